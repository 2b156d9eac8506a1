"""Static redundancy analysis (``ckpt-surgeon analyze`` without --measure): classes, energy split,
the sound logit bound, pair selection, inspect's ``k_bias_redundancy``, the CLI.

Expected values are computed here independently of ckpt_surgeon (raw safetensors reads, the
transformers modeling files' own conventions, ``np.linalg.norm(., 2)`` for spectral norms).
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from ckpt_surgeon import analyze, open_checkpoint
from ckpt_surgeon.analysis import bounds as B
from ckpt_surgeon.analysis import layer_redundancy as LR
from ckpt_surgeon.analysis import redundancy as R
from ckpt_surgeon.arch.layouts import llama_permute_index
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import CkptError


def _tensors(folder: Path) -> dict:
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return out


def _copy(tiny, name, tmp_path) -> Path:
    dst = tmp_path / name
    shutil.copytree(tiny(name), dst)
    return dst


def _edit_config(folder: Path, **changes) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


# ------------------------------------------------------------------------------------------------
# classes and energy split
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "bert", "bloom"])
def test_non_rotary_fixtures_are_exact(tiny, name):
    rep = analyze(tiny(name))
    assert rep.class_counts() == {"exact": rep.num_layers}
    assert len(rep.layers) == 2
    for lr in rep.layers:
        assert lr.k_class == "exact"
        assert lr.exact_fraction == 1.0 and lr.near_fraction == 0.0 and lr.rest_fraction == 0.0
        assert lr.bound == 0.0 and lr.bound_all == 0.0
        assert len(lr.exact_dims) == rep.num_kv_heads * rep.head_dim
        assert lr.v_bias.foldable is True          # all three have an output-projection bias
        # the fixtures' key biases are random (std 0.5): a trained non-rotary model would keep ~0
        assert any(f.startswith("suspicious-k-bias") for f in lr.flags)


def test_minilm_is_exact_and_its_trained_key_bias_is_not_suspicious(minilm_dir):
    rep = analyze(minilm_dir)
    assert rep.family == "bert" and rep.class_counts() == {"exact": 6}
    assert len(rep.layers) == 6
    for lr in rep.layers:
        assert lr.exact_fraction == 1.0 and lr.bound == 0.0
        assert lr.k_bias_l2 < 0.05 * lr.q_bias.l2     # no gradient: stays at its zero init
        assert not lr.flags
    assert any("post-norm" in n and "not an identity" in n for n in rep.notes)


def test_gpt_neox_partial_exact_fraction_is_the_pass_through_energy(tiny):
    folder = tiny("gpt_neox")
    cfg = json.loads((folder / "config.json").read_text())
    h = cfg["num_attention_heads"]
    d = cfg["hidden_size"] // h
    rot = int(d * cfg["rope_parameters"]["partial_rotary_factor"])
    assert rot == 4
    t = _tensors(folder)
    rep = analyze(folder)
    assert len(rep.layers) == 2
    for lr in rep.layers:
        qkv = t[f"gpt_neox.layers.{lr.layer}.attention.query_key_value.bias"]
        # modeling_gpt_neox: qkv.view(..., heads, 3 * head_size).chunk(3, -1) -> per head [q | k | v]
        k = qkv.reshape(h, 3, d)[:, 1, :]
        assert lr.k_class == "partial"
        assert lr.exact_fraction == pytest.approx((k[:, rot:] ** 2).sum() / (k ** 2).sum(), rel=1e-12)
        for hr in lr.heads:
            g = hr.kv_head
            assert hr.exact_fraction == pytest.approx((k[g, rot:] ** 2).sum() / (k[g] ** 2).sum(), rel=1e-12)
        assert len(lr.exact_dims) == h * (d - rot)
        assert lr.bound is not None and lr.bound_all > lr.bound >= 0


@pytest.mark.parametrize("epsilon,context,near", [
    (0.1, None, []),        # the slowest pair turns 0.18 rad over 32768 positions
    (0.5, None, [7]),
    (2.0, None, [6, 7]),    # pair 6 turns 1.04 rad, pair 5 5.8 rad
    (0.1, 1024, [6, 7]),    # --context 1024: pair 6 turns 0.032 rad
])
def test_qwen2_long_near_fraction_by_hand(tiny, epsilon, context, near):
    folder = tiny("qwen2_long")
    t = _tensors(folder)
    L = context or 32768
    # transformers _compute_default_rope_parameters: inv_freq_j = theta^(-2j/head_dim), head_dim 16
    w = 1e6 ** (-2 * np.arange(8) / 16)
    assert [j for j in range(8) if w[j] * L < epsilon] == near
    rep = analyze(folder, epsilon=epsilon, context=context)
    assert rep.context == L and rep.epsilon == epsilon
    assert len(rep.layers) == 2
    for lr in rep.layers:
        b = t[f"model.layers.{lr.layer}.self_attn.k_proj.bias"].reshape(2, 16)   # 2 kv heads
        # rotate_half pairs dim j with j + 8
        e_near = sum((b[:, j] ** 2 + b[:, j + 8] ** 2).sum() for j in near)
        assert lr.k_class == "rope" and lr.exact_fraction == 0.0
        assert lr.near_fraction == pytest.approx(e_near / (b ** 2).sum(), rel=1e-12, abs=1e-15)
        assert list(lr.near_pairs) == near
        assert lr.redundancy_dict()["context"] == L


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "olmo2"])
def test_qk_norm_models_are_not_removable(tiny, name):
    rep = analyze(tiny(name))
    assert len(rep.layers) == 2
    for lr in rep.layers:
        assert lr.k_class == "not-removable"
        assert lr.bound is None and lr.bound_all is None
        assert any("q/k-norm" in r for r in lr.reasons)
        assert lr.redundancy_dict()["bound"] is None


def test_value_bias_verdicts(tiny):
    q = analyze(tiny("qwen2")).layers[0].v_bias
    assert q.foldable is False and "no output-projection bias" in q.reason
    assert analyze(tiny("llama_bias")).layers[0].v_bias.foldable is True
    assert analyze(tiny("falcon")).layers[0].v_bias.foldable is True
    assert analyze(tiny("qwen2")).layers[0].q_bias.l2 > 0


def test_attention_sinks_make_key_and_value_bias_unremovable(tiny, tmp_path):
    folder = _copy(tiny, "qwen2", tmp_path)
    t = load_file(folder / "model.safetensors")
    t["model.layers.1.self_attn.sinks"] = np.zeros(4, dtype=np.float32)
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    rep = analyze(folder)
    l0, l1 = rep.layers
    assert l0.k_class == "rope"
    assert l1.k_class == "not-removable" and any("sinks" in r for r in l1.reasons)
    assert l1.v_bias.foldable is False and "sinks" in l1.v_bias.reason


def test_softcapping_is_reported(tiny, tmp_path):
    folder = _copy(tiny, "gemma3", tmp_path)
    _edit_config(folder, attn_logit_softcapping=50.0)
    lr = analyze(folder).layers[0]
    assert lr.k_class == "not-removable" and any("soft-capping" in r for r in lr.reasons)


def test_nan_key_bias_is_flagged_not_analysed(tiny, tmp_path):
    folder = _copy(tiny, "qwen2", tmp_path)
    t = load_file(folder / "model.safetensors")
    t["model.layers.0.self_attn.k_proj.bias"][3] = np.nan
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    lr0, lr1 = analyze(folder).layers
    assert any(f.startswith("nonfinite") and "key bias" in f for f in lr0.flags)
    assert lr0.exact_fraction is None and lr0.bound is None
    assert json.loads(json.dumps(lr0.to_dict(), allow_nan=False))["k_bias_l2"] is None
    assert lr1.bound is not None                                    # other layers unaffected


# ------------------------------------------------------------------------------------------------
# the bound
# ------------------------------------------------------------------------------------------------

def _independent_bound(t, layer, prefix, *, n_heads, n_kv, hd, theta, rot, L, eps, norm_bias=None):
    """Bound of removing near pairs / all rotated pairs, per the formula, with SVD spectral norms."""
    wq = t[f"{prefix}.{layer}.self_attn.q_proj.weight"]
    bq = t[f"{prefix}.{layer}.self_attn.q_proj.bias"]
    bk = t[f"{prefix}.{layer}.self_attn.k_proj.bias"]
    gamma = t[f"{prefix}.{layer}.input_layernorm.weight"]
    beta = t.get(f"{prefix}.{layer}.input_layernorm.bias") if norm_bias else None
    D = wq.shape[1]
    w = theta ** (-2 * np.arange(rot // 2) / rot)
    fac = np.minimum(2.0, w * L)
    s = hd ** -0.5
    c = np.zeros((n_heads, rot // 2))
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        for j in range(rot // 2):
            rows = [h * hd + j, h * hd + j + rot // 2]
            off = bq[rows] + (wq[rows] @ beta if beta is not None else 0.0)
            qhat = np.linalg.norm(wq[rows] * gamma, 2) * math.sqrt(D) + np.linalg.norm(off)
            bj = np.linalg.norm(bk[[g * hd + j, g * hd + j + rot // 2]])
            c[h, j] = s * qhat * bj * fac[j]
    near = w * L < eps
    return c[:, near].sum(1).max(), c.sum(1).max()


def test_bound_matches_the_formula_rms_input(tiny):
    folder = tiny("qwen2_long")
    t = _tensors(folder)
    rep = analyze(folder, epsilon=2.0)
    assert len(rep.layers) == 2
    for lr in rep.layers:
        near, full = _independent_bound(t, lr.layer, "model.layers", n_heads=4, n_kv=2, hd=16, theta=1e6, rot=16,
                                        L=32768, eps=2.0)
        assert lr.bound == pytest.approx(near, rel=1e-10)
        assert lr.bound_all == pytest.approx(full, rel=1e-10)
        assert max(h.bound for h in lr.heads) == pytest.approx(lr.bound, rel=1e-12)
        assert lr.redundancy_dict()["bound"] == lr.bound


def test_bound_matches_the_formula_layernorm_input_with_beta(tiny):
    folder = tiny("starcoder2")      # LayerNorm with bias feeds q_proj
    t = _tensors(folder)
    rep = analyze(folder, epsilon=1.0)
    assert len(rep.layers) == 2
    for lr in rep.layers:
        near, full = _independent_bound(t, lr.layer, "model.layers", n_heads=4, n_kv=2, hd=16, theta=1e4, rot=16,
                                        L=256, eps=1.0, norm_bias=True)
        assert lr.bound == pytest.approx(near, rel=1e-10) and lr.bound_all == pytest.approx(full, rel=1e-10)


def test_bf16_checkpoint_bound_matches_the_formula_without_a_float64_copy(tiny, tmp_path):
    # The 7B path: BF16 W_q is read with preadv into one buffer, widened to float32 (exact: a
    # 16-bit shift) and q_pair_bound sums in float64 one head at a time.  Same numbers as the
    # float64 SVD formula on the same bf16 values; rel 1e-10 as in the float32 test above (only
    # float64 summation order differs).
    import torch
    from safetensors.torch import load_file as load_pt, save_file as save_pt

    from ckpt_surgeon.formats.safetensors import LocalFile

    folder = _copy(tiny, "qwen2_long", tmp_path)
    f = folder / "model.safetensors"
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_pt(f).items()}
    save_pt(sd, f, metadata={"format": "pt"})
    t = {k: v.double().numpy() for k, v in sd.items()}
    ck = open_checkpoint(folder)
    layout = ck.layout()
    lt = layout.layers[0]
    assert ck.tensors[lt.q_weight].dtype == "BF16"
    wq = R.q_weight(ck, layout, lt)
    assert wq.dtype == np.float32 and np.array_equal(wq, t[lt.q_weight])
    rep = analyze(folder, epsilon=2.0)
    assert len(rep.layers) == 2
    for lr in rep.layers:
        near, full = _independent_bound(t, lr.layer, "model.layers", n_heads=4, n_kv=2, hd=16, theta=1e6, rot=16,
                                        L=32768, eps=2.0)
        assert lr.bound == pytest.approx(near, rel=1e-10) and lr.bound_all == pytest.approx(full, rel=1e-10)
    # read_into: the same bytes as read_bytes, into a caller's buffer; a wrong-sized buffer is refused
    lf = LocalFile(f)
    info = lf.header.tensors[lt.q_weight]
    buf = np.empty(info.end - info.start, np.uint8)
    lf.read_into(info, buf)
    assert buf.tobytes() == lf.read_bytes(info)
    with pytest.raises(ValueError, match="bytes"):
        lf.read_into(info, np.empty(info.end - info.start - 2, np.uint8))
    lf.close()


def test_no_static_norm_means_no_bound(tiny, tmp_path):
    folder = _copy(tiny, "qwen2", tmp_path)
    t = load_file(folder / "model.safetensors")
    t = {k: v for k, v in t.items() if "input_layernorm" not in k}
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    rep = analyze(folder)
    assert len(rep.layers) == 2
    for lr in rep.layers:
        assert lr.bound is None and lr.bound_all is None
        assert "norm" in lr.bound_note and "no static bound" in lr.bound_note
        assert lr.near_fraction > 0                   # fractions need no weights


def test_rope_scaling_yarn_scales_the_bound_and_unknown_types_give_none(tiny, tmp_path):
    base = analyze(tiny("qwen2"), epsilon=1.0)
    folder = _copy(tiny, "qwen2", tmp_path)
    _edit_config(folder, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 64})
    yarn = analyze(folder, epsilon=1.0)
    af = 0.1 * math.log(4.0) + 1.0        # modeling_rope_utils get_mscale(4)
    assert yarn.rope.attention_factor == pytest.approx(af)
    assert len(base.layers) == len(yarn.layers) == 2
    for a, b in zip(base.layers, yarn.layers):
        assert b.bound_all == pytest.approx(a.bound_all * af ** 2, rel=1e-12)
        assert b.near_fraction == a.near_fraction        # unscaled (larger) frequencies kept
    _edit_config(folder, rope_parameters={"rope_type": "something_new", "rope_theta": 10000.0})
    odd = analyze(folder)
    assert len(odd.layers) == 2
    assert all(lr.bound_all is None and "not modelled" in lr.bound_note for lr in odd.layers)


def test_longrope_gguf_analyses_like_its_hf_source(tiny, tmp_path):
    """Phi-3's longrope lives in tensors and rope.scaling.attn_factor in GGUF: analyze reads them,
    so a Phi-3.5-MoE GGUF's bound carries the attention factor (1.247 here, the logits x 1.56) as
    its HF source's does -- without it the bound was 1.56x too small, an unsound claim."""
    from convert_variants import build_variant

    from ckpt_surgeon.conversion import hf_to_gguf
    src = build_variant(tiny, "phimoe_longrope", tmp_path / "phimoe_longrope")
    hf = analyze(src)
    g = analyze(hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny"))
    assert g.rope.rope_type == hf.rope.rope_type == "longrope"
    assert g.rope.attention_factor == pytest.approx(hf.rope.attention_factor, rel=1e-7)   # stored as float32
    assert hf.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(512)))
    for a, b in zip(hf.layers, g.layers, strict=True):
        assert a.bound_all is not None and b.bound_all == pytest.approx(a.bound_all, rel=1e-6)


