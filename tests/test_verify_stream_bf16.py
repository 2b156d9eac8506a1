"""Layer-streamed verification in bfloat16 (``verify --stream --dtype bfloat16``; the torchrun
pipeline runs the same code: tests/test_verify_distributed.py).

The streamed run loads every layer in bf16 (each tensor rounded once from the float32 read; a
module the model keeps in float32, a MoE router, stays float32) and applies the head in float32
to the bf16 final hidden states and bf16 head weights, so its logits are float32.  transformers'
in-memory bf16 forward computes the same head product with float32 accumulation and rounds the
logits to bf16.

Tolerance against the in-memory bf16 path.  Everything before the head is the same modules, the
same bf16 weights and inputs (measured: the same bits), so the in-memory logit is the streamed
logit ``r`` rounded to bf16: ``|Δ| <= u·|r|`` with u = 2⁻⁸ (bf16 keeps 8 significant bits,
round to nearest), plus float32 summation-order noise of the head's dot product (1e-6 of the
logit scale, as tests/test_verify_stream.py allows).  Soft-capped models (gemma2) apply
``cap·tanh(logits / cap)`` to bf16 logits in memory: three more bf16 roundings, and ``tanh``'s
relative condition number is <= 1, so ``|Δ| <= 4u·|r|``.  Measured: at most 0.99 (one rounding)
and 1.57 (soft-capped) of these bounds.  A streamed run that silently computed in float32 would be
~1e-3 relative away from the bf16 model, which the test also rules out.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckpt_surgeon.verification.core import verify
from ckpt_surgeon.verification.stream import stream_logits, stream_pair

SEQS = [[1, 5, 9, 33, 2, 7, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42], [4, 8, 15, 16, 23, 42]]
U_BF16 = 2.0**-8
ORDER_TOL = 1e-6          # float32 summation order of the head's dot product, of the logit scale


def _in_memory(folder, seqs, dtype):
    """transformers' own whole-model forward in ``dtype``: float32 numpy logits."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                              dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s]), attention_mask=torch.ones(1, len(s), dtype=torch.long))
                .logits[0].float().numpy() for s in seqs]


# dense, MoE (mixtral; deepseek_v2: MLA and a float32 router), tied head + learned positions (gpt2),
# soft-capping + sliding window (gemma2)
@pytest.mark.parametrize("name", ["qwen2", "mixtral", "deepseek_v2", "gpt2", "gemma2"])
def test_stream_bf16_is_the_in_memory_bf16_model_to_one_rounding(tiny, name):
    folder = tiny(name)
    cfg = json.loads((Path(folder) / "config.json").read_text())
    roundings = 4 if cfg.get("final_logit_softcapping") else 1
    want = _in_memory(folder, SEQS, "bfloat16")
    full = _in_memory(folder, SEQS, "float32")
    pair = stream_pair(folder, folder, SEQS, dtype="bfloat16")
    got = list(pair)
    assert [s for s, *_ in got] == [0, 1]
    for (s, r, c), w, f in zip(got, want, full):
        assert r.shape == w.shape and r.dtype == c.dtype == np.float32
        assert np.array_equal(r, c)                   # the same model on both sides: the same bits
        d = np.abs(r.astype(np.float64) - w)
        bound = roundings * U_BF16 * np.abs(r) + ORDER_TOL * np.abs(w).max()
        assert np.all(d <= bound), (name, s, float((d / bound).max()))
        assert np.abs(r - f).max() > 1e-4 * np.abs(f).max()      # it did compute in bf16
    loc = pair.localize()
    assert loc.first_layer is None and all(p.rel == 0.0 for p in loc.points)


def test_bf16_hidden_states_spilled_to_disk_give_the_same_bits(tiny, tmp_path, monkeypatch):
    """Beyond the activations allowance the bf16 hidden states live in a uint16 memory-mapped file
    (numpy has no bfloat16): the same bits come back, nothing is left behind."""
    import ckpt_surgeon.verification.stream as st
    folder = tiny("qwen2_moe")
    in_ram = [o for _, o in stream_logits(folder, SEQS, dtype="bfloat16")]
    monkeypatch.setattr(st, "ACTIVATIONS_IN_RAM_BYTES", 1)
    spilled = [o for _, o in stream_logits(folder, SEQS, dtype="bfloat16", tmp_dir=tmp_path)]
    assert all(np.array_equal(a, b) for a, b in zip(in_ram, spilled))
    assert list(tmp_path.iterdir()) == []


def test_verify_stream_bf16_self_and_criteria(tiny, tmp_path):
    """verify of a model against itself, streamed in bf16: KL 0, the same top-1 everywhere, judged
    by the bfloat16 row (as the in-memory path judges a bf16 run)."""
    ref = tiny("qwen2")
    r = verify(ref, ref, token_ids=SEQS, dtype="bfloat16", stream=True)
    assert r.mode == "stream" and r.dtype == "bfloat16" and r.passed
    assert r.metrics.max_kl == 0.0 and r.metrics.top1_agreement == 1.0 and r.metrics.max_rel_diff == 0.0
    assert r.thresholds.dtype == "bfloat16"
    mem = verify(ref, ref, token_ids=SEQS, dtype="bfloat16", max_new_tokens=0)
    assert mem.mode == "parallel" and mem.thresholds == r.thresholds


def test_bf16_memory_plan_streams_what_float32_refuses():
    """The plan counts bf16 bytes: a 7B pair that float32 streaming cannot fit in 1.5 GiB streams
    in bf16 (layers and hidden states at 2 bytes; logits and the head chunk stay float32)."""
    from ckpt_surgeon.errors import CkptError
    from ckpt_surgeon.verification.core import ModelSizes, plan_memory
    from ckpt_surgeon.verification.stream import stream_need_from_sizes
    q7b = ModelSizes(7_615_616_512, 233_057_792, 3584, 152064)
    kw = dict(device="cpu", device_map=None, sequential=None, stream=None, positions=64)
    need16 = stream_need_from_sizes(q7b.largest_layer * 2, 64, 3584, 152064, 2)
    need32 = stream_need_from_sizes(q7b.largest_layer * 4, 64, 3584, 152064, 4)
    assert need32 - need16 == 3 * q7b.largest_layer * 2 + 2 * 64 * 3584 * 2      # the layer x3 and the hidden states
    budget = (need16 + need32) // 2
    assert plan_memory(q7b, q7b, dtype="bfloat16", available=budget, **kw).mode == "stream"
    with pytest.raises(CkptError, match="not enough memory"):
        plan_memory(q7b, q7b, dtype="float32", available=budget, **kw)
