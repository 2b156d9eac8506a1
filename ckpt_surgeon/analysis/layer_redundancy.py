"""One layer's key / value / query-bias verdict: its class from the layout alone, the records, and
the bounds of :mod:`.bounds` applied to its vectors; and the choice of rotary pairs
``fold-bias --k --approximate`` removes within a budget (module doc of :mod:`.bounds`: the math).

Nothing here reads a checkpoint: :mod:`.redundancy` reads the vectors and calls :func:`analyze_layer`;
nothing here branches on a model name.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..arch.checked import F32_MAX, config_float
from ..arch.resolve import LayerTensors, ModelLayout
from ..arch.rope import RopeGeometry
from ..errors import CkptError
from ..records import finite_or_none as _f
from .bounds import angle_factor, contributions, pair_norms, q_pair_bound, set_bound, tv_bound

DEFAULT_EPSILON = 0.1          # rad: a pair is near-redundant when it turns less than this over the context
CLASSES = ("exact", "partial", "rope", "not-removable", "unknown")
# "Far from zero" for a key bias that gets no gradient (non-rotary models): relative to the
# query bias of the same layer (trained all-MiniLM-L6-v2: ||b_k|| / ||b_q|| <= 0.005), or, with
# no query bias, an RMS above this absolute value.
SUSPICIOUS_K_RATIO = 0.1
SUSPICIOUS_K_RMS = 0.05

_SINKS = re.compile(r"(?:^|\.)(\d+)\.(?:.*\.)?(?:attn_)?sinks(?:\.weight)?$")


# ----------------------------------------------------------------------------------------------
# Model-level geometry (scale, sinks, class)
# ----------------------------------------------------------------------------------------------

def attention_scale(layout: ModelLayout, config: dict | None) -> float:
    """Logit scale ``s``: ``query_pre_attn_scalar ** -0.5`` (Gemma), ``attention_multiplier``
    (Granite), no scaling when GPT-2's ``scale_attn_weights`` is off, else ``head_dim ** -0.5``."""
    cfg = dict(config or {})
    # untrusted values, checked where read (arch/checked.py); at most float32's largest, as
    # llama.cpp stores them (a 1e308 multiplier would overflow the bound to inf)
    where = layout.config_source
    qpas = config_float(cfg, ("query_pre_attn_scalar",), path=where, positive=True, maximum=F32_MAX)
    if qpas is not None:
        return qpas ** -0.5
    mult = config_float(cfg, ("attention_multiplier",), path=where, positive=True, maximum=F32_MAX)
    if mult is not None:
        return mult
    if cfg.get("scale_attn_weights") is False:
        return 1.0
    return float(layout.head_dim) ** -0.5 if layout.head_dim else float("nan")


def sink_layers(tensor_names) -> set[int]:
    """Layers holding an attention-sink tensor (HF ``self_attn.sinks``, GGUF ``attn_sinks``)."""
    out = set()
    for n in tensor_names:
        m = _SINKS.search(n)
        if m:
            out.add(int(m.group(1)))
    return out


def classify(layout: ModelLayout, lt: LayerTensors, *, sinks: bool = False) -> tuple[str, tuple[str, ...]]:
    """Key-bias class of one layer and the reasons, from the layout alone (no data read)."""
    if getattr(layout, "derived", None) is not None:
        from ..arch.derive.derived import classify_group
        return classify_group(layout.derived, lt.group)     # probed per block group (arch/derive/probe.py)
    reasons = []
    if lt.k_norm or layout.qk_norm:
        reasons.append("a norm follows the projection (q/k-norm): the key bias passes through a nonlinearity")
    if sinks:
        reasons.append("attention sinks: a constant logit shift changes the weight of the sink")
    if layout.softcap:
        reasons.append(f"attention logit soft-capping ({layout.softcap}): tanh is not shift-invariant")
    if reasons:
        return "not-removable", tuple(reasons)
    pe = layout.position
    if pe.type == "unknown":
        return "unknown", ("architecture not in the registry: position encoding unknown",)
    if pe.type in ("absolute", "alibi", "none"):
        return "exact", (f"no rotary embedding ({pe.type} positions): q.b_k is constant over the keys",)
    if pe.type == "rope":
        if not layout.head_dim or not pe.rotary_dim:
            return "unknown", ("rope without a known head_dim / rotary_dim",)
        if pe.rotary_dim < layout.head_dim:
            return "partial", (f"partial rotary: dims {pe.rotary_dim}..{layout.head_dim - 1} of each head pass "
                               "through unrotated (exact); rotated pairs depend on the distance",)
        return "rope", ("every dimension is rotated after the biased projection: the bias term depends on n - m",)
    return "unknown", (f"position encoding {pe.type!r}",)


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadRedundancy:
    """One kv head's key bias: energy split and bounds (bounds: max over its query heads)."""

    kv_head: int
    query_heads: tuple
    k_bias_l2: float | None
    exact_fraction: float | None
    near_fraction: float | None
    rest_fraction: float | None
    bound: float | None          # removing exact + near parts
    bound_all: float | None      # removing the whole bias

    def to_dict(self) -> dict:
        return {"kv_head": self.kv_head, "query_heads": list(self.query_heads), "k_bias_l2": _f(self.k_bias_l2),
                "exact_fraction": _f(self.exact_fraction), "near_fraction": _f(self.near_fraction),
                "rest_fraction": _f(self.rest_fraction), "bound": _f(self.bound), "bound_all": _f(self.bound_all)}


