"""``kv-equalize``: rescale q/k rotary pairs (and value dims) so a quantized KV cache hurts less, exactly.

The transform (docs/architecture.md has the argument; :func:`ckpt_surgeon.surgery.ops.scale_axis` the
identities):

* rotary pair j of every query head in a kv group times ``alpha_j``, the same pair of the kv head's
  key times ``1 / alpha_j``.  Every attention logit ``q_m^T R_(n-m) k_n`` is unchanged: a scalar on a
  2-D rotation plane commutes with the rotation (any rope type, any scaling).  A pass-through dim of
  partial rotary takes its own scale.  Applied to the rows of ``W_q``/``b_q`` and ``W_k``/``b_k`` (fused
  QKV rows through the registry's layout), or to the q-norm / k-norm weights where a norm follows the
  projection (a per-head norm weight shared by every head takes one scale per pair for the whole layer).
  Pairs are the file's own (rotate_half, or llama.cpp's interleaved rows in a permuted GGUF).
* value dim i of a kv head times ``m_i`` (rows of ``W_v``/``b_v``) and the ``W_o`` columns of that dim
  in every query head of the group times ``1 / m_i``: the head output reaches the residual stream
  unchanged (``W_o M^-1 M v``).

The scales are chosen from the weights and biases (no calibration prompts) to minimise the static
prediction of :mod:`ckpt_surgeon.analysis.kv_cache` for the target cache types, Q's own quantization
to the K type's dot type included: for each kv head a family of candidates (balancing each pair's
modelled peak in q against k, ``alpha = (A_k / A_q)^(t/2)``, and flattening k's peaks alone,
``alpha = (A_k / rms A_k)^t``, and bringing only the outlier pairs down to ``c`` x the median peak) is
scored and the best kept; ``t = 0`` (no change) is always a
candidate, so the prediction never gets worse.  Values: ``m_i = (rms A_v / A_v,i)^t``, same rule.
With ``scales="pow2"`` (the static default) every candidate is rounded to powers of two before it is scored:
the rescaled BF16/F16/F32 weights are then the exact products (an exponent move, written on the stored bits
by :func:`ckpt_surgeon.surgery.ops.scale_pow2_bits`), and a tensor whose scales are all 1 is not rewritten.

``calibrate=True`` (``--calibrate``) starts from that choice and searches alpha on the *measured* attention
error of real prompts instead (:mod:`ckpt_surgeon.surgery.kv_calibrate`); the report says which way the
scales were chosen.  The transform, and so its exactness, is the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import kv_cache as KC
from ..analysis import kv_rot as KR
from ..errors import CkptError, UnsupportedError
from ..records import finite_or_none
from .kv_guard import MIN_GAIN, LayerErrors, is_identity, keep_gain
from .kv_turn import batched_errors, choose_turn, head_errors
from .plan import Plan, TensorStep, step_params

_T_BALANCE = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
_T_FLATTEN = (0.25, 0.5, 0.75, 1.0)
_T_VALUE = (0.25, 0.5, 0.75, 1.0)
_C_OUTLIER = (1.0, 2.0, 4.0, 8.0, 16.0)
SCALES = ("pow2", "continuous")     # how the scales are restricted: powers of two (the default), or any positive


def to_pow2(x: np.ndarray) -> np.ndarray:
    """Each scale rounded to the nearest power of two (in log2): scaling a BF16/F16/F32 weight by it moves the
    exponent only, so the rescaled weights are exact in their own dtype (:func:`.ops.scale_pow2_bits`)."""
    return np.exp2(np.round(np.log2(np.asarray(x, dtype=np.float64))))


@dataclass(frozen=True)
class KvEqualizeLayer:
    """Predicted error of one layer before and after (RMS over kv heads), and the scales' spread."""

    layer: int
    k_before: float
    k_after: float
    v_before: float | None = None
    v_after: float | None = None
    alpha_min: float = 1.0
    alpha_max: float = 1.0
    m_min: float | None = None
    m_max: float | None = None
    kl_before: float | None = None      # --calibrate: measured mean attention-row KL (first K type), alpha = 1
    kl_static: float | None = None      # ... with the static choice
    kl_after: float | None = None       # ... with the calibrated choice
    turned: int = 0                     # rotary pairs turned (per kv head, the most of any head)

    def to_dict(self) -> dict:
        return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}

    def row(self) -> dict:
        d = {"layer": self.layer, "K before": self.k_before, "K after": self.k_after,
             "K ratio": self.k_after / self.k_before if self.k_before else float("nan"),
             "alpha range": f"{self.alpha_min:.3g}..{self.alpha_max:.3g}", "pairs turned": self.turned}
        if self.v_before is not None:
            d.update({"V before": self.v_before, "V after": self.v_after,
                      "m range": f"{self.m_min:.3g}..{self.m_max:.3g}"})
        if self.kl_before is not None:
            d.update({"KL before": self.kl_before, "KL static": self.kl_static, "KL calibrated": self.kl_after})
        return d


