"""GGUF <-> HF conversion on the tiny fixtures: names, round trips, configs, tokenizers, errors.

llama.cpp-side checks (the GGUF files run in llama.cpp) are in tests/test_llamacpp.py; the real
SmolLM2 file is in tests/test_convert_smollm.py.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert_variants import (LLAMACPP_FAMILIES, MULTILINGUAL, STRAYS, build_variant, gguf_metadata, hf_tensor_bytes,
                              read_json, spm_llama, with_dtype)

from ckpt_surgeon.analysis.tokenizer import compare_tokenizers, tokenizer
from ckpt_surgeon.conversion import gguf_to_hf, gguf_to_hf_report, hf_to_gguf
from ckpt_surgeon.conversion import names as N
from ckpt_surgeon.errors import (CkptError, ConfigError, OutputExistsError, RefusedError, UnsupportedError)

DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@pytest.fixture(scope="session")
def family_dir(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    cache: dict = {}

    def get(name: str, dtype: str = "float32") -> Path:
        key = (name, dtype)
        if key not in cache:
            base = build_variant(tiny, name, root / name)
            cache[key] = with_dtype(base, dtype, root / f"{name}-{dtype}")
        return cache[key]
    return get


@pytest.fixture(scope="session")
def gguf_of(family_dir, tmp_path_factory):
    """Our HF -> GGUF file for (family, gguf dtype), cached for the session."""
    root = tmp_path_factory.mktemp("ggufs")
    cache: dict = {}

    def get(name: str, dtype: str = "f32", hf_dtype: str = "float32") -> Path:
        key = (name, dtype, hf_dtype)
        if key not in cache:
            cache[key] = hf_to_gguf(family_dir(name, hf_dtype), root / f"{name}-{hf_dtype}.{dtype}.gguf",
                                    dtype=dtype, name="tiny")
        return cache[key]
    return get


def _files_hash(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --- the name table -------------------------------------------------------------------------

def _arch_enum(gguf_arch: str):
    import gguf
    return next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch)


@pytest.mark.parametrize("spec", N.ARCHS, ids=lambda s: s.gguf_arch)
def test_name_table_agrees_with_gguf_py(spec):
    """Every HF -> GGUF name in our table is what gguf-py's TensorNameMap (the table llama.cpp's
    converter uses) gives for that architecture (for an expert row: the name of the stacked
    tensor llama.cpp's converter maps, without the expert index)."""
    import gguf
    tmap = gguf.get_tensor_name_map(_arch_enum(spec.gguf_arch), 3)
    for rule in spec.tensors:
        for layer in ("0", "2"):
            if rule.split:      # each part is named by gguf-py under the spelling the registry gives it
                continue
            hf = rule.hf.replace("{L}", layer).replace(".{E}", "")
            ours = rule.gguf.replace("{L}", layer)
            # BloomModel strips "transformer." before asking the map (gguf-py lists both for the rest)
            got = tmap.get_name(hf, try_suffixes=(".weight", ".bias")) or \
                tmap.get_name(hf.removeprefix("transformer."), try_suffixes=(".weight", ".bias"))
            assert got == ours, (spec.gguf_arch, hf)
            if rule.hf_alt:     # Falcon's input_layernorm: the same GGUF name as ln_mlp
                assert tmap.get_name(rule.hf_alt.replace("{L}", layer).removeprefix("transformer."),
                                     try_suffixes=(".weight", ".bias")) == ours, (spec.gguf_arch, rule.hf_alt)
    # and both directions of our map are inverse to each other, for either spelling of a module
    fwd, back = N.hf_to_gguf_names(spec), N.gguf_to_hf_names(spec)
    alt = N.gguf_to_hf_names(spec, dict([spec.hf_alt_when])) if spec.hf_alt_when else back
    for rule in spec.tensors:
        hf = rule.hf.replace("{L}", "7").replace("{E}", "3")
        g, _ = fwd.match(hf)
        assert back.match(g)[0] == hf.replace(".3.", ".{E}.") if rule.experts else hf
        assert fwd.expert(hf) == (3 if rule.experts else None)
        if rule.hf_alt:
            hf_alt = rule.hf_alt.replace("{L}", "7")
            assert fwd.match(hf_alt)[0] == g and alt.match(g)[0] == hf_alt


# --- round trips ----------------------------------------------------------------------------

ROUND_TRIP_FAMILIES = ("qwen2", "qwen2_long", "qwen2_sharded", "llama", "llama_bias", "llama3_rope", "llama_linear", "qwen2_yarn", "qwen3_yarn", "mistral", "qwen3", "phi3",
                       "gpt2", "qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "starcoder2", "olmo2", "granite",
                       "phi", "gpt_neox", "cohere", "stablelm", "bloom", "falcon_nobias", "falcon_mq_nobias",
                       "falcon_11b", "falcon_mha", "phimoe", "deepseek_v2", "phi3_longrope", "phimoe_longrope",
                       "deepseek_v2_yarn", "phi4mini_longrope")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", ROUND_TRIP_FAMILIES)
def test_hf_gguf_hf_round_trip_is_bit_exact(family, dtype, family_dir, tmp_path):
    """HF (f32/f16/bf16) -> GGUF (same dtype) -> HF: every tensor byte-identical, same names,
    shapes and dtypes (norms, biases and MoE routers pass through F32 in the GGUF, which holds
    every f16/bf16 value exactly).  A tensor transformers keeps float32 in a half-precision model
    (DeepSeek-V2's router, ``_keep_in_fp32_modules_strict``) is F32 in the source, stays F32 in the
    GGUF and comes back F32: the registry's ``hf_float32`` rows must name exactly those."""
    src = family_dir(family, dtype)
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype=DTYPES[dtype], name="tiny")
    out = gguf_to_hf(g, tmp_path / "back", dtype=dtype)
    if dtype == "float32":          # issue 48: the tokenizer and chat template come back too, in either format
        for x, y in ((src, g), (src, out)):
            d = compare_tokenizers(tokenizer(x), tokenizer(y))
            assert d.same, (family, str(y), d.to_dict())
    a, b = hf_tensor_bytes(src), hf_tensor_bytes(out)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name
    if dtype != "float32":      # what transformers saved in float32 is what the registry keeps float32
        spec = N.by_model_type(read_json(src / "config.json")["model_type"])
        keep = [N.template_regex(t) for t in spec.hf_float32]
        saved32 = {n for n, (dt, _, _) in a.items() if dt == "F32"}
        assert saved32 == {n for n in a if any(rx.match(n) for rx in keep)}
        assert bool(saved32) == family.startswith("deepseek_v2")


@pytest.mark.parametrize("family,norms", [("gemma3", 6 * 6 + 1), ("gemma2", 2 * 4 + 1), ("gemma3_linear", 6 * 6 + 1)])
def test_gemma_round_trip_exact_except_one_rounding_in_norms(family, norms, family_dir, tmp_path):
    """Gemma stores norms as w and applies 1 + w; llama.cpp's file holds 1 + w (in F32).  The
    round trip is exact for every other tensor; a norm weight can move by the one rounding
    of 1 + w to float32 (|error| <= ulp(1 + w) / 2, i.e. <= 2**-24 * (1 + |w|))."""
    src = family_dir(family)
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    out = gguf_to_hf(g, tmp_path / "back")
    a, b = hf_tensor_bytes(src), hf_tensor_bytes(out)
    assert sorted(a) == sorted(b)
    shifted = 0
    for name, (dt, shape, raw) in a.items():
        if "norm" in name:
            x = np.frombuffer(raw, np.float32)
            y = np.frombuffer(b[name][2], np.float32)
            assert np.all(np.abs(x - y) <= 2.0 ** -24 * (1 + np.abs(x))), name
            shifted += 1
        else:
            assert b[name] == (dt, shape, raw), name
    assert shifted == norms   # every norm of every layer (6 in Gemma 3, 4 in Gemma 2) + the final one
    # the rope parameters come back as given (Gemma 3's linear scaling: on the full-attention layers only)
    assert read_json(out / "config.json")["rope_parameters"] == read_json(src / "config.json")["rope_parameters"]


_QTYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "llama.cpp:Q4_0", "llama.cpp:Q5_1")


@pytest.fixture(scope="session")
def any_type_gguf(family_dir, tmp_path_factory):
    """A GGUF of (family, type): written by the reference writer in tests/gguf_util.py (gguf-py
    quantizers), or quantized by llama.cpp itself from our f32 file.  Gemma 3 always starts from
    our writer: the reference writer does not apply llama.cpp's +1 norm shift."""
    from gguf_util import llama_quantize, write_gguf
    root = tmp_path_factory.mktemp("anytype")
    ours = {"F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
    cache: dict = {}

    def get(family: str, qtype: str) -> Path:
        key = (family, qtype)
        if key not in cache:
            if family == "gemma3" and qtype in ours:
                cache[key] = hf_to_gguf(family_dir(family), root / f"{family}.{qtype}.gguf", dtype=ours[qtype],
                                        name="tiny")
            elif qtype.startswith("llama.cpp:") or family == "gemma3":
                lq = qtype.split(":")[-1]
                f32 = root / f"{family}.f32.gguf"
                if not f32.exists():
                    hf_to_gguf(family_dir(family), f32, dtype="f32", name="tiny")
                cache[key] = llama_quantize(f32, root / f"{family}.{lq}.lc.gguf", lq)
            else:
                cache[key] = write_gguf(family_dir(family), root / f"{family}.{qtype}.gguf", qtype=qtype)
        return cache[key]
    return get


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from(("qwen2", "llama", "llama_bias", "mistral", "qwen3", "phi3", "gpt2", "gemma3")),
       qtype=st.sampled_from(_QTYPES))
