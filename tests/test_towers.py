"""Issue 27: renamed layouts (transformers' checkpoint key conversions), towers, and the invariant that
no attention bias is left unsaid.

The files are the zoo's tiny models (fixtures/zoo.py), saved by transformers' own ``save_pretrained``,
which writes a model's original checkpoint layout back (EXAONE's ``transformer.h.N.attn.attention``,
Sarvam-MoE's fused ``attention.query_key_value``).  Every value claimed is compared with what
transformers loads from the same file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zoo_util import EXACT_RTOL, logits64, rel_change


def _zoo(mt):
    from fixtures.build_fixtures import zoo_path
    return zoo_path(mt)


def _loaded_state(folder):
    """The state dict transformers loads from ``folder`` (float64, its own key conversions applied)."""
    import torch
    import transformers

    from ckpt_surgeon.arch.derive.derived import config_object
    from ckpt_surgeon.runtime import quiet_transformers
    cfg = json.loads((folder / "config.json").read_text())
    klass = getattr(transformers, cfg["architectures"][0])
    with quiet_transformers():
        model = klass.from_pretrained(folder, config=config_object(cfg), dtype=torch.float64)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_SURGEON_CACHE_DIR", str(tmp_path / "derive-cache"))


def test_exaone_original_layout_resolves_as_transformers_loads_it():
    from ckpt_surgeon import inspect, open_checkpoint
    src = _zoo("exaone")
    with open_checkpoint(str(src)) as ck:
        assert "transformer.h.0.attn.attention.k_proj.bias" in ck.tensors     # the original layout, as saved
        assert not any(n.startswith("model.layers.") for n in ck.tensors)
    rep = inspect(str(src))
    assert rep.layers_with_qkv_bias == rep.num_layers >= 2 and not rep.warnings and rep.skipped == ()
    state = _loaded_state(src)
    from safetensors.numpy import load_file
    saved = {k: v for f in src.glob("*.safetensors") for k, v in load_file(f).items()}
    for lr in rep.layers:
        # reports keep the file's names; the values are those transformers loads into the renamed parameter
        assert lr.k_bias.tensor == f"transformer.h.{lr.layer}.attn.attention.k_proj.bias"
        loaded = state[f"model.layers.{lr.layer}.self_attn.k_proj.bias"]
        assert np.array_equal(saved[lr.k_bias.tensor], loaded)
        assert lr.k_bias.l2 == pytest.approx(float(np.linalg.norm(loaded)), rel=1e-12)   # float64 norms
    assert any("converts at load" in n for n in rep.notes)


def test_exaone_fold_writes_the_files_own_layout(tmp_path):
    from ckpt_surgeon import analyze, fold_bias
    src = _zoo("exaone")
    rep = analyze(str(src))
    assert all(lr.v_bias is not None and lr.v_bias.foldable for lr in rep.layers)
    fold_bias(str(src), str(tmp_path / "out"), v=True)
    from safetensors.numpy import load_file
    out = {k: v for f in (tmp_path / "out").glob("*.safetensors") for k, v in load_file(f).items()}
    assert "transformer.h.0.attn.attention.v_proj.bias" in out and not any(k.startswith("model.layers") for k in out)
    assert rel_change(logits64(src), logits64(tmp_path / "out")) < EXACT_RTOL


def test_sarvam_fused_qkv_is_split_as_transformers_splits_it():
    from ckpt_surgeon import inspect
    src = _zoo("sarvam_moe")
    rep = inspect(str(src))
    assert rep.fused_layout == "concat" and rep.layers_with_qkv_bias == rep.num_layers >= 2
    assert not rep.warnings and rep.skipped == ()
    state = _loaded_state(src)
    from ckpt_surgeon.analysis.inspect import _split_fused_bias
    from safetensors.numpy import load_file
    saved = {k: v for f in src.glob("*.safetensors") for k, v in load_file(f).items()}
    lay = None
    from ckpt_surgeon import open_checkpoint
    with open_checkpoint(str(src)) as ck:
        lay = ck.layout()
    for lt in lay.layers:
        assert lt.qkv_bias == f"model.layers.{lt.layer}.attention.query_key_value.bias"
        parts = _split_fused_bias(saved[lt.qkv_bias], lay)
        for role, part in zip("qkv", parts):
            assert np.array_equal(part, state[f"model.layers.{lt.layer}.self_attn.{role}_proj.bias"])


def test_renames_module_maps_names_like_transformers():
    """renames.loaded_names is transformers' own rename (the rule set is never retyped): every EXAONE
    tensor maps to a parameter of the model, and the model's state dict is covered."""
    from ckpt_surgeon.arch.derive.derived import build_meta
    from ckpt_surgeon.arch.derive.renames import loaded_names
    src = _zoo("exaone")
    cfg = json.loads((src / "config.json").read_text())
    _, model = build_meta(cfg)
    from safetensors import safe_open
    names = [k for f in src.glob("*.safetensors") for k in safe_open(f, "np").keys()]
    got = loaded_names(model, names)
    state = model.state_dict()
    targets = {got[n].model_name if n in got else n for n in names}
    assert targets <= set(state) and got["transformer.h.1.attn.attention.out_proj.weight"].model_name == \
        "model.layers.1.self_attn.o_proj.weight"
    missing = set(state) - targets - {"lm_head.weight"}      # tied to the embedding
    assert not missing, sorted(missing)[:5]


