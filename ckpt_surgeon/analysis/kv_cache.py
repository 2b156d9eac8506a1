"""``analyze --kv-cache``: what a quantized KV cache does to each layer, predicted from the weights.

The mechanism (llama.cpp's ``--cache-type-k/-v``): the cache holds K after RoPE and V in blocks of 32
along the head dimension (ggml ``quantize_row_*_ref``); a block's step follows from its largest
|value| (q8_0, q4_0, q5_0, iq4_nl) or its range (q4_1, q5_1).  After RoPE a key is
``R_n (W_k x_n + b_k)``: a bias that dominates a few dimensions sets the step of every block it sits
in, and the content falls below one step.  Q is quantized too, to the K type's ``vec_dot_type``
(ggml-cpu ``type_traits_cpu``: q8_0 for q4_0/q5_0/iq4_nl/q8_0, q8_1 for q4_1/q5_1), in the same
blocks.  vLLM's fp8 e4m3 cache has one scale per tensor (``amax / 448``); Q stays unquantized.

The model (documented in docs/architecture.md, numpy only, no torch; every number comes from weights and
biases):

* content: the attention input is modelled as unit variance per feature after the pre-attention
  norm (RMSNorm / LayerNorm output), scaled by the norm's weight ``gamma``: the content of output row
  i of a projection has variance ``sigma_i^2 = sum_j W_ij^2 gamma_j^2`` and mean ``b_i`` (plus
  ``W beta`` for a LayerNorm bias).  A q/k-norm after the projection divides each head by its
  modelled RMS and multiplies by its weight.  Post-norm models (no norm before attention): unit
  variance, noted.
* RoPE: the mean of rotary pair (a, b) turns by ``n theta_j``; at sampled positions n the rotated
  mean and variance of each dimension are computed exactly in the file's own pair layout.
* a block's largest |value| is modelled as ``max_i |m_i| + z sigma_i`` (z = 2.0: the expected
  largest of 32 standard normals is 2.04); its step is that over the type's largest level, and the
  rounding error per element is uniform, ``step^2 / 12``, but over the keys it varies no more than the
  value does (the error is a sawtooth of the value): ``min(step^2 / 12, var_n(x_i))``, where
  ``var_n`` is the content variance plus the spread of the rotated bias over the sampled positions.
* logit error (attention-logit units, after the ``1/sqrt(d)`` scale), counted as softmax sees it:
  by how it varies over the keys of one query (a shift common to a row changes nothing).  The K error
  seen through q, ``sum_i E[q_i^2] var_n(e_k,i) / d``, plus Q's own quantization seen through k,
  ``sum_i var(e_q,i) var_n(k_i) / d``; RMS over the query heads of the kv group.
* value error reaching the output: ``sum_i |W_o[:, i]|^2 var(e_v,i)`` for the attention row that
  puts all its weight on one key (attention rows sum to 1, so spreading weight over keys with
  independent errors only lowers it: an upper model), RMS over the query heads of the group.

At risk: a layer whose predicted error is more than :data:`RISK_RATIO` times the model's median
layer for that cache type, or (K) at least :data:`RISK_LOGIT` logit units.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import CkptError, UnsupportedError
from ..records import finite_or_none
from . import kv_rot as R

RISK_RATIO = 4.0          # x the median layer's predicted error, per cache type
RISK_LOGIT = 0.5          # attention-logit units: e^0.5 = 1.65x on an attention weight
Z_BLOCK_MAX = 2.0         # expected largest of 32 standard normals (2.04)
POSITIONS = 32            # positions sampled over the context for the rotated bias
DEFAULT_CONTEXT = 4096
# W_q / W_o larger than this are sampled by the static report (kv_layer_stats, o_column_weight)
FULL_READ_ELEMENTS = 4 * 1024 * 1024   # per tensor
O_SAMPLE_ROWS = 256        # rows of a large W_o read for its column norms (static report only)


@dataclass(frozen=True)
class CacheType:
    """One cache type: how a block's step follows from its values (ggml ``quantize_row_*_ref``)."""

    name: str
    block: int | None              # values per block (None: one scale per tensor)
    type_size: int | None          # bytes per block (gguf-py GGML_QUANT_SIZES)
    rule: str                      # absmax | range | fp8
    levels: float                  # absmax: step = amax / levels; range: step = (max - min) / levels
    dot_type: str | None           # what Q is quantized to for the dot product (None: Q not quantized)
    source: str

    def to_dict(self) -> dict:
        return {"name": self.name, "block": self.block, "type_size": self.type_size, "rule": self.rule,
                "levels": self.levels, "dot_type": self.dot_type, "source": self.source}


# iq4_nl's 16 non-uniform levels (ggml-common.h kvalues_iq4nl); the scale is amax / 127 and the
# levels around zero are 11.5 units apart (-10, 1, 13): small values see a step of amax * 11.5 / 127
_IQ4NL_CENTER_SPACING = (13 - (-10)) / 2


def _sizes(name: str) -> tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    return GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]


def _types() -> dict[str, CacheType]:
    # (name, rule, levels, dot type, the ggml reference it mirrors)
    rows = [("q8_0", "absmax", 127.0, "q8_0", "quantize_row_q8_0_ref: d = amax / 127, round"),
            ("q4_0", "absmax", 8.0, "q8_0", "quantize_row_q4_0_ref: d = max / -8, x/d + 8.5 truncated"),
            ("q4_1", "range", 15.0, "q8_1", "quantize_row_q4_1_ref: d = (max - min) / 15, round"),
            ("iq4_nl", "absmax", 127.0 / _IQ4NL_CENTER_SPACING, "q8_0",
             "quantize_row_iq4_nl_ref: d = amax / 127 on kvalues_iq4nl, 11.5 apart near zero"),
            ("q5_0", "absmax", 16.0, "q8_0", "quantize_row_q5_0_ref: d = max / -16"),
            ("q5_1", "range", 31.0, "q8_1", "quantize_row_q5_1_ref: d = (max - min) / 31"),
            ("q8_1", "absmax", 127.0, "q8_1", "quantize_row_q8_1_ref: d = amax / 127 (Q's dot type)")]
    out = {}
    for name, rule, levels, dot, src in rows:
        block, size = _sizes(name)
        out[name] = CacheType(name, block, size, rule, levels, dot, src)
    out["fp8_e4m3"] = CacheType("fp8_e4m3", None, 1, "fp8", 448.0, None,
                                "vLLM fp8 e4m3 KV cache: per-tensor scale amax / 448, 3 mantissa bits; Q not quantized")
    return out


