"""ggml tensor types and vectorised dequantization to float32 (numpy; no torch at import).

The type facts (``id -> name, elements per block, bytes per block``) are the one table of
:mod:`.ggml_types`.  A tensor of type ``T`` whose innermost dimension (ggml ``ne[0]``, the
*last* numpy axis) is ``n`` stores ``n / block_size`` blocks per row.

Each kernel below decodes a 2-D array of blocks ``[n_blocks, type_size] (uint8)`` into
``[n_blocks, block_size] (float32)``.  The block layouts follow ggml's
``ggml-common.h`` (``block_q4_K`` ...) and ``ggml-quants.c`` ``dequantize_row_*``.
Results are *element-exact* against ``gguf.quants.dequantize`` (gguf-py): every float32
product/sum is formed from the same operands in the same order (numpy never fuses a
multiply-add), so the roundings are the same; ``tests/test_dequant.py`` checks this
bit for bit on random blocks and on real tensors.

Why not just call gguf-py: it works in groups of 16 rows, keeps every group's temporaries
alive until a final concatenate, and unpacks bits byte by byte with broadcasting over short
axes (per-row loop overhead).  Here (measured on this 2-core machine; ``benchmarks/bench_gguf.py``):

* bit fields are unpacked eight bytes at a time on ``uint64`` lanes (SWAR: masks keep the bytes
  apart; ``_swar_sub`` subtracts the zero point per byte without carries), and re-ordered by
  copying whole 16-128-byte runs as numpy void items, so the only per-element passes left are
  one ``uint8 -> float32`` cast and the float32 scale/offset passes;
* per-block scales are expanded with ``np.repeat`` and applied in contiguous passes;
* blocks are decoded in chunks of :data:`CHUNK_ELEMENTS` outputs (1 MiB, inside L2) written
  straight into the output buffer;
* with more than one idle core, contiguous ranges of chunks run on a thread pool (numpy
  releases the GIL in its loops); see :func:`default_threads` for why only *idle* cores.

The IQ grid and sign tables are *data* from llama.cpp (``ggml-common.h`` ``iq2xxs_grid``
...).  Rather than duplicate several thousand table entries, they are read at first use
from the installed gguf-py package (``gguf.quants.<TYPE>.grid`` / ``IQ2_XXS.ksigns``),
a declared dependency; nothing else here calls gguf-py (the type table aside: :mod:`.ggml_types`).

:func:`dequantize_torch` is the thin torch wrapper (float32 or bfloat16); it imports
torch inside the function so that reading a GGUF (``inspect``) never imports torch.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .ggml_types import GGMLType, ggml_type

# Types read as their native numpy dtype (not "dequantized"): integers and F64.
NATIVE_DTYPES = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F64": np.float64}

# Output elements per chunk: 256 Ki float32 = 1 MiB, inside one core's L2 (2 MiB here),
# so the several passes a kernel makes over its chunk stay in cache.
CHUNK_ELEMENTS = 1 << 18


# --------------------------------------------------------------------------- helpers

# float16 bit pattern -> float32 value, for all 65536 patterns (256 KiB).  A table lookup
# on a strided column is ~2x faster than numpy's strided float16 cast, and gives the same
# values (the table is made by that very cast).
_F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)


def _f16(b: np.ndarray, byte_offset: int) -> np.ndarray:
    """float16 field at ``byte_offset`` of every block -> float32 ``[n]``."""
    if byte_offset % 2 == 0 and b.shape[1] % 2 == 0 and b.strides[1] == 1:
        bits = b.view(np.uint16)[:, byte_offset // 2]
    else:
        bits = b[:, byte_offset].astype(np.uint16) | (b[:, byte_offset + 1].astype(np.uint16) << np.uint16(8))
    return _F16_TABLE.take(bits)


def _u32(b: np.ndarray, start: int, count: int) -> np.ndarray:
    """``count`` little-endian uint32 fields from byte ``start`` -> ``[n, count]``."""
    return np.ascontiguousarray(b[:, start:start + 4 * count].view(np.dtype(f"V{4 * count}"))).view("<u4")


def _u16(b: np.ndarray, start: int, count: int) -> np.ndarray:
    """``count`` little-endian uint16 fields from byte ``start`` -> ``[n, count]``."""
    return np.ascontiguousarray(b[:, start:start + 2 * count].view(np.dtype(f"V{2 * count}"))).view("<u2")


def _nibbles(q: np.ndarray, dst: np.ndarray) -> None:
    """Low nibbles of ``q[..., k]`` -> ``dst[..., 0, k]``; high nibbles -> ``dst[..., 1, k]``."""
    np.bitwise_and(q, 15, out=dst[..., 0, :], casting="unsafe")
    np.right_shift(q, 4, out=dst[..., 1, :], casting="unsafe")


_LO4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_LO2 = np.uint64(0x0303030303030303)


def _interleave(parts: list[np.ndarray]) -> np.ndarray:
    """k contiguous arrays ``[n, g, B bytes]`` -> uint8 ``[n, g, k, B]`` (part i at ``[:, :, i]``).

    The copies move whole B-byte runs as numpy void items (``V{B}``): one long inner loop
    per part instead of one short loop per block, which is what makes this cheap.
    """
    n, g = parts[0].shape[:2]
    nbytes = parts[0].nbytes // (n * g)
    vt = np.dtype(f"V{nbytes}")
    out = np.empty((n * g, len(parts)), vt)
    for i, p in enumerate(parts):
        out[:, i] = np.ascontiguousarray(p).view(np.uint8).reshape(n * g, nbytes).view(vt)[:, 0]
    return out.view(np.uint8).reshape(n, g, len(parts), nbytes)


def _lanes(q: np.ndarray) -> np.ndarray:
    """uint8 ``[n, g, k]`` (k a multiple of 8; rows may be strided) -> contiguous uint64 lanes ``[n, g, k/8]``.

    Each row's ``g * k`` bytes are copied as one void item (a long inner loop), not byte-wise.
    """
    n, g, k = q.shape
    rows = q.reshape(n, g * k)
    if rows.strides[1] == 1:
        rows = np.ascontiguousarray(rows.view(np.dtype(f"V{g * k}"))).view(np.uint8)
    else:
        rows = np.ascontiguousarray(rows)
    return rows.view(np.uint64).reshape(n, g, k // 8)


def _nibbles_u8(q: np.ndarray) -> np.ndarray:
    """uint8 ``[n, g, k]`` (k a multiple of 8) -> uint8 ``[n, g, 2, k]``: low nibbles, then high.

    Works on 8 bytes at a time through uint64 lanes (the mask keeps every byte's bits
    apart), so the per-element work left is one contiguous uint8 -> float32 cast.
    """
    x = _lanes(q)
    return _interleave([x & _LO4, (x >> np.uint64(4)) & _LO4])


def _crumbs_u8(q: np.ndarray) -> np.ndarray:
    """uint8 ``[n, g, k]`` -> uint8 ``[n, g, 4, k]``: bits 0-1, 2-3, 4-5, 6-7 of each byte."""
    x = _lanes(q)
    return _interleave([(x >> np.uint64(2 * j)) & _LO2 for j in range(4)])


def _scale_flat(o: np.ndarray, s: np.ndarray, op) -> None:
    """``o[i, g*w:(g+1)*w] op= s[i, g]`` with one contiguous pass (``w = o.size / s.size``)."""
    flat = o.reshape(-1)
    op(flat, np.repeat(s.reshape(-1), flat.size // s.size), out=flat)


def _bits_le(x: np.ndarray) -> np.ndarray:
    """uint8 ``[..., k]`` -> bits ``[..., k, 8]`` (bit j of byte i at ``[..., i, j]``)."""
    return np.unpackbits(x[..., None], axis=-1, bitorder="little")


def _signs(bits: np.ndarray) -> np.ndarray:
    """0/1 sign bits -> +1/-1 float32."""
    return np.where(bits == 0, np.float32(1), np.float32(-1))


_SH_0_4 = np.array([0, 4], dtype=np.uint8)
_SH_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)
_SH_1BIT = np.arange(8, dtype=np.uint8)

# --------------------------------------------------------------------------- kernels
# Each: (blocks uint8 [n, type_size], out float32 [n, block_size]) -> None.


def _swar_sub(q64: np.ndarray, k: int) -> np.ndarray:
    """Bytes ``v`` (each ``v + 0x80 - k < 256`` and ``v < 128``) -> bytes ``(v - k) mod 256`` (int8 ``v - k``).

    SWAR: adding ``0x80 - k`` to every byte never carries into the next byte under the
    precondition, and flipping bit 7 turns that into ``v - k`` in two's complement.
    """
    rep = np.uint64(0x0101010101010101)
    q64 += np.uint64(0x80 - k) * rep
    q64 ^= np.uint64(0x80) * rep
    return q64


# _SPREAD8[x]: the 8 bits of x moved to bit 0 of 8 consecutive bytes (little endian).
_SPREAD8 = (np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
            .astype(np.uint8).view(np.uint64).reshape(256))


def _k_q4_0(b, o):
    # block_q4_0: d f16 | qs[16]; x = d * (nibble - 8); lows are elements 0..15, highs 16..31
    n = b.shape[0]
    q = _nibbles_u8(b[:, 2:18].reshape(n, 1, 16))
    o[...] = _swar_sub(q.reshape(n, 32).view(np.uint64), 8).view(np.int8)
    _scale_flat(o, _f16(b, 0), np.multiply)


def _k_q4_1(b, o):
    # block_q4_1: d f16 | m f16 | qs[16]; x = d * nibble + m
    n = b.shape[0]
    o[...] = _nibbles_u8(b[:, 4:20].reshape(n, 1, 16)).reshape(n, 32)
    _scale_flat(o, _f16(b, 0), np.multiply)
    _scale_flat(o, _f16(b, 2), np.add)


def _q5_values(qh_bytes: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 5-bit values as uint64 lanes [n, 4]: nibble | (bit j of the u32 qh) << 4."""
    n = qs.shape[0]
    q64 = _nibbles_u8(qs.reshape(n, 1, 16)).reshape(n, 32).view(np.uint64)
    q64 |= _SPREAD8[qh_bytes] << np.uint64(4)
    return q64


