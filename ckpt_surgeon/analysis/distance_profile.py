"""What the q/k biases do under RoPE: the distance profile (numpy only, no torch).

Why Qwen kept q/k biases: "to enhance the extrapolation ability" (Qwen report, arXiv 2309.16609,
citing Su, "RoPE + Bias = better length extrapolation", kexue.fm/archives/9577).  Under RoPE the
logit between a query at ``m`` and a key at ``n`` (notation of :mod:`.bounds`; ``z_j(v) =
v[p0_j] + i v[p1_j]`` the complex number of rotary pair ``j``, whose dims follow the file's own
layout: ``(j, j + r/2)`` for HF ``rotate_half``, ``(2j, 2j+1)`` for llama.cpp-permuted GGUFs) is

    l_mn = s a^2 sum_j Re(z_j(q~_m) conj z_j(k~_n) e^{i Δ θ_j}) + s <q~_m,pass, k~_n,pass>,   Δ = m - n

because transformers' ``apply_rotary_pos_emb`` turns pair ``j`` of a vector at position ``p`` by
``p θ_j`` (``x' = x cos - y sin``, ``y' = y cos + x sin``: multiplication by ``e^{i p θ_j}``) and
multiplies cos and sin by the attention factor ``a`` (yarn / longrope; 1 otherwise), which the
pass-through dims of a partial-rotary head do not get.  ``s`` is the logit scale
(:func:`.layer_redundancy.attention_scale`).  With the biases alone (``q~ = b_q``, ``k~ = b_k``: what a
model whose projections read nothing would compute) that is the static profile

    f_b(Δ) = s a^2 sum_j Re(h_j e^{i Δ θ_j}) + s <b_q,pass, b_k,pass>,   h_j = z_j(b_q,h) conj z_j(b_k,g)

for query head ``h`` and its kv head ``g``: exact, from two vectors and the config, so
``f_b(0) = s (a^2 <b_q,rot, b_k,rot> + <b_q,pass, b_k,pass>)``.  Aligned pair products (``Re h_j >
0``) make ``f`` decay with distance; opposed ones make it grow.  A pair whose angle over the
context ``θ_j L`` is below 1 barely turns: its share is a plateau softmax does not see.

Summaries (per head; ``L`` the context, distances ``Δ`` in ``[0, L - 1]``):

* ``g(Δ) = f(Δ) - f(0)`` at 1k, 8k, 32k and ``L - 1``;
* ``drop = f(0) - mean_{Δ in [L/2, L-1]} f(Δ)`` (exact: a geometric sum per pair); its sign says
  decay (> 0) or enhance (< 0), ``|drop| <`` :data:`FLAT_LOGIT` is flat;
* the first and last half-drop distance: where ``f`` crosses ``f(0) - drop / 2`` first and last;
* ``argmax`` of ``f``; the monotone ratio ``|drop| / total variation``; the alignment
  ``sum Re h_j / sum |h_j|``; the plateau share ``sum_{θ_j L < 1} |h_j| / sum |h_j|``;
* the spread ``max f - min f`` and its sound bound ``s a^2 sum_j |h_j| min(2, θ_j L)`` (each term
  ``Re(h_j e^{iφ})`` moves by at most ``|h_j| min(2, θ_j L)`` while ``φ`` sweeps ``θ_j L``: the
  same factor as the key-bias bound, :func:`.bounds.angle_factor`).

Half-drop, argmax, total variation and spread are read on the summary grid (every distance up to
:data:`DENSE_UPTO`, then :data:`GRID_POINTS` log-spaced ones up to ``L - 1``, linear
interpolation for the crossings); everything else is exact.

Model level: the first zero of ``sum_j cos(Δ θ_j)`` (Men et al., arXiv 2405.14591: the base
bounds the usable context) and the number of pairs whose period ``2π / θ_j`` exceeds the training
length (Liu et al., arXiv 2310.05209: the critical dimension).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..arch.layouts import rotary_pairs
from ..arch.resolve import ModelLayout
from ..arch.rope_frequencies import GGUF_FREQ_FACTORS, SUPPORTED, RopeFrequencies, rope_frequencies
from ..errors import CkptError
from ..records import finite_or_none as _f
from .bounds import angle_factor
from .layer_redundancy import attention_scale
from .redundancy import layer_vectors

DEFAULT_DELTAS = 48            # log-spaced distances besides 0
MARKS = (1024, 8192, 32768)    # g(Δ) is reported at these distances and at L - 1
FLAT_LOGIT = 0.01              # |drop| below this is flat: e^0.01 moves an attention weight by 1 %
DENSE_UPTO = 256
GRID_POINTS = 1024
FIRST_ZERO_LIMIT = 1 << 22     # the first-zero scan stops here (distances beyond are reported as > limit)


# ----------------------------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------------------------

def complex_pairs(v: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """``z_j = v[p0_j] + i v[p1_j]`` per head: ``v`` ``[N, head_dim]`` -> ``[N, P]`` complex."""
    v = np.asarray(v, dtype=np.float64)
    return v[:, pairs[:, 0]] + 1j * v[:, pairs[:, 1]]


def pass_dims(head_dim: int, pairs: np.ndarray) -> np.ndarray:
    """Dims of a head that no pair rotates (partial rotary)."""
    return np.setdiff1d(np.arange(head_dim), pairs.reshape(-1))


def phases(inv_freq: np.ndarray, deltas) -> tuple[np.ndarray, np.ndarray]:
    """``(cos Δθ_j, sin Δθ_j)``, each ``[P, D]`` (one per model: every layer shares them; two real
    products are several times faster than one complex one)."""
    ang = np.outer(inv_freq, np.asarray(deltas, dtype=np.float64))
    return np.cos(ang), np.sin(ang)


def profile_values(h: np.ndarray, const: np.ndarray, inv_freq: np.ndarray, deltas, rot_scale: float,
                   phase: np.ndarray | None = None) -> np.ndarray:
    """``rot_scale * sum_j Re(h_j e^{i Δ θ_j}) + const`` for every head and distance -> ``[H, D]``.

    ``h`` ``[H, P]`` complex pair products, ``const`` ``[H]`` (the scaled pass-through product);
    ``phase``: :func:`phases` of ``inv_freq`` and ``deltas`` when already computed."""
    c, s = phases(inv_freq, deltas) if phase is None else phase
    h = np.asarray(h)
    # einsum, not matmul: these products are small ([H, P] x [P, D]), and OpenBLAS's threads
    # spin-wait when the CPUs are busy (10x slower than einsum's single-threaded loop, measured on
    # the 7B shape with the machine loaded)
    return rot_scale * (np.einsum("hp,pd->hd", h.real, c) - np.einsum("hp,pd->hd", h.imag, s)) + np.asarray(const)[:, None]


def window_mean(h: np.ndarray, const: np.ndarray, inv_freq: np.ndarray, lo: int, hi: int, rot_scale: float) -> np.ndarray:
    """Exact mean of :func:`profile_values` over the integers ``Δ in [lo, hi]`` -> ``[H]``.

    ``sum_{Δ=lo}^{hi} e^{iΔθ} = e^{i(lo+hi)θ/2} sin(nθ/2) / sin(θ/2)`` with ``n = hi - lo + 1``
    (no cancellation for small ``θ``; ``n`` where ``sin(θ/2) = 0``)."""
    n = hi - lo + 1
    half = inv_freq / 2.0
    sh = np.sin(half)
    ratio = np.where(np.abs(sh) > 1e-300, np.sin(n * half) / np.where(sh == 0, 1.0, sh), float(n))
    mean_phase = np.exp(1j * (lo + hi) * half) * ratio / n     # [P]
    return rot_scale * (h @ mean_phase).real + np.asarray(const)


def summary_grid(max_delta: int) -> np.ndarray:
    """Every distance up to :data:`DENSE_UPTO`, then :data:`GRID_POINTS` log-spaced up to ``max_delta``."""
    dense = np.arange(0, min(max_delta, DENSE_UPTO) + 1)
    if max_delta <= DENSE_UPTO:
        return dense.astype(np.float64)
    tail = np.unique(np.round(np.geomspace(DENSE_UPTO, max_delta, GRID_POINTS)))
    return np.unique(np.concatenate([dense, tail, [max_delta]])).astype(np.float64)


def default_deltas(max_delta: int, n: int = DEFAULT_DELTAS) -> np.ndarray:
    """0 plus about ``n`` log-spaced integer distances up to ``max_delta`` (duplicates merged)."""
    if max_delta < 1:
        return np.zeros(1)
    return np.unique(np.concatenate([[0.0, max_delta], np.round(np.geomspace(1, max_delta, n))]))


def parse_deltas(spec: str | None, max_delta: int) -> np.ndarray:
    """``--deltas``: ``None`` (default grid), ``log:N`` (N log-spaced), or a comma list of distances;
    0 is always included (g, the plots and the table read f(0) as the first value)."""
    if spec is None:
        return default_deltas(max_delta)
    s = spec.strip()
    try:
        if s.startswith("log:"):
            n = int(s[4:])
            if n < 1:
                raise ValueError
            return default_deltas(max_delta, n)
        vals = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        vals = None
    if not vals or vals[0] < 0:
        raise CkptError(f"--deltas {spec!r}: expected log:N or a comma-separated list of distances >= 0")
    return np.asarray(sorted(set(vals) | {0}), dtype=np.float64)


def _crossings(x: np.ndarray, u: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """First and last Δ where ``u`` crosses ``level`` (either way; linear interpolation on the grid)."""
    above = u >= level
    idx = np.flatnonzero(above[1:] != above[:-1]) + 1
    if not idx.size:
        return None, None

    def at(i: int) -> float:
        u0, u1 = u[i - 1], u[i]
        t = 0.0 if u1 == u0 else (level - u0) / (u1 - u0)
        return float(x[i - 1] + t * (x[i] - x[i - 1]))
    return at(int(idx[0])), at(int(idx[-1]))


def first_zero(inv_freq: np.ndarray, limit: int = FIRST_ZERO_LIMIT) -> int | None:
    """Smallest integer ``Δ > 0`` with ``sum_j cos(Δ θ_j) <= 0`` (None: none up to ``limit``)."""
    chunk = 1 << 15
    start = 1
    while start <= limit:
        d = np.arange(start, min(start + chunk, limit + 1), dtype=np.float64)
        s = np.cos(np.outer(d, inv_freq)).sum(1)
        hit = np.flatnonzero(s <= 0)
        if hit.size:
            return int(d[hit[0]])
        start += chunk
        chunk = min(chunk * 2, 1 << 18)
    return None


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProfileSummary:
    """The summaries of one head's profile (see the module doc)."""

    f0: float
    g: dict                        # {"1k": .., "8k": .., "32k": .., "ctx": ..}: f(Δ) - f(0)
    drop: float
    trend: str                     # decay | enhance | flat
    half_drop_first: float | None
    half_drop_last: float | None
    argmax: float
    monotone: float | None
    alignment: float | None
    plateau_share: float | None
    spread: float
    spread_bound: float
    pass_const: float              # the pass-through part (constant over Δ)

    def to_dict(self) -> dict:
        return {"f0": _f(self.f0), "g": {k: _f(v) for k, v in self.g.items()}, "drop": _f(self.drop),
                "trend": self.trend, "half_drop_first": _f(self.half_drop_first),
                "half_drop_last": _f(self.half_drop_last), "argmax": _f(self.argmax), "monotone": _f(self.monotone),
                "alignment": _f(self.alignment), "plateau_share": _f(self.plateau_share), "spread": _f(self.spread),
                "spread_bound": _f(self.spread_bound), "pass_const": _f(self.pass_const)}


