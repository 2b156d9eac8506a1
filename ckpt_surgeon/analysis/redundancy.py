"""Static key/value/query-bias redundancy analysis (numpy only, no forward pass).

Works on any :class:`~ckpt_surgeon.checkpoint.Checkpoint` (HF folder, .safetensors, GGUF,
Hub) through its :class:`~ckpt_surgeon.arch.resolve.ModelLayout`; nothing here branches on a
model name.

Key bias: what removing it does to the attention logits
=======================================================

Notation (one layer, query head ``h``, its kv head ``g = h // (H / G)``; pair ``j`` of a head
is the two dimensions RoPE rotates together, :func:`~ckpt_surgeon.arch.layouts.rotary_pairs`:
``(j, j + r/2)`` for HF ``rotate_half``, ``(2j, 2j+1)`` for llama.cpp-permuted GGUFs; ``r`` is
the rotary dim, dimensions ``>= r`` pass through unrotated).  The projections are
``q~_m = W_q x_m + b_q`` and ``k~_n = W_k x_n + b_k`` (before RoPE), ``x`` the attention input.

transformers applies RoPE as ``q_m = q~_m * cos(m w) + rotate_half(q~_m) * sin(m w)`` with
``w_j = theta ** (-2j / r)`` shared by both dims of pair ``j`` (``modeling_rope_utils``
``_compute_default_rope_parameters``; ``modeling_qwen2.apply_rotary_pos_emb``).  On pair ``j``
that is the 2-D rotation ``R(m w_j)``, so with attention scale ``s`` (``head_dim ** -0.5``, or
``query_pre_attn_scalar ** -0.5``) the logit is

    l_mn = s * sum_j <R(m w_j) q~_mj, R(n w_j) k~_nj> + s * <q~_m,pass, k~_n,pass> + a_mn
         = s * sum_j <q~_mj, R((n - m) w_j) k~_nj> + s * <q~_m,pass, k~_n,pass> + a_mn

(``R`` is orthogonal, ``R(a)^T R(b) = R(b - a)``; ``a_mn`` = mask / ALiBi, independent of
``b_k``).  Removing the part ``b_S`` of ``b_k`` (pairs ``j in S`` plus any pass-through dims
``P``) changes the logit by

    D_mn = - s * sum_{j in S} <q~_mj, R((n - m) w_j) b_j>  -  s * <q~_m,P, b_P>.

* The pass-through term does not depend on ``n``: softmax ignores it (exact).  Without RoPE
  (absolute, learned, ALiBi, T5-style, none) every dimension is pass-through, so the whole key
  bias is exactly redundant (class ``exact``); with partial rotary the pass-through part is
  (class ``partial``); with full rotary nothing is (class ``rope``).
* Pair term: ``<q, R(phi) b> = |q| |b| cos(phi + alpha)``.  For a causal model the distance
  ``n - m`` ranges over ``[-(L-1), 0]`` in a window of ``L`` positions, so ``phi`` ranges over an
  interval of length ``<= w_j L`` and the pair term varies over the keys of a row by at most
  ``|q~_mj| |b_j| * min(2, 2 sin(w_j L / 2)) <= |q~_mj| |b_j| * min(2, w_j L)``.

Hence, for every query row ``m``, the spread ``max_n D_mn - min_n D_mn`` is at most

    E = max_{h, m} s * sum_{j in S} |q~_{m,h,j}| |b_{g(h),j}| min(2, w_j L)

and so is ``|D_mn - c_m|`` for any per-row shift ``c_m`` between the row's extremes (the
mean over the row's keys, the diagonal value ``D_mm``); softmax removes ``c_m``.  GQA: each kv
head's bias is read by ``H / G`` query heads; ``E`` takes the max over them.  Probabilities:
the log-ratio of the two softmax rows spans at most ``E``, so their total variation is at most
``tanh(E / 4)`` (the two-point distribution is extremal).

``|q~_{m,h,j}|`` is bounded from the weights.  RMSNorm input: ``x = gamma * u`` with
``u = h / sqrt(mean(h^2) + eps)``, so ``|u|_2 <= sqrt(D)`` (``D`` = hidden size) and
``|q~_j| <= ||W_q[j] diag(gamma)||_2 sqrt(D) + |b_q,j|`` (``W_q[j]``: the 2 x D row block of
pair ``j``; its spectral norm from the 2 x 2 Gram matrix).  LayerNorm input:
``x = gamma * u + beta`` with ``u`` centred and ``|u|_2 <= sqrt(D)``, so
``|q~_j| <= ||W_q[j] diag(gamma)||_2 sqrt(D) + |W_q[j] beta + b_q,j|``.  Where no norm feeds
the projection (post-norm models, unknown architectures) ``|q~|`` has no static bound and the
report gives none rather than a wrong one.

Rope scaling: linear / dynamic / llama3 / yarn / longrope only *lower* frequencies when their
factors are >= 1 (the bound keeps the unscaled, larger ``w_j``: conservative); yarn and
longrope multiply cos and sin by ``attention_factor`` (``modeling_rope_utils``), which scales
logits by its square: the bound includes it.  Other rope types: no bound.

Not removable at all: a norm after the projection (q/k-norm of Qwen3 / OLMo2 / Gemma3: the
bias goes through a nonlinearity), attention sinks (a constant logit shift changes the weight
of the sink), logit soft-capping (``tanh`` is not shift-invariant).

Value bias: softmax rows sum to 1, so ``b_v`` adds the constant ``W_o b_v`` per layer: exact
to fold into the output-projection bias where the architecture has one (not Qwen2's
``o_proj``), not with attention sinks (rows no longer sum to 1 over the keys).

Query bias: ``q~`` multiplies every key, so ``b_q`` is never redundant; only norms are reported.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..arch.checked import F32_MAX, config_float
from ..arch.layouts import GATE_LAYOUTS, query_row_index, qkv_row_index
from ..arch.resolve import LayerTensors, LayoutSummary, ModelLayout
from ..arch.rope import RopeGeometry, rope_geometry
from ..errors import CkptError
from ..records import finite_or_none as _f
from ..checkpoint import heads_cell

DEFAULT_EPSILON = 0.1          # rad: a pair is near-redundant when it turns less than this over the context
CLASSES = ("exact", "partial", "rope", "not-removable", "unknown")
# "Far from zero" for a key bias that gets no gradient (non-rotary models): relative to the
# query bias of the same layer (trained all-MiniLM-L6-v2: ||b_k|| / ||b_q|| <= 0.005), or, with
# no query bias, an RMS above this absolute value.
SUSPICIOUS_K_RATIO = 0.1
SUSPICIOUS_K_RMS = 0.05

_SINKS = re.compile(r"(?:^|\.)(\d+)\.(?:.*\.)?(?:attn_)?sinks(?:\.weight)?$")


# ----------------------------------------------------------------------------------------------
# Pure math
# ----------------------------------------------------------------------------------------------

def angle_factor(inv_freq: np.ndarray, context: int | None) -> np.ndarray:
    """``min(2, w_j L)``: the most a unit pair term ``cos(phi + a)`` varies while ``phi`` sweeps
    ``w_j L`` radians (``2 |sin(w_j L / 2)| <= min(2, w_j L)``).  Unknown ``L``: 2 (any window)."""
    if context is None:
        return np.full(inv_freq.shape, 2.0)
    return np.minimum(2.0, inv_freq * float(context))


def pair_norms(b: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """``|b_j|`` per head and pair: ``b`` ``[G, head_dim]``, ``pairs`` ``[P, 2]`` -> ``[G, P]``."""
    return np.sqrt(b[:, pairs[:, 0]] ** 2 + b[:, pairs[:, 1]] ** 2)


def q_pair_bound(w_q: np.ndarray, pairs: np.ndarray, n_heads: int, head_dim: int, *,
                 gamma: np.ndarray | None = None, beta: np.ndarray | None = None,
                 b_q: np.ndarray | None = None) -> np.ndarray:
    """Static bound on ``|q~_{h,j}|`` for every query head and rotary pair -> ``[H, P]``.

    ``w_q`` ``[H*head_dim, D]`` (numpy order, rows head-major in the file's own row order);
    ``gamma``/``beta`` ``[D]`` the attention-input norm's effective scale and shift (``beta``
    only for LayerNorm); ``b_q`` ``[H*head_dim]``.  With ``|u|_2 <= sqrt(D)`` for the normalised
    input ``u``: ``|q~_j| <= ||W_q[j] diag(gamma)||_2 sqrt(D) + |W_q[j] beta + b_q,j|``.
    The spectral norm of the 2 x D block is ``sqrt`` of the largest eigenvalue of its 2 x 2 Gram
    matrix ``[[a, b], [b, c]]``: ``(a + c) / 2 + sqrt(((a - c) / 2)^2 + b^2)``, with ``a``, ``c``
    the squared norms of the two rows of ``W_q[j] diag(gamma)`` and ``b`` their dot product.

    ``w_q`` may be float32 (what :func:`q_weight` returns for BF16/F16/F32 checkpoints, widened
    exactly): all arithmetic is float64 all the same, one head (``head_dim x D``) at a time into
    one reused buffer, so a 7B ``W_q`` never gets a float64 copy.  Every row norm comes from one
    pass (``einsum``); rotate_half pairs ``(j, j + r/2)`` with ``r = head_dim`` are the two
    halves of the head's rows (slices, no gather).
    """
    d_in = w_q.shape[1]
    pairs = np.asarray(pairs)
    p0, p1 = pairs[:, 0], pairs[:, 1]
    w = np.asarray(w_q).reshape(n_heads, head_dim, d_in)
    if w.dtype not in (np.float32, np.float64):
        w = w.astype(np.float64)
    g = np.asarray(gamma, dtype=np.float64) if gamma is not None else None
    half = head_dim // 2
    halves = len(p0) == half and np.array_equal(p0, np.arange(half)) and np.array_equal(p1, np.arange(half, head_dim))
    sq = np.empty((n_heads, head_dim))           # |row * gamma|^2 for every row
    b = np.empty((n_heads, len(p0)))             # <row_j0 * gamma, row_j1 * gamma> per pair
    buf = np.empty((head_dim, d_in))
    for h in range(n_heads):
        if g is not None:
            rows = np.multiply(w[h], g, out=buf)
        else:
            np.copyto(buf, w[h])
            rows = buf
        sq[h] = np.einsum("ij,ij->i", rows, rows)
        b[h] = (np.einsum("ij,ij->i", rows[:half], rows[half:]) if halves
                else np.einsum("ij,ij->i", rows[p0], rows[p1]))
    a, c = sq[:, p0], sq[:, p1]
    sigma = np.sqrt(np.maximum((a + c) / 2 + np.sqrt(((a - c) / 2) ** 2 + b ** 2), 0.0))
    off = np.zeros((n_heads, len(p0), 2))
    if beta is not None:
        bt = np.asarray(beta, dtype=np.float64)
        wb = np.stack([np.asarray(w[h], dtype=np.float64) @ bt for h in range(n_heads)])   # [H, head_dim]
        off += wb[:, pairs]
    if b_q is not None:
        off += np.asarray(b_q, dtype=np.float64).reshape(n_heads, head_dim)[:, pairs]
    return sigma * math.sqrt(d_in) + np.sqrt((off ** 2).sum(-1))


def contributions(q_hat: np.ndarray, b_pair: np.ndarray, factor: np.ndarray, scale: float, group: int) -> np.ndarray:
    """Per query head and pair, the most removing pair ``j`` of its kv head's bias can move a
    logit (beyond a per-row shift): ``s * |q~_{h,j}| * |b_{g(h),j}| * min(2, w_j L)`` -> ``[H, P]``.

    ``q_hat`` ``[H, P]``, ``b_pair`` ``[G, P]`` (``|b_j|``), ``factor`` ``[P]``, ``group = H / G``.
    """
    kv_of_head = np.arange(q_hat.shape[0]) // group
    return scale * q_hat * b_pair[kv_of_head] * factor[None, :]


def set_bound(contrib: np.ndarray, mask: np.ndarray, group: int) -> np.ndarray:
    """Bound per kv head for removing the pairs in ``mask`` (``[P]`` or ``[G, P]`` bool):
    ``max_{h in g} sum_{j in S_g} contrib[h, j]`` -> ``[G]``."""
    n_heads = contrib.shape[0]
    m = np.asarray(mask, dtype=bool)
    m = np.broadcast_to(m, (n_heads // group, contrib.shape[1])) if m.ndim == 1 else m
    per_head = (contrib * m[np.arange(n_heads) // group]).sum(axis=1)
    return per_head.reshape(-1, group).max(axis=1)


def tv_bound(e: float | None) -> float | None:
    """Total-variation bound ``tanh(E / 4)`` for two softmax rows whose logits differ by a per-row
    shift plus at most ``E`` of spread (log-ratio confined to an interval of width ``E``)."""
    return None if e is None else float(np.tanh(e / 4.0))


# ----------------------------------------------------------------------------------------------
# Model-level geometry (rope, scale, context)
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


# ----------------------------------------------------------------------------------------------
# Over a checkpoint
# ----------------------------------------------------------------------------------------------

def _vec(ck, name: str | None):
    if not name:
        return None
    info = ck.tensors[name]
    if info.missing:
        return None
    return np.asarray(ck.read(name), dtype=np.float64).reshape(-1)


def layer_vectors(ck, layout: ModelLayout, lt: LayerTensors) -> dict:
    """``{"q": b_q, "k": b_k, "v": b_v}`` for one layer (fused biases split by the layout; None
    where absent or unreadable) plus ``"k_tensor"``: the tensor the key bias lives in."""
    out = {"q": None, "k": None, "v": None, "k_tensor": lt.k_bias or (lt.qkv_bias if lt.qkv_bias else None)}
    if lt.qkv_bias:
        vec = _vec(ck, lt.qkv_bias)
        if vec is not None and layout.num_heads and layout.num_kv_heads and layout.head_dim:
            idx = qkv_row_index(layout.fused_layout or "concat", layout.num_heads, layout.num_kv_heads, layout.head_dim)
            out.update(q=vec[idx[0]], k=vec[idx[1]], v=vec[idx[2]])
    for role in ("q", "k", "v"):
        name = getattr(lt, f"{role}_bias")
        if name:
            out[role] = _vec(ck, name)
    if lt.q_bias and layout.q_gate and out["q"] is not None:
        out["q"] = _query_part(layout, out["q"])
    return out


def _query_part(layout: ModelLayout, rows: np.ndarray) -> np.ndarray | None:
    """The query rows of a gated q projection (query + output gate); None while unknown."""
    if layout.q_gate not in GATE_LAYOUTS:
        return None
    return rows[query_row_index(layout.q_gate, layout.num_heads, layout.head_dim)]


def q_weight(ck, layout: ModelLayout, lt: LayerTensors) -> np.ndarray | None:
    """``W_q`` ``[H*head_dim, D]`` (numpy order; GPT-2 Conv1D transposed; fused rows selected)."""
    name = lt.q_weight or lt.qkv_weight
    if not name or ck.tensors[name].missing:
        return None
    w = ck.read(name)
    # BF16 / F16 / F32 widen exactly to float32; q_pair_bound works in float64 one head at a
    # time, so a float64 copy of the whole matrix (~0.1 GB and ~0.06 s per 7B layer) buys nothing
    w = np.asarray(w, dtype=np.float32 if w.dtype in (np.float32, np.float16) else np.float64)
    if layout.conv1d:
        w = w.T
    if not lt.q_weight:
        iq, _, _ = qkv_row_index(layout.fused_layout or "concat", layout.num_heads, layout.num_kv_heads, layout.head_dim)
        w = w[iq]
    elif layout.q_gate:
        w = _query_part(layout, w)
    return w


def _norm_params(ck, layout: ModelLayout, lt: LayerTensors):
    """(gamma, beta, why-not) of the attention-input norm."""
    if layout.norm_placement != "pre" or layout.input_norm not in ("rms", "layer"):
        return None, None, ("no norm feeds the attention projections (post-norm or unknown architecture): "
                            "|q~| has no static bound")
    if not lt.attn_norm:
        return None, None, "the attention-input norm tensor was not found: |q~| has no static bound"
    g = _vec(ck, lt.attn_norm)
    if g is None:
        return None, None, "the attention-input norm tensor is missing from the (truncated) file"
    g = g + layout.norm_weight_offset
    b = None
    if layout.input_norm == "layer" and lt.attn_norm_bias:
        b = _vec(ck, lt.attn_norm_bias)
        if b is None:
            return None, None, "the attention-input norm bias is missing from the (truncated) file"
    return g, b, None


def _nothing_removable(lr: LayerRedundancy) -> bool:
    """A key bias with no exact and no near-redundant part (every dim rotated, no near pair; q/k-norm)."""
    return lr.has_k_bias and not lr.exact_fraction and not lr.near_fraction


@dataclass(frozen=True, eq=False)
class AnalysisReport(LayoutSummary):
    """``ckpt-surgeon analyze``: per-layer (and per kv head) key/value/query-bias verdicts (the
    layout's summary fields inherited from :class:`~ckpt_surgeon.arch.resolve.LayoutSummary`)."""

    source: str
    format: str
    input_norm: str | None
    context: int | None
    context_source: str
    epsilon: float
    attn_scale: float | None
    rope: RopeGeometry | None
    layers: tuple
    notes: tuple = ()
    warnings: tuple = ()
    bytes_read: int = 0
    measured: object | None = None      # measure.MeasuredReport when --measure ran
    per_head: bool = False              # rows(): one row per kv head instead of per layer
    consumers: object | None = None     # consumers.ConsumerReport: every bias, its consumer, removable share
    by_bias: bool = False               # rows(): one row per bias (consumers) instead of per layer
    facts: tuple = ()                   # how each architecture fact was established (registry | derived | probed)
    derivation: dict | None = None      # derived layouts: attention blocks per layer, their groups' classes
    distance_profile: object | None = None   # distance_profile.DistanceProfile with --distance-profile: its rows
    towers: tuple = ()                  # (name, kind, how, layers) per attention stack, the main one first
    tower_shapes: tuple = ()            # per stack of ``towers``: {num_heads, num_kv_heads, head_dim, position_encoding,
    #                                     norm_placement} (the stack's own)
    missing_config: str | None = None   # where config.json was looked for, when an HF source has none

    # -- views ---------------------------------------------------------------------------------
    def layer(self, i: int) -> LayerRedundancy:
        return self.layers[i]

    def class_counts(self) -> dict:
        out: dict = {}
        for lr in self.layers:
            if lr.has_k_bias:
                out[lr.k_class] = out.get(lr.k_class, 0) + 1
        return out

    @property
    def flags(self) -> list[dict]:
        out = [{"layer": lr.layer, "flag": f.split(":", 1)[0], "message": f} for lr in self.layers for f in lr.flags]
        if self.consumers is not None:
            out += [{"layer": None, "flag": f.split(":", 1)[0], "message": f} for f in self.consumers.flags]
        return out

    def to_dict(self) -> dict:
        d = {"source": self.source, "format": self.format, **self.summary_dict(), "norm_placement": self.norm_placement,
             "input_norm": self.input_norm, "qk_norm": self.qk_norm, "context": self.context,
             "context_source": self.context_source, "epsilon": self.epsilon, "attn_scale": _f(self.attn_scale),
             "rope": self.rope.to_dict() if self.rope else None, "class_counts": self.class_counts(),
             "layers": [lr.to_dict() for lr in self.layers], "flags": self.flags,
             "notes": list(self.notes), "warnings": list(self.warnings), "bytes_read": self.bytes_read,
             "measured": self.measured.to_dict() if self.measured is not None else None,
             "bias_consumers": self.consumers.to_dict() if self.consumers is not None else None,
             "facts": list(self.facts), "derivation": self.derivation, "missing_config": self.missing_config,
             "towers": [{"name": n, "kind": k, "how": how, "num_layers": len(ls),
                         **(self.tower_shapes[i] if i < len(self.tower_shapes) else {}),
                         "class_counts": _counts(ls), "layers": [lr.to_dict() for lr in ls]}
                        for i, (n, k, how, ls) in enumerate(self.towers)]}
        if self.distance_profile is not None:
            d["distance_profile"] = self.distance_profile.to_dict()
        return d

    def rows(self) -> list[dict]:
        """Flat rows for table/csv/markdown/``to_frame``: per layer, or per kv head with ``per_head``,
        or per bias (consumer and removable share) with ``by_bias``."""
        if self.by_bias and self.consumers is not None:
            return self.consumers.rows()
        if self.distance_profile is not None:
            from dataclasses import replace
            return replace(self.distance_profile, per_head=self.per_head).rows()
        mrows = {r["layer"]: r for r in self.measured.rows()} if self.measured is not None else {}
        if len(self.towers) > 1 and not self.per_head:   # a tower column: the main stack's rows first
            out = []
            for i, (n, _, _, ls) in enumerate(self.towers):
                out += [{"tower": n, **r} for r in self._rows(ls, mrows if i == 0 else {})]
            return out
        return self._rows(self.layers, mrows)

    def _rows(self, layers, mrows) -> list[dict]:
        rows = []
        for lr in layers:
            if self.per_head and lr.heads:
                for h in lr.heads:
                    rows.append({"layer": lr.layer, "kv_head": h.kv_head, "class": lr.k_class,
                                 "k_l2": h.k_bias_l2, "exact": h.exact_fraction, "near": h.near_fraction,
                                 "rest": h.rest_fraction, "bound": h.bound, "bound_all": h.bound_all})
                    if _nothing_removable(lr):
                        rows[-1].update(exact=None, near=None, bound=None)
                continue
            n_pairs = 0 if lr.pairs is None else lr.pairs.shape[0]
            # Short column names (the table must fit a terminal); JSON keeps the long ones.
            row = {"layer": lr.layer, "class": lr.k_class if lr.has_k_bias else "no k bias",
                   "k_l2": lr.k_bias_l2, "exact": lr.exact_fraction, "near": lr.near_fraction,
                   "rest": lr.rest_fraction, "near_pairs": f"{len(lr.near_pairs)}/{n_pairs}" if n_pairs else None,
                   "bound": lr.bound, "bound_all": lr.bound_all,
                   "q_l2": lr.q_bias.l2 if lr.q_bias else None,
                   "v_fold": (None if lr.v_bias is None else lr.v_bias.foldable),
                   "flags": ", ".join(sorted({f.split(":", 1)[0] for f in lr.flags})) or None}
            if _nothing_removable(lr):
                # as inspect: "-", not "0 / 0 / 0", which reads as "removing it is free" (to_dict keeps them)
                row.update(exact=None, near=None, bound=None)
            for k, v in mrows.get(lr.layer, {}).items():
                if k != "layer":
                    row[k] = v
            rows.append(row)
        return rows

    def csv_rows(self) -> list[dict]:
        """CSV rows: :meth:`rows`, or the distance profile in long form (one row per layer, head,
        term and distance) when it was computed."""
        return self.distance_profile.long_rows() if self.distance_profile is not None else self.rows()

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())

    def summary_items(self) -> list[tuple[str, str]]:
        pe = self.position
        pos = pe.describe(self.head_dim)
        if pe.type == "rope":
            if self.rope and self.rope.rope_type != "default":
                pos += f", scaling {self.rope.rope_type} (attention factor {self.rope.attention_factor:g})"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.class_counts().items())) or "no layer has a key bias"
        bounds = [lr.bound for lr in self.layers if lr.bound is not None and lr.has_k_bias
                  and not _nothing_removable(lr)]
        vb = [lr.v_bias for lr in self.layers if lr.v_bias is not None]
        items = [
            ("source", f"{self.source} ({self.format})"),
            ("architecture", heads_cell(self.missing_config) or self.architecture + (
                f" [registry: {self.family}]" if self.family else
                " [derived from transformers, probed]" if self.derivation else " [not in registry]")),
            ("heads / kv heads / head_dim", heads_cell(self.missing_config) or
             f"{self.num_heads} / {self.num_kv_heads} / {self.head_dim}"),
            ("position encoding", pos),
            ("norm placement / input norm", f"{self.norm_placement or 'unknown'} / {self.input_norm or ('none' if self.norm_placement == 'post' else 'unknown')}"),
            ("attention scale", f"{self.attn_scale:.6g}" if self.attn_scale is not None and math.isfinite(self.attn_scale) else "-"),
            ("context L", f"{self.context} ({self.context_source})" if self.context else f"unknown ({self.context_source})"),
            ("epsilon (rad)", f"{self.epsilon:g}: near-redundant pairs turn less than this over L"),
            ("key-bias classes", counts),
            ("max bound (exact + near removed)", f"{max(bounds):.4g} logit" if bounds else
             "- (no layer has a removable part)" if any(lr.has_k_bias for lr in self.layers) else "-"),
            ("value bias", ("foldable into the output bias in every layer" if vb and all(v.foldable for v in vb) else
                            vb[0].reason if vb else "none")),
        ]
        for i, (n, k, _, ls) in enumerate(self.towers[1:], 1):
            sh = self.tower_shapes[i] if i < len(self.tower_shapes) else {}
            shape = (f"heads {sh['num_heads']} / {sh['num_kv_heads']} / {sh['head_dim']}, position "
                     f"{sh['position_encoding']['type']}, {sh['norm_placement'] or 'unknown'}-norm, " if sh else "")
            items.append((f"tower {n}", f"{k}: {len(ls)} block(s), {shape}key-bias classes "
                                        + (", ".join(f"{c} {v}" for c, v in sorted(_counts(ls).items()))
                                           or "no block has a key bias")))
        if self.consumers is not None:
            items += self.consumers.summary_items()
        if self.measured is not None:
            items += self.measured.summary_items()
        if self.distance_profile is not None:
            items += self.distance_profile.summary_items()
        items.append(("bytes read", f"{self.bytes_read:,}"))
        return items