def _k_q5_0(b, o):
    # block_q5_0: d f16 | qh u32 | qs[16]; x = d * (q - 16)
    o[...] = _swar_sub(_q5_values(b[:, 2:6], b[:, 6:22]), 16).view(np.int8)
    _scale_flat(o, _f16(b, 0), np.multiply)


def _k_q5_1(b, o):
    # block_q5_1: d f16 | m f16 | qh u32 | qs[16]; x = d * q + m
    o[...] = _q5_values(b[:, 4:8], b[:, 8:24]).view(np.uint8)
    _scale_flat(o, _f16(b, 0), np.multiply)
    _scale_flat(o, _f16(b, 2), np.add)


def _k_q8_0(b, o):
    # block_q8_0: d f16 | qs int8[32]; x = qs * d
    o[...] = b[:, 2:34].view(np.int8)
    _scale_flat(o, _f16(b, 0), np.multiply)


def _bitplanes(bits: np.ndarray, shift: int) -> np.ndarray:
    """uint8 ``[n, k]`` -> uint64 lanes of bytes ``[n, 8, k]``: bit j of byte i, moved to bit ``shift``, at ``[:, j, i]``.

    K-quant high bits: bit j of ``qh[k]`` belongs to element ``32 j + k`` (Q3_K hmask,
    Q5_K qh).
    """
    n, k = bits.shape
    h64 = _lanes(bits.reshape(n, 1, k))
    one = np.uint64(0x0101010101010101)
    planes = _interleave([((h64 >> np.uint64(j)) & one) << np.uint64(shift) for j in range(8)])
    return planes.reshape(n, 8, k).view(np.uint64)


