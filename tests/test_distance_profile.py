"""The distance profile (``analyze --distance-profile``, issue 25): closed forms, the logits a real
transformers forward pass computes, the measured decomposition, the spread bound, and the rope
frequencies against transformers' own ``ROPE_INIT_FUNCTIONS``.
"""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from ckpt_surgeon.analysis import measure as M
from ckpt_surgeon.analysis.distance_measure import measure_profile
from ckpt_surgeon.analysis.distance_profile import (default_deltas, distance_profile, parse_deltas, summary_grid,
                                                    window_mean)
from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.arch.rope_frequencies import parse_rope_scaling, rope_frequencies
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import hf_to_gguf

ALL = ",".join(str(i) for i in range(256))      # every distance of the tiny qwen2's window


def _edit(tiny, tmp_path, name, fn, sub="m"):
    """A copy of the tiny fixture ``name`` with ``fn(tensors)`` applied (float64 numpy dict)."""
    dst = tmp_path / sub
    shutil.copytree(tiny(name), dst)
    t = load_file(dst / "model.safetensors")
    fn(t)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _profile(src, **kw):
    with open_checkpoint(src) as ck:
        return distance_profile(ck, **kw)


def _cfg(src):
    return json.loads((src / "config.json").read_text())


# ----------------------------------------------------------------------------------------------
# 1. Closed forms
# ----------------------------------------------------------------------------------------------

