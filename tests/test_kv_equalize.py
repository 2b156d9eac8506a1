"""kv-equalize: the pair / value rescaling is exact (transformers, float64) and never raises the prediction.

Exactness is judged on every tiny registry family with RoPE and q/k biases (GQA, partial rotary, fused
QKV layouts, per-head and whole-projection q/k-norm, Gemma's ``1 + w`` norm offset, soft-capping), on a
rope-scaled Qwen2, and on GGUF files of both pair layouts (llama-arch rows permuted to interleaved
pairs; qwen2 rows in rotate_half order).  A transform that scales Q without the inverse on K must fail
the same check, so the check can fail.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon import kv_equalize, open_checkpoint
from ckpt_surgeon.analysis.kv_cache import KV_TYPES
from ckpt_surgeon.cli import cli as cli_main
from ckpt_surgeon.surgery.kv_equalize import plan_kv_equalize
from ckpt_surgeon.surgery.plan import execute
from ckpt_surgeon.tiny import tiny_names
from tests.zoo_util import logits64

# Every tiny family with RoPE and a q/k bias (test_family_list derives the same list from the layouts).
FAMILIES = ["qwen2", "qwen2_long", "qwen2_sharded", "llama_bias", "qwen3", "gemma3", "gemma2", "phi", "gpt_neox",
            "falcon", "falcon_mq", "falcon_old", "starcoder2", "qwen2_moe", "phimoe", "stablelm", "olmo2"]

# The equalized weights are the float32 originals times scales in (~1e-2, ~1e2), rounded once to
# float32: a relative 6e-8 per weight, which through two tiny layers moves logits by ~1e-6 of their
# size.  A wrong transform (Q scaled without 1/alpha on K) moves them by a sizeable fraction.
REL_TOL = 1e-5


def _max_delta(a, b) -> tuple[float, float]:
    d = float((a - b).abs().max())
    return d, d / max(float(a.abs().max()), 1e-12)


def _equalize(src, out, **kw):
    return kv_equalize(str(src), str(out), **kw)


def test_family_list(tiny):
    found = []
    for n in tiny_names():
        with open_checkpoint(str(tiny(n))) as ck:
            lay = ck.layout()
            if lay.position.type == "rope" and any(lt.k_bias or lt.qkv_bias for lt in lay.layers):
                found.append(n)
    assert sorted(found) == sorted(FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_exact(tiny, tmp_path, name):
    src = tiny(name)
    with open_checkpoint(str(src)) as ck:
        lay = ck.layout()
    # a kv row of 16 values (falcon_mq: one kv head of 16) holds no block of 32: the per-tensor fp8 type then
    blocks = (lay.num_kv_heads * lay.head_dim) % 32 == 0
    t_k, t_v = ("q4_0", "q8_0") if blocks else ("fp8_e4m3", "fp8_e4m3")
    rep = _equalize(src, tmp_path / "eq", cache_type_k=t_k, cache_type_v=t_v)
    d, rel = _max_delta(logits64(src), logits64(tmp_path / "eq"))
    assert rel < REL_TOL, (name, d, rel)
    if not rep.plan.changed or not any(r.alpha_max / r.alpha_min > 1.01 for r in rep.layers):
        # the optimizer kept alpha = 1 (falcon_mq's per-tensor fp8 has nothing to gain; the no-harm guard then
        # writes nothing): the same steps with
        # random pair scales, so the family's exactness is still judged on a real transform
        _random_scales(src, tmp_path / "rnd")
        d, rel = _max_delta(logits64(src), logits64(tmp_path / "rnd"))
        assert rel < REL_TOL, (name, "random scales", d, rel)


def _random_scales(src, out):
    from ckpt_surgeon.analysis.kv_cache import kv_geometry
    from ckpt_surgeon.surgery.kv_equalize import layer_steps
    from ckpt_surgeon.surgery.plan import Plan
    rng = np.random.default_rng(0)
    with open_checkpoint(str(src)) as ck:
        lay = ck.layout()
        geom = kv_geometry(ck, lay)
        steps = []
        for lt in lay.layers:
            alpha = np.ones((lay.num_kv_heads, lay.head_dim))
            for g in geom.groups():
                alpha[:, g] = np.exp(rng.uniform(-1, 1, (lay.num_kv_heads, 1)))
            m = np.exp(rng.uniform(-1, 1, (lay.num_kv_heads, lay.head_dim)))
            steps += layer_steps(ck, lay, lt, alpha, m)
        execute(ck, Plan("kv-equalize", str(src), {}, tuple(steps)), out)


def test_exact_rope_scaling(tiny, tmp_path):
    src = tmp_path / "yarn"
    shutil.copytree(tiny("qwen2"), src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 64}
    (src / "config.json").write_text(json.dumps(cfg))
    _equalize(src, tmp_path / "eq", cache_type_k="q8_0", cache_type_v="q4_0")
    d, rel = _max_delta(logits64(src), logits64(tmp_path / "eq"))
    assert rel < REL_TOL, (d, rel)


@pytest.mark.parametrize("name,layout", [("llama_bias", "interleaved"), ("qwen2", "rotate_half")])
def test_exact_gguf(tiny, tmp_path, name, layout):
    from ckpt_surgeon.conversion.from_gguf import gguf_to_hf
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf

    g = hf_to_gguf(tiny(name), tmp_path / "m.gguf", dtype="f32")
    rep = _equalize(g, tmp_path / "eq.gguf", cache_type_k="q4_0", cache_type_v="q4_0")
    assert rep.plan.params["pair_layout"] == layout
    gguf_to_hf(g, tmp_path / "a")
    gguf_to_hf(tmp_path / "eq.gguf", tmp_path / "b")
    d, rel = _max_delta(logits64(tmp_path / "a"), logits64(tmp_path / "b"))
    assert rel < REL_TOL, (d, rel)


def test_wrong_transform_fails(tiny, tmp_path):
    """alpha on Q without 1/alpha on K: the same check must see it (continuous scales: every pair moves, where
    powers of two leave most of the tiny model's pairs at 1 and the error is only ~17x the tolerance)."""
    src = tiny("qwen2")
    with open_checkpoint(str(src)) as ck:
        plan = plan_kv_equalize(ck, cache_type_k="q4_0", scales="continuous")
        bad = replace(plan, steps=tuple(s for s in plan.steps if "k_proj" not in s.out))
        assert len(bad.steps) < len(plan.steps)
        execute(ck, bad, tmp_path / "bad")
    d, rel = _max_delta(logits64(src), logits64(tmp_path / "bad"))
    assert rel > 100 * REL_TOL, (d, rel)


@pytest.mark.parametrize("name", ["qwen2", "llama_bias", "qwen3", "phi", "gpt_neox", "falcon", "olmo2", "llama",
                                  "mistral", "cohere", "starcoder2"])
def test_no_harm_predicted(tiny, name):
    """On the tiny families, equalizing for a type never raises that type's predicted error."""
    with open_checkpoint(str(tiny(name))) as ck:
        for t in KV_TYPES:
            plan = plan_kv_equalize(ck, cache_type_k=t, cache_type_v=t)
            for r in plan.layers:
                assert r.k_after <= r.k_before * (1 + 1e-9), (name, t, r)
                assert r.v_after <= r.v_before * (1 + 1e-9), (name, t, r)


def test_input_untouched_and_bad_input(tiny, tmp_path):
    src = tiny("qwen2")
    before = {p.name: p.read_bytes() for p in Path(src).iterdir() if p.is_file()}
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "x"), "--cache-type-k", "q3_k"])
    assert r.exit_code == 2 and "unknown KV-cache type 'q3_k'; known: q8_0, q4_0" in r.output
    assert not (tmp_path / "x").exists()
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(tiny("deepseek_v2")), "-o", str(tmp_path / "y")])
    assert r.exit_code == 2 and "multi-head latent attention (MLA)" in r.output, r.output
    assert not (tmp_path / "y").exists()
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "z"), "--cache-type-k", "q4_0"])
    assert r.exit_code == 0, r.output
    assert "K before" in r.output and "K after" in r.output
    assert {p.name: p.read_bytes() for p in Path(src).iterdir() if p.is_file()} == before
    with open_checkpoint(str(tmp_path / "z")) as a, open_checkpoint(str(src)) as b:
        assert np.array_equal(a.read("model.embed_tokens.weight"), b.read("model.embed_tokens.weight"))


def test_quantized_weights_refused(tiny, tmp_path):
    """A quantized GGUF's Q/K rows cannot be rescaled without re-quantizing them: one line, exit 2."""
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf
    g = hf_to_gguf(tiny("qwen2"), tmp_path / "m.gguf", dtype="q8_0")
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(g), "-o", str(tmp_path / "eq.gguf")])
    assert r.exit_code == 2 and "quantized type" in r.output and r.output.count("\n") == 1, r.output
    assert not (tmp_path / "eq.gguf").exists()
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(tiny("qwen2")), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 2 and "source's own format" in r.output


def test_report_records(tiny):
    rep = kv_equalize(str(tiny("qwen2")), "unused", cache_type_k="q8_0", dry_run=True)
    d = rep.to_dict()
    assert d["out"] is None and d["write"] is None and len(d["layers"]) == 2
    assert {"K before", "K after", "K ratio"} <= set(rep.rows()[0])
    from ckpt_surgeon.analysis.kv_cache import analyze_kv_cache
    frame = analyze_kv_cache(str(tiny("qwen2")), "q4_0,fp8").to_frame()
    assert set(frame["cache_type"]) == {"q4_0", "fp8_e4m3"} and len(frame) == 2 * 2 * 2