@dataclass(frozen=True)
class QueryBias:
    l2: float | None
    per_head_l2: tuple | None
    note: str = "not removable: q~ multiplies every key, so b_q changes every logit differently"

    def to_dict(self) -> dict:
        return {"l2": _f(self.l2), "per_head_l2": None if self.per_head_l2 is None else [_f(x) for x in self.per_head_l2],
                "note": self.note}


@dataclass(frozen=True)
class ValueBias:
    l2: float | None
    foldable: bool | None
    reason: str

    def to_dict(self) -> dict:
        return {"l2": _f(self.l2), "foldable": self.foldable, "reason": self.reason}


@dataclass(frozen=True, eq=False)
class LayerRedundancy:
    """Static analysis of one layer (arrays are per kv head ``G``, query head ``H``, pair ``P``)."""

    layer: int
    k_class: str
    reasons: tuple
    k_bias_tensor: str | None
    k_bias_l2: float | None
    exact_fraction: float | None
    near_fraction: float | None
    rest_fraction: float | None
    epsilon: float
    context: int | None
    bound: float | None              # removing exact + near parts: max logit change beyond a per-row shift
    bound_all: float | None          # removing the whole key bias
    bound_note: str | None
    heads: tuple = ()
    near_pairs: tuple = ()           # pair indices j with w_j L < epsilon
    exact_dims: tuple = ()           # indices into this layer's key-bias vector (kv-head-major)
    group: int = 1                   # query heads per kv head
    head_dim: int | None = None
    pairs: np.ndarray | None = field(default=None, repr=False)          # [P, 2]
    inv_freq: np.ndarray | None = field(default=None, repr=False)       # [P]
    angles: np.ndarray | None = field(default=None, repr=False)         # [P] w_j L (None: L unknown)
    pair_energy: np.ndarray | None = field(default=None, repr=False)    # [G, P] |b_j|^2
    q_pair_bound: np.ndarray | None = field(default=None, repr=False)   # [H, P] static bound on |q~_j|
    contributions: np.ndarray | None = field(default=None, repr=False)  # [H, P] per-pair logit bound
    q_bias: QueryBias | None = None
    v_bias: ValueBias | None = None
    flags: tuple = ()

    @property
    def has_k_bias(self) -> bool:
        return self.k_bias_tensor is not None

    def redundancy_dict(self) -> dict:
        """The ``k_bias_redundancy`` object ``inspect --format json`` carries per layer."""
        d = {"class": self.k_class, "exact_fraction": _f(self.exact_fraction), "near_fraction": _f(self.near_fraction),
             "epsilon": self.epsilon, "context": self.context, "bound": _f(self.bound)}
        if self.bound is None and self.bound_note:
            d["note"] = self.bound_note
        return d

    def pair_rows(self) -> list[dict]:
        if self.pairs is None:
            return []
        out = []
        for j in range(self.pairs.shape[0]):
            row = {"j": j, "dims": [int(x) for x in self.pairs[j]], "inv_freq": float(self.inv_freq[j]),
                   "angle": None if self.angles is None else float(self.angles[j]), "near": j in self.near_pairs,
                   "energy": None if self.pair_energy is None else [_f(x) for x in self.pair_energy[:, j]]}
            if self.contributions is not None:
                g = self.contributions.shape[0] // self.group
                row["max_contribution"] = [_f(x) for x in self.contributions[:, j].reshape(g, self.group).max(axis=1)]
            out.append(row)
        return out

    def to_dict(self) -> dict:
        return {"layer": self.layer, "class": self.k_class, "reasons": list(self.reasons),
                "k_bias_tensor": self.k_bias_tensor, "k_bias_l2": _f(self.k_bias_l2),
                "exact_fraction": _f(self.exact_fraction), "near_fraction": _f(self.near_fraction),
                "rest_fraction": _f(self.rest_fraction), "epsilon": self.epsilon, "context": self.context,
                "bound": _f(self.bound), "bound_all": _f(self.bound_all), "tv_bound": _f(tv_bound(self.bound)),
                "tv_bound_all": _f(tv_bound(self.bound_all)), "bound_note": self.bound_note,
                "near_pairs": list(self.near_pairs), "exact_dims": len(self.exact_dims),
                "heads": [h.to_dict() for h in self.heads], "pairs": self.pair_rows(),
                "q_bias": self.q_bias.to_dict() if self.q_bias else None,
                "v_bias": self.v_bias.to_dict() if self.v_bias else None, "flags": list(self.flags)}