CACHE_TYPES: dict[str, CacheType] = _types()
KV_TYPES = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "fp8_e4m3")   # q8_1 is only a dot type
_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3"}


def parse_cache_types(spec, *, path=None) -> tuple[str, ...]:
    """``"q4_0,q8_0"`` (or a list) -> known names; an unknown one is one line listing the known ones."""
    items = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec) if s and s.strip()]
    out = []
    for s in items:
        s = _ALIASES.get(s, s)
        if s not in KV_TYPES:
            raise CkptError(f"unknown KV-cache type {s!r}; known: {', '.join(KV_TYPES)} (fp8 = fp8_e4m3)", path=path)
        if s not in out:
            out.append(s)
    if not out:
        raise CkptError(f"no KV-cache type given; known: {', '.join(KV_TYPES)}", path=path)
    return tuple(out)


# ----------------------------------------------------------------------------- the error model

def block_error_var(mean: np.ndarray, var: np.ndarray, ct: CacheType, *, z: float = Z_BLOCK_MAX,
                    tensor_amax: float | None = None, key_var: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-element rounding-error variance and the bias's share of the step, for rows ``[..., n]``.

    ``mean``/``var`` ``[..., n]``: the modelled mean and variance of each element of a cache row (``n``
    a multiple of the block); blocks are consecutive ``ct.block`` elements.  Share: ``(step - step
    without the mean) / step`` of each element's block.  fp8: relative model (3 mantissa bits, the
    mean squared step of a binade is ``2^-7 x^2``) with the subnormal floor ``2^-9 scale`` of the
    per-tensor scale ``tensor_amax / 448``.  ``key_var`` (same shape): how much each element varies over
    the keys; the error's variance over the keys is capped by it (see the body).
    """
    sd = np.sqrt(np.maximum(var, 0.0))
    if ct.rule == "fp8":
        scale = (tensor_amax if tensor_amax is not None else float(np.max(np.abs(mean) + z * sd))) / 448.0
        ev = np.maximum((mean ** 2 + var) * 2.0 ** -7, (2.0 ** -9 * scale) ** 2) / 12.0
        share = np.where(mean ** 2 + var > 0, mean ** 2 / np.maximum(mean ** 2 + var, 1e-300), 0.0)
        return (ev if key_var is None else np.minimum(ev, key_var)), share
    b = ct.block
    shape = mean.shape
    m = mean.reshape(shape[:-1] + (shape[-1] // b, b))
    s = sd.reshape(m.shape)
    hi, lo = (m + z * s).max(-1), (m - z * s).min(-1)
    c_hi = (z * s).max(-1)
    if ct.rule == "range":
        span, span_c = hi - lo, 2 * c_hi
    else:
        span, span_c = np.maximum(np.abs(hi), np.abs(lo)), c_hi
    step = span / ct.levels
    share = np.where(span > 0, (span - np.minimum(span_c, span)) / np.where(span > 0, span, 1.0), 0.0)
    ev = np.repeat((step ** 2 / 12.0)[..., None], b, axis=-1)
    if ct.name in _SHORT_FAR_SIDE:
        ev = ev + _far_side_clip(m, hi, lo, step, ct.levels)
    ev = ev.reshape(shape)
    if key_var is not None:
        ev = np.minimum(ev, _grid_cap(m, s, key_var.reshape(m.shape), span, z).reshape(shape))
    return ev, np.repeat(share[..., None], b, axis=-1).reshape(shape)


# q4_0 / q5_0 map the block's signed largest value to level -L (d = max / -L) and stop at L - 1 on the other
# side: a value of the opposite sign beyond (L - 1) / L of the largest is clipped (a rotated bias puts many there)
_SHORT_FAR_SIDE = ("q4_0", "q5_0")


def _far_side_clip(m: np.ndarray, hi: np.ndarray, lo: np.ndarray, step: np.ndarray, levels: float) -> np.ndarray:
    """``[..., blocks, b]``: squared clipping error of the elements whose mean lies past the last level on the
    side opposite the block's largest |value| (``quantize_row_q4_0_ref``: ``min(15, x/d + 8.5)``)."""
    top_pos = (np.abs(hi) >= np.abs(lo))[..., None]            # the largest |value| is positive
    far = np.where(top_pos, -m, m)                             # how far each mean goes to the other side
    limit = ((levels - 1) * step)[..., None]
    return np.maximum(far - limit, 0.0) ** 2


def _grid_cap(m: np.ndarray, s: np.ndarray, key_var: np.ndarray, span: np.ndarray, z: float) -> np.ndarray:
    """``[..., blocks, b]``: how much an element's rounding error can vary over the keys.

    The error is a sawtooth of the value in grid units ``x / step``; over the keys that moves by the
    value's own variation and by the grid's (the step follows the block's largest |value|, token by
    token): ``var(x) + x^2 var(span) / span^2``.  A constant value (an unrotated bias) on a steady grid
    keeps a constant error, which softmax ignores; content far below one step varies like itself.  The
    span moves with the elements that can be a token's largest |value| (those whose peak reaches the top
    element's low edge): as that element when one or two stand clear (biases), and by about half the
    content spread when many compete (the largest of several normals varies about half as much).
    """
    peak = np.abs(m) + z * s
    top = peak.argmax(-1)[..., None]
    top_low = np.abs(np.take_along_axis(m, top, -1)) - z * np.take_along_axis(s, top, -1)
    cand = peak >= top_low                     # the elements that can be a token's largest |value|
    n_cand = cand.sum(-1)
    sd_span = np.where(cand, np.sqrt(key_var), 0.0).max(-1) * np.where(n_cand > 2, 0.5, 1.0)
    rel = (sd_span / np.where(span > 0, span, 1.0)) ** 2
    return key_var + (m ** 2 + s ** 2) * rel[..., None]