def _peak(mean: np.ndarray, var: np.ndarray, groups) -> np.ndarray:
    """``[heads, n_groups]``: modelled peak magnitude of each pair (rotation-invariant) or single dim."""
    return np.stack([np.sqrt((mean[:, g] ** 2).sum(-1) + KC.Z_BLOCK_MAX ** 2 * var[:, g].max(-1)) for g in groups], -1)


def _expand(per_group: np.ndarray, groups, d: int) -> np.ndarray:
    out = np.ones(per_group.shape[:-1] + (d,))
    for j, g in enumerate(groups):
        out[..., g] = per_group[..., j:j + 1]
    return out


def _cost(errs: list[np.ndarray], base: list[np.ndarray]) -> np.ndarray:
    """Per kv head: sum over target types of (error / error before)^2."""
    return sum((e / np.where(b > 0, b, 1.0)) ** 2 for e, b in zip(errs, base))


def choose_alpha(st: KC.KvLayerStats, geom: KC.KvGeometry, types, shared: bool, pow2: bool = False,
                 errors: LayerErrors | None = None) -> np.ndarray:
    """``alpha [kv, d]`` minimising the predicted K error (Q's own quantization included) over ``types``;
    ``shared``: one scale per pair for every kv head (a per-head q/k-norm weight shared by all heads); ``pow2``:
    every candidate rounded to powers of two before it is scored; ``errors``: the layer's
    :class:`.kv_guard.LayerErrors` (its rotated moments and errors before are then computed once)."""
    kv, d = st.k_mean.shape
    g = st.q_mean.shape[0] // kv
    groups = geom.groups()
    a_k = _peak(st.k_mean, st.k_var, groups)
    a_q = np.sqrt((_peak(st.q_mean, st.q_var, groups) ** 2).reshape(kv, g, -1).mean(1))
    if shared:
        a_k = np.sqrt((a_k ** 2).mean(0, keepdims=True)).repeat(kv, 0)
        a_q = np.sqrt((a_q ** 2).mean(0, keepdims=True)).repeat(kv, 0)
    tiny = 1e-12
    cands = [np.ones((kv, d))]
    ratio = (a_k + tiny) / (a_q + tiny)
    cands += [_expand(ratio ** (t / 2), groups, d) for t in _T_BALANCE]
    ref = np.sqrt((a_k ** 2).mean(-1, keepdims=True)) + tiny
    cands += [_expand(((a_k + tiny) / ref) ** t, groups, d) for t in _T_FLATTEN]
    # the outlier pairs alone, brought down to c x the head's median peak (the rest untouched)
    med = np.median(a_k, -1, keepdims=True) + tiny
    cands += [_expand(np.maximum(1.0, a_k / (c * med)), groups, d) for c in _C_OUTLIER]
    if pow2:
        cands = [to_pow2(c) for c in cands]
    cts = [KC.CACHE_TYPES[t] for t in types]
    errors = errors if errors is not None else LayerErrors(st, geom)
    rot, base = errors.rot, [errors.k_heads(t) for t in types]
    errs = head_errors(st, geom, cts, rot, cands)                   # each distinct (head, scales) scored once
    if errs is None:
        errs = batched_errors(st, geom, cts, rot, cands)           # all candidates in one evaluation
    if errs is None:        # fp8's per-tensor scale couples the heads: one candidate at a time
        errs = [np.stack([KC.k_errors(st, geom, ct, KC.transform_rotated(rot, a))["error"] for a in cands])
                for ct in cts]
    costs = np.stack([_cost([e[i] for e in errs], base) for i in range(len(cands))])    # [candidates, kv]
    if shared:
        best = np.full(kv, int(np.argmin(costs.sum(1))))
    else:
        best = costs.argmin(0)
    return np.stack([cands[b][i] for i, b in enumerate(best)])


