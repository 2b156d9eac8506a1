"""``kv-equalize``'s pair turn: a fixed 2-D rotation of the bias-dominated rotary pairs of q and k (exact).

Why: llama.cpp multiplies Q and K by a Hadamard matrix before a quantized K cache (``attn_rot``,
:mod:`ckpt_surgeon.analysis.kv_rot`).  A key bias that dominates a few pairs is then spread over the whole
chunk, and every block's step follows the bias's rotated image ``H b``.  Scaling pairs (q x alpha, k /
alpha) can only trade the bias's energy against q's; the *shape* of ``H b`` (how large its largest entry
in each block of 32 is, and which blocks it reaches at all) depends on the direction of the bias inside
each pair plane, and that direction is free: turning pair j of q and of k by the same angle ``phi_j``
leaves every logit unchanged, because 2-D rotations commute with RoPE's rotation of that pair
(``(R_phi q)^T R_(n-m) (R_phi k) = q^T R_(n-m) k``; any rope type and scaling, both pair layouts).  With
a few bias pairs the turn can set the signs and mix of ``H b`` so its entries are flat (no block max far
above the block's RMS) or cancel in whole blocks.

How (static, from the weights and biases, the same prediction ``analyze --kv-cache`` makes, rotation
included): the pairs whose key bias dominates their content (mean^2 over the pair at least
:data:`DOMINANT` x its variance; at most :data:`TOP_PAIRS` per layer, the largest first) are swept by
coordinate descent, per kv head: each pair over :data:`ANGLES` angles in [0, 2 pi) and over the scale
``alpha x 2^(i/2)``, ``i = -4..4``; then a finer sweep (angle +- pi/16, +- pi/32; scale ``2^(+-1/4)``).  A
move is kept only if it lowers the predicted error, so the result is never predicted worse than the pair
scaling alone (on the search's positions: every :data:`SEARCH_STRIDE`-th of the prediction's, for speed).
Not used where a per-head q/k norm follows the projection (its weight is per dim, so a turn would not
commute with it), nor with ``--calibrate``, and only where llama.cpp rotates the K cache's blocks for every
target type: on plain blocks (``LLAMA_ATTN_ROT_DISABLE=1``) turns were predicted to help but measured worse
in llama.cpp (concentrated fixture, q4_0: mean KLD 0.040 -> 0.058), so kv-equalize keeps the pair scales
alone there.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..analysis import kv_cache as KC

DOMINANT = 16.0            # bias energy over content variance of a pair for the pair to be turned
TOP_PAIRS = 8              # pairs searched per layer (largest bias share first)
ANGLES = 12
BATCH_ELEMENTS = 1 << 17  # q elements scored in one batch (about 1 MB of float64 per array)
SEARCH_STRIDE = 4          # positions used by the search: every 4th of the prediction's (8 of 32)
FINE_ANGLES = (np.pi / 16, -np.pi / 16, np.pi / 32, -np.pi / 32)
COARSE_SCALES = tuple(2.0 ** (i / 2) for i in range(-4, 5) if i)
FINE_SCALES = (2.0 ** 0.25, 2.0 ** -0.25)
POW2_SCALES = (0.25, 0.5, 2.0, 4.0)   # COARSE_SCALES' whole powers of two (kv-equalize --scales pow2)


def dominant_pairs(st: KC.KvLayerStats, geom: KC.KvGeometry) -> list[int]:
    """Indices into ``geom.pairs`` of the pairs whose key bias dominates (largest first, at most TOP_PAIRS)."""
    if not len(geom.pairs):
        return []
    p = geom.pairs
    energy = (st.k_mean[:, p] ** 2).sum(-1)                  # [kv, P]
    var = st.k_var[:, p].sum(-1) + 1e-30
    score = (energy / var).max(0)
    order = np.argsort(-score)[:TOP_PAIRS]
    return [int(j) for j in order if score[j] >= DOMINANT]


class _Search:
    """The predicted cost per kv head (sum over types of (error / error at alpha = 1)^2) of (alpha, phi)."""

    def __init__(self, st, geom, types):
        # every SEARCH_STRIDE-th sampled position: the search's cost falls by that factor, the choice barely moves
        geom = replace(geom, angles=geom.angles[::SEARCH_STRIDE])
        self.st, self.geom = st, geom
        self.rot = (KC.rotate(st.k_mean, st.k_var, geom), KC.rotate(st.q_mean, st.q_var, geom))
        self.cts = [KC.CACHE_TYPES[t] for t in types]
        self.base = [np.where(e > 0, e, 1.0) for e in (KC.k_errors(st, geom, ct, self.rot)["error"]
                                                       for ct in self.cts)]

    def cost(self, alpha: np.ndarray, phi: np.ndarray) -> np.ndarray:
        rot = KC.transform_rotated(self.rot, alpha, *_active(phi, self.geom.pairs))
        return sum((KC.k_errors(self.st, self.geom, ct, rot)["error"] / b) ** 2 for ct, b in zip(self.cts, self.base))

    def costs(self, alphas: list, phis: list) -> list:
        """``[cost(a, phi) for a, phi in zip(alphas, phis)]`` in one evaluation (the same numbers: see
        :func:`batched_errors`)."""
        errs = batched_errors(self.st, self.geom, self.cts, self.rot, alphas, phis)
        if errs is None:
            return [self.cost(a, ph) for a, ph in zip(alphas, phis)]
        return [sum((e[i] / b) ** 2 for e, b in zip(errs, self.base)) for i in range(len(phis))]


def batched_errors(st, geom, cts, rot, alphas: list, phis: list | None = None):
    """Per cache type ``[len(alphas), kv]``: ``k_errors(...)["error"]`` of each ``(alpha, phi)`` candidate, all
    evaluated at once as extra kv heads of one layer (kv heads are independent in the model: blocks and Hadamard
    chunks lie within a head, reductions run per head, so the figures are the same bits as one call per
    candidate).  None where a type's per-tensor scale (fp8) couples the heads: call per candidate then."""
    if any(ct.rule == "fp8" for ct in cts):
        return None
    per = rot[1][0].size                               # q elements of one candidate (positions x heads x dims)
    step = max(1, BATCH_ELEMENTS // per)
    if len(alphas) > step:                             # large layers: batches gain nothing and cost memory
        parts = [batched_errors(st, geom, cts, rot, alphas[i:i + step], None if phis is None else phis[i:i + step])
                 for i in range(0, len(alphas), step)]
        return [np.concatenate([p[t] for p in parts]) for t in range(len(cts))]
    n, kv = len(alphas), st.k_mean.shape[0]
    (km, kvar), (qm, qvar) = rot
    tile = lambda x: np.concatenate([x] * n, axis=-2)       # noqa: E731 - candidate-major extra heads
    big = KC.KvLayerStats(st.layer, tile(st.q_mean), tile(st.q_var), tile(st.k_mean), tile(st.k_var),
                          None, None, None, st.q_sampled)
    phi, pairs = _active(None if phis is None else np.concatenate(phis, axis=0), geom.pairs)
    r = KC.transform_rotated(((tile(km), tile(kvar)), (tile(qm), tile(qvar))), np.concatenate(alphas, axis=0),
                             phi, pairs)
    return [KC.k_errors(big, geom, ct, r)["error"].reshape(n, kv) for ct in cts]


def head_errors(st, geom, cts, rot, alphas: list):
    """Per cache type ``[len(alphas), kv]``: what :func:`batched_errors` gives for ``alphas`` (no turns), with each
    distinct (kv head, alpha row) scored once.  Powers of two round many candidates to the same scales (at the
    Qwen2.5-7B shape 4-6 distinct rows of 68), and a kv head's figure depends on its own rows only: its blocks and
    Hadamard chunks lie within the head (``head_dim`` a multiple of every block), its reductions run per head or
    per element.  None where that does not hold (fp8's per-tensor scale, blocks across heads): call
    :func:`batched_errors` then."""
    kv, d = st.k_mean.shape
    blocks = [b for ct in cts for b in (ct.block, KC.CACHE_TYPES[ct.dot_type].block if ct.dot_type else None) if b]
    if any(ct.rule == "fp8" for ct in cts) or any(d % b for b in blocks):
        return None
    slot, heads, rows = {}, [], []
    where = np.empty((len(alphas), kv), dtype=np.int64)
    for c, a in enumerate(alphas):
        for i in range(kv):
            key = (i, a[i].tobytes())
            if key not in slot:
                slot[key] = len(heads)
                heads.append(i)
                rows.append(a[i])
            where[c, i] = slot[key]
    g = st.q_mean.shape[0] // kv
    step = max(1, BATCH_ELEMENTS // max(1, rot[1][0][:, :g].size))       # rows per evaluation, as batched_errors
    parts = [_rows_errors(st, cts, rot, geom, np.asarray(heads[i:i + step]), rows[i:i + step], g)
             for i in range(0, len(heads), step)]
    return [np.concatenate([p[t] for p in parts])[where] for t in range(len(cts))]


def _rows_errors(st, cts, rot, geom, heads: np.ndarray, rows: list, g: int) -> list:
    """Per type ``[len(heads)]``: the K error of kv head ``heads[r]`` with scales ``rows[r]``, each row an extra
    kv head of one evaluation (with its group's query heads)."""
    (km, kvar), (qm, qvar) = rot
    qi = (heads[:, None] * g + np.arange(g)).reshape(-1)
    sub = KC.KvLayerStats(st.layer, st.q_mean[qi], st.q_var[qi], st.k_mean[heads], st.k_var[heads], None, None, None,
                          st.q_sampled)
    # C order, as the tiled arrays of batched_errors: reductions follow the memory layout, and so do their bits
    take = lambda x, idx: np.ascontiguousarray(x[:, idx])       # noqa: E731
    r = KC.transform_rotated(((take(km, heads), take(kvar, heads)), (take(qm, qi), take(qvar, qi))), np.stack(rows))
    return [KC.k_errors(sub, geom, ct, r)["error"] for ct in cts]


def _active(phi, pairs):
    """``phi`` and ``pairs`` cut to the pairs some head turns (None: none): a turn by 0 leaves a pair's values as
    they are (cos 0 = 1, sin 0 = 0 exactly), so skipping it changes no figure, and most pairs are never turned."""
    if phi is None:
        return None, pairs
    act = np.flatnonzero(np.any(phi != 0, axis=0))
    return (phi[:, act], pairs[act]) if act.size else (None, pairs)


def _sweep(sr: _Search, alpha, phi, cur, j: int, angles, scales):
    """Try pair j at each (absolute) angle and scale multiplier; keep, per kv head, whatever lowers the cost.
    Returns (alpha, phi, cost)."""
    dims = sr.geom.pairs[j]
    phi, cur = _accept_angles(sr, alpha, phi, cur, j, [ang for ang in angles])
    alpha, cur = _accept_scales(sr, alpha, phi, cur, dims, scales)
    return alpha, phi, cur


def _accept_scales(sr: _Search, alpha, phi, cur, dims, scales):
    """Pair ``dims`` times each of ``scales`` in turn (relative to the scale then current), kept per kv head where
    it lowers the cost.  A candidate depends on the moves kept before it, so the remaining candidates are scored
    in one batch from the current scales and replayed in order up to the first move kept; the rest are scored
    again from there: the same choice as scoring them one by one."""
    i = 0
    while i < len(scales):
        cands = []
        for f in scales[i:]:
            a = alpha.copy()
            a[:, dims] = a[:, dims] * f
            cands.append(a)
        for a, c in zip(cands, sr.costs(cands, [phi] * len(cands))):
            i += 1
            better = c < cur - 1e-12
            alpha[:, dims] = np.where(better[:, None], a[:, dims], alpha[:, dims])
            cur = np.where(better, c, cur)
            if better.any():
                break
    return alpha, cur


def choose_turn(st: KC.KvLayerStats, geom: KC.KvGeometry, types, alpha: np.ndarray, pow2: bool = False):
    """``(alpha [kv, d], phi [kv, P])``: the pair scales refined and the pair turns chosen for the dominant
    pairs (see the module docstring); ``phi`` all zero (and ``alpha`` as given) when no pair dominates.
    ``pow2``: the scale steps are whole powers of two (:data:`POW2_SCALES`, no fine step), so a power-of-two
    ``alpha`` stays one."""
    kv = st.k_mean.shape[0]
    phi = np.zeros((kv, len(geom.pairs)))
    pairs = dominant_pairs(st, geom)
    if not pairs:
        return alpha, phi
    sr = _Search(st, geom, types)
    alpha = np.array(alpha, dtype=np.float64)
    cur = sr.cost(alpha, phi)
    coarse = tuple(2 * np.pi * i / ANGLES for i in range(1, ANGLES))
    for j in pairs:
        alpha, phi, cur = _sweep(sr, alpha, phi, cur, j, coarse, POW2_SCALES if pow2 else COARSE_SCALES)
    for j in pairs:
        alpha, phi, cur = _fine(sr, alpha, phi, cur, j, () if pow2 else FINE_SCALES)
    return alpha, phi


def _fine(sr: _Search, alpha, phi, cur, j: int, scales=FINE_SCALES):
    """The fine sweep of pair j: angles relative to each head's own, then ``scales`` (2^(+-1/4))."""
    base = phi[:, j].copy()
    phi, cur = _accept_angles(sr, alpha, phi, cur, j, [base + dlt for dlt in FINE_ANGLES])
    return _sweep(sr, alpha, phi, cur, j, (), scales)


def _accept_angles(sr: _Search, alpha, phi, cur, j: int, angles: list):
    """Pair j set to each of ``angles`` (absolute, a scalar or one per kv head) in turn, kept per kv head where it
    lowers the cost.  The candidates do not depend on each other (each sets the whole column j), so they are
    scored in one batch and the acceptances replayed in order: the same choice as scoring them one by one."""
    if not angles:
        return phi, cur
    phs = []
    for ang in angles:
        ph = phi.copy()
        ph[:, j] = ang
        phs.append(ph)
    for ph, c in zip(phs, sr.costs([alpha] * len(phs), phs)):
        better = c < cur - 1e-12
        phi[:, j] = np.where(better, ph[:, j], phi[:, j])
        cur = np.where(better, c, cur)
    return phi, cur