@dataclass(frozen=True, eq=False)
class KvGeometry:
    """Rotary pairs in the file's own dims, the cache order and the sampled positions' angles."""

    head_dim: int
    pairs: np.ndarray              # [P, 2] dims within a head (file order)
    angles: np.ndarray             # [positions, P] n * theta_j
    cache_order: np.ndarray        # [head_dim]: cache position p holds file dim cache_order[p]
    pair_layout: str
    attn_rot: bool = True          # model llama.cpp's Hadamard rotation where it applies it (.kv_rot)

    def groups(self) -> list[np.ndarray]:
        """Dims that must share one scale: each rotary pair, and each pass-through dim on its own."""
        seen = set(int(x) for x in self.pairs.reshape(-1))
        return [np.asarray(p) for p in self.pairs] + [np.array([i]) for i in range(self.head_dim) if i not in seen]


def rotate(mean: np.ndarray, var: np.ndarray, geom: KvGeometry) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance ``[..., d]`` at every sampled position -> ``[positions, ..., d]``.

    rotate_half convention (modeling_llama ``apply_rotary_pos_emb``): ``x_a' = x_a cos - x_b sin``,
    ``x_b' = x_b cos + x_a sin`` for pair (a, b); the variance of independent a, b rotates with the
    squares.  Pass-through dims are unchanged.
    """
    n = geom.angles.shape[0]
    m = np.broadcast_to(mean, (n,) + mean.shape).copy()
    v = np.broadcast_to(var, (n,) + var.shape).copy()
    if geom.pairs.size:
        a, b = geom.pairs[:, 0], geom.pairs[:, 1]
        extra = (None,) * (mean.ndim - 1)
        c = np.cos(geom.angles)[(slice(None),) + extra]
        s = np.sin(geom.angles)[(slice(None),) + extra]
        ma, mb, va, vb = mean[..., a], mean[..., b], var[..., a], var[..., b]
        m[..., a], m[..., b] = ma * c - mb * s, mb * c + ma * s
        v[..., a], v[..., b] = va * c ** 2 + vb * s ** 2, vb * c ** 2 + va * s ** 2
    return m, v


@dataclass(frozen=True, eq=False)
class KvLayerStats:
    """The modelled moments of one layer's q, k, v as they enter RoPE and the cache (file dims)."""

    layer: int
    q_mean: np.ndarray             # [h, d]
    q_var: np.ndarray              # [h, d]
    k_mean: np.ndarray             # [kv, d]
    k_var: np.ndarray              # [kv, d]
    v_mean: np.ndarray | None      # [kv, d]
    v_var: np.ndarray | None
    o_weight: np.ndarray | None    # [h, d]: |W_o[:, column]|^2 of each query head's value dims
    q_sampled: bool = False        # W_q rows of one query head per kv group were read (large models)

    def scaled(self, alpha: np.ndarray | None = None, m: np.ndarray | None = None) -> "KvLayerStats":
        """The stats after the exact transform: q pairs x alpha, k pairs / alpha (``alpha [kv, d]``);
        v dims x m, W_o columns / m (``m [kv, d]``)."""
        g = self.q_mean.shape[0] // self.k_mean.shape[0]
        qm, qv, km, kv = self.q_mean, self.q_var, self.k_mean, self.k_var
        if alpha is not None:
            aq = np.repeat(alpha, g, axis=0)
            qm, qv, km, kv = qm * aq, qv * aq ** 2, km / alpha, kv / alpha ** 2
        vm, vv, ow = self.v_mean, self.v_var, self.o_weight
        if m is not None and vm is not None:
            vm, vv = vm * m, vv * m ** 2
            ow = ow / np.repeat(m, g, axis=0) ** 2 if ow is not None else None
        return KvLayerStats(self.layer, qm, qv, km, kv, vm, vv, ow, self.q_sampled)

    def turned(self, phi: np.ndarray, pairs: np.ndarray) -> "KvLayerStats":
        """The stats after turning rotary pair j of every q head in kv group g and of its k head by
        ``phi [kv, P]`` (exact: 2-D rotations commute with RoPE's); variances of a pair's two dims mixed as
        independent (as :func:`rotate` does)."""
        g = self.q_mean.shape[0] // self.k_mean.shape[0]
        km, kv = _turn(self.k_mean, self.k_var, phi, pairs)
        qm, qv = _turn(self.q_mean, self.q_var, np.repeat(phi, g, axis=0), pairs)
        return KvLayerStats(self.layer, qm, qv, km, kv, self.v_mean, self.v_var, self.o_weight, self.q_sampled)


def _turn(mean: np.ndarray, var: np.ndarray, phi: np.ndarray, pairs: np.ndarray):
    """``mean``/``var [..., heads, d]`` with pair j of head i turned by ``phi [heads, P]``."""
    a, b = pairs[:, 0], pairs[:, 1]
    c, s = np.cos(phi), np.sin(phi)
    m, v = mean.copy(), var.copy()
    m[..., a], m[..., b] = c * mean[..., a] - s * mean[..., b], s * mean[..., a] + c * mean[..., b]
    v[..., a], v[..., b] = c ** 2 * var[..., a] + s ** 2 * var[..., b], s ** 2 * var[..., a] + c ** 2 * var[..., b]
    return m, v


def transform_rotated(rot: tuple, alpha: np.ndarray | None = None, phi: np.ndarray | None = None,
                      pairs: np.ndarray | None = None) -> tuple:
    """``(rotate(k), rotate(q))`` of a layer (see :func:`k_errors`) after the exact q/k transform: pairs x alpha
    on q, / alpha on k (``alpha [kv, d]``), then pair j turned by ``phi [kv, P]``.  Scales and turns commute
    with RoPE, so the sampled positions need not be rotated again (the search's fast path)."""
    (km, kvar), (qm, qvar) = rot
    g = qm.shape[-2] // km.shape[-2]
    if alpha is not None:
        aq = np.repeat(alpha, g, axis=0)
        km, kvar, qm, qvar = km / alpha, kvar / alpha ** 2, qm * aq, qvar * aq ** 2
    if phi is not None:
        km, kvar = _turn(km, kvar, phi, pairs)
        qm, qvar = _turn(qm, qvar, np.repeat(phi, g, axis=0), pairs)
    return (km, kvar), (qm, qvar)


