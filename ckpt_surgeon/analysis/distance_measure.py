"""Measured distance profile (``analyze --distance-profile --measure``): run the model and split
the mean attention logit at each distance into Su's terms (kexue.fm/archives/9577).

Per layer, query head ``h`` and kv head ``g``, over the prompts with the first ``K`` tokens of
each skipped (``--skip-first``: attention sinks / BOS tokens have outlying projections), with
``q~``, ``k~`` the pre-RoPE projections (bias included), ``z_j`` their rotary pairs as complex
numbers (:mod:`.distance_profile`) and ``P_Δ`` the query/key pairs ``(m, n = m - Δ)`` with
``n >= K``:

* ``μ_q``, ``μ_k``: the mean of ``q~``, ``k~`` over every token ``t >= K``; ``c_q = μ_q - b_q``,
  ``c_k = μ_k - b_k`` the mean *content*.  ``f_μ(Δ) = s a^2 Σ_j Re(z_j(μ_q) conj z_j(μ_k) e^{iΔθ_j})
  + s <μ_q,pass, μ_k,pass>`` is bilinear, so it splits exactly into bias·bias (the static
  ``f_b``), bias_q·content_k, content_q·bias_k and content·content: what removing ``b_q`` or
  ``b_k`` would take away from the mean logit.  Defined at every distance.
* ``f_Γ(Δ)``: the same with ``Γ_j(Δ) = mean_{P_Δ} (z_j(q~_m) - z_j(μ_q)) conj (z_j(k~_n) - z_j(μ_k))``,
  the covariance about the global means: measured only up to the longest prompt.
* ``drift(Δ)``: ``μ_q conj(k̄_Δ - μ_k) + (q̄_Δ - μ_q) conj μ_k`` with ``q̄_Δ``, ``k̄_Δ`` the means over
  ``P_Δ`` only: zero for stationary sequences, small in practice, and what makes the parts add up.
* the measured mean logit at ``Δ`` over ``P_Δ`` (from the logits as they enter softmax, captured
  as in :mod:`.measure`) with its standard error (naive: pairs taken as independent), and the
  worst ``|mean logit - (f_μ + f_Γ + drift)|`` (``residual``).

``f_μ + f_Γ + drift`` equals the mean logit exactly in exact arithmetic.  transformers computes
the rotary angles ``p θ_j`` and their cos / sin in float32 whatever the model dtype
(``Qwen2RotaryEmbedding.forward``), so ``residual`` is at float32 rounding of the angles
(~1e-7 relative at short range); with float64 angles it is float64 rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pathlib import Path

import numpy as np

from ..arch.layouts import qkv_row_index, rotary_pairs
from ..arch.rope_frequencies import rope_frequencies
from ..errors import CkptError, UnsupportedError
from ..records import finite_or_none as _f
from ..runtime import resolve_device
from . import measure as M
from .distance_profile import DistanceProfile, complex_pairs, pass_dims, profile_values
from .layer_redundancy import attention_scale
from .redundancy import _query_part, layer_vectors

DEFAULT_SKIP_FIRST = 4


@dataclass(frozen=True, eq=False)
class MeanTerms:
    """``f_μ`` at the report's distances and its four parts (logit units)."""

    total: np.ndarray = field(repr=False)
    bias_bias: np.ndarray = field(repr=False)
    bias_content: np.ndarray = field(repr=False)     # b_q · content_k
    content_bias: np.ndarray = field(repr=False)     # content_q · b_k
    content_content: np.ndarray = field(repr=False)

    def series(self):
        yield "mean", self.total
        yield "mean_bias_bias", self.bias_bias
        yield "mean_bias_content", self.bias_content
        yield "mean_content_bias", self.content_bias
        yield "mean_content_content", self.content_content

    def to_dict(self) -> dict:
        return {k: [_f(x) for x in v] for k, v in (("f", self.total), ("bias_bias", self.bias_bias),
                                                     ("bias_content", self.bias_content),
                                                     ("content_bias", self.content_bias),
                                                     ("content_content", self.content_content))}


