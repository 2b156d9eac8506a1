"""The converter's model check runs in a child process when the parent has not imported
transformers (the CLI's normal case).  Tests import transformers themselves, so conversions in
other test files take the in-process path; here the child is exercised directly and through a
real ``ckpt-surgeon convert`` subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckpt_surgeon.conversion.model_check import ExpectedTensors, _InProcess
from ckpt_surgeon.errors import ConfigError


@pytest.mark.parametrize("name", ["qwen2", "llama_bias", "phi3", "gpt2"])
def test_child_answer_equals_in_process(tiny, name):
    cfg = json.loads((tiny(name) / "config.json").read_text())
    child, here = ExpectedTensors("config.json"), _InProcess("config.json")
    child.submit(cfg)
    here.submit(cfg)
    got = child.result()
    assert got == here.result() and len(got) > 10


def test_child_reports_an_unbuildable_config():
    child = ExpectedTensors("x.gguf")
    child.submit({"model_type": "no-such-model-type"})
    with pytest.raises(ConfigError, match=r"^x\.gguf: transformers cannot build a model from the converted config"):
        child.result()


def test_cli_conversion_in_a_fresh_process_round_trips(tiny, tmp_path, monkeypatch):
    """A fresh interpreter (no transformers imported) converts HF -> GGUF -> HF, so the
    GGUF -> HF step validates through the child process; the result equals the source.  An
    empty answer cache, so that the child is asked (conversion/answer_cache.py)."""
    from safetensors.numpy import load_file
    monkeypatch.setenv("CKPT_SURGEON_CACHE_DIR", str(tmp_path / "answer-cache"))
    src = tiny("qwen2")
    gguf, back = tmp_path / "m.gguf", tmp_path / "back"
    for a, b, dt in ((src, gguf, "f32"), (gguf, back, "float32")):
        r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(a), "-o", str(b), "--dtype", dt],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    want, got = load_file(str(src / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert set(got) <= set(want)
    for k, v in got.items():
        assert (v == want[k]).all(), k   # f32 round trip: bit-exact


def test_the_model_check_leaves_the_config_unchanged(tiny):
    """transformers standardises a config's nested dicts in place (Phi-3's rope_parameters gains
    partial_rotary_factor): the in-process check ran beside the writer of that very config.json,
    so a library conversion wrote a config the CLI's child process did not."""
    from ckpt_surgeon.conversion.model_check import expected_tensors
    cfg = json.loads((tiny("phi3") / "config.json").read_text())
    cfg["rope_parameters"].pop("partial_rotary_factor", None)     # as GGUF -> HF writes it
    before = json.dumps(cfg, sort_keys=True)
    assert len(expected_tensors(cfg)) > 10
    assert json.dumps(cfg, sort_keys=True) == before
