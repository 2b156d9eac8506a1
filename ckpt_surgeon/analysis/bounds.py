"""Key-bias bounds: the math behind ``analyze``'s verdicts (numpy only: no records, no checkpoint).


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

Everything here is pure: arrays in, arrays out.  :mod:`.layer_redundancy` applies it to one layer's
vectors, :mod:`.redundancy` reads them from a checkpoint.
"""
from __future__ import annotations

import math

import numpy as np


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

    ``w_q`` may be float32 (what :func:`.redundancy.q_weight` returns for BF16/F16/F32 checkpoints, widened
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