def choose_m(st: KC.KvLayerStats, types, attn_rot: bool = False, pow2: bool = False) -> np.ndarray | None:
    """``m [kv, d]`` minimising the predicted value error reaching the output over ``types`` (``attn_rot``: as
    llama.cpp rotates V, :func:`ckpt_surgeon.analysis.kv_cache.v_errors`; ``pow2``: powers of two only)."""
    if st.v_mean is None:
        return None
    kv, d = st.v_mean.shape
    order = np.arange(d)
    a_v = np.sqrt(st.v_mean ** 2 + KC.Z_BLOCK_MAX ** 2 * st.v_var) + 1e-12
    ref = np.sqrt((a_v ** 2).mean(-1, keepdims=True))
    cands = [np.ones((kv, d))] + [(ref / a_v) ** t for t in _T_VALUE]
    if pow2:
        cands = [to_pow2(c) for c in cands]
    cts = [KC.CACHE_TYPES[t] for t in types]
    base = [KC.v_errors(st, order, ct, attn_rot)["error"] for ct in cts]
    costs = np.stack([_cost([KC.v_errors(st.scaled(m=m), order, ct, attn_rot)["error"] for ct in cts], base)
                      for m in cands])
    best = costs.argmin(0)
    return np.stack([cands[b][i] for i, b in enumerate(best)])


def _check_writable(ckpt, names, src) -> None:
    for n in names:
        info = ckpt.tensors[n]
        if info.quantized or (ckpt.quantization is not None and n in ckpt.quantization.tensors):
            raise UnsupportedError(f"{info.dtype} is a quantized type: rescaling its values would re-quantize them "
                                   "(not exact); equalize the float checkpoint, then quantize", path=src, tensor=n)


def _step(name: str, scale: np.ndarray, axis: int, layer: int, why: str, offset: float = 0.0,
          turn=None) -> TensorStep | None:
    """The ``scale_axis`` step of one tensor; None where it would change nothing (every scale 1, no turn: the
    writer then copies the tensor byte-identical)."""
    if turn is None and np.all(np.asarray(scale) == 1.0):
        return None
    extra = {} if turn is None else {"turn_a": [int(x) for x in turn[0]], "turn_b": [int(x) for x in turn[1]],
                                     "turn_angle": [float(x) for x in turn[2]]}
    return TensorStep("scale_axis", name, (name,), step_params(scale=[float(x) for x in scale], axis=axis,
                                                              offset=float(offset), **extra),
                      like=name, layer=layer, why=why + (", pairs turned" if turn is not None else ""))