def test_gguf_any_type_to_hf_to_gguf_to_hf_is_bit_exact(family, qtype, any_type_gguf, tmp_path_factory):
    """GGUF (any type) -> HF f32 -> GGUF f32 -> HF f32: the two HF folders are byte-identical.

    The first step dequantizes; after it every step is a permutation, transpose or (Gemma)
    +1 / -1 that the next step undoes exactly (the -1 is exact by Sterbenz' lemma for stored
    norms in [0.5, 2], which these are)."""
    tmp = tmp_path_factory.mktemp("rt")
    g0 = any_type_gguf(family, qtype)
    hf1 = gguf_to_hf(g0, tmp / "hf1")
    g1 = hf_to_gguf(hf1, tmp / "g1.gguf", dtype="f32", name="tiny")
    hf2 = gguf_to_hf(g1, tmp / "hf2")
    a, b = hf_tensor_bytes(hf1), hf_tensor_bytes(hf2)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name
    assert read_json(hf1 / "config.json") == read_json(hf2 / "config.json")
    # The tokenizer as transformers runs it: for model_type qwen2 that is Qwen2Tokenizer's split,
    # whatever the first tokenizer.json (rebuilt from a GGUF without tokenizer.ggml.pre) says.
    from transformers import AutoTokenizer
    t1, t2 = AutoTokenizer.from_pretrained(hf1), AutoTokenizer.from_pretrained(hf2)
    assert t1.get_vocab() == t2.get_vocab()
    assert t1.encode(MULTILINGUAL) == t2.encode(MULTILINGUAL)


# Families whose GGUF files are not written by the reference writer of tests/gguf_util.py (MoE
# stacks, LayerNorm biases, post-norms, multipliers): their GGUF round trips start from ours.
GGUF_ROUND_TRIP_FAMILIES = ("llama3_rope", "llama_linear", "qwen2_yarn", "qwen3_yarn", "qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "starcoder2", "olmo2", "granite", "phi",
                            "gpt_neox", "cohere", "stablelm", "bloom", "gemma2", "falcon_nobias", "falcon_mq_nobias",
                            "falcon_11b", "falcon_mha", "phimoe", "deepseek_v2", "phi3_longrope", "phimoe_longrope",
                            "deepseek_v2_yarn")
MOE_ROUND_TRIP_FAMILIES = ("qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "phimoe", "deepseek_v2", "phimoe_longrope",
                           "deepseek_v2_yarn")


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "llama.cpp:Q4_0"])
@pytest.mark.parametrize("family", GGUF_ROUND_TRIP_FAMILIES)
def test_ours_gguf_to_hf_to_gguf_is_bit_exact(family, qtype, family_dir, tmp_path):
    """Stacked experts (ffn_*_exps, [n_expert, ...]) unstack into one HF tensor per expert and
    stack back, and every other tensor maps one to one: GGUF (ours, or quantized by llama.cpp from ours) -> HF f32 -> GGUF f32 -> HF f32
    gives byte-identical HF folders, and from an f32 GGUF the second GGUF is byte-identical to
    the first, tensor for tensor, metadata included (bar general.name)."""
    from gguf_util import llama_quantize
    if family.startswith("deepseek_v2") and qtype.startswith("llama.cpp:"):
        # llama.cpp 0.3.36 loads (and so quantizes) a deepseek2 file without attention.q_lora_rank
        # only at V2-Lite's 27 layers: the same tiny model with 27 layers
        src = family_dir(family.replace("deepseek_v2", "deepseek_v2_lite"))
    else:
        src = family_dir(family)
    f32 = hf_to_gguf(src, tmp_path / "f32.gguf", dtype="f32", name="tiny")
    g0 = {"f32": f32, "q8_0": None, "llama.cpp:Q4_0": None}[qtype]
    if qtype == "q8_0":
        g0 = hf_to_gguf(src, tmp_path / "q8.gguf", dtype="q8_0", name="tiny")
    elif qtype.startswith("llama.cpp:"):
        g0 = llama_quantize(f32, tmp_path / "q4.gguf", qtype.split(":")[1])
    hf1 = gguf_to_hf(g0, tmp_path / "hf1")
    g1 = hf_to_gguf(hf1, tmp_path / "g1.gguf", dtype="f32", name="tiny")
    hf2 = gguf_to_hf(g1, tmp_path / "hf2")
    if qtype == "f32":              # issue 48: the tokenizer too
        for x, y in ((g0, hf1), (g0, g1)):
            d = compare_tokenizers(tokenizer(x), tokenizer(y))
            assert d.same, (family, str(y), d.to_dict())
    a, b = hf_tensor_bytes(hf1), hf_tensor_bytes(hf2)
    assert sorted(a) == sorted(b)
    assert any(".experts.3." in n for n in a) == (family in MOE_ROUND_TRIP_FAMILIES)
    for name in a:
        assert a[name] == b[name], name
    assert read_json(hf1 / "config.json") == read_json(hf2 / "config.json")
    if qtype == "f32":
        from ckpt_surgeon.checkpoint import open_checkpoint
        with open_checkpoint(g0) as x, open_checkpoint(g1) as y:
            assert sorted(x.tensors) == sorted(y.tensors)
            for name in x.tensors:
                assert x.read_raw(name) == y.read_raw(name), name
            assert dict(x.metadata) == dict(y.metadata)


def test_gguf_to_hf_matches_reference_writer_and_original(family_dir, tmp_path):
    """A GGUF written by the independent reference writer (tests/gguf_util.py: gguf-py names,
    its own llama permutation and Conv1D transpose) converts back to the original tensors."""
    from gguf_util import write_gguf
    for family in ("llama_bias", "qwen2", "gpt2", "phi3"):
        src = family_dir(family)
        g = write_gguf(src, tmp_path / f"{family}.gguf")
        out = gguf_to_hf(g, tmp_path / family)
        a, b = hf_tensor_bytes(src), hf_tensor_bytes(out)
        assert sorted(a) == sorted(b), family
        for name in a:
            assert a[name] == b[name], (family, name)


# --- against transformers' own GGUF loader ------------------------------------------------------

# llama_bias is not in the list: transformers' GGUF loader builds LlamaConfig(attention_bias=False)
# and silently drops the q/k/v/o biases (one of the "details" the issue says it loses); our
# folder keeps them (test_gguf_to_hf_matches_reference_writer_and_original).  gpt2 is not either:
# its GGUF config map reads n_inner / n_positions from keys GPT2Config does not have, so any GPT-2
# whose sizes differ from the defaults fails to load there ("size mismatch").  gemma3 is not either:
# it leaves query_pre_attn_scalar at the config default (256) where llama.cpp scales by 1/sqrt(head_dim).
# qwen3 is not either: attention.key_length is not mapped to head_dim (Qwen3Config default 128).
@pytest.mark.parametrize("family,qtype", [("llama", "f32"), ("llama", "q8_0"), ("qwen2", "f16"), ("qwen2", "bf16"),
                                          ("phi3", "q8_0"), ("qwen2_long", "f32")])
