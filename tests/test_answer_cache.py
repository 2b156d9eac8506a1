"""transformers' answers cached per config (conversion/answer_cache.py): a second ``convert`` or
``lint`` of the same model imports neither torch nor transformers, gives the same output, and a
changed config asks transformers again.  (The time saved is measured in
benchmarks/bench_convert.py --direction cache, not here.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Runs the CLI in this interpreter, then says which heavy packages it imported.
_RUN = ("import json, sys\n"
        "from ckpt_surgeon.cli import cli\n"
        "try:\n"
        "    cli(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n"
        "    print(json.dumps({'heavy': sorted(m for m in ('torch', 'transformers') if m in sys.modules)}),"
        " file=sys.stderr)\n")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "answer-cache"
    monkeypatch.setenv("CKPT_SURGEON_CACHE_DIR", str(path))
    return path


def _cli(*args) -> tuple[list, str]:
    """Run ``ckpt-surgeon ARGS`` in a fresh interpreter -> (heavy modules it imported, stdout)."""
    r = subprocess.run([sys.executable, "-c", _RUN, *map(str, args)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stderr.strip().splitlines()[-1])["heavy"], r.stdout


def _answers(cache: Path, question: str) -> list[Path]:
    return sorted((cache / "_transformers_answers" / question).rglob("*.json"))


def test_second_conversion_does_not_import_torch(tiny, cache, tmp_path):
    from ckpt_surgeon.conversion import convert
    src = tiny("qwen2")
    # first run in this process (pytest has transformers already): asks it, keeps the answers
    convert(src, tmp_path / "a.gguf", dtype="f32")
    convert(tmp_path / "a.gguf", tmp_path / "a-hf")
    assert len(_answers(cache, "probe_folder")) == 1 and len(_answers(cache, "expected_tensors")) == 1
    heavy, _ = _cli("convert", src, "-o", tmp_path / "b.gguf", "--dtype", "f32", "--no-progress")
    assert heavy == []
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes()
    heavy, _ = _cli("convert", tmp_path / "b.gguf", "-o", tmp_path / "b-hf", "--no-progress")
    assert heavy == []
    for f in ("config.json", "tokenizer.json"):
        assert (tmp_path / "b-hf" / f).read_bytes() == (tmp_path / "a-hf" / f).read_bytes(), f
    from safetensors.numpy import load_file   # (its metadata names the source file, a.gguf / b.gguf)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("a-hf", "b-hf"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_changed_config_or_tokenizer_misses_the_cache(tiny, cache, tmp_path):
    from ckpt_surgeon.conversion import convert
    src = tmp_path / "src"
    shutil.copytree(tiny("qwen2"), src)
    convert(src, tmp_path / "a.gguf", dtype="f32")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5 if cfg.get("rms_norm_eps") != 1e-5 else 1e-6
    (src / "config.json").write_text(json.dumps(cfg))
    _cli("convert", src, "-o", tmp_path / "b.gguf", "--dtype", "f32", "--no-progress")   # asks its child process
    assert len(_answers(cache, "probe_folder")) == 2
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tcfg["model_max_length"] = 77
    (src / "tokenizer_config.json").write_text(json.dumps(tcfg))
    convert(src, tmp_path / "c.gguf", dtype="f32")
    assert len(_answers(cache, "probe_folder")) == 3


def test_a_corrupt_answer_is_a_miss(tiny, cache, tmp_path):
    from ckpt_surgeon.conversion import convert
    src = tiny("qwen2")
    convert(src, tmp_path / "a.gguf", dtype="f32")
    (path,) = _answers(cache, "probe_folder")
    path.write_text('{"answer": ')
    _cli("convert", src, "-o", tmp_path / "b.gguf", "--dtype", "f32", "--no-progress")
    # asked again (in the CLI's child process), and kept
    assert json.loads(path.read_text())["answer"]["config"]["model_type"] == "qwen2"
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes()


def test_lint_loads_cleanly_from_the_cache(tiny, cache, tmp_path):
    from ckpt_surgeon import lint
    src = tmp_path / "src"
    shutil.copytree(tiny("qwen2"), src)
    first = lint(str(src)).to_dict()
    assert "loads-cleanly" in first["checks"] and first["cached"] == []
    heavy, out = _cli("lint", src, "--format", "json")
    again = json.loads(out)
    assert heavy == []
    assert [c["check"] for c in again["cached"]] == ["loads-cleanly"]
    assert again["findings"] == first["findings"] and again["checks"] == first["checks"]
    heavy, out = _cli("lint", src)
    assert "cached loads-cleanly" in out and "from the cache" in out
    # a changed config is a different question
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["Qwen2ForSequenceClassification"]
    (src / "config.json").write_text(json.dumps(cfg))
    heavy, out = _cli("lint", src, "--format", "json")
    changed = json.loads(out)
    assert "transformers" in heavy and changed["cached"] == []
    assert any(f["check"] == "loads-cleanly" for f in changed["findings"])   # lm_head has no place there
