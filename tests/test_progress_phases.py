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
