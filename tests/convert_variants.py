"""Models and texts for the converter tests (tests/test_convert*.py, tests/test_llamacpp.py).

Most families are the tiny fixtures as they are.  A few need a variant that llama.cpp can run:

* ``qwen3``: the fixture enables ``attention_bias``, which also puts a bias on ``o_proj``;
  llama.cpp's qwen3 graph has no slot for it (the converter refuses such a model), and real
  Qwen3 checkpoints have no attention biases at all, so the variant has none.
* ``gemma3``: llama.cpp hard-codes "every 6th layer global" (the 2-layer fixture alternates),
  has no ``o_proj`` bias, and Gemma stores its norm weights as ``w`` with ``1 + w`` applied —
  random non-zero norms make a wrong shift visible.  The variant has 6 layers, no attention
  biases, and norm weights ~ N(0, 0.3).

Variants are built with transformers from the fixture's config (seeded) and carry the
fixture's tokenizer files.  ``with_dtype`` saves a float16 / bfloat16 copy.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

# English, Chinese, code (digits, indentation, operators) and emoji; starts with a letter:
# llama.cpp's SentencePiece path always prepends "▁" while tokenizers' Metaspace does not when
# the text already starts with a space, a known difference that is not the converter's.
MULTILINGUAL = ("The attention layer projects every token into a query, a key and a value. "
                "注意力机制把每个词映射为查询、键和值。今天天气很好！\n"
                "def softmax(x):\n    m = max(x)\n    return [math.exp(v - m) for v in x]  # 2024-06-01, 3.14\n"
                "Great work! 🎉 The model converted cleanly 🚀 ☕😀")

# >= 128 tokens for teacher-forced comparisons on a real model.
LONG_TEXT = (
    "The history of natural language processing generally started in the 1950s, although work can be found "
    "from earlier periods. In 1950, Alan Turing published an article titled Computing Machinery and "
    "Intelligence which proposed what is now called the Turing test as a criterion of intelligence. The "
    "Georgetown experiment in 1954 involved fully automatic translation of more than sixty Russian sentences "
    "into English. The authors claimed that within three or four years, machine translation would be a "
    "solved problem. However, real progress was much slower, and after the ALPAC report in 1966, which found "
    "that ten years of research had failed to fulfill the expectations, funding for machine translation was "
    "dramatically reduced. Little further research in machine translation was conducted until the late "
    "1980s when the first statistical machine translation systems were developed. " + MULTILINGUAL)

_SHORT_FACTORS = [1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7]
_LONG_FACTORS = [1.0, 1.2, 1.9, 3.1, 5.0, 8.3, 12.7, 20.5]
_DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                  "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 64}
# name -> (fixture, config overrides, norm noise std)
VARIANTS = {
    "qwen3": ("qwen3", {"attention_bias": False}, 0.0),
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "attention_bias": False,
                          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}, 0.3),
    # Gemma 3 4B / 12B / 27B's RoPE: linear factor 8 on the full-attention layers, the sliding ones
    # plain (transformers 5 nests rope parameters per layer type); weights 5x wide as the other
    # RoPE variants
    "gemma3_linear": ("gemma3", {"num_hidden_layers": 6, "attention_bias": False,
                                 "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                                 "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                        "rope_theta": 1000000.0},
                                                     "sliding_attention": {"rope_type": "default",
                                                                           "rope_theta": 10000.0}},
                                 "initializer_range": 0.1}, 0.3),
    # Gemma 2 as released: no attention biases (llama.cpp's gemma2 has no attn_output bias slot);
    # norm weights ~ N(0, 0.3) make a wrong 1 + w shift visible
    "gemma2": ("gemma2", {"attention_bias": False}, 0.3),
    # the same with caps small enough that cap * tanh(x / cap) bends every logit and attention score
    # (the released 50 / 30 barely touch a tiny random model's values): llama.cpp must apply both
    "gemma2_softcap": ("gemma2", {"attention_bias": False, "initializer_range": 0.04, "attn_logit_softcapping": 1.0,
                                  "final_logit_softcapping": 2.0}, 0.3),
    # llama.cpp's phi2 is MHA (Phi2Model writes head_count_kv = head_count), as Phi-2 is
    "phi": ("phi", {"num_key_value_heads": 4}, 0.0),
    # llama.cpp's olmo2 has no attn_output bias slot (real OLMo 2 has no attention biases)
    "olmo2": ("olmo2", {"attention_bias": False}, 0.0),
    # llama.cpp's falcon graph has no linear biases (the fixture has bias=True) and the fixture's
    # ffn_hidden_size 128 is not the 4 * hidden that FalconModel writes; Falcon-40B's layout
    "falcon_nobias": ("falcon", {"bias": False, "ffn_hidden_size": 256}, 0.0),
    # Falcon-7B's layout: multi_query (one kv head, [Q; K; V]), one input_layernorm
    "falcon_mq_nobias": ("falcon_mq", {"bias": False, "ffn_hidden_size": 256}, 0.0),
    # Falcon2-11B's layout: new decoder, GQA, one input_layernorm (num_ln_in_parallel_attn 1)
    "falcon_11b": ("falcon", {"bias": False, "ffn_hidden_size": 256, "num_ln_in_parallel_attn": 1}, 0.0),
    # the old MHA layout (per-head [h, 3, d], as Falcon-RW), parallel as llama.cpp runs it
    "falcon_mha": ("falcon_old", {"bias": False, "ffn_hidden_size": 256, "parallel_attn": True}, 0.0),
    # llama.cpp (0.3.36) tells DeepSeek-V2-Lite (no query LoRA) by its 27 layers (llama-model.cpp
    # is_lite = n_layer == 27) and otherwise requires attention.q_lora_rank: V2-Lite's depth
    "deepseek_v2_lite": ("deepseek_v2", {"num_hidden_layers": 27}, 0.0),
    # Llama 3.1's rope scaling (rope_type llama3), which llama.cpp's converter writes as the
    # rope_freqs.weight tensor; high_freq_factor 16 / original 4096 leave 2 of the 8 rotary
    # frequencies interpolated (Llama 3.1's 4 / 8192 do that for head_dim 128, not 16), so
    # GGUF -> HF can recover the parameters; max_position_embeddings as Llama 3.1's is 16x original
    "llama3_rope": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 16.0,
                                                  "original_max_position_embeddings": 4096},
                              "max_position_embeddings": 65536, "initializer_range": 0.1}, 0.0),
    # yarn (as Qwen2.5's long-context configs: factor 4 over the original context) and linear
    # position interpolation; original 64 < the 192-token test text, so both change every logit
    "qwen2_yarn": ("qwen2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 64},
                             "initializer_range": 0.1}, 0.0),
    # Qwen3's long-context configs are yarn too (no attention biases, as the qwen3 variant)
    "qwen3_yarn": ("qwen3", {"attention_bias": False,
                             "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 64},
                             "initializer_range": 0.1}, 0.0),
    "llama_linear": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                               "initializer_range": 0.1}, 0.0),
    # Phi-3's long-context RoPE (Phi-3-128k, Phi-3.5-mini, Phi-4-mini: rope_type longrope, 32x the
    # original context): per-dimension short / long factors as released ones go (short near 1, long
    # up to ~20).  original 512 = llama-cpp's n_ctx in the tests, so the 192-token text runs the short
    # factors in both (llama.cpp picks by n_ctx, padded to 256s, transformers by length) and the
    # 752-token LONG_TEXT with n_ctx > 512 the long ones; weights 5x wide as the other RoPE variants
    "phi3_longrope": ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 1.0,
                                                   "short_factor": _SHORT_FACTORS, "long_factor": _LONG_FACTORS,
                                                   "original_max_position_embeddings": 512},
                               "max_position_embeddings": 16384, "original_max_position_embeddings": 512,
                               "initializer_range": 0.1}, 0.0),
    # Phi-4-mini's: longrope on 3/4 of each head (partial_rotary_factor 0.75: 12 of 16 dims, 6 factors),
    # tied embeddings as released
    "phi4mini_longrope": ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.75,
                                                       "short_factor": _SHORT_FACTORS[:6], "long_factor": _LONG_FACTORS[:6],
                                                       "original_max_position_embeddings": 512},
                                   "max_position_embeddings": 16384, "original_max_position_embeddings": 512,
                                   "tie_word_embeddings": True, "initializer_range": 0.1}, 0.0),
    # Phi-3.5-MoE's: the same factors, short_mscale the converter's sqrt(1 + ln 32 / ln 512) (as the
    # release's 1.1902 is for 4096) and long_mscale above it (as the release's 1.2432)
    "phimoe_longrope": ("phimoe", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                       "short_factor": _SHORT_FACTORS, "long_factor": _LONG_FACTORS,
                                                       "short_mscale": math.sqrt(1 + math.log(32) / math.log(512)),
                                                       "long_mscale": 1.3, "original_max_position_embeddings": 512},
                                   "max_position_embeddings": 16384, "original_max_position_embeddings": 512,
                                   "initializer_range": 0.1}, 0.0),
    # DeepSeek-V2 / V2-Lite's yarn as released (factor 40, mscale = mscale_all_dim = 0.707, beta 32 / 1)
    # over an original 64 < the 192-token text; the 27-layer form is the one llama.cpp runs (see
    # deepseek_v2_lite); weights 5x wide as the other RoPE variants
    "deepseek_v2_yarn": ("deepseek_v2", {"rope_parameters": _DEEPSEEK_YARN, "initializer_range": 0.1}, 0.0),
    "deepseek_v2_lite_yarn": ("deepseek_v2", {"num_hidden_layers": 27, "rope_parameters": _DEEPSEEK_YARN,
                                              "initializer_range": 0.1}, 0.0),
    # the fixture's alternating sliding / full layers, which llama.cpp cannot express
    "gemma3_alternating": ("gemma3", {"attention_bias": False}, 0.0),
    # quantization (tests/test_quantize.py): rows that are whole 256-value super-blocks, so the
    # k-quant / IQ types are used rather than their fallbacks, and 8 layers, so llama.cpp's
    # "more bits" layers (first / last eighth, every third) differ from the others.  GQA 4 (qwen2)
    # and 1 (llama) take different attn_v branches; mixtral's 8 experts and qwen2_moe's 4 take the
    # n_expert == 8 and n_expert >= 4 branches.
    "qwen2_q256": ("qwen2", {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
                             "num_attention_heads": 4, "num_key_value_heads": 1,
                             "layer_types": ["full_attention"] * 8}, 0.0),
    "llama_q256": ("llama", {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 8,
                             "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64}, 0.0),
    "mixtral_q256": ("mixtral", {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 4,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
                                 "head_dim": 64}, 0.0),
    "qwen2_moe_q256": ("qwen2_moe", {"hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 256,
                                     "shared_expert_intermediate_size": 256, "num_hidden_layers": 4,
                                     "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
                                     "layer_types": ["full_attention"] * 4}, 0.0),
}
# Variants whose files are then spelled as the Hub's (the reference converter reads a Phi-3 vocabulary
# only from tokenizer.model unless the tokenizer is declared BPE: see phi3_bpe / phimoe_hub below).
_BPE = {"tokenizer_config.json": {"tokenizer_class": "GPT2Tokenizer"}}
VARIANT_FILES = {"phi3_longrope": _BPE, "phi4mini_longrope": _BPE,
                 "phimoe_longrope": dict(_BPE, **{"config.json": {"architectures": ["PhiMoEForCausalLM"]}})}
# name -> (fixture, {json file: entries added to it}): the same weights with files spelled as Hub
# checkpoints spell them.  gpt2_hub: Hub GPT-2 configs carry n_ctx (= n_positions), which
# llama.cpp's GPT2Model reads and transformers 5's GPT2Config no longer saves.  phi3_bpe: Phi-4's
# layout (phi3 architecture, byte-level BPE declared as GPT2Tokenizer), the tokenizer llama.cpp's
# Phi3MiniModel reads from tokenizer.json instead of a SentencePiece tokenizer.model.
CONFIG_VARIANTS = {
    "gpt2_hub": ("gpt2", {"config.json": {"n_ctx": 256}}),
    "phi3_bpe": ("phi3", {"tokenizer_config.json": {"tokenizer_class": "GPT2Tokenizer"}}),
    # phimoe_hub: Phi-3.5-MoE's config.json names its class PhiMoEForCausalLM (the name llama.cpp's
    # PhiMoeModel registers; transformers 5 saves PhimoeForCausalLM), and the tokenizer declared as
    # BPE as for phi3_bpe (PhiMoeModel is a Phi3MiniModel)
    "phimoe_hub": ("phimoe", {"config.json": {"architectures": ["PhiMoEForCausalLM"]},
                              "tokenizer_config.json": {"tokenizer_class": "GPT2Tokenizer"}}),
}
# Families the HF -> GGUF -> llama.cpp path covers (issue: llama, mistral, qwen2, qwen3, phi3, gpt2).
LLAMACPP_FAMILIES = ("qwen2", "qwen2_long", "qwen2_yarn", "llama", "llama_bias", "llama3_rope", "llama_linear", "qwen3_yarn", "mistral", "qwen3", "phi3", "gpt2", "gemma3",
                     "qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "starcoder2", "olmo2", "granite", "phi", "gpt_neox",
                     "cohere", "stablelm", "bloom", "gemma2", "gemma2_softcap", "gemma2_spm", "falcon_nobias",
                     "falcon_mq_nobias", "falcon_11b", "falcon_mha", "phimoe", "deepseek_v2_lite", "phi3_longrope",
                     "phimoe_longrope", "gemma3_linear", "phi4mini_longrope")
# Config keys of other families' classes (and one made up), each with a plausible but wrong value:
# a converter that reads one where the model class does not writes another file, or fails.
STRAYS = {
    "ckpt_surgeon_made_up": 7,
    "num_key_value_heads": 1, "num_kv_heads": 1, "n_head_kv": 1, "multi_query_group_num": 1, "multi_query": True,
    "head_dim": 8, "num_attention_heads": 3, "n_head": 3, "num_heads": 3, "n_heads": 3,
    "hidden_size": 40, "n_embd": 40, "d_model": 40, "dim": 40,
    "num_hidden_layers": 5, "n_layer": 5, "num_layers": 5, "n_layers": 5,
    "max_position_embeddings": 24, "n_positions": 24, "seq_length": 24, "max_seq_len": 24, "n_ctx": 24,
    "intermediate_size": 40, "n_inner": 40, "ffn_hidden_size": 40,
    "rope_theta": 1234.0, "rotary_emb_base": 1234.0, "rope_base": 1234.0, "rope_local_base_freq": 1234.0,
    "partial_rotary_factor": 0.5, "rotary_pct": 0.5, "rotary_dim": 4,
    "rms_norm_eps": 0.25, "layer_norm_eps": 0.25, "layer_norm_epsilon": 0.25, "norm_eps": 0.25, "norm_epsilon": 0.25,
    "sliding_window": 8, "original_max_position_embeddings": 12,
    "num_experts": 3, "num_local_experts": 3, "n_routed_experts": 3, "num_experts_per_tok": 1,
    "moe_intermediate_size": 40, "shared_expert_intermediate_size": 40, "norm_topk_prob": True,
    "attention_multiplier": 0.5, "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
    "logits_scaling": 3.0, "logit_scale": 3.0, "use_parallel_residual": False,
    "attn_logit_softcapping": 5.0, "final_logit_softcapping": 5.0, "query_pre_attn_scalar": 3,
    "first_k_dense_replace": 1, "q_lora_rank": 8, "kv_lora_rank": 8, "n_shared_experts": 1,
    "routed_scaling_factor": 2.0, "n_group": 2, "topk_group": 1,
    "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 4,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "tokenizer.model")


def copy_tokenizer(src: Path, dst: Path) -> None:
    for f in TOKENIZER_FILES:
        if (Path(src) / f).is_file():
            shutil.copy(Path(src) / f, Path(dst) / f)


def build_variant(tiny, name: str, out: Path, *, seed: int = 0) -> Path:
    """The model for family ``name``: the fixture itself, or the variant described above."""
    if name in CONFIG_VARIANTS:
        return _config_variant(tiny, name, Path(out))
    if name in TOKENIZER_VARIANTS:
        return TOKENIZER_VARIANTS[name](tiny, Path(out))
    if name not in VARIANTS:
        return tiny(name)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    base_name, overrides, norm_std = VARIANTS[name]
    base = tiny(base_name)
    out = Path(out)
    if (out / "config.json").is_file():
        return out
    cfg = AutoConfig.from_pretrained(base)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif norm_std and "norm" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * norm_std)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    copy_tokenizer(base, tmp)
    _edit_files(tmp, VARIANT_FILES.get(name, {}))
    tmp.rename(out)
    return out


def _edit_files(folder: Path, edits: dict) -> None:
    for fname, entries in edits.items():
        data = read_json(folder / fname)
        data.update(entries)
        (folder / fname).write_text(json.dumps(data, indent=2) + "\n")


def _config_variant(tiny, name: str, out: Path) -> Path:
    base_name, edits = CONFIG_VARIANTS[name]
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(tiny(base_name), tmp)
    _edit_files(tmp, edits)
    tmp.rename(out)
    return out


def with_dtype(src: Path, dtype: str, out: Path) -> Path:
    """``src`` saved in ``dtype`` (float32 | float16 | bfloat16), tokenizer files included."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype == "float32":
        return Path(src)
    out = Path(out)
    if (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    copy_tokenizer(src, tmp)
    tmp.rename(out)
    return out


def train_spm(prefix: Path, vocab_size: int = 700, **ids) -> Path:
    """A SentencePiece BPE model with byte fallback trained on the fixtures' corpus
    (``prefix``.model); ``ids``: the special ids / pieces and options that differ per family (a Unigram model:
    ``model_type="unigram"``)."""
    import sentencepiece as spm

    from ckpt_surgeon.tiny import _CORPUS

    opts = dict(model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
                normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
                hard_vocab_limit=False, minloglevel=2)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_CORPUS * 3), model_prefix=str(prefix),
                                   vocab_size=vocab_size, **{**opts, **ids})
    return Path(f"{prefix}.model")


