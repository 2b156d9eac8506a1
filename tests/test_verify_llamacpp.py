"""``verify A.gguf B.gguf`` in prompt mode runs both files in llama.cpp by default (issue 50 item 7).

Real llama.cpp runs (llama-cpp-python) of GGUFs our converter wrote from the tiny Qwen2 and from a copy whose
layer-0 q bias moved by +1.0.  The statistics are checked against llama-cpp-python called directly, the greedy
continuations against its own greedy sampler, and both against the transformers path on the same pair.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from ckpt_surgeon.verification.core import verify
from ckpt_surgeon.verification.metrics import kl_per_position

FEW = ["The capital of France is", "def softmax(x):\n    return x", "注意力机制把每个词映射为查询"]
Q_BIAS = "model.layers.0.self_attn.q_proj.bias"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    """(reference GGUF, candidate GGUF, reference HF folder, candidate HF folder), all float32."""
    from safetensors.numpy import load_file, save_file

    from ckpt_surgeon.conversion import hf_to_gguf
    root = tmp_path_factory.mktemp("llama-prompts")
    src = tiny("qwen2")
    cand = root / "cand"
    shutil.copytree(src, cand)
    t = load_file(str(cand / "model.safetensors"))
    t[Q_BIAS] = t[Q_BIAS].copy()
    t[Q_BIAS][3] += 1.0
    save_file(t, str(cand / "model.safetensors"), metadata={"format": "pt"})
    return (hf_to_gguf(src, root / "ref.gguf", dtype="f32"), hf_to_gguf(cand, root / "cand.gguf", dtype="f32"),
            src, cand)


def _direct(path, ids, n_new):
    """llama-cpp-python called directly: the prompt's logits (f32 cache), then its own greedy sampler's tokens."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64, n_batch=64, n_ubatch=64, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        llm.eval(ids)
        logits = np.array(llm.scores[:len(ids)], dtype=np.float64)
        llm.reset()
        out = []
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(int(tok))
            if len(out) == n_new or llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), tok):
                break
        return logits, tuple(out)
    finally:
        llm.close()


def test_a_gguf_pair_runs_in_llama_cpp_by_default(pair):
    ref, cand, ref_hf, cand_hf = pair
    same = verify(ref, ref, prompts=FEW, max_new_tokens=4)
    assert same.mode == "llama.cpp" and same.passed and same.metrics.max_abs_diff == 0.0
    assert same.metrics.greedy_identical and same.environment["llama_cpp_python"]
    assert any(n.startswith("llama.cpp: both GGUFs run in llama.cpp") and "K/V cached in f32" in n
               for n in same.notes)
    rep = verify(ref, cand, prompts=FEW, max_new_tokens=4)
    assert rep.mode == "llama.cpp" and not rep.passed        # a q bias moved by 1.0: far beyond float32's row
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ref_hf)
    kls = []
    for p, res in zip(FEW, rep.prompts):
        ids = list(tok(p, add_special_tokens=True)["input_ids"])     # llama.cpp's vocabulary gives transformers' ids
        assert res.tokens == len(ids)
        (r_logits, r_cont), (c_logits, c_cont) = _direct(ref, ids, 4), _direct(cand, ids, 4)
        kl = kl_per_position(r_logits, c_logits)
        kls.append(kl)
        # the same float32 logits, the KL in float64 in another order: 1e-9 relative
        np.testing.assert_allclose(res.comparison.mean_kl, kl.mean(), rtol=1e-9)
        assert res.reference_continuation == r_cont and res.candidate_continuation == c_cont
    np.testing.assert_allclose(rep.metrics.mean_kl, np.concatenate(kls).mean(), rtol=1e-9)
    # the transformers path on the HF sources says the same, to llama.cpp's float32 arithmetic (measured 4e-6
    # relative on the mean KL; 1e-3 leaves room for another CPU's kernels)
    hf = verify(ref_hf, cand_hf, prompts=FEW, max_new_tokens=4)
    assert hf.mode == "parallel" and abs(hf.metrics.mean_kl - rep.metrics.mean_kl) < 1e-3 * hf.metrics.mean_kl
    assert hf.passed == rep.passed


