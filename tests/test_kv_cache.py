"""analyze --kv-cache: the cache-type table, the block model against ggml's kernels, the CLI, and the
static ranking of the fixture's layers against a ranking measured from a transformers forward pass with
ggml-quantized keys and queries."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.analysis.kv_cache import CACHE_TYPES, KV_TYPES, analyze_kv_cache, block_error_var
from ckpt_surgeon.cli import cli
from ckpt_surgeon.formats.quant import ggml_quant as GQ
from fixtures.kv_fixture import PLANTED, kv_fixture_path


def test_types_from_gguf_py():
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
    for name in ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"):
        ct = CACHE_TYPES[name]
        assert (ct.block, ct.type_size) == GGML_QUANT_SIZES[T[name.upper()]]
    # ggml-cpu type_traits_cpu vec_dot_type
    assert {n: CACHE_TYPES[n].dot_type for n in ("q4_0", "q5_0", "iq4_nl", "q8_0", "q4_1", "q5_1")} == \
        {"q4_0": "q8_0", "q5_0": "q8_0", "iq4_nl": "q8_0", "q8_0": "q8_0", "q4_1": "q8_1", "q5_1": "q8_1"}


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_block_model_against_ggml(name):
    """Blocks of content N(0, 1) plus a bias of 20 on one dim: the modelled error variance of the small
    values is within a factor 2.5 of what ggml's own kernel does (the model uses the expected block max;
    iq4_nl's non-uniform levels are modelled by their spacing near zero)."""
    rng = np.random.default_rng(0)
    n_blocks, b = 4000, 32
    mean = np.zeros((n_blocks, b))
    mean[:, 5] = 20.0
    x = (mean + rng.standard_normal((n_blocks, b))).astype(np.float32)
    q = GQ.dequantize(GQ.quantize_rows(x.reshape(1, -1), name), name, x.size).reshape(x.shape)
    measured = float(((q - x)[:, np.arange(b) != 5] ** 2).mean())
    ev, share = block_error_var(mean.reshape(1, -1)[:, :b], np.ones((1, b)), CACHE_TYPES[name])
    predicted = float(ev[0, 0])
    assert 1 / 2.5 < predicted / measured < 2.5, (name, predicted, measured)
    assert share[0, 0] > 0.8       # the bias sets most of the step


