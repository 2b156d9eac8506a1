"""``inspect``'s memory section: KV cache for --context / --batch / --cache-type, sliding-window, MLA and
recurrent (hybrid) layers, per-device totals (--devices), each byte count checked by hand, the cache
types' sizes against ggml's own type traits, and the KV size against llama.cpp's own allocation."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.analysis.kv_layers import layer_plan
from ckpt_surgeon.analysis.memory import CACHE_TYPES, FP8_SCALE_BYTES, row_bytes
from ckpt_surgeon.cli import cli as main

LLAMA_TYPES = [t for t in CACHE_TYPES if t != "fp8"]


def _model(folder: Path, *, layers=3, heads=4, kv=2, head_dim=32, hidden=64, vocab=64, rng=None, **cfg) -> Path:
    """A Qwen2-style HF folder: config.json + model.safetensors (zeros, or random with ``rng``)."""
    from safetensors.numpy import save_file
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": head_dim, "max_position_embeddings": 2048,
              "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "torch_dtype": "float32", **cfg}
    (folder / "config.json").write_text(json.dumps(config))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32) if rng is not None \
            else np.zeros(shape, np.float32)
    t = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": np.ones(hidden, np.float32),
         "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for role, rows in (("q", heads * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
            t[p + f"self_attn.{role}_proj.weight"] = w(rows, hidden)
            t[p + f"self_attn.{role}_proj.bias"] = w(rows)
        t[p + "self_attn.o_proj.weight"] = w(hidden, heads * head_dim)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(2 * hidden, hidden), w(2 * hidden, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, 2 * hidden)
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    save_file(t, str(folder / "model.safetensors"))
    return folder


def _memory(folder, *args) -> dict:
    r = CliRunner().invoke(main, ["inspect", str(folder), "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["memory"]


# --- element sizes: ggml's own type traits ------------------------------------------------------

@pytest.mark.parametrize("t", LLAMA_TYPES)
def test_cache_type_bytes_are_ggml_type_traits(t):
    """Bytes of a 4,096-element row per cache type = gguf-py's GGML_QUANT_SIZES and libggml's traits."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from ckpt_surgeon.formats.quant import ggml_quant
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t.upper()]]
    traits = ggml_quant.lib().ggml_get_type_traits(ggml_quant.type_id(t.upper())).contents
    assert (traits.blck_size, traits.type_size) == (block, size)
    assert row_bytes(t, 4096) == 4096 // block * size


def test_fp8_is_one_byte_plus_a_scale_per_tensor(tmp_path):
    m = _memory(_model(tmp_path / "m"), "--context", "100", "--cache-type", "fp8")
    # 3 layers x 100 tokens x (2 kv heads x 32) bytes, + one 4-byte scale per layer's K (and V)
    assert m["kv_cache_bytes_k"] == m["kv_cache_bytes_v"] == 3 * (100 * 64 + FP8_SCALE_BYTES)
    assert m["kv_cache_type_k"] == "fp8"


# --- Qwen2 GQA: context x batch x cache type --------------------------------------------------