def k_errors(st: KvLayerStats, geom: KvGeometry, ct: CacheType, rotated: tuple | None = None) -> dict[str, np.ndarray]:
    """Per kv head: predicted logit error (RMS over its query heads), its K and Q parts, bias share.
    ``rotated``: ``(rotate(k), rotate(q))`` when the caller already has them (several types, one layer).
    Everything is computed in the cache's dims: the file dims in cache order, multiplied by llama.cpp's
    Hadamard chunks where it rotates Q and K (:mod:`.kv_rot`; the logits are unchanged, the blocks are not)."""
    h, d = st.q_mean.shape
    kv = st.k_mean.shape[0]
    g = h // kv
    n = R.rot_size(d, ct.name, "k", geom.attn_rot)
    (km, kvar), (qm, qvar) = rotated or (rotate(st.k_mean, st.k_var, geom), rotate(st.q_mean, st.q_var, geom))
    order = geom.cache_order
    km, kvar = R.rotate_rows(km[..., order], n), R.chunk_mean(kvar[..., order], n)     # [P, kv, d]
    qm, qvar = R.rotate_rows(qm[..., order], n), R.chunk_mean(qvar[..., order], n)     # [P, h, d]
    p = km.shape[0]
    amax = float(np.max(np.abs(km) + Z_BLOCK_MAX * np.sqrt(kvar))) if ct.rule == "fp8" else None
    # softmax ignores what is constant over the keys: every error is counted by how it varies over them
    k_key = kvar + (km - km.mean(0)) ** 2                   # [P, kv, d]
    ek, share = block_error_var(km.reshape(p, -1), kvar.reshape(p, -1), ct, tensor_amax=amax,
                                key_var=k_key.reshape(p, -1))
    ek, share = ek.reshape(p, kv, d).mean(0), share.reshape(p, kv, d).mean(0)     # [kv, d]
    q2 = (qm ** 2 + qvar).mean(0)                          # [h, d]
    k2 = k_key.mean(0)                                     # variance of each key dim over the keys
    var_k = (q2 * np.repeat(ek, g, axis=0)).sum(-1) / d    # [h]
    if ct.dot_type is not None:
        dot = CACHE_TYPES[ct.dot_type]
        eq, _ = block_error_var(qm.reshape(p, -1), qvar.reshape(p, -1), dot)
        eq = eq.reshape(p, h, d).mean(0)
        var_q = (eq * np.repeat(k2, g, axis=0)).sum(-1) / d
    else:
        var_q = np.zeros(h)
    grp = lambda x: np.sqrt(x.reshape(kv, g).mean(1))      # noqa: E731 - RMS over the group's query heads
    return {"error": grp(var_k + var_q), "error_k": grp(var_k), "error_q": grp(var_q), "share": share.mean(-1)}


def v_errors(st: KvLayerStats, order: np.ndarray, ct: CacheType, attn_rot: bool = False) -> dict[str, np.ndarray] | None:
    """Per kv head: predicted value error reaching the output (all weight on one key) and bias share.
    ``attn_rot``: where llama.cpp rotates V by its 64 x 64 Hadamard (:mod:`.kv_rot`), the blocks see the
    rotated values and the output is rotated back, which mixes each chunk's rounding errors evenly."""
    if st.v_mean is None:
        return None
    kv, d = st.v_mean.shape
    g = st.q_mean.shape[0] // kv
    n = R.rot_size(d, ct.name, "v", attn_rot)
    vm, vv = R.rotate_rows(st.v_mean[..., order], n), R.chunk_mean(st.v_var[..., order], n)
    amax = float(np.max(np.abs(vm) + Z_BLOCK_MAX * np.sqrt(vv))) if ct.rule == "fp8" else None
    # values: a constant error passes through attention whole (rows sum to 1), so the cap is the value's
    # whole second moment (a value far below one step of a symmetric type rounds to zero)
    cap = (vm ** 2 + vv).reshape(-1) if ct.rule == "absmax" else None
    ev, share = block_error_var(vm.reshape(-1), vv.reshape(-1), ct, tensor_amax=amax, key_var=cap)
    ev = R.chunk_mean(ev.reshape(kv, d), n)                   # rotated back: each chunk's errors mixed evenly
    inv = np.empty_like(order)
    inv[order] = np.arange(d)
    ev, share = ev[..., inv], share.reshape(kv, d)[..., inv]
    ow = st.o_weight if st.o_weight is not None else np.ones((kv * g, d))
    per_q = (ow * np.repeat(ev, g, axis=0)).sum(-1)
    return {"error": np.sqrt(per_q.reshape(kv, g).mean(1)), "share": share.mean(-1)}


# ----------------------------------------------------------------------------- reading a layer

def check_pairable(ckpt, layout) -> None:
    """Refuse, in one line, a model whose cache the per-head model and the exact transform cannot touch:
    MLA's latent cache, a layout whose q and k heads do not pair up, a derived architecture."""
    src = ckpt.source
    names = " ".join(ckpt.tensors)
    if ("kv_a_proj" in names or "attn_kv_a_mqa" in names) and not any(lt.k_weight or lt.qkv_weight for lt in layout.layers):
        raise UnsupportedError("multi-head latent attention (MLA): the cache holds the compressed latent c_kv and a "
                               "shared rotary key, not per-head keys, so per-head block steps and the q/k pair "
                               "scaling do not apply; `analyze` without --kv-cache still reports the bias classes",
                               path=src)
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    if not (h and kv and d) or h % kv:
        raise UnsupportedError(f"the q and k heads do not pair up (heads {h}, kv heads {kv}, head_dim {d}): the "
                               "per-kv-head cache model needs n_heads to be a multiple of n_kv_heads; `analyze` "
                               "without --kv-cache still reports the bias classes", path=src)
    if layout.derived is not None or layout.position.pair_layout not in (None, "rotate_half", "interleaved") \
            or layout.position.axes != 1:
        raise UnsupportedError(f"{layout.architecture}: the rotary pair layout is not established (derived "
                               "architecture or multi-axis rope), so which dims rotate together is unknown; "
                               "`analyze` without --kv-cache still reports the bias classes", path=src)
    if layout.q_gate is not None:
        raise UnsupportedError(f"{layout.architecture}: the q projection carries an output gate; the KV-cache model "
                               "does not cover it yet", path=src)
    bad = [lt.layer for lt in layout.layers if not ((lt.q_weight and lt.k_weight) or lt.qkv_weight)]
    if bad:
        raise UnsupportedError(f"layers {bad[:4]} have no q/k projection the layout could place, so their q and k "
                               "heads do not pair up", path=src)


