"""``verify``: real transformers forward passes on the tiny fixtures and all-MiniLM-L6-v2.

Every model here is really loaded and run (CPU, eager attention).  Candidates are built by
editing a copy of a fixture with safetensors: one q-bias element +1.0, a bfloat16 copy, MiniLM
with its key biases zeroed (exactly redundant, see ARCHITECTURE.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import CkptError, ConfigError, SourceNotFoundError, UnsupportedError
from ckpt_surgeon.verification import DEFAULT_THRESHOLDS, thresholds_for
from ckpt_surgeon.verification.core import verify
from ckpt_surgeon.verification.kinds import model_kind
from ckpt_surgeon.verification.metrics import compare_outputs, first_difference, kl_per_position, log_softmax64
from ckpt_surgeon.verification.prompts import default_prompts, load_prompts
from ckpt_surgeon.verification.report import JSON_KEYS
from ckpt_surgeon.verification.thresholds import coarsest

# Fewer prompts / tokens where the test is not about the defaults: each verify of the tiny
# Qwen2 costs ~1 s per model on the shared CPUs.
FEW = ["The capital of France is", "def softmax(x):\n    return x", "注意力机制把每个词映射为查询"]
Q_BIAS = "model.layers.0.self_attn.q_proj.bias"


def _copy_with(src: Path, dst: Path, edit) -> Path:
    """Copy a single-file HF folder and rewrite model.safetensors through ``edit(dict) -> dict``."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(edit(tensors), str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _folder_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def qwen2(tiny) -> Path:
    return tiny("qwen2")


@pytest.fixture(scope="module")
def corrupted(qwen2, tmp_path_factory) -> Path:
    """tiny qwen2 with one q-bias element of layer 0 moved by +1.0."""
    def edit(t):
        t[Q_BIAS] = t[Q_BIAS].copy()
        t[Q_BIAS][3] += 1.0
        return t
    return _copy_with(qwen2, tmp_path_factory.mktemp("corrupt") / "qwen2", edit)


