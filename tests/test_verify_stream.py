"""Layer-streamed verification (``verify --stream``, :mod:`ckpt_surgeon.verification.stream`).

Every comparison here is against transformers' own in-memory forward pass (``from_pretrained``,
eager attention), on every tiny family the registry builds, on GGUF files our converter writes,
and on the real SmolLM2 Q4_1 GGUF.

Tolerances.  Streaming runs the same transformers modules with the same weights in the same
order, so on the CPU the outputs come out bit-identical (measured: 0.0 on all 30 families).  The
assertions still allow float32 noise, 1e-6 of the logit scale: a summation order that changed
(a BLAS path picked for a differently strided tensor) moves a float32 dot product of length
K = 64..128 by ~u·sqrt(K) ≈ 7e-7 of its magnitude, and the 1e-6 bound is 100x under verify's
own float32 threshold (1e-4), so a wrong mask, rotary table or missing bias (1e-3 .. 1e-1
here) cannot pass.  float64 runs are held to 1e-12 (u64·sqrt(K) ≈ 1e-15, the same margin).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.tiny import tiny_names
from ckpt_surgeon.verification.core import MemoryPlan, ModelSizes, plan_memory, verify
from ckpt_surgeon.verification.stream import stream_logits, stream_pair

SEQS = [[1, 5, 9, 33, 2, 7, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42], [4, 8, 15, 16, 23, 42]]
FLOAT32_TOL = 1e-6
FLOAT64_TOL = 1e-12
K_BIAS = "model.layers.1.self_attn.k_proj.bias"


from cli_util import _one_line_exit_2, _run  # noqa: E402  (shared CLI test helpers)


def _in_memory(folder, seqs, dtype="float32"):
    """transformers' own forward of the whole model: logits (last hidden state for encoders)."""
    import torch
    import transformers

    from ckpt_surgeon.verification.kinds import model_kind
    cfg = json.loads((Path(folder) / "config.json").read_text())
    cls = getattr(transformers, model_kind(cfg).auto_class)
    from ckpt_surgeon.verification.stream import float64_kwargs
    model = cls.from_pretrained(folder, attn_implementation="eager", dtype=getattr(torch, dtype),
                                **float64_kwargs(dtype)).eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            o = model(input_ids=torch.tensor([s]), attention_mask=torch.ones(1, len(s), dtype=torch.long))
            out.append((o.logits if hasattr(o, "logits") else o.last_hidden_state)[0].numpy())
    return out


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(np.asarray(b, np.float64)).max())


def _perturbed(src: Path, dst: Path, key: str, delta: float = 1.0) -> Path:
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    t = load_file(str(src / "model.safetensors"))
    t[key] = t[key].copy()
    t[key][0] += delta
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


# --- streaming equals the in-memory path ------------------------------------------------------

@pytest.mark.parametrize("name", tiny_names())
def test_stream_equals_in_memory_every_family(tiny, name):
    """Every tiny family (MoE: qwen2_moe, qwen3_moe, olmoe, mixtral, phimoe, deepseek_v2; sliding
    windows of 8 positions on 20-token inputs: gemma2, gemma3; MLA: deepseek_v2; ALiBi, learned
    positions, parallel blocks, tied heads, soft-capping, encoders)."""
    folder = tiny(name)
    want = _in_memory(folder, SEQS)
    pair = stream_pair(folder, folder, SEQS)
    got = list(pair)
    assert [s for s, *_ in got] == [0, 1]
    for (s, r, c), w in zip(got, want):
        assert r.shape == w.shape and r.dtype == np.float32
        assert np.array_equal(r, c)                       # the same model on both sides: the same bits
        assert _rel(r, w) <= FLOAT32_TOL, (name, s, _rel(r, w))
    loc = pair.localize()
    assert loc.first_layer is None and loc.mode == "stream"
    assert {p.layer for p in loc.points} == set(range(len({p.layer for p in loc.points})))
    assert all(p.rel == 0.0 for p in loc.points)


@pytest.mark.parametrize("name", ["qwen2", "gemma2", "deepseek_v2", "mixtral", "gpt2"])
def test_stream_float64(tiny, name):
    folder = tiny(name)
    want = _in_memory(folder, SEQS, "float64")
    for (s, out), w in zip(stream_logits(folder, SEQS, dtype="float64"), want):
        assert out.dtype == np.float64
        assert _rel(out, w) <= FLOAT64_TOL, (name, s, _rel(out, w))