def _turn_rows(phi, pairs, heads: int, group: int, d: int, rows=None):
    """``(a, b, angle)`` row indices of a projection with ``heads`` heads (head ``i`` uses kv head ``i // group``'s
    angles) for the pairs with a non-zero angle; ``rows`` maps them into a fused projection; None: no turn."""
    if phi is None or not np.any(phi):
        return None
    a, b, ang = [], [], []
    for i in range(heads):
        for j in np.nonzero(phi[i // group])[0]:
            a.append(i * d + pairs[j, 0])
            b.append(i * d + pairs[j, 1])
            ang.append(phi[i // group, j])
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if rows is not None:
        a, b = rows[a], rows[b]
    return a, b, np.asarray(ang)


def _qk_steps(ckpt, layout, lt, alpha: np.ndarray, phi=None, pairs=None) -> list[TensorStep]:
    """Steps writing ``alpha`` into q and ``1/alpha`` into k (norm weights, separate or fused projections), and
    the pair turns ``phi [kv, P]`` of ``pairs`` into both (projections only)."""
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    qs, ks = np.repeat(alpha, h // kv, axis=0).reshape(-1), (1.0 / alpha).reshape(-1)
    if lt.q_norm and lt.k_norm:
        off = layout.norm_weight_offset
        out = []
        for name, s in ((lt.q_norm, qs), (lt.k_norm, ks)):
            n = int(np.prod(ckpt.tensors[name].shape))
            out.append(_step(name, s[:d] if n == d else s, 0, lt.layer, "q/k-norm weight x pair scale", off))
        return out
    if lt.q_weight and lt.k_weight:
        out = []
        tq, tk = _turn_rows(phi, pairs, h, h // kv, d), _turn_rows(phi, pairs, kv, 1, d)
        for w, b, s, t in ((lt.q_weight, lt.q_bias, qs, tq), (lt.k_weight, lt.k_bias, ks, tk)):
            out.append(_step(w, s, 0, lt.layer, "rotary pair scale (q x alpha, k / alpha)", turn=t))
            if b:
                out.append(_step(b, s, 0, lt.layer, "rotary pair scale (q x alpha, k / alpha)", turn=t))
        return out
    return []          # fused: written together with v by _fused_steps


def _fused_steps(layout, lt, alpha, m, phi=None, pairs=None) -> list[TensorStep]:
    from ..arch.layouts import qkv_row_index
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    iq, ik, iv = qkv_row_index(layout.fused_layout or "concat", h, kv, d)
    tq, tk = _turn_rows(phi, pairs, h, h // kv, d, np.asarray(iq)), _turn_rows(phi, pairs, kv, 1, d, np.asarray(ik))
    turn = None if tq is None else tuple(np.concatenate([x, y]) for x, y in zip(tq, tk))
    s = np.ones(len(iq) + len(ik) + len(iv))
    s[iq] = np.repeat(alpha, h // kv, axis=0).reshape(-1)
    s[ik] = (1.0 / alpha).reshape(-1)
    if m is not None:
        s[iv] = m.reshape(-1)
    out = [_step(lt.qkv_weight, s, -1 if layout.conv1d else 0, lt.layer, "fused qkv rows scaled", turn=turn)]
    if lt.qkv_bias:
        out.append(_step(lt.qkv_bias, s, 0, lt.layer, "fused qkv bias scaled", turn=turn))
    return out


def _v_steps(layout, lt, m) -> list[TensorStep]:
    h, kv = layout.num_heads, layout.num_kv_heads
    out = []
    if lt.v_weight:
        out.append(_step(lt.v_weight, m.reshape(-1), 0, lt.layer, "value dims x m"))
        if lt.v_bias:
            out.append(_step(lt.v_bias, m.reshape(-1), 0, lt.layer, "value dims x m"))
    inv = (1.0 / np.repeat(m, h // kv, axis=0)).reshape(-1)
    out.append(_step(lt.o_weight, inv, 0 if layout.conv1d else -1, lt.layer, "W_o columns / m"))
    return out


def layer_steps(ckpt, layout, lt, alpha: np.ndarray, m: np.ndarray | None = None, phi=None,
                pairs=None) -> list[TensorStep]:
    """The steps writing given scales into one layer: q pairs x ``alpha [kv, d]``, k pairs / ``alpha`` (pairs
    must share a scale), value dims x ``m [kv, d]`` and W_o columns / ``m`` (None: values untouched), and
    rotary pair j of q and k turned by ``phi [kv, P]`` (``pairs [P, 2]``, file dims; None: no turn).
    Exact for any positive scales that are equal on both dims of each rotary pair and any angles
    (see ops.scale_axis); a turn is refused where a q/k norm follows the projection."""
    if phi is not None and np.any(phi) and lt.q_norm and lt.k_norm:
        raise UnsupportedError("a per-dim q/k-norm weight follows the projection: a pair turn would not commute "
                               "with it", path=ckpt.source, tensor=lt.q_norm)
    steps = _qk_steps(ckpt, layout, lt, alpha, phi, pairs)
    if lt.qkv_weight:
        steps += _fused_steps(layout, lt, alpha, m, phi, pairs)
    elif m is not None:
        steps += _v_steps(layout, lt, m)
    if m is not None and lt.qkv_weight:
        steps += [_step(lt.o_weight, (1.0 / np.repeat(m, layout.num_heads // layout.num_kv_heads, 0)).reshape(-1),
                        0 if layout.conv1d else -1, lt.layer, "W_o columns / m")]
    steps = [s for s in steps if s is not None]
    _check_writable(ckpt, [s.out for s in steps], ckpt.source)
    return steps


def plan_kv_equalize(ckpt, *, cache_type_k="q4_0", cache_type_v=None, context: int | None = None,
                     calibration=None, attn_rot: bool | None = None, turn: bool = True,
                     scales: str | None = None, min_gain: float = MIN_GAIN) -> Plan:
    """The kv-equalize plan of an open checkpoint (reads each layer's q/k/v/o once; writes nothing);
    ``calibration`` (:func:`ckpt_surgeon.surgery.kv_calibrate.collect`): choose alpha on its measured Q and K;
    ``attn_rot``: predict with llama.cpp's Hadamard rotation where it applies it (None: as llama.cpp would in
    this environment); ``turn``: also turn the bias-dominated pairs (:mod:`.kv_turn`; static choice only);
    ``scales``: ``pow2`` (powers of two: exact in the weights' own dtype) or ``continuous`` (None: pow2, or
    continuous with a calibration);
    ``min_gain``: a layer whose predicted error falls by less keeps its weights (:mod:`.kv_guard`; static only)."""
    src = ckpt.source
    pow2 = _pow2_mode(scales, calibration, src)
    types_k = KC.parse_cache_types(cache_type_k, path=src)
    types_v = KC.parse_cache_types(cache_type_v, path=src) if cache_type_v else ()
    ckpt.refuse_truncated()        # every tensor is copied: a file cut short is refused before planning
    layout = ckpt.layout()
    KC.check_pairable(ckpt, layout)
    KC.check_blocks(layout, types_k + types_v, src)
    geom = KC.kv_geometry(ckpt, layout, context, attn_rot)
    # turns only for llama.cpp's rotated blocks: on plain blocks they were predicted to help but measured worse
    # in llama.cpp (LLAMA_ATTN_ROT_DISABLE=1, concentrated q4_0: 0.040 -> 0.058)
    rotated = all(KR.rot_size(geom.head_dim, t, "k", geom.attn_rot) for t in types_k)
    steps, recs, kept = [], [], []
    # the next layer is read on a second thread meanwhile (this loop reads no tensor data itself)
    ahead = KC.layer_stats_ahead(ckpt, layout, values=bool(types_v), sample_q=False, sample_o=False)
    try:
        for lt in layout.layers:
            if types_v and not lt.o_weight:
                raise UnsupportedError("the layer has no output projection the layout could place, so the value map "
                                       "has nowhere to put M^-1", path=src, tensor=lt.v_weight)
            st = next(ahead)
            shared = bool(lt.q_norm and lt.k_norm and layout.num_heads > 1 and layout.head_dim
                          == min(np.prod(ckpt.tensors[n].shape) for n in (lt.q_norm, lt.k_norm)))
            errs = LayerErrors(st, geom)
            alpha = choose_alpha(st, geom, types_k, shared, pow2, errs)
            cal = _calibrate(calibration, lt.layer, geom, layout, types_k, alpha, shared, src)
            alpha = cal.alpha if cal is not None else alpha
            phi = None
            if turn and rotated and cal is None and not (lt.q_norm and lt.k_norm):
                alpha, phi = choose_turn(st, geom, types_k, alpha, pow2)
            m = choose_m(st, types_v, geom.attn_rot, pow2) if types_v else None
            if cal is None:
                alpha, phi, m = keep_gain(st, geom, types_k, types_v, alpha, phi, m, min_gain, errs)
            layer = layer_steps(ckpt, layout, lt, alpha, None if m is None or np.all(m == 1.0) else m, phi, geom.pairs)
            steps += [] if is_identity(alpha, phi, m) else layer
            kept += [lt.layer] if is_identity(alpha, phi, m) else []
            recs.append(_record(lt.layer, errs, types_k, types_v, alpha, phi, m, cal))
    finally:
        ahead.close()
    notes = _notes(calibration, how := _how(calibration), types_k, types_v, pow2, kept * (min_gain > 0), min_gain)
    notes += KC.llama_cache_warnings(layout, types_k, types_v)      # issue 50 item 5: a cache llama.cpp cannot show
    params = {"cache_type_k": list(types_k), "cache_type_v": list(types_v), "context": context,
              "pair_layout": geom.pair_layout, "scales": how, "scale_values": "pow2" if pow2 else "continuous",
              "attn_rot": geom.attn_rot, "min_gain": min_gain,
              "calibration": calibration.to_dict() if calibration is not None else None}
    return Plan(operation="kv-equalize", source=src, params=params, steps=tuple(steps), layers=tuple(recs),
                notes=tuple(notes))


def _record(layer: int, errs: LayerErrors, types_k, types_v, alpha, phi, m, cal) -> KvEqualizeLayer:
    """The layer's row: the predicted error before and after for the first K (V) type, the scales' spread."""
    t0, v0 = types_k[0], (types_v[0] if types_v else None)
    return KvEqualizeLayer(
        layer, errs.before(t0, "k"), errs.k_after(t0, alpha, phi),
        errs.before(v0, "v") if v0 else None, errs.v_after(v0, m) if v0 else None,
        float(alpha.min()), float(alpha.max()),
        float(m.min()) if m is not None else None, float(m.max()) if m is not None else None,
        *((cal.kl_before, cal.kl_static, cal.kl_after) if cal is not None else (None, None, None)),
        turned=int(np.count_nonzero(phi, axis=1).max()) if phi is not None and phi.size else 0)


def _notes(calibration, how: str, types_k, types_v, pow2: bool, kept, min_gain: float) -> list[str]:
    """The plan's notes: how the scales were chosen, why the transform is exact, which layers the guard kept."""
    notes = [f"scales {how if calibration is not None else 'chosen ' + how}: " + (
                 "alpha per rotary pair per kv head by coordinate descent on the measured mean attention-row KL "
                 f"(keys through {', '.join(types_k)}, queries through the vec_dot type, ggml's kernels), from the "
                 "static choice; 'KL before/static/calibrated' are that measurement, 'before/after' the static "
                 "prediction" + (" (values: the static choice)" if types_v else "") if calibration is not None else
                 f"to minimise the static prediction for K {', '.join(types_k)}"
                 + (f" and V {', '.join(types_v)}" if types_v else "")
                 + ", Q's own quantization to the dot type included; 'before/after' are that prediction"),
             "exact: every attention logit and head output is unchanged (q pair x alpha, k pair / alpha commute with "
             "the rotation; W_o M^-1 M v = W_o v); " + (
                 "scales are powers of two, so rescaled weights are exact in their own dtype (exponent moved; "
                 "turned pairs and any element leaving the normal range rounded once from float64)" if pow2 else
                 "changed tensors computed in float64 and cast once")]
    if kept and calibration is None:
        notes.append(f"layers left as they are (predicted gain under {100 * min_gain:.0f} %, within what the "
                     f"prediction can resolve): {', '.join(map(str, kept))}")
    return notes


def _pow2_mode(scales: str | None, calibration, src) -> bool:
    if scales is not None and scales not in SCALES:
        raise CkptError(f"unknown --scales {scales!r}; known: {', '.join(SCALES)}", path=src)
    if scales == "pow2" and calibration is not None:
        raise CkptError("--calibrate searches continuous scales (steps of 2^(1/4)); use --scales continuous or "
                        "leave --scales out", path=src)
    return scales == "pow2" or (scales is None and calibration is None)


def _how(calibration) -> str:
    return "from the weights and biases" if calibration is None else calibration.describe()


def _calibrate(calibration, layer: int, geom, layout, types_k, alpha, shared: bool, src):
    """The calibrated choice of one layer (None without a calibration)."""
    if calibration is None:
        return None
    from .kv_calibrate import calibrate_layer
    samples = calibration.layers.get(layer)
    if not samples:
        raise UnsupportedError(f"--calibrate: the forward pass recorded no attention call for layer {layer}, so its "
                               "scales cannot be calibrated (use the static choice)", path=src)
    return calibrate_layer(samples, geom, layout.naming, layout.num_kv_heads, types_k, alpha, shared,
                           calibration.attn_rot)


@dataclass(frozen=True)
class KvEqualizeReport:
    """What ``kv-equalize`` did: per layer the predicted error before and after, and the write."""

    plan: Plan
    out: str | None
    write: object | None = None     # formats.write.writer.WriteResult (None: dry run)

    @property
    def layers(self) -> tuple:
        return self.plan.layers

    @property
    def notes(self) -> tuple:
        return self.plan.notes

    def improvement(self, kind: str = "k") -> float:
        """Model-level predicted error before / after (RMS over layers)."""
        b = [getattr(r, f"{kind}_before") for r in self.layers]
        a = [getattr(r, f"{kind}_after") for r in self.layers]
        if not b or b[0] is None:
            return float("nan")
        return float(np.sqrt(np.mean(np.square(b))) / max(np.sqrt(np.mean(np.square(a))), 1e-300))

    def to_dict(self) -> dict:
        return {"operation": "kv-equalize", "source": self.plan.source, "out": self.out,
                "params": self.plan.to_dict()["params"], "layers": [r.to_dict() for r in self.layers],
                "tensors_changed": sorted(self.plan.changed), "notes": list(self.notes),
                "write": self.write.to_dict() if self.write is not None else None}

    def rows(self) -> list[dict]:
        return [r.row() for r in self.layers]

    def summary_items(self) -> list[tuple[str, str]]:
        p = self.plan.params
        items = [("operation", "kv-equalize"), ("source", self.plan.source),
                 ("output", self.out or "dry run: nothing written"),
                 ("cache type K", ", ".join(p["cache_type_k"])),
                 ("cache type V", ", ".join(p["cache_type_v"]) or "- (values untouched)"),
                 ("pairs", p["pair_layout"]), ("scales chosen", p.get("scales", "from the weights and biases")),
                 ("tensors changed", str(len(self.plan.changed))),
                 ("predicted K error", f"{self.improvement('k'):.3g}x lower (RMS over layers)")]
        kl = [(r.kl_before, r.kl_static, r.kl_after) for r in self.layers if r.kl_before is not None]
        if kl:
            b, st, a = (float(np.mean(x)) for x in zip(*kl))
            items.append(("measured row KL", f"{b:.3g} -> static {st:.3g} -> calibrated {a:.3g} nats "
                                             f"(mean over layers, {p['cache_type_k'][0]})"))
        if p["cache_type_v"]:
            items.append(("predicted V error", f"{self.improvement('v'):.3g}x lower (RMS over layers)"))
        if self.write is not None:
            items += [("written", f"{self.write.bytes_written:,} bytes in {self.write.seconds:.2f} s"),
                      ("reread check", self.write.check_scope)]
        return items


def kv_equalize(source, out, *, cache_type_k="q4_0", cache_type_v=None, context: int | None = None,
                force: bool = False, check: str = "auto", dry_run: bool = False, calibrate: bool = False,
                prompts=None, max_tokens: int = 256, rows: int = 64, device: str = "cpu", attn_rot: bool | None = None,
                turn: bool = True, scales: str | None = None, min_gain: float = MIN_GAIN,
                **open_kw) -> KvEqualizeReport:
    """Rescale and turn q/k rotary pairs (and value dims) so that a quantized KV cache hurts less, every
    attention logit unchanged: the twin of ``ckpt-surgeon kv-equalize`` (docs/kv-equalize.md).

    ``calibrate``: run the model (transformers) on ``prompts`` (default: the analysis prompt set), each cut
    to ``max_tokens``, keep ``rows`` query rows per prompt, and choose alpha on the measured attention error
    (:mod:`ckpt_surgeon.surgery.kv_calibrate`); ``attn_rot``: predict (and measure) K and Q as llama.cpp does
    when it Hadamard-rotates them for a quantized cache (head_dim a multiple of 64; False: plain blocks; None:
    as llama.cpp would in this environment, ``LLAMA_ATTN_ROT_DISABLE``); ``turn``: also turn the
    bias-dominated rotary pairs of q and k (:mod:`ckpt_surgeon.surgery.kv_turn`; static choice only);
    ``scales``: ``"pow2"`` (the default of the static choice: exact in the weights' own dtype, computed on their
    bits) or ``"continuous"`` (float64 then one rounding; the default with ``calibrate``).  ``min_gain``: a layer
    whose predicted K (V) error falls by less than this fraction keeps its weights (:mod:`.kv_guard`; 0: off).

    Streams through the atomic writer (input untouched, untouched tensors byte-identical, reread check);
    ``out``: a folder or ``.safetensors`` (HF sources), a ``.gguf`` file (GGUF sources).

    Returns:
        :class:`~ckpt_surgeon.surgery.kv_equalize.KvEqualizeReport`

    Example::

        import ckpt_surgeon
        rep = ckpt_surgeon.kv_equalize("Qwen2.5-7B", "qwen-eq", cache_type_k="q4_0", cache_type_v="q8_0")
        rep.layers[0].k_before, rep.layers[0].k_after, rep.improvement("k")
    """
    from ..checkpoint import open_checkpoint
    from .plan import plan_while_copying

    KC.parse_cache_types(cache_type_k, path=str(source))
    _pow2_mode(scales, True if calibrate else None, str(source))
    if cache_type_v:
        KC.parse_cache_types(cache_type_v, path=str(source))
    from ..analysis.kv_rot import resolve
    attn_rot = resolve(attn_rot)
    calibration = None
    if calibrate:
        from .kv_calibrate import check_types, collect
        check_types(KC.parse_cache_types(cache_type_k, path=str(source)), str(source))
        calibration = collect(source, prompts=prompts, max_tokens=max_tokens, rows=rows, device=device,
                              attn_rot=attn_rot)
    with open_checkpoint(source, **open_kw) as ck:
        if str(out).endswith(".gguf") != (ck.naming == "gguf"):
            raise CkptError("kv-equalize writes the source's own format: a .gguf OUT for a GGUF source, a folder "
                            "or .safetensors for an HF source (convert before or after)", path=str(out))
        make = lambda: plan_kv_equalize(ck, cache_type_k=cache_type_k, cache_type_v=cache_type_v,  # noqa: E731
                                        context=context, calibration=calibration, attn_rot=attn_rot, turn=turn,
                                        scales=scales, min_gain=min_gain)
        if dry_run:
            return KvEqualizeReport(make(), None)
        # values-only changes: the writer's kernel copy of the shards runs while the scales are chosen (as
        # fold-bias --approximate does); a refusal while planning cancels it and leaves nothing at OUT
        result = plan_while_copying(ck, out, make, force=force, check=check, progress=open_kw.get("progress", False))
    return KvEqualizeReport(result.plan, result.out, result.write)