@dataclass(frozen=True, eq=False)
class CovTerm:
    """``f_Γ``, the drift, the measured mean logit and its standard error at the report's
    distances (NaN / null beyond ``max_delta``, the longest measured distance)."""

    f: np.ndarray = field(repr=False)
    drift: np.ndarray = field(repr=False)
    mean_logit: np.ndarray = field(repr=False)
    se: np.ndarray = field(repr=False)
    count: np.ndarray = field(repr=False)
    max_delta: int
    residual: float | None          # max |mean_logit - (f_mu + f + drift)| over measured distances
    parts: np.ndarray | None = field(default=None, repr=False)     # f_mu + f + drift

    def series(self):
        yield "cov", self.f
        yield "drift", self.drift
        yield "mean_logit", self.mean_logit
        yield "mean_logit_se", self.se
        yield "sum_of_parts", self.parts

    def to_dict(self) -> dict:
        return {"f": [_f(x) for x in self.f], "drift": [_f(x) for x in self.drift],
                "mean_logit": [_f(x) for x in self.mean_logit], "se": [_f(x) for x in self.se],
                "sum_of_parts": [_f(x) for x in self.parts],
                "count": [int(c) for c in self.count], "measured_up_to": self.max_delta,
                "residual": _f(self.residual)}


class _LayerAcc:
    """Running sums of one layer over the prompts (complex pair sums per grid distance)."""

    def __init__(self, H: int, G: int, hd: int, P: int, npass: int, nd: int):
        self.sq = np.zeros((H, hd))
        self.sk = np.zeros((G, hd))
        self.n = 0
        self.a = np.zeros((nd, H, P), complex)        # Σ z(q_m) conj z(k_n) over P_Δ
        self.ap = np.zeros((nd, H))                   # Σ <q_m,pass, k_n,pass>
        self.qs = np.zeros((nd, H, P), complex)       # Σ z(q_m)
        self.qp = np.zeros((nd, H, npass))
        self.ks = np.zeros((nd, G, P), complex)       # Σ z(k_n)
        self.kp = np.zeros((nd, G, npass))
        self.c = np.zeros(nd)                          # |P_Δ|
        self.ls = np.zeros((nd, H))                    # Σ logit, Σ logit^2, count (masked keys left out)
        self.l2 = np.zeros((nd, H))
        self.lc = np.zeros((nd, H))


@dataclass
class _Run:
    layout: object
    pairs: np.ndarray
    pdims: np.ndarray
    group: int
    deltas: np.ndarray                # the report's distances (ints)
    skip: int
    accs: dict                        # layer -> _LayerAcc
    q_rows: dict                      # layer -> row selector of the query part (None: all rows)
    cur_q: dict = field(default_factory=dict)


def _split_qk(run: _Run, lt, out: np.ndarray, role: str) -> np.ndarray:
    """The q or k rows of a projection output ``[T, rows]`` (fused qkv / gated q resolved)."""
    lay = run.layout
    H, G, hd = lay.num_heads, lay.num_kv_heads, lay.head_dim
    if lt.qkv_weight and not (lt.q_weight if role == "q" else lt.k_weight):
        iq, ik, _ = qkv_row_index(lay.fused_layout or "concat", H, G, hd)
        return out[:, iq if role == "q" else ik]
    if role == "q" and lay.q_gate:
        return _query_part(lay, out.T).T
    return out


def _accumulate_qk(run: _Run, layer: int, q: np.ndarray, k: np.ndarray) -> None:
    """Add one prompt's pre-RoPE ``q~`` ``[T, H*hd]`` and ``k~`` ``[T, G*hd]`` of ``layer``."""
    lay = run.layout
    H, G, hd = lay.num_heads, lay.num_kv_heads, lay.head_dim
    acc = run.accs[layer]
    T = q.shape[0]
    K = run.skip
    qh, kh = q.reshape(T, H, hd), k.reshape(T, G, hd)
    acc.sq += qh[K:].sum(0)
    acc.sk += kh[K:].sum(0)
    acc.n += max(T - K, 0)
    zq = qh[:, :, run.pairs[:, 0]] + 1j * qh[:, :, run.pairs[:, 1]]          # [T, H, P]
    zk = kh[:, :, run.pairs[:, 0]] + 1j * kh[:, :, run.pairs[:, 1]]          # [T, G, P]
    kv_of = np.arange(H) // run.group
    qp, kp = qh[:, :, run.pdims], kh[:, :, run.pdims]
    for i, d in enumerate(run.deltas):
        d = int(d)
        if T - d - K <= 0:
            continue
        zm, zn = zq[K + d:], zk[K:T - d]                                     # m = n + Δ, n >= K
        acc.a[i] += (zm * np.conj(zn)[:, kv_of]).sum(0)
        acc.ap[i] += (qp[K + d:] * kp[K:T - d][:, kv_of]).sum((0, 2))
        acc.qs[i] += zm.sum(0)
        acc.ks[i] += zn.sum(0)
        acc.qp[i] += qp[K + d:].sum(0)
        acc.kp[i] += kp[K:T - d].sum(0)
        acc.c[i] += T - d - K