def test_gemma3_siglip_tower_is_reported_and_folded_per_tower(tmp_path):
    """Gemma 3 (a registry family): its SigLIP tower's biases are a tower of their own (not the text layers'
    ``layers.N``), with the pooling head's ``in_proj_bias``; ``fold-bias --k`` folds the tower where exact
    (absolute positions) and keeps the rotary text stack's key bias, said in a note; transformers' float64
    forward pass (logits and the vision tower's outputs on fixed pixels) agrees."""
    from ckpt_surgeon import fold_bias, inspect
    from ckpt_surgeon.errors import CkptError, RefusedError
    src = _zoo("gemma3")
    rep = inspect(str(src))
    assert rep.family == "gemma3" and not rep.warnings and rep.skipped == ()
    kinds = {t.kind: t for t in rep.towers}
    assert set(kinds) == {"text", "vision", "projector"} and rep.towers[0].kind == "text"
    vision = kinds["vision"]
    assert all(lr.k_bias is not None and "vision_tower." in lr.k_bias.tensor for lr in vision.layers)
    assert not any("vision_tower." in (lr.k_bias.tensor if lr.k_bias else "") for lr in rep.layers)
    assert kinds["projector"].layers[0].k_bias.tensor.endswith("head.attention.in_proj_bias")
    assert {r["tower"] for r in rep.rows()} == {t.name for t in rep.towers}
    out = tmp_path / "k"
    res = fold_bias(str(src), str(out), k=True)
    assert any("biases kept" in n for n in res.plan.notes), res.plan.notes    # the rotary text stack
    from safetensors.numpy import load_file
    folded = {k: v for f in out.glob("*.safetensors") for k, v in load_file(f).items()}
    for lr in vision.layers:
        assert not folded[lr.k_bias.tensor].any()
    assert rel_change(logits64(src), logits64(out)) < EXACT_RTOL
    with pytest.raises(RefusedError):
        fold_bias(str(src), str(tmp_path / "t"), k=True, tower="text")
    with pytest.raises(CkptError, match="no such attention stack"):
        fold_bias(str(src), str(tmp_path / "n"), k=True, tower="nope")


def _tiny_seamless(out):
    """A tiny SeamlessM4T speech-to-text model (conformer speech encoder with ``linear_q/k/v``, its adapter,
    a text decoder with self- and cross-attention), every bias drawn with std 0.5, saved by transformers."""
    import transformers

    from ckpt_surgeon.arch.derive.instance import random_instance
    from ckpt_surgeon.runtime import quiet_transformers
    cfg = transformers.SeamlessM4TConfig(
        vocab_size=64, t2u_vocab_size=64, hidden_size=16, speech_encoder_layers=2, speech_encoder_attention_heads=2,
        speech_encoder_intermediate_size=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, feature_projection_input_dim=16,
        num_adapter_layers=1, adaptor_kernel_size=2, adaptor_stride=2, conv_depthwise_kernel_size=3,
        t2u_encoder_layers=1, t2u_decoder_layers=1, t2u_encoder_attention_heads=2, t2u_decoder_attention_heads=2,
        t2u_encoder_ffn_dim=16, t2u_decoder_ffn_dim=16, max_position_embeddings=64, t2u_max_position_embeddings=64,
        architectures=["SeamlessM4TForSpeechToText"]).to_dict()
    _, model = random_instance(cfg, transformers.SeamlessM4TForSpeechToText, seed=0)
    with quiet_transformers():
        model.save_pretrained(out)
    return out