def test_hub_era_rope_spelling_reads_the_same(tiny, tmp_path):
    folder = _copy(tiny, "gpt_neox", tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rotary_pct=0.25, rotary_emb_base=10000)
    (folder / "config.json").write_text(json.dumps(cfg))
    a, b = analyze(tiny("gpt_neox")), analyze(folder)
    assert len(a.layers) == len(b.layers) == 2
    assert [x.exact_fraction for x in a.layers] == [x.exact_fraction for x in b.layers]
    assert [x.bound_all for x in a.layers] == pytest.approx([x.bound_all for x in b.layers], rel=1e-12)


def _layer_inputs(folder):
    ck = open_checkpoint(folder)
    layout = ck.layout()
    lt = layout.layers[0]
    v = R.layer_vectors(ck, layout, lt)
    gamma, beta, why = R._norm_params(ck, layout, lt)
    assert why is None
    return ck, layout, lt, v, R.q_weight(ck, layout, lt), gamma


def test_interleaved_pairs_on_permuted_rows_give_the_same_analysis(tiny):
    ck, layout, lt, v, wq, gamma = _layer_inputs(tiny("llama_bias"))
    H, G, hd = layout.num_heads, layout.num_kv_heads, layout.head_dim
    kw = dict(gamma=gamma, scale=LR.attention_scale(layout, ck.config), context=256, epsilon=1.0)
    hf = LR.analyze_layer(layout, lt, b_k=v["k"], b_q=v["q"], w_q=wq, rope=R.rope_geometry(layout, ck.config), **kw)
    # llama.cpp's converter permutes Q and K rows to interleaved pairs (2i, 2i+1)
    pq, pk = llama_permute_index(H, hd), llama_permute_index(G, hd)
    inter = replace(layout, position=replace(layout.position, pair_layout="interleaved"), qk_permuted=True)
    gg = LR.analyze_layer(inter, lt, b_k=v["k"][pk], b_q=v["q"][pq], w_q=wq[pq], rope=R.rope_geometry(inter, ck.config), **kw)
    assert hf.near_pairs and gg.near_fraction == pytest.approx(hf.near_fraction, rel=1e-12)
    assert gg.bound == pytest.approx(hf.bound, rel=1e-12) and gg.bound_all == pytest.approx(hf.bound_all, rel=1e-12)
    # reading permuted rows with the rotate_half pairing gives another answer: the layout matters
    wrong = LR.analyze_layer(layout, lt, b_k=v["k"][pk], b_q=v["q"][pq], w_q=wq[pq],
                            rope=R.rope_geometry(layout, ck.config), **kw)
    assert wrong.near_fraction != pytest.approx(hf.near_fraction, rel=1e-3)


