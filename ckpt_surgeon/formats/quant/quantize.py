"""Encoding float rows as GGUF tensor bytes: F32, F16, BF16 and Q8_0.

Q8_0 (ggml ``block_q8_0``: an f16 scale ``d`` then 32 int8 ``qs`` per block of 32 values) follows
llama.cpp's reference ``quantize_row_q8_0_ref`` (``ggml-quants.c``): ``d = max|x| / 127``,
``qs = roundf(x / d)`` with ``x * (1/d)`` and round-half-away-from-zero, ``d`` stored as f16.
gguf-py's ``gguf.quants.quantize`` (what llama.cpp's ``convert_hf_to_gguf.py`` calls) computes
the same thing in float32 numpy; our bytes are identical (``tests/test_convert_stream.py`` checks
it on random data and on zeros, tiny and subnormal values, exact halves, infinities and NaN).

Two paths.  :func:`_quantize_q8_0_exact` is gguf-py's float32 operations in its order (numpy,
~13 passes); it handles every block whose ``d`` is 0, subnormal, inf or NaN (all-zero blocks,
blocks holding inf / NaN, maxima below ~2**-119), and all blocks when torch is missing.  The
fast path (every other block) runs 6 vectorised torch passes on 1000-block chunks (in L2 cache,
and under torch's intra-op grain, so each call stays on its caller's thread: the converter runs
its own workers): ``max|x|`` (abs, amax: the same float32 maximum), ``d`` and ``1/d`` with numpy's
IEEE float32 division as gguf-py, ``v = x * (1/d)`` (one IEEE multiply, no FMA), then
``trunc(v + sign(v) * c)`` with ``c = 0.5 - 2**-25`` (the float32 just below 1/2; ``sign(v) * c``
is exact, so fused or not the add rounds once) by the float -> int8 cast.  A normal, finite ``d``
gives a finite ``1/d`` and ``|v| <= 127.0001``, and for every float32 ``|v| <= 128`` that rounding
equals gguf-py's ``np_roundf`` (``sign(v) * (floor|v| + floor(2 * (|v| - floor|v|)))``): checked
exhaustively over all 2,248,146,946 float32 bit patterns with ``|v| <= 128``, both signs, in
chunked numpy (0 mismatches, as floats and after the int8 cast); the test suite re-checks every
float32 within 2048 ulps of each ``k`` and ``k + 1/2``.  ``d`` -> f16 by :func:`to_f16` (IEEE
round-to-nearest-even, as numpy).  ~4.5x the numpy path's throughput on one core here
(~560-620 vs ~127 M values/s on a 2048x4096 float32 array; was ~13 numpy passes over RAM).
"""
from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError

__all__ = ["quantize_q8_0", "encode_rows", "to_f16", "bf16_bits_to_f16", "Q8_0_BLOCK", "Q8_0_BYTES"]

Q8_0_BLOCK = 32
Q8_0_BYTES = 34                  # 2-byte f16 scale + 32 int8
_TORCH_MIN = 1 << 16             # values below which numpy's cast is as fast as a torch call
_Q8_GROUP = 16000                # blocks whose scales are computed together (2 MB of values)
_Q8_CHUNK = 1000                 # Q8_0 blocks per pass: 32000 values (125 KiB) stay in L2, and under
                                 # torch's 32768-value grain, so each op runs on the calling thread
_HALF_DOWN = float(np.nextafter(np.float32(0.5), np.float32(0)))      # 0.5 - 2**-25
_F32_TINY = np.float32(2.0 ** -126)                                   # smallest normal float32
_F32_MAX = np.finfo(np.float32).max