class _LogitReducer:
    """Stands in for :func:`.measure._capture_softmax`'s record: each layer's logits ``[1, H, T, T]``
    are reduced to per-distance sums at once (a 7B's full logits would not fit)."""

    def __init__(self, run: _Run, layers: list):
        self.run, self.layers = run, layers

    def __setitem__(self, i: int, x) -> None:
        import torch
        if i >= len(self.layers):
            return
        acc = self.run.accs.get(self.layers[i])
        if acc is None:
            return
        x = x.to("cpu", torch.float64)
        x = x.reshape(-1, x.shape[-2], x.shape[-1])                           # [H, T, T]
        T, K = x.shape[-1], self.run.skip
        for j, d in enumerate(self.run.deltas):
            d = int(d)
            if T - d - K <= 0:
                continue
            diag = torch.diagonal(x, offset=-d, dim1=-2, dim2=-1)[:, K:].numpy()   # (n + Δ, n), n >= K
            # a sliding window masks far keys (logit + finfo.min or -inf): they are not logits
            ok = diag > -1e30
            diag = np.where(ok, diag, 0.0)
            acc.ls[j] += diag.sum(1)
            acc.l2[j] += (diag ** 2).sum(1)
            acc.lc[j] += ok.sum(1)


def _projection_modules(model, lt):
    q = lt.q_weight or lt.qkv_weight
    k = lt.k_weight or lt.qkv_weight
    return M._module(model, q), M._module(model, k)


def _head_terms(acc: _LayerAcc, bq: np.ndarray, bk: np.ndarray, run: _Run, inv: np.ndarray, rot: float, s: float,
                deltas: np.ndarray):
    """``[(MeanTerms, CovTerm)]`` per query head from one layer's sums."""
    H = bq.shape[0]
    kv_of = np.arange(H) // run.group
    mu_q, mu_k = acc.sq / max(acc.n, 1), acc.sk / max(acc.n, 1)
    cq, ck = mu_q - bq, mu_k - bk
    p, pd = run.pairs, run.pdims

    def f(vq, vk):       # f_μ-style profile of two mean vectors at every report distance -> [H, D]
        h = complex_pairs(vq, p) * np.conj(complex_pairs(vk, p))[kv_of]
        const = s * (vq[:, pd] * vk[kv_of][:, pd]).sum(1)
        return profile_values(rot * h, const, inv, deltas, 1.0)
    bb, bc, cb, cc = f(bq, bk), f(bq, ck), f(cq, bk), f(cq, ck)
    total = f(mu_q, mu_k)
    zmq, zmk = complex_pairs(mu_q, p), complex_pairs(mu_k, p)[kv_of]          # [H, P]
    pmq, pmk = mu_q[:, pd], mu_k[kv_of][:, pd]
    nd = len(deltas)
    cov = np.full((H, nd), np.nan)
    drift = np.full((H, nd), np.nan)
    mean_l = np.full((H, nd), np.nan)
    se = np.full((H, nd), np.nan)
    ph = np.exp(1j * np.outer(deltas, inv))                                     # [D, P]
    for i in range(nd):
        c = acc.c[i]
        if c <= 0:
            continue
        m_ = acc.a[i] / c
        qbar, kbar = acc.qs[i] / c, (acc.ks[i] / c)[kv_of]
        qpb, kpb = acc.qp[i] / c, (acc.kp[i] / c)[kv_of]
        gam = m_ - zmq * np.conj(kbar) - qbar * np.conj(zmk) + zmq * np.conj(zmk)
        dr = zmq * np.conj(kbar - zmk) + (qbar - zmq) * np.conj(zmk)
        gam_p = acc.ap[i] / c - (pmq * kpb).sum(1) - (qpb * pmk).sum(1) + (pmq * pmk).sum(1)
        dr_p = (pmq * (kpb - pmk)).sum(1) + ((qpb - pmq) * pmk).sum(1)
        cov[:, i] = rot * (gam @ ph[i]).real + s * gam_p
        drift[:, i] = rot * (dr @ ph[i]).real + s * dr_p
        n_l = acc.lc[i]
        seen = n_l > 0
        mean_l[seen, i] = acc.ls[i][seen] / n_l[seen]
        var = np.maximum(acc.l2[i][seen] / n_l[seen] - mean_l[seen, i] ** 2, 0.0)
        se[seen, i] = np.sqrt(var / n_l[seen])
    measured = acc.c > 0
    max_delta = int(deltas[measured].max()) if measured.any() else 0
    out = []
    for h in range(H):
        parts = total[h] + cov[h] + drift[h]
        ok = measured & np.isfinite(mean_l[h])
        resid = float(np.abs(mean_l[h][ok] - parts[ok]).max()) if ok.any() else None
        out.append((MeanTerms(total[h], bb[h], bc[h], cb[h], cc[h]),
                    CovTerm(cov[h], drift[h], mean_l[h], se[h], acc.c.copy(), max_delta, resid, parts)))
    return out