def test_gguf_file_analysis_equals_the_hf_folder(tiny, tmp_path):
    from ckpt_surgeon.conversion import hf_to_gguf
    gguf = hf_to_gguf(tiny("llama_bias"), tmp_path / "m.gguf", dtype="f32")
    a, b = analyze(tiny("llama_bias"), epsilon=1.0), analyze(gguf, epsilon=1.0)
    assert b.format == "gguf" and b.position.pair_layout == "interleaved"
    assert len(a.layers) == len(b.layers) == 2
    for x, y in zip(a.layers, b.layers):
        assert y.k_class == x.k_class == "rope"
        assert y.near_fraction == pytest.approx(x.near_fraction, rel=1e-12)
        assert y.bound == pytest.approx(x.bound, rel=1e-9) and y.bound_all == pytest.approx(x.bound_all, rel=1e-9)


# ------------------------------------------------------------------------------------------------
# math properties
# ------------------------------------------------------------------------------------------------

def _rot(phi):
    c, s = np.cos(phi), np.sin(phi)
    return np.array([[c, -s], [s, c]])


@settings(max_examples=200, deadline=None)
@given(q=st.lists(st.floats(-5, 5), min_size=2, max_size=2), b=st.lists(st.floats(-5, 5), min_size=2, max_size=2),
       w=st.floats(1e-6, 3.0), L=st.integers(2, 300), m=st.integers(0, 400))
