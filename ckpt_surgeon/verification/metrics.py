"""Pure comparison math for ``verify`` (numpy, float64; no torch, no models).

Inputs are one prompt's outputs from the two models, ``[T, V]`` logits (or ``[T, H]`` hidden
states for encoders), already on the host as float32.  Everything is widened to float64 before
subtracting or exponentiating so the metric itself adds no rounding comparable to what it
measures (float32 log-softmax of nearly equal logits would show KL ~1e-8 of pure noise).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def log_softmax64(x: np.ndarray) -> np.ndarray:
    """``x - logsumexp(x)`` over the last axis in float64.  ``[..., V] -> [..., V]``.

    Shifted by the row max (the usual trick) so ``exp`` never overflows; ``-inf`` entries
    (vocabulary masks) stay ``-inf``.
    """
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(under="ignore"):
        lse = np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)) + m
    return x - lse


def kl_per_position(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """``KL(p‖q)[t] = Σ_v p[t,v]·(log p[t,v] − log q[t,v])`` with p = softmax(ref), q = softmax(cand).

    ``[T, V], [T, V] -> [T]``, nats, float64.  Terms with ``p = 0`` contribute 0 (the limit of
    ``p log p``), so masked tokens are fine; ``q = 0`` where ``p > 0`` gives ``inf``, which is
    what KL is there.  Results are clamped at 0: KL is non-negative and a value of -1e-17 is
    float64 rounding of identical distributions.
    """
    lp = log_softmax64(ref_logits)
    lq = log_softmax64(cand_logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return np.maximum(terms.sum(axis=-1), 0.0)


def first_difference(a, b) -> int | None:
    """Index of the first position where token sequences ``a`` and ``b`` differ (a shorter
    sequence differs at its end), or ``None`` when they are identical."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


@dataclass(frozen=True)
class OutputComparison:
    """One prompt's comparison.  KL / top-1 fields are None for non-distribution outputs."""

    positions: int
    max_abs_diff: float          # over elements finite in both
    scale: float                 # max |ref| over finite elements
    nonfinite: int               # elements where the two disagree on being finite (NaN counts)
    mean_kl: float | None
    max_kl: float | None
    top1_agree: int | None       # positions whose arg-max agrees
    cosine: float | None         # cosine of the token-mean vectors (encoders' pooled embedding)


def compare_outputs(ref: np.ndarray, cand: np.ndarray, *, distribution: bool) -> OutputComparison:
    """Compare one prompt's ``[T, D]`` outputs of the two models.

    ``distribution=True`` (logits): also per-position KL(ref‖cand) and arg-max agreement.
    ``distribution=False`` (hidden states): also the cosine of the mean over positions, which is
    the mean-pooled sentence embedding sentence-transformers computes.
    """
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    if r.shape != c.shape:
        raise ValueError(f"output shapes differ: {r.shape} vs {c.shape}")
    fr, fc = np.isfinite(r), np.isfinite(c)
    both = fr & fc
    with np.errstate(invalid="ignore"):
        nonfinite = int(np.count_nonzero(~both & ~(r == c)))   # same ±inf on both sides is agreement
    diff = np.abs(np.where(both, r, 0.0) - np.where(both, c, 0.0))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(np.where(fr, r, 0.0)).max()) if r.size else 0.0
    if distribution:
        kl = kl_per_position(r, c)
        return OutputComparison(r.shape[0], max_abs, scale, nonfinite, float(kl.mean()) if kl.size else 0.0,
                                float(kl.max()) if kl.size else 0.0,
                                int(np.count_nonzero(r.argmax(-1) == c.argmax(-1))), None)
    mr, mc = r.mean(axis=0), c.mean(axis=0)
    denom = float(np.linalg.norm(mr) * np.linalg.norm(mc))
    cos = float(mr @ mc / denom) if denom > 0 else (1.0 if np.array_equal(mr, mc) else 0.0)
    return OutputComparison(r.shape[0], max_abs, scale, nonfinite, None, None, None, cos)


def common_width(r: np.ndarray, c: np.ndarray, tok, notes: list, *, what: str = "output", distribution: bool = True):
    """Logits of different widths, for prompts and corpus alike: models often pad the vocabulary
    (embedding rows beyond the tokenizer, to a multiple of 64/128) and a converter may drop or keep
    that padding.  The rows beyond ``len(tokenizer)`` can never be produced by the tokenizer, so
    comparing the first ``min`` columns is sound as long as every real token is inside them
    (and the outputs are distributions over tokens); otherwise a ConfigError whose line starts
    with ``what`` ("output widths differ ...")."""
    if r.shape[-1] == c.shape[-1]:
        return r, c
    n = min(r.shape[-1], c.shape[-1])
    if not distribution or tok is None or n < len(tok):
        from ..errors import ConfigError
        has = f"tokenizer has {len(tok)} tokens" if tok is not None else "no tokenizer to bound the real tokens"
        raise ConfigError(f"{what} widths differ: reference {r.shape[-1]}, candidate {c.shape[-1]} "
                          f"({has}); the models are not comparable")
    notes.append(f"vocabulary widths differ ({r.shape[-1]} vs {c.shape[-1]}); compared the first {n} logits "
                 f"(the tokenizer has {len(tok)} tokens)")
    return np.asarray(r)[..., :n], np.asarray(c)[..., :n]
