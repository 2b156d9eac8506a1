"""Turn a verify input into something transformers loads, and load it.

Inputs: a Hugging Face folder, a single ``.safetensors`` file with its ``config.json`` beside
it, a ``.gguf`` file (converted to a temporary HF folder by our own converter), or a Hub repo id
(downloaded into the Hugging Face cache first, then one of the above).  Every input is first opened with :func:`ckpt_surgeon.open_checkpoint`, so a bad
file is reported by the same validated header parser as every other command (one line, exit 2)
before transformers sees it; that pass also gives the storage precision and parameter count
without reading any weights.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import CkptError, ConfigError, UnsupportedError
from ..progress import phase
from ..runtime import gguf_to_folder, has_tokenizer, load_pretrained, quantized_to_folder
from .kinds import ModelKind, model_kind
from .thresholds import coarsest

# safetensors / GGUF dtype name -> precision class used to pick thresholds.  Integer tensors
# (position-id buffers, GGUF I32 tables) are not weights and are skipped; every other
# float-like type (float8, GGUF Q*/IQ*/TQ*) is "quantized".
_PRECISION = {"F64": "float32", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
NOT_WEIGHTS = frozenset({"BOOL", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"})

# Files of a folder that are not weights: what a single-file source borrows from its folder.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".index.json", ".msgpack", ".h5")

TORCH_DTYPES = ("float32", "float64", "bfloat16", "float16")
_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class PreparedModel:
    """A verify input made loadable: the folder transformers reads and what we know of it."""

    given: str                 # what the user passed
    folder: str                # HF folder (the input itself, a symlink folder, or a converted GGUF)
    config: dict
    kind: ModelKind
    architecture: str
    storage_dtype: str         # float32 | float16 | bfloat16 | quantized
    n_params: int
    has_tokenizer: bool
    converted_from_gguf: bool = False
    role: str = "candidate"    # reference | candidate (for messages)
    dequantized: object | None = None   # conversion.dense.DequantizedRun: a quantized checkpoint, run dequantized

    def estimated_bytes(self, dtype: str) -> int:
        """Weights in memory once loaded in ``dtype``."""
        return self.n_params * _BYTES[dtype]


def storage_precision(dtypes) -> str:
    """Coarsest precision class among tensor dtype names (``"F32"``, ``"BF16"``, ``"Q4_1"`` ...)."""
    classes = [_PRECISION.get(d.upper(), "quantized") for d in dtypes if d.upper() not in NOT_WEIGHTS]
    return coarsest(*classes) if classes else "float32"


def prepare(source: str | os.PathLike, workdir: Path, *, role: str, dtype: str,
            progress: bool | None = False, revision: str | None = None) -> PreparedModel:
    """Validate ``source`` and return a :class:`PreparedModel`; GGUF inputs are converted into
    ``workdir/role``; a Hub repo id is first downloaded into the Hugging Face cache at
    ``revision`` (branch, tag or commit; default the repo's default branch) with
    :func:`ckpt_surgeon.formats.hub.snapshot.download` (bars per ``progress``).  ``revision``
    with a local source is an error.  Raises CkptError (one line) for anything transformers
    could not load."""
    given = os.fspath(source)
    p, ck, precision, n_params = open_input(given, revision=revision, progress=progress, verb="loads")
    dequantized = None
    try:
        if ck.format == "gguf":
            with phase(progress, f"{role}: converting {Path(ck.source).name} to a temporary HF folder ({dtype})"):
                folder = gguf_to_folder(Path(ck.source), workdir / role, dtype)
            config = _read_config(folder / "config.json")
            converted = True
        else:
            config = ck.config
            converted = False
            if ck.quantization is not None:
                # transformers runs it only through the method's package (FP8 not on a CPU, MLX not at
                # all): the same model from its dequantized weights instead, activations not quantized
                from ..conversion.dense import dequantized_run
                dequantized = dequantized_run(ck)
                with phase(progress, f"{role}: dequantizing {p.name} into a temporary dense folder"):
                    folder = quantized_to_folder(p, workdir / role)
            else:
                folder = p if p.is_dir() else _single_file_folder(p, workdir / role)
    finally:
        ck.close()
    archs = config.get("architectures") or [config.get("model_type") or "?"]
    kind = model_kind(config, path=str(Path(folder) / "config.json") if not converted else given)
    has_tok = has_tokenizer(folder)
    return PreparedModel(given, str(folder), config, kind, str(archs[0]), precision, n_params, has_tok, converted,
                         role, dequantized)


# How the one-line refusal of a safetensors input without config.json reads, per caller's verb.
_BUILT_BY = {"loads": "verify builds the model with transformers, which needs",
             "streams": "the model is built with transformers, which needs"}


def open_input(given: str, *, revision: str | None, progress: bool | None, verb: str):
    """``(local path, Checkpoint, storage precision, weight parameter count)`` of a verify input,
    whether it is then loaded whole (:func:`prepare`, ``verb="loads"``) or streamed
    (:func:`.stream.open_source`, ``verb="streams"``): a Hub repo id is first downloaded into the
    Hugging Face cache at ``revision`` (a revision with a local path is an error); the checkpoint is
    validated (:func:`open_validated`) and must be a GGUF, or safetensors with its config.json.
    The caller closes the checkpoint."""
    from ..checkpoint import is_hub_source, missing_local

    p = Path(given)
    if not p.exists():
        if not is_hub_source(given):
            raise missing_local(given)
        from ..formats.hub.snapshot import download
        p = download(given, revision=revision, progress=progress)
    elif revision is not None:
        raise CkptError(f"a revision ({revision!r}) applies to Hub repo ids only; this is a local path",
                        path=given)
    ck, precision, n_params = open_validated(p, given)
    try:
        if ck.format not in ("gguf", "safetensors"):
            raise UnsupportedError(f"verify {verb} safetensors or GGUF inputs, not {ck.format}", path=given)
        if ck.format == "safetensors" and ck.config is None:
            where = p if p.is_dir() else p.parent
            raise ConfigError(f"no config.json: {_BUILT_BY[verb]} config.json beside the weights", path=str(where))
    except BaseException:
        ck.close()
        raise
    return p, ck, precision, n_params


def check_inputs(*inputs, verb: str = "loads") -> None:
    """Every local input of a run, given as ``(source, revision)`` (None: absent), validated from its
    headers as :func:`open_input` validates it, before any of them is converted, dequantized or loaded
    (issue 50 item 8: a good reference was converted into a 538 MB folder before the bad candidate was
    refused).  A Hub repo id is checked once downloaded, where it is opened."""
    from ..checkpoint import is_hub_source
    for source, revision in inputs:
        if source is None:
            continue
        given = os.fspath(source)
        if not Path(given).exists() and is_hub_source(given):
            continue
        _, ck, _, _ = open_input(given, revision=revision, progress=False, verb=verb)
        ck.close()


def open_validated(p: Path, given: str):
    """``(Checkpoint, storage precision, weight parameter count)`` of a local input, validated as every
    command validates it (headers, not truncated, config and tensors agreeing: layer count, widths,
    heads) before a model is built from it; the caller closes the checkpoint."""
    from ..checkpoint import open_checkpoint
    try:
        ck = open_checkpoint(p)
    except ModuleNotFoundError as e:        # a reader this build lacks (the GGUF path)
        raise UnsupportedError(f"cannot read this input: module {e.name} is not available in this build",
                               path=given) from None
    try:
        floats = [i for i in ck.tensors.values() if i.dtype.upper() not in NOT_WEIGHTS]
        # a quantized checkpoint's logical weights read as float32, but are stored quantized
        precision = "quantized" if ck.quantization is not None else storage_precision(i.dtype for i in floats)
        n_params = sum(i.numel for i in floats)
        ck.refuse_truncated()          # the same line as every command but inspect
        ck.layout()
    except BaseException:
        ck.close()
        raise
    return ck, precision, n_params


def _read_config(path: Path) -> dict:
    from ..formats.safe_input import read_json
    return read_json(path, error=ConfigError)


def _single_file_folder(file: Path, out: Path) -> Path:
    """A folder transformers can load for one ``.safetensors`` file: symlinks to the file (as
    ``model.safetensors``) and to the non-weight files beside it (config, tokenizer, generation
    config).  Why not load the parent folder: it may hold other shards or an index that would be
    loaded instead of (or along with) the file the user named."""
    out.mkdir(parents=True)
    os.symlink(file.resolve(), out / "model.safetensors")
    for f in file.parent.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            os.symlink(f.resolve(), out / f.name)
    return out


# --- transformers side (torch imported here only) ----------------------------------------------

def load_model(pm: PreparedModel, *, dtype: str, device: str, device_map: str | None, warnings: list,
               max_memory: dict | None = None, progress: bool | None = False):
    """Load ``pm`` with its kind's Auto class, eval mode, on ``device`` (or spread by ``device_map``).

    Eager attention (why: :func:`ckpt_surgeon.runtime.load_pretrained`).  ``local_files_only``:
    verify never touches the network.  Missing weights are an error: transformers would
    initialise them randomly and the comparison would measure noise.
    """
    import torch
    import transformers

    # multimodal: the checkpoint's own class (an Auto class would pick the text-only model of some types)
    cls = getattr(transformers, pm.kind.auto_class or pm.architecture)
    kw = dict(local_files_only=True, output_loading_info=True)
    if device_map:
        kw["device_map"] = device_map
        if max_memory:
            kw["max_memory"] = max_memory      # accelerate's per-device limits, passed through
    elif device != "cpu":
        # Straight onto the GPU: loading on the CPU first and then moving held the whole model in
        # host RAM (a 7B float32 pair on an H200: 43.6 GiB of host RSS, which a 24 GB machine with
        # a GPU does not have; the memory plan counts the GPU's memory only).
        kw["device_map"] = device
    kw.update(float64_kwargs(dtype))
    torch.manual_seed(0)
    with phase(progress, f"{pm.role}: loading {Path(pm.given).name} with transformers ({dtype})"):
        model, info = load_pretrained(cls, pm.folder, dtype=dtype, path=pm.given, **kw)
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(str(x) for x in (info.get("mismatched_keys") or ()))
    if missing or mismatched:
        bad = missing or mismatched
        what = "misses" if missing else "has wrongly shaped"
        raise ConfigError(f"{pm.architecture} {what} {len(bad)} weight(s) the model needs "
                          f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); transformers would initialise "
                          f"them randomly", path=pm.given)
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        warnings.append(f"{pm.given}: {len(unexpected)} tensor(s) not used by {pm.architecture} "
                        f"({', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''})")
    if not device_map:
        model.to(device)
    model.eval()
    return model


def float64_kwargs(dtype: str) -> dict:
    """Model-building options float64 needs: transformers' default MoE experts kernel
    (``grouped_mm``) takes float32 / bfloat16 / float16 only and raises on float64; the eager
    experts loop computes in any dtype (and is what it falls back to where grouped_mm is absent)."""
    return {"experts_implementation": "eager"} if dtype == "float64" else {}


def free_memory(torch) -> None:
    """Drop what a freed model left behind (Python cycles, the CUDA cache)."""
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