def test_pair_term_spread_is_within_min_2_wL(q, b, w, L, m):
    q, b = np.array(q), np.array(b)
    # keys n = m-L+1 .. m (causal window of L positions): term <q, R((n-m)w) b>
    vals = [q @ _rot((n - m) * w) @ b for n in range(m - L + 1, m + 1)]
    assert max(vals) - min(vals) <= np.linalg.norm(q) * np.linalg.norm(b) * min(2.0, w * L) + 1e-9


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 30), E=st.floats(0.0, 20.0), seed=st.integers(0, 2 ** 31))
def test_tv_bound_tanh_quarter(n, E, seed):
    rng = np.random.default_rng(seed)
    l = rng.normal(0, 3, n)
    d = rng.normal(0, 1) + rng.uniform(0, E, n)          # a shift plus at most E of spread
    p, pc = np.exp(l - l.max()), np.exp(l + d - (l + d).max())
    tv = 0.5 * np.abs(p / p.sum() - pc / pc.sum()).sum()
    assert tv <= B.tv_bound(E) + 1e-12


def test_tv_bound_is_tight_on_the_two_point_case():
    E = 3.0
    # two keys, spread E on one: TV = tanh(E/4) when the weights balance the log-ratio
    l = np.array([E / 2, 0.0])
    p = np.exp(l) / np.exp(l).sum()
    pc = np.exp(l + [0.0, E]) / np.exp(l + [0.0, E]).sum()
    assert 0.5 * np.abs(p - pc).sum() == pytest.approx(math.tanh(E / 4), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), layer_norm=st.booleans())