@dataclass(frozen=True, eq=False)
class HeadProfile:
    q_head: int
    kv_head: int
    f: np.ndarray = field(repr=False)          # [D] f_b at the report's deltas
    re_h: np.ndarray = field(repr=False)       # [P] Re h_j (scaled by s a^2)
    abs_h: np.ndarray = field(repr=False)      # [P] |h_j| (scaled by s a^2)
    summary: ProfileSummary | None = None
    mean: object | None = None                 # distance_measure.MeanTerms (--measure)
    cov: object | None = None                  # distance_measure.CovTerm (--measure)

    def to_dict(self) -> dict:
        return {"q_head": self.q_head, "kv_head": self.kv_head,
                "bias": {"f": [_f(x) for x in self.f], **(self.summary.to_dict() if self.summary else {}),
                         "re_h": [_f(x) for x in self.re_h], "abs_h": [_f(x) for x in self.abs_h]},
                "mean": self.mean.to_dict() if self.mean is not None else None,
                "cov": self.cov.to_dict() if self.cov is not None else None}


def _median(xs) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(v)) if v else None


@dataclass(frozen=True, eq=False)
class LayerProfile:
    layer: int
    heads: tuple = ()
    note: str | None = None                    # why there is no profile (q/k-norm, no bias, ...)

    def counts(self) -> dict:
        out = {"decay": 0, "enhance": 0, "flat": 0}
        for h in self.heads:
            if h.summary is not None:
                out[h.summary.trend] += 1
        return out

    def to_dict(self) -> dict:
        return {"layer": self.layer, "note": self.note, "counts": self.counts() if self.heads else None,
                "heads": [h.to_dict() for h in self.heads]}


