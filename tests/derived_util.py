"""What the derived-conversion tests (test_convert_derived, test_gguf_to_hf_derived) and
benchmarks/zoo_derived.py share: llama.cpp's converter source named for the module, and a zoo folder
as the model's Hub folder has it where llama.cpp's class reads it: a tokenizer (the zoo carries none), the class
llama.cpp registers, config keys and values, tensor names and storage in the Hub's form (the tables below)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from llamacpp_src import llamacpp_source

from fixtures.build_fixtures import fixture_path, zoo_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# what the model's own Hub folder has and the zoo folder lacks, which llama.cpp's class reads (both converters
# read the same folder):
# special tokens a class looks up by name (llama.cpp's _set_vocab_glm: bos [gMASK], eot <|user|>, eom
# <|observation|>; GLM-4 / ChatGLM's set_vocab: <|user|>; Solar Open's: <unk>, <|startoftext|>)
_GLM = ("[gMASK]", "<|user|>", "<|observation|>")
SPECIALS = {"glm4_moe": _GLM, "glm4_moe_lite": _GLM, "glm_moe_dsa": _GLM, "glm4": _GLM, "glm": _GLM,
            "solar_open": ("<unk>", "<|startoftext|>"), "dots3_note": ("<|endofassistant|>",)}
# config keys the Hub's config.json has and transformers' config class does not write (MiniMaxM2Model reads
# rotary_dim; MiniMax-M2's own config says 64 of head_dim 128; here the whole head, as transformers'
# MiniMaxM2Config rotates it; GPT-SW3's config.json keeps GPT-2's n_ctx, which GPT2Model.set_gguf_parameters reads;
# Qwen4Exp's class writes the indexer's sizes, None in transformers' config of a model with no indexed layer, as
# the tiny one is: tiny values, metadata only)
CONFIG_EXTRA = {"minimax_m2": {"rotary_dim": 16},
                "gpt-sw3": {"n_ctx": 1024},
                "qwen4_exp": {"indexer_n_heads": 2, "indexer_head_dim": 16, "indexer_budget": 64,
                              "indexer_compress_ratio": 4, "indexer_kv_heads": 1},
                # Hunyuan-A13B's config.json gives the expert width, the router's top-k and the shared experts per layer
                # (lists), which HunYuanMoEModel asserts uniform and reads; transformers' config has one top-k and its
                # experts are intermediate_size wide, with one shared MLP a layer
                "hunyuan_v1_moe": lambda cfg: {"moe_intermediate_size": [cfg["intermediate_size"]] * cfg["num_hidden_layers"],
                                               "moe_topk": [cfg["moe_topk"]] * cfg["num_hidden_layers"],
                                               "num_shared_expert": [1] * cfg["num_hidden_layers"]},
                # Cohere2Model reads rotary_pct (Command R7B rotates the whole head, as transformers' Cohere2 does);
                # FalconH1Model reads head_dim, which transformers' config derives (hidden / heads) and does not write
                "cohere2": {"rotary_pct": 1.0},
                "falcon_h1": lambda cfg: {"head_dim": cfg["hidden_size"] // cfg["num_attention_heads"]},
                # DeepSeek-V4's config.json: per-layer compress_ratios (0 = sliding window) and num_hash_layers,
                # which transformers' config reads into layer_types / mlp_layer_types; DeepseekV4Model reads the Hub's
                "deepseek_v4": lambda cfg: {"num_hash_layers": cfg["mlp_layer_types"].count("hash_moe"),
                                            "compress_ratios": [cfg["compress_rates"].get(t, 0)
                                                                for t in cfg["layer_types"]]},
                # Gemma4Model asks for the expert width (None: dense), which Gemma4TextConfig writes (null for the
                # dense models) and Gemma4UnifiedTextConfig, which has no MoE, does not
                "gemma4_unified": lambda cfg: {"text_config": {**cfg["text_config"], "moe_intermediate_size": None}},
                # Kimi-Linear's config.json groups the linear attention's sizes in linear_attn_config (layers
                # 1-indexed) and counts the leading dense layers (first_k_dense_replace), which transformers' config
                # reads and writes as its own keys (mlp_layer_types); KimiLinearModel reads the Hub's
                "kimi_linear": lambda cfg: {"linear_attn_config": {
                    "full_attn_layers": [i + 1 for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"],
                    "kda_layers": [i + 1 for i, t in enumerate(cfg["layer_types"]) if t == "linear_attention"],
                    "head_dim": cfg["linear_head_dim"], "num_heads": cfg["linear_num_heads"],
                    "short_conv_kernel_size": cfg["linear_conv_kernel_dim"]},
                    "first_k_dense_replace": next((i for i, t in enumerate(cfg["mlp_layer_types"]) if t != "dense"),
                                                  len(cfg["mlp_layer_types"]))},
                # nomic-embed-text-v1.5's config.json is its remote code's (GPT-2 style), which NomicBertModel reads
                # and asserts: positions as v1.5 (8192, trained 2048), and what transformers' NomicBert class is
                # (SwiGLU, bidirectional, post-norm, no projection biases, whole-head non-interleaved RoPE)
                "nomic_bert": {"n_positions": 8192, "max_trained_positions": 2048, "activation_function": "swiglu",
                               "causal": False, "prenorm": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
                               "mlp_fc2_bias": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
                               "rotary_emb_scale_base": None}}


def _dots3_release(cfg: dict) -> dict:
    """dots3-note's config.json as its release stores it (transformers' Dots3NoteConfig: "published checkpoints
    store the text configuration at the top level", with the sliding-window layers' MLA sizes as flat ``swa_*``
    keys, which Dots3NoteTextConfig normalises into ``per_layer_config``): the outer model type with the text keys
    flat, the DSA layers under their legacy name ``full_attention`` with ``use_dsa``, ``swa_*`` = a sliding layer's
    sizes as transformers' config gives them, the window as ``sliding_window_size``, the RoPE bases flat, the
    router as transformers' class runs it (sigmoid scores + correction bias: ``scoring_func`` sigmoid,
    ``topk_method`` noaux_tc), and the vision / audio sub-configs' one field the outer config checks against the
    text width (their adapters' output).  Dots3NoteModel reads these keys."""
    sliding = cfg["layer_types"].index("sliding_attention")
    sizes = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "head_dim",
             "qk_nope_head_dim", "v_head_dim", "qk_rope_head_dim")
    swa = {**{k: cfg[k] for k in sizes}, **cfg["per_layer_config"][str(sliding)]}
    rope = cfg["rope_parameters"]
    flat = {k: v for k, v in cfg.items() if k not in ("per_layer_config", "rope_parameters")}
    return {**flat, "model_type": "dots3_note", "use_dsa": True,
            "layer_types": ["full_attention" if t == "indexed_attention" else t for t in cfg["layer_types"]],
            **{f"swa_{k}": v for k, v in swa.items()}, "sliding_window_size": cfg["sliding_window"],
            "rope_theta": rope["indexed_attention"]["rope_theta"],
            "swa_rope_theta": rope["sliding_attention"]["rope_theta"],
            "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "vision_config": {"adapter_out_dim": cfg["hidden_size"]},
            "audio_config": {"adapter_out_dim": cfg["hidden_size"]}}


