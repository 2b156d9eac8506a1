"""Casting computed values once to a stored dtype (round-to-nearest-even, no double rounding).

Used by the checkpoint writer for every ``put`` of an array, and by GGUF -> HF conversion.
"""
from __future__ import annotations

import numpy as np

__all__ = ["cast_to_dtype"]

_NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
              "U64": np.uint64, "BOOL": np.bool_}
_ML = {"BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}


def _f64_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 bit patterns, round-to-nearest-even in one step.

    Rounding float64 -> float32 -> bfloat16 rounds twice and can land on the wrong side of a
    tie; instead round the float64 mantissa (52 bits) to bfloat16's 7 in integer arithmetic
    (add half an ulp minus one, plus the lowest kept bit: RNE), after which the value is exactly a
    bfloat16, its float32 is exact and its top 16 bits are the answer (inf past the range, RNE's
    answer too).  bfloat16 subnormals (|x| < 2**-126) and non-finite values go through ml_dtypes'
    own conversion.  Done in chunks of :data:`_CHUNK` elements (the passes stay in cache, and the
    temporaries stay small: a 7B projection is 100 MB of float64).
    """
    a = np.ascontiguousarray(a, dtype=np.float64)
    flat, out = a.reshape(-1), np.empty(a.size, dtype=np.uint16)
    for i in range(0, a.size, _CHUNK):
        out[i:i + _CHUNK] = _bf16_chunk(flat[i:i + _CHUNK])
    return out.reshape(a.shape)


_CHUNK = 1 << 16


def _bf16_chunk(a: np.ndarray) -> np.ndarray:
    u = a.view(np.uint64)
    keep = (u >> np.uint64(45)) & np.uint64(1)
    r = ((u + np.uint64((1 << 44) - 1) + keep) & ~np.uint64((1 << 45) - 1)).view(np.float64)
    with np.errstate(over="ignore"):
        bits = (r.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    small_or_bad = ~np.isfinite(a) | (np.abs(a) < 2.0 ** -126)
    if small_or_bad.any():
        import ml_dtypes
        with np.errstate(over="ignore"):
            bits[small_or_bad] = a[small_or_bad].astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    return bits


def cast_to_dtype(arr: np.ndarray, dtype: str) -> bytes:
    """Cast ``arr`` once to the safetensors ``dtype`` and return its little-endian bytes.

    Floats: round-to-nearest-even from whatever precision ``arr`` has (numpy's float64->float16
    and ->float32 casts round directly; BF16 via :func:`_f64_to_bf16_bits`).  Integer/bool targets
    require an array of that exact kind (no silent float->int truncation).
    """
    arr = np.asarray(arr)
    if dtype == "BF16":
        if arr.dtype == np.float32 or arr.dtype == np.float16:
            arr = arr.astype(np.float64)     # exact widening, then one rounding
        if arr.dtype.name == "bfloat16":
            return np.ascontiguousarray(arr).view(np.uint16).astype("<u2").tobytes()
        return _f64_to_bf16_bits(arr.astype(np.float64)).astype("<u2").tobytes()
    if dtype in ("F32", "F16", "F64"):
        if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
            raise TypeError(f"cannot store a {arr.dtype} array as {dtype}")
        if arr.dtype.name == "bfloat16":
            arr = arr.astype(np.float32)
        return np.ascontiguousarray(arr.astype(_NP_DTYPES[dtype]).astype(np.dtype(_NP_DTYPES[dtype]).newbyteorder("<"))).tobytes()
    if dtype in _NP_DTYPES:
        want = np.dtype(_NP_DTYPES[dtype])
        if arr.dtype.kind != want.kind:
            raise TypeError(f"cannot store a {arr.dtype} array as {dtype} without an explicit conversion")
        return np.ascontiguousarray(arr.astype(want.newbyteorder("<"))).tobytes()
    if dtype in _ML:
        import ml_dtypes
        return np.ascontiguousarray(arr.astype(np.float32).astype(getattr(ml_dtypes, _ML[dtype]))).tobytes()
    raise TypeError(f"writing dtype {dtype} from numbers is not supported (pass raw bytes)")