def _spm_tokenizer(out: Path, tokenizer_class, vocab_size: int = 700, **ids):
    """(work folder beside ``out`` holding ``sp.model``, the transformers tokenizer ``tokenizer_class``
    builds from it)."""
    work = out.with_name(out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    (work / "spm").mkdir(parents=True)
    train_spm(work / "sp", vocab_size=vocab_size, **ids)
    shutil.copy(work / "sp.model", work / "spm" / "tokenizer.model")
    return work, tokenizer_class.from_pretrained(work / "spm")


def spm_llama(tiny, out: Path) -> Path:
    """A tiny llama whose tokenizer is SentencePiece BPE with byte fallback (Llama-2 style).

    The vocabulary is trained with the ``sentencepiece`` library on the fixtures' corpus and
    turned into ``tokenizer.json`` by transformers' own SentencePiece converter
    (``LlamaTokenizer.from_pretrained`` on a folder holding ``tokenizer.model``), so nothing in
    it comes from the code under test.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    work, tok = _spm_tokenizer(out, LlamaTokenizer, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    cfg = AutoConfig.from_pretrained(tiny("llama"))
    cfg.vocab_size = (len(tok) + 63) // 64 * 64
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(work, ignore_errors=True)
    tmp.rename(out)
    return out


def spm_gemma2(tiny, out: Path) -> Path:
    """The ``gemma2`` variant with a SentencePiece tokenizer as Gemma ships one (``tokenizer.model``,
    BPE with byte fallback, no dummy prefix, ids pad 0 / eos 1 / bos 2 / unk 3 / mask 4), which llama.cpp's
    ``Gemma2Model.set_vocab`` requires (``_set_vocab_sentencepiece``: no tokenizer.json path).

    Trained with the ``sentencepiece`` library on the fixtures' corpus; ``tokenizer.json`` is
    transformers' own conversion (``GemmaTokenizer.from_pretrained`` on the folder holding
    ``tokenizer.model``), so nothing in it comes from the code under test.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GemmaTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    work, tok = _spm_tokenizer(out, GemmaTokenizer, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
                               eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>", control_symbols=["<mask>"],
                               add_dummy_prefix=False)
    base = build_variant(tiny, "gemma2", out.with_name(out.name + ".base"))
    cfg = AutoConfig.from_pretrained(base)
    cfg.vocab_size = (len(tok) + 63) // 64 * 64
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = 0, 1, 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * VARIANTS["gemma2"][2])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.copy(work / "sp.model", tmp / "tokenizer.model")
    shutil.rmtree(work, ignore_errors=True)
    tmp.rename(out)
    return out


