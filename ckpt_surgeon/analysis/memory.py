"""Memory figures for ``inspect``: weight bytes per dtype and KV-cache bytes per 1,000 tokens.

KV cache per token and layer: K and V, ``n_kv_heads x head_dim`` elements each (llama.cpp
``llama_kv_cache`` and transformers' ``DynamicCache`` both store them per kv head, before GQA
expansion).  Sliding-window layers keep at most ``sliding_window`` tokens (transformers
``DynamicSlidingWindowLayer``, llama.cpp's SWA cache), so for 1,000 tokens they hold
``min(1000, window)``.  Multi-head latent attention (DeepSeek-V2/V3 ``kv_lora_rank``) caches the
compressed latent plus the shared rotary key, ``kv_lora_rank + qk_rope_head_dim`` elements per
token and layer, instead of K and V.

Element sizes: f16 2 bytes; q8_0 34 bytes per 32 elements (a float16 scale + 32 int8,
ggml ``block_q8_0``), the type llama.cpp's ``--cache-type-k/v q8_0`` uses.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.checked import MAX_POSITIONS, MAX_WIDTH, config_int

TOKENS = 1000
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32}


@dataclass(frozen=True)
class MemoryFigures:
    weight_bytes: dict              # dtype -> bytes stored
    kv_elements_per_1000: int | None  # K + V elements cached for 1,000 tokens over all layers
    kv_bytes_per_1000: dict         # "f16" / "q8_0" -> bytes
    kv_note: str | None = None      # how sliding-window / MLA layers were counted, or why unknown

    def to_dict(self) -> dict:
        return {"weight_bytes": dict(self.weight_bytes), "weight_bytes_total": sum(self.weight_bytes.values()),
                "kv_cache_tokens": TOKENS, "kv_cache_elements": self.kv_elements_per_1000,
                "kv_cache_bytes": dict(self.kv_bytes_per_1000), "kv_cache_note": self.kv_note}

    def summary_items(self) -> list[tuple[str, str]]:
        w = ", ".join(f"{k} {_mib(v)}" for k, v in sorted(self.weight_bytes.items(), key=lambda kv: -kv[1]))
        items = [("weight bytes", f"{_mib(sum(self.weight_bytes.values()))} ({w})" if w else "-")]
        if self.kv_elements_per_1000 is None:
            items.append(("KV cache / 1,000 tokens", f"unknown ({self.kv_note})"))
        else:
            kv = ", ".join(f"{k} {_mib(v)}" for k, v in self.kv_bytes_per_1000.items())
            items.append(("KV cache / 1,000 tokens", kv + (f" ({self.kv_note})" if self.kv_note else "")))
        return items


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _sliding_layers(cfg: dict, n_layers: int) -> list[bool]:
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return [t == "sliding_attention" for t in types]
    # Mistral-style: one window for every layer, unless the config switches it off (Qwen2 keeps
    # sliding_window set with use_sliding_window=false).
    on = bool(cfg.get("sliding_window")) and cfg.get("use_sliding_window", True) is not False
    return [on] * n_layers


def memory_figures(tensors: dict, config: dict | None, layout) -> MemoryFigures:
    weight: dict[str, int] = {}
    for info in tensors.values():
        weight[info.dtype] = weight.get(info.dtype, 0) + info.nbytes
    if layout.tower_kind in ("vision", "audio"):     # an mmproj file: encoders only, run once per image / clip
        return MemoryFigures(weight, None, {}, f"no KV cache: a {layout.tower_kind} encoder, not a decoder")
    cfg = dict(config or {})
    n_layers = layout.num_layers
    where = layout.config_source
    # config.json values are untrusted: type and range checked where read (arch/checked.py)
    rank = config_int(cfg, ("kv_lora_rank",), path=where, minimum=0, maximum=MAX_WIDTH)
    if rank:
        per_layer = rank + (config_int(cfg, ("qk_rope_head_dim",), path=where, minimum=0, maximum=MAX_WIDTH) or 0)
        elements = n_layers * per_layer * TOKENS
        note = "MLA: compressed latent + rotary key per token"
    elif layout.num_kv_heads and layout.head_dim and n_layers:
        window = config_int(cfg, ("sliding_window",), path=where, minimum=0, maximum=MAX_POSITIONS)
        sliding = _sliding_layers(cfg, n_layers)
        per_token = 2 * layout.num_kv_heads * layout.head_dim
        elements = sum(per_token * (min(TOKENS, window) if s and window else TOKENS) for s in sliding)
        n_swa = sum(sliding)
        note = f"{n_swa} sliding-window layer(s) keep at most {window} tokens" if n_swa else None
    else:
        return MemoryFigures(weight, None, {}, "kv heads / head_dim unknown")
    return MemoryFigures(weight, elements, {k: round(elements * b) for k, b in KV_BYTES_PER_ELEMENT.items()}, note)
