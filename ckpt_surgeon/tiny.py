"""Tiny random checkpoints, one per architecture family, built with transformers.

Why this lives inside the package: ``ckpt-surgeon demo`` needs a real checkpoint to operate on
and must work offline, so the builder ships with the tool; the test-suite (``fixtures/``) and the
benchmarks use the same builder so that all three see identical models.

Design:

* :data:`SPECS` is data, not code: ``name -> TinySpec(config class, config kwargs, model class,
  options)``. Adding a family is adding a row; :func:`build_tiny` never branches on a name.
* Every ``*.bias`` parameter is overwritten with non-zero seeded noise after transformers'
  init (which zeroes biases). Attention q/k/v biases get std 0.5 so that dropping or folding
  them has a clearly visible effect on the forward pass; every other bias gets std 0.05.
* Builds are deterministic: same ``(name, seed)`` -> byte-identical ``model.safetensors``
  (transformers' init draws from the global torch RNG, which we seed; the tokenizer is trained
  deterministically from the corpus below).
* Importing this module is cheap: torch / transformers / tokenizers are imported inside the
  functions that need them, so ``ckpt_surgeon`` CLI start-up does not pay for torch.

Transformers 5 notes (checked against the installed 5.x sources, ``configuration_*.py`` and
``modeling_rope_utils.py``): rope settings are passed and saved as
``rope_parameters={"rope_type": ..., "rope_theta": ..., "partial_rotary_factor": ...}``; the
legacy top-level ``rope_theta`` / ``rotary_pct`` kwargs are still accepted on input and moved
into ``rope_parameters`` by ``convert_rope_params_to_dict``. ``save_pretrained`` always writes
safetensors in v5 (the ``safe_serialization`` argument is gone).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

from .quiet import quiet_transformers

__all__ = [
    "SPECS",
    "TinySpec",
    "build_tiny",
    "spec_fingerprint",
    "tiny_names",
]


class TinySpec(NamedTuple):
    """One row of the tiny-model table.

    ``config_kwargs`` never contains ``vocab_size`` or special-token ids: those are derived from
    the tokenizer at build time so the model and tokenizer can never disagree.

    ``options`` keys (all optional):

    * ``tokenizer``: ``"bpe"`` (byte-level BPE + ChatML, default) or ``"wordpiece"`` (BERT).
    * ``max_shard_size``: passed to ``save_pretrained`` to force a sharded checkpoint.
    """

    config_class: str
    config_kwargs: dict[str, Any]
    model_class: str
    options: dict[str, Any]


# Shared shape of every decoder: hidden 64 = 4 query heads x head_dim 16, GQA with 2 kv heads,
# 2 layers. Small enough that a forward pass is microseconds, big enough that GQA grouping,
# partial rotary (rotary dim 8 or 4) and per-head fused layouts are all non-trivial.
_DECODER: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def _rope(theta: float, **extra: Any) -> dict[str, Any]:
    """The transformers-5 spelling of rope settings (see module docstring)."""
    return {"rope_type": "default", "rope_theta": theta, **extra}


_QWEN2 = {**_DECODER, "rope_parameters": _rope(10000.0)}

SPECS: dict[str, TinySpec] = {
    # q/k/v biases are hard-wired in Qwen2Attention; o_proj has none.
    "qwen2": TinySpec("Qwen2Config", _QWEN2, "Qwen2ForCausalLM", {}),
    # Long-context variant: large theta makes the low-frequency rope pairs nearly static over the
    # window, which is what the "nearly removable k-bias" bound is about.
    "qwen2_long": TinySpec(
        "Qwen2Config",
        {**_QWEN2, "max_position_embeddings": 32768, "rope_parameters": _rope(1_000_000.0)},
        "Qwen2ForCausalLM",
        {},
    ),
    # ~240 KB of weights; 64 KB shards give several files plus model.safetensors.index.json.
    "qwen2_sharded": TinySpec("Qwen2Config", _QWEN2, "Qwen2ForCausalLM", {"max_shard_size": "64KB"}),
    "llama": TinySpec(
        "LlamaConfig",
        {**_DECODER, "head_dim": 16, "attention_bias": False, "rope_parameters": _rope(10000.0)},
        "LlamaForCausalLM",
        {},
    ),
    # attention_bias=True puts biases on q/k/v *and* o_proj (LlamaAttention).
    "llama_bias": TinySpec(
        "LlamaConfig",
        {**_DECODER, "head_dim": 16, "attention_bias": True, "rope_parameters": _rope(10000.0)},
        "LlamaForCausalLM",
        {},
    ),
    "mistral": TinySpec(
        "MistralConfig",
        {**_DECODER, "head_dim": 16, "sliding_window": None, "rope_parameters": _rope(10000.0)},
        "MistralForCausalLM",
        {},
    ),
    # q/k RMSNorm after the projection: biases here are *not* removable; enabling
    # attention_bias gives the analysis something to refuse.
    "qwen3": TinySpec(
        "Qwen3Config",
        {**_DECODER, "head_dim": 16, "attention_bias": True, "rope_parameters": _rope(10000.0)},
        "Qwen3ForCausalLM",
        {},
    ),
    # Gemma3 text: q/k norm, sliding + full layers with different rope thetas (nested
    # rope_parameters per layer type, filled in by Gemma3TextConfig), tied embeddings.
    "gemma3": TinySpec(
        "Gemma3TextConfig",
        {
            **_DECODER,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "attention_bias": True,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": True,
        },
        "Gemma3ForCausalLM",
        {},
    ),
    # Gemma2: norms before and after attention and MLP (stored as w, applied as 1 + w), no q/k
    # norm, sliding and full layers alternating (window 8), attention logits soft-capped at 50 and
    # final logits at 30 (the released models' values), query_pre_attn_scalar = head_dim as in the
    # real checkpoints, tied embeddings; attention_bias on so the analysis has biases to judge.
    "gemma2": TinySpec(
        "Gemma2Config",
        {
            **_DECODER,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "attention_bias": True,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
            "rope_parameters": _rope(10000.0),
        },
        "Gemma2ForCausalLM",
        {},
    ),
    # Fused [Q; K; V] rows in qkv_proj, no biases anywhere in Phi3.
    "phi3": TinySpec(
        "Phi3Config",
        {**_DECODER, "original_max_position_embeddings": 256, "rope_parameters": _rope(10000.0)},
        "Phi3ForCausalLM",
        {},
    ),
    # Phi-2: half of each head is rotated (rotary dim 8 of 16); q/k/v/dense all biased.
    "phi": TinySpec(
        "PhiConfig",
        {**_DECODER, "rope_parameters": _rope(10000.0, partial_rotary_factor=0.5)},
        "PhiForCausalLM",
        {},
    ),
    # Conv1D c_attn stored [in, 3*out]; learned absolute positions; MHA only.
    "gpt2": TinySpec(
        "GPT2Config",
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "n_positions": 256},
        "GPT2LMHeadModel",
        {},
    ),
    # OPT: learned absolute positions (offset 2), pre-LN, biases on every linear (enable_bias),
    # tied head; word_embed_proj_dim = hidden, so no project_in/out.
    "opt": TinySpec(
        "OPTConfig",
        {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 256, "word_embed_proj_dim": 64, "do_layer_norm_before": True,
         "enable_bias": True},
        "OPTForCausalLM",
        {},
    ),
    # Per-head interleaved [h, 3, d] query_key_value; rotary on 4 of 16 dims (Pythia's 0.25).
    "gpt_neox": TinySpec(
        "GPTNeoXConfig",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 256,
            "attention_bias": True,
            "rope_parameters": _rope(10000.0, partial_rotary_factor=0.25),
        },
        "GPTNeoXForCausalLM",
        {},
    ),
    # ALiBi, per-head interleaved [h, 3, d] fused QKV, biases everywhere.
    "bloom": TinySpec("BloomConfig", {"hidden_size": 64, "n_layer": 2, "n_head": 4}, "BloomForCausalLM", {}),
    # Falcon-40B style: grouped per kv head [kv, q_per_kv + 2, d], two parallel layer norms.
    "falcon": TinySpec(
        "FalconConfig",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "multi_query": False,
            "parallel_attn": True,
            "bias": True,
            "alibi": False,
            "ffn_hidden_size": 128,
            "max_position_embeddings": 256,
            "rope_parameters": _rope(10000.0),
        },
        "FalconForCausalLM",
        {},
    ),
    # Falcon-7B style multi-query: [Q (h*d); K (d); V (d)] with one shared kv head.
    "falcon_mq": TinySpec(
        "FalconConfig",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "bias": True,
            "alibi": False,
            "ffn_hidden_size": 128,
            "max_position_embeddings": 256,
            "rope_parameters": _rope(10000.0),
        },
        "FalconForCausalLM",
        {},
    ),
    # Old MHA Falcon layout: per-head [h, 3, d] like BLOOM, sequential (non-parallel) block.
    "falcon_old": TinySpec(
        "FalconConfig",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "new_decoder_architecture": False,
            "multi_query": False,
            "parallel_attn": False,
            "bias": True,
            "alibi": False,
            "ffn_hidden_size": 128,
            "max_position_embeddings": 256,
            "rope_parameters": _rope(10000.0),
        },
        "FalconForCausalLM",
        {},
    ),
    # Encoder with absolute positions and post-norm: the textbook "k-bias is exactly redundant".
    "bert": TinySpec(
        "BertConfig",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "max_position_embeddings": 128,
        },
        "BertModel",
        {"tokenizer": "wordpiece"},
    ),
    "starcoder2": TinySpec(
        "Starcoder2Config",
        {**_DECODER, "use_bias": True, "sliding_window": None, "rope_parameters": _rope(10000.0)},
        "Starcoder2ForCausalLM",
        {},
    ),
    # MoE: 4 experts, 2 routed per token, expert FFN width 32 (a whole Q8_0 block); checkpoints
    # store one tensor per expert (transformers 5 fuses them on load, splits them on save).
    # Qwen2-MoE adds an always-on shared expert behind a sigmoid gate; q/k/v biases (qkv_bias).
    "qwen2_moe": TinySpec(
        "Qwen2MoeConfig",
        {**_DECODER, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
         "shared_expert_intermediate_size": 64, "norm_topk_prob": False, "rope_parameters": _rope(10000.0)},
        "Qwen2MoeForCausalLM",
        {},
    ),
    # Qwen3-MoE: q/k RMSNorm per head, top-k weights renormalised (as the released models).
    "qwen3_moe": TinySpec(
        "Qwen3MoeConfig",
        {**_DECODER, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
         "norm_topk_prob": True, "rope_parameters": _rope(10000.0)},
        "Qwen3MoeForCausalLM",
        {},
    ),
    # OLMoE: q/k RMSNorm over the whole projection, experts as wide as intermediate_size; MHA
    # like the released model (llama.cpp's olmoe sizes k_norm by n_embd: no GQA).
    "olmoe": TinySpec(
        "OlmoeConfig",
        {**_DECODER, "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False,
         "rope_parameters": _rope(10000.0)},
        "OlmoeForCausalLM",
        {},
    ),
    # Mixtral: experts w1 / w3 / w2 (gate / up / down) under block_sparse_moe, as wide as intermediate_size.
    "mixtral": TinySpec(
        "MixtralConfig",
        {**_DECODER, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
         "rope_parameters": _rope(10000.0)},
        "MixtralForCausalLM",
        {},
    ),
    # Phi-3.5-MoE: nn.LayerNorm (weights and biases) everywhere, q/k/v/o and lm_head biases (as
    # released), experts w1 / w3 / w2 under block_sparse_moe, top-2 "sparsemixer" routing;
    # original_max_position_embeddings as Phi-3 configs carry it (llama.cpp's converter reads it).
    "phimoe": TinySpec(
        "PhimoeConfig",
        {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2, "attention_bias": True, "lm_head_bias": True,
         "original_max_position_embeddings": 256, "rope_parameters": _rope(10000.0)},
        "PhimoeForCausalLM",
        {},
    ),
    # DeepSeek-V2 (V2-Lite's layout): MLA attention with no query LoRA (plain q_proj), the kv
    # latent (kv_lora_rank 16) expanded per head by kv_b_proj, decoupled RoPE on 8 dims of a
    # 16 + 8 query/key head, values 16 wide; one leading dense layer (first_k_dense_replace), then
    # an MoE layer of 4 routed experts (softmax, greedy top-2, not renormalised) plus 1 shared expert.
    "deepseek_v2": TinySpec(
        "DeepseekV2Config",
        {**_DECODER, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 16,
         "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "head_dim": 8,
         "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
         "moe_intermediate_size": 32, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
         "norm_topk_prob": False, "routed_scaling_factor": 1.0, "rope_parameters": _rope(10000.0)},
        "DeepseekV2ForCausalLM",
        {},
    ),
    # Granite: llama with multipliers on attention scores, embeddings, residual branches and logits.
    "granite": TinySpec(
        "GraniteConfig",
        {**_DECODER, "attention_multiplier": 0.2, "embedding_multiplier": 4.0, "residual_multiplier": 0.5,
         "logits_scaling": 2.0, "rope_parameters": _rope(10000.0)},
        "GraniteForCausalLM",
        {},
    ),
    # Command-R: parallel block under one bias-free LayerNorm, interleaved rotary pairs, tied
    # embeddings, logits scaled by logit_scale.
    "cohere": TinySpec(
        "CohereConfig",
        {**_DECODER, "logit_scale": 0.25, "use_qk_norm": False, "tie_word_embeddings": True,
         "rope_parameters": _rope(10000.0)},
        "CohereForCausalLM",
        {},
    ),
    # StableLM 2: LayerNorms with biases, a quarter of each head rotated, q/k/v biases.
    "stablelm": TinySpec(
        "StableLmConfig",
        {**_DECODER, "use_qkv_bias": True, "qk_layernorm": False, "use_parallel_residual": False,
         "rope_parameters": _rope(10000.0, partial_rotary_factor=0.25)},
        "StableLmForCausalLM",
        {},
    ),
    # OLMo2: q/k RMSNorm over the whole projection (not per head); biases enabled on purpose.
    "olmo2": TinySpec(
        "Olmo2Config",
        {**_DECODER, "attention_bias": True, "rope_parameters": _rope(10000.0)},
        "Olmo2ForCausalLM",
        {},
    ),
}

# Module names (second-to-last component of a parameter name) whose bias is an attention
# q/k/v (or fused qkv) bias. Used only to give those biases a larger std; which tensor plays
# which role is the arch/ registry's business, not this file's.
_QKV_BIAS_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "query", "key", "value"}
)
_QKV_BIAS_STD = 0.5
_OTHER_BIAS_STD = 0.05

# --- tokenizer --------------------------------------------------------------------------------

# A small multilingual corpus: English prose, Chinese, Python and emoji, so byte-level BPE learns
# merges across 1-, 3- and 4-byte UTF-8 sequences and round-trip tests exercise all of them.
_CORPUS = [
    "The attention layer projects every token into a query, a key and a value. "
    "The query of one token is compared with the keys of all the tokens before it, "
    "and the softmax of those scores weights the values that are summed into the output.",
    "A bias added to the key is constant across the keys when positions are absolute, so the "
    "softmax ignores it; with rotary position embeddings the bias is rotated with the key and "
    "the score depends on the distance between the two tokens.",
    "Checkpoints are stored as safetensors files: a small JSON header that names each tensor, "
    "its dtype, its shape and its byte range, followed by the raw little-endian data.",
    "Quantized GGUF files store the same tensors in blocks, each block with its own scale, "
    "and a key-value table of metadata that describes the model and its tokenizer.",
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "注意力机制把每个词映射为查询、键和值。模型的权重保存在文件中，偏置项也是权重的一部分。",
    "我们在小模型上测试转换和验证，确保输出与原始模型一致。今天天气很好，我们去公园散步吧。",
    "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n    s = sum(e)\n"
    "    return [v / s for v in e]\n",
    "class Linear:\n    def __init__(self, weight, bias=None):\n        self.weight = weight\n"
    "        self.bias = bias\n\n    def __call__(self, x):\n        y = x @ self.weight.T\n"
    "        if self.bias is not None:\n            y = y + self.bias\n        return y\n",
    "for i in range(10):\n    print(f\"layer {i}: {norm[i]:.4f}\")\n",
    "Great work! 🎉 The model converted cleanly 🚀 and every test passed ✅. Coffee time ☕😀",
]

# Deliberately not multiples of 64: the model's vocab is rounded up (as real checkpoints pad
# their embedding to a multiple of 64/128), so embedding rows beyond len(tokenizer) exist and
# converters must cope with model vocab != tokenizer vocab.
_BPE_VOCAB_SIZE = 420  # -> model vocab 448
_WORDPIECE_VOCAB_SIZE = 360  # -> model vocab 384
_ENDOFTEXT, _IM_START, _IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_BPE_SPECIALS = [_ENDOFTEXT, _IM_START, _IM_END]
_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_names() -> list[str]:
    """All buildable names, in table order (stable, so test ids are stable)."""
    return list(SPECS)


def spec_fingerprint(name: str, *, seed: int = 0) -> str:
    """Short hash of everything that decides the bytes :func:`build_tiny` writes for ``name``.

    Why: fixture caches key on this. It covers the spec row, the seed and this file's own source
    (corpus, bias stds, tokenizer recipe, build steps), so any edit here invalidates cached
    builds instead of letting tests run on stale fixtures; rebuilding all of them takes seconds.
    transformers' version is keyed separately by the cache, since its init and serialization
    decide the bytes too.
    """
    spec = _spec(name)
    payload = json.dumps(
        {
            "name": name,
            "spec": spec._asdict(),
            "seed": seed,
            "builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _require_transformers_5(version: str) -> None:
    """transformers 4 would silently ignore `rope_parameters` (theta 1e6 -> 10000, GPT-NeoX's
    partial rotary -> its default): refuse rather than build a subtly different model."""
    if int(version.split(".")[0]) < 5:
        raise RuntimeError(
            f"ckpt_surgeon.tiny needs transformers>=5 (its specs use the v5 `rope_parameters` "
            f"spelling); found transformers {version}. Upgrade: pip install -U transformers"
        )


def build_tiny(name: str, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build the tiny random model ``name`` and save it as a Hugging Face folder in ``out_dir``.

    Writes ``config.json``, ``model.safetensors`` (or shards + index when the spec asks),
    ``generation_config.json`` for generative models, and a tokenizer that
    ``AutoTokenizer.from_pretrained(out_dir)`` loads offline. Returns ``Path(out_dir)``.

    Weights keep transformers' own init under ``torch.manual_seed(seed)``; every bias parameter
    is then refilled from a separate generator seeded with ``seed`` so biases are non-zero
    (transformers initialises them to zero, which would make bias surgery a no-op to test).
    The caller owns atomicity: build into a temp dir and rename (see ``fixtures/``).
    """
    import copy

    import torch
    import transformers

    spec = _spec(name)
    _require_transformers_5(transformers.__version__)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok_kind = _TOKENIZER_KINDS[spec.options.get("tokenizer", "bpe")]
    tokenizer = tok_kind.make()
    # Ids for config.json / generation_config.json are read from the tokenizer so the three
    # files cannot disagree.
    token_ids = tok_kind.special_ids(tokenizer)

    # deepcopy: config constructors mutate nested dicts (rope_parameters) in place, and SPECS
    # must stay pristine for the next build and for spec_fingerprint.
    kwargs = copy.deepcopy(spec.config_kwargs)
    kwargs["vocab_size"] = _round_up(len(tokenizer), 64)
    kwargs.update(token_ids)
    config = getattr(transformers, spec.config_class)(**kwargs)

    torch.manual_seed(seed)
    model_cls = getattr(transformers, spec.model_class)
    # eager attention: the reference path for later forward-pass comparisons (sdpa kernels
    # may pick different reduction orders).
    model = model_cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    _fill_biases(model, seed)

    if model.can_generate():
        model.generation_config = transformers.GenerationConfig(**token_ids)

    save_kwargs = {}
    if "max_shard_size" in spec.options:
        save_kwargs["max_shard_size"] = spec.options["max_shard_size"]
    with quiet_transformers():
        model.save_pretrained(out, **save_kwargs)
        tokenizer.save_pretrained(out)
    tok_kind.save_extra(tokenizer, out)
    return out