def test_logits_match_transformers_gguf_loading(family, qtype, gguf_of, tmp_path):
    """Our HF folder runs exactly like transformers' from_pretrained(dir, gguf_file=...) of the
    same file.  Both dequantize the same blocks to float32 and undo the same permutation, so the
    bound is float32 noise: 1e-5 absolute on logits of scale ~1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    g = gguf_of(family, qtype)
    out = gguf_to_hf(g, tmp_path / "hf")
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    ref = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(out).encode(MULTILINGUAL)
    with torch.no_grad():
        a = ours(torch.tensor([ids])).logits
        b = ref(torch.tensor([ids])).logits
    assert torch.max(torch.abs(a - b)).item() <= 1e-5


# --- configs and metadata -------------------------------------------------------------------

REQUIRED_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count")


@pytest.mark.parametrize("family", LLAMACPP_FAMILIES)
def test_gguf_metadata_llama_cpp_needs(family, gguf_of, family_dir):
    meta, tensors = gguf_metadata(gguf_of(family, "f32"))
    cfg = read_json(family_dir(family) / "config.json")
    arch = meta["general.architecture"]
    for key in REQUIRED_KEYS:
        assert f"{arch}.{key}" in meta, key
    assert meta["general.file_type"] == 0
    # transformers 5 runs Qwen2Tokenizer (the Qwen2 split regex, whatever tokenizer.json says) for
    # model_type qwen2, the file's GPT-2 ByteLevel split for the others: llama.cpp must do the same.
    if (family_dir(family) / "tokenizer.model").is_file():     # a SentencePiece variant (gemma2_spm)
        assert meta["tokenizer.ggml.model"] == "llama" and meta.get("tokenizer.ggml.pre", "default") == "default"
    else:
        assert meta["tokenizer.ggml.model"] == "gpt2"
        assert meta["tokenizer.ggml.pre"] == ("qwen2" if cfg["model_type"] == "qwen2" else "gpt-2")
    assert meta[f"{arch}.embedding_length"] == cfg.get("hidden_size", cfg.get("n_embd"))
    if arch not in ("gpt2", "bloom"):      # learned positions / ALiBi: no rope
        theta = cfg["rope_parameters"].get("rope_theta") or cfg["rope_parameters"]["full_attention"]["rope_theta"]
        assert meta[f"{arch}.rope.freq_base"] == pytest.approx(theta)   # written even when it is 10000
        # llama.cpp reads a missing head_count_kv as head_count (GPT-NeoX files have none)
        # (Falcon: num_kv_heads, and one kv head for multi_query without new_decoder_architecture)
        kv = cfg.get("num_key_value_heads", cfg.get("num_kv_heads", cfg["num_attention_heads"]))
        spec = N.by_model_type(cfg["model_type"])
        assert meta.get(f"{arch}.attention.head_count_kv", meta[f"{arch}.attention.head_count"]) == \
            spec.gguf_values.get("n_head_kv", N.kv_heads(spec, cfg, kv))
        if "rms_norm_eps" in cfg:
            assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
        else:   # LayerNorm families: StarCoder2 norm_epsilon, Phi-2 / GPT-NeoX layer_norm_eps, Falcon
            eps = cfg.get("norm_epsilon", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon")))
            assert meta[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(eps)
    else:
        assert f"{arch}.rope.freq_base" not in meta
        assert meta[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(cfg["layer_norm_epsilon"])
    assert ("output.weight" in tensors) == (not cfg.get("tie_word_embeddings", arch == "gpt2"))
    assert meta["tokenizer.ggml.eos_token_id"] == cfg["eos_token_id"]
    template = family_dir(family) / "chat_template.jinja"
    assert meta.get("tokenizer.chat_template") == (template.read_text() if template.is_file() else None)


def test_rope_theta_1e6_survives_both_ways(gguf_of, tmp_path):
    meta, _ = gguf_metadata(gguf_of("qwen2_long", "f16"))
    assert meta["qwen2.rope.freq_base"] == 1e6
    assert meta["qwen2.context_length"] == 32768
    cfg = read_json(gguf_to_hf(gguf_of("qwen2_long", "f16"), tmp_path / "hf") / "config.json")
    assert cfg["rope_parameters"]["rope_theta"] == 1e6 and cfg["rope_theta"] == 1e6
    assert cfg["max_position_embeddings"] == 32768


def test_config_from_gguf(gguf_of, family_dir, tmp_path):
    """tie_word_embeddings from the tensors, heads/kv heads/head_dim/eps/bias switch from metadata,
    Gemma 3's sliding window and layer pattern, GPT-2's own spellings."""
    for family in ("llama_bias", "gemma3", "gpt2", "qwen3"):
        cfg = read_json(gguf_to_hf(gguf_of(family, "f32"), tmp_path / family) / "config.json")
        src = read_json(family_dir(family) / "config.json")
        keys = ["vocab_size", "tie_word_embeddings"]
        keys += (["n_embd", "n_layer", "n_head", "n_positions", "layer_norm_epsilon"] if family == "gpt2" else
                 ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "max_position_embeddings", "rms_norm_eps"])
        if family in ("llama_bias", "qwen3", "gemma3"):
            keys.append("attention_bias")
        if family == "gemma3":
            keys += ["sliding_window", "layer_types", "query_pre_attn_scalar", "rope_parameters"]
        for k in keys:
            want = src.get(k, True if (k == "tie_word_embeddings" and family == "gpt2") else None)
            assert cfg[k] == (pytest.approx(want) if isinstance(want, float) else want), (family, k)
        assert cfg["architectures"] == src["architectures"]


def test_tied_when_output_duplicates_token_embd(family_dir, tmp_path):
    """llama.cpp's GPT-2 converter writes the tied matrix twice (output.weight = token_embd);
    a byte-identical output.weight means tied, and is not written to the HF folder."""
    import gguf
    g = hf_to_gguf(family_dir("gpt2"), tmp_path / "g.gguf", dtype="f32", name="tiny")
    r = gguf.GGUFReader(g)
    w = gguf.GGUFWriter(tmp_path / "dup.gguf", "gpt2")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    w.add_tensor("output.weight", np.array(emb.data))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    rep = gguf_to_hf_report(tmp_path / "dup.gguf", tmp_path / "hf")
    assert rep.tied_embeddings
    assert read_json(tmp_path / "hf" / "config.json")["tie_word_embeddings"] is True
    assert "lm_head.weight" not in hf_tensor_bytes(tmp_path / "hf")


# --- tokenizers -----------------------------------------------------------------------------

@pytest.mark.parametrize("family", ("qwen2", "gpt2", "phi3"))
def test_tokenizer_round_trip(family, gguf_of, family_dir, tmp_path, monkeypatch):
    """HF tokenizer -> tokenizer.ggml.* -> tokenizer.json: AutoTokenizer loads it offline and
    encodes the multilingual text to the same ids; specials, chat template, generation ids kept."""
    from transformers import AutoTokenizer
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = family_dir(family)
    out = gguf_to_hf(gguf_of(family, "f16"), tmp_path / "hf")
    a, b = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    assert b.encode(MULTILINGUAL) == a.encode(MULTILINGUAL)
    assert b.decode(b.encode(MULTILINGUAL)) == MULTILINGUAL
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(b, attr) == getattr(a, attr), attr
    msgs = [{"role": "user", "content": "Hi 👋"}]
    assert b.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        a.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    gen_src, gen_out = read_json(src / "generation_config.json"), read_json(out / "generation_config.json")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert gen_out[k] == gen_src[k]


def test_sentencepiece_tokenizer_both_ways(tiny, tmp_path_factory, tmp_path):
    """tokenizer.json of a SentencePiece BPE (byte fallback) -> GGUF 'llama' vocabulary with
    scores, byte tokens and the space prefix -> tokenizer.json that encodes like the original."""
    from transformers import AutoTokenizer
    src = spm_llama(tiny, tmp_path_factory.mktemp("spm") / "model")
    g = hf_to_gguf(src, tmp_path / "spm.gguf", dtype="f32", name="tiny")
    meta, _ = gguf_metadata(g)
    assert meta["tokenizer.ggml.model"] == "llama"
    types = list(meta["tokenizer.ggml.token_type"])
    assert types.count(6) == 256                               # <0x00> .. <0xFF>
    assert types[0] == 2 and types[1] == types[2] == 3           # <unk>, <s>, </s>
    assert meta["tokenizer.ggml.add_space_prefix"] is True
    assert len(meta["tokenizer.ggml.scores"]) == len(meta["tokenizer.ggml.tokens"])
    out = gguf_to_hf(g, tmp_path / "hf")
    a, b = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    for text in (MULTILINGUAL, "Hello world", "x=1 2 3 ∑ tab\there"):
        assert b.encode(text, add_special_tokens=False) == a.encode(text, add_special_tokens=False), text
        assert b.decode(b.encode(text, add_special_tokens=False)) == text


def test_unknown_pre_tokenizer_is_refused(family_dir, tmp_path):
    src = tmp_path / "m"
    shutil.copytree(family_dir("llama"), src)   # not qwen2: transformers forces Qwen2's split there
    tj = read_json(src / "tokenizer.json")
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(UnsupportedError, match="pre_tokenizer is not one llama.cpp knows"):
        hf_to_gguf(src, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


# --- errors: one clear message, nothing written, inputs untouched -------------------------------

def test_moe_routing_llama_cpp_cannot_run_is_refused(family_dir, tmp_path):
    """llama.cpp renormalises Qwen3-MoE's top-k weights whatever the file says; a config that
    does not is refused with the reason, nothing written, the input untouched."""
    src = tmp_path / "m"
    shutil.copytree(family_dir("qwen3_moe"), src)
    cfg = read_json(src / "config.json")
    cfg["norm_topk_prob"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    before = _files_hash(src)
    with pytest.raises(UnsupportedError, match="llama.cpp's qwen3moe assumes norm_topk_prob = True"):
        hf_to_gguf(src, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists() and _files_hash(src) == before


def test_moe_gguf_missing_expert_dimension_is_an_error(family_dir, tmp_path):
    """A GGUF whose expert tensor is not [n_expert, ...] (here: one expert's matrix) is one clear
    error naming the tensor; nothing is written."""
    from gguf_util import rewrite_gguf
    g = hf_to_gguf(family_dir("olmoe"), tmp_path / "m.gguf", dtype="f32", name="tiny")
    bad = rewrite_gguf(g, tmp_path / "bad.gguf",
                       tensors=lambda n, a: a[0] if n == "blk.1.ffn_up_exps.weight" else a)
    with pytest.raises(CkptError) as e:
        gguf_to_hf(bad, tmp_path / "hf")
    assert "blk.1.ffn_up_exps.weight" in str(e.value)
    assert not (tmp_path / "hf").exists()


def test_missing_tensor_in_hf_is_an_error(family_dir, tmp_path):
    from safetensors.numpy import load_file, save_file
    src = tmp_path / "m"
    shutil.copytree(family_dir("qwen2"), src)
    sd = load_file(src / "model.safetensors")
    del sd["model.layers.1.self_attn.k_proj.bias"]
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError) as e:
        hf_to_gguf(src, tmp_path / "o.gguf")
    assert "model.layers.1.self_attn.k_proj.bias" in str(e.value) and "random" in str(e.value)
    assert not (tmp_path / "o.gguf").exists() and not _leftovers(tmp_path)


def test_unexpected_tensor_in_hf_is_an_error(family_dir, tmp_path):
    from safetensors.numpy import load_file, save_file
    src = tmp_path / "m"
    shutil.copytree(family_dir("llama"), src)
    sd = load_file(src / "model.safetensors")
    sd["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)   # config says attention_bias=False
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="tensor 'model.layers.0.self_attn.q_proj.bias'"):
        hf_to_gguf(src, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def _rewrite_gguf(src: Path, dst: Path, *, drop=(), add=None) -> Path:
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.get_field("general.architecture").contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.array(t.data))
    for name, arr in (add or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return dst


def test_gguf_with_unmapped_tensor_is_an_error(gguf_of, tmp_path):
    g = _rewrite_gguf(gguf_of("qwen2", "f32"), tmp_path / "x.gguf", add={"blk.0.attn_sinks.weight": np.zeros(4, np.float32)})
    with pytest.raises(UnsupportedError) as e:
        gguf_to_hf(g, tmp_path / "out")
    assert "tensor 'blk.0.attn_sinks.weight'" in str(e.value) and str(g) in str(e.value)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_gguf_missing_tensor_is_an_error(gguf_of, tmp_path):
    g = _rewrite_gguf(gguf_of("qwen2", "f32"), tmp_path / "x.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ConfigError) as e:
        gguf_to_hf(g, tmp_path / "out")
    assert "model.layers.1.mlp.up_proj.weight" in str(e.value)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_gguf_wrong_shape_is_an_error(gguf_of, tmp_path):
    g = _rewrite_gguf(gguf_of("qwen2", "f32"), tmp_path / "x.gguf", drop=("blk.0.attn_k.bias",),
                      add={"blk.0.attn_k.bias": np.zeros(48, np.float32)})
    with pytest.raises(ConfigError, match=r"tensor 'blk.0.attn_k.bias': shape \[48\] but .* expects \[32\]"):
        gguf_to_hf(g, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_gguf_is_an_error(gguf_of, tmp_path):
    src = gguf_of("qwen2", "f32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:-5000])
    with pytest.raises(CkptError, match="truncated"):
        gguf_to_hf(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_llama_cpp_unloadable_models_are_refused(tiny, family_dir, tmp_path):
    """qwen3 / gemma3 with an o_proj bias and gemma3 with llama.cpp-foreign settings would not
    run (or would run a different model) in llama.cpp: refused, naming the reason."""
    with pytest.raises(UnsupportedError, match="o_proj.bias.*no attn_output.bias"):
        hf_to_gguf(tiny("qwen3"), tmp_path / "q3.gguf")
    with pytest.raises(UnsupportedError, match="o_proj.bias.*no attn_output.bias"):
        hf_to_gguf(tiny("gemma3"), tmp_path / "g3.gguf")
    with pytest.raises(UnsupportedError, match=r"assumes global_every = \['sliding_attention', 'sliding_attention'\]"):
        hf_to_gguf(family_dir("gemma3_alternating"), tmp_path / "g3.gguf")   # [sliding, full]
    assert not list(tmp_path.iterdir())
    # gemma2: o_proj bias; no soft-capping value (llama.cpp would cap at its default 50 / 30);
    # a layer pattern other than llama.cpp's set_swa_pattern(2)
    with pytest.raises(UnsupportedError, match="o_proj.bias.*no attn_output.bias"):
        hf_to_gguf(tiny("gemma2"), tmp_path / "g2.gguf")
    for key, value, message in (("final_logit_softcapping", None, "config gives no final_logit_softcapping"),
                                ("attn_logit_softcapping", None, "config gives no attn_logit_softcapping"),
                                ("layer_types", ["full_attention"] * 2,
                                 r"assumes global_every = \['sliding_attention', 'full_attention'\]")):
        src = tmp_path / "src"
        shutil.copytree(family_dir("gemma2"), src)
        cfg = read_json(src / "config.json")
        cfg[key] = value
        (src / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UnsupportedError, match=message):
            hf_to_gguf(src, tmp_path / "g2.gguf")
        shutil.rmtree(src)
    assert not list(tmp_path.iterdir())


_FALCON_REFUSED = "{key} = {got} is not converted ({why}); only {key} = {want} is"


@pytest.mark.parametrize("base,edit,why", [
    ("falcon", None, "llama.cpp's falcon graph has no bias on attn_qkv, attn_output, ffn_up or ffn_down, so the file "
                     "would not load"),
    ("falcon_mq_nobias", {"parallel_attn": False}, "llama.cpp's falcon graph always runs attention and MLP in "
                                                   "parallel on the same input; it would run a different model"),
    ("falcon_nobias", {"alibi": True}, "llama.cpp's falcon graph applies RoPE, not ALiBi; it would run a different "
                                       "model"),
    ("falcon_nobias", {"activation": "relu"}, "llama.cpp's falcon graph hard-codes a GELU MLP; it would run a "
                                              "different model"),
])
def test_falcon_settings_llama_cpp_cannot_run_are_refused(base, edit, why, tiny, family_dir, tmp_path):
    """Falcon settings no GGUF key stores and llama.cpp's falcon graph runs one way only: refused
    by their config key, before the tensors they add (biases, post_attention_layernorm) are looked
    at.  ``falcon`` is the fixture itself (bias=True, real bias tensors)."""
    src = tiny(base) if edit is None else tmp_path / "src"
    if edit is not None:
        shutil.copytree(family_dir(base), src)
        cfg = read_json(src / "config.json")
        cfg.update(edit)
        (src / "config.json").write_text(json.dumps(cfg))
    key, value = next(iter((edit or {"bias": True}).items()))
    want = {"bias": False, "parallel_attn": True, "alibi": False, "activation": "gelu"}[key]
    with pytest.raises(UnsupportedError) as e:
        hf_to_gguf(src, tmp_path / "f.gguf")
    assert str(e.value) == f"{src / 'config.json'}: " + _FALCON_REFUSED.format(key=key, got=repr(value), why=why,
                                                                              want=repr(want))
    assert not (tmp_path / "f.gguf").exists()


# Phi-3.5-MoE-instruct's own rope_scaling (config.json as published: 64 factors each, here 8 for
# head_dim 16; long_mscale / short_mscale multiply cos and sin in modeling_phimoe)
_PHIMOE_LONGROPE = {"type": "longrope", "long_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                    "short_factor": [1.0] * 8, "long_mscale": 1.243163121016122, "short_mscale": 1.243163121016122,
                    "original_max_position_embeddings": 64}


@pytest.mark.parametrize("edit,message", [
    ({"attention_bias": False}, "attention_bias = False is not converted (llama.cpp's phimoe graph requires "
                                "attn_q/k/v/output biases, so the file would not load); only attention_bias = True is"),
    ({"lm_head_bias": False}, "lm_head_bias = False is not converted (llama.cpp's phimoe graph requires an "
                              "output.bias tensor, so the file would not load); only lm_head_bias = True is"),
    ({"lm_head_bias": None}, "lm_head_bias = False is not converted (llama.cpp's phimoe graph requires an "
                             "output.bias tensor, so the file would not load); only lm_head_bias = True is"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings = True is not converted (llama.cpp's phimoe graph requires "
                                    "its own output.weight, so the file would not load); only "
                                    "tie_word_embeddings = False is"),
    ({"num_experts_per_tok": 1}, "num_experts_per_tok = 1 is not converted (modeling_phimoe's sparsemixer always "
                                 "routes to 2 experts, llama.cpp to num_experts_per_tok); only num_experts_per_tok = 2 "
                                 "is"),
    # as config.json spells it, but with short_mscale = long_mscale: llama.cpp applies its converter's
    # formula instead (Phi-3.5-MoE as published converts: test_published_longrope_configs_convert)
    ({"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": _PHIMOE_LONGROPE},
     "longrope short_mscale gives attention factor 1.24316, but llama.cpp applies sqrt(1 + ln(256 / 64) / ln(64)) "
     "= 1.1547 (rope.scaling.attn_factor, from max_position_embeddings / original_max_position_embeddings as its "
     "converter computes it): it would run a different model"),
])
def test_phimoe_settings_llama_cpp_cannot_run_are_refused(edit, message, family_dir, tmp_path):
    """Phi-3.5-MoE configs llama.cpp's phimoe graph cannot load or would run differently are
    refused in one line naming the config key (``None``: the key absent, read as the model class
    reads it); nothing is written, the input is untouched."""
    src = tmp_path / "src"
    shutil.copytree(family_dir("phimoe"), src)
    cfg = read_json(src / "config.json")
    cfg.update({k: v for k, v in edit.items() if v is not None})
    for k in [k for k, v in edit.items() if v is None]:
        cfg.pop(k)
    (src / "config.json").write_text(json.dumps(cfg))
    before = _files_hash(src)
    with pytest.raises(UnsupportedError) as e:
        hf_to_gguf(src, tmp_path / "p.gguf")
    assert str(e.value) == f"{src / 'config.json'}: {message}"
    assert not (tmp_path / "p.gguf").exists() and _files_hash(src) == before


def test_unsupported_architecture_and_dtype(tiny, gguf_of, tmp_path):
    with pytest.raises(UnsupportedError, match="model_type 'bert' has no GGUF mapping"):
        hf_to_gguf(tiny("bert"), tmp_path / "b.gguf")
    with pytest.raises(UnsupportedError, match="cannot be written to an HF folder"):
        gguf_to_hf(gguf_of("qwen2", "f32"), tmp_path / "o", dtype="q8_0")
    with pytest.raises(UnsupportedError, match="cannot be written to a GGUF file"):
        hf_to_gguf(tiny("qwen2"), tmp_path / "o.gguf", dtype="int4")
    assert not list(tmp_path.iterdir())


def test_outputs_need_force_and_inputs_stay_untouched(family_dir, gguf_of, tmp_path):
    src = family_dir("llama")
    before = _files_hash(src)
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f16")
    g_bytes = g.read_bytes()
    with pytest.raises(OutputExistsError):
        hf_to_gguf(src, g, dtype="q8_0")
    assert g.read_bytes() == g_bytes
    hf_to_gguf(src, g, dtype="q8_0", force=True)
    assert g.read_bytes() != g_bytes
    out = gguf_to_hf(g, tmp_path / "hf")
    with pytest.raises(OutputExistsError):
        gguf_to_hf(g, out)
    gguf_to_hf(g, out, dtype="bfloat16", force=True)
    assert read_json(out / "config.json")["dtype"] == "bfloat16"
    with pytest.raises(RefusedError, match="would overwrite the input"):
        hf_to_gguf(out, out / "model.safetensors", force=True)
    assert _files_hash(src) == before
    assert not _leftovers(tmp_path)


def test_output_onto_input_is_refused(gguf_of, tmp_path):
    g = shutil.copy(gguf_of("qwen2", "f32"), tmp_path / "m.gguf")
    data = Path(g).read_bytes()
    with pytest.raises(CkptError):
        gguf_to_hf(g, g, force=True)
    assert Path(g).read_bytes() == data


def test_hf_to_gguf_memory_does_not_grow_with_the_model(tiny, tmp_path):
    """Streaming: the peak traced allocation of a conversion is the same for a 2-layer and a
    6-layer model of the same width (it is set by the largest tensor, 4 MiB, and the GGUF
    reader's first header read, not by the model) and far below the bigger model's size."""
    import tracemalloc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from convert_variants import copy_tokenizer
    peaks, totals = [], []
    for layers in (2, 6):
        cfg = AutoConfig.from_pretrained(tiny("llama"))
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 512, 2048, layers
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 8, 4, 64
        torch.manual_seed(0)
        src = tmp_path / f"m{layers}"
        AutoModelForCausalLM.from_config(cfg).save_pretrained(src)
        copy_tokenizer(tiny("llama"), src)
        totals.append(sum(p.stat().st_size for p in src.glob("*.safetensors")))
        hf_to_gguf(src, tmp_path / f"warm{layers}.gguf", dtype="f16")   # imports and caches outside the trace
        tracemalloc.start()
        hf_to_gguf(src, tmp_path / f"m{layers}.gguf", dtype="f32")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert totals[1] > 2.5 * totals[0] and totals[1] > 90e6
    assert peaks[1] <= peaks[0] + 2**20, (peaks, totals)     # 1 MiB slack for per-tensor bookkeeping
    assert peaks[1] < totals[1] / 4, (peaks, totals)


# --- CLI -----------------------------------------------------------------------------------

def test_cli_both_directions(gguf_of, family_dir, tmp_path):
    from click.testing import CliRunner

    from ckpt_surgeon.cli import cli
    runner = CliRunner()
    res = runner.invoke(cli, ["convert", str(gguf_of("llama_bias", "q8_0")), "-o", str(tmp_path / "hf"),
                              "--dtype", "bf16", "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["direction"] == "gguf->hf" and rep["dtype"] == "bfloat16" and rep["arch"] == "llama"
    assert {t["transform"] for t in rep["tensors"]} == {"none", "perm_q", "perm_k"}
    q = next(t for t in rep["tensors"] if t["source"] == "blk.0.attn_q.weight")
    assert q == {"source": "blk.0.attn_q.weight", "target": "model.layers.0.self_attn.q_proj.weight",
                 "transform": "perm_q", "source_dtype": "Q8_0", "target_dtype": "BF16", "shape": [64, 64]}
    res = runner.invoke(cli, ["convert", str(family_dir("gpt2")), "-o", str(tmp_path / "g.gguf"), "--dtype", "q8_0"])
    assert res.exit_code == 0, res.output
    assert "hf->gguf" in res.stdout and "hf->gguf" not in res.stderr      # the summary is stdout's (issue 24)
    res = runner.invoke(cli, ["convert", str(family_dir("gpt2")), "-o", str(tmp_path / "g.gguf")])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [f"error: {tmp_path / 'g.gguf'}: already exists (pass --force to replace it)"]


def test_cli_exit_code_in_a_real_process(tiny, tmp_path):
    """A refusal in a real process: exit code 2, one line on stderr, nothing on stdout or at OUT.  The native
    registry has no bert; the default engine hands it to llama.cpp's own BertModel class, which stops on a
    classifier pooling it does not write (``classifier_pooling: late``, EuroBERT's config default, added to the
    tiny BERT's config): both are one line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(tiny("bert")), "-o",
                        str(tmp_path / "b.gguf"), "--engine", "native"], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tiny('bert') / 'config.json'}: model_type 'bert' has no GGUF mapping here "
        f"(supported: {', '.join(N.supported_model_types())})"]
    assert r.stdout == ""
    src = tmp_path / "bert"
    src.mkdir()
    shutil.copytree(tiny("bert"), src, dirs_exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "classifier_pooling": "late"}))
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(tmp_path / "b.gguf")],
                       capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
    assert lines[0] == f"error: {src}: llama.cpp's converter stopped: NotImplementedError: Unsupported " \
                       "classifier_pooling: late", lines
    assert not (tmp_path / "b.gguf").exists()