def kv_geometry(ckpt, layout, context: int | None = None, attn_rot: bool | None = None) -> KvGeometry:
    """Pairs in the file's dims, the cache order llama.cpp would store, and sampled angles; ``attn_rot``:
    model llama.cpp's Hadamard rotation (None: as llama.cpp would in this environment, :mod:`.kv_rot`)."""
    rot = R.resolve(attn_rot)
    from ..arch import families as F
    from ..arch.layouts import llama_permute_index, rotary_pairs
    from ..arch.rope import rope_inv_freq

    d = layout.head_dim
    pe = layout.position
    L = int(context or min(layout.max_positions or DEFAULT_CONTEXT, DEFAULT_CONTEXT))
    if pe.type != "rope" or not pe.rotary_dim:
        return KvGeometry(d, np.zeros((0, 2), dtype=np.int64), np.zeros((POSITIONS, 0)), np.arange(d), "none", rot)
    r = min(int(pe.rotary_dim), d)
    layout_name = pe.pair_layout or "rotate_half"
    pairs = rotary_pairs(d, r, layout_name)
    inv = rope_inv_freq(float(pe.theta or 10000.0), r)[: len(pairs)]
    pos = np.linspace(0, max(L - 1, 1), POSITIONS)
    order = np.arange(d)
    fam = F.by_name(layout.family) if layout.family else None
    if layout.naming == "hf" and fam is not None and fam.gguf_qk_permuted and r == d and layout_name == "rotate_half":
        # llama.cpp's converter stores these rows as interleaved pairs: the cache blocks follow that order
        order = llama_permute_index(1, d)
    return KvGeometry(d, pairs, pos[:, None] * inv[None, :], order, layout_name, rot)


def _read(ckpt, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
    x = ckpt.read_rows(name, *rows) if rows is not None else ckpt.read(name)
    return np.asarray(x, dtype=np.float32)


def projection(ckpt, layout, lt, role: str, rows: tuple[int, int] | None = None):
    """(W ``[rows, in]`` float32, b ``[rows]`` float64 or zeros) of role ``q|k|v`` in this layer; separate
    projections read only ``rows`` when given, fused ones are sliced (arch/layouts.qkv_row_index)."""
    from ..arch.layouts import qkv_row_index
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    wname, bname = getattr(lt, f"{role}_weight"), getattr(lt, f"{role}_bias")
    if wname:
        w = _read(ckpt, wname, rows)
        b = _read(ckpt, bname).astype(np.float64) if bname else np.zeros((h if role == "q" else kv) * d)
        return w, (b[rows[0]:rows[1]] if rows is not None else b)
    idx = qkv_row_index(layout.fused_layout or "concat", h, kv, d)["qkv".index(role)]
    w = _read(ckpt, lt.qkv_weight)
    w = w.T if layout.conv1d else w
    b = _read(ckpt, lt.qkv_bias).astype(np.float64) if lt.qkv_bias else np.zeros(w.shape[0])
    w, b = w[idx], b[idx]
    if rows is not None:
        w, b = w[rows[0]:rows[1]], b[rows[0]:rows[1]]
    return w, b


def _moments(w: np.ndarray, b: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None):
    """Mean and variance of ``W x_hat + b`` for unit-variance features scaled by ``gamma`` (+ ``beta``)."""
    var = np.einsum("ij,ij->i", w, w) if gamma is None else np.einsum("ij,ij,j->i", w, w, (gamma ** 2).astype(np.float32))
    mean = b + (w @ beta.astype(np.float32) if beta is not None else 0.0)
    return np.asarray(mean, np.float64), np.asarray(var, np.float64)


def _norm_weight(ckpt, layout, name: str | None) -> np.ndarray | None:
    return None if not name else np.asarray(ckpt.read(name), np.float64) + layout.norm_weight_offset


def _after_norm(mean, var, w, heads: int, d: int):
    """A q/k RMSNorm after the projection (per head ``[d]`` weight or over the whole projection):
    divide by the modelled RMS, multiply by the weight."""
    m, v = mean.reshape(heads, d), var.reshape(heads, d)
    if w.size == d:
        rms = np.sqrt((m ** 2 + v).mean(-1, keepdims=True)) + 1e-12
        wd = w.reshape(1, d)
    else:
        rms = np.sqrt((m ** 2 + v).mean()) + 1e-12
        wd = w.reshape(heads, d)
    return (m / rms * wd).reshape(-1), (v / rms ** 2 * wd ** 2).reshape(-1)


def kv_layer_stats(ckpt, layout, lt, *, values: bool = True, sample_q: bool | None = None,
                   sample_o: bool = True) -> KvLayerStats:
    """The modelled moments of one layer (see the module docstring).  ``sample_q``: read W_q rows of one
    query head per kv group (its moments stand for the group's other heads; their biases are exact);
    default: when W_q has more than :data:`FULL_READ_ELEMENTS` elements."""
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    g = h // kv
    gamma = _norm_weight(ckpt, layout, lt.attn_norm)
    beta = np.asarray(ckpt.read(lt.attn_norm_bias), np.float64) if lt.attn_norm_bias else None
    hidden = ckpt.tensors[lt.q_weight].shape[-1] if lt.q_weight else None
    if sample_q is None:
        sample_q = bool(lt.q_weight and hidden and h * d * hidden > FULL_READ_ELEMENTS and g > 1)
    if sample_q:
        qm, qv = np.empty(h * d), np.empty(h * d)
        _, bq = projection(ckpt, layout, lt, "q") if lt.q_bias else (None, np.zeros(h * d))
        for grp in range(kv):
            w, _ = projection(ckpt, layout, lt, "q", rows=(grp * g * d, grp * g * d + d))
            _, var = _moments(w, np.zeros(d), gamma, beta)
            for j in range(g):
                sl = slice((grp * g + j) * d, (grp * g + j + 1) * d)
                qv[sl] = var
                qm[sl] = bq[sl] + (w @ beta.astype(np.float32) if beta is not None else 0.0)
    else:
        qm, qv = _moments(*projection(ckpt, layout, lt, "q"), gamma, beta)
    km, kvar = _moments(*projection(ckpt, layout, lt, "k"), gamma, beta)
    if lt.q_norm and lt.k_norm:
        qm, qv = _after_norm(qm, qv, _norm_weight(ckpt, layout, lt.q_norm), h, d)
        km, kvar = _after_norm(km, kvar, _norm_weight(ckpt, layout, lt.k_norm), kv, d)
    vm = vv = ow = None
    if values:
        vm, vv = _moments(*projection(ckpt, layout, lt, "v"), gamma, beta)
        vm, vv = vm.reshape(kv, d), vv.reshape(kv, d)
        ow = o_column_weight(ckpt, layout, lt, sample=sample_o)
    return KvLayerStats(lt.layer, qm.reshape(h, d), qv.reshape(h, d), km.reshape(kv, d), kvar.reshape(kv, d),
                        vm, vv, ow, bool(sample_q))


def o_column_weight(ckpt, layout, lt, *, sample: bool = True) -> np.ndarray | None:
    """``|W_o[:, c]|^2`` for each input column c (query head h's value dims) -> ``[h, d]``; None if absent.
    ``sample``: estimate it from a few output rows when W_o is large (the static report; kv-equalize reads
    it all)."""
    if not lt.o_weight:
        return None
    info = ckpt.tensors[lt.o_weight]
    rows = info.shape[0]
    if sample and not layout.conv1d and len(info.shape) == 2 and rows * info.shape[1] > FULL_READ_ELEMENTS:
        # a large W_o [hidden, h*d]: its column norms estimated from O_SAMPLE_ROWS output rows in four spread
        # chunks (each column's squared norm is a sum over rows; the sample's sum is scaled up to all rows)
        n = O_SAMPLE_ROWS // 4
        starts = np.linspace(0, rows - n, 4).astype(int)
        w = np.concatenate([_read(ckpt, lt.o_weight, (int(a), int(a) + n)) for a in starts])
        col = np.einsum("ij,ij->j", w, w) * (rows / w.shape[0])
        return np.asarray(col, np.float64).reshape(layout.num_heads, layout.head_dim)
    w = _read(ckpt, lt.o_weight)
    col = np.einsum("ij,ij->i" if layout.conv1d else "ij,ij->j", w, w)      # no [out, in] temporary
    return np.asarray(col, np.float64).reshape(layout.num_heads, layout.head_dim)


# ----------------------------------------------------------------------------- the report

@dataclass(frozen=True)
class KvHeadPrediction:
    """One layer, kv head and cache type."""

    layer: int
    kv_head: int
    cache_type: str
    k_share: float                 # the bias's share of the K block steps (0: content sets every step)
    k_error: float                 # predicted attention-logit RMS error (K through q + Q through k)
    k_error_k: float               # its K-quantization part
    k_error_q: float               # its Q-to-dot-type part
    v_share: float | None
    v_error: float | None          # predicted value error reaching the output (hidden-state units)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "kv_head": self.kv_head, "cache_type": self.cache_type,
                "k_share": finite_or_none(self.k_share), "k_error": finite_or_none(self.k_error),
                "k_error_k": finite_or_none(self.k_error_k), "k_error_q": finite_or_none(self.k_error_q),
                "v_share": finite_or_none(self.v_share), "v_error": finite_or_none(self.v_error)}