def _to_numpy(out):
    """A projection's output ``[1, T, rows]`` (or a tuple holding it) -> float64 ``[T, rows]``."""
    import torch
    o = out[0] if isinstance(out, tuple) else out
    return o.detach().to("cpu", torch.float64).numpy().reshape(o.shape[-2], o.shape[-1])


def _register_hooks(model, run: _Run, lts: dict, profiled: list) -> list:
    """Forward hooks on the q / k projections (or the fused qkv) of the profiled layers: each
    prompt's pre-RoPE ``q~``, ``k~`` go straight into the layer's sums (q is held until k runs)."""
    def hook_for(lt, role):
        def fn(_m, _inp, out):
            arr = _split_qk(run, lt, _to_numpy(out), role)
            if role == "q":
                run.cur_q[lt.layer] = arr
                return
            q = run.cur_q.pop(lt.layer, None)
            if q is None:
                raise UnsupportedError("measured profile: the key projection ran before the query projection")
            _accumulate_qk(run, lt.layer, q, arr)
        return fn

    def fused_for(lt):
        def fn(_m, _inp, out):
            a = _to_numpy(out)
            _accumulate_qk(run, lt.layer, _split_qk(run, lt, a, "q"), _split_qk(run, lt, a, "k"))
        return fn
    hooks = []
    for li in profiled:
        qm, km = _projection_modules(model, lts[li])
        if qm is km:
            hooks.append(qm.register_forward_hook(fused_for(lts[li])))
        else:
            hooks.append(qm.register_forward_hook(hook_for(lts[li], "q")))
            hooks.append(km.register_forward_hook(hook_for(lts[li], "k")))
    return hooks


def _attach(static: DistanceProfile, run: _Run, view, rf, lts: dict) -> tuple:
    """The static profile's layers with each head's measured terms attached."""
    layout = run.layout
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    s = attention_scale(layout, view.config)
    layers = []
    for lp in static.layers:
        if not lp.heads:
            layers.append(lp)
            continue
        vecs = layer_vectors(view, layout, lts[lp.layer])
        terms = _head_terms(run.accs[lp.layer], vecs["q"].reshape(H, hd), vecs["k"].reshape(G, hd), run,
                            rf.inv_freq, s * rf.attention_factor ** 2, s, run.deltas.astype(np.float64))
        layers.append(replace(lp, heads=tuple(replace(h, mean=t[0], cov=t[1]) for h, t in zip(lp.heads, terms))))
    return tuple(layers)