def test_q_pair_bound_bounds_every_normalised_input(seed, layer_norm):
    rng = np.random.default_rng(seed)
    H, hd, D = 2, 8, 12
    pairs = np.stack([np.arange(4), np.arange(4) + 4], 1)
    W = rng.normal(0, 1, (H * hd, D))
    gamma, bq = rng.normal(1, 0.5, D), rng.normal(0, 1, H * hd)
    beta = rng.normal(0, 1, D) if layer_norm else None
    qhat = B.q_pair_bound(W, pairs, H, hd, gamma=gamma, beta=beta, b_q=bq)
    # Gram-matrix spectral norm equals the SVD one
    blk = W.reshape(H, hd, D)[0, pairs[1]] * gamma
    off0 = bq.reshape(H, hd)[0, pairs[1]] + (W.reshape(H, hd, D)[0, pairs[1]] @ beta if layer_norm else 0)
    assert qhat[0, 1] == pytest.approx(np.linalg.norm(blk, 2) * math.sqrt(D) + np.linalg.norm(off0), rel=1e-10)
    # random hidden states, and the worst direction of every block (top right-singular vector)
    hs = list(rng.normal(0, 10, (50, D)))
    for h in range(H):
        for j in range(4):
            rows = W.reshape(H, hd, D)[h, pairs[j]] * gamma
            hs.append(np.linalg.svd(rows)[2][0] * 7.0)
    for x in hs:
        if layer_norm:
            u = (x - x.mean()) / np.sqrt(x.var() + 1e-5)
            inp = gamma * u + beta
        else:
            inp = gamma * x / np.sqrt((x ** 2).mean() + 1e-6)
        q = (W @ inp + bq).reshape(H, hd)
        got = np.sqrt(q[:, pairs[:, 0]] ** 2 + q[:, pairs[:, 1]] ** 2)
        assert np.all(got <= qhat * (1 + 1e-12))