def test_gqa_context_batch_cache_type_by_hand(tmp_path):
    folder = _model(tmp_path / "m")
    d = _memory(folder)                       # defaults: today's figures, 1,000 tokens, f16 and q8_0
    elems = 3 * 2 * (2 * 32) * 1000
    assert d["kv_cache_tokens"] == 1000 and d["kv_cache_elements"] == elems
    assert d["kv_cache_bytes"] == {"f16": 2 * elems, "q8_0": elems // 32 * 34}
    assert d["kv_cache_note"] is None and d["devices"] == 1 and d["per_device"] is None
    m = _memory(folder, "--context", "4096", "--batch", "2", "--cache-type-k", "q4_0", "--cache-type-v", "q8_0")
    # per token and layer a row of 2 kv heads x 32 = 64 elements: q4_0 2 blocks x 18 bytes, q8_0 2 x 34
    assert m["kv_cache_bytes_k"] == 3 * 4096 * 2 * (2 * 18)
    assert m["kv_cache_bytes_v"] == 3 * 4096 * 2 * (2 * 34)
    assert m["kv_cache_elements"] == 3 * 4096 * 2 * 128 and m["kv_cache_layers"]["full"] == 3
    assert m["total_bytes"] == m["weight_bytes_total"] + m["kv_cache_bytes_k"] + m["kv_cache_bytes_v"]
    r = CliRunner().invoke(main, ["inspect", str(folder), "--context", "4096", "--cache-type", "q4_0"])
    assert "KV cache / 4,096 tokens" in r.output and "K q4_0" in r.output


def test_unknown_cache_type_is_one_line_exit_2(tmp_path):
    folder = _model(tmp_path / "m")
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", str(folder), "--cache-type", "q3_k"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not r.stdout
    assert "unknown KV-cache type 'q3_k'" in r.stderr and all(t in r.stderr for t in CACHE_TYPES)


def test_python_options_are_checked_alike():
    from ckpt_surgeon.analysis.memory import MemoryOptions
    from ckpt_surgeon.errors import CkptError
    assert MemoryOptions(type_k="FP8_E4M3", type_v="Q4_0").types == ("fp8", "q4_0")
    with pytest.raises(CkptError, match="known: f32, f16"):
        MemoryOptions(type_v="q2_k")
    with pytest.raises(CkptError, match="batch must be a positive integer"):
        MemoryOptions(batch=0)


def test_context_beyond_max_positions_is_a_note(tmp_path):
    m = _memory(_model(tmp_path / "m"), "--context", "5000")
    assert "context 5,000 is beyond the model's 2,048 positions" in m["kv_cache_note"]


def test_head_size_not_a_block_multiple_is_said(tmp_path):
    m = _memory(_model(tmp_path / "m", head_dim=16, hidden=64), "--cache-type", "q8_0")
    assert "llama.cpp refuses this cache type" in m["kv_cache_note"]


# --- sliding-window patterns ------------------------------------------------------------------

def test_qwen2_max_window_layers(tmp_path):
    """transformers' Qwen2 rule: with use_sliding_window, layers i >= max_window_layers slide."""
    folder = _model(tmp_path / "m", use_sliding_window=True, sliding_window=100, max_window_layers=1)
    m = _memory(folder, "--context", "1000", "--cache-type", "f16")
    assert m["kv_cache_layers"] == {"full": 1, "sliding": 2, "mla": 0, "recurrent": 0}
    assert m["kv_cache_bytes_k"] == 64 * 2 * (1000 + 2 * 100)
    off = _memory(_model(tmp_path / "off", use_sliding_window=False, sliding_window=100, max_window_layers=1))
    assert off["kv_cache_layers"]["sliding"] == 0


def test_sliding_window_pattern_and_layer_types():
    """Gemma 3's every-N-th-layer-full rule, an explicit layer_types list, and Mistral's window everywhere."""
    p = layer_plan({"sliding_window": 512, "sliding_window_pattern": 3}, 6, None, mla=False, hidden=64)
    assert p.kinds == ("sliding", "sliding", "full", "sliding", "sliding", "full") and p.window == 512
    p = layer_plan({"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]}, 2, None,
                   mla=False, hidden=64)
    assert p.kinds == ("full", "sliding")
    assert layer_plan({"sliding_window": 4096}, 3, None, mla=False, hidden=64).kinds == ("sliding",) * 3


def test_gemma3_sliding_by_hand(tiny):
    m = _memory(tiny("gemma3"), "--context", "3", "--batch", "4", "--cache-type", "q8_0")
    cfg = json.loads((tiny("gemma3") / "config.json").read_text())
    row = cfg["num_key_value_heads"] * cfg["head_dim"]
    assert row % 32 == 0
    # one sliding layer (window 8) and one full layer: a 3-token context is below the window
    assert m["kv_cache_bytes_k"] == 4 * (3 + 3) * row // 32 * 34
    m = _memory(tiny("gemma3"), "--context", "100", "--cache-type", "f32")
    assert m["kv_cache_bytes_k"] == (8 + 100) * row * 4 and m["sliding_window"] == 8


# --- MLA ----------------------------------------------------------------------------------------

def test_mla_latent_by_hand(tiny):
    cfg = json.loads((tiny("deepseek_v2") / "config.json").read_text())
    row = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]          # 16 + 8
    m = _memory(tiny("deepseek_v2"), "--context", "512", "--batch", "3", "--cache-type", "f16", "--devices", "2")
    assert m["kv_cache_layers"]["mla"] == cfg["num_hidden_layers"]
    assert m["kv_cache_bytes_k"] == cfg["num_hidden_layers"] * 512 * 3 * row * 2 and m["kv_cache_bytes_v"] == 0
    assert "MLA" in m["kv_cache_note"]
    d = m["per_device"]          # the latent serves every head: each device keeps all of it
    assert d["kv_cache_bytes"] == m["kv_cache_bytes_k"] and "replicated" in d["kv_split"]


def test_mla_gguf_counts_the_same_latent(tiny, tmp_path):
    """A GGUF's derived config has no kv_lora_rank: the file's own attention.kv_lora_rank is read, so the
    converted file reports the same latent bytes as its HF source (not K and V of one 24-wide 'head')."""
    gguf = tmp_path / "ds.gguf"
    r = CliRunner().invoke(main, ["convert", str(tiny("deepseek_v2")), "-o", str(gguf)])
    assert r.exit_code == 0, r.output
    args = ("--context", "300", "--cache-type", "q8_0")
    hf, g = _memory(tiny("deepseek_v2"), *args), _memory(gguf, *args)
    assert g["kv_cache_layers"] == hf["kv_cache_layers"] and g["kv_cache_layers"]["mla"] == 2
    assert (g["kv_cache_bytes_k"], g["kv_cache_bytes_v"]) == (hf["kv_cache_bytes_k"], 0)


# --- hybrid (recurrent) layers ----------------------------------------------------------------

def test_gated_delta_net_state_by_hand(tmp_path):
    """Qwen3-Next-style layer_types: 3 linear-attention layers keep a fixed f32 state per sequence."""
    lin = {"linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_num_value_heads": 4,
           "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4}
    folder = _model(tmp_path / "m", layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"], **lin)
    m = _memory(folder, "--context", "1000", "--batch", "2", "--cache-type", "f16")
    state = (4 - 1) * (2 * 2 * 8 + 4 * 8) + 4 * 8 * 8      # conv window over q, k, v + 4 value heads x 8 x 8
    assert m["kv_cache_layers"] == {"full": 1, "sliding": 0, "mla": 0, "recurrent": 3}
    assert m["recurrent_state_bytes"] == 2 * 3 * state * 4
    assert m["kv_cache_bytes_k"] == 2 * 1000 * 64 * 2          # the one full layer only
    assert "fixed state" in m["kv_cache_note"]
    assert m["total_bytes"] == m["weight_bytes_total"] + 2 * m["kv_cache_bytes_k"] + m["recurrent_state_bytes"]


def test_short_conv_and_mamba_states():
    lfm = layer_plan({"layer_types": ["conv", "full_attention"], "conv_L_cache": 3}, 2, None, mla=False, hidden=64)
    assert lfm.kinds == ("recurrent", "full") and lfm.state_elements == 2 * 64
    # Mamba-2 (hybrid_override_pattern: M mamba, * attention, - MLP only): conv over x, B, C + heads x d x state
    m2 = layer_plan({"hybrid_override_pattern": "M-*-M", "mamba_num_heads": 4, "mamba_head_dim": 16,
                     "ssm_state_size": 8, "n_groups": 1, "conv_kernel": 4}, 3, None, mla=False, hidden=64)
    assert m2.kinds == ("recurrent", "full", "recurrent")
    assert m2.state_elements == 3 * (64 + 2 * 8) + 64 * 8
    # Mamba-1 (attn_layer_period / offset): conv over d_inner, d_inner x state
    m1 = layer_plan({"attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
                     "mamba_expand": 2}, 4, None, mla=False, hidden=64)
    assert m1.kinds == ("recurrent", "full", "recurrent", "full") and m1.state_elements == 3 * 128 + 128 * 16
    # the older spellings transformers still reads: LFM2's full_attn_idxs, Qwen3-Next's full_attention_interval
    assert layer_plan({"full_attn_idxs": [1], "conv_L_cache": 3}, 3, None, mla=False, hidden=8).kinds == \
        ("recurrent", "full", "recurrent")
    assert layer_plan({"full_attention_interval": 2}, 4, None, mla=False, hidden=8).kinds == \
        ("recurrent", "full", "recurrent", "full")


# --- tensor parallel ----------------------------------------------------------------------------

def test_devices_split(tmp_path):
    folder = _model(tmp_path / "m")
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(folder) as ck:
        split = sum(i.nbytes for i in ck.tensors.values() if len(i.shape) >= 2)
        kept = sum(i.nbytes for i in ck.tensors.values() if len(i.shape) < 2)
    m = _memory(folder, "--context", "256", "--cache-type", "f16", "--devices", "2")
    kv = m["kv_cache_bytes_k"] + m["kv_cache_bytes_v"]
    d = m["per_device"]
    assert d["weight_bytes"] == split // 2 + kept and d["kv_cache_bytes"] == kv // 2
    assert d["total_bytes"] == d["weight_bytes"] + d["kv_cache_bytes"] and "split 2 ways" in d["kv_split"]
    four = _memory(folder, "--context", "256", "--cache-type", "f16", "--devices", "4")["per_device"]
    assert four["kv_cache_bytes"] == kv // 2 and "replicated 2 times" in four["kv_split"]   # 2 kv heads, 4 devices
    three = _memory(folder, "--context", "256", "--cache-type", "f16", "--devices", "3")["per_device"]
    assert three["kv_cache_bytes"] == kv and "replicated on every device" in three["kv_split"]


# --- against llama.cpp's own allocation ---------------------------------------------------------

_PROBE = r"""
import sys, llama_cpp
for name in sys.argv[2:]:
    t = getattr(llama_cpp, "GGML_TYPE_" + name.upper())
    m = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_batch=64, type_k=t, type_v=t, flash_attn=True, verbose=True,
                        n_threads=1)
    m.close()
"""


def test_kv_bytes_match_llama_cpp(tiny, tmp_path):
    """llama.cpp's log states its KV allocation (``llama_kv_cache: size = X MiB ... K (t): X MiB, V (t): X MiB``,
    two decimals of MiB): our figure for the same n_ctx, printed the same way, must read the same."""
    pytest.importorskip("llama_cpp")
    folder = _model(tmp_path / "hf", layers=2, heads=4, kv=4, head_dim=32, hidden=128, vocab=448,
                    rng=np.random.default_rng(0))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny("qwen2") / f, folder / f)
    gguf = tmp_path / "m.gguf"
    r = CliRunner().invoke(main, ["convert", str(folder), "-o", str(gguf), "--dtype", "f16"])
    assert r.exit_code == 0, r.output
    types = ("f16", "q8_0", "q4_0", "q5_1", "iq4_nl")
    p = subprocess.run([sys.executable, "-c", _PROBE, str(gguf), *types], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    logged = re.findall(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells.*K \((\w+)\): +([\d.]+) MiB, "
                        r"V \((\w+)\): +([\d.]+) MiB", p.stderr)
    assert [x[2] for x in logged] == list(types), p.stderr[-2000:]
    for total, cells, tk, k, _, v in logged:
        assert cells == "4096"
        m = _memory(gguf, "--context", "4096", "--cache-type", tk)
        assert f"{m['kv_cache_bytes_k'] / 2**20:.2f}" == k and f"{m['kv_cache_bytes_v'] / 2**20:.2f}" == v
        assert f"{(m['kv_cache_bytes_k'] + m['kv_cache_bytes_v']) / 2**20:.2f}" == total
