"""Hub repos as local files, for the commands that need whole weights (``verify``).

``inspect`` / ``analyze`` read a Hub repo by HTTP range (:mod:`.ranges`); a forward pass needs
every weight, so ``verify`` downloads instead, through huggingface_hub's ``snapshot_download``
into the normal Hugging Face cache (:func:`.hf_cache.hub_cache`): a later run, or
``transformers`` / ``hf`` itself, reuses the files, and ``hf cache scan`` sees them.

Only what the model needs is fetched: the weights :func:`.ranges._choose_weights` picks (the
shards its index names, or one safetensors file, or one GGUF and the other parts of its split
set) plus the small files at the root (config, tokenizer, generation config).  A repo that
also holds ``consolidated.safetensors`` or ONNX exports does not cost those bytes.

Token, endpoint and offline mode are read from the environment on every call, as in
:mod:`.ranges`: ``HF_TOKEN`` (or the stored login), ``HF_ENDPOINT``, ``HF_HUB_OFFLINE=1`` (then
the cache answers or one line says what is missing).  Progress bars follow
:mod:`ckpt_surgeon.progress`.
"""
from __future__ import annotations

import posixpath
import sys
from pathlib import Path

from ...errors import CkptError, HubError
from ...version import __version__
from .. import gguf as gg
from . import hf_cache
from .ranges import _choose_weights, _read_small, hf_cache_target, resolve_revision
from .range_cache import RepoCache
from .http import HubClient
from .settings import HubSettings

# Root files never needed to load a model from safetensors / GGUF: other weight formats.
_SKIP_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack", ".onnx",
                  ".onnx_data", ".tflite", ".ot", ".npz", ".mlmodel", ".zip", ".tar", ".gz")


def needed_files(client: HubClient, cache: RepoCache, files: list[str], file: str | None = None) -> tuple[list[str], str]:
    """-> (repo files to download, the path inside the snapshot to load: ``""`` for the root
    folder, a subfolder, or a ``.gguf`` file)."""
    kind, chosen = _choose_weights(files, file, client)
    if kind == "sniff":
        kind = "gguf" if chosen[0].endswith(".gguf") else "safetensors"
    base = posixpath.dirname(chosen[0])
    if kind == "gguf":
        group = next(g for g in gg.group_gguf_names([f for f in files if posixpath.dirname(f) == base])
                     if posixpath.basename(chosen[0]) in g)
        weights = [posixpath.join(base, n) if base else n for n in group]
        target = chosen[0]
    elif kind == "index":
        wm = _read_small(client, cache, {chosen[0]: "index"})[chosen[0]].get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise HubError("has no weight_map object", path=client.label(chosen[0]))
        shards = sorted({v for v in wm.values() if isinstance(v, str)})
        weights = [chosen[0]] + [posixpath.join(base, s) if base else s for s in shards]
        missing = [w for w in weights if w not in set(files)]
        if missing:
            raise HubError(f"weight_map names {missing[0]}, which is not in the repository", path=client.label(chosen[0]))
        target = base
    else:
        weights, target = list(chosen), base
    side = [f for f in files if posixpath.dirname(f) == base and not f.endswith(_SKIP_SUFFIXES)]
    return sorted(set(weights) | set(side)), target


def download(repo_id: str, *, revision: str | None = None, file: str | None = None,
             progress: bool | None = None) -> Path:
    """Download what loading ``repo_id`` needs into the Hugging Face cache -> the local path to
    load (the snapshot folder, a subfolder of it, or a ``.gguf`` file in it).  Files already in
    the cache are not fetched again.  Raises :class:`HubError` (one line) for every Hub problem."""
    settings = HubSettings.from_env(progress)
    client = HubClient(repo_id, settings, revision)
    cache = RepoCache(settings.cache, repo_id)
    hub_cache = hf_cache.hub_cache()
    if settings.offline:
        # No request at all: a snapshot (ours, or one `hf download` left) that holds the weights.
        found = hf_cache_target(client, client.revision, file)
        if found is None:
            raise HubError("is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids network access",
                           path=client.label(), hint=f"run once online, or unset HF_HUB_OFFLINE; cache: {hub_cache}")
        return found[1]
    files = resolve_revision(client, cache)
    wanted, target = needed_files(client, cache, files, file)
    from huggingface_hub import snapshot_download

    try:
        # By the revision the user gave (not the sha just resolved): huggingface_hub then records
        # refs/<revision> -> sha in its cache, which offline runs (ours, transformers') resolve through.
        folder = snapshot_download(repo_id, revision=client.revision, cache_dir=str(hub_cache),
                                   endpoint=settings.endpoint, allow_patterns=wanted, library_name="ckpt-surgeon",
                                   library_version=__version__, tqdm_class=_tqdm_class(settings.progress))
    except CkptError:
        raise
    except Exception as e:     # huggingface_hub / httpx errors: the same one-line mapping as range reads
        raise client._map_hf_error(e) from None
    return Path(folder) / target if target else Path(folder)


def _tqdm_class(enabled: bool):
    """huggingface_hub takes a tqdm class, not a yes/no: one that is on or off by our rule."""
    from tqdm.auto import tqdm

    class _Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = not enabled
            kwargs.setdefault("file", sys.stderr)
            super().__init__(*args, **kwargs)

    return _Bar