def test_entry_points_stay_functions_after_importing_every_submodule():
    """No submodule shares a name with a function, so importing them never rebinds the API."""
    import importlib
    import inspect
    import pkgutil

    import ckpt_surgeon
    import ckpt_surgeon.conversion as conv
    for m in pkgutil.iter_modules(conv.__path__):
        importlib.import_module(f"ckpt_surgeon.conversion.{m.name}")
    for fn in (ckpt_surgeon.convert, ckpt_surgeon.gguf_to_hf, ckpt_surgeon.hf_to_gguf, conv.convert, conv.gguf_to_hf,
               conv.hf_to_gguf, ckpt_surgeon.verify):
        assert inspect.isfunction(fn), fn


def test_write_failure_while_model_check_runs_is_one_line(smollm_gguf, tmp_path):
    """A write error (RLIMIT_FSIZE: 'disk full' as root) while the model-check child is still
    importing transformers: the child is ended without racing the check thread for its pipes,
    the CLI prints one line, exit 2, and nothing is left behind."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))   # the first 4 MB shard write fails

    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(smollm_gguf), "-o", str(out)],
                       capture_output=True, text=True, preexec_fn=limit, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "File too large" in lines[0], p.stderr
    assert not out.exists() and not _leftovers(tmp_path)


def test_gguf_source_needs_a_folder_output_and_a_gguf_folder_converts(smollm_gguf, tmp_path):
    from ckpt_surgeon.cli import cli
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, ["convert", str(smollm_gguf), "-o", str(tmp_path / "x.gguf")])
    assert res.exit_code == 2 and "output is an HF folder" in res.stderr and not (tmp_path / "x.gguf").exists()
    folder = tmp_path / "g"
    folder.mkdir()
    os.symlink(smollm_gguf, folder / Path(smollm_gguf).name)
    res = CliRunner().invoke(cli, ["convert", str(folder), "-o", str(tmp_path / "hf"), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["direction"] == "gguf->hf"
    (folder / "other.gguf").write_bytes(Path(smollm_gguf).read_bytes()[:4096])
    res = CliRunner().invoke(cli, ["convert", str(folder), "-o", str(tmp_path / "hf2")])
    assert res.exit_code == 2 and "folder holds 2 GGUF models" in res.stderr


def test_phimoe_gguf_with_another_expert_count_is_refused(family_dir, tmp_path):
    """GGUF -> HF: a phimoe file routing to 1 expert (phimoe.expert_used_count) cannot become a
    transformers Phimoe model, whose sparsemixer always routes to 2: one line, nothing written."""
    from gguf_util import rewrite_gguf
    g = hf_to_gguf(family_dir("phimoe"), tmp_path / "m.gguf", dtype="f32", name="tiny")
    bad = rewrite_gguf(g, tmp_path / "bad.gguf", set_kv={"phimoe.expert_used_count": 1})
    with pytest.raises(UnsupportedError) as e:
        gguf_to_hf(bad, tmp_path / "hf")
    assert str(e.value) == (f"{bad}: num_experts_per_tok = 1 in this file is not converted (modeling_phimoe's "
                            "sparsemixer always routes to 2 experts, llama.cpp to num_experts_per_tok); only "
                            "num_experts_per_tok = 2 is")
    assert not (tmp_path / "hf").exists()


def test_a_family_llama_cpp_runs_differently_is_warned_both_ways(family_dir, tmp_path):
    """Phi-3.5-MoE: the GGUF is llama.cpp's own file, but llama.cpp's phimoe graph is not
    transformers' (tests/test_llamacpp.py measures it), so both directions say so in the report;
    a family llama.cpp runs as transformers does gets no such warning."""
    from ckpt_surgeon.conversion import hf_to_gguf_report
    to = hf_to_gguf_report(family_dir("phimoe"), tmp_path / "p.gguf", dtype="f32")
    back = gguf_to_hf_report(tmp_path / "p.gguf", tmp_path / "hf")
    for rep in (to, back):
        assert [w for w in rep.warnings if "phi3 graph" in w and "not transformers'" in w], rep.warnings
    plain = hf_to_gguf_report(family_dir("qwen2"), tmp_path / "q.gguf", dtype="f32")
    assert not [w for w in plain.warnings if "graph" in w], plain.warnings


# Published long-context configs, spelled as their config.json files spell them (8 factors here for
# head_dim 16; the published ones have 48 / 64; 131072 positions over an original 4096): Phi-3.5-mini
# and Phi-4-mini ("longrope", the original context at the top level), Phi-3-mini-128k's first
# release ("su"; transformers 5.24 reads it only with the original context inside rope_scaling),
# Phi-3.5-MoE (short_mscale = sqrt(1 + ln 32 / ln 4096) = 1.1902, long_mscale 1.2432) with the
# original context inside rope_scaling (PhimoeConfig does not read the top-level key: see below).
_FACTORS = {"long_factor": [1.0, 1.2, 1.9, 3.1, 5.0, 8.3, 12.7, 20.5], "short_factor": [1.0, 1.0, 1.1, 1.1, 1.2, 1.3, 1.4, 1.5]}
_MOE_MSCALES = {"short_mscale": 1.1902380714238083, "long_mscale": 1.243163121016122}
_PUBLISHED_LONGROPE = {
    "phi3.5-mini": ("phi3", {"type": "longrope", **_FACTORS}),
    "phi3-su": ("phi3", {"type": "su", **_FACTORS, "original_max_position_embeddings": 4096}),
    "phi3.5-moe": ("phimoe", {"type": "longrope", **_FACTORS, **_MOE_MSCALES, "original_max_position_embeddings": 4096}),
}


def _published_longrope(family_dir, tmp_path, family: str, scaling: dict) -> Path:
    src = tmp_path / "src"
    shutil.copytree(family_dir(family), src)
    cfg = read_json(src / "config.json")
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=10000.0, rope_scaling=scaling, max_position_embeddings=131072,
               original_max_position_embeddings=4096)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


@pytest.mark.parametrize("name", sorted(_PUBLISHED_LONGROPE))
def test_published_longrope_configs_convert(name, family_dir, tmp_path):
    """The factor tensors and llama.cpp's attention factor are written, and the report says where
    llama.cpp runs differently (factors picked by n_ctx; Phi-3.5-MoE's long_mscale not applied).
    GGUF -> HF writes the factors back and the attention factor llama.cpp applies."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf_report
    family, scaling = _PUBLISHED_LONGROPE[name]
    src = _published_longrope(family_dir, tmp_path, family, scaling)
    rep = hf_to_gguf_report(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    assert [w for w in rep.warnings if "run llama.cpp with n_ctx <= 4096 for the short factors" in w], rep.warnings
    assert bool([w for w in rep.warnings if "long_mscale = 1.24316 past 4096 tokens" in w]) == (family == "phimoe")
    with open_checkpoint(rep.output) as ck:
        assert ck.metadata[f"{family}.rope.scaling.attn_factor"] == pytest.approx(1.1902380714238083, rel=1e-7)
        assert ck.metadata[f"{family}.rope.scaling.original_context_length"] == 4096
        for key in ("long", "short"):
            assert ck.read(f"rope_factors_{key}.weight").tolist() == pytest.approx(scaling[f"{key}_factor"], rel=1e-7)
    rp = read_json(gguf_to_hf(rep.output, tmp_path / "hf") / "config.json")["rope_parameters"]
    assert rp["rope_type"] == "longrope" and rp["original_max_position_embeddings"] == 4096
    assert rp["long_factor"] == pytest.approx(scaling["long_factor"], rel=1e-7)
    if family == "phimoe":      # llama.cpp applies the short factor at every length
        assert rp["short_mscale"] == rp["long_mscale"] == 1.1902380714238083
    else:
        assert "attention_factor" not in rp      # transformers' formula gives llama.cpp's value


def test_phimoe_published_config_is_refused_with_the_fix(family_dir, tmp_path):
    """Phi-3.5-MoE's config.json gives original_max_position_embeddings (4096) at the top level
    only; transformers 5.24's PhimoeConfig does not read it there and takes 131072, and so does
    llama.cpp's converter, which reads the config through transformers: it would write attention
    factor 1 where transformers applies short_mscale 1.19.  Refused, naming the fix."""
    scaling = {"type": "longrope", **_FACTORS, **_MOE_MSCALES}
    src = _published_longrope(family_dir, tmp_path, "phimoe", scaling)
    with pytest.raises(UnsupportedError) as e:
        hf_to_gguf(src, tmp_path / "m.gguf")
    assert str(e.value) == (f"{src / 'config.json'}: longrope short_mscale gives attention factor 1.19024, but "
                            "llama.cpp applies 1 (rope.scaling.attn_factor, from max_position_embeddings / "
                            "original_max_position_embeddings as its converter computes it): it would run a different "
                            "model (transformers reads original_max_position_embeddings as 131072, not config.json's "
                            "top-level 4096, which this config class does not read: if 4096 is meant, give it inside "
                            "rope_scaling)")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("family, edit, message", [
    ("phi3_longrope", {"drop_tensor": "rope_factors_short.weight"},
     "tensor 'rope_factors_short.weight': absent beside rope_factors_long.weight: llama.cpp needs both longrope "
     "factor tensors"),
    ("phi3_longrope", {"tensor": ("rope_factors_long.weight", lambda d: d[:4])},
     "tensor 'rope_factors_long.weight': 4 values (want 8, each finite and > 0) are not longrope factors"),
    ("phi3_longrope", {"tensor": ("rope_factors_short.weight", lambda d: d * 0)},
     "tensor 'rope_factors_short.weight': 8 values (want 8, each finite and > 0) are not longrope factors"),
    ("phi3_longrope", {"drop": "phi3.rope.scaling.original_context_length"},
     "tensor 'rope_factors_long.weight': longrope factors without rope.scaling.original_context_length"),
    ("qwen2", {"set": ("qwen2.rope.scaling.attn_factor", 1.25)},
     "qwen2.rope.scaling.attn_factor = 1.25 is not converted (llama.cpp multiplies cos and sin by it"),
])
def test_gguf_rope_factors_that_cannot_convert_are_refused(family, edit, message, gguf_of, tmp_path):
    """GGUF -> HF: longrope tensors that are not a pair of positive factor lists of the rotary
    width, without the original context, or an attention factor with nothing to carry it into
    transformers' config: one line naming the file (and tensor), nothing written."""
    import gguf
    from gguf_util import rewrite_gguf
    src = gguf_of(family)
    kwargs = {}
    if "drop_tensor" in edit:
        kwargs["tensors"] = lambda n, d: None if n == edit["drop_tensor"] else d
    if "tensor" in edit:
        name, fn = edit["tensor"]
        kwargs["tensors"] = lambda n, d: fn(d) if n == name else d
    if "drop" in edit:
        kwargs["drop"] = (edit["drop"],)
    if "set" in edit:
        kwargs["set_kv"] = {edit["set"][0]: (edit["set"][1], gguf.GGUFValueType.FLOAT32)}
    bad = rewrite_gguf(src, tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(CkptError) as e:
        gguf_to_hf(bad, tmp_path / "hf")
    assert str(e.value).startswith(f"{bad}: {message}"), str(e.value)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("family", ["phi3_longrope", "phimoe_longrope"])
@pytest.mark.parametrize("edit, message", [
    # (transformers' own config validation may say it first, in its words, naming the key)
    ({"long_factor": [1.0] * 7}, "long_factor"),
    ({"short_factor": None}, "rope_parameters.short_factor is None; a longrope RoPE needs a list of factors, one per "
                             "rotary pair"),
    ({"short_factor": [1.0] * 7 + ["x"]}, "rope_parameters.short_factor[7] is 'x' (a string); it must be a finite "
                                          "positive number"),
    ({"long_factor": [1.0] * 7 + [0.0]}, "rope_parameters.long_factor[7] is 0; it must be a finite positive number"),
    ({"attention_factor": 1.5, "short_mscale": 1.5}, " gives attention factor 1.5, but llama.cpp applies "
                                                     "sqrt(1 + ln(16384 / 512) / ln(512)) = 1.24722"),
])
def test_longrope_configs_llama_cpp_cannot_run_are_refused(edit, message, family, family_dir, tmp_path):
    """Factors that are not one positive number per rotary pair, or an attention factor llama.cpp
    would not apply (Phi-3: attention_factor; Phi-3.5-MoE: short_mscale): one line naming
    config.json and the key, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(family_dir(family), src)
    cfg = read_json(src / "config.json")
    cfg["rope_parameters"].update(edit)
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CkptError) as e:
        hf_to_gguf(src, tmp_path / "r.gguf")
    assert str(e.value).startswith(f"{src / 'config.json'}: ") and message in str(e.value), str(e.value)
    assert not (tmp_path / "r.gguf").exists()


@pytest.mark.parametrize("family", ["qwen2", "deepseek_v2", "llama"])
@pytest.mark.parametrize("key", ["rope_parameters.rope_type", "rope_scaling.type", "rope_scaling.rope_type"])
def test_scaled_rope_is_refused_by_its_config_key(family, key, family_dir, tmp_path):
    """A scaled RoPE the family does not convert (here dynamic NTK) is refused naming the key the config spells it with and the types it does convert, before
    anything is written."""
    src = tmp_path / "src"
    shutil.copytree(family_dir(family), src)
    cfg = read_json(src / "config.json")
    outer, inner = key.split(".")
    cfg[outer] = dict(cfg.get(outer) or {}, **{inner: "dynamic", "factor": 4.0, "original_max_position_embeddings": 64})
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError) as e:
        hf_to_gguf(src, tmp_path / "r.gguf")
    only = {"llama": "rope_type 'default' or 'llama3' or 'linear' or 'yarn'",
            "qwen2": "rope_type 'default' or 'linear' or 'yarn'", "deepseek_v2": "rope_type 'default' or 'yarn'"}[family]
    assert str(e.value) == f"{src / 'config.json'}: {key} = 'dynamic' is not converted (only {only})"
    assert not (tmp_path / "r.gguf").exists()


def _refused_gguf_to_hf(g: Path, tmp_path: Path, name: str, **rewrite) -> tuple[Path, str]:
    """``g`` rewritten by gguf_util.rewrite_gguf(``rewrite``) into ``name``: GGUF -> HF refuses it
    with an UnsupportedError and writes nothing; returns (the file, the message)."""
    from gguf_util import rewrite_gguf
    bad = rewrite_gguf(g, tmp_path / name, **rewrite)
    with pytest.raises(UnsupportedError) as e:
        gguf_to_hf(bad, tmp_path / "refused-hf")
    assert not (tmp_path / "refused-hf").exists()
    return bad, str(e.value)


def test_gemma3_published_rope_scaling_converts_and_other_scalings_are_refused(family_dir, gguf_of, tmp_path):
    """Gemma 3 4B / 12B / 27B's config.json spells `rope_scaling: {rope_type: linear, factor: 8}`,
    which transformers applies to the full-attention layers only, as llama.cpp applies
    rope.scaling.factor; it converts both ways.  Scaling the sliding layers (llama.cpp keeps them at
    scale 1) or another type is refused by the key that says it, and GGUF -> HF refuses a scaling
    type the architecture does not convert."""
    import gguf

    from ckpt_surgeon.checkpoint import open_checkpoint
    src = tmp_path / "src"
    shutil.copytree(family_dir("gemma3"), src)
    cfg = read_json(src / "config.json")
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    (src / "config.json").write_text(json.dumps(cfg))
    g = hf_to_gguf(src, tmp_path / "g.gguf", dtype="f32", name="tiny")
    with open_checkpoint(g) as ck:
        assert ck.metadata["gemma3.rope.scaling.type"] == "linear" and ck.metadata["gemma3.rope.scaling.factor"] == 8.0
    rp = read_json(gguf_to_hf(g, tmp_path / "hf") / "config.json")["rope_parameters"]
    assert rp == {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    for layer, rope, only in (("sliding_attention", {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                               "plain RoPE: rope_type 'default'"),
                              ("full_attention", {"rope_type": "yarn", "factor": 8.0, "rope_theta": 1000000.0,
                                                  "original_max_position_embeddings": 64},
                               "rope_type 'default' or 'linear'")):
        bad = tmp_path / f"bad-{layer}"
        shutil.copytree(family_dir("gemma3_linear"), bad)
        cfg = read_json(bad / "config.json")
        cfg["rope_parameters"][layer] = rope
        (bad / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UnsupportedError) as e:
            hf_to_gguf(bad, tmp_path / "r.gguf")
        assert str(e.value) == (f"{bad / 'config.json'}: rope_parameters.{layer}.rope_type = {rope['rope_type']!r} "
                                f"is not converted (only {only})")
        assert not (tmp_path / "r.gguf").exists()
    for family, arch, stype, only in (("gemma3_linear", "gemma3", "yarn", "'none' or 'linear'"),
                                      ("gemma2", "gemma2", "linear", "'none'")):
        bad, message = _refused_gguf_to_hf(gguf_of(family), tmp_path, f"{family}.gguf",
                                           set_kv={f"{arch}.rope.scaling.type": (stype, gguf.GGUFValueType.STRING)})
        assert message == f"{bad}: {arch}.rope.scaling.type = {stype!r} is not converted for this architecture (only {only})"


def test_remote_code_model_without_a_mapping_is_refused_by_its_model_type(family_dir, tmp_path):
    """A folder whose model_type needs remote code (auto_map) and has no registry row is refused
    before transformers is asked (it would ask to run that code), naming the model_type."""
    src = tmp_path / "src"
    shutil.copytree(family_dir("qwen2"), src)
    cfg = read_json(src / "config.json")
    cfg.update(model_type="baichuan", auto_map={"AutoConfig": "configuration_baichuan.BaichuanConfig"})
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="model_type 'baichuan' needs remote code \\(auto_map\\) and has no "
                                               "GGUF mapping here"):
        hf_to_gguf(src, tmp_path / "b.gguf")
    assert not (tmp_path / "b.gguf").exists()


def test_q8_0_fallback_is_one_warning_per_hf_tensor(family_dir, tmp_path):
    """A Split row's parts (DeepSeek-V2's kv_b_proj -> attn_k_b, attn_v_b: rows of 16, not whole
    Q8_0 blocks) fall back to F16 with one warning for their one HF tensor, naming the parts."""
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf_report
    rep = hf_to_gguf_report(family_dir("deepseek_v2"), tmp_path / "q.gguf", dtype="q8_0", name="tiny")
    kv_b = [w for w in rep.warnings if "kv_b_proj" in w]
    assert kv_b == [f"model.layers.{i}.self_attn.kv_b_proj.weight: row size 16 of blk.{i}.attn_k_b.weight, "
                    f"blk.{i}.attn_v_b.weight is not a multiple of 32; stored F16 instead of Q8_0" for i in (0, 1)]
    assert len(rep.warnings) == len(set(rep.warnings))


def test_llama3_rope_parameters_come_back_from_rope_freqs(family_dir, tmp_path):
    """Llama 3's rope scaling is a tensor in GGUF (rope_freqs.weight, as llama.cpp's converter
    writes it: tests/test_llamacpp_converter.py holds the bytes to the reference); GGUF -> HF
    recovers the four parameters from it, so config.json says what the source said."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    src = family_dir("llama3_rope")
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    with open_checkpoint(g) as ck:
        assert ck.tensors["rope_freqs.weight"].shape == (8,)    # head_dim 16: 8 rotary frequencies
        assert not any(k.startswith("llama.rope.scaling") for k in ck.metadata)   # as the reference: a tensor only
    back = gguf_to_hf(g, tmp_path / "back")
    assert read_json(back / "config.json")["rope_parameters"] == read_json(src / "config.json")["rope_parameters"]


@pytest.mark.parametrize("edit, message", [
    (lambda f: np.where(f > 1, 8.0, 1.0), "only 0 of 8 rotary dimensions are interpolated"),
    (lambda f: f[:4], "4 values (want 8, each finite and >= 1) are not Llama 3 rope factors"),
    (lambda f: f * np.float32(0.5), "are not Llama 3 rope factors"),
    (lambda f: np.where(np.arange(8) == 5, f * np.float32(1.1), f), "no Llama 3 rope parameters reproduce these factors"),
])
def test_rope_freqs_that_are_not_llama3_are_refused(edit, message):
    from ckpt_surgeon.conversion.rope_llama3 import llama3_params_from_factors, llama3_rope_factors
    rp = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 16.0,
          "original_max_position_embeddings": 4096}
    f = llama3_rope_factors(10000.0, 16, rp)
    assert llama3_params_from_factors(f, 10000.0, 16) == rp
    with pytest.raises(UnsupportedError, match=re.escape(message)) as e:
        llama3_params_from_factors(edit(f), 10000.0, 16, path="m.gguf")
    assert e.value.tensor == "rope_freqs.weight"


