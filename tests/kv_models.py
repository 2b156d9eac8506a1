"""Tiny Qwen2 models for the KV-cache tests (verify's cache types, analysis.kv_measure).

llama.cpp quantizes the cache in blocks of 32 along the head dimension and refuses a block type
that does not divide it, so these have head_dim 64 (the tiny fixtures' 16 cannot take q4_0).
``initializer_range`` 0.2 makes attention far from uniform (at transformers' default 0.02 every
row is near-uniform and no cache error would show in the logits).

``plant`` puts a large key bias into a few rotary pairs of the named layers: the pattern of the
Qwen2.5 boundary layers (a few dominant dimensions that set the quantization step of the block
they sit in).  In HF's rotate_half layout pair j is dims (j, j + d/2); the planted dims are the
lowest-frequency pairs (largest j), one per 32-block, so both blocks of a 64-dim head carry one.
"""
from __future__ import annotations

import shutil
from pathlib import Path

KV_CONFIG = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 64, "initializer_range": 0.2,
             "layer_types": ["full_attention"] * 3}


def planted_dims(head_dim: int = 64, pairs: int = 2) -> list[int]:
    """The dims a planted bias occupies: the last ``pairs`` rotary pairs, both halves."""
    half = head_dim // 2
    js = range(half - pairs, half)
    return sorted([j for j in js] + [j + half for j in js])


def build_kv_qwen2(tiny, out: Path, *, plant: dict | None = None, seed: int = 0) -> Path:
    """A tiny Qwen2 (``KV_CONFIG``) at ``out``; ``plant = {layer: magnitude}`` sets those layers'
    key bias to ``magnitude`` on :func:`planted_dims` (every kv head).  Built once per folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    base = tiny("qwen2")
    cfg = AutoConfig.from_pretrained(base)
    for k, v in KV_CONFIG.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for layer, magnitude in (plant or {}).items():
            b = model.model.layers[layer].self_attn.k_proj.bias.view(cfg.num_key_value_heads, cfg.head_dim)
            b[:, planted_dims(cfg.head_dim)] = float(magnitude)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        if (base / f).is_file():
            shutil.copy(base / f, tmp / f)
    tmp.rename(out)
    return out