def _k_q2_k(b, o):
    # block_q2_K: scales[16] (lo nibble scale, hi nibble min) | qs[64] | d f16 | dmin f16
    n = b.shape[0]
    sc = b[:, :16]
    dl = _f16(b, 80)[:, None] * (sc & np.uint8(15)).astype(np.float32)
    ml = _f16(b, 82)[:, None] * (sc >> np.uint8(4)).astype(np.float32)
    o[...] = _crumbs_u8(b[:, 16:80].reshape(n, 2, 32)).reshape(n, 256)
    _scale_flat(o, dl, np.multiply)        # x = dl * q - ml
    _scale_flat(o, ml, np.subtract)


def _k_q3_k(b, o):
    # block_q3_K: hmask[32] | qs[64] | scales[12] (16 x 6-bit) | d f16
    n = b.shape[0]
    sc = b[:, 96:108]
    lo = (sc[:, None, :8] >> _SH_0_4[:, None]).reshape(n, 16) & np.uint8(15)
    hi = (sc[:, None, 8:12] >> _SH_2BIT[:, None]).reshape(n, 16) & np.uint8(3)
    scales = ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = _f16(b, 108)[:, None] * scales                                          # [n, 16]
    # q = low 2 bits - (4 if the hmask bit is clear else 0) = (low | hbit << 2) - 4
    # (ggml dequantize_row_q3_K)
    q64 = _crumbs_u8(b[:, 32:96].reshape(n, 2, 32)).reshape(n, 8, 32).view(np.uint64)
    q64 |= _bitplanes(b[:, :32], 2)
    o[...] = _swar_sub(q64, 4).view(np.int8).reshape(n, 256)
    _scale_flat(o, dl, np.multiply)