def _counts(layers) -> dict:
    out: dict = {}
    for lr in layers:
        if lr.has_k_bias:
            out[lr.k_class] = out.get(lr.k_class, 0) + 1
    return out


def _tower_layers(ck, lay: ModelLayout, context, epsilon, warnings: list, name: str) -> tuple:
    """A tower's per-block verdicts: the classes its derivation established; no bounds (a tower's rotary
    geometry, 2-D or windowed, is not read), so W_q is not read either."""
    out = []
    for lt in lay.layers:
        vecs = layer_vectors(ck, lay, lt)
        if vecs["k_tensor"] and vecs["k"] is None:
            warnings.append(f"tower {name} block {lt.layer}: key bias {vecs['k_tensor']} could not be read "
                            "(truncated file or unknown heads)")
        cls, _ = classify(lay, lt)
        note = ("a tower's rotary geometry (2-D / windowed) is not read: no bound" if cls in ("partial", "rope")
                else None)
        out.append(analyze_layer(lay, lt, b_k=vecs["k"], b_q=vecs["q"], b_v=vecs["v"], w_q=None, gamma=None,
                                 beta=None, rope=None, scale=float("nan"), context=context, epsilon=epsilon, sinks=False,
                                 weights_note=note, k_tensor=vecs["k_tensor"]))
    return tuple(out)