@dataclass(frozen=True)
class KvLayerPrediction:
    """One layer and cache type: kv heads combined (errors RMS, shares mean), and the risk flags."""

    layer: int
    cache_type: str
    k_share: float
    k_error: float
    v_share: float | None
    v_error: float | None
    k_at_risk: bool
    v_at_risk: bool

    def to_dict(self) -> dict:
        return {"layer": self.layer, "cache_type": self.cache_type, "k_share": finite_or_none(self.k_share),
                "k_error": finite_or_none(self.k_error), "v_share": finite_or_none(self.v_share),
                "v_error": finite_or_none(self.v_error), "k_at_risk": self.k_at_risk, "v_at_risk": self.v_at_risk}


def _rms(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.sqrt(np.mean(np.square(xs)))) if xs else float("nan")


def flag_layers(heads: list[KvHeadPrediction], types) -> list[KvLayerPrediction]:
    """Combine kv heads per layer and flag the layers at risk (see the module docstring)."""
    out = []
    for t in types:
        per = {}
        for p in heads:
            if p.cache_type == t:
                per.setdefault(p.layer, []).append(p)
        rows = {i: (float(np.mean([p.k_share for p in ps])), _rms(p.k_error for p in ps),
                    None if ps[0].v_error is None else float(np.mean([p.v_share for p in ps])),
                    None if ps[0].v_error is None else _rms(p.v_error for p in ps)) for i, ps in per.items()}
        med_k = float(np.median([r[1] for r in rows.values()])) if rows else 0.0
        vs = [r[3] for r in rows.values() if r[3] is not None]
        med_v = float(np.median(vs)) if vs else 0.0
        for i, (ks, ke, vsh, ve) in sorted(rows.items()):
            k_risk = bool(ke >= RISK_LOGIT or (med_k > 0 and ke > RISK_RATIO * med_k))
            v_risk = bool(ve is not None and med_v > 0 and ve > RISK_RATIO * med_v)
            out.append(KvLayerPrediction(i, t, ks, ke, vsh, ve, k_risk, v_risk))
    return out


def predict_layer(st: KvLayerStats, geom: KvGeometry, types) -> list[KvHeadPrediction]:
    """Every kv head of one layer under every cache type in ``types``."""
    out = []
    v_order = np.arange(geom.head_dim)
    rot = (rotate(st.k_mean, st.k_var, geom), rotate(st.q_mean, st.q_var, geom))
    for t in types:
        ct = CACHE_TYPES[t]
        k = k_errors(st, geom, ct, rot)
        v = v_errors(st, v_order, ct, geom.attn_rot)
        for g in range(st.k_mean.shape[0]):
            out.append(KvHeadPrediction(st.layer, g, t, float(k["share"][g]), float(k["error"][g]),
                                        float(k["error_k"][g]), float(k["error_q"][g]),
                                        None if v is None else float(v["share"][g]),
                                        None if v is None else float(v["error"][g])))
    return out


