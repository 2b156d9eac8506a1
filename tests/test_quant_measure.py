"""Quantized checkpoints (``fixtures/quant/<scheme>``, written by the real quantizers) run with
transformers: ``analyze --measure`` and ``verify`` build the unquantized architecture from
config.json (``quantization_config`` removed) and load the checkpoint's own dequantization (our
reader: element-exact against the producer's, tests/test_quant_read.py).  The reports say so, and
say which schemes quantize activations at runtime, which such a run leaves out.

Where transformers' own quantized runtime runs on this CPU (compressed-tensors 0.19 and
bitsandbytes 0.50, from the test extra), its logits are compared with ours."""
from __future__ import annotations

import json

import numpy as np
import pytest
from cli_util import _run
from test_quant_fixtures import SCHEMES as FIXTURE_BOUNDS
from test_quant_read import BASE, QUANT, SCHEMES, _oracle

from ckpt_surgeon.analysis.measure import measure
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.conversion.dense import quantized_to_dense

# Short prompts keep 18 measured runs to seconds; two of them so each layer sees two contexts.
PROMPTS = ["The attention layer projects every token into a query, a key and a value.",
           "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n    return e\n"]
MAX_TOKENS = 64

# The schemes whose runtime quantizes activations (what a dequantized run leaves out), as
# config.json declares it: compressed-tensors input_activations, fp8 activation_scheme, LLM.int8.
ACTIVATIONS = {"ct_fp8_dynamic": "float 8-bit, dynamic per token", "ct_fp8_block": "float 8-bit, dynamic per group of 128",
               "ct_w8a8_int": "int 8-bit, dynamic per token", "fp8_block_deepseek": "float8, dynamic per token",
               "bnb_int8": "LLM.int8",
               "ct_nvfp4": "float 4-bit, dynamic per group of 16 under a static global scale (input_global_scale)",
               "ct_mixed": "float 8-bit, dynamic per token", "modelopt_nvfp4": "float 4-bit, static per group of 16",
               "modelopt_fp8": "float 8-bit, static per tensor", "modelopt_mixed": "float 8-bit, static per tensor",
               "modelopt_fp8_pc_pt": "float 8-bit, dynamic per token"}