def test_seamless_conformer_biases_land_in_an_audio_tower_row(tmp_path):
    """SeamlessM4T: its attention class names once read as an SSM mixer ("SeamlessM4T") and its conformer's
    ``linear_q/k/v`` as no projection, so all its biases were unplaced.  Now the speech encoder is an audio
    tower with one row per conformer layer, the adapter its own stack, the text decoder (self- and
    cross-attention) the main one; every key bias is classified by the float64 probe, and transformers'
    float64 forward pass (the logits and the speech encoder's own outputs) agrees with the exact fold."""
    from ckpt_surgeon import fold_bias, inspect
    src = _tiny_seamless(tmp_path / "src")
    rep = inspect(str(src))
    assert rep.skipped == () and not rep.warnings
    by_kind = {t.kind: t for t in rep.towers}
    audio = by_kind["audio"]
    assert audio.name == "speech_encoder.encoder.layers" and len(audio.layers) == 2
    assert (audio.num_heads, audio.num_kv_heads, audio.head_dim) == (2, 2, 8)
    for i, lr in enumerate(audio.layers):
        for role, b in zip("qkv", (lr.q_bias, lr.k_bias, lr.v_bias)):
            assert b.tensor == f"speech_encoder.encoder.layers.{i}.self_attn.linear_{role}.bias"
        assert (lr.extra.get("k_bias_redundancy") or {}).get("class") not in (None, "unknown")
    assert by_kind["projector"].layers[0].k_bias.tensor == "speech_encoder.adapter.layers.0.self_attn.linear_k.bias"
    text = rep.towers[0]
    assert text.kind == "text" and {lr.k_bias.tensor for lr in text.layers} == {
        "text_decoder.layers.0.self_attn.k_proj.bias", "text_decoder.layers.0.cross_attention.k_proj.bias"}
    fold_bias(str(src), str(tmp_path / "k"), k=True)
    from safetensors.numpy import load_file
    folded = {k: v for f in (tmp_path / "k").glob("*.safetensors") for k, v in load_file(f).items()}
    assert not folded[audio.layers[0].k_bias.tensor].any()
    assert rel_change(logits64(src), logits64(tmp_path / "k")) < EXACT_RTOL