# the families whose Hub tokenizer is a module of their own (tokenizer_config.json auto_map; Hunyuan-A13B's
# tokenization_hy.HYTokenizer, tiktoken), which llama.cpp's class loads with trust_remote_code and reads as tiktoken
# (mergeable_ranks, special_tokens, vocab_size): convert needs --trust-remote-code for these folders
REMOTE_TOKENIZER = {"hunyuan_v1_moe": "tokenization_hy.HYTokenizer"}
_REMOTE_TOKENIZER_CODE = '''"""The folder's own tokenizer module, as Hunyuan ships one (tokenization_hy.py, named by tokenizer_config.json's
auto_map), for a tiny test model: the byte-level BPE of tokenizer.json, exposing what a tiktoken tokenizer exposes
and llama.cpp's HunYuanMoEModel reads (mergeable_ranks: each token's bytes -> its id, in id order; special_tokens;
vocab_size)."""
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode


class HYTokenizer(PreTrainedTokenizerFast):
    @property
    def special_tokens(self):
        return dict(self.get_added_vocab())

    @property
    def mergeable_ranks(self):
        byte = {ch: b for b, ch in bytes_to_unicode().items()}
        special = self.special_tokens
        ranked = sorted((i, tok) for tok, i in self.get_vocab().items() if tok not in special)
        return {bytes(byte[ch] for ch in tok): i for i, tok in ranked}     # in rank order, as a .tiktoken file

    @property
    def vocab_size(self):
        return len(self.get_vocab())
'''