def _fractions(e_exact, e_near, total):
    if total is None or not np.isfinite(total):
        return None, None, None
    if total == 0:
        return 1.0, 0.0, 0.0       # an all-zero bias is trivially removable
    ex, ne = float(e_exact / total), float(e_near / total)
    return ex, ne, max(0.0, 1.0 - ex - ne)


def _query_bias(b_q: np.ndarray | None, H: int | None, hd: int | None, flags: list) -> QueryBias | None:
    """Norms of the query bias (never redundant: it multiplies every key), whole and per head."""
    if b_q is None:
        return None
    v = np.asarray(b_q, dtype=np.float64).reshape(-1)
    per = tuple(np.sqrt((v.reshape(H, hd) ** 2).sum(1))) if (H and hd and v.size == H * hd) else None
    if not np.all(np.isfinite(v)):
        flags.append("nonfinite: the query bias has NaN/Inf values")
    return QueryBias(float(np.sqrt((v ** 2).sum())), per)


def _value_bias(layout: ModelLayout, lt: LayerTensors, b_v: np.ndarray | None, sinks: bool,
                flags: list) -> ValueBias | None:
    """Whether ``W_o b_v`` folds into the output bias of this layer, and why."""
    if b_v is None:
        return None
    v = np.asarray(b_v, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(v)):
        flags.append("nonfinite: the value bias has NaN/Inf values")
    l2 = float(np.sqrt((v ** 2).sum()))
    derived = getattr(layout, "derived", None)
    if derived is not None and lt.o_bias is not None:
        from ..arch.derive.derived import v_fold_verdict      # probed per block group (arch/derive/probe.py)
        return ValueBias(l2, *v_fold_verdict(derived, lt.group))
    if sinks:
        return ValueBias(l2, False, "attention sinks: softmax rows do not sum to 1 over the keys, so W_o b_v is not "
                                    "a constant")
    if lt.o_bias is not None:
        return ValueBias(l2, True, "exact: softmax rows sum to 1, fold as b_o' = b_o + W_o b_v")
    if lt.o_weight is not None:
        return ValueBias(l2, False, "the architecture has no output-projection bias to fold W_o b_v into")
    return ValueBias(l2, None, "output projection not found")


def _suspicious_k_flag(bk: np.ndarray, l2: float, qb: QueryBias | None) -> str | None:
    """A non-rotary key bias far from its init: it gets no gradient, so a large one points to a
    conversion error (thresholds :data:`SUSPICIOUS_K_RATIO`, :data:`SUSPICIOUS_K_RMS`)."""
    ql2 = qb.l2 if qb else None
    if (ql2 and l2 > SUSPICIOUS_K_RATIO * ql2) or (not ql2 and bk.size and math.sqrt(l2 ** 2 / bk.size) > SUSPICIOUS_K_RMS):
        ref = f"||b_q|| = {ql2:.4g}" if ql2 else f"RMS {math.sqrt(l2 ** 2 / bk.size):.4g}"
        return (f"suspicious-k-bias: non-rotary model, the key bias gets no gradient and should sit at its "
                f"init (~0), yet ||b_k|| = {l2:.4g} ({ref}); a conversion error (shifted / mislabeled tensor)?")
    return None