def _quantize_q8_0_exact(blocks: np.ndarray) -> np.ndarray:
    """(n, 32) float32 blocks -> (n, 34) Q8_0 bytes: gguf-py's float32 numpy operations, in its
    order (the reference; :func:`quantize_q8_0` sends here every block the fast path does not cover)."""
    out = np.empty((blocks.shape[0], Q8_0_BYTES), np.uint8)
    a = np.abs(blocks)
    d = a.max(axis=1, keepdims=True) / np.float32(127)          # gguf-py: abs(blocks).max(...) / 127
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    v = np.multiply(blocks, inv, out=a)                          # x * (1/d); a is free again
    # roundf (half away from zero) exactly as gguf-py's np_roundf:
    # sign(v) * (floor|v| + floor(2 * (|v| - floor|v|)))
    av = np.abs(v)
    fl = np.floor(av)
    np.subtract(av, fl, out=av)
    np.multiply(av, np.float32(2), out=av)
    np.floor(av, out=av)
    np.add(fl, av, out=fl)
    np.multiply(np.sign(v, out=av), fl, out=fl)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = fl.astype(np.int8).view(np.uint8)
    return out


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 values (any shape, last axis a multiple of 32) -> Q8_0 bytes, shape
    ``x.shape[:-1] + (x.shape[-1] // 32 * 34,)``, uint8."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"Q8_0 needs rows that are whole blocks of {Q8_0_BLOCK} values, got shape {x.shape}")
    shape = x.shape[:-1] + (x.shape[-1] // Q8_0_BLOCK * Q8_0_BYTES,)
    blocks = x.reshape(-1, Q8_0_BLOCK)
    n = blocks.shape[0]
    try:
        import torch
    except ImportError:      # torch is a dependency; a broken install still converts, slower
        torch = None
    if torch is None:
        return _quantize_q8_0_exact(blocks).reshape(shape)
    out = np.empty((n, Q8_0_BYTES), np.uint8)
    src = torch.from_numpy(blocks)
    qs = torch.from_numpy(out)[:, 2:].view(torch.int8)
    m = torch.empty(n, dtype=torch.float32)
    d = np.empty(n, np.float32)
    inv = np.empty((n, 1), np.float32)
    inv_t = torch.from_numpy(inv)
    v_buf = torch.empty((_Q8_CHUNK, Q8_0_BLOCK), dtype=torch.float32)
    c_buf = torch.empty((_Q8_CHUNK, Q8_0_BLOCK), dtype=torch.float32)
    redo = []
    for g in range(0, n, _Q8_GROUP):          # a group's values are read twice: from cache the second time
        ge = min(g + _Q8_GROUP, n)
        for s in range(g, ge, _Q8_CHUNK):
            e = min(s + _Q8_CHUNK, ge)
            torch.amax(torch.abs(src[s:e], out=v_buf[:e - s]), dim=1, out=m[s:e])   # max|x|, NaN kept
        dg = d[g:ge]
        np.divide(m[g:ge].numpy(), np.float32(127), out=dg)        # d = max|x| / 127, float32
        if not (dg.min() >= _F32_TINY and dg.max() <= _F32_MAX):  # d 0, subnormal, inf or NaN
            bad = np.flatnonzero(~((dg >= _F32_TINY) & (dg <= _F32_MAX)))
            redo.append(bad + g)
            dg[bad] = 1                                             # placeholder, redone below
        np.divide(np.float32(1), dg, out=inv[g:ge, 0])             # 1/d: finite and > 0 here
        for s in range(g, ge, _Q8_CHUNK):
            e = min(s + _Q8_CHUNK, ge)
            v, c = v_buf[:e - s], c_buf[:e - s]
            torch.mul(src[s:e], inv_t[s:e], out=v)                  # v = x * (1/d): |v| <= 127.0001
            v.add_(torch.sign(v, out=c), alpha=_HALF_DOWN)          # v + sign(v) * (0.5 - 2**-25)
            qs[s:e].copy_(v)                                        # float -> int8 truncates
    out[:, :2] = to_f16(d).view(np.uint8).reshape(n, 2)
    if redo:
        idx = np.concatenate(redo)
        out[idx] = _quantize_q8_0_exact(blocks[idx])
    return out.reshape(shape)


def bf16_bits_to_f16(u: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float16, exactly numpy's ``astype(float16)`` of the value.

    No float arithmetic: a bfloat16 whose exponent lies in float16's normal range (2**-14 up to
    65280, the largest bfloat16 below 65504) is exact in float16 (7 mantissa bits fit in 10), so
    its bits are moved, not rounded: sign kept, exponent rebiased (127 -> 15: minus 112 << 7),
    mantissa shifted up by 3.  The rest (zeros, values that become float16 subnormals or
    overflow, inf, NaN: ~0.3% of typical weights) go through numpy's own cast.  Integer numpy
    passes on 2-byte values: several times numpy's float32 -> float16 cast, without importing torch.
    """
    u = np.ascontiguousarray(u, dtype=np.uint16)
    a = u & 0x7FFF
    out = ((a - 0x3800) << 3) | (u & 0x8000)            # wraps for the others, fixed below
    odd = np.flatnonzero((a < 0x3880) | (a > 0x477F))    # exponent outside [113, 142]
    if odd.size:
        vals = np.left_shift(u.reshape(-1)[odd], 16, dtype=np.uint32).view(np.float32)
        with np.errstate(over="ignore"):
            out.reshape(-1)[odd] = vals.astype(np.float16).view(np.uint16)
    return out.view(np.float16)


def to_f16(arr: np.ndarray) -> np.ndarray:
    """Values -> float16, round-to-nearest-even: numpy's ``astype(float16)`` bytes, faster.

    numpy converts element by element in C (~0.3 GB/s per core here); torch's conversion is
    vectorised (F16C / AVX), ~6-10x faster, and rounds every finite value the same way (IEEE
    round-to-nearest-even, subnormals included: ``tests/test_convert_stream.py``).  NaNs are the
    one difference (the hardware sets the quiet bit, numpy keeps the payload as is), so the few
    NaN entries, if any, are redone by numpy.  Small arrays, and a machine without torch, use numpy.
    """
    arr = np.asarray(arr)
    if arr.dtype == np.float16:
        return np.ascontiguousarray(arr)
    if arr.dtype != np.float32 or arr.size < _TORCH_MIN:
        return np.ascontiguousarray(arr, dtype=np.float16)
    try:
        import torch
    except ImportError:      # torch is a dependency; a broken install still converts, slower
        return np.ascontiguousarray(arr, dtype=np.float16)
    src = np.ascontiguousarray(arr)
    out = torch.from_numpy(src).to(torch.float16).numpy()
    nan = np.isnan(src)
    if nan.any():
        out[nan] = src[nan].astype(np.float16)
    return out


def encode_rows(arr: np.ndarray, ggml_type: str, imatrix: np.ndarray | None = None, first: int = 0) -> np.ndarray:
    """Values -> a contiguous array whose bytes are the GGUF tensor data of type ``ggml_type``.

    Floats are rounded once, to nearest even (numpy's f32 cast, :func:`to_f16`; BF16 through
    ml_dtypes, as torch's ``.to(torch.bfloat16)``).  Q8_0: our kernel (:func:`quantize_q8_0`;
    llama.cpp's Q8_0 ignores an importance matrix too).  Every other ggml type: llama.cpp's own
    kernel (:func:`~.ggml_quant.quantize_rows`) with ``imatrix``, one weight per column, or
    ``n_expert`` of them for a 3-D (expert) tensor whose first expert in ``arr`` is ``first``.
    """
    if ggml_type == "F32":
        return np.ascontiguousarray(arr, dtype=np.float32)
    if ggml_type == "F16":
        return to_f16(arr)
    if ggml_type == "BF16":
        import ml_dtypes
        return np.ascontiguousarray(np.asarray(arr, dtype=np.float32).astype(ml_dtypes.bfloat16)).view(np.uint16)
    if ggml_type == "Q8_0":
        return quantize_q8_0(arr)
    from . import ggml_quant
    if ggml_type not in ("F32", "F16", "BF16") and ggml_quant.is_quantized(ggml_type):
        arr = np.asarray(arr, dtype=np.float32)
        ne0 = arr.shape[-1]
        if imatrix is not None and imatrix.size != ne0:
            # one matrix per expert (llama-quant.cpp llama_tensor_quantize_impl: imatrix_for_row)
            if arr.ndim != 3:
                raise ValueError(f"an imatrix of {imatrix.size} for a {arr.shape} chunk")
            return np.stack([ggml_quant.quantize_rows(arr[i], ggml_type, imatrix[(first + i) * ne0:(first + i + 1) * ne0])
                             for i in range(arr.shape[0])])
        return ggml_quant.quantize_rows(arr, ggml_type, imatrix)
    raise UnsupportedError(f"writing GGUF type {ggml_type} is not supported")