@pytest.mark.parametrize("edit, message", [
    ({"mscale": 1.0}, "rope_parameters.mscale = 1.0 with mscale_all_dim = 0.707 is not converted (llama.cpp's "
                      "deepseek2 takes mscale_all_dim for both, so cos and sin would be scaled differently)"),
    ({"mscale": None}, "rope_parameters.mscale = None with mscale_all_dim = 0.707 is not converted"),
    ({"mscale_all_dim": None}, "a yarn RoPE without rope_parameters.mscale_all_dim is not converted (llama.cpp's "
                               "deepseek2 would scale attention by (1 + 0.1 ln factor)^2 where transformers does not)"),
    ({"attention_factor": 1.0}, "rope_parameters.attention_factor = 1.0 is not converted (llama.cpp's deepseek2 "
                                "ignores yarn_attn_factor and derives the factor from mscale_all_dim)"),
])
def test_deepseek_yarn_llama_cpp_would_run_differently_is_refused(edit, message, family_dir, tmp_path):
    """DeepSeek's yarn converts with mscale == mscale_all_dim (as released) and no attention_factor:
    llama.cpp's deepseek2 then scales exactly as transformers (tests/test_llamacpp.py); any other
    combination is refused in one line, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(family_dir("deepseek_v2_yarn"), src)
    cfg = read_json(src / "config.json")
    for k, v in edit.items():
        if v is None:
            cfg["rope_parameters"].pop(k)
        else:
            cfg["rope_parameters"][k] = v
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError) as e:
        hf_to_gguf(src, tmp_path / "d.gguf")
    assert str(e.value).startswith(f"{src / 'config.json'}: {message}"), str(e.value)
    assert not (tmp_path / "d.gguf").exists()


def test_deepseek_yarn_metadata_both_ways(family_dir, gguf_of, tmp_path):
    """HF -> GGUF writes mscale_all_dim as llama.cpp's yarn_log_multiplier (0.1 x, as its converter:
    tests/test_llamacpp_converter.py holds the bytes); GGUF -> HF gives back mscale = mscale_all_dim
    = 0.707 as configs spell it.  A deepseek2 yarn file without the multiplier, or with a
    yarn_attn_factor llama.cpp's deepseek2 ignores, is refused."""
    import gguf

    from ckpt_surgeon.checkpoint import open_checkpoint
    g = gguf_of("deepseek_v2_yarn")
    with open_checkpoint(g) as ck:
        assert ck.metadata["deepseek2.rope.scaling.yarn_log_multiplier"] == pytest.approx(0.0707, rel=1e-7)
        assert ck.metadata["deepseek2.rope.scaling.type"] == "yarn"
    rp = read_json(gguf_to_hf(g, tmp_path / "hf") / "config.json")["rope_parameters"]
    assert rp == dict(read_json(family_dir("deepseek_v2_yarn") / "config.json")["rope_parameters"])
    for kwargs, message in (
            ({"drop": ("deepseek2.rope.scaling.yarn_log_multiplier",)},
             "a yarn file without deepseek2.rope.scaling.yarn_log_multiplier is not converted"),
            ({"set_kv": {"deepseek2.rope.scaling.yarn_attn_factor": (1.0, gguf.GGUFValueType.FLOAT32)}},
             "deepseek2.rope.scaling.yarn_attn_factor is not converted")):
        bad, got = _refused_gguf_to_hf(g, tmp_path, "bad.gguf", **kwargs)
        assert got.startswith(f"{bad}: {message}"), got
        bad.unlink()


