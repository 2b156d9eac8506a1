"""Quantized weights moved into ggml block types bit for bit (no value is dequantized and requantized).

The sources (compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``, ModelOpt NVFP4) store a
row of ``n`` E2M1 codes as ``n/2`` bytes, byte ``k`` holding element ``2k`` in its low nibble and ``2k + 1``
in its high one, with one scale per 16 (NVFP4: F8_E4M3 bits) or 32 (MXFP4: an E8M0 exponent byte) values.

ggml's blocks (``ggml-common.h``; decoded by :mod:`.dequant` ``_k_nvfp4`` / ``_k_mxfp4``, which match
gguf-py's dequantization, ``tests/test_dequant.py``):

* ``block_mxfp4`` (32 values, 17 bytes): the E8M0 byte, then 16 bytes whose byte ``j`` holds element
  ``j`` in its low nibble and element ``j + 16`` in its high one;
* ``block_nvfp4`` (64 values, 36 bytes): four UE4M3 scale bytes (one per 16 values; the E4M3 sign bit
  cleared, as llama.cpp's converter stores them), then four groups of 8 bytes, byte ``j`` of group ``s``
  holding element ``16 s + j`` (low nibble) and ``16 s + j + 8`` (high).

The 4-bit codes index the same E2M1 table on both sides (ggml's ``kvalues_mxfp4`` are the E2M1 values
doubled, its scales halved), so each element keeps its code and each group its scale byte.

Symmetric int4 (compressed-tensors ``pack-quantized`` without a zero point: ``w = (q - 8) * s``, eight codes a
little-endian int32 word, low nibble first) is ggml's ``block_q4_0`` exactly (32 values, 18 bytes: the f16
scale ``d``, then 16 bytes whose byte ``j`` holds code ``j`` in its low nibble and ``j + 16`` in its high one;
``x = d * (q - 8)``) when the group is a multiple of 32 and every scale is an f16 value: each block of 32
takes its group's scale, each element its code.
"""
from __future__ import annotations

import numpy as np

from .ggml_types import ggml_type

__all__ = ["KEPT", "repack_rows", "q4_0_rows", "f16_exact"]

# scheme key -> the ggml type its weights are kept in
KEPT = {"ct-nvfp4": "NVFP4", "modelopt-nvfp4": "NVFP4", "ct-mxfp4": "MXFP4"}


def _codes(packed: np.ndarray) -> np.ndarray:
    """uint8 ``[rows, n/2]`` -> codes ``[rows, n]`` (element 2k: low nibble of byte k)."""
    out = np.empty(packed.shape + (2,), np.uint8)
    np.bitwise_and(packed, 15, out=out[..., 0])
    np.right_shift(packed, 4, out=out[..., 1])
    return out.reshape(packed.shape[0], -1)


def _pack(codes: np.ndarray, half: int) -> np.ndarray:
    """codes ``[..., 2 half]`` -> bytes ``[..., half]``: element j low, element j + half high."""
    return codes[..., :half] | (codes[..., half:] << 4)


def repack_rows(ggml: str, packed: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """Rows of FP4 codes and their scale bytes -> the rows of ``ggml`` (``NVFP4`` / ``MXFP4``) blocks,
    uint8 ``[rows, n / block * type_size]``.  ``scale_bytes``: uint8 ``[rows, n / 16]`` (F8_E4M3 bits)
    or ``[rows, n / 32]`` (E8M0)."""
    t = ggml_type(ggml)
    packed = np.ascontiguousarray(packed, np.uint8)
    s = np.ascontiguousarray(scale_bytes, np.uint8)
    rows, n = packed.shape[0], packed.shape[1] * 2
    if n % t.block_size:
        raise ValueError(f"a row of {n} values is not a whole number of {ggml} blocks ({t.block_size})")
    nb = n // t.block_size
    codes = _codes(packed)
    if ggml == "MXFP4":
        if s.shape != (rows, nb):
            raise ValueError(f"{ggml}: scales {list(s.shape)} for rows [{rows}, {n}]")
        out = np.empty((rows, nb, 17), np.uint8)
        out[:, :, 0] = s
        out[:, :, 1:] = _pack(codes.reshape(rows, nb, 32), 16)
        return out.reshape(rows, nb * 17)
    if ggml == "NVFP4":
        if s.shape != (rows, nb * 4):
            raise ValueError(f"{ggml}: scales {list(s.shape)} for rows [{rows}, {n}]")
        out = np.empty((rows, nb, 36), np.uint8)
        out[:, :, :4] = (s & 0x7F).reshape(rows, nb, 4)
        out[:, :, 4:] = _pack(codes.reshape(rows, nb, 4, 16), 8).reshape(rows, nb, 32)
        return out.reshape(rows, nb * 36)
    raise ValueError(f"{ggml} is not an FP4 block type")


def f16_exact(scale: np.ndarray) -> bool:
    """Whether every (float32) scale is a finite float16 value (a Q4_0 block's ``d`` holds it exactly)."""
    s = np.asarray(scale, np.float32)
    with np.errstate(over="ignore"):
        h = s.astype(np.float16)
    return bool(np.all(np.isfinite(h)) and np.array_equal(h.astype(np.float32), s))


def q4_0_rows(packed: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """Rows of symmetric int4 codes (int32 ``[rows, n/8]``, low nibble first) and their float32 group scales
    ``[rows, n/group]`` (f16 values: :func:`f16_exact`) -> the rows of ``block_q4_0``, uint8 ``[rows, n/32*18]``."""
    from .kernels import unpack_last
    codes = unpack_last(packed, 4)                                   # [rows, n], 0..15 (offset 8)
    rows, n = codes.shape
    if n % 32 or group % 32:
        raise ValueError(f"rows of {n} values in groups of {group} are not whole Q4_0 blocks (32)")
    nb = n // 32
    d = np.repeat(np.asarray(scale, np.float32), group // 32, axis=1)[:, :nb].astype("<f2")
    out = np.empty((rows, nb, 18), np.uint8)
    out[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = _pack(codes.reshape(rows, nb, 32), 16)
    return out.reshape(rows, nb * 18)
