"""Issue 36 item 14: every phase of a long command shows progress on stderr, never on stdout.

``analyze --measure`` (loading, the layers measured, the whole-model passes), ``verify`` (a GGUF converted
for transformers, each model loading, the prompt loop, ``--localize``'s pass), ``convert`` both ways (the
plan checked with transformers, quantizing + writing, the tensor-set check).  The rule is
:mod:`ckpt_surgeon.progress`'s: ``--progress`` shows them on a pipe, the default (stderr not a terminal)
shows nothing, and ``--format json`` output stays parseable JSON on stdout.
"""
from __future__ import annotations

import json

from cli_util import _run


def test_phase_and_steps_follow_the_switch(capsys):
    from ckpt_surgeon.progress import phase, steps
    with phase(True, "loading x"):
        pass
    assert list(steps(True, [1, 2, 3], desc="layers")) == [1, 2, 3]
    out, err = capsys.readouterr()
    assert out == "" and "loading x ..." in err and "loading x: " in err and "layers" in err
    with phase(False, "loading y"):
        pass
    items = [1, 2]
    assert steps(False, items, desc="layers") is items      # off: the iterable itself, no tqdm
    assert capsys.readouterr() == ("", "")


def _json_and_err(res):
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return json.loads(res.stdout), res.stderr


def test_analyze_measure_phases(tiny):
    src = tiny("qwen2")
    doc, err = _json_and_err(_run("analyze", src, "--measure", "--progress", "--format", "json"))
    assert doc["measured"]["layers"]
    for needle in (f"loading {src.name} with transformers", "measuring layers", "whole-model passes"):
        assert needle in err, (needle, err)
    _, quiet = _json_and_err(_run("analyze", src, "--measure", "--format", "json"))   # not a terminal: silent
    assert "measuring layers" not in quiet and "loading" not in quiet, quiet


def test_verify_phases_gguf_loading_prompts_localize(tiny, tmp_path):
    from ckpt_surgeon.conversion import hf_to_gguf
    src = tiny("qwen2")
    gguf = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32")
    doc, err = _json_and_err(_run("verify", gguf, src, "--progress", "--localize", "--max-new-tokens", "0",
                                  "--format", "json"))
    assert "passed" in doc
    for needle in ("reference: converting m.gguf to a temporary HF folder", "reference: loading m.gguf",
                   f"candidate: loading {src.name}", "both models", "localize: reference"):
        assert needle in err, (needle, err)
    _, quiet = _json_and_err(_run("verify", gguf, src, "--max-new-tokens", "0", "--format", "json"))
    assert "converting" not in quiet and "loading" not in quiet, quiet


def test_convert_phases_both_ways(tiny, tmp_path):
    src = tiny("qwen2")
    out = tmp_path / "m.gguf"
    doc, err = _json_and_err(_run("convert", src, "-o", out, "--dtype", "q8_0", "--progress", "--format", "json"))
    assert doc["tensors"] and "planning m.gguf" in err and "quantizing + writing m.gguf" in err, err
    doc, err = _json_and_err(_run("convert", out, "-o", tmp_path / "hf", "--progress", "--format", "json"))
    assert "checking the tensor set" in err and "writing hf" in err, err


def test_analyze_measure_phases_of_the_profile_and_the_kv_cache(tiny, tmp_path):
    """--distance-profile --measure and --kv-cache --measure load a model and run the prompts too."""
    from kv_models import build_kv_qwen2
    src = tiny("qwen2")
    doc, err = _json_and_err(_run("analyze", src, "--distance-profile", "--measure", "--progress", "--format", "json"))
    assert doc["distance_profile"]["measured"], doc.keys()
    assert f"loading {src.name} with transformers" in err and "distance profile" in err, err
    kv = build_kv_qwen2(tiny, tmp_path / "kv", plant={0: 60.0})
    doc, err = _json_and_err(_run("analyze", kv, "--kv-cache", "q8_0", "--measure", "--progress", "--format", "json"))
    assert doc["kv_cache"]["measured"]["layers"], doc["kv_cache"].keys()
    assert "loading kv with transformers" in err and "Q, K, V through the cache types" in err, err
    _, quiet = _json_and_err(_run("analyze", kv, "--kv-cache", "q8_0", "--measure", "--format", "json"))
    assert "loading" not in quiet and "Q, K, V" not in quiet, quiet


