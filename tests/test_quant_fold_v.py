"""``fold-bias --v`` on a quantized output projection (issue 23, item 4).

``b_o' = b_o + W_o·b_v`` needs W_o's values: the fold reads W_o dequantized (our reader,
element-exact against the producer), writes the output bias as a float tensor, zeroes b_v, and
copies every packed tensor byte for byte.  Qwen2 (the ``fixtures/quant`` family) has no o_proj
bias, so the fold is refused there; ``fixtures/quant_obias`` holds a tiny Llama with
``attention_bias=True`` (q, k, v and o biases; 4 heads on 2 kv heads; float32) and its nf4
quantization written by the real bitsandbytes 0.50.2 through transformers (``obias_*`` targets of
``fixtures/quant/build_quant_fixtures.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_util import _run
from fixtures.oracle import read_oracle
from test_quant_measure import _ids, _logits, _native

from ckpt_surgeon.checkpoint import open_checkpoint

OBIAS = Path(__file__).resolve().parent.parent / "fixtures" / "quant_obias"
BASE, NF4 = OBIAS / "base", OBIAS / "bnb_nf4"
LAYERS, HEADS, KV, HD = 2, 4, 2, 32

assert NF4.is_dir(), f"{NF4}: committed test data (fixtures/quant/build_quant_fixtures.py obias_base obias_bnb_nf4)"


def _oracle() -> dict:
    return read_oracle(NF4)


def _stored(folder: Path) -> dict:
    with open_checkpoint(folder) as ck:
        return {n: ck.read_raw(n) for n in ck.stored_tensors}


def test_fixture_is_the_base_quantized_by_bitsandbytes():
    """The folder is what it claims: bitsandbytes nf4 (4-bit, blocks of 64) of the o-bias base,
    every Linear dequantized by our reader equal to bitsandbytes' own ``dequantize_4bit`` (the
    oracle) and within nf4's error of the base (relative 0.15: tests/test_quant_fixtures.py),
    every bias the base's, o_proj's included."""
    oracle = _oracle()
    with open_checkpoint(NF4) as q, open_checkpoint(BASE) as b:
        assert q.quantization.method == "bitsandbytes" and q.quantization.schemes == ("bnb-4bit",)
        assert set(q.quantization.tensors) == set(oracle) and len(oracle) == 7 * LAYERS
        for name, want in oracle.items():
            got = q.read(name)
            np.testing.assert_array_equal(got, want, err_msg=name)
            w = b.read(name)
            assert 1e-4 < np.linalg.norm(got - w) / np.linalg.norm(w) < 0.15, name
        for name, info in b.tensors.items():
            if name.endswith(".bias"):
                assert q.tensors[name].dtype == "F32"
                np.testing.assert_array_equal(q.read(name), b.read(name), err_msg=name)
        assert all(lt.o_bias and lt.v_bias for lt in q.layout().layers)


def _expected_o_bias(folder: Path, layer: int) -> np.ndarray:
    """b_o + W_o·b_v in float64, W_o the producer's dequantization, b_v GQA-expanded: query head
    h reads kv head h // (HEADS / KV)."""
    p = f"model.layers.{layer}.self_attn"
    w_o = _oracle()[f"{p}.o_proj.weight"].astype(np.float64)          # [hidden, HEADS * HD]
    with open_checkpoint(folder) as ck:
        b_o = ck.read(f"{p}.o_proj.bias").astype(np.float64)
        b_v = ck.read(f"{p}.v_proj.bias").astype(np.float64).reshape(KV, HD)
    expanded = b_v[np.arange(HEADS) // (HEADS // KV)].reshape(-1)    # [HEADS * HD]
    return b_o + w_o @ expanded


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    out = tmp_path_factory.mktemp("fold-v") / "folded"
    res = _run("fold-bias", NF4, "-o", out, "--v", "--format", "json")
    assert res.exit_code == 0, res.output
    return out, json.loads(res.stdout)


def test_fold_v_writes_the_float_output_bias_and_leaves_packed_bytes_alone(folded):
    out, d = folded
    assert all(lr["v_folded"] for lr in d["layers"])
    biases = {f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(LAYERS) for p in "ov"}
    assert set(d["tensors_changed"]) == biases
    a, b = _stored(NF4), _stored(out)
    assert set(a) == set(b)
    assert {n for n in a if a[n] != b[n]} == biases          # codes, absmax, quant_map, quant state: identical
    src_cfg = json.loads((NF4 / "config.json").read_text())
    out_cfg = json.loads((out / "config.json").read_text())
    assert out_cfg["quantization_config"] == src_cfg["quantization_config"]
    with open_checkpoint(out) as ck:
        assert ck.quantization is not None and ck.quantization.method == "bitsandbytes"
        for i in range(LAYERS):
            p = f"model.layers.{i}.self_attn"
            assert ck.tensors[f"{p}.o_proj.bias"].dtype == "F32"
            got = ck.read(f"{p}.o_proj.bias")
            want = _expected_o_bias(NF4, i)
            # computed in float64 and rounded once to float32: at most one float32 ulp apart
            # (the two float64 sums may be ordered differently)
            assert np.all(np.abs(got - want) <= np.spacing(np.abs(want).astype(np.float32))), i
            np.testing.assert_array_equal(ck.read(f"{p}.v_proj.bias"), 0)
            # the fold moved something: W_o·b_v is not negligible next to b_o
            with open_checkpoint(NF4) as src:
                assert np.abs(got - src.read(f"{p}.o_proj.bias")).max() > 0.1


def test_fold_v_keeps_the_model_function(folded, tmp_path):
    """transformers' forward of the model before and after (each built as the unquantized Llama
    from its dequantized weights) agree to float32 noise.

    Tolerance: the fold is an identity in exact arithmetic (attention rows sum to 1, so
    ``softmax·(V + 1 b_vᵀ)·W_oᵀ + b_o = softmax·V·W_oᵀ + (b_o + W_o b_v)``); in float32 the two
    forms round differently: a few ulps (2^-24 relative) of the attention output and of ``W_o
    b_v`` per layer, carried through 2 layers and the head.  1e-5 on logits below 1 is ~170 ulps
    of that scale (observed 3.9e-7, 7 ulps); a fold that drops W_o·b_v moves the logits by 0.84
    (checked below on such a wrong fold)."""
    from transformers import AutoModelForCausalLM

    from ckpt_surgeon import runtime
    out, _ = folded
    ids = _ids()

    def logits(folder, name):
        dense = runtime.quantized_to_folder(folder, tmp_path / name)
        return _logits(runtime.load_pretrained(AutoModelForCausalLM, dense, dtype="float32", path=str(folder)), ids)

    before, after = logits(NF4, "before"), logits(out, "after")
    assert np.abs(before).max() > 0.1
    assert np.abs(after - before).max() <= 1e-5, np.abs(after - before).max()

    # the same check fails on a wrong fold: b_v zeroed without moving W_o·b_v into b_o
    from ckpt_surgeon.formats.write.writer import CheckpointWriter
    with open_checkpoint(NF4) as ck, CheckpointWriter(tmp_path / "wrong", source=ck) as w:
        for i in range(LAYERS):
            name = f"model.layers.{i}.self_attn.v_proj.bias"
            w.put(name, np.zeros(ck.tensors[name].shape, np.float32))
    assert np.abs(logits(tmp_path / "wrong", "wrong-dense") - before).max() > 1e-2


def test_fold_v_refused_where_o_proj_has_no_bias(tmp_path):
    """Qwen2 (fixtures/quant): the value bias has nowhere to go; one line, nothing written."""
    qwen = Path(__file__).resolve().parent.parent / "fixtures" / "quant" / "bnb_nf4"
    res = _run("fold-bias", qwen, "-o", tmp_path / "out", "--v")
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "out").exists()
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "has no bias" in line[0] and "o_proj" in line[0], res.stderr


def test_folded_checkpoint_runs_in_bitsandbytes_itself(folded):
    """The written checkpoint is still a bitsandbytes checkpoint: transformers + bitsandbytes load
    it (their own nf4 runtime, bfloat16 compute) and compute the same function as before the fold.

    Tolerance: bfloat16 compute (relative 2^-8 per rounding); the folded form rounds differently
    (and b_o' is added in bfloat16), a few roundings per layer: 8 * 2^-8 * max|logit| (= 0.02 here;
    observed 0.0044).  Dropping W_o·b_v instead moves the logits by 0.84 (previous test)."""
    out, _ = folded
    res = []
    for folder in (NF4, out):
        m = _native(folder, "bfloat16")
        assert type(m.model.layers[0].self_attn.o_proj).__name__ == "Linear4bit"
        res.append(_logits(m, _ids()))
    before, after = res
    assert np.abs(after - before).max() <= 8 * 2.0 ** -8 * np.abs(before).max(), np.abs(after - before).max()
