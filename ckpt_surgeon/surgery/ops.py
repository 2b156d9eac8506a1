"""Pure tensor operations of the surgery, each with the identity it preserves.

Conventions: numpy arrays; a projection weight is ``[out, in]`` (``nn.Linear``) unless said
otherwise (GPT-2 ``Conv1D`` stores ``[in, out]``); heads are laid out head-major along the output
axis (``[n_heads * head_dim]``: head h owns rows ``h*d .. h*d+d-1``).  Value-changing functions
work in float64 and return float64 (the writer casts back once); layout functions are pure
gathers/scatters and keep dtype and bits (they also work on raw byte views).

Looping over layers, choosing which rows to touch and naming tensors live in
:mod:`ckpt_surgeon.surgery.plan`; these functions know nothing of models.
"""
from __future__ import annotations

import numpy as np

from ..arch.layouts import qkv_row_index


def expand_kv(b: np.ndarray, n_heads: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    """``[n_kv*d] -> [n_heads*d]``: query head h reads kv head ``h // (n_heads / n_kv_heads)``.

    This is the GQA grouping of transformers' ``repeat_kv`` (modeling_llama) and of Falcon's
    grouped layout: consecutive query heads share one kv head.
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    g = n_heads // n_kv_heads
    return np.repeat(np.asarray(b).reshape(n_kv_heads, 1, head_dim), g, axis=1).reshape(n_heads * head_dim)


def fold_v_bias(b_o: np.ndarray, w_o: np.ndarray, b_v: np.ndarray, n_heads: int, n_kv_heads: int,
                head_dim: int, *, w_o_in_out: bool = False) -> np.ndarray:
    """New output bias ``b_o' = b_o + W_o · expand(b_v)``; afterwards ``b_v`` can be zeroed.

    Identity: every attention row sums to 1 (softmax, no sinks), so a head's output is
    ``Σ_n p_mn (W_v x_n + b_v) = Σ_n p_mn W_v x_n + b_v``; the constant ``b_v`` passes through
    the output projection as ``W_o b_v``, which the output bias absorbs (TransformerLens:
    ``b_O' = b_O + Σ_h b_V[h] W_O[h]``).  Shapes: ``b_o [hidden]``, ``w_o [hidden, n_heads*d]``
    (``[n_heads*d, hidden]`` with ``w_o_in_out`` for Conv1D), ``b_v [n_kv*d]`` -> ``[hidden]``.
    """
    bv = expand_kv(np.asarray(b_v, dtype=np.float64), n_heads, n_kv_heads, head_dim)
    w = np.asarray(w_o, dtype=np.float64)
    contrib = bv @ w if w_o_in_out else w @ bv
    return np.asarray(b_o, dtype=np.float64) + contrib


def center(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """``x`` minus its mean along ``axis`` (the hidden-size axis it writes into the stream), float64.

    Identity: LayerNorm subtracts the mean over features, ``LN(h + c·1) = LN(h)``.  A bias
    ``b [hidden]`` added into the residual stream contributes ``b - mean(b)·1`` to what every
    centering reader sees; a writing weight ``W [hidden, in]`` (axis 0; Conv1D ``[in, hidden]`` and
    embedding tables ``[rows, hidden]``: axis -1) writes ``W a``, whose mean over features is
    ``mean_cols(W) a``: subtracting each column's mean removes exactly that (TransformerLens
    ``center_writing_weights``).  Exact only when every reader of the stream is a centering norm.
    """
    v = np.asarray(x, dtype=np.float64)
    return v - v.mean(axis=axis, keepdims=True)


def zero_rows(b: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``b`` with ``b[rows] = 0`` (float64 copy).  Shapes: ``b [n]``, ``rows`` int indices into it."""
    out = np.array(b, dtype=np.float64)
    out[np.asarray(rows, dtype=np.int64)] = 0.0
    return out


def k_bias_exact_mask(n_kv_heads: int, head_dim: int, rotary_dim: int | None) -> np.ndarray:
    """Bool mask ``[n_kv*d]`` of the key-bias components that are exactly redundant.

    Identity: the bias adds ``q_m · b`` to the logit of key n.  Without rotary (``rotary_dim``
    None: absolute, learned, ALiBi or no positions) that term is constant over the keys n, and
    softmax is shift-invariant, so all of ``b_k`` can go.  Under partial rotary, dims
    ``>= rotary_dim`` of each head pass through unrotated (modeling_gpt_neox / modeling_phi:
    ``k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]``), so exactly those components
    are constant over n and can go; the rotated ones give ``q̃_mᵀ R_{n-m} b`` and cannot.
    """
    dims = np.arange(head_dim)
    per_head = np.ones(head_dim, dtype=bool) if rotary_dim is None else dims >= rotary_dim
    return np.tile(per_head, n_kv_heads)


def k_bias_pair_mask(n_kv_heads: int, head_dim: int, pairs: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Bool mask ``[n_kv*d]`` covering both dims of each selected rotary pair.

    ``pairs [P, 2]`` are within-head dim indices of the rotary pairs (see
    :func:`ckpt_surgeon.arch.layouts.rotary_pairs`); ``selected [n_kv, P]`` says which pair of
    which kv head is removed.  Removing pair j of a kv head changes each logit by
    ``q̃_jᵀ (R_j(n-m) - I) b_j`` beyond a constant shift, at most ``|q̃_j||b_j|·min(2, θ_j L)``
    (the analyzer's bound; whole pairs, since a rotation mixes the two dims).
    """
    mask = np.zeros((n_kv_heads, head_dim), dtype=bool)
    sel = np.asarray(selected, dtype=bool)
    for j, (a, b) in enumerate(np.asarray(pairs)):
        mask[sel[:, j], a] = True
        mask[sel[:, j], b] = True
    return mask.reshape(-1)


def drop_k_bias(b: np.ndarray, k_rows: np.ndarray, remove: np.ndarray) -> np.ndarray:
    """Zero the key-bias components ``remove`` (bool ``[n_kv*d]``) found at ``k_rows`` of ``b``.

    ``b`` is a separate ``k_proj`` bias (``k_rows = arange``) or a fused qkv bias (``k_rows``
    from :func:`qkv_row_index`).  Exact for the components chosen by :func:`k_bias_exact_mask`;
    within the analyzer's bound for those of :func:`k_bias_pair_mask`.
    """
    return zero_rows(b, np.asarray(k_rows)[np.asarray(remove, dtype=bool)])


def fuse_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: str, n_heads: int, n_kv_heads: int,
             head_dim: int, *, axis: int = 0) -> np.ndarray:
    """Scatter q ``[h*d, ...]``, k, v ``[kv*d, ...]`` into one fused tensor ``[(h+2kv)*d, ...]``.

    Identity: ``split_qkv(fuse_qkv(q, k, v)) == (q, k, v)`` bit for bit (pure index moves; no
    arithmetic), for every layout of :func:`ckpt_surgeon.arch.layouts.qkv_row_index`.  ``axis`` is
    the output-feature axis (``-1`` for Conv1D ``[in, out]`` weights).  Keeps the dtype.
    """
    iq, ik, iv = qkv_row_index(layout, n_heads, n_kv_heads, head_dim)
    q, k, v = (np.moveaxis(np.asarray(t), axis, 0) for t in (q, k, v))
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q/k/v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    out = np.empty((len(iq) + len(ik) + len(iv),) + q.shape[1:], dtype=q.dtype)
    out[iq], out[ik], out[iv] = q, k, v
    return np.moveaxis(out, 0, axis)


def split_qkv(fused: np.ndarray, layout: str, n_heads: int, n_kv_heads: int, head_dim: int, *,
              axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gather q ``[h*d, ...]``, k, v ``[kv*d, ...]`` (HF head-major order) out of a fused tensor.

    Identity: ``fuse_qkv(*split_qkv(x)) == x`` bit for bit when ``x`` has ``(h+2kv)*d`` rows along
    ``axis``; the projections computed from the parts equal the fused projection's slices.
    """
    f = np.moveaxis(np.asarray(fused), axis, 0)
    iq, ik, iv = qkv_row_index(layout, n_heads, n_kv_heads, head_dim)
    if f.shape[0] != len(iq) + len(ik) + len(iv):
        raise ValueError(f"fused tensor has {f.shape[0]} rows on axis {axis}, layout needs {len(iq) + len(ik) + len(iv)}")
    return tuple(np.ascontiguousarray(np.moveaxis(f[i], 0, axis)) for i in (iq, ik, iv))


def split_halves(w: np.ndarray, *, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``[2n, ...] -> ([n, ...], [n, ...])``: first half, second half along ``axis``.

    Phi-3's ``gate_up_proj`` (modeling_phi3 ``Phi3MLP``: ``gate, up = gate_up_proj(x).chunk(2, -1)``)
    becomes Llama's ``gate_proj`` (first half of the rows) and ``up_proj`` (second half), so
    ``down(act(gate(x)) * up(x))`` is computed from the same numbers.  Bit-exact.
    """
    w = np.asarray(w)
    n = w.shape[axis]
    if n % 2:
        raise ValueError(f"cannot halve {n} rows")
    a, b = np.split(w, 2, axis=axis)
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


def fuse_halves(a: np.ndarray, b: np.ndarray, *, axis: int = 0) -> np.ndarray:
    """Inverse of :func:`split_halves`: ``concatenate([a, b], axis)``.  Bit-exact."""
    return np.concatenate([np.asarray(a), np.asarray(b)], axis=axis)


def raw_rows(buf: bytes, shape: tuple, itemsize: int) -> np.ndarray:
    """Raw tensor bytes as an integer array of ``shape`` (one unsigned int per element).

    Lets the layout functions move elements of any float dtype (BF16, F16, F32 ...) without
    converting them: what is gathered is the bit pattern itself.
    """
    unit = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    return np.frombuffer(buf, dtype=np.dtype(unit).newbyteorder("<")).reshape(shape)


def scale_axis(x: np.ndarray, scale: np.ndarray, axis: int = 0, offset: float = 0.0, turn=None) -> np.ndarray:
    """``(x + offset) * scale - offset`` with ``scale`` broadcast along ``axis`` (float64), then, with ``turn``
    (``(a, b, angle)`` index arrays along ``axis``), each pair of slices turned by its angle:
    ``x_a' = cos x_a - sin x_b``, ``x_b' = sin x_a + cos x_b``.

    Used by ``kv-equalize`` (:mod:`ckpt_surgeon.surgery.kv_equalize`) for three exact identities:

    * rotary pair j of every query head in a kv group times ``alpha_j``, the same pair of the kv
      head's key times ``1 / alpha_j``: rows of ``W_q``/``b_q`` and ``W_k``/``b_k`` (axis 0 of ``[out, in]``),
      or the q/k-norm weights when a norm follows the projection (``offset`` = the stored weight's
      offset, Gemma's ``1 + w``).  ``q_m^T R_(n-m) k_n`` is unchanged because a scalar on a 2-D
      rotation plane commutes with the rotation, for every rope type and scaling; a pass-through dim
      takes its own scale on the same grounds without a rotation;
    * the same pair of q and k both turned by one fixed angle ``phi_j`` (``turn``): 2-D rotations commute,
      so ``(R_phi q)^T R_(n-m) (R_phi k) = q^T R_phi^T R_phi R_(n-m) k = q^T R_(n-m) k``;
    * a value dim times ``m_i`` (``W_v``/``b_v`` rows) and the matching ``W_o`` columns (axis 1, or axis 0
      of a Conv1D ``[in, out]``) times ``1 / m_i``: ``W_o diag(1/m) diag(m) v = W_o v``.
    Shapes: ``x [n, ...]`` (or ``[..., n]`` on the last axis), ``scale [n]``.
    """
    v = np.asarray(x, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    ax = axis % v.ndim
    if v.shape[ax] != s.shape[0]:
        raise ValueError(f"scale has {s.shape[0]} entries, axis {axis} has {v.shape[ax]}")
    shape = [1] * v.ndim
    shape[ax] = s.shape[0]
    out = (v + offset) * s.reshape(shape) - offset
    if turn is None:
        return out
    ia, ib, ang = (np.asarray(t) for t in turn)
    out = np.moveaxis(out, ax, 0)
    c = np.cos(ang.astype(np.float64)).reshape((-1,) + (1,) * (out.ndim - 1))
    sn = np.sin(ang.astype(np.float64)).reshape(c.shape)
    xa, xb = out[ia.astype(np.int64)].copy(), out[ib.astype(np.int64)].copy()
    out[ia.astype(np.int64)], out[ib.astype(np.int64)] = c * xa - sn * xb, sn * xa + c * xb
    return np.moveaxis(out, 0, ax)


# (total bits, mantissa bits, exponent bits) of the float dtypes scale_pow2_bits works on
_POW2_FORMATS = {"BF16": (16, 7, 8), "F16": (16, 10, 5), "F32": (32, 23, 8)}
POW2_DTYPES = tuple(_POW2_FORMATS)
POW2_CHUNK = 1 << 20          # elements per pass (the temporaries stay small)


def scale_pow2_bits(raw, dtype: str, shape: tuple, exps: np.ndarray, axis: int = 0) -> bytes | None:
    """``x * 2^exps`` (``exps`` integers broadcast along ``axis``) computed on the stored bit patterns of a
    BF16 / F16 / F32 tensor: each nonzero element's exponent field moves by its ``exps`` entry, a zero stays
    (signed) zero, so the result is the exact product, no rounding at all (the same bits as
    ``cast_to_dtype(x * 2.0**exps)``).  None (nothing computed) when that does not hold for some element: an
    input subnormal, inf or NaN, or a product that would leave the normal range (overflow to inf, underflow to
    a subnormal or zero); the caller then rounds the float64 product once (:func:`scale_axis`).
    Shapes: ``raw`` the tensor's little-endian bytes of ``shape``; ``exps [shape[axis]]``."""
    if dtype not in _POW2_FORMATS:
        return None
    bits, man, ebits = _POW2_FORMATS[dtype]
    unit = np.dtype(np.uint16 if bits == 16 else np.uint32).newbyteorder("<")
    ax = axis % len(shape)
    n, post = int(shape[ax]), int(np.prod(shape[ax + 1:], dtype=np.int64))
    k = np.asarray(exps, dtype=np.int64)
    if k.shape[0] != n:
        raise ValueError(f"scale has {k.shape[0]} entries, axis {axis} has {n}")
    # rows of the tensor in its own layout: [pre * n, post] (one scale per row) or, on the last axis, [pre, n]
    u = np.frombuffer(raw, dtype=unit).reshape((-1, post) if post > 1 else (-1, n))
    if post > 1:
        k = np.tile(k, u.shape[0] // n)[:, None]
    top = (1 << ebits) - 1                                       # the inf/NaN exponent
    lo = (np.maximum(1, 1 - k) << man).astype(unit)              # smallest magnitude allowed (normal, stays normal)
    span = (((top - np.maximum(k, 0)) << man) - lo.astype(np.int64)).astype(unit)   # hi - lo, hi exclusive
    delta = ((k << man) % (1 << bits)).astype(unit)              # the exponent move, two's complement
    mask = unit.type((1 << (bits - 1)) - 1)
    out = np.empty(u.shape, dtype=unit)
    step = max(1, POW2_CHUNK // u.shape[1])
    for i in range(0, u.shape[0], step):
        x = u[i:i + step]
        sl = slice(i, i + step) if post > 1 else slice(None)
        m = x & mask
        nz = m != 0
        m -= lo[sl]                              # wraps below lo: out of range on either side
        if np.any((m >= span[sl]) & nz):
            return None
        np.add(x, delta[sl] * nz, out=out[i:i + step])
    return out.tobytes()