def test_yarn_values_llama_cpp_runs_convert_both_ways_and_others_are_refused(family_dir, gguf_of, tmp_path):
    """beta_fast 32, beta_slow 1 and attention_factor 0.1 ln(factor) + 1 are what llama.cpp runs:
    written as its converter writes them and read back; a file saying otherwise is refused GGUF -> HF
    (llama.cpp would run 32 / 1 / the default, transformers the file's value)."""
    import gguf
    src = tmp_path / "src"
    shutil.copytree(family_dir("qwen2_yarn"), src)
    cfg = read_json(src / "config.json")
    cfg["rope_parameters"].update(beta_fast=32.0, beta_slow=1.0, attention_factor=0.1 * math.log(4.0) + 1.0)
    (src / "config.json").write_text(json.dumps(cfg))
    g = hf_to_gguf(src, tmp_path / "y.gguf", dtype="f32", name="tiny")
    rp = read_json(gguf_to_hf(g, tmp_path / "hf") / "config.json")["rope_parameters"]
    assert rp["beta_fast"] == 32.0 and rp["beta_slow"] == 1.0
    assert rp["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-7)
    for key, value, want in (("yarn_beta_fast", 16.0, "runs 32"), ("yarn_beta_slow", 2.0, "runs 1"),
                             ("yarn_attn_factor", 1.5, "applies 0.1 ln(factor) + 1 = 1.13863")):
        bad, message = _refused_gguf_to_hf(gguf_of("qwen2_yarn"), tmp_path, f"{key}.gguf",
                                           set_kv={f"qwen2.rope.scaling.{key}": (value, gguf.GGUFValueType.FLOAT32)})
        assert message == f"{bad}: qwen2.rope.scaling.{key} = {value!r} is not converted (llama.cpp's qwen2 does " \
                          f"not load it and {want})"


@pytest.mark.parametrize("extra", [{"mscale": 0.707}, {"mscale_all_dim": 1.0}, {"truncate": False},
                                   {"beta_fast": 16.0}, {"beta_slow": 2.0}, {"attention_factor": 1.5}])
def test_yarn_parameters_gguf_cannot_carry_are_refused(extra, family_dir, tmp_path):
    """yarn converts with factor, original_max_position_embeddings, and attention_factor, beta_fast
    and beta_slow at the values llama.cpp runs (its converter writes their keys, its qwen2 / llama /
    qwen3 load none of them: test_llama_cpp_ignores_the_yarn_keys); any other yarn parameter, or
    another value of those three, changes what transformers computes and not what llama.cpp does:
    refused naming it, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(family_dir("qwen2_yarn"), src)
    cfg = read_json(src / "config.json")
    cfg["rope_parameters"].update(extra)
    (src / "config.json").write_text(json.dumps(cfg))
    key, value = next(iter(extra.items()))
    with pytest.raises(UnsupportedError, match=re.escape(f"rope_parameters.{key} = {value!r} is not converted")):
        hf_to_gguf(src, tmp_path / "y.gguf")
    assert not (tmp_path / "y.gguf").exists()


# --- stray config keys (issue 24) ----------------------------------------------------------------

# Every registry family HF -> GGUF converts -> the fixture or variant of it that converts as it is
# (InternLM2's own layout has no transformers class: tests/test_internlm2.py covers it).
STRAY_VARIANTS = {
    "qwen2": "qwen2", "llama": "llama", "mistral": "mistral", "qwen3": "qwen3", "gemma3": "gemma3",
    "gemma2": "gemma2", "olmo2": "olmo2", "starcoder2": "starcoder2", "phi3": "phi3", "phi": "phi", "gpt2": "gpt2",
    "gpt_neox": "gpt_neox", "bloom": "bloom", "falcon": "falcon_nobias", "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe", "olmoe": "olmoe", "deepseek_v2": "deepseek_v2", "mixtral": "mixtral",
    "phimoe": "phimoe", "granite": "granite", "cohere": "cohere", "stablelm": "stablelm", "internlm2_hf": None,
}


def test_every_converted_family_has_a_stray_key_variant():
    from ckpt_surgeon.arch import families as F
    converted = {f.name for f in F.FAMILIES if f.conversion is not None and f.conversion.hf_to_gguf}
    assert converted == set(STRAY_VARIANTS)


def _strays_split(fam_name: str, folder: Path) -> tuple[dict, dict]:
    """(keys the model class does not read, keys it reads) among :data:`STRAYS` absent from the
    folder's config.json: read are the keys its config class declares (fields and attribute_map
    aliases) and those transformers' modeling code asks for by name (names.UNDECLARED_READ) unless
    the registry says the class ignores them (hf_rename to None)."""
    import transformers

    from ckpt_surgeon.arch import families as F
    from ckpt_surgeon.conversion.model_check import declared_config_keys
    cfg = read_json(folder / "config.json")
    cls = type(transformers.AutoConfig.from_pretrained(folder))
    ignored_by_name = F.absent_config_keys(F.by_name(fam_name))
    # (a key the class defines as a property, FalconConfig's head_dim, is one transformers refuses to set)
    read = set(declared_config_keys(cls)) | (N.UNDECLARED_READ - ignored_by_name) | {k for k in STRAYS if hasattr(cls, k)}
    absent = {k: v for k, v in STRAYS.items() if k not in cfg}
    return ({k: v for k, v in absent.items() if k not in read}, {k: v for k, v in absent.items() if k in read})


def _with_config(src: Path, dst: Path, extra: dict) -> Path:
    shutil.copytree(src, dst)
    (dst / "config.json").write_text(json.dumps({**read_json(src / "config.json"), **extra}))
    return dst


def _logits(folder: Path):
    """transformers' logits on a fixed input, or the first line of why it cannot give them."""
    import torch
    import transformers
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4] * 4])
    step = "load"
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        step = "forward"
        with torch.no_grad():
            return model(ids).logits
    except Exception as e:  # noqa: BLE001 - a model transformers will not build or run from this config
        return f"{step}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


