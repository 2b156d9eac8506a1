"""Fidelity statistics over a corpus: what ``llama-perplexity --kl-divergence`` reports, in float64.

Per scored token t (the logits at one position, predicting the actual next token y_t), with
p = softmax(reference logits) and q = softmax(candidate logits) over the full vocabulary:

- ``KL(p‖q) = Σ_v p_v (log p_v − log q_v)`` (nats);
- ``NLL_ref = −log p_y``, ``NLL_cand = −log q_y``;
- ``Δp = q_y − p_y`` (candidate minus reference, as llama.cpp's ``p − p_base``);
- top-1 agreement: ``argmax p == argmax q`` (first index among ties, as llama.cpp's ``>`` scan).

:class:`FidelityAccumulator` keeps running float64 sums and one float64 KL and Δp value per
token (8 bytes each; a million tokens is 16 MB), never a ``[T, V]`` array: ``add`` takes one
chunk's scored rows and processes them in row blocks of bounded size.

The aggregates follow ``tools/perplexity/perplexity.cpp`` (``kl_divergence``) formula for formula,
so our numbers and llama.cpp's can be put side by side:

- mean ± SE with ``SE = sqrt((Σx²/N − mean²)/(N − 1))``, 0 when that variance is not positive or
  N ≤ 10 (``mean_and_uncertainty``);
- ``cov(a, b) = (Σab/N − mean_a·mean_b)/(N − 1)``, 0 for N < 10 (``covariance``), the correlation
  ``cov / (SE_a·SE_b)``;
- ``ln(PPL(Q)/PPL(base))`` = mean NLL_cand − mean NLL_ref, its SE
  ``sqrt(SE_cand² + SE_ref² − 2 cov)`` (paired: the same tokens under both models);
  ``PPL = exp(mean NLL)`` ± ``PPL·SE``, the ratio ± ``ratio·SE_ln``;
- RMS Δp = sqrt(mean Δp²), its SE ``0.5/RMS · SE(Δp²)`` with ``SE(Δp²)`` from Σ Δp⁴;
- same top ``p`` ± ``sqrt(p(1−p)/(N−1))``;
- percentiles: linear interpolation at ``fraction·(N−1)`` of the sorted values, the fractions
  taken as float32 as llama.cpp's ``0.999f`` literals are; the median is the mean of the two
  middle values for even N.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..records import finite_or_none as _num
from .metrics import log_softmax64

# Rows processed at once: bounded by elements so that a 150k-token vocabulary still keeps each
# float64 temporary near 32 MB (log p, log q, p and the KL terms are alive together).
_BLOCK_ELEMENTS = 1 << 22

# llama.cpp's percentile rows, in its printout order: (JSON key, label, fraction).
KL_PERCENTILES = (("p99_9", "99.9%", 0.999), ("p99", "99.0%", 0.990), ("p95", "95.0%", 0.950),
                  ("p90", "90.0%", 0.900), ("median", "Median", 0.5), ("p10", "10.0%", 0.100),
                  ("p5", " 5.0%", 0.050), ("p1", " 1.0%", 0.010), ("p0_1", " 0.1%", 0.001))
DP_PERCENTILES = (("p99_9", "99.9%", 0.999), ("p99", "99.0%", 0.990), ("p95", "95.0%", 0.950),
                  ("p90", "90.0%", 0.900), ("p75", "75.0%", 0.750), ("median", "Median", 0.5),
                  ("p25", "25.0%", 0.250), ("p10", "10.0%", 0.100), ("p5", " 5.0%", 0.050),
                  ("p1", " 1.0%", 0.010), ("p0_1", " 0.1%", 0.001))

# llama.cpp prints no distribution statistics below this many tokens ("we do not wish to do
# statistics on so few values"); we compute them anyway and say so in the report.
LLAMACPP_MIN_TOKENS = 100


def mean_and_se(s: float, s2: float, n: int) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty``: (Σx/N, sqrt((Σx²/N − mean²)/(N−1))), SE 0 when the
    variance is not positive or N ≤ 10."""
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def covariance(sa: float, sb: float, sab: float, n: int) -> float:
    """llama.cpp's ``covariance``: (Σab/N − (Σa/N)(Σb/N)) / (N − 1), 0 for N < 10."""
    if n < 10:
        return 0.0
    return (sab / n - (sa / n) * (sb / n)) / (n - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's ``percentile`` on already sorted values (fraction as its float32 literal)."""
    f = float(np.float32(fraction))
    if f <= 0:
        return float(sorted_values[0])
    if f >= 1:
        return float(sorted_values[-1])
    p = f * (len(sorted_values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, len(sorted_values) - 1)])


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]) if n % 2 == 0 else sorted_values[n // 2])


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics of one block of scored rows (float64, ``[n]`` each)."""

    kl: np.ndarray
    nll_ref: np.ndarray
    nll_cand: np.ndarray
    dp: np.ndarray
    same_top: np.ndarray          # bool


def token_stats(ref_logprobs: np.ndarray, cand_logprobs: np.ndarray, targets: np.ndarray, *,
                kl_floor: float | None = None) -> TokenStats:
    """Per-row statistics from log-probabilities ``[n, V]`` (float64) and the next tokens ``[n]``.

    ``kl_floor``: KL terms only where ``log p > kl_floor`` (llama.cpp's ``p_log_base > -16`` for a
    reference read from its uint16 file, whose entries below max − 16 are not stored).  Without
    it every term with p > 0 counts (p = 0 contributes 0, the limit of p log p).
    """
    lp, lq = ref_logprobs, cand_logprobs
    rows = np.arange(len(targets))
    with np.errstate(under="ignore", invalid="ignore"):
        p = np.exp(lp)
        keep = p > 0 if kl_floor is None else lp > kl_floor
        kl = np.where(keep, p * (lp - lq), 0.0).sum(axis=-1)
    nll_ref = -lp[rows, targets]
    nll_cand = -lq[rows, targets]
    dp = np.exp(-nll_cand) - np.exp(-nll_ref)
    same = np.argmax(lp, axis=-1) == np.argmax(lq, axis=-1)
    return TokenStats(kl, nll_ref, nll_cand, dp, same)


@dataclass(frozen=True)
class FidelityStats:
    """llama.cpp's three blocks (plus same-top), over every scored token."""

    n: int
    ppl_ref: float
    ppl_ref_se: float
    ppl_cand: float
    ppl_cand_se: float
    ln_ratio: float
    ln_ratio_se: float
    ratio: float
    ratio_se: float
    diff: float                   # PPL(cand) − PPL(ref)
    diff_se: float
    cor: float | None             # correlation of the per-token NLLs (None when an SE is 0)
    kl_mean: float
    kl_se: float
    kl: dict                      # percentile key -> value, plus "max", "min"
    kl_max_at: tuple              # (chunk, position) of the largest KL
    dp_mean: float
    dp_se: float
    dp: dict
    rms_dp: float
    rms_dp_se: float
    same_top: float
    same_top_se: float
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        kl = {"mean": _num(self.kl_mean), "se": _num(self.kl_se), "max": _num(self.kl["max"])}
        kl.update({k: _num(self.kl[k]) for k, _, _ in KL_PERCENTILES})
        kl["min"] = _num(self.kl["min"])
        kl["max_at"] = {"chunk": self.kl_max_at[0], "position": self.kl_max_at[1]}
        dp = {"mean": _num(self.dp_mean), "se": _num(self.dp_se), "rms": _num(self.rms_dp),
              "rms_se": _num(self.rms_dp_se), "max": _num(self.dp["max"])}
        dp.update({k: _num(self.dp[k]) for k, _, _ in DP_PERCENTILES})
        dp["min"] = _num(self.dp["min"])
        return {
            "ppl": {"ref": _num(self.ppl_ref), "cand": _num(self.ppl_cand), "ratio": _num(self.ratio),
                    "cor": _num(self.cor), "ln_ratio": {"mean": _num(self.ln_ratio), "se": _num(self.ln_ratio_se)},
                    "ref_se": _num(self.ppl_ref_se), "cand_se": _num(self.ppl_cand_se),
                    "ratio_se": _num(self.ratio_se), "diff": _num(self.diff), "diff_se": _num(self.diff_se)},
            "kl": kl, "dp": dp,
            "same_top": {"p": _num(self.same_top), "se": _num(self.same_top_se)},
        }

    def blocks(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The three blocks as llama.cpp prints them: ``[(title, [(label, value text), ...]), ...]``
        (same labels and number formats as ``perplexity.cpp``; "Q" is the candidate, "base" the
        reference)."""
        ppl = [("Mean PPL(Q)", f"{self.ppl_cand:10.6f} ± {self.ppl_cand_se:10.6f}"),
               ("Mean PPL(base)", f"{self.ppl_ref:10.6f} ± {self.ppl_ref_se:10.6f}"),
               ("Cor(ln(PPL(Q)), ln(PPL(base)))", "-" if self.cor is None else f"{100.0 * self.cor:6.2f}%"),
               ("Mean ln(PPL(Q)/PPL(base))", f"{self.ln_ratio:10.6f} ± {self.ln_ratio_se:10.6f}"),
               ("Mean PPL(Q)/PPL(base)", f"{self.ratio:10.6f} ± {self.ratio_se:10.6f}"),
               ("Mean PPL(Q)-PPL(base)", f"{self.diff:10.6f} ± {self.diff_se:10.6f}")]
        kl = [("Mean    KLD", f"{self.kl_mean:10.6f} ± {self.kl_se:10.6f}"),
              ("Maximum KLD", f"{self.kl['max']:10.6f} (chunk {self.kl_max_at[0]}, position {self.kl_max_at[1]})")]
        kl += [(f"{label:<7} KLD", f"{self.kl[k]:10.6f}") for k, label, _ in KL_PERCENTILES]
        kl.append(("Minimum KLD", f"{self.kl['min']:10.6f}"))
        tp = [("Mean    Δp", f"{100.0 * self.dp_mean:6.3f} ± {100.0 * self.dp_se:5.3f} %"),
              ("Maximum Δp", f"{100.0 * self.dp['max']:6.3f}%")]
        tp += [(f"{label:<7} Δp", f"{100.0 * self.dp[k]:6.3f}%") for k, label, _ in DP_PERCENTILES]
        tp += [("Minimum Δp", f"{100.0 * self.dp['min']:6.3f}%"),
               ("RMS Δp", f"{100.0 * self.rms_dp:6.3f} ± {100.0 * self.rms_dp_se:5.3f} %"),
               ("Same top p", f"{100.0 * self.same_top:6.3f} ± {100.0 * self.same_top_se:5.3f} %")]
        return [("Perplexity statistics", ppl), ("KL divergence statistics", kl),
                ("Token probability statistics", tp)]


class FidelityAccumulator:
    """Running sums over scored tokens; ``add`` chunk by chunk, ``result()`` at the end.

    ``add(ref_logits [n, V], cand_logits [n, V], targets [n])`` widens to float64 and takes the
    log-softmax of both; ``add_logprobs`` takes the reference as log-probabilities already (a
    llama.cpp base file).  ``chunk`` / ``positions`` label the rows for "where the max occurred".
    """

    def __init__(self) -> None:
        self._s = dict.fromkeys(("nll", "nll2", "nll_ref", "nll_ref2", "nll_nll_ref", "kl", "kl2",
                                 "dp", "dp2", "dp4"), 0.0)
        self.n = 0
        self.n_same_top = 0
        self._kl: list[np.ndarray] = []
        self._dp: list[np.ndarray] = []
        self._where: list[np.ndarray] = []      # [n, 2] (chunk, position) per token

    def add(self, ref_logits, cand_logits, targets, *, chunk: int = 0, positions=None) -> None:
        ref = np.asarray(ref_logits)
        self._add(ref, cand_logits, targets, chunk, positions, lambda block: log_softmax64(block), None)

    def add_logprobs(self, ref_logprobs, cand_logits, targets, *, chunk: int = 0, positions=None,
                     kl_floor: float | None = None) -> None:
        self._add(np.asarray(ref_logprobs), cand_logits, targets, chunk, positions,
                  lambda block: np.asarray(block, dtype=np.float64), kl_floor)

    def _add(self, ref, cand_logits, targets, chunk, positions, ref_lp, kl_floor) -> None:
        cand = np.asarray(cand_logits)
        targets = np.asarray(targets, dtype=np.int64)
        n = len(targets)
        if ref.ndim != 2 or cand.shape != ref.shape or ref.shape[0] != n:
            raise ValueError(f"shapes differ: reference {ref.shape}, candidate {cand.shape}, targets {targets.shape}")
        if n and (targets.min() < 0 or targets.max() >= ref.shape[1]):
            raise ValueError(f"a target id is outside the vocabulary of {ref.shape[1]}")
        positions = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
        step = max(1, _BLOCK_ELEMENTS // max(ref.shape[1], 1))
        for a in range(0, n, step):
            b = min(n, a + step)
            st = token_stats(ref_lp(ref[a:b]), log_softmax64(cand[a:b]), targets[a:b], kl_floor=kl_floor)
            s = self._s
            s["nll"] += float(st.nll_cand.sum())
            s["nll2"] += float((st.nll_cand ** 2).sum())
            s["nll_ref"] += float(st.nll_ref.sum())
            s["nll_ref2"] += float((st.nll_ref ** 2).sum())
            s["nll_nll_ref"] += float((st.nll_cand * st.nll_ref).sum())
            s["kl"] += float(st.kl.sum())
            s["kl2"] += float((st.kl ** 2).sum())
            s["dp"] += float(st.dp.sum())
            s["dp2"] += float((st.dp ** 2).sum())
            s["dp4"] += float((st.dp ** 4).sum())
            self.n_same_top += int(st.same_top.sum())
            self.n += b - a
            self._kl.append(st.kl)
            self._dp.append(st.dp)
            self._where.append(np.stack([np.full(b - a, chunk), positions[a:b]], axis=1))

    def result(self) -> FidelityStats:
        n = self.n
        if n < 2:
            raise ValueError("fidelity statistics need at least 2 scored tokens")
        s = self._s
        ln_c, se_c = mean_and_se(s["nll"], s["nll2"], n)
        ln_r, se_r = mean_and_se(s["nll_ref"], s["nll_ref2"], n)
        cov = covariance(s["nll"], s["nll_ref"], s["nll_nll_ref"], n)
        cor = cov / (se_c * se_r) if se_c > 0 and se_r > 0 else None
        ppl_c, ppl_r = math.exp(ln_c), math.exp(ln_r)
        ln_ratio = ln_c - ln_r
        ln_ratio_se = math.sqrt(max(se_c * se_c + se_r * se_r - 2.0 * cov, 0.0))
        ratio = math.exp(ln_ratio)
        ppl_cov = ppl_c * ppl_r * cov
        diff_se = math.sqrt(max((ppl_c * se_c) ** 2 + (ppl_r * se_r) ** 2 - 2.0 * ppl_cov, 0.0))
        kl_all = np.concatenate(self._kl)
        dp_all = np.concatenate(self._dp)
        where = np.concatenate(self._where)
        at = where[int(np.argmax(kl_all))]
        kl_sorted, dp_sorted = np.sort(kl_all), np.sort(dp_all)
        kl_mean, kl_se = mean_and_se(s["kl"], s["kl2"], n)
        dp_mean, dp_se = mean_and_se(s["dp"], s["dp2"], n)
        mse, mse_se = mean_and_se(s["dp2"], s["dp4"], n)
        rms = math.sqrt(mse)
        same = self.n_same_top / n
        return FidelityStats(
            n=n, ppl_ref=ppl_r, ppl_ref_se=ppl_r * se_r, ppl_cand=ppl_c, ppl_cand_se=ppl_c * se_c,
            ln_ratio=ln_ratio, ln_ratio_se=ln_ratio_se, ratio=ratio, ratio_se=ratio * ln_ratio_se,
            diff=ppl_c - ppl_r, diff_se=diff_se, cor=cor,
            kl_mean=kl_mean, kl_se=kl_se, kl=_distribution(kl_sorted, KL_PERCENTILES), kl_max_at=(int(at[0]), int(at[1])),
            dp_mean=dp_mean, dp_se=dp_se, dp=_distribution(dp_sorted, DP_PERCENTILES),
            rms_dp=rms, rms_dp_se=(0.5 / rms * mse_se if rms > 0 else 0.0),
            same_top=same, same_top_se=math.sqrt(same * (1.0 - same) / (n - 1)))


def _distribution(sorted_values: np.ndarray, table) -> dict:
    d = {"max": float(sorted_values[-1]), "min": float(sorted_values[0])}
    for key, _, frac in table:
        d[key] = median(sorted_values) if key == "median" else percentile(sorted_values, frac)
    return d
