"""GGUF <-> Hugging Face conversion.

- :func:`gguf_to_hf` ``(gguf_path, out_dir, dtype="float32", force=False) -> Path``
- :func:`hf_to_gguf` ``(src, out_path, dtype="f16", force=False) -> Path``
- :func:`convert` ``(source, out, dtype=None, force=False) -> ConvertReport``: direction from the
  source's magic bytes (a GGUF file goes to an HF folder, anything else to a GGUF file).

Like :mod:`ckpt_surgeon.verify`, this package is itself callable (``ckpt_surgeon.convert(...)``):
importing ``ckpt_surgeon.convert.*`` makes the attribute ``ckpt_surgeon.convert`` this module, so
the module forwards calls to :func:`convert` and both spellings work.  Importing it is cheap:
torch, transformers and gguf-py are imported by the conversion functions only.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

__all__ = ["convert", "gguf_to_hf", "hf_to_gguf", "gguf_to_hf_report", "hf_to_gguf_report", "normalize_dtype"]

# Output dtype spellings accepted by both directions (CLI and API): the HF names and the GGUF names.
_TO_HF = {"float32": "float32", "f32": "float32", "float16": "float16", "f16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}
_TO_GGUF = {"f32": "f32", "float32": "f32", "f16": "f16", "float16": "f16", "bf16": "bf16",
            "bfloat16": "bf16", "q8_0": "q8_0"}


def normalize_dtype(dtype: str | None, to_gguf: bool) -> str:
    """The output dtype in the target's spelling (``None``: f16 for GGUF, float32 for HF)."""
    from ..errors import UnsupportedError
    if dtype is None:
        return "f16" if to_gguf else "float32"
    table = _TO_GGUF if to_gguf else _TO_HF
    got = table.get(str(dtype).lower())
    if got is None:
        where = "a GGUF file" if to_gguf else "an HF folder"
        raise UnsupportedError(f"--dtype {dtype!r} cannot be written to {where} (choose {', '.join(sorted(set(table.values())))})")
    return got


# The public functions share their names with the submodules that implement them.  Once a
# submodule is imported, Python sets this package's attribute of that name to the *module*; the
# submodules are therefore callable modules forwarding to their function (see the end of
# gguf_to_hf.py / hf_to_gguf.py), so ``ckpt_surgeon.convert.gguf_to_hf(...)`` always works.
def gguf_to_hf(gguf_path, out_dir, dtype: str = "float32", force: bool = False) -> Path:
    """GGUF file -> HF folder; see :func:`ckpt_surgeon.convert.gguf_to_hf.gguf_to_hf`."""
    from .gguf_to_hf import gguf_to_hf as _f
    return _f(gguf_path, out_dir, dtype=dtype, force=force)


def hf_to_gguf(src, out_path, dtype: str = "f16", force: bool = False, *, name: str | None = None) -> Path:
    """HF folder -> GGUF file; see :func:`ckpt_surgeon.convert.hf_to_gguf.hf_to_gguf`."""
    from .hf_to_gguf import hf_to_gguf as _f
    return _f(src, out_path, dtype=dtype, force=force, name=name)


def gguf_to_hf_report(gguf_path, out_dir, dtype: str = "float32", force: bool = False, **kw):
    from .gguf_to_hf import gguf_to_hf_report as _r
    return _r(gguf_path, out_dir, dtype=dtype, force=force, **kw)


def hf_to_gguf_report(src, out_path, dtype: str = "f16", force: bool = False, **kw):
    from .hf_to_gguf import hf_to_gguf_report as _r
    return _r(src, out_path, dtype=dtype, force=force, **kw)


def is_gguf(path) -> bool:
    p = Path(os.fspath(path))
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def convert(source, out, dtype: str | None = None, force: bool = False, *, name: str | None = None):
    """Convert in the direction the source implies -> :class:`~ckpt_surgeon.convert.report.ConvertReport`.

    A ``.gguf`` source (recognised by its magic bytes) becomes an HF folder at ``out``;
    an HF folder / ``.safetensors`` becomes the GGUF file ``out``.
    """
    from ..errors import SourceNotFoundError, UnsupportedError
    if not os.path.exists(os.fspath(source)):
        raise SourceNotFoundError("no such file or folder", path=os.fspath(source))
    if is_gguf(source):
        if name is not None:
            raise UnsupportedError("--name sets general.name of a GGUF output; it does not apply to GGUF -> HF")
        return gguf_to_hf_report(source, out, dtype=dtype if dtype is not None else "float32", force=force)
    if not str(out).endswith(".gguf"):
        raise UnsupportedError("the source is an HF model, so the output is a GGUF file: give a path ending in .gguf",
                               path=os.fspath(out))
    return hf_to_gguf_report(source, out, dtype=dtype if dtype is not None else "f16", force=force, name=name)


class _CallableModule(types.ModuleType):
    def __call__(self, source, out, dtype: str | None = None, force: bool = False, **kw):
        return convert(source, out, dtype=dtype, force=force, **kw)


sys.modules[__name__].__class__ = _CallableModule
