"""The Hugging Face hub cache (``HF_HUB_CACHE``) as a source of complete local files.

``hf download`` / ``snapshot_download()`` / transformers' ``from_pretrained`` keep a repo as::

    $HF_HUB_CACHE/models--<owner>--<name>/
        blobs/<sha256 or etag>                 the bytes, once
        refs/<branch or tag>                   the commit sha it points at
        snapshots/<commit sha>/<path>          symlinks into ../../blobs/

(huggingface_hub ``file_download.py``: ``hf_hub_download`` and ``_create_symlink``.)  A Hub id
whose weights are already there is read from there, as transformers does, instead of by HTTP
ranges.  Only what is complete on disk counts: a snapshot missing a shard (an interrupted or
filtered download) is not used and the remote path takes over.
"""
from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from ...errors import CkptError
from ...userdirs import xdg_cache
from ..safe_input import read_json

_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def hf_home() -> Path:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``
    (huggingface_hub ``constants.py``), read at call time."""
    home = os.environ.get("HF_HOME") or str(xdg_cache() / "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home)))


def hub_cache() -> Path:
    """``$HF_HUB_CACHE`` (or the older ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``."""
    own = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(os.path.expandvars(os.path.expanduser(own))) if own else hf_home() / "hub"


def snapshot_dir(repo_id: str, revision: str) -> Path | None:
    """The snapshot folder for ``revision`` (a commit sha, or a branch/tag through ``refs/``)."""
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    sha = revision if _FULL_SHA.match(revision) else None
    if sha is None:
        ref = repo / "refs" / revision
        try:
            sha = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
        except (OSError, UnicodeDecodeError):
            return None
        if not sha or not _FULL_SHA.match(sha):
            return None
    snap = repo / "snapshots" / sha
    return snap if snap.is_dir() else None


def listing(snap: Path) -> list[str]:
    """Repo-relative paths present in a snapshot (links that resolve to a file only)."""
    out = []
    for root, dirs, files in os.walk(snap):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fn in files:
            p = Path(root) / fn
            if p.is_file():
                out.append(p.relative_to(snap).as_posix())
    return sorted(out)


def _index_shards(index: Path) -> set[str] | None:
    try:
        wm = read_json(index).get("weight_map")      # size, depth and number limits; regular files only
    except CkptError:
        return None
    return set(wm.values()) if isinstance(wm, dict) and all(isinstance(v, str) for v in wm.values()) else None


def local_target(snap: Path, kind: str, chosen: list[str]) -> Path | None:
    """The path to open locally for the weights the remote reader chose, when they are all on
    disk; None otherwise.  ``kind``: index | safetensors | gguf | sniff (as hub.py chooses)."""
    have = set(listing(snap))
    if not all(c in have for c in chosen):
        return None
    if kind == "index":
        base, name = posixpath.split(chosen[0])
        shards = _index_shards(snap / chosen[0])
        # a folder opens through model.safetensors.index.json; another index name stays remote
        if name != "model.safetensors.index.json" or shards is None \
                or not all((posixpath.join(base, s) if base else s) in have for s in shards):
            return None
        return snap / base if base else snap
    if len(chosen) == 1:
        return snap / chosen[0]
    base = posixpath.dirname(chosen[0])
    return snap / base if base else snap


def display_name(folder: Path) -> str:
    """A model folder's name for people and ``general.name``: ``name`` for a cache snapshot
    ``models--owner--name/snapshots/<commit>`` (whose own name is a commit sha), else the
    folder's name."""
    folder = Path(folder)
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--") and repo.count("--") >= 2:
        return repo.split("--", 2)[2]
    return folder.name
