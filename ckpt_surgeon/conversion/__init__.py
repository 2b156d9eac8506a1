"""GGUF <-> Hugging Face conversion.

- :func:`gguf_to_hf` ``(gguf_path, out_dir, dtype="float32", force=False) -> Path``
- :func:`hf_to_gguf` ``(src, out_path, dtype="f16", force=False) -> Path``
- :func:`convert` ``(source, out, dtype=None, force=False) -> ConvertReport``: direction from the
  source's magic bytes (a GGUF file goes to an HF folder, anything else to a GGUF file).

The same three are ``ckpt_surgeon.convert``, ``ckpt_surgeon.gguf_to_hf`` and
``ckpt_surgeon.hf_to_gguf``.  The implementations live in :mod:`.from_gguf` and :mod:`.to_gguf`
(no module shares a name with a function, so importing a submodule never rebinds a package
attribute).  Importing this package is cheap: torch, transformers and gguf-py are imported by
the conversion functions only.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["convert", "gguf_to_hf", "hf_to_gguf", "gguf_to_hf_report", "hf_to_gguf_report", "normalize_dtype"]

from .dtypes import normalize_dtype
from .._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(globals(), {"gguf_to_hf": ".from_gguf", "gguf_to_hf_report": ".from_gguf",
                                                "hf_to_gguf": ".to_gguf", "hf_to_gguf_report": ".to_gguf"})


def is_gguf(path) -> bool:
    """Whether ``path`` is a GGUF file, by its magic (a file no magic fits is a FormatError that
    says what it looks like, never taken for an HF model)."""
    from ..formats.magic import file_kind
    p = Path(os.fspath(path))
    if p.is_dir() or not os.path.lexists(p):
        return False
    return file_kind(p) == "gguf"


def _gguf_in_folder(p: Path) -> Path | None:
    """The GGUF a folder without config.json holds (its one file, or part 1 of its one split
    set), so ``convert FOLDER`` goes GGUF -> HF like ``inspect FOLDER`` reads it; None otherwise."""
    from ..errors import SourceNotFoundError
    from ..formats.gguf import describe_gguf_groups, group_gguf_names
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    groups = group_gguf_names(g.name for g in p.glob("*.gguf") if g.is_file())
    if not groups:
        return None
    if len(groups) > 1:
        raise SourceNotFoundError(f"folder holds {len(groups)} GGUF models ({describe_gguf_groups(groups)}); "
                                  "pass one of them", path=str(p))
    return p / groups[0][0]


def _quantized_folder(p: Path) -> bool:
    """Whether ``p`` is an HF folder (or a file beside one) whose config.json declares a quantization."""
    from ..errors import CkptError
    from ..formats.quant.schemes import config_method
    from ..formats.safe_input import read_json
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    try:
        return cfg.is_file() and config_method(read_json(cfg)) is not None
    except (CkptError, OSError):   # an unreadable config is reported by the conversion that reads it
        return False


def _check_local(source) -> None:
    from ..errors import SourceNotFoundError
    if not os.path.exists(os.fspath(source)):
        from ..checkpoint import is_hub_source, missing_local
        s = os.fspath(source)
        if is_hub_source(s):
            # convert reads every byte and writes beside it: a local copy first (issue 36: it said
            # "Path ... does not exist" while the help says SOURCE may be a Hub id)
            raise SourceNotFoundError("convert reads a local model, and this is a Hub repo id: download it first "
                                      f"(hf download {s} --local-dir DIR) and convert DIR", path=s)
        raise missing_local(s)


def _split(out, max_size, max_tensors, small_first=False):
    """The split request of the options (:mod:`.split_output`), checked against the output kind."""
    from ..errors import UnsupportedError
    from .split_output import split_request
    split = split_request(max_size, max_tensors, small_first)
    if split is not None and not str(out).endswith(".gguf") and (split.max_tensors or split.small_first):
        what = "--split-max-tensors" if split.max_tensors else "--no-tensor-first-split"
        raise UnsupportedError(f"{what} splits a GGUF output; an HF folder is sharded by size only "
                               "(--split-max-size)", path=os.fspath(out))
    return split


def convert(source, out, dtype: str | None = None, force: bool = False, *, name: str | None = None,
            progress: bool | None = False, isolate: bool = False, imatrix=None, allow_requantize: bool = False,
            split_max_size=None, split_max_tensors=None, engine: str = "auto", mmproj: bool = False,
            config=None, no_tensor_first_split: bool = False, trust_remote_code: bool = False):
    """Convert in the direction the source implies: the twin of ``ckpt-surgeon convert`` (docs/convert.md).

    A GGUF ``source`` (by its magic bytes) becomes the HF folder ``out``; an HF folder or ``.safetensors``
    becomes the GGUF file ``out`` (``dtype`` f16 | bf16 | f32 | q8_0, or a llama.cpp file type such as
    q4_k_m, with the importance matrix ``imatrix``); a GGUF with a ``.gguf`` ``out`` is quantized as
    llama-quantize does (``allow_requantize``); a quantized HF folder with a folder ``out`` becomes its dense
    folder.  ``split_max_size`` (``"4G"``) / ``split_max_tensors`` / ``no_tensor_first_split``: llama.cpp's
    split set (an HF output: its shard size).  ``engine`` (auto | native | llama.cpp), ``mmproj`` and
    ``trust_remote_code``: the path derived from llama.cpp's converter; ``config``: the original config.json
    for GGUF -> HF of such an architecture.  ``progress``: a bar on stderr (None: when stderr is a terminal);
    ``isolate``: ask transformers in a short-lived child process, as the CLI does.

    Returns:
        :class:`~ckpt_surgeon.conversion.report.ConvertReport`

    Example::

        import ckpt_surgeon
        rep = ckpt_surgeon.convert("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-hf")
        rep.direction, rep.n_tensors, rep.config["num_hidden_layers"]
    """
    from ..errors import UnsupportedError
    _check_local(source)
    source = _gguf_in_folder(Path(os.fspath(source))) or source
    split = _split(out, split_max_size, split_max_tensors, no_tensor_first_split)
    shard_bytes = split.max_size if split is not None else None
    if is_gguf(source) and str(out).endswith(".gguf") and dtype is not None:
        # GGUF -> GGUF quantization (without a dtype, a .gguf OUT for a GGUF source is refused below)
        from .dtypes import normalize_dtype
        from .requantize import gguf_requantize_report
        if name is not None:
            raise UnsupportedError("--name sets general.name of an HF -> GGUF output; GGUF -> GGUF keeps the source's")
        return gguf_requantize_report(source, out, normalize_dtype(dtype, to_gguf=True), force=force,
                                      imatrix=imatrix, allow_requantize=allow_requantize, progress=progress,
                                      split=split)
    if imatrix is not None and is_gguf(source):
        raise UnsupportedError("--imatrix applies to a GGUF output")
    if is_gguf(source):
        if name is not None:
            raise UnsupportedError("--name sets general.name of a GGUF output; it does not apply to GGUF -> HF")
        return _to_hf(source, out, dtype, force, progress, shard_bytes, config)
    if not str(out).endswith(".gguf"):
        if _quantized_folder(Path(os.fspath(source))):
            # a quantized HF folder -> the dense HF folder of the same model (.dense)
            from .dense import quantized_to_dense_report
            from .dtypes import normalize_dtype
            if name is not None or imatrix is not None:
                raise UnsupportedError("--name and --imatrix apply to a GGUF output, not to a dense HF folder")
            return quantized_to_dense_report(source, out, normalize_dtype(dtype, to_gguf=False), force=force,
                                             progress=progress, max_shard_bytes=shard_bytes)
        raise UnsupportedError("the source is an HF model, so the output is a GGUF file: give a path ending in .gguf "
                               "(an HF folder output is written only for a quantized source: its dense folder)",
                               path=os.fspath(out))
    return _to_gguf(source, out, dtype, force, name=name, progress=progress, isolate=isolate, imatrix=imatrix,
                    engine="llama.cpp" if mmproj else engine, mmproj=mmproj, split=split, trust=trust_remote_code)


def _to_hf(source, out, dtype, force, progress, shard_bytes, config):
    """GGUF -> HF folder: the native registry's inverse, or (its architecture unknown there, or a
    ``config`` given) llama.cpp's converter class inverted by probing (:mod:`.derived.to_hf`)."""
    from .derived.to_hf import derived_gguf_to_hf_report, gguf_needs_derived
    from .from_gguf import gguf_to_hf_report
    if config is not None or gguf_needs_derived(source):
        from .dtypes import normalize_dtype
        return derived_gguf_to_hf_report(source, out, config, normalize_dtype(dtype or "float32", to_gguf=False),
                                         force=force, progress=progress)
    extra = {"max_shard_bytes": shard_bytes} if shard_bytes else {}
    return gguf_to_hf_report(source, out, dtype=dtype if dtype is not None else "float32", force=force,
                             progress=progress, **extra)


def _to_gguf(source, out, dtype, force, *, name, progress, isolate, imatrix, engine, mmproj=False, split=None,
             trust=False):
    """HF -> GGUF by the native registry or, for another architecture, llama.cpp's class (:mod:`.derived`)."""
    from .derived.listing import engine_for
    from .to_gguf import hf_to_gguf_report
    folder = Path(os.fspath(source))
    if engine_for(folder if folder.is_dir() else folder.parent, engine) == "derived":
        from .derived.run import derived_hf_to_gguf_report
        return derived_hf_to_gguf_report(source, out, normalize_dtype(dtype or "f16", to_gguf=True), force, name=name,
                                         imatrix=imatrix, mmproj=mmproj, split=split, progress=progress,
                                         trust_remote_code=trust)
    return hf_to_gguf_report(source, out, dtype=dtype if dtype is not None else "f16", force=force, name=name,
                             progress=progress, isolate=isolate, imatrix=imatrix, split=split)