def test_every_fixture_has_a_weight_error_bound():
    assert set(SCHEMES) <= set(FIXTURE_BOUNDS), sorted(set(SCHEMES) - set(FIXTURE_BOUNDS))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dense_folder_is_the_logical_layout(scheme, tmp_path):
    """What measured mode and verify load: every quantized weight the producer's dequantization
    (float32, bit for bit), every other tensor its stored bytes, the config without its
    quantization keys."""
    out = quantized_to_dense(QUANT / scheme, tmp_path / "dense")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and "quantization" not in cfg
    oracle = _oracle(scheme)
    with open_checkpoint(out) as d, open_checkpoint(QUANT / scheme) as q:
        assert d.quantization is None
        assert {n: tuple(i.shape) for n, i in d.tensors.items()} == {n: tuple(i.shape) for n, i in q.tensors.items()}
        for name, info in q.tensors.items():
            if name in oracle:
                assert d.tensors[name].dtype == "F32"
                np.testing.assert_array_equal(d.read(name), oracle[name], err_msg=name)
            else:
                assert d.read_raw(name) == q.read_raw(name), name
    assert (out / "tokenizer.json").read_bytes() == (QUANT / scheme / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def base_measured():
    return measure(BASE, prompts=PROMPTS, device="cpu", max_tokens=MAX_TOKENS)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_measured_mode_runs_and_agrees_with_the_base_model(scheme, base_measured):
    """Every fixture measures, and every measured logit change is the unquantized model's within
    the scheme's weight error.

    Tolerance: the measured quantity (the change of layer l's attention logits when key-bias
    components are removed) is linear in the query ``q = W_q x + b_q`` (the removed b_k is stored
    unquantized, its values the base's).  Quantizing the weights with relative error r
    (``rel``: the scheme's bound on ``||W_deq - W|| / ||W||`` from tests/test_quant_fixtures.py:
    4-bit RTN 0.15, 8-bit 0.015, FP8 0.04, GPTQ / AWQ 0.25) moves ``W_q x`` by at most ~r of itself
    and the layer's input by the same order through the layers before it, while ``b_q`` (large
    here: N(0, 0.5)) is exact; so the relative change of the measurement stays within r.
    Observed: at most 0.47 r (ct_fp8_dynamic), typically 0.01-0.3 r.  The output KL of removing
    the whole key bias is quadratic in the logit change: within 2r relative (observed <= 0.3 r).
    """
    m = measure(QUANT / scheme, prompts=PROMPTS, device="cpu", max_tokens=MAX_TOKENS)
    r = FIXTURE_BOUNDS[scheme]["rel"]
    b = {(lm.layer, v.variant): v for lm in base_measured.layers for v in lm.variants}
    got = {(lm.layer, v.variant): v for lm in m.layers for v in lm.variants}
    assert set(got) == set(b) and b
    for key, vb in b.items():
        vq = got[key]
        assert abs(vq.logit - vb.logit) <= r * vb.logit + vb.noise, (scheme, key, vq.logit, vb.logit)
        assert vq.within_bound is not False, (scheme, key)
    ob, oq = base_measured.output("all"), m.output("all")
    assert abs(oq.kl_max - ob.kl_max) <= 2 * r * ob.kl_max, (scheme, oq.kl_max, ob.kl_max)
    # what ran, said plainly
    dq = m.dequantized
    with open_checkpoint(QUANT / scheme) as ck:
        method, bits = ck.quantization.method, ck.quantization.bits
    assert dq.note().startswith(f"weights dequantized by ckpt-surgeon ({method}, {'/'.join(map(str, bits))}-bit); "
                                "activations not quantized")
    d = m.to_dict()["quantization"]
    assert d["weights"] == "dequantized by ckpt-surgeon" and d["activations"] == "not quantized"
    assert d["method"] == method and d["bits"] == list(bits)
    if scheme in ACTIVATIONS:
        assert ACTIVATIONS[scheme] in d["runtime_activation_quantization"]
        assert d["activation_quantization_excluded"] is True and "which this measurement excludes" in dq.note()
    else:
        assert d["runtime_activation_quantization"] is None and d["activation_quantization_excluded"] is False
    assert base_measured.dequantized is None and base_measured.to_dict()["quantization"] is None


@pytest.mark.parametrize("scheme, want", [
    ("mlx_4bit", "weights dequantized by ckpt-surgeon (mlx, 4-bit); activations not quantized"),
    ("ct_w8a8_int", "the checkpoint quantizes activations at runtime (int 8-bit, dynamic per token), which this "
                    "measurement excludes"),
])
def test_cli_table_and_json_say_what_ran(scheme, want, tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(PROMPTS[:1]))
    args = ("analyze", QUANT / scheme, "--measure", "--device", "cpu", "--prompts", prompts, "--max-tokens", 32)
    res = _run(*args)
    assert res.exit_code == 0, res.output
    # the summary's "quantized model" row (the table may wrap a long value over lines)
    flat = " ".join(res.stdout.split())
    assert "quantized model" in flat and " ".join(want.split()) in flat, res.stdout
    res = _run(*args, "--format", "json")
    assert res.exit_code == 0, res.output
    q = json.loads(res.stdout)["measured"]["quantization"]
    assert want in q["note"] and q["weights"] == "dequantized by ckpt-surgeon"


def test_distance_profile_measure_says_what_ran():
    from ckpt_surgeon.analysis.api import analyze
    rep = analyze(QUANT / "gptqmodel_gptq", measure=True, distance_profile=True, prompts=PROMPTS, device="cpu",
                  max_tokens=MAX_TOKENS, deltas="log:4")
    prof = rep.distance_profile
    assert prof.measured["quantization"]["method"] == "gptq"
    assert any(n.startswith("measured: weights dequantized by ckpt-surgeon (gptq, 4-bit)") for n in prof.notes)


def test_unsupported_quant_method_refused_in_one_line(tmp_path):
    import shutil
    bad = tmp_path / "hqq"
    shutil.copytree(QUANT / "gptqmodel_gptq", bad, ignore=shutil.ignore_patterns("oracle.safetensors"))
    c = json.loads((bad / "config.json").read_text())
    c["quantization_config"]["quant_method"] = "hqq"
    (bad / "config.json").write_text(json.dumps(c))
    res = _run("analyze", bad, "--measure", "--device", "cpu")
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "quant_method 'hqq' is not supported" in lines[0], res.stderr


# ------------------------------------------------------------------------------------ verify


@pytest.mark.parametrize("scheme", ["mlx_4bit", "fp8_block_deepseek", "ct_mixed", "modelopt_nvfp4"])
def test_verify_in_memory_and_streamed_agree(scheme):
    """verify runs a quantized candidate both ways (a temporary dense folder loaded whole, or its
    layers streamed through the reader): the same model, so the same numbers (float32 noise)."""
    from ckpt_surgeon.verification.core import verify
    par = verify(BASE, QUANT / scheme, prompts=PROMPTS, max_new_tokens=0, device="cpu")
    st = verify(BASE, QUANT / scheme, prompts=PROMPTS, stream=True, device="cpu")
    assert par.mode == "parallel" and st.mode == "stream"
    assert par.storage_dtypes[1] == st.storage_dtypes[1] == "quantized"
    # float32: the two runs differ only in how tensors reach the modules (same values, same ops)
    assert st.metrics.max_rel_diff == pytest.approx(par.metrics.max_rel_diff, rel=1e-5)
    assert st.metrics.max_kl == pytest.approx(par.metrics.max_kl, rel=1e-4)
    # the quantization error (mlx 4-bit quantizes the embedding and head too: 0.13), not another model
    assert 0 < par.metrics.max_rel_diff < 0.3
    for rep in (par, st):
        assert any(n.startswith(f"{QUANT / scheme}: weights dequantized by ckpt-surgeon") for n in rep.notes), rep.notes


# ------------------------------------------------------- transformers' own quantized runtime on CPU


def _logits(model, ids):
    import torch
    with torch.no_grad():
        return model(input_ids=ids).logits.double().numpy()


def _ours(scheme, dtype, tmp_path):
    from transformers import AutoModelForCausalLM

    from ckpt_surgeon import runtime
    dense = runtime.quantized_to_folder(QUANT / scheme, tmp_path / "dense")
    return runtime.load_pretrained(AutoModelForCausalLM, dense, dtype=dtype, path=str(QUANT / scheme))


def _native(folder, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    from ckpt_surgeon.quiet import quiet_transformers
    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="eager")


def _ids():
    import torch
    return torch.randint(3, 420, (1, 64), generator=torch.Generator().manual_seed(0))


def _runtime_equals_ours(scheme, dtype, tmp_path):
    from compressed_tensors.quantization.lifecycle.helpers import disable_quantization
    ids = _ids()
    nat = _native(QUANT / scheme, dtype)
    ours = _logits(_ours(scheme, dtype, tmp_path), ids)
    with_acts = _logits(nat, ids)
    nat.apply(disable_quantization)
    np.testing.assert_array_equal(_logits(nat, ids), ours)
    if scheme in ACTIVATIONS:
        assert np.abs(with_acts - ours).max() > 1e-3          # activation quantization is real, and left out
    else:
        np.testing.assert_array_equal(with_acts, ours)       # W4A16: weight-only, nothing left out


@pytest.mark.parametrize("scheme", ["ct_fp8_dynamic", "ct_fp8_block", "ct_w8a8_int", "ct_w4a16_gptq"])
def test_compressed_tensors_runtime_equals_ours(scheme, tmp_path):
    """transformers + compressed-tensors on a CPU decompress the weights into plain Linears and,
    for W8A8 / FP8 schemes, fake-quantize each Linear's input on the fly.  With that activation
    quantization switched off (compressed-tensors' own ``disable_quantization``), its logits equal
    ours bit for bit (same weights: its decompressor is the oracle; same modules and ops).  With
    it on, they differ: that difference is what our report says the measurement excludes."""
    _runtime_equals_ours(scheme, "float32", tmp_path)


@pytest.mark.parametrize("scheme", ["ct_nvfp4a16", "ct_nvfp4", "ct_mxfp4a16", "ct_mxfp8a16", "ct_mixed"])
def test_compressed_tensors_fp4_runtime_equals_ours(scheme, tmp_path):
    """The FP4 / MX formats (and the mixed groups holding one): compressed-tensors decompresses them
    into bfloat16 weights whatever the model's dtype (a float32 model then fails on a bf16 weight), so
    both run in bfloat16; our bfloat16 folder holds the same values (the logical weights are
    bfloat16 values, docs/quantization.md): the logits are equal bit for bit with its activation
    quantization switched off, and differ with it on (NVFP4 W4A4, the mixed folder's FP8 attention)."""
    _runtime_equals_ours(scheme, "bfloat16", tmp_path)


def test_compressed_tensors_asymmetric_pack_not_loadable_by_transformers():
    """transformers 5.24 + compressed-tensors 0.19 cannot load llmcompressor's asymmetric W4A16
    (it expects the zero points unpacked, [out, G]; the file packs them along the output, [out/8,
    G]); our reader dequantizes it (test_quant_read) and measured mode runs it (above)."""
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        _native(QUANT / "ct_w4a16_awq", "float32")


def test_bitsandbytes_nf4_runtime_equals_ours(tmp_path):
    """transformers + bitsandbytes on a CPU run nf4 in bfloat16 (the quant state's compute dtype):
    dequantize_4bit (whose values ours equal bit for bit) then a bfloat16 matmul.  Ours, loaded in
    bfloat16, runs the same weights through torch's Linear.

    Tolerance: every op rounds to bfloat16 (relative 2^-8); the two kernels accumulate and round
    in different places, so a logit may differ by a few roundings.  The logits are below 2 here
    (ulp 2^-7); 4 ulps = 0.031, observed 1 ulp (0.0078).  The check has teeth: the unquantized
    base differs from both by ~0.09, three times the tolerance."""
    ids = _ids()
    ours = _logits(_ours("bnb_nf4", "bfloat16", tmp_path), ids)
    nat = _logits(_native(QUANT / "bnb_nf4", "bfloat16"), ids)
    base = _logits(_native(BASE, "bfloat16"), ids)
    assert np.abs(ours).max() < 2
    tol = 4 * 2.0 ** -7
    assert np.abs(nat - ours).max() <= tol, np.abs(nat - ours).max()
    assert np.abs(nat - base).max() > 2.5 * tol


def test_verify_corpus_says_what_ran(tmp_path):
    """Corpus mode (perplexity / KL over a text) runs a quantized side the same way and says so."""
    corpus = tmp_path / "c.txt"
    corpus.write_text((QUANT / "README.md").read_text()[:3000])
    res = _run("verify", BASE, QUANT / "ct_fp8_dynamic", "--corpus", corpus, "--device", "cpu", "--format", "json")
    assert res.exit_code in (0, 1), res.output
    d = json.loads(res.stdout)
    assert d["mode"] == "corpus"
    assert any("weights dequantized by ckpt-surgeon (compressed-tensors, 8-bit)" in n and "which this measurement "
               "excludes" in n for n in d["notes"]), d["notes"]
