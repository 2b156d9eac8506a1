"""analysis.kv_measure: the measured KV-cache damage per layer (issue 32, ``analyze --kv-cache --measure``).

Tiny Qwen2s with head_dim 64 (tests/kv_models.py): ``clean``, and ``hot``, the same weights but for
a key bias of 60 planted in two rotary pairs of layer 1.  The oracles are independent: gguf-py's
own numpy quantizers for the cache round trip, transformers' own attention logits (the softmax
input of eager attention) for the captured Q and K, and the physics of block quantization for
the ranking (a planted bias sets the step of its blocks, so its layer must be named worst, and by
a wide margin, while the clean model's layers stay alike).
"""
from __future__ import annotations

import numpy as np
import pytest

from kv_models import build_kv_qwen2

from ckpt_surgeon.analysis.kv_measure import (CACHE_TYPES, capture_attention, check_cache_types, measure_kv_cache,
                                              roundtrip)
from ckpt_surgeon.errors import CkptError, UnsupportedError

PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 4, "def f(x):\n    return x * 2 + 1\n" * 3]


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("kvmeasure")
    return {"clean": build_kv_qwen2(tiny, root / "clean"), "hot": build_kv_qwen2(tiny, root / "hot", plant={1: 60.0})}


@pytest.fixture(scope="module")
def reports(models):
    # the plain blocks (llama.cpp's LLAMA_ATTN_ROT_DISABLE=1): the figures below were measured so; the rotated
    # path (llama.cpp's default) is checked against llama.cpp itself in test_kv_rot
    kw = dict(prompts=PROMPTS, max_tokens=48, attn_rot=False)
    return {name: measure_kv_cache(m, ("q8_0", "q4_0", "fp8_e4m3", "f16"), **kw) for name, m in models.items()}


def test_planted_key_bias_is_named_worst(reports):
    clean, hot = reports["clean"], reports["hot"]
    assert hot.worst_layers("q4_0")[0] == 1 and hot.worst_layers("q8_0")[0] == 1
    # measured: layer 1's mean row KL under q4_0 is 3.8 nats planted, 0.046 clean (80x); 20x leaves room
    assert hot.get(1, "q4_0").k_row_kl > 20 * clean.get(1, "q4_0").k_row_kl
    assert hot.get(1, "q8_0").k_row_kl > 20 * clean.get(1, "q8_0").k_row_kl
    # the other layers are untouched by the plant: identical weights, identical inputs to layer 0
    assert hot.get(0, "q4_0") == clean.get(0, "q4_0")
    # without a plant no layer stands out (measured spread 0.043 … 0.046)
    kls = [clean.get(i, "q4_0").k_row_kl for i in range(3)]
    assert max(kls) < 1.5 * min(kls)
    # finer types do less harm on every layer: q4_0's step is 16x q8_0's
    for r in (clean, hot):
        for i in range(3):
            assert r.get(i, "f16").k_row_kl < r.get(i, "q8_0").k_row_kl < r.get(i, "q4_0").k_row_kl
            assert r.get(i, "q8_0").v_out_rel_rms < r.get(i, "q4_0").v_out_rel_rms
    # V is not touched by a key bias: the value-side error is the same planted or not (same V)
    assert hot.get(1, "q4_0").v_out_rel_rms == pytest.approx(clean.get(1, "q4_0").v_out_rel_rms, rel=0.05)


def test_report_records(reports):
    r = reports["hot"]
    d = r.to_dict()
    assert d["worst_layers"]["q4_0"][0] == 1 and d["head_dim"] == 64
    assert {x["cache_type"] for x in d["layers"]} == {"q8_0", "q4_0", "fp8_e4m3", "f16"}
    rows = r.rows()
    assert len(rows) == 3 * 4 and {x["worst"] for x in rows if x["layer"] == 1} == {"yes"}
    frame = r.to_frame()
    assert list(frame.columns[:3]) == ["layer", "cache_type", "k_logit_rms"]
    assert dict(r.summary_items())["worst layers q4_0"].startswith("1, ")


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_roundtrip_is_ggmls_block_quantization(name):
    """ggml's kernels (libggml-base) against gguf-py's independent numpy quantizers: bit-identical."""
    import gguf
    from gguf.quants import dequantize, quantize
    x = (np.random.default_rng(0).standard_normal((40, 64)) * 3).astype(np.float32)
    x[:, 31] = 60.0                       # one dominant dimension per block, as a key bias makes
    t = gguf.GGMLQuantizationType[name.upper()]
    np.testing.assert_array_equal(roundtrip(x, name), dequantize(quantize(x, t), t))


def test_fp8_roundtrip_has_a_per_tensor_scale():
    x = np.array([[448.0 * 4, 1.0, -3.0, 0.01]], dtype=np.float32)
    y = roundtrip(x, "fp8_e4m3")
    assert y[0, 0] == x[0, 0]             # amax maps onto 448 exactly
    # e4m3 has 3 mantissa bits: relative step 2^-3 for normal values, and 0.01 / 4 is subnormal-small
    np.testing.assert_allclose(y[0, 1:3], x[0, 1:3], rtol=2 ** -3)


def test_captured_q_k_give_transformers_own_logits(models):
    """s·q·kᵀ from the captured post-RoPE tensors equals the attention logits eager attention feeds
    its softmax (float32 products, compared at 1e-5 relative to the logit scale)."""
    import torch

    from ckpt_surgeon.analysis.measure import _capture_softmax, load_model
    model, tok, _ = load_model(str(models["hot"]), device="cpu")
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"][:, :32]
    rec, soft = [], {}
    with capture_attention(rec), _capture_softmax(soft), torch.no_grad():
        model(input_ids=ids, use_cache=False)
    assert [r[0] for r in rec] == [0, 1, 2]
    t = ids.shape[1]
    causal = np.tril(np.ones((t, t), dtype=bool))
    for layer, q, k, _, s in rec:
        q, k = q[0].double().numpy(), k[0].double().numpy()
        mine = s * np.einsum("htd,hsd->hts", q, k[np.arange(q.shape[0]) // (q.shape[0] // k.shape[0])])
        theirs = soft[layer][0].double().numpy()
        scale = np.abs(theirs[:, causal]).max()
        np.testing.assert_allclose(mine[:, causal], theirs[:, causal], atol=1e-5 * scale)


def test_bad_input(models, tiny):
    with pytest.raises(CkptError, match=r"unknown KV cache type 'q3_k'; known: " + ", ".join(CACHE_TYPES)):
        check_cache_types("q8_0,q3_k")
    assert check_cache_types("Q8_0, q4_0,q8_0") == ("q8_0", "q4_0")
    # the tiny fixtures' head_dim 16 cannot hold a 32-block: one line saying so; f16 still measures
    with pytest.raises(UnsupportedError, match="head_dim 16 is not a multiple of 32"):
        measure_kv_cache(tiny("qwen2"), "q4_0", prompts=PROMPTS[:1], max_tokens=8)
    assert measure_kv_cache(tiny("qwen2"), "f16", prompts=PROMPTS[:1], max_tokens=8).head_dim == 16