def test_constant_biases_give_the_cosine_sum(tiny, tmp_path):
    mu = 0.75                 # exact in float32 (the fixture stores float32)

    def const(t):
        for k in list(t):
            if k.endswith(("q_proj.bias", "k_proj.bias")):
                t[k] = np.full_like(t[k], mu)
    src = _edit(tiny, tmp_path, "qwen2", const)
    p = _profile(src, deltas=ALL)
    cfg = _cfg(src)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = cfg["rope_parameters"]["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    d = np.arange(256)
    # z_j = mu (1 + i) for both: h_j = 2 mu^2, so f = s 2 mu^2 sum_j cos(Δ θ_j)
    want = hd ** -0.5 * 2 * mu ** 2 * np.cos(np.outer(d, inv)).sum(1)
    for lp in p.layers:
        assert len(lp.heads) == cfg["num_attention_heads"]
        for h in lp.heads:
            np.testing.assert_allclose(h.f, want, rtol=0, atol=1e-12)
            assert h.summary.alignment == pytest.approx(1.0)        # every pair aligned
    assert p.model.first_zero == int(d[np.argmax(np.cos(np.outer(d, inv)).sum(1) <= 0)])

    def flip(t):
        const(t)
        for k in list(t):
            if k.endswith("k_proj.bias"):
                t[k] = -t[k]
    q = _profile(_edit(tiny, tmp_path, "qwen2", flip, "flipped"), deltas=ALL)
    for a, b in zip(p.layers, q.layers):
        for ha, hb in zip(a.heads, b.heads):
            np.testing.assert_array_equal(hb.f, -ha.f)                  # flipping b_k flips the sign
            assert hb.summary.trend == {"decay": "enhance", "enhance": "decay", "flat": "flat"}[ha.summary.trend]


def test_f0_is_the_scaled_dot_product(tiny):
    src = tiny("qwen2")
    p = _profile(src)
    cfg = _cfg(src)
    H, G = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg["hidden_size"] // H
    t = load_file(src / "model.safetensors")
    for lp in p.layers:
        bq = t[f"model.layers.{lp.layer}.self_attn.q_proj.bias"].astype(np.float64).reshape(H, hd)
        bk = t[f"model.layers.{lp.layer}.self_attn.k_proj.bias"].astype(np.float64).reshape(G, hd)
        for h in lp.heads:
            want = hd ** -0.5 * bq[h.q_head] @ bk[h.q_head // (H // G)]
            assert p.deltas[0] == 0 and h.f[0] == pytest.approx(want, rel=1e-13, abs=1e-15)
            assert h.summary.f0 == pytest.approx(want, rel=1e-13, abs=1e-15)


def test_window_mean_and_summaries_against_brute_force():
    rng = np.random.default_rng(3)
    inv = 1.0 / 10000 ** (np.arange(0, 32, 2) / 32)
    h = rng.normal(size=(3, 16)) + 1j * rng.normal(size=(3, 16))
    const = rng.normal(size=3)
    d = np.arange(100, 400)
    brute = (h @ np.exp(1j * np.outer(inv, d))).real.mean(1) * 0.3 + const
    np.testing.assert_allclose(window_mean(h, const, inv, 100, 399, 0.3), brute, rtol=1e-12, atol=1e-12)
    assert parse_deltas("10,5", 100).tolist() == [0, 5, 10]          # f(0) always first: g reads it
    assert parse_deltas("log:4", 1000).tolist() == [0, 1, 10, 100, 1000]
    for bad in ("-1,2", "a", "log:0"):
        with pytest.raises(CkptError, match="--deltas"):
            parse_deltas(bad, 100)
    g = summary_grid(5000)
    assert g[0] == 0 and g[-1] == 5000 and np.all(np.diff(g) > 0) and np.array_equal(g[:257], np.arange(257))


# ----------------------------------------------------------------------------------------------
# 2. Logits of a real forward pass, through the HF file and the project's own GGUF
# ----------------------------------------------------------------------------------------------

def _zero_qk_weights(t):
    for k in list(t):
        if k.endswith(("q_proj.weight", "k_proj.weight")):
            t[k] = np.zeros_like(t[k])


def _captured_logits(src, ids, exact_rope: bool = False):
    """Every layer's pre-softmax logits ``[H, T, T]`` of an eager float64 forward pass
    (``exact_rope``: rotary angles in float64, :func:`_float64_rope`)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64, attn_implementation="eager")
    if exact_rope:
        _float64_rope(model)
    rec: dict = {}
    with M._capture_softmax(rec):
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    return [rec[i][0].numpy() for i in sorted(rec)]


@pytest.mark.parametrize("exact_rope", [False, True])
def test_logits_equal_the_static_profile_hf_and_gguf(tiny, tmp_path, exact_rope):
    src = _edit(tiny, tmp_path, "qwen2", _zero_qk_weights)
    gguf = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    T = 40
    ids = torch.arange(5, 5 + T).reshape(1, T)
    logits = _captured_logits(src, ids, exact_rope)
    m, n = np.tril_indices(T)
    for path in (src, gguf):
        p = _profile(path, deltas=ALL)
        assert p.layers and all(lp.heads for lp in p.layers)
        for lp, lg in zip(p.layers, logits):
            for h in lp.heads:
                got = lg[h.q_head][m, n]
                want = h.f[m - n]
                # transformers computes the rotary angles p·θ_j and their cos / sin in float32 even
                # in a float64 model: at p < 40 the angle carries <= 40 * 2^-24 rad of rounding, so
                # each pair term is off by at most ~3e-6 |h_j| (two rotations): 1e-5 of sum |h_j|.
                # With float64 angles: float64 rounding of a 16-term sum of products of size ~1.
                tol = (1e-12 if exact_rope else 1e-5) * h.abs_h.sum() + 1e-13
                assert np.abs(got - want).max() <= tol, (path, lp.layer, h.q_head)
    # the profile really varies with the distance (the comparison is not between constants)
    assert np.ptp(p.layers[0].heads[0].f[:T]) > 1e-2


# (qwen2_moe's attention is qwen2's; its grouped-GEMM experts do not run in float64)
RUNTIME_ROPES = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.3 * i for i in range(8)],
                 "long_factor": [2.0 + i for i in range(8)], "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("rope", sorted(RUNTIME_ROPES))
def test_logits_under_rope_scaling(tiny, tmp_path, rope):
    """The frequencies and attention factor the runtime really uses: logits of a forward pass with
    the config's scaling equal the profile (longrope at a 40-token context: its short factors)."""
    src = _edit(tiny, tmp_path, "qwen2", _zero_qk_weights)
    cfg = _cfg(src)
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **RUNTIME_ROPES[rope]}
    (src / "config.json").write_text(json.dumps(cfg))
    T = 40
    logits = _captured_logits(src, torch.arange(5, 5 + T).reshape(1, T))
    p = _profile(src, context=T, deltas=",".join(str(i) for i in range(T)))
    assert p.rope.rope_type == rope
    if rope == "yarn":
        assert p.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    m, n = np.tril_indices(T)
    for lp, lg in zip(p.layers, logits):
        for h in lp.heads:
            # float32 rotary angles in transformers: see test_logits_equal_the_static_profile_hf_and_gguf
            assert np.abs(lg[h.q_head][m, n] - h.f[m - n]).max() <= 1e-5 * h.abs_h.sum() + 1e-13, (lp.layer, h.q_head)


ROTARY_BIASED = ["llama_bias", "starcoder2", "phi", "gpt_neox", "falcon", "falcon_mq", "falcon_old", "stablelm"]


@pytest.mark.parametrize("name", ROTARY_BIASED)
def test_logits_equal_the_static_profile_across_families(tiny, tmp_path, name):
    """Fused qkv, partial rotary, parallel blocks, MQA: with the attention-input norm zeroed the
    projections see x = 0, so q~ = b_q and k~ = b_k exactly and the logits are f_b(m - n)."""
    with open_checkpoint(tiny(name)) as ck:
        norms = [n for lt in ck.layout().layers for n in (lt.attn_norm, lt.attn_norm_bias) if n]

    def zero_norm(t):
        for n in norms:
            t[n] = np.zeros_like(t[n])
    src = _edit(tiny, tmp_path, name, zero_norm)
    T = 40
    logits = _captured_logits(src, torch.arange(5, 5 + T).reshape(1, T))
    m, n = np.tril_indices(T)
    p = _profile(src, deltas=ALL)
    assert len(p.layers) == len(logits) and all(lp.heads for lp in p.layers)
    for lp, lg in zip(p.layers, logits):
        for h in lp.heads:
            # float32 rotary angles in transformers: see test_logits_equal_the_static_profile_hf_and_gguf
            tol = 1e-5 * h.abs_h.sum() + 1e-12 * (1 + abs(h.summary.pass_const))
            assert np.abs(lg[h.q_head][m, n] - h.f[m - n]).max() <= tol, (lp.layer, h.q_head)


def test_permuted_gguf_gives_the_same_profile(tiny, tmp_path):
    """llama.cpp permutes llama Q/K rows to interleaved pairs; the profile reads them as such."""
    src = tiny("llama_bias")
    gguf = hf_to_gguf(src, tmp_path / "l.gguf", dtype="f32", name="tiny")
    a, b = _profile(src), _profile(gguf)
    assert (a.pair_layout, b.pair_layout) == ("rotate_half", "interleaved")
    for la, lb in zip(a.layers, b.layers):
        for ha, hb in zip(la.heads, lb.heads):
            # f32 GGUF of an f32 checkpoint: the same bias values, summed in another pair order
            np.testing.assert_allclose(hb.f, ha.f, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name,rope", [("qwen2", "yarn"), ("qwen2", "linear"), ("llama_bias", "llama3")])
def test_gguf_under_rope_scaling_gives_the_hf_profile(tiny, tmp_path, name, rope):
    """GGUF keeps yarn / linear as metadata and llama3 as the rope_freqs.weight tensor (which
    llama.cpp divides the frequencies by): the GGUF's profile is its HF source's."""
    dst = tmp_path / "m"
    shutil.copytree(tiny(name), dst)
    cfg = _cfg(dst)
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **RUNTIME_ROPES[rope]}
    (dst / "config.json").write_text(json.dumps(cfg))
    g = hf_to_gguf(dst, tmp_path / "m.gguf", dtype="f32", name="tiny")
    a, b = _profile(dst, deltas=ALL), _profile(g, deltas=ALL)
    assert b.rope.rope_type == rope and b.attention_factor == a.attention_factor
    # llama3: the converter computes the factors in float32 (2^-24 relative); over Δ <= 255 the
    # angle moves by <= 255 θ_j 2^-24, so each pair term by <= 2e-5 |h_j| at worst (θ_0 = 1)
    tol = 2e-5 if rope == "llama3" else 1e-12
    for la, lb in zip(a.layers, b.layers):
        for ha, hb in zip(la.heads, lb.heads):
            assert np.abs(hb.f - ha.f).max() <= tol * ha.abs_h.sum() + 1e-14


# ----------------------------------------------------------------------------------------------
# 3. Measured mode: the parts add up to the measured mean logit
# ----------------------------------------------------------------------------------------------

def _float64_rope(model):
    """Rotary cos / sin in float64 (transformers computes them in float32 whatever the model dtype),
    so the identity can be checked at float64 rounding."""
    emb = model.model.rotary_emb
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        e = torch.cat((freqs, freqs), dim=-1)
        return e.cos().to(x.dtype), e.sin().to(x.dtype)
    emb.forward = forward


@pytest.mark.parametrize("exact_rope", [True, False])
def test_measured_mean_logit_is_the_sum_of_the_parts(tiny, exact_rope):
    src = tiny("qwen2")
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    if exact_rope:
        _float64_rope(model)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    from ckpt_surgeon.analysis.prompts import default_prompts
    static = _profile(src, deltas="0,1,2,3,5,8,13,21,34,55,89,144,255")
    p = measure_profile(src, static, prompts=default_prompts()[:3], dtype="float64", device="cpu", skip_first=4,
                        model=model, tokenizer=tok)
    assert p.measured["skip_first"] == 4 and p.measured["max_delta"] > 21
    for lp in p.layers:
        for h in lp.heads:
            mt, cv = h.mean, h.cov
            # bilinear split: the four parts are the total, and bias·bias is the static profile
            np.testing.assert_allclose(mt.bias_bias + mt.bias_content + mt.content_bias + mt.content_content,
                                       mt.total, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(mt.bias_bias, h.f, rtol=1e-9, atol=1e-12)
            seen = np.isfinite(cv.mean_logit)
            assert seen[:6].all() and not seen[-1]          # Δ = 255 is beyond every prompt
            assert np.isnan(cv.f[~seen]).all()
            # float64 angles: the parts equal the measured mean logit at float64 rounding; the
            # runtime's float32 angles leave <= ~40 positions * 2^-24 rad per rotation: 1e-5 relative
            tol = 1e-10 if exact_rope else 1e-5 * (np.abs(cv.mean_logit[seen]).max() + 1)
            assert cv.residual <= tol, (lp.layer, h.q_head, cv.residual)
            np.testing.assert_allclose(cv.parts[seen], cv.mean_logit[seen], rtol=0, atol=tol)
            assert np.all(cv.se[seen] >= 0)


# ----------------------------------------------------------------------------------------------
# 4. The spread never exceeds its bound
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "qwen2_long", "llama_bias"])
def test_spread_within_bound(tiny, name):
    src = tiny(name)
    p = _profile(src, context=256, deltas=ALL)
    for lp in p.layers:
        for h in lp.heads:
            s = h.summary
            brute = float(np.ptp(h.f))                         # every integer distance of the window
            assert s.spread <= brute + 1e-12                   # the grid sees a subset
            assert brute <= s.spread_bound * (1 + 1e-12)
    rng = np.random.default_rng(0)
    from ckpt_surgeon.analysis.distance_profile import summarize
    for theta, L in ((1e4, 4096), (1e6, 32768), (500.0, 300)):
        inv = 1.0 / theta ** (np.arange(0, 64, 2) / 64)
        h = rng.normal(size=(8, 32)) * np.exp(1j * rng.uniform(0, 2 * np.pi, size=(8, 32)))
        d = np.arange(L)
        brute = (h @ np.exp(1j * np.outer(inv, d))).real
        for i, s in enumerate(summarize(h, np.zeros(8), inv, L)):
            assert np.ptp(brute[i]) <= s.spread_bound * (1 + 1e-12)
            assert s.drop == pytest.approx(brute[i, 0] - brute[i, L // 2:].mean(), abs=1e-9)


# ----------------------------------------------------------------------------------------------
# 5. Frequencies and attention factor: transformers' ROPE_INIT_FUNCTIONS
# ----------------------------------------------------------------------------------------------

SCALINGS = [
    ("default", {}),
    ("linear", {"factor": 4.0}),
    ("dynamic", {"factor": 2.0}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16, "beta_slow": 2,
              "mscale": 0.707, "mscale_all_dim": 1.0}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 1.3, "truncate": False}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}),
    ("longrope", {"short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [1.5 + 0.5 * i for i in range(8)],
                  "original_max_position_embeddings": 64}),
]


