"""Which decoder layers cache what, read from a config as the runtimes read it (``inspect``'s memory figures).

Each layer is one of:

* ``full``: K and V for every token (``n_kv_heads x head_dim`` elements each);
* ``sliding``: K and V for at most ``sliding_window`` tokens.  The pattern comes from
  ``layer_types`` (``"sliding_attention"``) when the config lists it; else from
  ``sliding_window_pattern`` (every N-th layer full, the rest sliding: layer ``i`` slides when
  ``(i + 1) % N != 0``, transformers' Gemma 3 rule); else from ``use_sliding_window`` +
  ``max_window_layers`` (layers ``i >= max_window_layers`` slide: transformers' Qwen2 rule; llama.cpp
  runs those models without a window); else a set ``sliding_window`` slides every layer (Mistral's
  rule).  transformers' ``DynamicSlidingWindowLayer`` and llama.cpp's SWA cache both keep at most
  the window (llama.cpp adds one micro-batch of cells, ``n_ubatch``, not counted here);
* ``mla``: multi-head latent attention (``kv_lora_rank``): the compressed latent plus the shared
  rotary key, ``kv_lora_rank + qk_rope_head_dim`` elements per token, one copy for all heads
  (llama.cpp's and vLLM's MLA caches; transformers expands it to full K and V per head);
* ``recurrent``: a linear-attention / state-space / short-convolution layer (``layer_types`` entries
  such as ``linear_attention``, ``mamba``, ``conv``; ``full_attn_idxs`` (the others short-conv);
  ``full_attention_interval`` (every N-th layer full); ``hybrid_override_pattern`` ``M``;
  ``attn_layer_period``/``attn_layer_offset``).  It keeps a fixed-size state per sequence, not per
  token: the convolution window plus the recurrent matrix, stored in f32 whatever the KV cache
  type (llama.cpp's ``llama_memory_recurrent``: ``type_r`` / ``type_s`` are F32);
* ``none``: a layer without a token mixer (``layer_types`` / ``layers_block_type`` ``mlp`` or ``moe``:
  NemotronH), or with no attention heads in a GGUF file outside the registry (``head_count_kv`` 0 for the layer,
  ``layer_kv_heads`` in the config :func:`ckpt_surgeon.arch.gguf_config.config_from_gguf` reads): no K or V.
  Whether the layer is recurrent or MLP-only is llama.cpp's architecture's own rule (NemotronH: recurrent
  when its FFN width is 0 too; GraniteHybrid: always), so its state is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arch.checked import MAX_LAYERS, MAX_POSITIONS, MAX_WIDTH, config_int

RECURRENT_KINDS = frozenset({"linear_attention", "mamba", "mamba2", "conv", "short_conv", "ssm", "recurrent",
                             "rwkv", "deltanet", "gated_deltanet", "lightning_attention"})
_ATTENTION_KINDS = frozenset({"full_attention", "attention", "global_attention", "global", "full",
                              "chunked_attention"})
STATE_BYTES_PER_ELEMENT = 4      # f32: llama.cpp's recurrent state types


@dataclass(frozen=True)
class LayerPlan:
    kinds: tuple                    # per layer: full | sliding | mla | recurrent
    window: int | None              # sliding_window (tokens), when some layer slides
    state_elements: int | None      # recurrent state elements per recurrent layer and sequence (None: unknown)
    how: str                        # where the pattern came from

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kinds if k == kind)


def _int(cfg, keys, where, maximum=MAX_WIDTH):
    return config_int(cfg, keys if isinstance(keys, tuple) else (keys,), path=where, minimum=0, maximum=maximum)


_MLP_ONLY_KINDS = frozenset({"mlp", "moe", "ffn"})      # a block with no token mixer: NemotronH's "-" / "E" layers


def _from_layer_types(types: list) -> list[str]:
    out = []
    for t in types:
        t = str(t).lower()
        out.append("sliding" if t == "sliding_attention" else "recurrent" if t in RECURRENT_KINDS else
                   "none" if t in _MLP_ONLY_KINDS else "full")
    return out


def layer_kinds(cfg: dict, n_layers: int, where) -> tuple[list[str], str]:
    """Per layer ``full | sliding | recurrent | none`` and where the pattern came from (MLA is decided by the caller)."""
    per_layer = cfg.get("layer_kv_heads")
    if isinstance(per_layer, list) and len(per_layer) == n_layers:
        return ["full" if v else "none" for v in per_layer], "head_count_kv per layer (GGUF)"
    for key in ("layer_types", "layers_block_type"):    # (NemotronH in transformers 5: layers_block_type)
        types = cfg.get(key)
        if isinstance(types, list) and len(types) == n_layers:
            return _from_layer_types(types), key
    idxs = cfg.get("full_attn_idxs")        # LFM2 before layer_types: the attention layers, the rest short-conv
    if isinstance(idxs, list) and all(isinstance(i, int) for i in idxs):
        return ["full" if i in idxs else "recurrent" for i in range(n_layers)], "full_attn_idxs"
    interval = _int(cfg, "full_attention_interval", where, MAX_LAYERS)
    if interval:                            # Qwen3-Next before layer_types: every interval-th layer full
        return (["recurrent" if (i + 1) % interval else "full" for i in range(n_layers)],
                f"full_attention_interval {interval}")
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern.replace("-", "")) == n_layers:   # M mamba, * attention, - MLP only
        return ["recurrent" if c == "M" else "full" for c in pattern.replace("-", "")], "hybrid_override_pattern"
    period = _int(cfg, "attn_layer_period", where, MAX_LAYERS)
    if period:
        offset = _int(cfg, "attn_layer_offset", where, MAX_LAYERS) or 0
        return (["full" if i % period == offset else "recurrent" for i in range(n_layers)],
                "attn_layer_period / attn_layer_offset")
    window = _int(cfg, "sliding_window", where, MAX_POSITIONS)
    if not window:
        return ["full"] * n_layers, "every layer full"
    every = _int(cfg, ("sliding_window_pattern", "_sliding_window_pattern"), where, MAX_LAYERS)
    if every:
        return (["sliding" if (i + 1) % every else "full" for i in range(n_layers)],
                f"sliding_window_pattern {every}")
    if "max_window_layers" in cfg and cfg.get("use_sliding_window") is not None:
        if not cfg.get("use_sliding_window"):
            return ["full"] * n_layers, "use_sliding_window false"
        first = _int(cfg, "max_window_layers", where, MAX_LAYERS) or 0
        return ["sliding" if i >= first else "full" for i in range(n_layers)], f"max_window_layers {first}"
    if cfg.get("use_sliding_window") is False:
        return ["full"] * n_layers, "use_sliding_window false"
    return ["sliding"] * n_layers, "sliding_window on every layer"


def _mamba_state(cfg: dict, where, hidden: int | None) -> int | None:
    """(d_conv - 1) x conv channels + d_inner x d_state (Mamba-2: conv channels = d_inner + 2 x groups x d_state)."""
    d_state = _int(cfg, ("mamba_d_state", "ssm_state_size", "state_size", "d_state"), where)
    d_conv = _int(cfg, ("mamba_d_conv", "mamba_conv_kernel", "conv_kernel", "d_conv"), where)
    heads = _int(cfg, ("mamba_n_heads", "mamba_num_heads", "ssm_num_heads"), where)
    head_dim = _int(cfg, ("mamba_d_head", "mamba_head_dim", "ssm_head_dim", "mamba_headdim"), where)
    expand = _int(cfg, ("mamba_expand", "expand", "ssm_expand"), where)
    d_inner = _int(cfg, ("mamba_d_ssm", "d_inner", "intermediate_ssm_size"), where) or \
        (heads * head_dim if heads and head_dim else (expand * hidden if expand and hidden else None))
    if not (d_state and d_conv and d_inner):
        return None
    groups = _int(cfg, ("mamba_n_groups", "n_groups", "ssm_n_groups"), where)
    channels = d_inner + 2 * groups * d_state if heads or groups else d_inner
    return (d_conv - 1) * channels + d_inner * d_state


def recurrent_state_elements(cfg: dict, where, hidden: int | None) -> int | None:
    """Elements of one recurrent layer's state for one sequence, or None when the config does not say."""
    kh, kd = _int(cfg, "linear_num_key_heads", where), _int(cfg, "linear_key_head_dim", where)
    vh, vd = _int(cfg, "linear_num_value_heads", where), _int(cfg, "linear_value_head_dim", where)
    kernel = _int(cfg, "linear_conv_kernel_dim", where)
    # gated delta net: a conv window over q, k, v, and per value head a kd x vd matrix
    if kh and kd and vh and vd and kernel:
        return (kernel - 1) * (2 * kh * kd + vh * vd) + vh * kd * vd
    cache = _int(cfg, "conv_L_cache", where)
    if cache and hidden:                           # short convolution: the last L - 1 inputs
        return (cache - 1) * hidden
    return _mamba_state(cfg, where, hidden)


def layer_plan(cfg: dict, n_layers: int, where, *, mla: bool, hidden: int | None) -> LayerPlan:
    kinds, how = layer_kinds(cfg, n_layers, where)
    if mla:
        kinds = ["mla" if k == "full" else k for k in kinds]
    window = _int(cfg, "sliding_window", where, MAX_POSITIONS) if "sliding" in kinds else None
    if "sliding" in kinds and not window:        # layer_types says sliding but no window: counted as full
        kinds = ["full" if k == "sliding" else k for k in kinds]
    state = recurrent_state_elements(cfg, where, hidden) if "recurrent" in kinds else None
    return LayerPlan(tuple(kinds), window, state, how)