def _whole_class_layer(cls: str, reasons: tuple, bk: np.ndarray, l2: float, G: int, hd: int, group: int,
                       flags: list, base: dict) -> LayerRedundancy:
    """A class that applies to the whole key bias (exact, not-removable, unknown), per kv head."""
    bh = bk.reshape(G, hd)
    tot_h = (bh ** 2).sum(1)
    e = {"exact": (1.0, 0.0, 0.0), "not-removable": (0.0, 0.0, 1.0), "unknown": (None, None, None)}[cls]
    bnd = 0.0 if cls == "exact" else None
    note = None if cls == "exact" else ("not removable: " + "; ".join(reasons) if cls == "not-removable"
                                        else "class unknown")
    heads = tuple(HeadRedundancy(g, tuple(range(g * group, (g + 1) * group)), float(math.sqrt(tot_h[g])), *e, bnd, bnd)
                  for g in range(G))
    return LayerRedundancy(k_bias_l2=l2, exact_fraction=e[0], near_fraction=e[1], rest_fraction=e[2],
                           bound=bnd, bound_all=bnd, bound_note=note, heads=heads,
                           exact_dims=tuple(range(bk.size)) if cls == "exact" else (), flags=tuple(flags), **base)


def _rotary_layer(bk: np.ndarray, l2: float, *, H: int, G: int, hd: int, group: int, rope: RopeGeometry,
                  w_q, gamma, beta, b_q, scale: float, context: int | None, epsilon: float,
                  weights_note: str | None, flags: list, base: dict) -> LayerRedundancy:
    """Partial / full rotary key bias: exact pass-through dims, near pairs (``w_j L < epsilon``),
    and the bound for removing them from ``W_q`` (module doc)."""
    bh = bk.reshape(G, hd)
    tot_h = (bh ** 2).sum(1)
    heads_q = [tuple(range(g * group, (g + 1) * group)) for g in range(G)]
    pairs, r = rope.pairs, rope.rotary_dim
    pass_dims = np.arange(r, hd)
    e_exact = (bh[:, pass_dims] ** 2).sum(1)
    energy = bh[:, pairs[:, 0]] ** 2 + bh[:, pairs[:, 1]] ** 2                     # [G, P]
    angles = None if context is None else rope.inv_freq * float(context)
    near = np.zeros(len(rope.inv_freq), bool) if (angles is None or rope.pair_layout == "unknown") else angles < epsilon
    e_near = energy[:, near].sum(1)
    exact_dims = tuple(int(g * hd + d) for g in range(G) for d in pass_dims)
    factor = angle_factor(rope.inv_freq, context)
    contrib = q_hat = None
    note = None
    if not rope.supported:
        note = rope.note
    elif w_q is not None:
        if not np.all(np.isfinite(w_q)):
            flags.append("nonfinite: W_q has NaN/Inf values")
            note = "W_q has NaN/Inf values"
        else:
            q_hat = q_pair_bound(w_q, pairs, H, hd, gamma=gamma, beta=beta, b_q=b_q)
            contrib = contributions(q_hat, pair_norms(bh, pairs), factor, scale * rope.attention_factor ** 2, group)
    else:
        note = weights_note or "needs W_q"
    if contrib is not None:
        b_near_h, b_all_h = set_bound(contrib, near, group), set_bound(contrib, np.ones_like(near), group)
    else:
        b_near_h = np.zeros(G) if not near.any() and rope.supported else None
        b_all_h = None
    heads = []
    for g in range(G):
        ex, ne, re_ = _fractions(e_exact[g], e_near[g], tot_h[g])
        heads.append(HeadRedundancy(g, heads_q[g], float(math.sqrt(tot_h[g])), ex, ne, re_,
                                    None if b_near_h is None else float(b_near_h[g]),
                                    None if b_all_h is None else float(b_all_h[g])))
    ex, ne, re_ = _fractions(e_exact.sum(), e_near.sum(), tot_h.sum())
    bound = None if b_near_h is None else float(b_near_h.max())
    return LayerRedundancy(
        k_bias_l2=l2, exact_fraction=ex, near_fraction=ne, rest_fraction=re_,
        bound=bound, bound_all=None if b_all_h is None else float(b_all_h.max()),
        bound_note=None if (bound is not None and b_all_h is not None) else note,
        heads=tuple(heads), near_pairs=tuple(int(j) for j in np.flatnonzero(near)), exact_dims=exact_dims,
        pairs=pairs, inv_freq=rope.inv_freq, angles=angles, pair_energy=energy, q_pair_bound=q_hat,
        contributions=contrib, flags=tuple(flags), **base)