# config.json replaced whole by the release's form of it (keys transformers writes and the release does not)
CONFIG_FORM = {"dots3_note": _dots3_release}
# tokenizer_config.json keys (DeepSeek-V3.2's class asserts add_bos_token, which its Hub tokenizer_config sets)
TOKENIZER_CONFIG = {"deepseek_v32": {"add_bos_token": True}}
# the families that ship a SentencePiece tokenizer (tokenizer.model, and tokenizer.json = transformers' conversion of
# it: BPE with byte fallback), which llama.cpp's class reads (_set_vocab_sentencepiece: Gemma, ERNIE 4.5, Nemotron,
# MiniCPM3, Jamba; gguf.LlamaHfVocab, which wants the byte-fallback BPE tokenizer.json: Gemma 4); value: the
# transformers tokenizer class that converts it and the special ids the family's own tokenizer has
_GEMMA_SPM = ("GemmaTokenizer", dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                                     bos_piece="<bos>", unk_piece="<unk>", add_dummy_prefix=False))
_LLAMA_SPM = ("LlamaTokenizer", dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
SPM = {"gemma": _GEMMA_SPM, "gemma4": _GEMMA_SPM, "gemma4_text": _GEMMA_SPM, "gemma4_unified": _GEMMA_SPM,
       "ernie4_5": _LLAMA_SPM, "ernie4_5_moe": _LLAMA_SPM, "nemotron": _LLAMA_SPM, "minicpm3": _LLAMA_SPM,
       "jamba": _LLAMA_SPM, "bitnet@1bitllm": _LLAMA_SPM,
       # XLM-RoBERTa's: a Unigram model (XLMRobertaModel's set_vocab asserts it) without byte fallback, fairseq's
       # ids, in sentencepiece.bpe.model
       "xlm-roberta": ("XLMRobertaTokenizer", dict(bos_id=0, pad_id=1, eos_id=2, unk_id=3, model_type="unigram",
                                                   byte_fallback=False), "sentencepiece.bpe.model")}
# tensors the Hub checkpoint carries and transformers' class does not build: Qwen3-Next's and Qwen3.5's
# multi-token-prediction block (``mtp.*``: one more full-attention decoder layer, ``fc`` over the concatenated
# embedding and hidden state, three norms), which llama.cpp's class requires (``_QwenMtpMixin``) and writes as a
# NextN layer
MTP = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
# routed experts the Hub checkpoint stores as MXFP4 (DeepSeek-V4: `layers.N.ffn.experts.E.wK.weight`, two E2M1 codes
# per byte, [rows, cols / 2], and `.scale`, one E8M0 exponent per 32 values, [rows, cols / 32]), which
# DeepseekV4Model repacks into ggml's MXFP4 and requires: seeded random codes, exponents near 2^0 (as
# tests/mxfp4_source.py makes gpt-oss's release layout), in place of the zoo's float experts
MXFP4_EXPERTS = {"deepseek_v4": r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$"}
# zoo types built again for conversion, from the zoo's own tiny config: {model type: (class, config values)}.
# The class is the one llama.cpp's converter registers where the zoo builds another (the zoo takes transformers'
# causal-LM class first, the encoders' Hub checkpoints are the base model: BertModel, RobertaModel, ...;
# ModernBertForMaskedLM's tied decoder leaves a `decoder.bias` llama.cpp's class cannot map); the values are the
# model's own where the zoo's differ and the class asserts them: the zoo turns every bias switch on, the models have
# none there (Cohere2's attention, LFM2's short convolution, Falcon-H1's projections, DeepSeek-V4's attention and
# MLPs: the class would drop a non-zero bias, index a 1-D one as a matrix, or refuse it), Mamba's d_inner =
# expand x hidden and its dt rank ceil(hidden / 16) ("auto"), which the shrink's feed-forward width broke; Bamba's
# attention layer indices (the Hub config lists them; without, the tiny model has no attention layer); EuroBERT's
# classifier pooling, where the config class's default "late" is not one llama.cpp writes ("mean" is one of the
# config's own values)
_MAMBA = lambda cfg: {"intermediate_size": cfg["expand"] * cfg["hidden_size"],        # noqa: E731
                      "time_step_rank": -(-cfg["hidden_size"] // 16)}
REBUILD = {"bert": ("BertModel", {}), "camembert": ("CamembertModel", {}), "roberta": ("RobertaModel", {}),
           "xlm-roberta": ("XLMRobertaModel", {}), "nomic_bert": ("NomicBertModel", {}),
           "eurobert": ("EuroBertModel", {"classifier_pooling": "mean"}), "modernbert": ("ModernBertModel", {}),
           "mamba": (None, _MAMBA), "falcon_mamba": (None, _MAMBA),
           "bamba": (None, lambda cfg: {"attn_layer_indices": [cfg["num_hidden_layers"] - 1]}),
           "cohere2": (None, {"attention_bias": False}), "cohere2_moe": (None, {"attention_bias": False}),
           "lfm2_moe": (None, {"conv_bias": False}),
           "deepseek_v4": (None, {"attention_bias": False, "mlp_bias": False}),
           "falcon_h1": (None, {"attention_bias": False, "mlp_bias": False, "projectors_bias": False,
                                "mamba_proj_bias": False}),
           # a second layout of a model type (key MODEL_TYPE@LAYOUT, the zoo's tiny MODEL_TYPE config): BitNet as
           # llama.cpp's BitnetModel maps it, 1bitLLM's architecture name, sub-norm names (RENAME) and tied
           # embeddings (its tensor list has no output matrix), where transformers' BitNet class is BitNet b1.58
           # 2B4T's layout (`attn_sub_norm` / `ffn_sub_norm`, at the same place in the block), which the class
           # cannot map (tests/test_convert_derived.py's refusal)
           "bitnet@1bitllm": ("BitNetForCausalLM", {"tie_word_embeddings": True, "attention_bias": False}),
           # dots3-note with a sliding-window layer, as the release has (the zoo's two layers are both DSA layers in
           # transformers' own schedule, full for i < 2): three layers, the schedule and the MLP types transformers'
           # config derives, the sliding layer's MLA sizes unlike the DSA layers' (head 16 = nope 8 + rope 8, kv rank
           # 16, v 8: the class splits each layer's kv_b_proj by its own kind's sizes)
           # Hunyuan-A13B: no attention biases; several experts, two routed (the zoo's shrink left one)
           "hunyuan_v1_moe": (None, {"attention_bias": False, "num_experts": 4, "moe_topk": 2}),
           "dots3_note": (None, {"num_hidden_layers": 3, "layer_types": None, "mlp_layer_types": None,
                                 "per_layer_config": {"2": {"head_dim": 16, "kv_lora_rank": 16, "v_head_dim": 8}}})}
# the architecture name a REBUILD layout's config.json carries, where it is not the class transformers builds
ARCHITECTURE = {"bitnet@1bitllm": "BitnetForCausalLM"}
# the families whose Hub tokenizer is WordPiece (BERT's vocab.txt), which llama.cpp's BERT classes read as such
# (NomicBertModel refuses any other)
WORDPIECE = ("bert", "nomic_bert")
# tensor names as the Hub spells them where transformers' save differs: Kimi-Linear's reverse rename turns every
# `.mlp.` into `.block_sparse_moe.` (its load renames the MoE blocks to `mlp`), the dense first layer's MLP too,
# which the Hub checkpoint (and llama.cpp's tensor map) names `mlp`; HY-V4's load renames `.hc_pre.hc_` to `.hc_`,
# whose reverse on save puts `hc_pre` in front of the wrong part (`model.hc_pre.hc_head.hc_head_fn`,
# `layers.N.hc_pre.hc_attn_layer.hc_fn`), where the Hub (and llama.cpp's map) has `model.hc_head.hc_head_fn` and
# `layers.N.hc_attn_layer.hc_pre.hc_fn`: both load to the same transformers names; its rename of the attention's
# `.linear_gate` to `.gate_proj` turns the MLPs' `gate_proj` into `linear_gate` on save; DeepSeek-V4's Hub names
# have no `model.` prefix (`embed.weight`, `hc_head_fn`, `layers.N.ffn...`), and its renames anchored at the start of
# the name (`^embed`, `^hc_head_fn`) are not reversed under the prefix transformers' save adds; its load renames the
# compressor's `.norm.` to `.kv_norm.`, whose reverse also turns the attention's own `attn.kv_norm` into `attn.norm`
RENAME = {"kimi_linear": ((r"^(model\.layers\.\d+)\.block_sparse_moe\.(gate|up|down)_proj\.", r"\1.mlp.\2_proj."),),
          "hy_v4": ((r"^model\.hc_pre\.hc_head\.", "model.hc_head."),
                    (r"\.hc_pre\.hc_(attn|mlp)_layer\.hc_(fn|base|scale)$", r".hc_\1_layer.hc_pre.hc_\2"),
                    (r"\.mlp\.((?:shared_experts\.)?)linear_gate\.", r".mlp.\1gate_proj.")),
          "bitnet@1bitllm": ((r"\.self_attn\.attn_sub_norm\.", ".self_attn.inner_attn_ln."),
                             (r"\.mlp\.ffn_sub_norm\.", ".mlp.ffn_layernorm.")),
          "deepseek_v4": ((r"^model\.embed_tokens\.", "embed."),
                          (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
                          (r"^model\.", ""), (r"^(layers\.\d+\.attn)\.norm\.", r"\1.kv_norm."))}


@pytest.fixture(scope="module", autouse=True)
def converter_src():
    """``CKPT_SURGEON_LLAMACPP_SRC`` = the sdist's llama.cpp for the module's tests (imported, it is autouse)."""
    os.environ["CKPT_SURGEON_LLAMACPP_SRC"] = str(llamacpp_source())
    yield
    os.environ.pop("CKPT_SURGEON_LLAMACPP_SRC", None)


def zoo_folder(model_type: str, root: Path) -> Path:
    """``root/model_type``: the zoo's tiny ``model_type`` (built again as :data:`REBUILD` says) with a tokenizer (the
    tiny llama fixture's BPE one copied in, a SentencePiece one for :data:`SPM`, a WordPiece one for
    :data:`WORDPIECE`), built once, and what its own Hub folder has that llama.cpp's class reads (:data:`RENAME`,
    :data:`MXFP4_EXPERTS`, :data:`SPECIALS`, :data:`CONFIG_EXTRA`, :data:`TOKENIZER_CONFIG`, :data:`MTP`)."""
    out = root / model_type
    if out.exists():
        return out
    tmp = root / f".{model_type}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if model_type in REBUILD:
        _rebuild(model_type, tmp)
    else:
        shutil.copytree(zoo_path(model_type), tmp)
    _fill(model_type, tmp)
    tmp.rename(out)
    return out


def _rebuild(model_type: str, out: Path) -> None:
    """The zoo's tiny config of ``model_type`` with :data:`REBUILD`'s class and values, built and run by the zoo's
    own code (fixtures/zoo.py: seeded random instance, one forward pass) and saved to ``out``."""
    import transformers

    from fixtures.zoo import _instance, zoo_config
    from ckpt_surgeon.runtime import quiet_transformers
    klass, values = REBUILD[model_type]
    cfg = zoo_config(model_type.partition("@")[0])
    cfg.update(values(cfg) if callable(values) else values)
    if klass is not None:
        cfg["architectures"] = [klass]
    _, model = _instance(cfg, getattr(transformers, cfg["architectures"][0]), 0)
    with quiet_transformers():
        model.save_pretrained(out)
    if model_type in ARCHITECTURE:
        saved = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**saved, "architectures": [ARCHITECTURE[model_type]]}, indent=2))


def _fill(model_type: str, out: Path) -> None:
    if model_type in RENAME:
        _rename(out, RENAME[model_type])
    if model_type in MXFP4_EXPERTS:
        _mxfp4_experts(out, MXFP4_EXPERTS[model_type])
    if model_type in SPM:
        _spm_tokenizer_into(out, *SPM[model_type])
    elif model_type in WORDPIECE:
        _wordpiece_tokenizer_into(out)
    else:
        tok = fixture_path("llama")
        for f in TOKENIZER_FILES:
            shutil.copy(tok / f, out / f)
    if model_type in MTP:
        _add_mtp(out)
    if model_type in REMOTE_TOKENIZER:
        _remote_tokenizer_into(out, REMOTE_TOKENIZER[model_type])
    if model_type in CONFIG_FORM:
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(CONFIG_FORM[model_type](cfg), indent=2))
    for name, extra in (("config.json", CONFIG_EXTRA), ("tokenizer_config.json", TOKENIZER_CONFIG)):
        if model_type in extra:
            cfg = json.loads((out / name).read_text())
            more = extra[model_type](cfg) if callable(extra[model_type]) else extra[model_type]
            (out / name).write_text(json.dumps({**cfg, **more}, indent=2))
    if model_type in SPECIALS:
        from tokenizers import AddedToken, Tokenizer
        t = Tokenizer.from_file(str(out / "tokenizer.json"))
        t.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS[model_type]])
        t.save(str(out / "tokenizer.json"))