def layer_error(st: KvLayerStats, geom: KvGeometry, cache_type: str, kind: str) -> float:
    """One layer's predicted error (RMS over kv heads) for ``kind`` ``k`` (logit) or ``v`` (output)."""
    ct = CACHE_TYPES[cache_type]
    e = k_errors(st, geom, ct)["error"] if kind == "k" else \
        v_errors(st, np.arange(geom.head_dim), ct, geom.attn_rot)["error"]
    return float(np.sqrt(np.mean(e ** 2)))


def llama_cache_warnings(layout, types_k, types_v=()) -> list[str]:
    """``warning: ...`` notes for the llama.cpp cache types that cannot act on this model (a block that does not
    divide the head size, :func:`.kv_rot.head_block_problem`): the prediction stands, llama.cpp cannot show it."""
    out = []
    for types, side in ((types_k, "K"), (types_v, "V")):
        for t in types:
            why = R.head_block_problem(t, (layout.head_dim,), side) if layout.head_dim else None
            if why:
                out.append(f"warning: {why}; verify --cache-type-k/-v and --cache-sweep refuse it")
    return out


def check_blocks(layout, types, src) -> None:
    for t in types:
        b = CACHE_TYPES[t].block
        if b and (layout.num_kv_heads * layout.head_dim) % b:
            raise UnsupportedError(f"a {t} cache quantizes rows of {b} values, but a layer's kv row has "
                                   f"{layout.num_kv_heads} x {layout.head_dim} = "
                                   f"{layout.num_kv_heads * layout.head_dim} values", path=src)