def _context(layout: ModelLayout, context: int | None) -> tuple[int | None, str]:
    if context is not None:
        if int(context) < 1:
            raise CkptError(f"--context must be a positive number of positions (got {context})")
        return int(context), "--context"
    if layout.max_positions:
        return int(layout.max_positions), "config max positions"
    return None, "config has no max positions: pass --context L (bounds assume any distance)"


def analyze_checkpoint(ck, *, context: int | None = None, epsilon: float = DEFAULT_EPSILON,
                       weights: bool = True, layout: ModelLayout | None = None,
                       consumers: bool = True) -> AnalysisReport:
    """Static analysis of every layer.  ``weights=False`` reads bias vectors only (inspect);
    ``consumers=False`` skips the per-bias consumer table (:mod:`.consumers`)."""
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise CkptError(f"--epsilon must be a finite angle >= 0 in radians (got {epsilon})")
    layout = layout or ck.layout()
    L, L_src = _context(layout, context)
    rope = rope_geometry(layout, ck.config)
    scale = attention_scale(layout, ck.config)
    sinks = sink_layers(ck.tensors)
    warnings = list(getattr(ck, "warnings", ()))
    from ..arch.model_layout import unplaced_warning, unreported
    if unplaced_warning(unreported(layout)):
        warnings.append(unplaced_warning(unreported(layout)))
    notes = list(layout.notes)
    missing_config = getattr(ck, "missing_config", None)
    if missing_config:
        # say what is missing, not "unknown architecture" (the registry is not the problem)
        warnings.insert(0, ck.missing_config_warning())
        notes = [n for n in notes if "is not in the registry" not in n]
    if layout.norm_placement == "post":
        notes = [n for n in notes if not n.startswith("post-norm:")]   # the registry's shorter line says the same
        notes.append("post-norm: the claim that LayerNorm's beta makes the q/k/v biases redundant is not an identity "
                     "(beta passes through W_q / W_k and differs from b_q / b_k); this report does not treat it as one")
    if rope and rope.note:
        notes.append(rope.note)
    if L is None and rope is not None:      # a context only matters to the bounds of rotated pairs
        notes.append(L_src)
    q = getattr(ck, "quantization", None)
    if q is not None:
        notes.append(f"quantized checkpoint ({q.method}, {'/'.join(str(b) for b in q.bits)}-bit): bounds use the "
                     "dequantized weights, i.e. they are the quantized model's")
    layers = []
    qkv_vectors = {}
    for lt in layout.layers:
        vecs = layer_vectors(ck, layout, lt)
        qkv_vectors[lt.layer] = vecs
        if vecs["k_tensor"] and vecs["k"] is None:
            warnings.append(f"layer {lt.layer}: key bias {vecs['k_tensor']} could not be read (truncated file or unknown heads)")
        cls, _ = classify(layout, lt, sinks=lt.layer in sinks)
        w_q = gamma = beta = None
        wnote = None
        if vecs["k"] is not None and cls in ("partial", "rope"):
            if not weights:
                wnote = "needs W_q (reads the query weights): run `ckpt-surgeon analyze`"
            else:
                gamma, beta, wnote = _norm_params(ck, layout, lt)
                if wnote is None:
                    w_q = q_weight(ck, layout, lt)
                    if w_q is None:
                        wnote = "W_q is missing or unreadable: no bound"
        layers.append(analyze_layer(layout, lt, b_k=vecs["k"], b_q=vecs["q"], b_v=vecs["v"], w_q=w_q, gamma=gamma,
                                    beta=beta, rope=rope, scale=scale, context=L, epsilon=epsilon,
                                    sinks=lt.layer in sinks, weights_note=wnote, k_tensor=vecs["k_tensor"]))
    towers = [(n, k, how, _tower_layers(ck, lay, L, epsilon, warnings, n)) for n, k, lay, how in layout.stacks()[1:]]
    towers = [(layout.stacks()[0][0], layout.stacks()[0][1], layout.stacks()[0][3], tuple(layers))] + towers
    cons = None
    if consumers:
        from .consumers import bias_consumers
        cons = bias_consumers(ck, layout, key_layers=layers, qkv_vectors=qkv_vectors)
    return AnalysisReport(
        **layout.summary(), source=ck.source, format=ck.format, input_norm=layout.input_norm, context=L, context_source=L_src, epsilon=float(epsilon), attn_scale=scale, rope=rope, layers=tuple(layers),
        notes=tuple(notes), warnings=tuple(warnings), bytes_read=ck.bytes_read, consumers=cons,
        facts=tuple(layout.facts()), derivation=layout.derivation(), towers=tuple(towers),
        tower_shapes=tuple({"num_heads": lay.num_heads, "num_kv_heads": lay.num_kv_heads, "head_dim": lay.head_dim,
                            "position_encoding": lay.position.to_dict(), "norm_placement": lay.norm_placement}
                           for _, _, lay, _ in layout.stacks()),
        missing_config=missing_config)