def analyze_layer(layout: ModelLayout, lt: LayerTensors, *, b_k: np.ndarray | None, b_q: np.ndarray | None = None,
                  b_v: np.ndarray | None = None, w_q: np.ndarray | None = None, gamma: np.ndarray | None = None,
                  beta: np.ndarray | None = None, rope: RopeGeometry | None = None, scale: float = float("nan"),
                  context: int | None = None, epsilon: float = DEFAULT_EPSILON, sinks: bool = False,
                  weights_note: str | None = None, k_tensor: str | None = None) -> LayerRedundancy:
    """Analyse one layer from its bias vectors (and ``W_q`` + norm when a bound needs them).

    Shapes: ``b_k``/``b_v`` ``[G*head_dim]``, ``b_q`` ``[H*head_dim]``, ``w_q`` ``[H*head_dim, D]``,
    ``gamma``/``beta`` ``[D]`` (effective norm scale/shift).  ``w_q=None``: the bound is given only
    where it needs no weights (0 when nothing rotated is removed), else None with ``weights_note``.
    """
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    cls, reasons = classify(layout, lt, sinks=sinks)
    flags = []
    group = (H // G) if (H and G and H % G == 0) else 1
    qb = _query_bias(b_q, H, hd, flags)
    vb = _value_bias(layout, lt, b_v, sinks, flags)
    base = dict(layer=lt.layer, k_class=cls, reasons=reasons, k_bias_tensor=k_tensor, epsilon=float(epsilon),
                context=context, group=group, head_dim=hd, q_bias=qb, v_bias=vb)
    if b_k is None:
        return LayerRedundancy(k_bias_l2=None, exact_fraction=None, near_fraction=None, rest_fraction=None,
                               bound=None, bound_all=None, bound_note=("no key bias" if k_tensor is None else weights_note),
                               flags=tuple(flags), **base)
    bk = np.asarray(b_k, dtype=np.float64).reshape(-1)
    l2 = float(np.sqrt((bk ** 2).sum()))
    if not np.all(np.isfinite(bk)):
        flags.append("nonfinite: the key bias has NaN/Inf values")
        return LayerRedundancy(k_bias_l2=None, exact_fraction=None, near_fraction=None, rest_fraction=None,
                               bound=None, bound_all=None, bound_note="the key bias has NaN/Inf values",
                               flags=tuple(flags), **base)
    if cls == "exact":
        flag = _suspicious_k_flag(bk, l2, qb)
        if flag:
            flags.append(flag)
    if not (G and hd and bk.size == G * hd):
        note = "head counts unknown: per-head split and bound unavailable"
        ex = (1.0 if cls == "exact" else 0.0) if cls != "unknown" else None
        return LayerRedundancy(k_bias_l2=l2, exact_fraction=ex, near_fraction=None if ex is None else 0.0,
                               rest_fraction=None if ex is None else 1.0 - ex,
                               bound=0.0 if cls == "exact" else None, bound_all=0.0 if cls == "exact" else None,
                               bound_note=None if cls == "exact" else note, flags=tuple(flags), **base)
    if cls in ("exact", "not-removable", "unknown"):
        return _whole_class_layer(cls, reasons, bk, l2, G, hd, group, flags, base)
    if rope is None:      # partial / rope in a stack whose rotary geometry is not established (a derived
        #                   layer group with other head counts, e.g. MiMo-V2-Flash's second attention kind)
        note = "rotary geometry of this attention stack not established: no removable share or bound claimed"
        return LayerRedundancy(k_bias_l2=l2, exact_fraction=None, near_fraction=None, rest_fraction=None,
                               bound=None, bound_all=None, bound_note=note, flags=tuple(flags), **base)
    return _rotary_layer(bk, l2, H=H, G=G, hd=hd, group=group, rope=rope, w_q=w_q, gamma=gamma, beta=beta, b_q=b_q,
                         scale=scale, context=context, epsilon=epsilon, weights_note=weights_note, flags=flags,
                         base=base)


# ----------------------------------------------------------------------------------------------
# Pair selection for approximate surgery (fold-bias --k --approximate --max-logit-change X)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairSelection:
    """Which parts of one layer's key bias to zero, with the sound bound that choice carries."""

    layer: int
    dims: tuple            # indices into the layer's key-bias vector (kv-head-major, the checkpoint's row order)
    pairs: tuple           # (kv_head, j) rotary pairs chosen
    exact_dims: int        # how many of ``dims`` are pass-through (exact) dims
    bound: float           # max logit change beyond a per-row shift (<= the budget)
    removed_energy_fraction: float
    note: str | None = None

    def to_dict(self) -> dict:
        return {"layer": self.layer, "dims": list(self.dims), "pairs": [list(p) for p in self.pairs],
                "exact_dims": self.exact_dims, "bound": self.bound, "tv_bound": tv_bound(self.bound),
                "removed_energy_fraction": self.removed_energy_fraction, "note": self.note}


def pair_contributions(layer: LayerRedundancy) -> np.ndarray | None:
    """``[H, P]``: the most removing pair ``j`` (of query head ``h``'s kv head) can move a logit
    beyond a per-row shift; sums over a set of pairs bound removing the set (see module doc)."""
    return None if layer.contributions is None else layer.contributions.copy()


def select_pairs(layer: LayerRedundancy, max_logit_change: float, *, include_exact: bool = True,
                 only_near: bool = False) -> PairSelection:
    """Choose rotary pairs of ``layer``'s key bias to remove so the bound stays <= ``max_logit_change``.

    Per kv head (logits of different heads are independent; the layer bound is their max), pairs
    are taken greedily from the slowest-turning (smallest ``w_j``) up; a pair is skipped when it
    would push ``max_{h in g} sum c[h, j]`` over the budget.  Hence a budget >= ``layer.bound``
    takes every near-redundant pair, and a budget >= ``layer.bound_all`` takes every pair.  The
    guarantee is the bound, not the most energy removed.  ``include_exact`` adds the pass-through dims (cost 0);
    ``only_near`` restricts candidates to pairs with ``w_j L < epsilon``.  Layers without a
    bound (not-removable, no static |q| bound) get the exact dims only (or nothing).
    """
    if max_logit_change < 0 or not math.isfinite(max_logit_change):
        raise CkptError(f"max_logit_change must be a finite number >= 0 (got {max_logit_change})")
    hd = layer.head_dim or 0
    total = (layer.k_bias_l2 or 0.0) ** 2
    exact = list(layer.exact_dims) if (include_exact and layer.k_class in ("exact", "partial")) else []
    e_exact = total * (layer.exact_fraction or 0.0) if exact else 0.0
    if layer.k_class == "exact":
        return PairSelection(layer.layer, tuple(exact), (), len(exact), 0.0, 1.0 if exact else 0.0)
    if layer.contributions is None or layer.pairs is None:
        note = layer.bound_note or "no bound available"
        return PairSelection(layer.layer, tuple(exact), (), len(exact), 0.0,
                             (e_exact / total) if total else 0.0, f"no rotary pair chosen: {note}")
    c, g_size = layer.contributions, layer.group
    n_kv = c.shape[0] // g_size
    chosen, dims, e_removed, bound = [], list(exact), e_exact, 0.0
    for g in range(n_kv):
        cg = c[g * g_size:(g + 1) * g_size]                  # [group, P]
        cost = cg.max(axis=0)
        energy = layer.pair_energy[g]
        cand = [j for j in range(cg.shape[1]) if (not only_near or j in layer.near_pairs) and energy[j] > 0]
        cand.sort(key=lambda j: (layer.inv_freq[j], cost[j], j))
        acc = np.zeros(g_size)
        # 1e-12 relative slack: summation order differs from set_bound's by a few ulps, and a
        # budget equal to a reported bound must admit the set that bound was computed for.
        budget = max_logit_change * (1 + 1e-12)
        for j in cand:
            if (acc + cg[:, j]).max() <= budget:
                acc += cg[:, j]
                chosen.append((g, j))
                dims.extend(int(g * hd + d) for d in layer.pairs[j])
                e_removed += float(energy[j])
        bound = max(bound, float(acc.max()) if g_size else 0.0)
    return PairSelection(layer.layer, tuple(sorted(dims)), tuple(chosen), len(exact), bound,
                         (e_removed / total) if total else 0.0)