@pytest.mark.parametrize("rtype,extra", SCALINGS, ids=[f"{t}{i}" for i, (t, _) in enumerate(SCALINGS)])
@pytest.mark.parametrize("length", [None, 48, 1000])
def test_frequencies_match_transformers(tiny, tmp_path, rtype, extra, length):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    dst = tmp_path / "m"
    shutil.copytree(tiny("qwen2"), dst)
    cfg = _cfg(dst)
    cfg["max_position_embeddings"] = 256
    cfg["rope_parameters"] = {"rope_type": rtype, "rope_theta": 10000.0, **extra}
    (dst / "config.json").write_text(json.dumps(cfg))
    tcfg = transformers.Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    if rtype == "default":
        inv_t = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
        af_t = 1.0
    else:
        # the runtime's length: ours evaluates at max positions when none is given
        inv_t, af_t = ROPE_INIT_FUNCTIONS[rtype](tcfg, None, seq_len=length or cfg["max_position_embeddings"])
    with open_checkpoint(dst) as ck:
        rf = rope_frequencies(ck.layout(), ck.config, length=length)
    # transformers computes in float32: agreement to a few float32 ulps
    np.testing.assert_allclose(rf.inv_freq, inv_t.double().numpy(), rtol=4e-7, atol=0)
    assert rf.attention_factor == pytest.approx(float(af_t), rel=1e-12)
    assert rf.rope_type == rtype


