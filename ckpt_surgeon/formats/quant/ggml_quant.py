"""llama.cpp's own quantization kernels, through the ggml library llama-cpp-python ships.

``libggml-base`` exports ``ggml_quantize_chunk`` (the function ``llama_model_quantize`` calls,
``src/llama-quant.cpp`` ``llama_tensor_quantize_impl``), ``ggml_quantize_requires_imatrix`` and
the type traits (``ggml_get_type_traits``: the name, checked against gguf-py's, and ``to_float``;
block sizes and bytes are the one table of :mod:`.ggml_types`).  Calling
them gives llama-quantize's bytes by construction, at its speed, with no kernel of ours to
maintain.  ctypes releases the GIL for the duration of each call, so the converter's worker
threads quantize in parallel.

llama-cpp-python is an optional dependency (the ``llama`` extra): without it every quantized
type but Q8_0 (our own kernel, :mod:`.quantize`) is refused with one line saying how to install it.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import numpy as np

from ...errors import UnsupportedError

__all__ = ["lib", "type_id", "type_name", "is_quantized",
           "quantize_rows", "dequantize", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'ckpt-surgeon[llama]' (llama-cpp-python ships the ggml library whose kernels are used)"


class _Traits(ctypes.Structure):
    # struct ggml_type_traits (ggml/include/ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _find_library() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
            p = Path(base) / "lib" / name
            if p.is_file():
                return p
    return None


@functools.lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """The loaded libggml-base, its functions typed.  Raises :class:`UnsupportedError` (one line,
    with the install command) when llama-cpp-python is not installed."""
    path = _find_library()
    if path is None:
        raise UnsupportedError("quantized GGUF types other than q8_0 use llama.cpp's kernels, from "
                               "llama-cpp-python, which is not installed", hint=INSTALL_HINT)
    g = ctypes.CDLL(str(path))
    g.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
    g.ggml_get_type_traits.argtypes = [ctypes.c_int]
    g.ggml_row_size.restype = ctypes.c_size_t
    g.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    g.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    g.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    g.ggml_quantize_init.restype = None
    g.ggml_quantize_init.argtypes = [ctypes.c_int]
    g.ggml_validate_row_data.restype = ctypes.c_bool
    g.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    return g


@functools.lru_cache(maxsize=None)
def _names() -> dict[str, int]:
    """ggml type name (upper case, as gguf-py spells it: ``Q4_K``) -> id.  The ids are gguf-py's
    (``GGMLQuantizationType``, the file format's numbering), each checked against the library's
    own traits name: ``ggml_get_type_traits`` only asserts its argument, so ids past the
    library's ``GGML_TYPE_COUNT`` are never asked; a type the library names differently (or not
    at all) is left out, and asking for it is refused."""
    import gguf
    g = lib()
    out = {}
    for member in gguf.GGMLQuantizationType:
        t = g.ggml_get_type_traits(int(member)).contents
        if t.type_name and t.type_name.decode().upper() == member.name and t.blck_size > 0:
            out[member.name] = int(member)
    return out


def type_id(name: str) -> int:
    ids = _names()
    if name.upper() not in ids:
        raise UnsupportedError(f"ggml type {name} is not in this ggml library (llama-cpp-python too old?)",
                               hint=INSTALL_HINT)
    return ids[name.upper()]


def _traits(name: str) -> _Traits:
    return lib().ggml_get_type_traits(type_id(name)).contents


def type_name(tid: int) -> str:
    return lib().ggml_get_type_traits(int(tid)).contents.type_name.decode().upper()


def is_quantized(name: str) -> bool:
    """Whether ``name`` is a quantized type (:mod:`.ggml_types`) this ggml library has; refused
    (:class:`UnsupportedError`) when the library lacks it."""
    from .ggml_types import ggml_type
    type_id(name)
    return ggml_type(name.upper()).quantized


def quantize_rows(x: np.ndarray, name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 rows (last axis: a row) -> the ``name`` type's bytes (uint8, one row of bytes per
    row), by ``ggml_quantize_chunk`` with ``imatrix`` (one float32 weight per column, or None) as
    llama.cpp's quantizer calls it.  The row must be a whole number of blocks."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_per_row = x.shape[-1]
    nrows = x.size // max(n_per_row, 1)
    tid = type_id(name)
    g = lib()
    rs = int(g.ggml_row_size(tid, n_per_row))
    out = np.empty((nrows, rs), np.uint8)
    im = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_per_row,):
            raise ValueError(f"imatrix of {imatrix.shape} for rows of {n_per_row}")
        im = imatrix.ctypes.data
    n = g.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, nrows, n_per_row, im)
    if n != out.nbytes:
        raise ValueError(f"ggml_quantize_chunk wrote {n} bytes, expected {out.nbytes}")
    return out.reshape(x.shape[:-1] + (rs,))


def dequantize(data: np.ndarray, name: str, n: int) -> np.ndarray:
    """``n`` values of type ``name`` (their bytes) -> float32, by the type's ``to_float`` (what
    llama.cpp's quantizer runs on a quantized source tensor, ``llama_tensor_dequantize_impl``)."""
    t = _traits(name)
    if not t.to_float:
        raise UnsupportedError(f"ggml has no dequantization for {name}")
    data = np.ascontiguousarray(data)
    out = np.empty(n, np.float32)
    _TO_FLOAT(t.to_float)(data.ctypes.data, out.ctypes.data, n)
    return out