# --- internals --------------------------------------------------------------------------------


def _spec(name: str) -> TinySpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(SPECS)}") from None


def _round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


def _fill_biases(model: Any, seed: int) -> None:
    """Overwrite every bias *parameter* with seeded N(0, std) noise.

    Buffers (GPT-2's causal-mask ``attn.bias`` in older versions) are not parameters and are
    left alone. Parameters are visited in ``named_parameters`` order, which is the module
    definition order and therefore stable, so the fill is deterministic.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if not pname.endswith(".bias"):
                continue
            parts = pname.split(".")
            module = parts[-2] if len(parts) >= 2 else ""
            std = _QKV_BIAS_STD if module in _QKV_BIAS_MODULES else _OTHER_BIAS_STD
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            param.copy_(noise.to(param.dtype))


def _bpe_special_ids(tokenizer: Any) -> dict[str, int]:
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _bert_special_ids(tokenizer: Any) -> dict[str, int]:
    # BertConfig has no meaningful bos/eos; only the pad id is used (position/padding masks).
    return {"pad_token_id": tokenizer.pad_token_id}


def _no_extra_files(tokenizer: Any, out: Path) -> None:
    return None


def _write_vocab_txt(tokenizer: Any, out: Path) -> None:
    """Real BERT folders ship ``vocab.txt`` next to ``tokenizer.json`` (older slow tokenizers
    and some converters read only that); transformers 5's ``save_pretrained`` does not write it."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    (out / "vocab.txt").write_text("".join(tok + "\n" for tok, _ in vocab), encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _trained_bpe_json() -> str:
    """Train the byte-level BPE once per process; returns its JSON so each caller gets a
    fresh, independent ``Tokenizer`` object.

    The BPE trainer breaks count ties by pair order, so its output is the same in every process
    (checked: identical JSON across 16 concurrent processes; ``test_tiny`` rebuilds in a fresh
    process and compares bytes). The WordPiece trainer is *not*, see :func:`_wordpiece_vocab`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=_BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return tok.to_str()


def _bpe_tokenizer() -> Any:
    """Byte-level BPE with ChatML specials, Qwen2-like: bos/pad/unk = <|endoftext|>,
    eos = <|im_end|> (the turn terminator generation stops on)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe_json()),
        bos_token=_ENDOFTEXT,
        eos_token=_IM_END,
        pad_token=_ENDOFTEXT,
        unk_token=_ENDOFTEXT,
        additional_special_tokens=[_IM_START, _IM_END],
        chat_template=_CHATML_TEMPLATE,
        model_max_length=256,
    )