def test_renamed_layout_is_matched_once_then_read_from_the_cache(tmp_path):
    """A file in a layout transformers renames at load (EXAONE here, the Hub's LLaVA likewise) is matched
    through the meta-device model's rules on the first run; later runs read the match from the derivation
    cache and import neither torch nor transformers (before the cache: every run, ~4 s)."""
    import os
    import subprocess
    import sys
    src = _zoo("exaone")
    code = ("import json, sys; from ckpt_surgeon import inspect; d = inspect(sys.argv[1]).to_dict(); "
            "print(json.dumps([[(r.get('k_bias'), r.get('q_bias')) for r in d['layers']], sorted(d.get('skipped', []))])); "
            "print('torch' in sys.modules)")
    env = dict(os.environ, CKPT_SURGEON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    runs = [subprocess.run([sys.executable, "-c", code, str(src)], capture_output=True, text=True, env=env)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    (rows1, torch1), (rows2, torch2) = (r.stdout.strip().splitlines() for r in runs)
    assert rows1 == rows2 and "transformer.h.0.attn.attention.k_proj.bias" in rows1, rows1
    assert torch1 == "True" and torch2 == "False", (torch1, torch2)
    assert list((tmp_path / "cache").rglob("*.names-*.json"))


def test_speech_encoder_is_an_audio_tower_and_its_conformer_is_classified(tmp_path):
    """A speech seq2seq model's encoder (``get_encoder()`` of a model whose main input is audio features) is an
    audio tower beside the text decoder, not one "text" stack with it (Canary / Cohere-ASR / Whisper were
    reported as ``model.decoder.layers + model.encoder.layers``).  Canary's conformer was ``unknown``: a conv
    front end at transformers' std-0.02 init passed only its biases, every frame reached attention as the same
    vector and the probe's control saw nothing; with variance-preserving conv weights in the probe instance it
    is classified, and the fold of every key bias is exact in transformers' float64 forward pass."""
    from ckpt_surgeon import fold_bias, inspect
    src = _zoo("canary@mm")
    rep = inspect(str(src))
    kinds = {t.name: t.kind for t in rep.towers}
    assert kinds == {"model.decoder.layers": "text", "model.encoder.layers": "audio"}, kinds
    for t in rep.towers:
        classes = {(lr.extra.get("k_bias_redundancy") or {}).get("class") for lr in t.layers if lr.k_bias is not None}
        assert classes == {"exact"}, (t.name, classes)
    fold_bias(str(src), str(tmp_path / "k"), k=True)
    from safetensors.numpy import load_file
    folded = {k: v for f in (tmp_path / "k").glob("*.safetensors") for k, v in load_file(f).items()}
    audio = next(t for t in rep.towers if t.kind == "audio")
    assert not folded[audio.layers[0].k_bias.tensor].any()
    assert rel_change(logits64(src), logits64(tmp_path / "k")) < EXACT_RTOL


@pytest.mark.parametrize("key, group", [
    ("blip-2@mm", "qformer.encoder.layer"),                           # a Q-Former: query embeddings + image states
    ("minicpmv4_6@mm", "model.vision_tower.vit_merger.self_attn"),    # target_sizes; the merger kept in the shrink
    ("lfm2_vl@mm", "model.vision_tower.encoder.layers"),             # SigLIP-2 NaFlex: spatial_shapes
    ("video_llama_3@mm", "model.vision_model.encoder.layers"),       # merge_sizes
    ("omniasr@mm", "model.audio_tower.layers"),                      # [b, 1, samples]
    ("trocr", "model.decoder.layers"),                               # cross-attention: seeded encoder states
    ("kosmos-2.5@mm", "image_to_text_projection.x_attn"),            # a projector without a config: features
    ("aria@mm", "model.multi_modal_projector.cross_attn.multihead_attn"),   # ... at its table's patch count
])
def test_towers_a_token_forward_never_runs_are_probed_alone(key, group):
    """Each of these stacks was ``unknown`` (the probe's control saw nothing): it is now run alone, or fed the
    input it needs, and every key-bias row of it is classified."""
    from ckpt_surgeon import inspect
    rep = inspect(str(_zoo(key)))
    t = next(t for t in rep.towers if t.name == group)
    classes = {(lr.extra.get("k_bias_redundancy") or {}).get("class") for lr in t.layers if lr.k_bias is not None}
    assert classes and None not in classes and "unknown" not in classes, classes


@pytest.mark.parametrize("key, want", [
    ("blip-2@mm", {"language_model.model.decoder.layers": "pre", "qformer.encoder.layer": "post",
                   "vision_model.encoder.layers": "pre"}),
    ("bert", {"text": "post"}),
    ("whisper@mm", {"model.decoder.layers": "pre", "model.encoder.layers": "pre"}),
    # SpeechT5: every path starts "speecht5." ("speech"); its text decoder is still the main stack
    ("speecht5@mm", {"speecht5.decoder.wrapped_decoder.layers": "post", "speecht5.encoder.wrapped_encoder.layers": "post"}),
])
def test_norm_placement_of_each_stack_is_traced(key, want):
    """Every derived stack says whether its attention reads a norm's output (pre) or the layer's input with a
    norm after it (post), traced with forward hooks in the probe; BLIP-2's Q-Former is post-norm (BERT-style)
    beside a pre-norm ViT and OPT.  The Q-Former's feed-forward for query tokens (``intermediate_query.dense``)
    is no attention bias: no unplaced-bias warning names it."""
    from ckpt_surgeon import analyze, inspect
    rep = inspect(str(_zoo(key)))
    assert {t.name: t.norm_placement for t in rep.towers} == want
    assert not any("could not be placed" in w for w in rep.warnings), rep.warnings
    d = analyze(str(_zoo(key))).to_dict()
    assert {t["name"]: t["norm_placement"] for t in d["towers"]} == want


def test_phi4_multimodal_key_bias_count_meets_module_introspection():
    """Issue 36 item 8: Phi-4-multimodal's text decoder has no q/k/v bias, its audio, vision and pooling-head
    stacks do.  ``layers_with_qkv_bias`` (the main stack's layers: 0) is not a count of key biases; the report's
    key-bias total over every stack equals a count made by introspecting transformers' own attention modules
    (test_zoo_towers' counter, independent of the report's name matching), and the table says where they are."""
    from ckpt_surgeon import inspect
    from cli_util import _run
    from test_zoo_towers import attention_biases
    src = _zoo("phi4_multimodal")
    introspected = sum(1 for role in attention_biases(src).values() if role in ("k", "qkv"))
    rep = inspect(str(src))
    assert rep.layers_with_qkv_bias == 0 and introspected >= 3      # the case: none in the text stack
    assert rep.to_dict()["key_bias_tensors"] == sum(rep.key_bias_tensors.values()) == introspected
    assert not rep.warnings and rep.skipped == ()
    kinds = {t.kind for t in rep.towers}
    assert {"audio", "vision"} <= kinds
    res = _run("inspect", src)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("key-bias tensors"))
    assert f"{introspected} in all stacks" in line and "text 0" in line and "layers only" in line
