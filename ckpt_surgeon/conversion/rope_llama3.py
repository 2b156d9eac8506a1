"""Llama 3's rope scaling (``rope_type: llama3``) <-> GGUF's ``rope_freqs.weight``.

transformers (``modeling_rope_utils._compute_llama3_parameters``) divides each rotary frequency
by a factor: 1 for wavelengths shorter than ``original_max_position_embeddings /
high_freq_factor``, ``factor`` for those longer than ``original / low_freq_factor``, and in
between ``1 / ((1 - s) / factor + s)`` with ``s = (original / wavelength - low) / (high - low)``.
GGUF has no keys for it: llama.cpp's converter writes those per-dimension factors as an F32
tensor ``rope_freqs.weight`` (``head_dim / 2`` values), which its graph divides the frequencies
by.  HF -> GGUF computes that tensor in float32 with torch, in the converter's order of
operations, so its bytes are the converter's.  GGUF -> HF recovers the four parameters from it:
``factor`` is the largest value; the interpolated dimensions give ``s`` as an affine function
of the frequency, whose slope and intercept fix ``original / (high - low)`` and
``low / (high - low)``.  Those two ratios are all the function depends on (scaling all three by
one constant changes nothing), so ``low_freq_factor`` is taken as 1, as every Llama 3 release has
it, and the result is checked to reproduce the tensor.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedError

__all__ = ["llama3_rope_factors", "llama3_params_from_factors", "LLAMA3_KEYS"]

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def llama3_rope_factors(theta: float, dim: int, rp: dict) -> np.ndarray:
    """The ``rope_freqs.weight`` values (float32, ``dim // 2``) for rope parameters ``rp``."""
    import torch

    factor = float(rp["factor"])
    low, high = float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
    orig = rp["original_max_position_embeddings"]
    low_wavelen, high_wavelen = orig / low, orig / high
    inv = 1.0 / (float(theta) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for f in inv:                       # 0-d float32 tensors: float32 arithmetic throughout
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            s = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _nice(x: float) -> float:
    """``x`` rounded to 6 significant digits (the parameters are configuration values)."""
    return float(f"{x:.6g}")


def llama3_params_from_factors(factors: np.ndarray, theta: float, dim: int, *, path: str | None = None,
                               tensor: str = "rope_freqs.weight") -> dict:
    """The llama3 rope parameters that give ``factors`` (refused when none do, or when fewer than
    two dimensions are interpolated, which leaves the ratios undetermined)."""
    f = np.asarray(factors, np.float64).reshape(-1)
    if f.shape[0] != dim // 2 or not np.all(np.isfinite(f)) or np.any(f < 1.0):
        raise UnsupportedError(f"{f.shape[0]} values (want {dim // 2}, each finite and >= 1) are not Llama 3 "
                               "rope factors", path=path, tensor=tensor)
    factor = float(np.float32(f.max()))
    inv = 1.0 / (float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    mid = (np.abs(f - 1.0) > 1e-6) & (np.abs(f - factor) > 1e-6 * factor)
    if factor <= 1.0 or mid.sum() < 2:
        raise UnsupportedError(f"only {int(mid.sum())} of {f.shape[0]} rotary dimensions are interpolated: the "
                               "Llama 3 rope parameters cannot be recovered from it", path=path, tensor=tensor)
    s = (1.0 / f[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
    a, b = np.polyfit(inv[mid], s, 1)   # s = a * freq + b; a = orig / (2 pi (high - low)), b = -low / (high - low)
    if b >= 0:
        raise UnsupportedError("rope factors do not fall with the wavelength as Llama 3's do", path=path, tensor=tensor)
    high = _nice(1.0 - 1.0 / b)
    orig = int(round(-a * 2 * math.pi / b))
    rp = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": high,
          "original_max_position_embeddings": orig}
    got = _factors64(theta, dim, rp)
    if not np.allclose(got, f, rtol=1e-5, atol=0):
        worst = float(np.max(np.abs(got - f) / f))
        raise UnsupportedError(f"no Llama 3 rope parameters reproduce these factors (best fit {rp}: relative "
                               f"difference {worst:.2g})", path=path, tensor=tensor)
    return rp


def _factors64(theta: float, dim: int, rp: dict) -> np.ndarray:
    """The same function in float64 (the check of a recovered fit)."""
    inv = 1.0 / (float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    wavelen = 2 * math.pi / inv
    orig, low, high, factor = (rp["original_max_position_embeddings"], rp["low_freq_factor"],
                               rp["high_freq_factor"], rp["factor"])
    s = (orig / wavelen - low) / (high - low)
    out = 1.0 / ((1 - s) / factor + s)
    out = np.where(wavelen < orig / high, 1.0, out)
    return np.where(wavelen > orig / low, factor, out)