@functools.lru_cache(maxsize=None)
def _wordpiece_vocab() -> tuple[str, ...]:
    """A deterministic uncased WordPiece vocab built from the corpus, in id order.

    Why not ``tokenizers.trainers.WordPieceTrainer``: its output (ids *and* which sub-words it
    keeps) changes from process to process (Rust hash-map iteration order breaks ties), which
    would make the fixture bytes irreproducible. Instead: specials, then every character and
    its ``##`` continuation (so any corpus word can always be spelled out), then whole words by
    descending frequency (ties alphabetical) until the vocab is full.
    """
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: dict[str, int] = {}
    for text in _CORPUS:
        for word, _span in pre.pre_tokenize_str(norm.normalize_str(text)):
            counts[word] = counts.get(word, 0) + 1
    chars = sorted({c for word in counts for c in word})
    vocab = list(_BERT_SPECIALS) + chars + ["##" + c for c in chars]
    for word, _n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= _WORDPIECE_VOCAB_SIZE:
            break
        if word not in vocab:
            vocab.append(word)
    return tuple(vocab)


def _wordpiece_tokenizer() -> Any:
    """BERT-style uncased WordPiece; transformers 5's ``BertTokenizer`` is the fast
    (tokenizers-backed) class, ``BertTokenizerFast`` is an alias of it."""
    from transformers import BertTokenizer

    vocab = {tok: i for i, tok in enumerate(_wordpiece_vocab())}
    return BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=128)


class _TokenizerKind(NamedTuple):
    make: Callable[[], Any]
    special_ids: Callable[[Any], dict[str, int]]
    save_extra: Callable[[Any, Path], None]


_TOKENIZER_KINDS = {
    "bpe": _TokenizerKind(_bpe_tokenizer, _bpe_special_ids, _no_extra_files),
    "wordpiece": _TokenizerKind(_wordpiece_tokenizer, _bert_special_ids, _write_vocab_txt),
}
