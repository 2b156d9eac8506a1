"""The tiny-model builder: every fixture loads offline in transformers, runs, carries non-zero
biases where its family has them, and is reproducible byte for byte.

Everything downstream (analysis, surgery, conversion, verification tests and the demo) trusts
these folders, so this file pins the properties those tests silently rely on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ckpt_surgeon.tiny import SPECS, build_tiny, spec_fingerprint, tiny_names

NAMES = tiny_names()

# Per layer, the total number of attention q/k/v bias elements the checkpoint must hold.
# 4 query heads x 16 + kv heads x 16 for K and for V: GQA (2 kv heads) -> 64 + 32 + 32 = 128;
# MHA -> 192; Falcon multi-query (1 kv head) -> 64 + 16 + 16 = 96; 0 = the family has no
# attention biases. Checks both "biases exist" and "the GQA/MQA head counts really took".
QKV_BIAS_NUMEL_PER_LAYER = {
    "qwen2": 128,
    "qwen2_long": 128,
    "qwen2_sharded": 128,
    "llama": 0,
    "llama_bias": 128,
    "mistral": 0,
    "qwen3": 128,
    "gemma3": 128,
    "gemma2": 128,
    "phi3": 0,
    "phi": 128,
    "gpt2": 192,
    "gpt_neox": 192,
    "bloom": 192,
    "falcon": 128,
    "falcon_mq": 96,
    "falcon_old": 192,
    "bert": 192,
    "starcoder2": 128,
    "olmo2": 128,
    "opt": 192,
    "qwen2_moe": 128,
    "qwen3_moe": 0,
    "olmoe": 0,
    "mixtral": 0,
    "deepseek_v2": 0,
    "granite": 0,
    "cohere": 0,
    "stablelm": 128,
    "phimoe": 128,
}
QKV_BIAS_MODULES = {"q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "query", "key", "value"}
N_LAYERS = 2

BPE_SAMPLE = "Hello, world! 注意力机制 🚀✅\ndef f(x):\n    return x.bias + 1\n"
WORDPIECE_SAMPLE = "the quick brown fox jumps over the lazy dog"


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (possibly sharded) safetensors checkpoint, read without transformers."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                assert key not in tensors, f"{key} appears in two shards"
                tensors[key] = f.get_tensor(key)
    return tensors


def test_table_and_expectations_agree():
    assert set(QKV_BIAS_NUMEL_PER_LAYER) == set(NAMES)
    assert len(NAMES) == len(set(NAMES))


def test_import_does_not_import_torch():
    code = "import sys, ckpt_surgeon.tiny; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


@pytest.mark.parametrize("name", NAMES)
def test_loads_offline_and_runs(tiny, name):
    import transformers

    folder = tiny(name)
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    assert config.architectures == [SPECS[name].model_class]
    assert config.num_hidden_layers == N_LAYERS
    assert config.hidden_size <= 64
    model_cls = getattr(transformers, SPECS[name].model_class)
    model = model_cls.from_pretrained(folder, local_files_only=True, attn_implementation="eager")
    model.eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())

    ids = torch.tensor([[1, 5, 17, 42, 99, 3]])
    with torch.no_grad():
        out = model(input_ids=ids)
    result = out.logits if hasattr(out, "logits") else out.last_hidden_state
    width = config.vocab_size if hasattr(out, "logits") else config.hidden_size
    assert result.shape == (1, ids.shape[1], width)
    assert torch.isfinite(result).all()


@pytest.mark.parametrize("name", NAMES)
def test_biases_nonzero_and_qkv_biases_present(tiny, name):
    tensors = read_tensors(tiny(name))
    assert all(t.dtype == torch.float32 for t in tensors.values())
    biases = {k: t for k, t in tensors.items() if k.endswith(".bias")}
    for key, t in biases.items():
        assert t.norm() > 0, f"{name}: {key} is all zeros"
    qkv = {k: t for k, t in biases.items() if k.split(".")[-2] in QKV_BIAS_MODULES}
    expected = QKV_BIAS_NUMEL_PER_LAYER[name]
    assert sum(t.numel() for t in qkv.values()) == expected * N_LAYERS, sorted(qkv)
    for key, t in qkv.items():
        # std 0.5 on q/k/v biases: their effect must be large, not a rounding-level nudge.
        assert t.std() > 0.2, f"{name}: {key} std {t.std():.3f}"


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_and_special_ids_consistent(tiny, name):
    from transformers import AutoTokenizer

    folder = tiny(name)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    config = json.loads((folder / "config.json").read_text())
    assert len(tok) <= config["vocab_size"]
    assert config["vocab_size"] % 64 == 0
    assert config["pad_token_id"] == tok.pad_token_id

    wordpiece = SPECS[name].options.get("tokenizer") == "wordpiece"
    sample = WORDPIECE_SAMPLE if wordpiece else BPE_SAMPLE
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    assert ids and max(ids) < len(tok)
    assert tok.decode(ids) == sample

    if wordpiece:
        assert {"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"} <= set(tok.get_vocab())
        assert not (folder / "generation_config.json").exists()
        return
    assert config["bos_token_id"] == tok.bos_token_id
    assert config["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    gen = json.loads((folder / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", [n for n in NAMES if "rope_parameters" in SPECS[n].config_kwargs])
def test_saved_config_carries_spec_rope_parameters(tiny, name):
    """transformers 5 moves/renames rope settings; the spec's values must survive to disk."""
    saved = json.loads((tiny(name) / "config.json").read_text())["rope_parameters"]
    for key, value in SPECS[name].config_kwargs["rope_parameters"].items():
        assert saved[key] == value, (name, key, saved)