@pytest.mark.parametrize("family", [f for f, v in STRAY_VARIANTS.items() if v])
def test_stray_config_keys_the_class_ignores_change_nothing(family, family_dir, gguf_of, tmp_path):
    """issue 24: BLOOM with a num_key_value_heads key crashed HF -> GGUF with a traceback, GPT-NeoX with
    num_kv_heads too, and another family's spelling changed the file (rotary_pct / partial_rotary_factor
    halved the rotary width of llama-style families, rope_local_base_freq wrote a sliding-window theta,
    GPT-2 took intermediate_size for n_inner, Starcoder2 / Phi / Cohere another family's epsilon, Cohere
    logits_scaling for logit_scale, Qwen3-MoE / OLMoE / Mixtral the expert widths of other families).
    Every stray key of :data:`STRAYS` that the class does not read is put into config.json at once:
    transformers gives the same logits (the premise, asserted), and our GGUF is byte-identical."""
    import torch
    src = family_dir(STRAY_VARIANTS[family])
    ignored, _ = _strays_split(family, src)
    assert len(ignored) >= 30, sorted(ignored)
    noisy = _with_config(src, tmp_path / "noisy", ignored)
    ref, got = _logits(src), _logits(noisy)
    assert isinstance(got, torch.Tensor) and torch.equal(ref, got), got     # transformers ignores them
    b = hf_to_gguf(noisy, tmp_path / "b.gguf", dtype="f32", name="tiny")
    assert b.read_bytes() == gguf_of(STRAY_VARIANTS[family]).read_bytes(), sorted(ignored)