# ------------------------------------------------------------------------------------------------
# select_pairs (used by fold-bias --k --approximate)
# ------------------------------------------------------------------------------------------------

def test_select_pairs_respects_the_budget_and_is_monotone(tiny):
    lr = analyze(tiny("qwen2_long"), epsilon=2.0).layers[1]
    c = LR.pair_contributions(lr)
    assert c.shape == (4, 8)
    for budget in [0.0, lr.bound, 0.5, 1.0, lr.bound_all, 10 * lr.bound_all]:
        sel = LR.select_pairs(lr, budget)
        assert sel.bound <= budget * (1 + 1e-12)      # documented summation-order slack
        # the bound of the chosen set, recomputed from the per-pair contributions
        mask = np.zeros((2, 8), bool)
        for g, j in sel.pairs:
            mask[g, j] = True
        assert B.set_bound(c, mask, 2).max(initial=0.0) == pytest.approx(sel.bound, abs=1e-12)
        assert sorted(sel.dims) == sorted(int(g * 16 + d) for g, j in sel.pairs for d in (j, j + 8))
        if budget >= lr.bound:      # slowest pairs first: the near-redundant set always fits
            assert {j for _, j in sel.pairs} >= set(lr.near_pairs)
    assert lr.near_pairs == (6, 7)
    assert LR.select_pairs(lr, 0.0).dims == ()
    full = LR.select_pairs(lr, lr.bound_all)
    assert len(full.pairs) == 16 and full.removed_energy_fraction == pytest.approx(1.0)
    near_only = LR.select_pairs(lr, 10.0, only_near=True)
    assert {j for _, j in near_only.pairs} == set(lr.near_pairs)
    with pytest.raises(CkptError):
        LR.select_pairs(lr, -1.0)