def measure_profile(source, static: DistanceProfile, *, prompts=None, device: str = "auto", dtype: str = "float32",
                    max_tokens: int | None = None, skip_first: int = DEFAULT_SKIP_FIRST, model=None,
                    tokenizer=None, progress: bool | None = None) -> DistanceProfile:
    """Run ``source`` with transformers on ``prompts`` and attach the measured terms to the heads
    of ``static`` (a :class:`DistanceProfile` of the same model).  ``model`` / ``tokenizer``: an
    already loaded pair (tests); otherwise loaded as :func:`.measure.load_model` does.  ``progress``: the
    loading phase and a bar over the prompts on stderr (:mod:`ckpt_surgeon.progress`)."""
    from ..progress import phase, steps
    from .prompts import default_prompts

    if skip_first < 0:
        raise CkptError(f"--skip-first must be >= 0 (got {skip_first})")
    if not any(lp.heads for lp in static.layers):
        # nothing profiled (q/k-norm, no biases, not rotary): nothing to measure, and said so
        return replace(static, notes=tuple(static.notes) + ("--measure: no layer has a profile, nothing was measured",))
    dev = resolve_device(device)
    dq = None
    if model is None:
        dq = M.quantized_run(source)
        with phase(progress, f"loading {Path(str(source)).name} with transformers ({dtype}, {dev})"):
            model, tokenizer, _ = M.load_model(source, device=dev, dtype=dtype)
    else:
        dev = str(next(model.parameters()).device)
    view = M.model_checkpoint(model, str(source))
    layout = view.layout()
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    limit = min(max_tokens or M.DEFAULT_MAX_TOKENS, int(static.context))
    encoded = M._encode_prompts(tokenizer, list(default_prompts() if prompts is None else prompts), limit, dev)
    longest = max(int(e.shape[1]) for e in encoded)
    if longest <= skip_first + 1:
        raise CkptError(f"every prompt is shorter than --skip-first {skip_first} + 2 tokens: nothing to measure")
    rf = rope_frequencies(layout, view.config, length=longest)
    pairs = rotary_pairs(hd, rf.rotary_dim, layout.position.pair_layout or "rotate_half")
    profiled = [lp.layer for lp in static.layers if lp.heads]
    deltas = np.asarray(static.deltas, dtype=np.int64)
    run = _Run(layout, pairs, pass_dims(hd, pairs), H // G, deltas, int(skip_first),
               {i: _LayerAcc(H, G, hd, len(pairs), hd - 2 * len(pairs), len(deltas)) for i in profiled}, {})
    M._check_capture(model, encoded[0], layout.num_layers)
    lts = {lt.layer: lt for lt in layout.layers}
    hooks = _register_hooks(model, run, lts, profiled)
    try:
        red = _LogitReducer(run, list(range(layout.num_layers)))
        for ids in steps(progress, encoded, desc="distance profile", unit="prompt"):
            with M._capture_softmax(red):
                M._forward(model, ids)
    finally:
        for h in hooks:
            h.remove()
    facts = {"prompts": len(encoded), "tokens": sum(int(e.shape[1]) for e in encoded), "max_prompt_tokens": longest,
             "skip_first": int(skip_first), "device": dev, "dtype": dtype,
             "max_delta": int(max(0, longest - 1 - skip_first)), "rope_evaluated_at": rf.length,
             "attention_factor": rf.attention_factor,
             "quantization": dq.to_dict() if dq is not None else None}
    return replace(static, layers=_attach(static, run, view, rf, lts), measured=facts,
                   notes=_measured_notes(static, dq, rf))


def _measured_notes(static: DistanceProfile, dq, rf) -> tuple:
    """The static profile's notes and what the measured run adds (a quantized source, other rope settings)."""
    notes = list(static.notes)
    if dq is not None:
        notes.append(f"measured: {dq.note()}")
    if rf.length is not None and static.rope is not None and static.rope.length != rf.length:
        notes.append(f"measured terms use the rope frequencies at the prompt length {rf.length} "
                     f"(the static profile: at {static.rope.length})")
    if not math.isclose(rf.attention_factor, static.attention_factor or 1.0):
        notes.append("the loaded model's attention factor differs from the file's")
    return tuple(notes)