def _k_scale_min(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K packed 6-bit (scale, min) x 8 from 12 bytes (ggml ``get_scale_min_k4``).

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high
    nibble).  Done on uint32 words, four bytes at a time (masks keep the bytes apart).
    """
    n = sc12.shape[0]
    w = _lanes32(sc12)                                   # [n, 3] uint32
    d, m, md = w[:, 0], w[:, 1], w[:, 2]
    m6, m4, m2 = np.uint32(0x3F3F3F3F), np.uint32(0x0F0F0F0F), np.uint32(0x30303030)
    scale = np.empty((n, 2), np.uint32)
    mins = np.empty((n, 2), np.uint32)
    np.bitwise_and(d, m6, out=scale[:, 0])
    np.bitwise_or(md & m4, (d >> np.uint32(2)) & m2, out=scale[:, 1])
    np.bitwise_and(m, m6, out=mins[:, 0])
    np.bitwise_or((md >> np.uint32(4)) & m4, (m >> np.uint32(2)) & m2, out=mins[:, 1])
    return scale.view(np.uint8), mins.view(np.uint8)


def _lanes32(q: np.ndarray) -> np.ndarray:
    """uint8 ``[n, 4k]`` (rows may be strided) -> contiguous little-endian uint32 ``[n, k]``."""
    n, k = q.shape
    return np.ascontiguousarray(q.view(np.dtype(f"V{k}"))).view("<u4").reshape(n, k // 4)


def _k_q4_k(b, o):
    # block_q4_K: d f16 | dmin f16 | scales[12] | qs[128]; sub-block j (32 values) uses the
    # low nibbles (j even) or high nibbles (j odd) of qs[32*(j//2) : 32*(j//2)+32]
    n = b.shape[0]
    scale, mins = _k_scale_min(b[:, 4:16])
    ds = _f16(b, 0)[:, None] * scale.astype(np.float32)     # [n, 8]
    dm = _f16(b, 2)[:, None] * mins.astype(np.float32)
    o[...] = _nibbles_u8(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 256)
    _scale_flat(o, ds, np.multiply)                           # x = ds * q - dm
    _scale_flat(o, dm, np.subtract)


def _k_q5_k(b, o):
    # block_q5_K: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; bit j of qh[k] is the
    # 5th bit of element 32*j + k
    n = b.shape[0]
    scale, mins = _k_scale_min(b[:, 4:16])
    ds = _f16(b, 0)[:, None] * scale.astype(np.float32)
    dm = _f16(b, 2)[:, None] * mins.astype(np.float32)
    q64 = _nibbles_u8(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32).view(np.uint64)
    q64 |= _bitplanes(b[:, 16:48], 4)
    o[...] = q64.view(np.uint8).reshape(n, 256)
    _scale_flat(o, ds, np.multiply)
    _scale_flat(o, dm, np.subtract)


def _k_q6_k(b, o):
    # block_q6_K: ql[128] | qh[64] | scales int8[16] | d f16; x = d * scale[e // 16] * (q - 32)
    # element e = 128 h + 32 g + k: low 4 bits from ql[64 h + 32 (g & 1) + k] (nibble g >> 1),
    # high 2 bits from qh[32 h + k] >> 2 g
    n = b.shape[0]
    q64 = _nibbles_u8(b[:, :128].reshape(n, 2, 64)).reshape(n, 2, 4, 32).view(np.uint64)
    hb = _crumbs_u8(b[:, 128:192].reshape(n, 2, 32)).view(np.uint64)      # [n, 2, 4, 4]
    hb <<= np.uint64(4)
    q64 |= hb
    o[...] = _swar_sub(q64, 32).view(np.int8).reshape(n, 256)
    _scale_flat(o, _f16(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(np.float32), np.multiply)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _k_tq1_0(b, o):
    # block_tq1_0: qs[48] | qh[4] | d f16; base-3 digits packed 5 (qs) or 4 (qh) per byte as a
    # fixed-point fraction: digit k of byte x is ((x * 3^k mod 256) * 3) >> 8 (ggml-quants.c)
    n = b.shape[0]
    parts = [
        (b[:, None, 0:32] * _POW3[:, None]).reshape(n, 160),
        (b[:, None, 32:48] * _POW3[:, None]).reshape(n, 80),
        (b[:, None, 48:52] * _POW3[:4, None]).reshape(n, 16),
    ]
    q = np.concatenate(parts, axis=1)
    o[...] = ((q.astype(np.uint16) * np.uint16(3)) >> np.uint16(8)).astype(np.int8) - np.int8(1)
    _scale_flat(o, _f16(b, 52), np.multiply)


def _k_tq2_0(b, o):
    # block_tq2_0: qs[64] | d f16; 2-bit values minus 1
    n = b.shape[0]
    q64 = _crumbs_u8(b[:, :64].reshape(n, 2, 32)).view(np.uint64)
    o[...] = _swar_sub(q64, 1).view(np.int8).reshape(n, 256)
    _scale_flat(o, _f16(b, 64), np.multiply)


# E2M1 values, doubled (ggml kvalues_mxfp4); the block scale is halved to compensate.
_KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
E2M1_VALUES = _KV_MXFP4 / np.float32(2)      # the 16 FP4 (E2M1) values themselves (code 8 is -0 there, 0 here)


def _e8m0_half_table() -> np.ndarray:
    # ggml-impl.h ggml_e8m0_to_fp32_half: 2^(e - 128) as float32 bits (subnormal for e < 2)
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


def _ue4m3_table() -> np.ndarray:
    # unsigned E4M3 (bias 7) scale of NVFP4, times 0.5 for the doubled kvalues (ggml-impl.h
    # ggml_ue4m3_to_fp32); 0 and 0x7F decode to 0.  Every value is exact in float32.
    x = np.arange(256)
    exp, man = (x >> 3) & 15, (x & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    return np.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).astype(np.float32)


_E8M0_HALF = _e8m0_half_table()
_UE4M3 = _ue4m3_table()


def _k_mxfp4(b, o):
    # block_mxfp4: e (E8M0) | qs[16]; lows are elements 0..15, highs 16..31
    n = b.shape[0]
    q = np.empty((n, 2, 16), np.uint8)
    _nibbles(b[:, 1:17], q)
    o[...] = _KV_MXFP4[q.reshape(n, 32)]
    _scale_flat(o, _E8M0_HALF[b[:, 0]], np.multiply)


def _k_nvfp4(b, o):
    # block_nvfp4: 4 UE4M3 scales | qs[4][8]; sub-block s: lows then highs of its 8 bytes
    n = b.shape[0]
    q = np.empty((n, 4, 2, 8), np.uint8)
    _nibbles(b[:, 4:36].reshape(n, 4, 8), q)
    o[...] = _KV_MXFP4[q.reshape(n, 64)]
    _scale_flat(o, _UE4M3[b[:, :4]], np.multiply)


_KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _k_iq4_nl(b, o):
    # block_iq4_nl: d f16 | qs[16]; non-linear 4-bit codebook
    n = b.shape[0]
    q = np.empty((n, 2, 16), np.uint8)
    _nibbles(b[:, 2:18], q)
    o[...] = _KV_IQ4NL[q.reshape(n, 32)]
    _scale_flat(o, _f16(b, 0), np.multiply)


def _k_iq4_xs(b, o):
    # block_iq4_xs: d f16 | scales_h u16 | scales_l[4] | qs[128]; 8 sub-blocks of 32 with
    # 6-bit scales (low 4 bits in scales_l nibbles, high 2 bits in scales_h) minus 32
    n = b.shape[0]
    lo = (b[:, 4:8, None] >> _SH_0_4).reshape(n, 8) & np.uint8(15)
    sh = _u16(b, 2, 1)                                                      # [n, 1]
    hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)).astype(np.uint8)
    dl = _f16(b, 0)[:, None] * ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    q = np.empty((n, 8, 2, 16), np.uint8)
    _nibbles(b[:, 8:136].reshape(n, 8, 16), q)
    o[...] = _KV_IQ4NL[q.reshape(n, 256)]
    _scale_flat(o, dl, np.multiply)


_IQ_TABLES: dict = {}


def _iq_table(name: str) -> np.ndarray:
    """IQ codebook ``[rows, cols]`` float32 (see module docstring: data from gguf-py)."""
    if name not in _IQ_TABLES:
        from gguf import quants as gq  # data tables only
        if name == "ksigns":
            _IQ_TABLES[name] = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()
        else:
            cls = getattr(gq, name)
            cls.init_grid()
            _IQ_TABLES[name] = np.ascontiguousarray(cls.grid.reshape(cls.grid_shape), dtype=np.float32)
    return _IQ_TABLES[name]


def _ksign_values(idx7: np.ndarray) -> np.ndarray:
    """7-bit sign indices -> +-1 float32 ``[..., 8]`` through the ``ksigns`` parity table."""
    return _signs(_bits_le(_iq_table("ksigns")[idx7]))


def _iq_half_scale(d: np.ndarray, s: np.ndarray, factor: float) -> np.ndarray:
    # gguf-py / ggml: db = d * (0.5 + s) * factor, evaluated left to right in float32
    return d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(factor)


def _k_iq2_xxs(b, o):
    # block_iq2_xxs: d f16 | qs u16[32] read as 8 x (u32 grid bytes, u32 signs+scale)
    n = b.shape[0]
    aux = _u32(b, 2, 16).reshape(n, 8, 2)
    db = _iq_half_scale(_f16(b, 0)[:, None], aux[..., 1] >> np.uint32(28), 0.25)          # [n, 8]
    sidx = (aux[..., 1][..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)
    signs = _ksign_values(sidx)                                                              # [n, 8, 4, 8]
    gidx = np.ascontiguousarray(aux[..., 0]).view(np.uint8).reshape(n, 8, 4)
    grid = _iq_table("IQ2_XXS")[gidx]                                                       # [n, 8, 4, 8]
    np.multiply(db[:, :, None, None] * grid, signs, out=o.reshape(n, 8, 4, 8))


def _k_iq2_xs(b, o):
    # block_iq2_xs: d f16 | qs u16[32] (9-bit grid index, 7-bit sign index) | scales[8]
    n = b.shape[0]
    qs = _u16(b, 2, 32)
    sc = (b[:, 66:74, None] >> _SH_0_4).reshape(n, 16) & np.uint8(15)
    db = _iq_half_scale(_f16(b, 0)[:, None], sc, 0.25)                                      # [n, 16]
    signs = _ksign_values(qs >> np.uint16(9)).reshape(n, 16, 2, 8)
    grid = _iq_table("IQ2_XS")[qs & np.uint16(511)].reshape(n, 16, 2, 8)
    np.multiply(db[:, :, None, None] * grid, signs, out=o.reshape(n, 16, 2, 8))


def _k_iq2_s(b, o):
    # block_iq2_s: d f16 | qs[32] | signs[32] | qh[8] | scales[8]; 10-bit grid index
    n = b.shape[0]
    sc = (b[:, 74:82, None] >> _SH_0_4).reshape(n, 16) & np.uint8(15)
    db = _iq_half_scale(_f16(b, 0)[:, None], sc, 0.25)
    signs = _signs(_bits_le(b[:, 34:66])).reshape(n, 16, 2, 8)
    qh = ((b[:, 66:74, None] >> _SH_2BIT) & np.uint8(3)).reshape(n, 32).astype(np.uint16)
    idx = b[:, 2:34].astype(np.uint16) | (qh << np.uint16(8))
    grid = _iq_table("IQ2_S")[idx].reshape(n, 16, 2, 8)
    np.multiply(db[:, :, None, None] * grid, signs, out=o.reshape(n, 16, 2, 8))


def _k_iq3_xxs(b, o):
    # block_iq3_xxs: d f16 | qs[64] (grid indices) | 8 x u32 (4 x 7-bit sign index, 4-bit scale)
    n = b.shape[0]
    sc = _u32(b, 66, 8)
    db = _iq_half_scale(_f16(b, 0)[:, None], sc >> np.uint32(28), 0.5)
    sidx = (sc[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)
    signs = _ksign_values(sidx)                                                              # [n, 8, 4, 8]
    grid = _iq_table("IQ3_XXS")[b[:, 2:66]].reshape(n, 8, 4, 8)
    np.multiply(db[:, :, None, None] * grid, signs, out=o.reshape(n, 8, 4, 8))


def _k_iq3_s(b, o):
    # block_iq3_s: d f16 | qs[64] | qh[8] | signs[32] | scales[4]; db = d * (1 + 2 * scale)
    n = b.shape[0]
    sc = (b[:, 106:110, None] >> _SH_0_4).reshape(n, 8) & np.uint8(15)
    db = _f16(b, 0)[:, None] * (np.uint8(1) + np.uint8(2) * sc)
    signs = _signs(_bits_le(b[:, 74:106])).reshape(n, 8, 4, 8)
    qh = _bits_le(b[:, 66:74]).reshape(n, 64).astype(np.uint16)
    idx = b[:, 2:66].astype(np.uint16) | (qh << np.uint16(8))
    grid = _iq_table("IQ3_S")[idx].reshape(n, 8, 4, 8)
    np.multiply(db[:, :, None, None] * grid, signs, out=o.reshape(n, 8, 4, 8))


_IQ1_DELTA = np.float32(0.125)


def _k_iq1_s(b, o):
    # block_iq1_s: d f16 | qs[32] | qh u16[8] (3 bits of grid index x 4, 3-bit scale, delta sign)
    n = b.shape[0]
    qh = _u16(b, 34, 8)
    dl = _f16(b, 0)[:, None] * (np.uint16(2) * ((qh >> np.uint16(12)) & np.uint16(7)) + np.uint16(1))
    delta = np.where((qh & np.uint16(0x8000)) == 0, _IQ1_DELTA, -_IQ1_DELTA)
    hi = ((qh[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)).reshape(n, 32)
    idx = b[:, 2:34].astype(np.uint16) | (hi << np.uint16(8))
    grid = _iq_table("IQ1_S")[idx].reshape(n, 8, 4, 8)
    np.multiply(dl[:, :, None, None], grid + delta[:, :, None, None], out=o.reshape(n, 8, 4, 8))


def _k_iq1_m(b, o):
    # block_iq1_m: qs[32] | qh[16] | scales u16[4]; the f16 super-scale is spread over the
    # top nibbles of the four scale words; 3-bit sub-scales below them
    n = b.shape[0]
    sw = _u16(b, 48, 4)
    top = (sw & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = (top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]).view(np.float16).astype(np.float32)
    sub = ((sw[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)).reshape(n, 16)
    dl = d[:, None] * (np.uint16(2) * sub + np.uint16(1))                                  # [n, 16]
    qh = (b[:, 32:48, None] >> _SH_0_4).reshape(n, 32)
    idx = b[:, :32].astype(np.uint16) | ((qh & np.uint8(7)).astype(np.uint16) << np.uint16(8))
    delta = np.where((qh & np.uint8(8)) == 0, _IQ1_DELTA, -_IQ1_DELTA).reshape(n, 8, 2, 2, 1)
    grid = _iq_table("IQ1_M")[idx].reshape(n, 8, 2, 2, 8)
    np.multiply(dl.reshape(n, 8, 2, 1, 1), grid + delta, out=o.reshape(n, 8, 2, 2, 8))


KERNELS = {
    "Q4_0": _k_q4_0, "Q4_1": _k_q4_1, "Q5_0": _k_q5_0, "Q5_1": _k_q5_1, "Q8_0": _k_q8_0,
    "Q2_K": _k_q2_k, "Q3_K": _k_q3_k, "Q4_K": _k_q4_k, "Q5_K": _k_q5_k, "Q6_K": _k_q6_k,
    "TQ1_0": _k_tq1_0, "TQ2_0": _k_tq2_0, "MXFP4": _k_mxfp4, "NVFP4": _k_nvfp4,
    "IQ4_NL": _k_iq4_nl, "IQ4_XS": _k_iq4_xs, "IQ2_XXS": _k_iq2_xxs, "IQ2_XS": _k_iq2_xs,
    "IQ2_S": _k_iq2_s, "IQ3_XXS": _k_iq3_xxs, "IQ3_S": _k_iq3_s, "IQ1_S": _k_iq1_s, "IQ1_M": _k_iq1_m,
}
FLOAT_TYPES = ("F32", "F16", "BF16")


def supported_types() -> tuple[str, ...]:
    """Type names :func:`dequantize` decodes to float32 (plus the native ``NATIVE_DTYPES``)."""
    return FLOAT_TYPES + tuple(KERNELS)


# --------------------------------------------------------------------------- driver

_POOL: ThreadPoolExecutor | None = None


def default_threads() -> int:
    """Worker threads: ``CKPT_SURGEON_THREADS``, else the *idle* CPUs this process may run on.

    Idle = usable CPUs minus what keeps them busy (at least 1): the 1-minute load average, or the
    processes runnable right now besides this one (``/proc/loadavg``'s fourth field), whichever is
    larger: the average lags a minute behind work that has just started (measured: two busy loops
    started 5 s before a verify left the average at 0.2, so it took 2 threads and spent 37.5 s of
    CPU spinning where 1 thread spends 10.4 s).  Measured on the 2-core machine this was tuned on:
    while other processes keep the cores busy a second worker only adds GIL hand-offs (5-10 %
    slower), so it is used only when a core is actually free.
    """
    env = os.environ.get("CKPT_SURGEON_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(cpus, int(cpus - max(busy, _running_others()) + 0.5)))


_RUNNING: list = [0.0, 0]          # (when, count) of the last reading: asked per tensor, read at most once a second


def _running_others() -> int:
    """Tasks runnable this instant besides this process's own (``/proc/loadavg``'s ``running/total`` less this
    process's threads in state R), 0 where the files are not there: the least of 5 readings 2 ms apart, so that a
    kernel thread passing by is not counted as load (a busy loop is in every reading)."""
    now = time.monotonic()
    if now - _RUNNING[0] < 1.0:
        return _RUNNING[1]
    counts = []
    for _ in range(5):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
            counts.append(running - _own_running())
        except (OSError, IndexError, ValueError):
            return 0
        time.sleep(0.002)
    _RUNNING[:] = [now, max(0, min(counts))]
    return _RUNNING[1]


def _own_running() -> int:
    own = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                own += f.read().rpartition(")")[2].split()[0] == "R"
        except OSError:          # a thread that just ended
            pass
    return max(1, own)


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:
        old, _POOL = _POOL, ThreadPoolExecutor(max_workers=n, thread_name_prefix="ckpt-dequant")
        if old is not None:
            old.shutdown(wait=False)
    return _POOL


def _as_u8(raw) -> np.ndarray:
    if isinstance(raw, np.ndarray):
        return raw.reshape(-1).view(np.uint8) if raw.flags.c_contiguous else np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return np.frombuffer(raw, dtype=np.uint8)


def dequantize(raw, ggml_type_: int | str | GGMLType, shape: tuple | None = None, *,
               threads: int | None = None) -> np.ndarray:
    """Raw bytes of one tensor -> float32 array (``shape`` in numpy order, else 1-D).

    ``raw``: bytes / bytearray / memoryview / uint8 array of ``k * type_size`` bytes.
    Integer and F64 types come back in their native dtype (they are not quantized).
    Raises ``ValueError`` for a byte count that is not whole blocks or does not match
    ``shape``, ``NotImplementedError`` for a type without a decoder (Q8_1, Q8_K, Q1_0).
    """
    t = ggml_type(ggml_type_)
    buf = _as_u8(raw)
    if buf.size % t.type_size:
        raise ValueError(f"{buf.size} bytes is not a whole number of {t.name} blocks ({t.type_size} bytes each)")
    n_blocks = buf.size // t.type_size
    numel = n_blocks * t.block_size
    if shape is not None:
        want = 1
        for d in shape:
            want *= int(d)
        if want != numel:
            raise ValueError(f"{buf.size} bytes of {t.name} hold {numel} elements, shape {tuple(shape)} needs {want}")
    if t.name in NATIVE_DTYPES:
        out = buf.view(NATIVE_DTYPES[t.name]).copy()
    elif t.name == "F32":
        out = buf.view(np.float32).copy()
    elif t.name == "F16":
        out = buf.view(np.float16).astype(np.float32)
    elif t.name == "BF16":
        # bfloat16 is the top half of a float32: widen by a 16-bit shift (exact)
        out = (buf.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    elif t.name in KERNELS:
        out = np.empty(numel, np.float32)
        _run_kernel(KERNELS[t.name], buf.reshape(n_blocks, t.type_size), out.reshape(n_blocks, t.block_size),
                    threads)
    else:
        raise NotImplementedError(f"dequantizing ggml type {t.name} is not supported "
                                  f"(supported: {', '.join(supported_types())})")
    return out.reshape(shape) if shape is not None else out


def _run_kernel(kernel, blocks: np.ndarray, out: np.ndarray, threads: int | None) -> None:
    """Decode in chunks of ~CHUNK_ELEMENTS outputs; with threads, each worker (the caller is one
    of them) takes one contiguous range, so it also first-touches its own part of ``out``."""
    n_blocks, block_size = out.shape
    per_chunk = max(1, CHUNK_ELEMENTS // block_size)
    threads = default_threads() if threads is None else max(1, int(threads))
    threads = min(threads, -(-n_blocks // per_chunk))

    def work(lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):   # NaN/Inf scales propagate as in ggml, silently (errstate is per thread)
            for s in range(lo, hi, per_chunk):
                kernel(blocks[s:min(s + per_chunk, hi)], out[s:min(s + per_chunk, hi)])

    if threads <= 1:
        work(0, n_blocks)
        return
    # range boundaries on chunk multiples, so chunks stay full-sized
    chunks = -(-n_blocks // per_chunk)
    bounds = [min(n_blocks, (chunks * i // threads) * per_chunk) for i in range(threads + 1)]
    futures = [_pool(threads - 1).submit(work, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    work(bounds[0], bounds[1])
    for f in futures:
        f.result()


def dequantize_torch(raw, ggml_type_: int | str | GGMLType, shape: tuple | None = None, *,
                     dtype: str = "float32", threads: int | None = None):
    """Like :func:`dequantize` but returns a ``torch.Tensor`` (``dtype`` "float32" or "bfloat16").

    The float32 values are exactly :func:`dequantize`'s; bfloat16 rounds them to nearest-even
    (torch's cast).  torch is imported here, never at module import.
    """
    import torch

    want = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in want and dtype not in want.values():
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', not {dtype!r}")
    arr = dequantize(raw, ggml_type_, shape, threads=threads)
    t = torch.from_numpy(np.ascontiguousarray(arr))
    tdt = want.get(dtype, dtype)
    return t if tdt == torch.float32 and t.dtype == torch.float32 else t.to(tdt)