def test_select_pairs_exact_partial_and_unremovable(tiny):
    neox = analyze(tiny("gpt_neox")).layers[0]
    sel = LR.select_pairs(neox, 0.0)
    assert sel.exact_dims == len(neox.exact_dims) == 48 and sel.bound == 0.0
    assert sel.removed_energy_fraction == pytest.approx(neox.exact_fraction)
    gpt2 = LR.select_pairs(analyze(tiny("gpt2")).layers[0], 0.0)
    assert len(gpt2.dims) == 64 and gpt2.removed_energy_fraction == 1.0
    q3 = LR.select_pairs(analyze(tiny("qwen3")).layers[0], 5.0)
    assert q3.dims == () and "not removable" in q3.note


# ------------------------------------------------------------------------------------------------
# inspect's k_bias_redundancy, report records, CLI
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "gpt2", "gpt_neox", "qwen3", "llama"])
def test_inspect_json_carries_k_bias_redundancy(tiny, name):
    res = CliRunner().invoke(cli, ["inspect", str(tiny(name)), "--format", "json"])
    assert res.exit_code == 0, res.output
    layers = json.loads(res.output)["layers"]
    rep = analyze(tiny(name))
    assert len(layers) == len(rep.layers) == 2
    for d, lr in zip(layers, rep.layers):
        red = d["k_bias_redundancy"]
        if not lr.has_k_bias:
            assert red is None
            continue
        assert {"class", "exact_fraction", "near_fraction", "epsilon", "context", "bound"} <= set(red)
        assert red["class"] == lr.k_class and red["epsilon"] == 0.1 and red["context"] == rep.context
        assert red["exact_fraction"] == pytest.approx(lr.exact_fraction)
        assert red["near_fraction"] == pytest.approx(lr.near_fraction)
        if lr.k_class in ("exact", "partial") and not lr.near_pairs:
            assert red["bound"] == 0.0            # nothing rotated removed: exact, no weights needed
        else:
            assert red["bound"] is None and red["note"]   # needs W_q (or not removable)