def inspect_summary(layout: ModelLayout, config: dict | None, lt: LayerTensors, b_k: np.ndarray | None, *,
                    sinks: bool = False, context: int | None = None, epsilon: float = DEFAULT_EPSILON) -> dict | None:
    """The ``k_bias_redundancy`` object for ``inspect`` (bias vector only, no weights read).

    The bound is 0 where removing exact + near parts needs none (no near pairs); otherwise it is
    null with a note: computing it needs ``W_q`` (the query weights, ~hidden^2 values per layer,
    ~0.7 GB for a 7B bf16 model), which ``inspect`` does not read; ``analyze`` does.
    """
    if b_k is None:
        return None
    L, _ = _context(layout, context)
    lr = analyze_layer(layout, lt, b_k=b_k, rope=rope_geometry(layout, config), scale=attention_scale(layout, config),
                       context=L, epsilon=epsilon, sinks=sinks, k_tensor=lt.k_bias or lt.qkv_bias,
                       weights_note="needs W_q (the query weights); run `ckpt-surgeon analyze` for the bound")
    return lr.redundancy_dict()


def analyze(source, context: int | None = None, epsilon: float = DEFAULT_EPSILON, **open_kwargs) -> AnalysisReport:
    """Static analysis of ``source`` (folder, .safetensors, .gguf, Hub repo id or an open
    Checkpoint): :func:`analyze_checkpoint` on it, opened with ``open_kwargs``.  With measured
    mode too: :func:`ckpt_surgeon.analysis.api.analyze` (``ckpt_surgeon.analyze``)."""
    from ..checkpoint import Checkpoint, open_checkpoint
    if isinstance(source, Checkpoint):
        source.refuse_truncated()
        return analyze_checkpoint(source, context=context, epsilon=epsilon)
    with open_checkpoint(source, **open_kwargs) as ck:
        ck.refuse_truncated()        # as every command but inspect (which shows the structure)
        return analyze_checkpoint(ck, context=context, epsilon=epsilon)