def test_qwen2_long_config(tiny):
    config = json.loads((tiny("qwen2_long") / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == 1_000_000.0
    assert config["max_position_embeddings"] == 32768


def test_partial_rotary_spellings(tiny):
    phi = json.loads((tiny("phi") / "config.json").read_text())
    neox = json.loads((tiny("gpt_neox") / "config.json").read_text())
    assert phi["rope_parameters"]["partial_rotary_factor"] == 0.5
    assert neox["rope_parameters"]["partial_rotary_factor"] == 0.25


def test_qwen2_sharded_index_covers_every_tensor(tiny):
    folder = tiny("qwen2_sharded")
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3
    assert not (folder / "model.safetensors").exists()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    on_disk = {}
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            on_disk.update({key: shard.name for key in f.keys()})
    assert index["weight_map"] == on_disk
    # Same weights as the unsharded build: sharding changes files, not tensors.
    whole, parts = read_tensors(tiny("qwen2")), read_tensors(folder)
    assert whole.keys() == parts.keys()
    assert all(torch.equal(whole[k], parts[k]) for k in whole)


def test_same_seed_same_bytes(tmp_path):
    a = build_tiny("qwen2", tmp_path / "a", seed=0)
    b = build_tiny("qwen2", tmp_path / "b", seed=0)
    c = build_tiny("qwen2", tmp_path / "c", seed=1)
    for fname in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (a / fname).read_bytes() == (b / fname).read_bytes(), fname
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert spec_fingerprint("qwen2", seed=0) != spec_fingerprint("qwen2", seed=1)


def test_fixture_cache_is_atomic_and_reused(tmp_path, monkeypatch):
    from fixtures import fixture_path

    monkeypatch.setenv("CKPT_SURGEON_FIXTURE_CACHE", str(tmp_path))
    first = fixture_path("bert")
    assert first.is_relative_to(tmp_path) and (first / "model.safetensors").is_file()
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert fixture_path("bert") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert not [p.name for p in first.parent.iterdir() if p.name.startswith(".")]   # no temp left beside it


def test_unknown_name_lists_known_ones(tmp_path):
    with pytest.raises(KeyError, match="qwen2"):
        build_tiny("no_such_model", tmp_path)


def test_fresh_process_rebuild_is_byte_identical(tiny, tmp_path):
    """The cache is shared across processes, so a build must not depend on per-process state
    (e.g. hash-map order inside a tokenizer trainer): rebuild in a new interpreter, compare."""
    names = ["qwen2", "bert"]
    code = (
        "import sys; from ckpt_surgeon.tiny import build_tiny\n"
        "for n in sys.argv[2:]: build_tiny(n, sys.argv[1] + '/' + n)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path), *names], env=env, check=True)
    for name in names:
        cached = tiny(name)
        for file in sorted(cached.iterdir()):
            assert (tmp_path / name / file.name).read_bytes() == file.read_bytes(), (name, file.name)
