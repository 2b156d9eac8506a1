"""Pure surgery ops: the identities their docstrings state, checked numerically and bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_surgeon.arch.layouts import qkv_row_index
from ckpt_surgeon.formats.write.writer import cast_to_dtype
from ckpt_surgeon.surgery import ops


@st.composite
def heads(draw, layout=None):
    layout = layout or draw(st.sampled_from(["concat", "per_head", "grouped"]))
    kv = draw(st.integers(1, 4))
    h = kv if layout == "per_head" else kv * draw(st.integers(1, 4))
    d = draw(st.integers(1, 8))
    return layout, h, kv, d


@settings(max_examples=150, deadline=None)
@given(heads(), st.integers(0, 3), st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_split_fuse_roundtrip_bit_exact(hd, trailing, unit, last_axis, seed):
    """split(fuse(q, k, v)) == (q, k, v) and fuse(split(x)) == x, bit for bit, on raw bit patterns
    (any float dtype's bits: NaN payloads, -0.0 and subnormals included), for every layout, GQA,
    the row axis first or last (Conv1D)."""
    layout, h, kv, d = hd
    rng = np.random.default_rng(seed)
    info = np.iinfo(unit)
    extra = (trailing,) if trailing else ()

    def rand(rows):
        shape = (rows,) + extra
        a = rng.integers(0, info.max, size=shape, dtype=unit, endpoint=True)
        return np.moveaxis(a, 0, -1) if last_axis else a

    axis = -1 if last_axis else 0
    q, k, v = rand(h * d), rand(kv * d), rand(kv * d)
    fused = ops.fuse_qkv(q, k, v, layout, h, kv, d, axis=axis)
    assert fused.shape[axis] == (h + 2 * kv) * d and fused.dtype == unit
    q2, k2, v2 = ops.split_qkv(fused, layout, h, kv, d, axis=axis)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
    x = rand((h + 2 * kv) * d)
    assert ops.fuse_qkv(*ops.split_qkv(x, layout, h, kv, d, axis=axis), layout, h, kv, d, axis=axis).tobytes() == x.tobytes()


def test_split_matches_the_layout_definitions():
    """Per-head [h, 3, d] and grouped [kv, g + 2, d] as the transformers modeling files reshape them."""
    h, kv, d = 4, 2, 3
    x = np.arange((h + 2 * kv) * d)
    q, k, v = ops.split_qkv(x, "grouped", h, kv, d)
    grid = x.reshape(kv, h // kv + 2, d)     # modeling_falcon _split_heads (new_decoder_architecture)
    assert (q == grid[:, :-2].reshape(-1)).all() and (k == grid[:, -2].reshape(-1)).all() and (v == grid[:, -1].reshape(-1)).all()
    y = np.arange(3 * h * d)
    q, k, v = ops.split_qkv(y, "per_head", h, h, d)
    grid = y.reshape(h, 3, d)                # modeling_gpt_neox: view(..., h, 3 * d).chunk(3, -1)
    assert (q == grid[:, 0].reshape(-1)).all() and (v == grid[:, 2].reshape(-1)).all()


def test_expand_kv_matches_transformers_repeat_kv():
    from transformers.models.llama.modeling_llama import repeat_kv

    h, kv, d = 6, 2, 4
    b = np.random.default_rng(0).standard_normal(kv * d)
    ref = repeat_kv(torch.tensor(b).reshape(1, kv, 1, d), h // kv).reshape(-1).numpy()
    assert np.array_equal(ops.expand_kv(b, h, kv, d), ref)


@pytest.mark.parametrize("h,kv,conv1d", [(4, 4, False), (4, 2, False), (6, 1, False), (4, 4, True)])
def test_fold_v_bias_identity(h, kv, conv1d):
    """Attention with b_v and b_o == attention with b_v = 0 and b_o' = b_o + W_o·expand(b_v), for any
    row-stochastic attention (float64, so only rounding of the order 1e-15 remains)."""
    rng = np.random.default_rng(1)
    d, hidden, n = 5, 7, 9
    x = rng.standard_normal((n, hidden))
    w_v = rng.standard_normal((kv * d, hidden))
    b_v = rng.standard_normal(kv * d)
    w_o = rng.standard_normal((hidden, h * d))
    b_o = rng.standard_normal(hidden)
    logits = rng.standard_normal((h, n, n))
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)          # rows sum to 1

    def attn(bv, bo):
        vals = (x @ w_v.T + bv).reshape(n, kv, d)
        out = np.concatenate([p[i] @ vals[:, i // (h // kv)] for i in range(h)], axis=-1)   # [n, h*d]
        return out @ w_o.T + bo

    w_stored = w_o.T if conv1d else w_o        # Conv1D stores [in, out]
    b_o2 = ops.fold_v_bias(b_o, w_stored, b_v, h, kv, d, w_o_in_out=conv1d)
    assert np.allclose(attn(b_v, b_o), attn(np.zeros_like(b_v), b_o2), rtol=0, atol=1e-12)


def test_k_bias_masks():
    m = ops.k_bias_exact_mask(2, 8, 4)        # partial rotary: dims 4..7 of each head pass through
    assert m.tolist() == ([False] * 4 + [True] * 4) * 2
    assert ops.k_bias_exact_mask(2, 8, None).all()
    pairs = np.array([[0, 2], [1, 3]])         # rotate_half pairs of rotary_dim 4
    sel = np.array([[False, True], [True, False]])
    pm = ops.k_bias_pair_mask(2, 8, pairs, sel)
    assert np.flatnonzero(pm).tolist() == [1, 3, 8, 10]


def test_drop_k_bias_zeroes_exactly_the_chosen_rows():
    b = np.arange(1.0, 13.0)
    _, k_rows, _ = qkv_row_index("concat", 2, 1, 2)       # fused [Q(4); K(2); V(2)] ... of 8 rows
    b8 = b[:8]
    out = ops.drop_k_bias(b8, k_rows, np.array([True, False]))
    assert out.tolist() == [1, 2, 3, 4, 0, 6, 7, 8]


def test_split_halves_roundtrip():
    w = np.arange(24, dtype=np.uint16).reshape(6, 4)
    a, b = ops.split_halves(w)
    assert (a == w[:3]).all() and (b == w[3:]).all()
    assert ops.fuse_halves(a, b).tobytes() == w.tobytes()
    with pytest.raises(ValueError):
        ops.split_halves(np.zeros((3, 2)))


# -- casting back once -----------------------------------------------------------------------

def _bf16_rne_reference(x: float) -> int:
    """bfloat16 bits of float64 x, by exact comparison of the two bfloat16 neighbours (normal range)."""
    u = np.array([x], dtype=np.float64).view(np.uint64)[0]
    lo = int(u) & ~((1 << 45) - 1)
    hi = lo + (1 << 45)
    flo = np.array([lo], dtype=np.uint64).view(np.float64)[0]
    fhi = np.array([hi], dtype=np.uint64).view(np.float64)[0]
    dlo, dhi = abs(x - flo), abs(fhi - x)        # exact (Sterbenz: neighbours within a factor 2)
    pick = lo if dlo < dhi else hi if dhi < dlo else (lo if not (lo >> 45) & 1 else hi)
    f = np.array([pick], dtype=np.uint64).view(np.float64)[0]
    return int(np.array([f], dtype=np.float32).view(np.uint32)[0] >> 16)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False).filter(lambda v: v == 0 or abs(v) > 1e-30))
def test_bf16_cast_is_one_round_to_nearest_even(x):
    got = int(np.frombuffer(cast_to_dtype(np.array([x]), "BF16"), dtype="<u2")[0])
    if x == 0:
        assert got in (0, 0x8000)
    else:
        assert got == _bf16_rne_reference(x)


def test_bf16_cast_avoids_double_rounding():
    """1 + 2^-8 + 2^-30 lies just above the tie between 1 and 1 + 2^-7: rounding through float32
    first lands exactly on the tie and then goes to even (1.0); one rounding gives 1 + 2^-7."""
    x = 1 + 2.0 ** -8 + 2.0 ** -30
    import ml_dtypes
    via_f32 = np.float32(x).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert int(via_f32) == 0x3F80                                   # 1.0: the double-rounding answer
    got = int(np.frombuffer(cast_to_dtype(np.array([x]), "BF16"), dtype="<u2")[0])
    assert got == 0x3F81                                            # 1.0078125


def test_cast_f16_f32_and_refusals():
    x = np.array([0.1, -2.5, 65504.0, 1e-8])
    assert cast_to_dtype(x, "F32") == x.astype("<f4").tobytes()
    assert cast_to_dtype(x, "F16") == x.astype("<f2").tobytes()
    with pytest.raises(TypeError):
        cast_to_dtype(np.array([1.5]), "I32")