@pytest.mark.parametrize("family", [f for f, v in STRAY_VARIANTS.items() if v])
def test_stray_config_keys_the_class_reads_are_read_as_it_does(family, family_dir, gguf_of, tmp_path):
    """Each stray key the class does read (one of its fields or aliases, or head_dim, which modeling
    code asks for by name): where transformers cannot build or load the model from such a config,
    our conversion refuses with one CkptError (its one line on the CLI, exit 2) and writes nothing;
    where it runs another model, our file differs from the clean one (we read the key too).  GPT-NeoX
    reads head_dim only for its rotary width, checked against transformers' own below."""
    import torch
    src = family_dir(STRAY_VARIANTS[family])
    _, reads = _strays_split(family, src)
    ref = _logits(src)
    for key, value in reads.items():
        noisy = _with_config(src, tmp_path / key, {key: value})
        got = _logits(noisy)
        out = tmp_path / f"{key}.gguf"
        try:
            hf_to_gguf(noisy, out, dtype="f32", name="tiny")
        except CkptError as e:
            assert isinstance(got, str) or not torch.equal(ref, got), (key, str(e))
            assert "\n" not in str(e) and not out.exists(), key
            continue
        if key in N.UNDECLARED_READ - {"head_dim"}:
            # context lengths llama.cpp's converter reads (BLOOM's seq_length, Phi-3.5-MoE's
            # original_max_position_embeddings): metadata only, every tensor the same
            meta, ref_meta = (gguf_metadata(p)[0] for p in (out, gguf_of(STRAY_VARIANTS[family])))
            changed = {k for k in set(meta) | set(ref_meta) if meta.get(k) != ref_meta.get(k)}
            assert all(k.endswith("context_length") for k in changed), (key, changed)
            assert hf_tensor_bytes(out) == hf_tensor_bytes(gguf_of(STRAY_VARIANTS[family])), key
            continue
        if isinstance(got, str) and got.startswith("forward"):
            # transformers builds the model but cannot run it (StableLM with a head_dim that is not
            # hidden / heads: its rotary embedding reads head_dim, its attention does not): no model
            # to agree with; converting it did not crash (any other exception fails the test)
            continue
        same_file = out.read_bytes() == gguf_of(STRAY_VARIANTS[family]).read_bytes()
        assert isinstance(got, torch.Tensor), (key, got)          # transformers runs it: so do we
        assert same_file == torch.equal(ref, got), (key, same_file)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "bloom"])
def test_stray_kv_head_counts_leave_the_layout_of_mha_families_alone(family, family_dir, tmp_path):
    """inspect / lint / analyze read the layout from config.json without transformers: a GPT-NeoX
    config.json with num_kv_heads 1 was refused ("config says 4 heads + 2 x 1 kv heads x head_dim 16
    = 96 qkv rows") although its class has no kv head count and ignores the key; every spelling of
    one is now ignored for the MHA families (registry hf_rename to None), shapes checked."""
    from ckpt_surgeon.arch.families import CONFIG_KEYS
    from ckpt_surgeon.checkpoint import open_checkpoint
    src = family_dir(family)
    with open_checkpoint(src) as ck:
        want = ck.layout()
    for key in CONFIG_KEYS["num_kv_heads"]:
        noisy = _with_config(src, tmp_path / key, {key: 1})
        with open_checkpoint(noisy) as ck:
            got = ck.layout()
        assert (got.num_heads, got.num_kv_heads, got.head_dim) == (want.num_heads, want.num_kv_heads, want.head_dim)


def test_gpt_neox_head_dim_sets_the_rotary_width_as_transformers_does(family_dir, tmp_path):
    """GPTNeoXConfig has no head_dim field, but its rotary embedding asks for one by name
    (``getattr(config, "head_dim", None)``): a config.json with head_dim 8 (hidden / heads = 16)
    rotates int(8 * rotary_pct) dims; rope.dimension_count says the same."""
    import transformers
    noisy = _with_config(family_dir("gpt_neox"), tmp_path / "neox", {"head_dim": 8})
    model = transformers.AutoModelForCausalLM.from_pretrained(noisy)
    rotated = 2 * model.gpt_neox.rotary_emb.inv_freq.shape[0]
    meta, _ = gguf_metadata(hf_to_gguf(noisy, tmp_path / "n.gguf", dtype="f32"))
    assert int(meta["gptneox.rope.dimension_count"]) == rotated == 2


def test_bloom_with_num_key_value_heads_converts_and_any_escape_is_one_line(family_dir, tmp_path):
    """The report's exact case, through the CLI: exit 0 now; and an exception no handler expects
    is still one line and exit 2 (a defect, said so), never a traceback."""
    from click.testing import CliRunner

    from ckpt_surgeon.cli import cli
    src = tmp_path / "bloom"
    shutil.copytree(family_dir("bloom"), src)
    cfg = read_json(src / "config.json")
    (src / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 1}))
    res = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "b.gguf")])
    assert res.exit_code == 0, res.output
    import ckpt_surgeon.conversion as conv
    orig = conv.convert

    def boom(*a, **k):
        raise ValueError("per-head interleaved [h, 3, d] needs n_kv_heads == n_heads\nsecond line")
    conv.convert = boom
    try:
        res = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "c.gguf")])
    finally:
        conv.convert = orig
    assert res.exit_code == 2 and res.stderr == (
        "error: internal error (ValueError: per-head interleaved [h, 3, d] needs n_kv_heads == n_heads); this is a "
        "bug in ckpt-surgeon: rerun with --debug for the traceback and report it\n")


def test_gguf_floats_become_their_shortest_decimal_in_config(tiny, tmp_path):
    """Issue 36: a converted config.json held rms_norm_eps 9.999999747378752e-06, the float64
    widening of GGUF's float32 1e-05.  It now holds the shortest decimal giving the same float32,
    and converting back writes the same bits."""
    from ckpt_surgeon.formats.gguf import GGUFFile
    from gguf_util import write_gguf
    g = write_gguf(tiny("qwen2"), tmp_path / "q.gguf")
    out = gguf_to_hf(g, tmp_path / "hf")
    text = (out / "config.json").read_text()
    assert '"rms_norm_eps": 1e-06' in text, text
    assert not re.search(r"\d{12,}e-", text), text        # no float32 artifact anywhere in the config
    back = hf_to_gguf(out, tmp_path / "back.gguf", dtype="f32")
    key = "qwen2.attention.layer_norm_rms_epsilon"
    a, b = GGUFFile(str(g)), GGUFFile(str(back))
    assert np.float32(a.metadata[key]).tobytes() == np.float32(b.metadata[key]).tobytes()