def test_rows_and_single_model(tiny):
    folder = tiny("qwen2")
    full = [o for _, o in stream_logits(folder, SEQS)]
    rows = [np.array([0, 7, 19]), np.array([5])]
    part = list(stream_pair(folder, folder, SEQS, rows=rows))
    for (s, r, c), want_rows in zip(part, rows):
        # the head multiplies 3 rows instead of 20: another BLAS blocking, float32 noise (measured 1e-7)
        assert r.shape == (len(want_rows), full[s].shape[1]) and np.array_equal(c, r)
        assert _rel(r, full[s][want_rows]) <= FLOAT32_TOL
    with pytest.raises(CkptError, match="outside sequence 1"):
        list(stream_pair(folder, folder, SEQS, rows=[np.array([0]), np.array([6])]))


def test_hidden_states_spilled_to_disk_give_the_same_numbers(tiny, tmp_path, monkeypatch):
    import ckpt_surgeon.verification.stream as st
    folder = tiny("qwen2")
    in_ram = [o for _, o in stream_logits(folder, SEQS)]
    monkeypatch.setattr(st, "ACTIVATIONS_IN_RAM_BYTES", 1)        # every hidden state memory-mapped
    monkeypatch.setattr(st, "LOGITS_GROUP_BYTES", 1)              # one sequence per logits group
    monkeypatch.setattr(st, "HEAD_CHUNK_BYTES", 64 * 4 * 50)      # head read 50 rows at a time
    spilled = [o for _, o in stream_logits(folder, SEQS, tmp_dir=tmp_path)]
    # Not bit-identity (issue 36: it failed on an AMD EPYC): the hidden states and the final norm
    # are the same bits in both paths, but each logit is a float32 dot product over d = hidden
    # terms that BLAS sums in an order that may depend on the matrix shape (the whole head vs 50
    # rows).  Two orders of one d-term sum differ by at most 2·γ_d·Σ|x_i·w_i|, γ_d = d·u/(1 − d·u),
    # u = 2⁻²⁴ (Higham, Accuracy and Stability, eq. 3.4).  x is the RMSNorm output g·h/rms(h), and
    # rms(h) >= ‖h‖₂/√d, so ‖x‖₂ <= max|g|·√d and by Cauchy-Schwarz Σ|x_i·w_i| <= max|g|·√d·‖w‖₂
    # per head row w (x 1.001 for x's own float32 roundings).  Here that is ~1e-5 of the logit
    # scale: a real difference (a wrong row, a wrong chunk offset) is far above it.
    from safetensors.numpy import load_file
    t = load_file(str(folder / "model.safetensors"))
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"]).astype(np.float64)
    d = head.shape[1]
    gamma = d * 2.0**-24 / (1 - d * 2.0**-24)
    bound = 2 * gamma * 1.001 * np.abs(t["model.norm.weight"]).max() * np.sqrt(d) * np.linalg.norm(head, axis=1)
    assert len(in_ram) == len(spilled) == len(SEQS)
    for a, b in zip(in_ram, spilled):
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32
        assert np.all(np.abs(a.astype(np.float64) - b) <= bound[: a.shape[-1]]), np.abs(a - b).max()
    assert list(tmp_path.iterdir()) == []                         # nothing left behind


# --- localisation --------------------------------------------------------------------------------

def test_many_positions_compare_layer_outputs_only(tiny, tmp_path, monkeypatch):
    """Beyond the activations allowance the reference's attention / MLP outputs are not kept for
    every sequence: the report then has the layer outputs alone (no zero rows for parts never
    compared), and still names the perturbed layer."""
    import ckpt_surgeon.verification.stream as st
    ref = tiny("qwen2")
    cand = _perturbed(ref, tmp_path / "cand", K_BIAS)
    monkeypatch.setattr(st, "ACTIVATIONS_IN_RAM_BYTES", 1)
    pair = stream_pair(ref, cand, SEQS, tmp_dir=tmp_path)
    list(pair)
    loc = pair.localize()
    assert {p.part for p in loc.points} == {"output"} and [p.layer for p in loc.points] == [0, 1]
    assert loc.first_point == "layer 1 output" and loc.points[0].rel == 0.0