@dataclass(frozen=True)
class KvCacheReport:
    """``analyze --kv-cache``: predicted quantized-cache error per layer (and kv head) and type."""

    source: str
    architecture: str
    cache_types: tuple
    heads: tuple                   # KvHeadPrediction
    layers: tuple                  # KvLayerPrediction
    pair_layout: str
    cache_order: str               # file | interleaved (llama.cpp's permuted rows)
    context: int
    notes: tuple = ()
    per_head: bool = False
    warnings: tuple = field(default_factory=tuple)
    measured: object | None = None  # analysis.kv_measure.KvMeasureReport (``--measure``), else None
    attn_rot: bool = True          # llama.cpp's Hadamard rotation modelled where it applies it (.kv_rot)
    head_dim: int = 0
    capture_perm: tuple = ()       # cache position p holds transformers' dim capture_perm[p] (--measure)

    def rotation(self, cache_type: str) -> dict:
        """Whether llama.cpp rotates for this cache type: the Hadamard size for K (Q and K) and V, or None."""
        return {"k": R.rot_size(self.head_dim, cache_type, "k", self.attn_rot),
                "v": R.rot_size(self.head_dim, cache_type, "v", self.attn_rot)}

    def at_risk(self, cache_type: str | None = None) -> list[int]:
        return sorted({r.layer for r in self.layers if (cache_type in (None, r.cache_type))
                       and (r.k_at_risk or r.v_at_risk)})

    def n_worst(self) -> int:
        """How many layers the table names worst per type: a third of the layers, 1 to 3."""
        return max(1, min(3, len({r.layer for r in self.layers}) // 3))

    def worst_predicted(self, cache_type: str) -> tuple:
        """The layers with the largest predicted K logit error under ``cache_type``, worst first."""
        rows = sorted((r for r in self.layers if r.cache_type == cache_type), key=lambda r: -r.k_error)
        return tuple(r.layer for r in rows[:self.n_worst()])

    def worst_measured(self, cache_type: str) -> tuple:
        """With ``measured``: the layers with the largest measured attention-row KL, worst first."""
        if self.measured is None or cache_type not in self.measured.cache_types:
            return ()
        return tuple(self.measured.worst_layers(cache_type, self.n_worst()))

    def to_dict(self) -> dict:
        return {"source": self.source, "architecture": self.architecture, "kv_cache": {
            "cache_types": [CACHE_TYPES[t].to_dict() for t in self.cache_types],
            "model": {"z_block_max": Z_BLOCK_MAX, "positions": POSITIONS, "context": self.context,
                      "risk_ratio": RISK_RATIO, "risk_logit": RISK_LOGIT, "pair_layout": self.pair_layout,
                      "cache_order": self.cache_order, "attn_rot": self.attn_rot,
                      "rotation": {t: self.rotation(t) for t in self.cache_types}},
            "layers": [r.to_dict() for r in self.layers], "heads": [h.to_dict() for h in self.heads],
            "at_risk": {t: self.at_risk(t) for t in self.cache_types},
            "worst_predicted": {t: list(self.worst_predicted(t)) for t in self.cache_types},
            "measured": None if self.measured is None else self.measured.to_dict(),
            "rank_agreement": None if self.measured is None else {
                t: finite_or_none(self.rank_agreement(t)) for t in self.cache_types}}, "notes": list(self.notes)}

    def rows(self) -> list[dict]:
        """One row per layer (per layer and kv head with ``per_head``): each type's K logit error and V
        error, and the at-risk flag column naming the types."""
        risk = {}
        for r in self.layers:
            if r.k_at_risk or r.v_at_risk:
                risk.setdefault(r.layer, []).append(f"{r.cache_type}:{'K' if r.k_at_risk else ''}"
                                                    f"{'V' if r.v_at_risk else ''}")
        src = self.heads if self.per_head else self.layers
        out: dict = {}
        for r in src:
            key = (r.layer, r.kv_head) if self.per_head else r.layer
            row = out.setdefault(key, {"layer": r.layer, **({"kv_head": r.kv_head} if self.per_head else {})})
            row[f"K {r.cache_type}"] = r.k_error
            row[f"K share {r.cache_type}"] = r.k_share
            if r.v_error is not None:
                row[f"V {r.cache_type}"] = r.v_error
        for row in out.values():
            row["at risk"] = ", ".join(risk.get(row["layer"], [])) or "-"
        if self.measured is not None:
            self._measured_columns(out.values())
        return list(out.values())

    def rank_agreement(self, cache_type: str) -> float | None:
        """With ``measured``: Spearman correlation of the layers' predicted K error and measured row KL
        (None under 3 layers or without a measurement)."""
        if self.measured is None or cache_type not in self.measured.cache_types:
            return None
        pred = {r.layer: r.k_error for r in self.layers if r.cache_type == cache_type}
        meas = {r.layer: r.k_row_kl for r in self.measured.layers if r.cache_type == cache_type}
        common = sorted(set(pred) & set(meas))
        if len(common) < 3:
            return None
        ra = np.argsort(np.argsort([pred[i] for i in common]))
        rb = np.argsort(np.argsort([meas[i] for i in common]))
        return float(np.corrcoef(ra, rb)[0, 1])

    def _measured_columns(self, rows) -> None:
        """``--measure``: each type's measured logit RMS error and row KL beside the prediction, and the
        worst layers by prediction and by measurement."""
        m = self.measured
        worst_p = {t: self.worst_predicted(t) for t in self.cache_types}
        worst_m = {t: self.worst_measured(t) for t in self.cache_types}
        for row in rows:
            i = row["layer"]
            for t in self.cache_types:
                r = next((x for x in m.layers if x.layer == i and x.cache_type == t), None)
                row[f"meas K {t}"] = None if r is None else r.k_logit_rms
                row[f"KL {t}"] = None if r is None else r.k_row_kl
            row["worst (pred)"] = ", ".join(t for t in self.cache_types if i in worst_p[t]) or "-"
            row["worst (meas)"] = ", ".join(t for t in self.cache_types if i in worst_m[t]) or "-"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([h.to_dict() for h in self.heads])

    def summary_items(self) -> list[tuple[str, str]]:
        items = [("source", self.source), ("architecture", self.architecture),
                 ("cache types", ", ".join(self.cache_types)),
                 ("pairs", f"{self.pair_layout}; cache blocks in {self.cache_order} order"),
                 ("model", f"static (weights and biases), {POSITIONS} positions over {self.context}; K: logit RMS "
                           "error (K via q + Q to its dot type via k); V: error reaching the output")]
        items += [(f"attn_rot ({t})", R.describe(self.head_dim, t, self.attn_rot)) for t in self.cache_types]
        for t in self.cache_types:
            bad = self.at_risk(t)
            items.append((f"at risk ({t})", ", ".join(map(str, bad)) if bad else "none"))
        if self.measured is not None:
            m = self.measured
            items.append(("measured", f"{m.prompts} prompt(s), {sum(m.tokens)} tokens on {m.device}: K logit RMS "
                                      "error and attention-row KL (nats), ggml's kernels on the real Q, K, V"))
            for t in self.cache_types:
                rho = self.rank_agreement(t)
                items.append((f"worst layers ({t})", f"predicted {', '.join(map(str, self.worst_predicted(t)))}; "
                                                     f"measured {', '.join(map(str, self.worst_measured(t)))}"
                              + ("" if rho is None else f"; rank agreement (Spearman) {rho:.2f}")))
        return items


def layer_stats_ahead(ckpt, layout, **options):
    """:func:`kv_layer_stats` (with ``options``) of every layer in order, read and reduced on a second thread
    ahead of the caller's work on the previous layer: the same numbers, and the caller must not read tensor
    data meanwhile (only that thread touches the checkpoint's files).  Close it (``contextlib.closing``) to
    stop the reading early."""
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-read")
    try:
        yield from pool.map(lambda lt: kv_layer_stats(ckpt, layout, lt, **options), layout.layers)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def kv_cache_report(ckpt, cache_types, *, context: int | None = None, per_head: bool = False,
                    values: bool = True, attn_rot: bool | None = None) -> KvCacheReport:
    """The static KV-cache prediction of an open checkpoint (see the module docstring); ``attn_rot``: model
    llama.cpp's Hadamard rotation where it applies it (None: as llama.cpp would in this environment)."""
    types = parse_cache_types(cache_types, path=ckpt.source)
    layout = ckpt.layout()
    check_pairable(ckpt, layout)
    check_blocks(layout, types, ckpt.source)
    geom = kv_geometry(ckpt, layout, context, attn_rot)
    heads, sampled = [], False
    for st in layer_stats_ahead(ckpt, layout, values=values):
        sampled = sampled or st.q_sampled
        heads += predict_layer(st, geom, types)
    notes = ["predicted from weights and biases only (no forward pass): content modelled as unit-variance "
             "features after the pre-attention norm (--measure: the real Q, K, V beside it)"]
    notes += llama_cache_warnings(layout, types, types if values else ())
    if sampled:
        notes.append("W_q is large: the content moments of one query head per kv group stand for the group "
                     f"(every head's own bias is used); a large W_o's column norms come from {O_SAMPLE_ROWS} of "
                     "its rows (kv-equalize reads both whole)")
    if not any(lt.attn_norm for lt in layout.layers):
        notes.append("no norm before attention in this layout (post-norm): features modelled as unit variance")
    if layout.softcap:
        notes.append("logit soft-capping compresses large logits: the predicted error is before the cap")
    ctx = int(geom.angles.shape[0] and (context or min(layout.max_positions or DEFAULT_CONTEXT, DEFAULT_CONTEXT)))
    order = "interleaved" if not np.array_equal(geom.cache_order, np.arange(geom.head_dim)) else "file"
    return KvCacheReport(ckpt.source, layout.architecture, types, tuple(heads), tuple(flag_layers(heads, types)),
                         geom.pair_layout, order, ctx, tuple(notes), per_head, attn_rot=geom.attn_rot,
                         head_dim=geom.head_dim,
                         capture_perm=tuple(int(x) for x in R.capture_cache_perm(geom, ckpt.naming)[0]))


def analyze_kv_cache(source, cache_types, *, context: int | None = None, per_head: bool = False,
                     attn_rot: bool | None = None, **open_kwargs) -> KvCacheReport:
    """Python twin of ``analyze --kv-cache TYPES`` (``source``: any source or an open Checkpoint)."""
    from ..checkpoint import Checkpoint, open_checkpoint
    if isinstance(source, Checkpoint):
        source.refuse_truncated()        # as every command but inspect
        return kv_cache_report(source, cache_types, context=context, per_head=per_head, attn_rot=attn_rot)
    parse_cache_types(cache_types, path=str(source))      # an unknown type before the file is opened
    with open_checkpoint(source, **open_kwargs) as ck:
        ck.refuse_truncated()
        return kv_cache_report(ck, cache_types, context=context, per_head=per_head, attn_rot=attn_rot)
