"""Issue 27: ``verify`` on a multimodal fold judges the text path on token ids and each vision tower on its
own outputs, run alone in both models on the same seeded pixels (verification/towers.py).

The models are the zoo's tiny LLaVA (CLIP tower, absolute positions: its key bias folds exactly) and
Qwen2-VL (2-D rotary tower: its key bias does not fold, its value bias does), saved by transformers'
``save_pretrained``.  A fold that only touches a tower leaves the token-id logits bit-identical, so only
the tower comparison can tell a sound fold from a broken one: the last test breaks one on purpose.
"""
from __future__ import annotations

import json
import shutil

import pytest
from cli_util import _run

IDS = [[5, 17, 33, 101, 7, 250]]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_SURGEON_CACHE_DIR", str(tmp_path / "derive-cache"))


def _zoo(key):
    from fixtures.build_fixtures import zoo_path
    return zoo_path(key)


def _verify_json(ref, cand, tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(IDS))
    res = _run("verify", ref, cand, "--token-ids", ids, "--max-new-tokens", "2", "--format", "json")
    return res, json.loads(res.stdout)


def test_llava_vision_key_fold_is_verified_on_the_tower(tmp_path):
    src, out = _zoo("llava@mm"), tmp_path / "folded"
    res = _run("fold-bias", src, "-o", out, "--k", "--tower", "model.vision_tower.encoder.layers")
    assert res.exit_code == 0, res.output
    res, d = _verify_json(src, out, tmp_path)
    assert res.exit_code == 0, res.output
    assert d["kind"] == "multimodal" and d["passed"] and d["max_new_tokens"] == 2
    assert d["metrics"]["max_abs_diff"] == 0.0          # the text path never runs the tower
    (t,) = d["towers"]
    assert t["name"] == "model.vision_tower.encoder.layers" and t["kind"] == "vision"
    assert t["module"] == "model.vision_tower" and t["inputs"].startswith("pixel_values [1, 3, ")
    # the fold moved the tower's outputs by float32 rounding only (verify computes in float32: ~1e-7 relative),
    # far below the float32 row's 1e-4; and it did move them (the tower really ran on the folded weights)
    assert 0 < t["max_rel_diff"] < 1e-5 and t["passed"] is True


def test_qwen2_vl_tower_value_fold_verified_key_fold_refused(tmp_path):
    src, out = _zoo("qwen2_vl@mm"), tmp_path / "folded"
    res = _run("fold-bias", src, "-o", tmp_path / "k", "--k", "--tower", "model.visual.blocks")
    assert res.exit_code == 2 and "RoPE" in res.stderr          # 2-D rotary: the key bias is not redundant
    res = _run("fold-bias", src, "-o", out, "--v", "--tower", "model.visual.blocks")
    assert res.exit_code == 0, res.output
    res, d = _verify_json(src, out, tmp_path)
    assert res.exit_code == 0, res.output
    (t,) = d["towers"]
    assert t["module"] == "model.visual" and "grid_thw [1, 3]" in t["inputs"]    # flattened patches + their grid
    assert t["passed"] is True and t["max_rel_diff"] < 1e-5
    # the table says it per tower
    res = _run("verify", src, out, "--token-ids", tmp_path / "ids.json", "--max-new-tokens", "0")
    assert res.exit_code == 0 and "tower model.visual.blocks" in res.output and "run alone as model.visual" in res.output


def test_a_broken_tower_fails_verify_though_the_text_path_is_identical(tmp_path):
    from safetensors.numpy import load_file, save_file
    src, bad = _zoo("qwen2_vl@mm"), tmp_path / "bad"
    shutil.copytree(src, bad)
    hit = 0
    for f in bad.glob("*.safetensors"):
        t = load_file(f)
        names = [n for n in t if n.endswith("visual.blocks.0.attn.qkv.bias")]   # the file keeps the original layout
        if names:
            t[names[0]] = t[names[0]] * 0       # q, k and v biases of one vision block dropped
            save_file(t, f, metadata={"format": "pt"})
            hit += 1
    assert hit == 1
    res, d = _verify_json(src, bad, tmp_path)
    assert res.exit_code == 1, res.output
    assert d["metrics"]["max_abs_diff"] == 0.0 and d["passed"] is False
    assert d["towers"][0]["passed"] is False and d["towers"][0]["max_rel_diff"] > 1e-3
    assert any(f.startswith("tower model.visual.blocks") for f in d["failures"])


def test_a_text_only_model_has_no_towers_key(tiny, tmp_path):
    res = _run("verify", tiny("qwen2"), tiny("qwen2"), "--max-new-tokens", "0", "--format", "json")
    assert res.exit_code == 0 and "towers" not in json.loads(res.stdout)


def test_speech_encoder_decoder_fold_is_verified_on_the_decoder_and_the_audio_tower(tmp_path):
    """An encoder-decoder (``seq2seq``): the prompt's ids are the decoder's input and the encoder reads seeded
    audio features built from the config, the same in both models; the speech encoder is an audio tower, also
    run alone.  A sound fold of Canary's key and value biases passes; a broken value fold (one conformer
    block's value bias dropped, the output bias not compensated) fails on the tower."""
    from safetensors.numpy import load_file, save_file
    src, out, bad = _zoo("canary@mm"), tmp_path / "folded", tmp_path / "bad"
    res = _run("fold-bias", src, "-o", out, "--k", "--v")
    assert res.exit_code == 0, res.output
    res, d = _verify_json(src, out, tmp_path)
    assert res.exit_code == 0, res.output
    assert d["kind"] == "seq2seq" and d["passed"] and d["max_new_tokens"] is None
    assert any("the encoder reads seeded input_features [1, " in n for n in d["notes"])
    (t,) = d["towers"]
    assert (t["name"], t["kind"], t["module"]) == ("model.encoder.layers", "audio", "model.encoder")
    # float32 rounding of the folded biases (verify computes in float32), far below the float32 row's 1e-4
    assert 0 < t["max_rel_diff"] < 1e-5 and t["passed"] is True
    assert d["metrics"]["max_rel_diff"] < 1e-5
    shutil.copytree(src, bad)
    for f in bad.glob("*.safetensors"):
        w = load_file(f)
        name = "model.encoder.layers.0.self_attn.v_proj.bias"
        if name in w:
            w[name] = w[name] * 0
            save_file(w, f, metadata={"format": "pt"})
    res, d = _verify_json(src, bad, tmp_path)
    assert res.exit_code == 1 and d["passed"] is False, res.output
    assert d["towers"][0]["passed"] is False and d["towers"][0]["max_rel_diff"] > 1e-3


def test_text_encoder_decoder_reads_the_prompt_on_both_sides(tmp_path):
    """BART: the encoder and the decoder both read the prompt's ids; a key-bias fold (absolute positions) passes,
    and an encoder-decoder is refused layer by layer in one line."""
    src, out = _zoo("bart@mm"), tmp_path / "folded"
    res = _run("fold-bias", src, "-o", out, "--k")
    assert res.exit_code == 0, res.output
    res, d = _verify_json(src, out, tmp_path)
    assert res.exit_code == 0 and d["kind"] == "seq2seq" and d["passed"], res.output
    assert any("the encoder reads the same token ids" in n for n in d["notes"]) and "towers" not in d
    res = _run("verify", src, out, "--token-ids", tmp_path / "ids.json", "--stream")
    assert res.exit_code == 2 and "encoder-decoder model is not run layer by layer" in res.stderr