def test_report_records(tiny):
    rep = analyze(tiny("qwen2"))
    d = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert d["class_counts"] == {"rope": 2} and d["context"] == 256 and d["epsilon"] == 0.1
    lay = d["layers"][0]
    assert len(lay["heads"]) == 2 and lay["heads"][0]["query_heads"] == [0, 1]
    assert len(lay["pairs"]) == 8 and lay["pairs"][7]["near"] is True and lay["pairs"][0]["near"] is False
    assert lay["tv_bound"] == pytest.approx(math.tanh(lay["bound"] / 4))
    frame = rep.to_frame()
    assert list(frame["layer"]) == [0, 1] and "bound" in frame
    assert len(replace(rep, per_head=True).rows()) == 4


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_cli_formats(tiny, tmp_path, fmt):
    out = tmp_path / f"a.{fmt}"
    res = CliRunner().invoke(cli, ["analyze", str(tiny("phi")), "--format", fmt, "--output", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    if fmt == "json":
        assert json.loads(text)["class_counts"] == {"partial": 2}
    elif fmt == "csv":
        assert text.startswith("layer,class,") and len(text.splitlines()) == 3
    elif fmt == "markdown":
        assert "| layer | class |" in text
    else:
        assert "partial" in text and "bound" in text
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_cli_options_and_errors(tiny, tmp_path):
    r = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2_long")), "--format", "json", "--context", "1024",
                                 "--epsilon", "0.1"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["context"] == 1024 and d["context_source"] == "--context" and d["layers"][0]["near_pairs"] == [6, 7]
    r = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2")), "--per-head", "--format", "csv"])
    assert r.exit_code == 0 and r.output.splitlines()[0].startswith("layer,kv_head,")
    r = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2")), "--context", "0"])
    assert r.exit_code == 2 and r.output.strip() == "error: --context must be a positive number of positions (got 0)"
    r = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2")), "--epsilon", "nan"])
    assert r.exit_code == 2 and "--epsilon" in r.output
    r = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2")), "--prompts", str(tmp_path / "p.txt")])
    assert r.exit_code == 2 and "--prompts only makes sense with --measure" in r.output
    r = CliRunner().invoke(cli, ["analyze", str(tmp_path / "nope")])
    assert r.exit_code == 2 and r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1
    assert "--measure" in CliRunner().invoke(cli, ["analyze", "--help"]).output


def test_hub_repo_analysis_equals_the_local_folder(tiny, tmp_path, monkeypatch):
    """Hub sources work through Checkpoint unchanged (real HTTP server on 127.0.0.1, range reads)."""
    import sys

    from huggingface_hub import constants
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hubserver import HubServer

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(tmp_path / "cache"))
    folder = tiny("qwen2_sharded")
    with HubServer(idle_timeout=60) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        srv.add_repo("owner/tiny", folder)
        remote = analyze("owner/tiny", epsilon=1.0)
    local = analyze(folder, epsilon=1.0)
    assert remote.format == "hub-safetensors"
    assert len(local.layers) == len(remote.layers) == 2
    for x, y in zip(local.layers, remote.layers):
        assert (y.k_class, y.near_pairs) == (x.k_class, x.near_pairs)
        assert y.near_fraction == x.near_fraction and y.bound == x.bound and y.bound_all == x.bound_all


def test_full_rope_layers_show_dashes_not_zeros(tiny):
    """issue 24: with every dim rotated and no near pair, analyze printed exact / near / bound as
    0 / 0 / 0 and "max bound ... 0 logit", which reads as "removing it is free"; inspect showed "-".
    JSON keeps the numbers."""
    from ckpt_surgeon.cli.render import to_table
    rep = analyze(tiny("qwen2"), context=1_000_000)
    assert [(r["exact"], r["near"], r["bound"]) for r in rep.rows()] == [(None, None, None)] * 2
    assert [(lr.exact_fraction, lr.near_fraction, lr.bound) for lr in rep.layers] == [(0.0, 0.0, 0.0)] * 2
    assert dict(rep.summary_items())["max bound (exact + near removed)"] == "- (no layer has a removable part)"
    assert "0 logit" not in to_table(rep.rows(), rep.summary_items())
    res = CliRunner().invoke(cli, ["analyze", str(tiny("qwen2")), "--context", "1000000"])
    assert res.exit_code == 0 and "- (no layer has a removable part)" in res.stdout
    near = analyze(tiny("qwen2"))          # the config's context: one near pair, a real bound
    assert near.rows()[0]["near"] > 0 and dict(near.summary_items())["max bound (exact + near removed)"].endswith(
        " logit")
    exact = analyze(tiny("gpt2"))            # exact class: the bound 0 is real and shown
    assert exact.rows()[0]["exact"] == 1.0 and exact.rows()[0]["bound"] == 0.0