def test_perturbed_layer_is_localised(tiny, tmp_path):
    ref = tiny("qwen2")
    cand = _perturbed(ref, tmp_path / "cand", K_BIAS)
    pair = stream_pair(ref, cand, SEQS)
    outs = list(pair)
    loc = pair.localize()
    assert loc.first_layer == 1 and loc.first_point == "layer 1 attention"
    assert all(p.rel == 0.0 for p in loc.points if p.layer == 0)   # layer 0 untouched: identical
    assert any(not np.array_equal(r, c) for _, r, c in outs)
    # the candidate side is the candidate's own forward
    for (s, _, c), w in zip(outs, _in_memory(cand, SEQS)):
        assert _rel(c, w) <= FLOAT32_TOL


def test_verify_stream_report_matches_in_memory_verify(tiny, tmp_path):
    ref = tiny("qwen2")
    cand = _perturbed(ref, tmp_path / "cand", K_BIAS)
    prompts = ["The capital of France is", "def softmax(x):\n    return x"]
    par = verify(ref, cand, prompts=prompts, max_new_tokens=0)
    st = verify(ref, cand, prompts=prompts, stream=True)
    assert st.mode == "stream" and par.mode == "parallel"
    assert st.passed is par.passed is False
    assert st.metrics.positions == par.metrics.positions
    assert st.metrics.max_rel_diff == pytest.approx(par.metrics.max_rel_diff, rel=1e-5)
    assert st.metrics.max_kl == pytest.approx(par.metrics.max_kl, rel=1e-4)
    assert st.metrics.top1_agreement == par.metrics.top1_agreement
    assert st.metrics.greedy_identical is None
    assert st.localize.first_layer == 1
    d = st.to_dict()
    assert d["mode"] == "stream" and d["localize"]["first_layer"] == 1
    assert any("greedy continuations not compared" in n for n in st.notes)
    items = dict(st.summary_items())
    assert items["greedy"].startswith("not compared")                # said in the table, not only in JSON
    assert items["first diverging layer"].startswith("layer 1 attention")


def test_cli_stream_and_localize(tiny, tmp_path):
    ref = tiny("qwen2")
    cand = _perturbed(ref, tmp_path / "cand", K_BIAS)
    res = _run("verify", ref, cand, "--stream", "--localize", "--format", "json")
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    assert d["mode"] == "stream" and d["localize"]["first_point"] == "layer 1 attention"
    assert res.stderr.strip().splitlines()[-1].startswith("error: ")
    res = _run("verify", ref, cand, "--stream", "--localize-threshold", "1e9", "--format", "json")
    assert json.loads(res.stdout)["localize"]["first_layer"] is None          # nothing moved that much
    res = _run("verify", ref, ref, "--stream", "--dtype", "float64")
    assert res.exit_code == 0, res.output
    assert "float64, stream" in res.stdout and "not compared (layer-streamed" in res.stdout


# --- GGUF -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen2_moe"])
def test_gguf_streamed_directly(tiny, tmp_path, name):
    """A float32 GGUF our converter writes, streamed tensor by tensor (llama's Q/K rows un-permuted,
    qwen2_moe's stacked experts split) against the HF original run in memory."""
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf
    folder = tiny(name)
    gguf = hf_to_gguf(folder, tmp_path / f"{name}.gguf", dtype="f32")
    want = _in_memory(folder, SEQS)
    pair = stream_pair(gguf, folder, SEQS)
    for (s, g, h), w in zip(pair, want):
        assert _rel(h, w) <= FLOAT32_TOL
        assert _rel(g, w) <= FLOAT32_TOL, (name, s, _rel(g, w))
    assert pair.localize().first_layer is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.gguf"]     # no temporary folder


def test_real_quantized_gguf_streamed(smollm_gguf, tmp_path):
    """SmolLM2-135M Q4_1 (30 layers, llama permutation, tied head): streamed straight from the
    GGUF equals the converter's float32 folder run whole by transformers."""
    from ckpt_surgeon.conversion import gguf_to_hf
    folder = gguf_to_hf(smollm_gguf, tmp_path / "hf", dtype="float32")
    seqs = [[1, 504, 3458, 282, 4649, 314], [1, 2, 3, 4, 5, 6, 7, 8]]
    want = _in_memory(folder, seqs)
    for (s, out), w in zip(stream_logits(smollm_gguf, seqs), want):
        assert _rel(out, w) <= FLOAT32_TOL, (s, _rel(out, w))
    r = verify(smollm_gguf, smollm_gguf, prompts=["The capital of France is"], stream=True)
    assert r.passed and r.metrics.max_abs_diff == 0.0 and r.mode == "stream"
    assert any("GGUF streamed" in n for n in r.notes)