def test_whatif_and_cli(tiny, tmp_path):
    src = tiny("qwen2_long")
    with open_checkpoint(src) as ck:
        p = distance_profile(ck, context=4096, scaling=parse_rope_scaling("yarn:4"), theta=1e7)
    assert p.whatif is not None and p.whatif.context == 4 * 4096 and p.context == 4096
    assert p.whatif.rope.rope_type == "yarn" and p.whatif.rope.theta == 1e7
    assert p.whatif.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert p.deltas[-1] == 4 * 4096 - 1
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, ["analyze", str(src), "--distance-profile", "--context", "4096", "--rope-scaling",
                                 "linear:2", "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["distance_profile"]
    assert {"deltas", "attn_scale", "attention_factor", "rope", "model", "layers"} <= set(d)
    h = d["layers"][0]["heads"][0]
    assert set(h) == {"q_head", "kv_head", "bias", "mean", "cov"} and h["mean"] is None
    assert len(h["bias"]["f"]) == len(d["deltas"]) and d["whatif"]["rope"]["rope_type"] == "linear"
    r = CliRunner().invoke(cli, ["analyze", str(src), "--distance-profile", "--deltas", "log:10", "--format", "csv"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0] == "profile,layer,q_head,kv_head,term,delta,value"
    n_d = len(default_deltas(32767, 10))                       # qwen2_long: 32768 positions
    assert len(lines) - 1 == 2 * 4 * n_d and lines[-1].startswith("config,1,3,1,bias,32767,")   # layers x heads x Δ
    r = CliRunner().invoke(cli, ["analyze", str(src), "--distance-profile", "--per-head", "--format", "markdown"])
    assert r.exit_code == 0 and "half_first" in r.output and r.output.count("\n| 1 |") == 4
    r = CliRunner().invoke(cli, ["analyze", str(src), "--rope-theta", "1e7"])
    assert r.exit_code == 2 and "--distance-profile" in r.output
    r = CliRunner().invoke(cli, ["analyze", str(src), "--distance-profile", "--rope-scaling", "yarn:x"])
    assert r.exit_code == 2 and "--rope-scaling 'yarn:x'" in r.output


@pytest.mark.parametrize("name,note", [("qwen3", "q/k-norm"), ("gpt2", "no rotary"), ("llama", "no q/k biases")])
def test_nothing_to_profile_gets_a_note(tiny, name, note):
    p = _profile(tiny(name))
    notes = list(p.notes) + [lp.note for lp in p.layers]
    assert any(note in (n or "") for n in notes)
    assert not any(lp.heads for lp in p.layers)
    m = measure_profile(tiny(name), p, device="cpu")          # no model is loaded for nothing
    assert m.notes[-1] == "--measure: no layer has a profile, nothing was measured" and m.measured is None


def test_partial_rotary_reports_the_pass_through_constant(tiny):
    src = tiny("phi")
    p = _profile(src, deltas=ALL)
    cfg = _cfg(src)
    assert p.rope.rotary_dim < cfg["hidden_size"] // cfg["num_attention_heads"]
    t = load_file(src / "model.safetensors")
    H, G = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd, r = cfg["hidden_size"] // H, p.rope.rotary_dim
    for lp in p.layers:
        bq = t[f"model.layers.{lp.layer}.self_attn.q_proj.bias"].astype(np.float64).reshape(H, hd)
        bk = t[f"model.layers.{lp.layer}.self_attn.k_proj.bias"].astype(np.float64).reshape(G, hd)
        for h in lp.heads:
            want = hd ** -0.5 * bq[h.q_head, r:] @ bk[h.q_head // (H // G), r:]
            assert h.summary.pass_const == pytest.approx(want, rel=1e-12) and want != 0
            # the pass-through part does not move with Δ: the spread bound ignores it and holds
            assert np.ptp(h.f) <= h.summary.spread_bound * (1 + 1e-12)


def test_plots(tiny, tmp_path):
    from ckpt_surgeon.analysis.distance_plots import plot_profile
    written = plot_profile(_profile(tiny("qwen2")), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["g_heatmap.png", "g_layer0.png", "g_layer1.png", "pairs_layer0.png",
                                              "pairs_layer1.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_static_profile_does_not_import_torch(tiny):
    """The static profile reads biases and the config only (numpy): checked in a fresh process."""
    import subprocess
    import sys
    code = ("import sys; from ckpt_surgeon.checkpoint import open_checkpoint; "
            "from ckpt_surgeon.analysis.distance_profile import distance_profile; "
            f"ck = open_checkpoint({str(tiny('qwen2'))!r}); p = distance_profile(ck); "
            "assert p.layers[0].heads; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_measure_through_the_gguf(tiny, tmp_path):
    """``--distance-profile --measure`` end to end on the project's GGUF of the tiny qwen2 (loaded
    through gguf_as_folder): mean and covariance terms in the JSON, the CSV's long form carries them."""
    g = hf_to_gguf(tiny("qwen2"), tmp_path / "m.gguf", dtype="f32", name="tiny")
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, ["analyze", str(g), "--distance-profile", "--measure", "--dtype", "float64",
                                 "--max-tokens", "48", "--skip-first", "2", "--deltas", "0,1,2,4,8,16,32,64",
                                 "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["distance_profile"]
    assert d["measured"]["skip_first"] == 2 and d["measured"]["max_delta"] == 45
    h = d["layers"][1]["heads"][2]
    assert set(h["mean"]) == {"f", "bias_bias", "bias_content", "content_bias", "content_content"}
    assert h["cov"]["mean_logit"][-1] is None and h["cov"]["mean_logit"][-2] is not None   # 64 > 45, 32 <= 45
    # float32 rotary angles in the runtime (see the measured-mode test): ~1e-8 here
    assert h["cov"]["residual"] < 1e-5
    r = CliRunner().invoke(cli, ["analyze", str(g), "--distance-profile", "--measure", "--dtype", "float64",
                                 "--max-tokens", "48", "--deltas", "0,1,2", "--format", "csv"])
    assert r.exit_code == 0, r.output
    terms = {line.split(",")[4] for line in r.output.strip().splitlines()[1:]}
    assert terms == {"bias", "mean", "mean_bias_bias", "mean_bias_content", "mean_content_bias",
                     "mean_content_content", "cov", "drift", "mean_logit", "mean_logit_se", "sum_of_parts"}