def test_a_non_terminal_stderr_hears_of_long_steps_in_plain_lines(capsys, monkeypatch):
    """Issue 50 item 7: on a stderr that is not a terminal the default drew nothing, so a 7-minute verify printed
    nothing at all.  Now a step still running after CKPT_SURGEON_PROGRESS_AFTER seconds (10 by default) is said in
    plain lines, no bar; 0 says every step at once (what this test uses: no timing in it), a step that ends sooner
    says nothing, and --no-progress / CKPT_SURGEON_PROGRESS=0 silence the lines too."""
    from ckpt_surgeon.progress import counter, phase, progress_mode, steps
    monkeypatch.delenv("CKPT_SURGEON_PROGRESS", raising=False)
    assert progress_mode(None) == "lines" and progress_mode(True) == "bars" and progress_mode(False) == "off"
    monkeypatch.setenv("CKPT_SURGEON_PROGRESS_AFTER", "0")
    with phase(None, "loading x"):
        pass
    assert list(steps(None, [1, 2, 3], desc="layers", unit="layer")) == [1, 2, 3]
    with counter(None, total=4, desc="tokens", unit="tok") as c:
        c.tick(3)
        c.tick()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and "\r" not in err and "|" not in err, err          # lines, not bars
    assert lines[0] == "loading x ..." and lines[1].startswith("loading x: ") and lines[1].endswith(" s")
    assert "layers: 1/3 layer (" in err and lines[-1].startswith("tokens: 4/4 tok (") and lines[-1].endswith(", done")
    monkeypatch.setenv("CKPT_SURGEON_PROGRESS_AFTER", "1e9")                 # a short step: nothing said
    with phase(None, "loading y"):
        pass
    with counter(None, total=2, desc="tokens") as c:
        c.tick(2)
    assert capsys.readouterr() == ("", "")
    monkeypatch.setenv("CKPT_SURGEON_PROGRESS_AFTER", "0")
    for silenced in (lambda: phase(False, "z"), lambda: counter(None, total=1, desc="z")):
        monkeypatch.setenv("CKPT_SURGEON_PROGRESS", "0")
        with silenced():
            pass
    assert capsys.readouterr() == ("", "")


def test_verify_says_its_steps_and_tokens_on_a_pipe(tiny, tmp_path, monkeypatch):
    """Both runtimes of verify on a pipe: the GGUF converted for transformers and the prompt tokens counted (the
    per-prompt bar sat at 0/8 for a minute: the count is now of tokens, the greedy ones included), and a GGUF pair in
    llama.cpp; stdout stays the JSON report."""
    from ckpt_surgeon.conversion import hf_to_gguf
    monkeypatch.delenv("CKPT_SURGEON_PROGRESS", raising=False)
    monkeypatch.setenv("CKPT_SURGEON_PROGRESS_AFTER", "0")
    src = tiny("qwen2")
    gguf = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32")
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\nhello")
    doc, err = _json_and_err(_run("verify", gguf, src, "--prompts", prompts, "--max-new-tokens", "3",
                                  "--format", "json"))
    assert doc["passed"] and "\r" not in err
    assert "reference: converting m.gguf to a temporary HF folder (float32) ..." in err.splitlines(), err
    assert "both models: prompt tokens: 16/16 tok (" in err, err          # 2 models x 2 prompts x (1 + 3)
    doc, err = _json_and_err(_run("verify", gguf, gguf, "--prompts", prompts, "--max-new-tokens", "3",
                                  "--format", "json"))
    assert doc["mode"] == "llama.cpp" and "llama.cpp: prompt tokens, both models: 16/16 tok (" in err, err