def test_cli_table_json_and_bad_input(tiny, tmp_path):
    src = str(kv_fixture_path("concentrated"))
    r = CliRunner().invoke(cli, ["analyze", src, "--kv-cache", "q4_0,q8_0"])
    assert r.exit_code == 0, r.output
    assert "at risk" in r.output and "K q4_0" in r.output and "q4_0:K" in r.output
    r = CliRunner().invoke(cli, ["analyze", src, "--kv-cache", "q4_0", "--per-head", "--format", "json"])
    d = json.loads(r.output)["kv_cache"]
    assert d["at_risk"]["q4_0"] == sorted(PLANTED)
    assert {h["kv_head"] for h in d["heads"]} == {0, 1}
    r = CliRunner().invoke(cli, ["analyze", src, "--kv-cache", "q4_0,q2_k"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "known: " + ", ".join(KV_TYPES) in r.output
    r = CliRunner().invoke(cli, ["analyze", str(tiny("deepseek_v2")), "--kv-cache", "q4_0"])
    assert r.exit_code == 2 and "latent" in r.output and "still reports" in r.output


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def measured_logit_error(folder, k_type: str = "q4_0", q_type: str = "q8_0", n_tokens: int = 96,
                         attn_rot: bool = True) -> np.ndarray:
    """Per layer: RMS over query heads and causal (query, key) pairs of the attention-logit change (each
    query's row centred: softmax ignores a common shift) when the
    post-RoPE keys go through ``k_type`` and the queries through ``q_type`` (ggml's kernels, blocks of 32
    along the head dim), from a float32 transformers forward pass on the tiny tokenizer's text; ``attn_rot``:
    both first multiplied by llama.cpp's Hadamard chunks (the Qwen2 fixture's cache order is its own)."""
    from ckpt_surgeon.analysis.kv_rot import rot_size, rotate_rows
    import torch
    import transformers
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    text = ("The quick brown fox jumps over the lazy dog. def softmax(x): return exp(x) / sum(exp(x)). "
            "Numbers 1 2 3 4 5 and words, words, words in a sentence that keeps going for a while. ") * 4
    ids = tok(text, return_tensors="pt").input_ids[:, :n_tokens]
    cfg = model.config
    d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    caught = {}
    hooks = [layer.self_attn.q_proj.register_forward_hook(lambda m, i, o, j=j: caught.__setitem__(("q", j), o))
             for j, layer in enumerate(model.model.layers)]
    hooks += [layer.self_attn.k_proj.register_forward_hook(lambda m, i, o, j=j: caught.__setitem__(("k", j), o))
              for j, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(ids)
        pos = torch.arange(ids.shape[1])[None]
        cos, sin = model.model.rotary_emb(caught[("q", 0)], pos)
    for hk in hooks:
        hk.remove()
    n = ids.shape[1]
    out = []
    for j in range(cfg.num_hidden_layers):
        q = caught[("q", j)].view(1, n, h, d).transpose(1, 2)
        k = caught[("k", j)].view(1, n, kv, d).transpose(1, 2)
        q, k = (t[0].numpy().astype(np.float32) for t in apply_rotary_pos_emb(q, k, cos, sin))
        rot = rot_size(d, k_type, "k", attn_rot)
        q, k = rotate_rows(q, rot), rotate_rows(k, rot)
        qq = GQ.dequantize(GQ.quantize_rows(q.reshape(-1, d), q_type), q_type, q.size).reshape(q.shape)
        kq = GQ.dequantize(GQ.quantize_rows(k.reshape(-1, d), k_type), k_type, k.size).reshape(k.shape)
        k_full, kq_full = np.repeat(k, h // kv, 0), np.repeat(kq, h // kv, 0)
        ref = q @ k_full.transpose(0, 2, 1) / np.sqrt(d)
        got = qq @ kq_full.transpose(0, 2, 1) / np.sqrt(d)
        mask = np.tril(np.ones((n, n), bool))
        err = np.where(mask, got - ref, 0.0)
        # softmax ignores a shift common to a query's row: centre each row over its causal keys
        err = np.where(mask, err - err.sum(-1, keepdims=True) / mask.sum(-1, keepdims=True), 0.0)
        out.append(float(np.sqrt((err[:, mask] ** 2).mean())))
    return np.array(out)


@pytest.mark.parametrize("variant,attn_rot", [("concentrated", True), ("spread", True), ("concentrated", False),
                                              ("spread", False)])
def test_fixture_ranking(variant, attn_rot):
    """With and without llama.cpp's Hadamard rotation, the static ranking follows the measured one."""
    folder = kv_fixture_path(variant)
    rep = analyze_kv_cache(str(folder), "q4_0", attn_rot=attn_rot)
    static = np.array([r.k_error for r in rep.layers])
    measured = measured_logit_error(folder, attn_rot=attn_rot)
    order = list(np.argsort(-static))
    assert set(order[:len(PLANTED)]) == set(PLANTED), (static, measured)
    assert set(np.argsort(-measured)[:len(PLANTED)]) == set(PLANTED), measured
    rho = _spearman(static, measured)
    assert rho >= 0.8, (rho, static, measured)
    assert rep.at_risk("q4_0") == sorted(PLANTED)


@pytest.mark.parametrize("variant,k_type,gain,scales", [
    ("concentrated", "q8_0", 2.0, "pow2"), ("concentrated", "q4_0", 2.5, "pow2"),
    ("spread", "q4_0", 1.05, "continuous"), ("spread", "q4_0", 1.0, "pow2"),
    ("clean", "q4_0", 1 / 1.05, "pow2"), ("clean", "q8_0", 1 / 1.05, "pow2")])
def test_equalize_measured(tmp_path, variant, k_type, gain, scales):
    """kv-equalize lowers the measured logit error (RMS over layers; Q and K rotated as llama.cpp rotates
    them) by at least ``gain`` (clean: no harm beyond 5 %).  Measured 2026-11-28 (this code): concentrated q8_0
    4.04x, q4_0 4.37x; spread q4_0 1.18x with continuous scales, 1.0x with powers of two; clean 1.0x at both
    (plain blocks, before the rotation and pair turns: 1.2x and 1.5x, docs/surgery.md);
    the thresholds leave room for float and token-set noise, not for a regression of the optimizer.  The spread
    variant's gain needs continuous scales: with powers of two (the default) every layer's predicted gain is
    under the no-harm guard's 10 % and the model is left as it is (ratio exactly 1)."""
    from ckpt_surgeon import kv_equalize
    folder = kv_fixture_path(variant)
    kv_equalize(str(folder), str(tmp_path / "eq"), cache_type_k=k_type, scales=scales)
    before, after = measured_logit_error(folder, k_type), measured_logit_error(tmp_path / "eq", k_type)
    ratio = float(np.sqrt(np.mean(before ** 2)) / np.sqrt(np.mean(after ** 2)))
    assert ratio >= gain, (ratio, before, after)


def test_lint_row():
    from ckpt_surgeon import lint
    rep = lint(str(kv_fixture_path("concentrated")))
    hits = [f for f in rep.findings if f.check == "kv-cache-risk"]
    assert {f.tensor for f in hits} == {f"model.layers.{i}.self_attn.k_proj.bias" for i in PLANTED}
    assert all(f.severity == "warning" and "kv-equalize" in f.fix for f in hits)
    assert not [f for f in lint(str(kv_fixture_path("clean"))).findings if f.check == "kv-cache-risk"]


def test_demo_kv_runs_the_recipe_on_the_fixture(tmp_path, monkeypatch):
    """Issue 50 item 3: docs/kv-cache.md's figures come from the fixture, which ``ckpt-surgeon demo --kv`` builds and
    runs the recipe on (analyze, kv-equalize per K type, convert, verify --cache-sweep in llama.cpp over the shipped
    corpus).  Here on 2 of the doc's 8 chunks: equalizing must lower llama.cpp's mean KLD for both K types (the doc's
    8 chunks give 3.69x and 11.88x; 2x leaves room for the shorter corpus, and a rescaling that did nothing gives
    1.00x)."""
    from ckpt_surgeon.demo_kv import run_kv_demo
    from fixtures.build_fixtures import fixture_base
    monkeypatch.setenv("CKPT_SURGEON_FIXTURE_CACHE", str(fixture_base()))     # the fixture the tests built
    lines = []
    ctx = run_kv_demo(tmp_path / "demo", say=lines.append, chunks=2)
    assert ctx.model == kv_fixture_path("concentrated")
    ratio = ctx.results["ratio"]
    assert ratio["q4_0"] > 2 and ratio["q8_0"] > 2, ratio
    text = "\n".join(lines)
    for needle in ("--kv-cache q4_0,q8_0", "kv-equalize", "--corpus builtin --ctx 256 --chunks 2 --cache-sweep",
                   f"K q4_0: mean KLD {ctx.results['original']['q4_0'].kl_mean:.6f} -> "):
        assert needle in text, needle
    assert sorted(p.name for p in (tmp_path / "demo").iterdir() if p.suffix == ".gguf") == [
        "kv-eq-q4_0.f16.gguf", "kv-eq-q8_0.f16.gguf", "kv-original.f16.gguf"]