@dataclass(frozen=True)
class ModelLevel:
    first_zero: int | None             # first Δ with sum_j cos(Δ θ_j) <= 0 (Men et al.)
    first_zero_limit: int
    long_period_pairs: int             # pairs with 2π/θ_j > training length (Liu et al.)
    critical_dim: int                  # 2 * (pairs with period within the training length)
    training_length: int | None
    pairs: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class DistanceProfile:
    """``analyze --distance-profile``: per layer and query head, the static bias profile (and with
    ``--measure`` the measured terms); ``whatif`` the same under another rope base / scaling."""

    source: str
    label: str                         # "config" | "what-if: ..."
    context: int | None
    deltas: np.ndarray
    attn_scale: float
    rope: RopeFrequencies | None
    pair_layout: str | None
    model: ModelLevel | None
    layers: tuple
    notes: tuple = ()
    whatif: "DistanceProfile | None" = None
    measured: dict | None = None       # run facts of --measure (prompts, tokens, skip_first, dtype, device)
    per_head: bool = False

    @property
    def attention_factor(self) -> float | None:
        return self.rope.attention_factor if self.rope else None

    def layer(self, i: int) -> LayerProfile:
        return next(lp for lp in self.layers if lp.layer == i)

    def to_dict(self) -> dict:
        return {"label": self.label, "context": self.context, "deltas": [int(d) for d in self.deltas],
                "attn_scale": _f(self.attn_scale), "attention_factor": _f(self.attention_factor),
                "pair_layout": self.pair_layout, "rope": self.rope.to_dict() if self.rope else None,
                "model": self.model.to_dict() if self.model else None,
                "layers": [lp.to_dict() for lp in self.layers], "notes": list(self.notes),
                "measured": self.measured,
                "whatif": self.whatif.to_dict() if self.whatif is not None else None}

    # -- rows ------------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """Per layer (heads that decay / enhance / are flat, medians of the summaries), or one row
        per query head with ``per_head``; what-if and measured columns beside them."""
        wi = {lp.layer: lp for lp in self.whatif.layers} if self.whatif is not None else {}
        rows = []
        for lp in self.layers:
            if not lp.heads:
                rows.append({"layer": lp.layer, "note": lp.note})
                continue
            if self.per_head:
                wheads = {h.q_head: h for h in wi[lp.layer].heads} if lp.layer in wi else {}
                for h in lp.heads:
                    s = h.summary
                    row = {"layer": lp.layer, "q_head": h.q_head, "kv_head": h.kv_head, "trend": s.trend,
                           "f0": s.f0, "g_1k": s.g.get("1k"), "g_8k": s.g.get("8k"), "g_32k": s.g.get("32k"),
                           "g_ctx": s.g.get("ctx"), "drop": s.drop, "half_first": s.half_drop_first,
                           "half_last": s.half_drop_last, "argmax": s.argmax, "mono": s.monotone,
                           "align": s.alignment, "plateau": s.plateau_share, "spread": s.spread,
                           "bound": s.spread_bound}
                    w = wheads.get(h.q_head)
                    if w is not None and w.summary is not None:
                        row.update(wi_trend=w.summary.trend, wi_drop=w.summary.drop, wi_g_ctx=w.summary.g.get("ctx"))
                    row.update(_measured_cells([h]))
                    rows.append(row)
                continue
            c = lp.counts()
            sums = [h.summary for h in lp.heads]
            row = {"layer": lp.layer, "heads": len(lp.heads), "decay": c["decay"], "enhance": c["enhance"],
                   "flat": c["flat"], "f0": _median(s.f0 for s in sums), "g_ctx": _median(s.g.get("ctx") for s in sums),
                   "drop": _median(s.drop for s in sums), "half": _median(s.half_drop_first for s in sums),
                   "mono": _median(s.monotone for s in sums), "align": _median(s.alignment for s in sums),
                   "plateau": _median(s.plateau_share for s in sums), "spread": _median(s.spread for s in sums),
                   "bound": _median(s.spread_bound for s in sums)}
            if lp.layer in wi and wi[lp.layer].heads:
                wc = wi[lp.layer].counts()
                row.update(wi_decay=wc["decay"], wi_enhance=wc["enhance"],
                           wi_drop=_median(h.summary.drop for h in wi[lp.layer].heads))
            row.update(_measured_cells(lp.heads))
            rows.append(row)
        return rows

    def long_rows(self) -> list[dict]:
        """Long-form rows for CSV: one per (profile, layer, head, term, Δ)."""
        out = []
        for prof in (self, self.whatif):
            if prof is None:
                continue
            deltas = [int(d) for d in prof.deltas]
            for lp in prof.layers:
                for h in lp.heads:
                    base = {"profile": prof.label, "layer": lp.layer, "q_head": h.q_head, "kv_head": h.kv_head}
                    series = [("bias", h.f)]
                    if h.mean is not None:
                        series += list(h.mean.series())
                    if h.cov is not None:
                        series += list(h.cov.series())
                    for term, vals in series:
                        for d, v in zip(deltas, vals):
                            out.append({**base, "term": term, "delta": d, "value": _f(v)})
        return out

    def summary_items(self) -> list[tuple[str, str]]:
        items = []
        r = self.rope
        if r is not None:
            at = f", evaluated at length {r.length}" if r.length else ""
            items.append(("profile rope", f"{r.rope_type}, theta {r.theta:g}, attention factor {r.attention_factor:g}, "
                                          f"pairs {self.pair_layout}{at}"))
        if self.model is not None:
            m = self.model
            fz = f"{m.first_zero:,}" if m.first_zero is not None else f"> {m.first_zero_limit:,}"
            items.append(("sum_j cos(Δθ_j) first zero", f"{fz} (Men et al.: a bound on usable context)"))
            items.append(("pairs with period > training length",
                          f"{m.long_period_pairs}/{m.pairs} (training length {m.training_length}; critical dim "
                          f"{m.critical_dim}, Liu et al.)"))
        heads = [h for lp in self.layers for h in lp.heads]
        if heads:
            c = {"decay": 0, "enhance": 0, "flat": 0}
            for h in heads:
                c[h.summary.trend] += 1
            items.append(("bias profile heads", f"decay {c['decay']}, enhance {c['enhance']}, flat {c['flat']} "
                                                f"(flat: |drop| < {FLAT_LOGIT} logit)"))
        if self.whatif is not None:
            wh = [h for lp in self.whatif.layers for h in lp.heads]
            if wh:
                c = {"decay": 0, "enhance": 0, "flat": 0}
                for h in wh:
                    c[h.summary.trend] += 1
                items.append((self.whatif.label, f"decay {c['decay']}, enhance {c['enhance']}, flat {c['flat']} "
                                                 f"over L = {self.whatif.context}"))
        if self.measured:
            m = self.measured
            items.append(("profile measured on", f"{m['prompts']} prompt(s), {m['tokens']} tokens, first "
                                                 f"{m['skip_first']} skipped, {m['device']} {m['dtype']}; covariance "
                                                 f"and mean logit only up to Δ = {m['max_delta']}"))
        return items


def _measured_cells(heads) -> dict:
    """Table cells of the measured terms: medians over ``heads`` of the mean term and the
    covariance term at Δ = 0, and the worst |mean logit - sum of parts|."""
    hs = [h for h in heads if h.mean is not None]
    if not hs:
        return {}
    return {"mu_f0": _median(h.mean.total[0] for h in hs),
            "cov_f0": _median(h.cov.f[0] for h in hs if h.cov is not None and h.cov.f[0] is not None),
            "resid": max((h.cov.residual for h in hs if h.cov is not None and h.cov.residual is not None), default=None)}


# ----------------------------------------------------------------------------------------------
# Over a checkpoint
# ----------------------------------------------------------------------------------------------

def summarize(h_s: np.ndarray, const: np.ndarray, inv_freq: np.ndarray, context: int,
              cache: dict | None = None) -> list[ProfileSummary]:
    """The summaries of every head: ``h_s`` ``[H, P]`` pair products already scaled by ``s a^2``,
    ``const`` ``[H]`` the scaled pass-through product, over distances ``[0, context - 1]``.
    ``cache``: a dict kept across the layers of one model (the grid's phases)."""
    top = max(int(context) - 1, 1)
    marks = {"1k": 1024, "8k": 8192, "32k": 32768, "ctx": top}
    cache = {} if cache is None else cache
    if "grid" not in cache:
        cache["grid"] = summary_grid(top)
        cache["ph_grid"] = phases(inv_freq, cache["grid"])
        cache["ph_marks"] = phases(inv_freq, list(marks.values()))
    grid = cache["grid"]
    fg = profile_values(h_s, const, inv_freq, grid, 1.0, cache["ph_grid"])              # [H, N]
    fm = profile_values(h_s, const, inv_freq, None, 1.0, cache["ph_marks"])
    far = window_mean(h_s, const, inv_freq, top // 2 + (top % 2), top, 1.0)             # [L/2, L-1]
    absh = np.abs(h_s)
    fac = angle_factor(inv_freq, top)
    plateau = inv_freq * top < 1.0
    out = []
    for i in range(h_s.shape[0]):
        f = fg[i]
        f0 = float(f[0])
        drop = f0 - float(far[i])
        trend = "flat" if abs(drop) < FLAT_LOGIT else ("decay" if drop > 0 else "enhance")
        first = last = None
        if drop != 0:
            first, last = _crossings(grid, (f0 - f) / drop, 0.5)
        tv = float(np.abs(np.diff(f)).sum())
        tot = float(absh[i].sum())
        out.append(ProfileSummary(
            # distances beyond the window do not occur in it: null
            f0=f0, g={k: (float(fm[i, j] - f0) if v <= top else None) for j, (k, v) in enumerate(marks.items())},
            drop=drop, trend=trend,
            half_drop_first=first, half_drop_last=last, argmax=float(grid[int(np.argmax(f))]),
            monotone=(abs(drop) / tv) if tv > 0 else None,
            alignment=float(h_s[i].real.sum() / tot) if tot > 0 else None,
            plateau_share=float(absh[i][plateau].sum() / tot) if tot > 0 else None,
            spread=float(f.max() - f.min()), spread_bound=float((absh[i] * fac).sum()), pass_const=float(const[i])))
    return out


def _context(layout: ModelLayout, context: int | None) -> tuple[int | None, str]:
    if context is not None:
        if int(context) < 2:
            raise CkptError(f"--context must be at least 2 positions for a distance profile (got {context})")
        return int(context), "--context"
    if layout.max_positions:
        return int(layout.max_positions), "config max positions"
    return None, "no max positions in the config"


def layer_note(layout: ModelLayout, lt, vecs: dict) -> str | None:
    """Why layer ``lt`` has no bias profile (None: it has one).  Attention sinks do not change the
    logits (only how softmax weighs them), so a layer with sinks is profiled."""
    if lt.k_norm or layout.qk_norm:
        return "q/k-norm after the projections: the biases pass through a norm, no profile"
    if vecs["q"] is None and vecs["k"] is None:
        return "no q/k biases"
    if vecs["q"] is None or vecs["k"] is None:
        which = "query" if vecs["q"] is None else "key"
        return f"no {which} bias: the bias·bias profile is 0 (--measure shows the bias·content terms)"
    return None


def _why_not(layout: ModelLayout, vecs: dict) -> str | None:
    """What makes a layer's bias vectors unusable (head counts, sizes, NaN/Inf); after :func:`layer_note`."""
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    note = None
    if not (H and G and H % G == 0):
        note = "head counts unknown: no per-head profile"
    if note is None and (vecs["q"].size != H * hd or vecs["k"].size != G * hd):
        note = f"bias sizes {vecs['q'].size} / {vecs['k'].size} do not match the heads ({H}, {G} x {hd})"
    if note is None and not (np.all(np.isfinite(vecs["q"])) and np.all(np.isfinite(vecs["k"]))):
        note = "nonfinite: the q/k biases have NaN/Inf values"
    return note


@dataclass(frozen=True, eq=False)
class _Geometry:
    """What every layer of one profile shares: pairs, pass-through dims, θ, scales, distances."""

    pairs: np.ndarray
    pdims: np.ndarray
    inv: np.ndarray
    s: float                 # logit scale (pass-through part)
    rot: float               # s a^2 (rotated part)
    deltas: np.ndarray
    context: int
    phase: tuple
    cache: dict


def _layer_profile(layout: ModelLayout, layer: int, vecs: dict, geo: _Geometry) -> LayerProfile:
    """One layer's heads: ``h_j`` per query head, ``f`` at the distances, the summaries."""
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    bq, bk = vecs["q"].reshape(H, hd), vecs["k"].reshape(G, hd)
    kv_of = np.arange(H) // (H // G)
    h_s = geo.rot * complex_pairs(bq, geo.pairs) * np.conj(complex_pairs(bk, geo.pairs))[kv_of]     # [H, P]
    const = geo.s * (bq[:, geo.pdims] * bk[kv_of][:, geo.pdims]).sum(1)
    f = profile_values(h_s, const, geo.inv, geo.deltas, 1.0, geo.phase)
    sums = summarize(h_s, const, geo.inv, geo.context, geo.cache)
    return LayerProfile(layer, tuple(HeadProfile(i, int(kv_of[i]), f[i], h_s[i].real, np.abs(h_s[i]), sums[i])
                                     for i in range(H)))


def _model_level(rf: RopeFrequencies, context: int) -> ModelLevel:
    period = 2 * math.pi / rf.inv_freq
    train = rf.training_length or context
    long_p = int((period > train).sum())
    return ModelLevel(first_zero(rf.inv_freq), FIRST_ZERO_LIMIT, long_p, 2 * (len(rf.inv_freq) - long_p), train,
                      len(rf.inv_freq))


def _no_rope_note(layout: ModelLayout) -> str | None:
    pe = layout.position
    if pe.type != "rope":
        return (f"position encoding {pe.type!r}: no rotary embedding, so q·k biases do not depend on the distance "
                "(nothing to profile)")
    if getattr(layout, "derived", None) is not None:
        return "derived architecture: which dims rotate together is not established, no profile"
    return None


def profile_checkpoint(ck, *, context: int | None = None, deltas=None, theta: float | None = None,
                       scaling: dict | None = None, layout: ModelLayout | None = None,
                       vectors: dict | None = None, label: str = "config") -> DistanceProfile:
    """The static distance profile of every layer of an open checkpoint (biases and config only).

    ``deltas``: distances (default :func:`default_deltas` up to ``L - 1``; a string is parsed by
    :func:`parse_deltas`).  ``theta`` / ``scaling``: what-if rope settings (the profile those
    would give; see :func:`distance_profile`).  ``vectors``: ``{layer: layer_vectors(...)}`` already read.
    """
    layout = layout or ck.layout()
    L, L_src = _context(layout, context)
    base = dict(source=ck.source, label=label, context=L, attn_scale=attention_scale(layout, ck.config))
    empty = dict(deltas=np.zeros(0), model=None, layers=())
    why = _no_rope_note(layout)
    if why:
        return DistanceProfile(rope=None, pair_layout=None, notes=(why,), **empty, **base)
    if L is None:
        raise CkptError("the distance profile needs a context: the config has no max positions, pass --context L",
                        path=ck.source)
    ff = None
    if GGUF_FREQ_FACTORS in ck.tensors and not ck.tensors[GGUF_FREQ_FACTORS].missing:
        ff = np.asarray(ck.read(GGUF_FREQ_FACTORS), dtype=np.float64)
    rf = rope_frequencies(layout, ck.config, length=L, theta=theta, scaling=scaling, freq_factors=ff)
    pair_layout = layout.position.pair_layout or "rotate_half"
    if rf is None or rf.rope_type not in SUPPORTED:
        why = (rf.note if rf else None) or "rope without head_dim / rotary_dim: no profile"
        return DistanceProfile(rope=rf, pair_layout=pair_layout, notes=(why,), **empty, **base)
    notes = [rf.note] if rf.note else []
    if layout.softcap:
        notes.append(f"attention logit soft-capping ({layout.softcap}): the profile is of the logit before tanh")
    d = (parse_deltas(deltas, L - 1) if (deltas is None or isinstance(deltas, str))
         else np.union1d(np.asarray(deltas, np.float64), [0.0]))
    pairs = rotary_pairs(layout.head_dim, rf.rotary_dim, pair_layout)
    s = base["attn_scale"]
    geo = _Geometry(pairs, pass_dims(layout.head_dim, pairs), rf.inv_freq, s, s * rf.attention_factor ** 2, d, L,
                    phases(rf.inv_freq, d), {})
    layers = []
    for lt in layout.layers:
        vecs = vectors[lt.layer] if vectors is not None else layer_vectors(ck, layout, lt)
        why = layer_note(layout, lt, vecs) or _why_not(layout, vecs)
        layers.append(LayerProfile(lt.layer, (), why) if why else _layer_profile(layout, lt.layer, vecs, geo))
    if L_src != "--context":
        notes.append(f"context L = {L} ({L_src})")
    return DistanceProfile(deltas=d, rope=rf, pair_layout=pair_layout, model=_model_level(rf, L),
                           layers=tuple(layers), notes=tuple(notes), **base)


def whatif_context(layout: ModelLayout, config: dict | None, context: int, scaling: dict | None) -> int:
    """The context an extension with ``scaling`` targets: ``factor`` times today's (dynamic / linear
    / yarn / llama3), today's otherwise."""
    if scaling and scaling.get("factor") and scaling.get("rope_type") in ("linear", "dynamic", "yarn", "llama3"):
        return int(round(context * float(scaling["factor"])))
    return context


def distance_profile(ck, *, context: int | None = None, deltas=None, theta: float | None = None,
                     scaling: dict | None = None, layout: ModelLayout | None = None) -> DistanceProfile:
    """The static profile under the config's rope; with ``theta`` and/or ``scaling`` (what-if,
    e.g. ``parse_rope_scaling("yarn:4")``) the profile under those beside it (``.whatif``), over
    the extended context, on a distance grid covering both."""
    layout = layout or ck.layout()
    if theta is None and scaling is None:
        return profile_checkpoint(ck, context=context, deltas=deltas, layout=layout)
    if theta is not None and not (math.isfinite(theta) and theta > 1):
        raise CkptError(f"--rope-theta must be a finite base > 1 (got {theta})")
    L, _ = _context(layout, context)
    if L is None:
        raise CkptError("the distance profile needs a context: pass --context L", path=ck.source)
    L2 = whatif_context(layout, ck.config, L, scaling)
    d = parse_deltas(deltas, max(L, L2) - 1) if (deltas is None or isinstance(deltas, str)) else deltas
    vectors = {lt.layer: layer_vectors(ck, layout, lt) for lt in layout.layers}
    today = profile_checkpoint(ck, context=L, deltas=d, layout=layout, vectors=vectors)
    what = []
    if theta is not None:
        what.append(f"rope_theta {theta:g}")
    if scaling is not None:
        what.append("rope scaling " + ", ".join(f"{k}={v}" for k, v in scaling.items()))
    wi = profile_checkpoint(ck, context=L2, deltas=d, theta=theta, scaling=scaling, layout=layout, vectors=vectors,
                            label="what-if: " + "; ".join(what))
    from dataclasses import replace
    return replace(today, whatif=wi)