def _spm_tokenizer_into(out: Path, tokenizer_class: str, ids: dict, filename: str = "tokenizer.model") -> None:
    """A SentencePiece model trained on the fixtures' corpus (BPE with byte fallback unless ``ids`` say otherwise;
    below the zoo's vocabulary of 512, which llama.cpp pads), as ``filename``, with transformers' own conversion of
    it saved beside."""
    import transformers
    from convert_variants import _spm_tokenizer
    work, tok = _spm_tokenizer(out, getattr(transformers, tokenizer_class), vocab_size=500, **ids)
    shutil.copy(work / "sp.model", out / filename)
    tok.save_pretrained(out)
    shutil.rmtree(work)


def _wordpiece_tokenizer_into(out: Path) -> None:
    """A lower-casing WordPiece vocabulary (BERT's special tokens) trained on the fixtures' corpus with the
    tokenizers library, as ``vocab.txt``, and transformers' BertTokenizer built from it saved beside."""
    import tempfile

    import transformers
    from tokenizers import BertWordPieceTokenizer

    from ckpt_surgeon.tiny import _CORPUS
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(iter(list(_CORPUS) * 3), vocab_size=500,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with tempfile.TemporaryDirectory() as work:
        wp.save_model(work)
        transformers.BertTokenizer.from_pretrained(work).save_pretrained(out)
        shutil.copy(Path(work) / "vocab.txt", out / "vocab.txt")


def _remote_tokenizer_into(out: Path, klass: str) -> None:
    """The folder's tokenizer served by a module of its own (:data:`REMOTE_TOKENIZER`): the module written beside,
    named by tokenizer_config.json's auto_map, and reserved special tokens (``<|extra_N|>``, as tiktoken releases
    reserve theirs) filling the vocabulary up to config.json's vocab_size, which the class asserts equal."""
    from tokenizers import AddedToken, Tokenizer
    module, name = klass.split(".")
    (out / f"{module}.py").write_text(_REMOTE_TOKENIZER_CODE)
    vocab_size = json.loads((out / "config.json").read_text())["vocab_size"]
    t = Tokenizer.from_file(str(out / "tokenizer.json"))
    t.add_special_tokens([AddedToken(f"<|extra_{k}|>", special=True) for k in range(vocab_size - t.get_vocab_size())])
    t.save(str(out / "tokenizer.json"))
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    tcfg.update(tokenizer_class=name, auto_map={"AutoTokenizer": [None, klass]})
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))