@pytest.fixture(scope="module")
def bf16_copy(qwen2, tmp_path_factory) -> Path:
    """tiny qwen2 with every float tensor stored as bfloat16 (round to nearest even, torch's cast)."""
    import torch
    from safetensors.torch import load_file, save_file

    dst = tmp_path_factory.mktemp("bf16") / "qwen2"
    shutil.copytree(qwen2, dst)
    t = load_file(str(qwen2 / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in t.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


# --- identical copies ---------------------------------------------------------------------------

def test_identical_copies_are_bitwise_equal(qwen2, tmp_path):
    # A byte-identical copy in another folder: same weights -> same float32 ops in the same order
    # on the CPU (eager attention, same thread count) -> logits equal to the last bit.  Exactly 0,
    # no tolerance needed.
    copy = tmp_path / "copy"
    shutil.copytree(qwen2, copy)
    r = verify(qwen2, copy, max_new_tokens=8)
    m = r.metrics
    assert r.passed and r.failures == ()
    assert r.kind == "causal-lm" and r.mode == "parallel" and r.dtype == "float32" and r.device == "cpu"
    assert m.max_abs_diff == 0.0 and m.max_rel_diff == 0.0
    assert m.mean_kl == 0.0 and m.max_kl == 0.0
    assert m.top1_agreement == 1.0 and m.greedy_identical is True
    assert m.positions == sum(p.tokens for p in r.prompts) > 0
    assert len(r.prompts) == len(default_prompts())
    # 8 new tokens unless the model emitted its stop token earlier
    assert all(1 <= len(p.reference_continuation) <= 8 for p in r.prompts)
    assert r.thresholds.dtype == "float32"


def test_module_and_package_entry_points(qwen2):
    import inspect

    import ckpt_surgeon
    import ckpt_surgeon.verification as pkg

    # The package is not named like the function, so importing it leaves ckpt_surgeon.verify a function.
    assert inspect.isfunction(ckpt_surgeon.verify) and inspect.isfunction(pkg.verify)
    for entry in (ckpt_surgeon.verify, pkg.verify):
        r = entry(qwen2, qwen2, prompts=FEW[:1], max_new_tokens=2)
        assert r.passed and r.metrics.max_abs_diff == 0.0


# --- a corrupted candidate ----------------------------------------------------------------------

def test_corrupted_candidate_fails_api(qwen2, corrupted):
    before = _folder_hash(corrupted), _folder_hash(qwen2)
    r = verify(qwen2, corrupted, prompts=FEW, max_new_tokens=4)
    assert not r.passed
    assert r.metrics.max_abs_diff > 0
    # Caught by the relative logit criterion (2.8e-3 of scale measured vs 1e-4 allowed).
    assert r.metrics.max_rel_diff > DEFAULT_THRESHOLDS["float32"].max_logit_diff
    assert any("max |Δlogits|/scale" in f for f in r.failures)
    assert (_folder_hash(corrupted), _folder_hash(qwen2)) == before     # inputs never modified


def test_corrupted_candidate_exit_1_clirunner(qwen2, corrupted):
    res = _run("verify", qwen2, corrupted, "--max-new-tokens", "4")
    assert res.exit_code == 1, res.output
    assert "verdict" in res.stdout and "FAIL" in res.stdout                  # report rendered first
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {corrupted}: mismatch: max |Δlogits|/scale = ")


def test_corrupted_candidate_exit_1_subprocess(qwen2, corrupted):
    proc = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "verify", str(qwen2), str(corrupted),
                           "--max-new-tokens", "2", "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    d = json.loads(proc.stdout)
    assert d["passed"] is False and d["failures"]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "mismatch" in proc.stderr


def test_sequential_equals_parallel(qwen2, corrupted):
    # The saved-logits path must give the very same numbers (float32 outputs saved, compared in
    # float64 on reload: nothing is rounded on the way).
    par = verify(qwen2, corrupted, prompts=FEW, max_new_tokens=4)
    seq = verify(qwen2, corrupted, prompts=FEW, max_new_tokens=4, sequential=True)
    assert par.mode == "parallel" and seq.mode == "sequential"
    assert seq.metrics == par.metrics
    assert [p.to_dict() for p in seq.prompts] == [p.to_dict() for p in par.prompts]


# --- dtype-dependent thresholds -----------------------------------------------------------------

def test_bf16_copy_passes_bf16_thresholds_fails_fp32(qwen2, bf16_copy):
    r = verify(qwen2, bf16_copy, prompts=FEW, max_new_tokens=4)
    assert r.storage_dtypes == ("float32", "bfloat16")
    assert r.thresholds.dtype == "bfloat16"       # coarsest of compute fp32 and the two storages
    assert r.passed, r.failures
    assert 0 < r.metrics.max_rel_diff < DEFAULT_THRESHOLDS["bfloat16"].max_logit_diff
    strict = verify(qwen2, bf16_copy, prompts=FEW, max_new_tokens=4, thresholds="float32")
    assert not strict.passed
    assert strict.metrics == r.metrics             # same run, judged differently
    res = _run("verify", qwen2, bf16_copy, "--max-new-tokens", "2")
    assert res.exit_code == 0, res.output
    res = _run("verify", qwen2, bf16_copy, "--max-new-tokens", "2", "--thresholds", "float32")
    assert res.exit_code == 1, res.output


def test_overrides_change_the_verdict(qwen2, corrupted):
    r = verify(qwen2, corrupted, prompts=FEW[:1], max_new_tokens=0, max_logit_diff=1.0)
    assert r.passed and r.thresholds.overridden == ("max_logit_diff",)
    res = _run("verify", qwen2, corrupted, "--max-new-tokens", "2", "--max-logit-diff", "1")
    assert res.exit_code == 0, res.output
    assert "overridden: max_logit_diff" in res.stdout


def test_device_map_auto_runs_sequentially(qwen2, corrupted):
    # accelerate's device_map="auto" (here it can only place everything on the CPU): each model is
    # spread over the devices on its own, so the run is sequential, and it measures the same thing.
    r = verify(qwen2, corrupted, prompts=FEW[:2], max_new_tokens=2, device_map="auto")
    base = verify(qwen2, corrupted, prompts=FEW[:2], max_new_tokens=2)
    assert r.mode == "sequential" and r.device == "device_map=auto"
    assert r.metrics == base.metrics and not r.passed


def test_bfloat16_compute_identical_weights(qwen2):
    r = verify(qwen2, qwen2, prompts=FEW[:1], max_new_tokens=2, dtype="bfloat16")
    assert r.dtype == "bfloat16" and r.thresholds.dtype == "bfloat16"
    assert r.passed and r.metrics.max_abs_diff == 0.0


# --- encoders -----------------------------------------------------------------------------------

def test_bert_tiny_encoder_path(tiny, tmp_path):
    bert = tiny("bert")
    same = verify(bert, bert, prompts=FEW)
    assert same.kind == "encoder" and same.output == "last_hidden_state"
    assert same.passed and same.metrics.max_abs_diff == 0.0
    assert same.metrics.mean_kl is None and same.metrics.greedy_identical is None
    assert same.metrics.min_embedding_cosine == pytest.approx(1.0, abs=1e-12)

    def bump_value_bias(t):
        name = "encoder.layer.0.attention.self.value.bias"
        t[name] = t[name] + np.float32(1.0)
        return t
    bad = _copy_with(bert, tmp_path / "bert", bump_value_bias)
    r = verify(bert, bad, prompts=FEW)
    assert not r.passed and r.metrics.max_rel_diff > 1e-3


def test_masked_lm_path(tiny, tmp_path):
    # A BertForMaskedLM checkpoint (the tiny BERT plus an MLM head, saved by transformers) is
    # loaded with AutoModelForMaskedLM and compared on its logits: KL and top-1, no generation.
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    mlm = BertForMaskedLM.from_pretrained(tiny("bert"), local_files_only=True)
    ref = tmp_path / "mlm"
    mlm.save_pretrained(ref)
    for f in tiny("bert").iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special")):
            shutil.copy(f, ref / f.name)
    r = verify(ref, ref, prompts=FEW)
    assert r.kind == "masked-lm" and r.output == "logits" and r.architectures[0] == "BertForMaskedLM"
    assert r.passed and r.metrics.max_abs_diff == 0.0 and r.metrics.top1_agreement == 1.0
    assert r.metrics.greedy_identical is None and r.metrics.mean_kl == 0.0


def test_minilm_key_bias_is_redundant(minilm_dir, tmp_path):
    """Real all-MiniLM-L6-v2: zeroing every key bias passes the float32 thresholds (absolute
    positions: q·b_k is constant over keys, softmax ignores it), zeroing the query biases fails."""
    def zero(kind):
        def edit(t):
            for k in [k for k in t if k.endswith(f"attention.self.{kind}.bias")]:
                t[k] = np.zeros_like(t[k])
            return t
        return edit
    no_k = _copy_with(minilm_dir, tmp_path / "no_k", zero("key"))
    r = verify(minilm_dir, no_k, prompts=FEW)
    assert r.kind == "encoder" and r.architectures == ("BertModel", "BertModel")
    assert r.passed, r.failures
    assert 0 < r.metrics.max_rel_diff < 1e-5      # float32 reassociation only (ARCHITECTURE.md: 4e-6 on scale 6)
    no_q = _copy_with(minilm_dir, tmp_path / "no_q", zero("query"))
    assert not verify(minilm_dir, no_q, prompts=FEW).passed


# --- output formats -----------------------------------------------------------------------------

def _flat_keys(d: dict) -> set[str]:
    """Dotted keys as JSON_KEYS spells them (objects one level deep, prompts as "prompts[].x")."""
    out = set()
    for k, v in d.items():
        if k == "prompts":
            out |= {f"prompts[].{kk}" for p in v for kk in p}
        elif isinstance(v, dict) and k != "environment":
            out |= {f"{k}.{kk}" for kk in v}
        else:
            out.add(k)
    return out


def test_json_output_has_documented_keys(qwen2, corrupted, tmp_path):
    res = _run("verify", qwen2, corrupted, "--max-new-tokens", "3", "--format", "json")
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert _flat_keys(d) == set(JSON_KEYS)          # every key documented, every documented key present
    assert len({frozenset(p) for p in d["prompts"]}) == 1
    assert d["kind"] == "causal-lm" and d["max_new_tokens"] == 3 and d["passed"] is False
    assert d["architectures"] == {"reference": "Qwen2ForCausalLM", "candidate": "Qwen2ForCausalLM"}
    assert all(len(p["reference_continuation"]) <= 3 for p in d["prompts"])
    assert d["metrics"]["max_rel_diff"] == pytest.approx(d["metrics"]["max_abs_diff"] / d["metrics"]["scale"])
    # --output writes the same JSON atomically; csv has one row per prompt.
    out = tmp_path / "r.json"
    res = _run("verify", qwen2, qwen2, "--max-new-tokens", "1", "--format", "json", "-o", out)
    assert res.exit_code == 0 and json.loads(out.read_text())["passed"] is True
    res = _run("verify", qwen2, qwen2, "--max-new-tokens", "1", "--format", "csv")
    assert res.exit_code == 0 and len(res.stdout.strip().splitlines()) == 1 + len(default_prompts())
    res = _run("verify", qwen2, qwen2, "--max-new-tokens", "1", "--format", "markdown")
    assert res.exit_code == 0 and "- **verdict**: PASS" in res.stdout


def test_encoder_json_has_no_greedy_keys(tiny):
    res = _run("verify", tiny("bert"), tiny("bert"), "--format", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kind"] == "encoder" and d["max_new_tokens"] is None
    greedy_only = {k for k in JSON_KEYS if k.startswith("prompts[].") and "causal LMs only" in JSON_KEYS[k]}
    assert greedy_only and _flat_keys(d) == set(JSON_KEYS) - greedy_only
    assert d["metrics"]["mean_kl"] is None and d["metrics"]["min_embedding_cosine"] is not None


def test_prompts_file_json_and_lines(qwen2, tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\n   \nsecond prompt\n", encoding="utf-8")
    js = tmp_path / "p.json"
    js.write_text(json.dumps(["a\nmultiline prompt", "another"]), encoding="utf-8")
    assert load_prompts(lines) == ["first prompt", "second prompt"]
    assert load_prompts(js) == ["a\nmultiline prompt", "another"]
    res = _run("verify", qwen2, qwen2, "--prompts", js, "--max-new-tokens", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [p["prompt"] for p in json.loads(res.stdout)["prompts"]] == ["a\nmultiline prompt", "another"]
    bad = tmp_path / "bad.json"
    bad.write_text('["unterminated', encoding="utf-8")
    with pytest.raises(CkptError, match=r"bad\.json: starts with '\[' but is not valid JSON"):
        load_prompts(bad)
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(CkptError, match="holds no non-empty prompt"):
        load_prompts(tmp_path / "empty.txt")


# --- bad inputs: one line, exit 2 ---------------------------------------------------------------

def _one_line_exit_2(res, *needles):
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_missing_folder(qwen2, tmp_path):
    missing = tmp_path / "nope"
    _one_line_exit_2(_run("verify", qwen2, missing), str(missing), "no such file or folder",
                     "and not a Hub repo id of the form owner/name")
    with pytest.raises(SourceNotFoundError):
        verify(missing, qwen2)


def test_folder_without_config(qwen2, tmp_path):
    folder = tmp_path / "noconfig"
    folder.mkdir()
    shutil.copy(qwen2 / "model.safetensors", folder / "model.safetensors")
    _one_line_exit_2(_run("verify", qwen2, folder), str(folder), "no config.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_exit_2(_run("verify", empty, qwen2), str(empty), "no model.safetensors")


def test_truncated_candidate(qwen2, tmp_path):
    bad = tmp_path / "trunc"
    shutil.copytree(qwen2, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:-1000])
    _one_line_exit_2(_run("verify", qwen2, bad), "model.safetensors")


def test_tokenizer_that_changes_ids_is_a_finding(qwen2, tmp_path):
    # Same weights, but the candidate's tokenizer.json numbers the ordinary tokens in reverse
    # (special tokens keep their ids): every prompt encodes to other ids.  The tokenizer section
    # (issue 48) reports it and fails the run (exit 1) while both models, fed the reference's ids, agree.
    other = tmp_path / "other_tok"
    shutil.copytree(qwen2, other)
    tok = json.loads((qwen2 / "tokenizer.json").read_text(encoding="utf-8"))
    special = {t["content"] for t in tok["added_tokens"]}
    vocab = tok["model"]["vocab"]
    plain = sorted((t for t in vocab if t not in special), key=vocab.get)
    ids = [vocab[t] for t in plain]
    for t, i in zip(plain, reversed(ids)):
        vocab[t] = i
    (other / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    r = verify(qwen2, other, prompts=FEW, max_new_tokens=0)
    assert not r.passed and r.metrics.max_abs_diff == 0
    assert len(r.failures) == 1 and r.failures[0].startswith("tokenizer: ")
    assert any(n.startswith(f"{other}: tokenizer encodes prompt 0 ") and n.endswith(
        "both models are fed the reference's ids (the tokenizer section reports tokenizer differences)")
        for n in r.notes), r.notes
    res = _run("verify", qwen2, other, "--max-new-tokens", "0")
    assert res.exit_code == 1 and res.stderr.startswith(f"error: {other}: mismatch: tokenizer: "), res.output
    off = verify(qwen2, other, prompts=FEW, max_new_tokens=0, tokenizer_check=False)
    assert off.passed and any(n.endswith("(--no-tokenizer-check)") for n in off.notes)


def test_kind_mismatch_and_bad_options(qwen2, tiny):
    _one_line_exit_2(_run("verify", qwen2, tiny("bert")), "causal-lm", "encoder")
    _one_line_exit_2(_run("verify", qwen2, qwen2, "--min-top1", "2"), "--min-top1")
    with pytest.raises(CkptError, match="unknown dtype"):
        verify(qwen2, qwen2, dtype="int8")


def test_cuda_requested_without_cuda(qwen2):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA; the error path is for hosts without it")
    _one_line_exit_2(_run("verify", qwen2, qwen2, "--device", "cuda"), "torch.cuda.is_available() is False")


def test_gguf_input(smollm_gguf, tmp_path):
    """GGUF inputs go through our converter into a temporary folder under --tmp-dir, which is
    left empty afterwards; the same file on both sides gives identical outputs."""
    import json

    work = tmp_path / "scratch"
    work.mkdir()
    res = _run("verify", smollm_gguf, smollm_gguf, "--tmp-dir", work, "--max-new-tokens", 4, "--format", "json",
               "--runtime", "transformers")      # (a GGUF pair runs in llama.cpp by default: test_verify_llamacpp.py)
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["passed"] and r["metrics"]["max_abs_diff"] == 0.0
    assert r["storage_dtypes"] == {"reference": "quantized", "candidate": "quantized"}
    assert any("GGUF converted" in n and str(work) in n for n in r["notes"]), r["notes"]
    assert list(work.iterdir()) == []
    _one_line_exit_2(_run("verify", smollm_gguf, smollm_gguf, "--tmp-dir", tmp_path / "nope"), "--tmp-dir")
    with pytest.raises(CkptError, match="not an existing directory"):
        verify(smollm_gguf, smollm_gguf, tmp_dir=tmp_path / "nope")


def test_single_safetensors_file_input(qwen2):
    r = verify(qwen2, qwen2 / "model.safetensors", prompts=FEW[:1], max_new_tokens=2)
    assert r.passed and r.metrics.max_abs_diff == 0.0


# --- pure metrics -------------------------------------------------------------------------------

def test_kl_matches_torch_float64():
    import torch

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 50)) * 3, rng.normal(size=(5, 50)) * 3
    ref = torch.nn.functional.kl_div(torch.log_softmax(torch.tensor(b), -1), torch.log_softmax(torch.tensor(a), -1),
                                     log_target=True, reduction="none").sum(-1).numpy()
    np.testing.assert_allclose(kl_per_position(a, b), ref, rtol=1e-12, atol=1e-15)
    assert np.all(kl_per_position(a, a) == 0.0)
    np.testing.assert_allclose(np.exp(log_softmax64(a)).sum(-1), 1.0, rtol=1e-14)


def test_masked_and_nonfinite_outputs():
    r = np.array([[1.0, 2.0, -np.inf], [0.5, 0.1, -np.inf]])
    c = r.copy()
    same = compare_outputs(r, c, distribution=True)
    assert same.nonfinite == 0 and same.max_kl == 0.0 and same.max_abs_diff == 0.0
    c[1, 0] = np.nan
    bad = compare_outputs(r, c, distribution=True)
    assert bad.nonfinite == 1
    c2 = r.copy()
    c2[0, 0] = -np.inf                                    # candidate gives 0 probability to a real token
    assert math.isinf(compare_outputs(r, c2, distribution=True).max_kl)


def test_nan_candidate_fails_and_json_stays_valid():
    from ckpt_surgeon.cli.render import to_json
    from ckpt_surgeon.verification.kinds import KINDS
    from ckpt_surgeon.verification.report import PromptResult, VerifyReport, aggregate, judge

    r = np.zeros((3, 4), dtype=np.float32)
    c = np.full((3, 4), np.nan, dtype=np.float32)
    kind = KINDS["masked-lm"]
    res = [PromptResult(0, "x", 3, compare_outputs(r, c, distribution=True))]
    m = aggregate(res, kind)
    failures = judge(m, thresholds_for("float32"), kind, res)
    assert failures and "NaN/inf" in failures[0]
    rep = VerifyReport("a", "b", kind.name, kind.output, ("X", "X"), ("float32", "float32"), "cpu", "float32",
                       "parallel", 0, thresholds_for("float32"), m, tuple(res), passed=not failures, failures=failures)
    d = json.loads(to_json(rep))
    assert d["passed"] is False and d["prompts"][0]["mean_kl"] is None


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None


def test_thresholds_table():
    assert coarsest("float32", "bfloat16", "float16") == "bfloat16"
    assert coarsest("float32", "float16") == "float16"
    assert coarsest("float32", "quantized") == "quantized"
    assert thresholds_for("quantized") == thresholds_for("bfloat16")
    # Looser precision, looser every criterion.
    f32, f16, bf16 = (DEFAULT_THRESHOLDS[k] for k in ("float32", "float16", "bfloat16"))
    assert f32.max_logit_diff < f16.max_logit_diff < bf16.max_logit_diff
    assert f32.max_kl < f16.max_kl < bf16.max_kl
    assert f32.min_top1 > f16.min_top1 > bf16.min_top1
    t = thresholds_for("float32", max_kl=0.5, require_greedy=False)
    assert t.max_kl == 0.5 and t.require_greedy is False and t.overridden == ("max_kl", "require_greedy")
    with pytest.raises(CkptError):
        thresholds_for("float32", max_logit_diff=-1.0)
    with pytest.raises(CkptError):
        thresholds_for("int4")


def test_model_kind_table():
    assert model_kind({"architectures": ["Qwen2ForCausalLM"]}).name == "causal-lm"
    assert model_kind({"architectures": ["GPT2LMHeadModel"]}).name == "causal-lm"
    assert model_kind({"architectures": ["BertForMaskedLM"]}).name == "masked-lm"
    assert model_kind({"architectures": ["BertModel"]}).name == "encoder"
    assert model_kind({"model_type": "bert"}).name == "encoder"
    assert model_kind({"model_type": "llama"}).name == "causal-lm"
    with pytest.raises(UnsupportedError, match="BertForSequenceClassification"):
        model_kind({"architectures": ["BertForSequenceClassification"]})


# --- GPU (skipped cleanly without CUDA) ---------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_gpu_identical_and_corrupted(qwen2, corrupted):
    # cuBLAS: "all cuBLAS API routines from a given toolkit version generate the same bit-wise
    # results at every run when executed on GPUs with the same architecture and the same number
    # of SMs" (cuBLAS docs, Results reproducibility); with eager attention the whole forward is
    # such routines plus elementwise kernels, so identical weights give identical logits: 0.
    same = verify(qwen2, qwen2, prompts=FEW, max_new_tokens=8, device="cuda")
    assert same.device == "cuda" and "gpu" in same.environment
    assert same.passed and same.metrics.max_abs_diff == 0.0 and same.metrics.greedy_identical
    bad = verify(qwen2, corrupted, prompts=FEW, max_new_tokens=8, device="cuda")
    assert not bad.passed and bad.metrics.max_rel_diff > DEFAULT_THRESHOLDS["float32"].max_logit_diff
    res = _run("verify", qwen2, corrupted, "--device", "cuda", "--max-new-tokens", "2")
    assert res.exit_code == 1


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_gpu_bf16_and_sequential(qwen2, bf16_copy):
    r = verify(qwen2, bf16_copy, prompts=FEW, max_new_tokens=8, device="cuda", dtype="bfloat16")
    assert r.thresholds.dtype == "bfloat16" and r.passed, r.failures
    seq = verify(qwen2, bf16_copy, prompts=FEW, max_new_tokens=8, device="cuda", sequential=True)
    par = verify(qwen2, bf16_copy, prompts=FEW, max_new_tokens=8, device="cuda")
    assert seq.mode == "sequential" and seq.metrics == par.metrics and seq.passed


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_gpu_cpu_agree(qwen2):
    # The same model on the two devices (different kernels, same float32 math; TF32 is off during
    # verify): greedy continuations token for token, and the largest |logit| within the float32
    # row's 1e-4 relative bound.
    cpu = verify(qwen2, qwen2, prompts=FEW, max_new_tokens=8, device="cpu")
    gpu_r = verify(qwen2, qwen2, prompts=FEW, max_new_tokens=8, device="cuda")
    assert [p.reference_continuation for p in cpu.prompts] == [p.reference_continuation for p in gpu_r.prompts]
    assert gpu_r.metrics.scale == pytest.approx(cpu.metrics.scale, rel=1e-4)