def named_templates_qwen2(tiny, out: Path) -> Path:
    """tiny qwen2 with a named chat template beside its default (transformers' additional_chat_templates/)."""
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(tiny("qwen2"), tmp)
        (tmp / "additional_chat_templates").mkdir()
        (tmp / "additional_chat_templates" / "tool_use.jinja").write_text(
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' (tools)\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}", encoding="utf-8")
        tmp.rename(out)
    return out


# name -> builder: variants whose tokenizer is rebuilt (so the vocabulary size changes too), or whose tokenizer
# files are changed
TOKENIZER_VARIANTS = {"gemma2_spm": spm_gemma2, "qwen2_named_templates": named_templates_qwen2}


def hf_tensor_bytes(folder: Path) -> dict:
    """name -> (dtype, shape, raw bytes) of every tensor in an HF folder (our validated reader)."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(folder) as ck:
        return {n: (i.dtype, tuple(i.shape), ck.read_raw(n)) for n, i in ck.tensors.items()}


def gguf_metadata(path: Path) -> dict:
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(path) as ck:
        return dict(ck.metadata), {n: (i.dtype, tuple(i.shape)) for n, i in ck.tensors.items()}


def read_json(p: Path) -> dict:
    return json.loads(Path(p).read_text(encoding="utf-8"))


def smollm_hf(smollm_gguf: Path, root: Path) -> Path:
    """SmolLM2-135M-Instruct Q4_1 converted by us to an HF folder (float32), built once per
    session directory and shared by the modules that need it."""
    from ckpt_surgeon.conversion import gguf_to_hf
    out = Path(root) / "smollm2-hf"
    if not (out / "config.json").is_file():
        gguf_to_hf(smollm_gguf, out, dtype="float32")
    return out