def _rewrite(out: Path, edit) -> None:
    """The model's safetensors file replaced by ``edit(tensors)`` (a dict of torch tensors in, one out)."""
    from safetensors.torch import load_file, save_file
    path = out / "model.safetensors"
    save_file(edit(load_file(str(path))), str(path), metadata={"format": "pt"})


def _rename(out: Path, rules) -> None:
    """The model's tensor names rewritten by ``rules`` ((pattern, replacement), ... applied in order)."""
    import re

    def edit(tensors):
        for pattern, repl in rules:
            tensors = {re.sub(pattern, repl, k): v for k, v in tensors.items()}
        return tensors
    _rewrite(out, edit)


def _mxfp4_experts(out: Path, pattern: str) -> None:
    """The tensors whose names match ``pattern`` replaced by MXFP4 ones of the same logical shape: the packed codes
    (int8, [rows, cols / 2]) under the name, the E8M0 exponents ([rows, cols / 32]) under ``.scale`` in place of
    ``.weight``."""
    import re

    import torch

    def edit(tensors):
        gen = torch.Generator().manual_seed(0)
        new = {}
        for name, t in tensors.items():
            if re.match(pattern, name):
                rows, cols = t.shape
                new[name] = torch.randint(-128, 128, (rows, cols // 2), generator=gen, dtype=torch.int8)
                new[name.removesuffix(".weight") + ".scale"] = torch.randint(
                    120, 131, (rows, cols // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
            else:
                new[name] = t
        return new
    _rewrite(out, edit)


def _add_mtp(out: Path) -> None:
    """``mtp.layers.0.*`` shaped as the model's last full-attention layer, ``mtp.fc`` (hidden x 2 hidden) and the
    three norms, seeded, in the model's dtype, added to its safetensors file."""
    import numpy as np
    import torch
    cfg = json.loads((out / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    full = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    prefix = f"model.layers.{full}."

    def edit(tensors):
        hidden, dtype = tensors["model.norm.weight"].shape[0], tensors["model.norm.weight"].numpy().dtype
        shapes = {"mtp.layers.0." + k[len(prefix):]: tuple(v.shape) for k, v in tensors.items() if k.startswith(prefix)}
        shapes.update({"mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
                       "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,)})
        rng = np.random.default_rng(0)
        return {**tensors, **{k: torch.from_numpy((rng.standard_normal(shape) * 0.02).astype(dtype))
                              for k, shape in sorted(shapes.items())}}
    _rewrite(out, edit)