# --- the memory plan ------------------------------------------------------------------------------

# Qwen2.5-7B's shape: 7.6e9 parameters, 28 layers of 233e6, hidden 3584, vocabulary 152064.
Q7B = ModelSizes(7_615_616_512, 233_057_792, 3584, 152064)
GiB = 1 << 30


def test_plan_memory_decisions():
    def plan(avail, dtype="float32", **kw):
        kw = {"device": "cpu", "device_map": None, "sequential": None, "stream": None, **kw}
        return plan_memory(Q7B, Q7B, dtype=dtype, available=avail, positions=64, **kw)

    # the machine: 24 GB, float32 -> neither both (61 GB) nor one (30 GB): streamed
    p = plan(21 * GiB)
    assert isinstance(p, MemoryPlan) and p.mode == "stream"
    assert p.need["stream"] < 4 * GiB < p.need["sequential"]
    assert plan(21 * GiB, "bfloat16").mode == "sequential"        # 15 GB fits once
    assert plan(80 * GiB).mode == "parallel"
    assert plan(80 * GiB, sequential=True).mode == "sequential"
    assert plan(21 * GiB, sequential=True).mode == "stream"       # asked sequential, would not fit: stream
    assert plan(None).mode == "sequential"
    assert plan(21 * GiB, device_map="auto").mode == "sequential"
    with pytest.raises(CkptError, match=r"not enough memory: one model needs ~28.37 GiB in float32 and a "
                                        r"layer-streamed run ~[0-9.]+ GiB, 1.00 GiB free on cpu"):
        plan(1 * GiB)
    assert plan(8 * GiB, "bfloat16").mode == "stream"             # bf16 streams too (issue 34)
    with pytest.raises(CkptError, match=r"layer-streamed run \(--dtype bfloat16\) would need"):
        plan(8 * GiB, "float16")


def test_automatic_switch_to_stream(tiny, tmp_path):
    """The real decision on a real run, with the free memory given as a budget: a budget that holds
    one layer but not one model streams; one that holds neither is refused before any loading."""
    ref = tiny("qwen2")
    r = verify(ref, ref, prompts=["The capital of France is"], memory_budget=300 << 20)
    assert r.mode == "stream" and r.passed
    assert any(n.startswith("stream: one model needs") for n in r.notes)
    r = verify(ref, ref, prompts=["The capital of France is"], memory_budget=1 << 40, max_new_tokens=1)
    assert r.mode != "stream"
    _one_line_exit_2(_run("verify", ref, ref, "--memory-budget", "100MiB"), "not enough memory")
    res = _run("verify", ref, ref, "--memory-budget", "300MiB", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mode"] == "stream"


# --- bad input ------------------------------------------------------------------------------------

def test_bad_input_exit_2(tiny, tmp_path):
    ref = tiny("qwen2")
    _one_line_exit_2(_run("verify", ref, ref, "--stream", "--dtype", "float16"),
                     "--stream computes in float32, float64 or bfloat16, not float16")
    _one_line_exit_2(_run("verify", ref, ref, "--stream", "--device-map", "auto"), "not both")
    _one_line_exit_2(_run("verify", ref, ref, "--max-memory", "cpu=1GiB"), "--device-map auto")
    _one_line_exit_2(_run("verify", ref, ref, "--memory-budget", "lots"), "not a size")
    _one_line_exit_2(_run("verify", ref, tmp_path / "nope", "--stream"), "nope")
    bad = tmp_path / "bad"
    shutil.copytree(ref, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:-1000])
    _one_line_exit_2(_run("verify", ref, bad, "--stream"), "model.safetensors", "truncated")
    _one_line_exit_2(_run("verify", ref, tiny("bert"), "--stream"), "causal-lm", "encoder")


# --- GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_stream_on_cuda_equals_cpu(tiny):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folder = tiny("qwen2_moe")
    cpu = [o for _, o in stream_logits(folder, SEQS)]
    gpu = [o for _, o in stream_logits(folder, SEQS, device="cuda")]
    # different kernels (cuBLAS vs CPU BLAS): float32 reordering noise, same bound as above
    assert all(_rel(g, c) <= FLOAT32_TOL * 10 for g, c in zip(gpu, cpu))