def _cli(*args):
    return CliRunner().invoke(cli, ["verify", *map(str, args)])


def test_runtime_choice_and_refusals(pair, tmp_path):
    ref, cand, ref_hf, _ = pair
    few = tmp_path / "p.txt"
    few.write_text("\n".join(FEW[:2]))
    res = _cli(ref, ref, "--prompts", few, "--max-new-tokens", 2, "--runtime", "transformers", "--format", "json")
    d = json.loads(res.stdout)
    assert d["mode"] == "parallel" and any("GGUF converted" in n for n in d["notes"]), d["notes"]
    # a transformers-only option keeps auto in transformers, and says so
    res = _cli(ref, ref, "--prompts", few, "--max-new-tokens", 0, "--localize", "--format", "json")
    d = json.loads(res.stdout)
    assert d["mode"] != "llama.cpp" and any("not llama.cpp: --localize asked for it" in n for n in d["notes"])
    for args, want in (((ref_hf, ref, "--runtime", "llama.cpp"), "--runtime llama.cpp in prompt mode runs two .gguf"),
                       ((ref, cand, "--runtime", "llama.cpp", "--localize"),
                        "--runtime llama.cpp does not combine with --localize")):
        res = _cli(*args, "--prompts", few)
        assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0 and want in res.stderr, res.output


def test_the_llama_path_imports_no_torch(pair):
    """torch never; transformers only for the tokenizer section (its jinja renderer of the GGUFs' chat templates,
    no torch behind it), so not at all with the section switched off."""
    ref, cand, _, _ = pair
    code = ("import sys; from ckpt_surgeon import verify; r = verify(sys.argv[1], sys.argv[2], prompts=['a b c'], "
            "max_new_tokens=2, tokenizer_check=sys.argv[3] == 'on'); "
            "print(r.mode, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    for section, heavy in (("on", "['transformers']"), ("off", "[]")):
        r = subprocess.run([sys.executable, "-c", code, str(ref), str(cand), section], capture_output=True, text=True,
                           env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0 and r.stdout.split() == ["llama.cpp", heavy], (r.stdout, r.stderr[-2000:])


def test_threads_follow_the_idle_cores(pair, monkeypatch):
    """torch's threads and llama.cpp's are the idle cores (CKPT_SURGEON_THREADS here, else the usable CPUs minus the
    load): a thread more than the free cores spins and waits out scheduler slices (the tour's pair: 264 s with 2
    threads at load 4-6, 84 s with 1).  torch's own count comes back after the run; a caller's OMP_NUM_THREADS is
    kept."""
    import torch

    from ckpt_surgeon.verification.session import scratch
    ref, _, _, _ = pair
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("CKPT_SURGEON_THREADS", "1")
        with scratch(None, "ckpt-surgeon-test-"):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        with scratch(None, "ckpt-surgeon-test-"):
            assert torch.get_num_threads() == 2
        assert verify(ref, ref, prompts=FEW[:1], max_new_tokens=1).environment["threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_work_that_just_started_counts_as_load():
    """The 1-minute load average lags behind work that has just started (two busy loops started 5 s before a verify
    left it at 0.2: 2 threads, 37.5 s of CPU spinning where 1 thread spends 10.4 s); the tasks runnable this instant
    count too, this process's own threads left out."""
    import os

    from ckpt_surgeon.formats.quant import dequant
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        dequant._RUNNING[:] = [0.0, 0]            # no cached reading
        assert dequant._running_others() >= 2     # a busy loop is runnable in every reading
        cpus = len(os.sched_getaffinity(0))
        assert dequant.default_threads() <= max(1, cpus - 2)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        dequant._RUNNING[:] = [0.0, 0]
