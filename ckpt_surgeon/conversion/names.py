"""GGUF <-> Hugging Face: tensor names, per-tensor transforms and hyper-parameter keys, as data.

One :class:`ArchSpec` row per GGUF architecture.  Both directions read the same rows, so a
name that converts one way converts back the other way; nothing in ``hf_to_gguf`` /
``gguf_to_hf`` branches on an architecture name.

Sources the rows mirror:

- tensor names: llama.cpp ``gguf-py/gguf/constants.py`` ``MODEL_TENSOR`` / ``TENSOR_NAMES`` and
  ``tensor_mapping.py`` ``TensorNameMap`` (the HF spellings per architecture).  A test checks
  every HF -> GGUF name here against gguf-py's own ``TensorNameMap``.
- transforms: llama.cpp ``convert_hf_to_gguf.py``: ``LlamaModel.modify_tensors`` permutes
  Q/K rows (``LlamaModel.permute``) for llama/mistral only; ``GPT2Model`` stores Conv1D
  weights transposed back to ``[out, in]``; ``Gemma3Model`` adds ``norm_shift = 1.0`` to every
  ``*norm.weight`` (Gemma's RMSNorm multiplies by ``1 + w``; llama.cpp multiplies by ``w``).
- hyper-parameter keys: ``gguf_writer.py`` ``add_*`` methods (``{arch}.context_length`` ...)
  and each model's ``set_gguf_parameters``.

Transforms (applied HF -> GGUF; their inverses GGUF -> HF):

``perm_q`` / ``perm_k``
    rows reordered by :func:`ckpt_surgeon.arch.layouts.llama_permute_index` with the query /
    kv head count (weights and biases alike).
``conv1d``
    2-D weight transposed (GPT-2 ``Conv1D`` keeps ``[in, out]``, GGUF wants ``[out, in]``).
``norm_shift``
    ``+1`` (Gemma stores ``w``, llama.cpp wants ``1 + w``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# --- tensor rules -------------------------------------------------------------------------

TRANSFORMS = ("none", "perm_q", "perm_k", "conv1d", "norm_shift")


@dataclass(frozen=True)
class TensorRule:
    """One HF name pattern <-> one GGUF name pattern.  ``{L}`` is the layer index."""

    hf: str
    gguf: str
    transform: str = "none"


def _rules(*rows) -> tuple[TensorRule, ...]:
    out = []
    for row in rows:
        out.append(TensorRule(*row))
    return tuple(out)


def _wb(hf: str, gguf: str, transform: str = "none", bias: bool = True) -> list[tuple]:
    """A module's ``.weight`` and (optionally) ``.bias`` under one rule pair."""
    rows = [(f"{hf}.weight", f"{gguf}.weight", transform)]
    if bias:
        # Conv1D biases are vectors: nothing to transpose.
        rows.append((f"{hf}.bias", f"{gguf}.bias", "none" if transform == "conv1d" else transform))
    return rows


# Llama-style decoder (modeling_llama / modeling_qwen2 / modeling_qwen3 / modeling_mistral).
def _llama_like(perm: bool, qk_norm: bool = False) -> tuple[TensorRule, ...]:
    pq, pk = ("perm_q", "perm_k") if perm else ("none", "none")
    rows = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        ("model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight"),
        *_wb("model.layers.{L}.self_attn.q_proj", "blk.{L}.attn_q", pq),
        *_wb("model.layers.{L}.self_attn.k_proj", "blk.{L}.attn_k", pk),
        *_wb("model.layers.{L}.self_attn.v_proj", "blk.{L}.attn_v"),
        *_wb("model.layers.{L}.self_attn.o_proj", "blk.{L}.attn_output"),
        ("model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.ffn_norm.weight"),
        *_wb("model.layers.{L}.mlp.gate_proj", "blk.{L}.ffn_gate"),
        *_wb("model.layers.{L}.mlp.up_proj", "blk.{L}.ffn_up"),
        *_wb("model.layers.{L}.mlp.down_proj", "blk.{L}.ffn_down"),
    ]
    if qk_norm:
        rows += [("model.layers.{L}.self_attn.q_norm.weight", "blk.{L}.attn_q_norm.weight"),
                 ("model.layers.{L}.self_attn.k_norm.weight", "blk.{L}.attn_k_norm.weight")]
    return _rules(*rows)


_PHI3 = _rules(
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight"),
    # [Q; K; V] rows, the same concat layout on both sides (modeling_phi3 / llama.cpp phi3).
    *_wb("model.layers.{L}.self_attn.qkv_proj", "blk.{L}.attn_qkv"),
    *_wb("model.layers.{L}.self_attn.o_proj", "blk.{L}.attn_output"),
    ("model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.ffn_norm.weight"),
    # [gate; up] rows: llama.cpp's phi3 graph splits ffn_up in halves (LLM_FFN_SWIGLU on a fused up).
    *_wb("model.layers.{L}.mlp.gate_up_proj", "blk.{L}.ffn_up"),
    *_wb("model.layers.{L}.mlp.down_proj", "blk.{L}.ffn_down"),
)

_GPT2 = _rules(
    ("transformer.wte.weight", "token_embd.weight"),
    ("transformer.wpe.weight", "position_embd.weight"),
    *_wb("transformer.ln_f", "output_norm"),
    ("lm_head.weight", "output.weight"),
    *_wb("transformer.h.{L}.ln_1", "blk.{L}.attn_norm"),
    *_wb("transformer.h.{L}.attn.c_attn", "blk.{L}.attn_qkv", "conv1d"),
    *_wb("transformer.h.{L}.attn.c_proj", "blk.{L}.attn_output", "conv1d"),
    *_wb("transformer.h.{L}.ln_2", "blk.{L}.ffn_norm"),
    *_wb("transformer.h.{L}.mlp.c_fc", "blk.{L}.ffn_up", "conv1d"),
    *_wb("transformer.h.{L}.mlp.c_proj", "blk.{L}.ffn_down", "conv1d"),
)

_GEMMA3 = _rules(
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight", "norm_shift"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{L}.input_layernorm.weight", "blk.{L}.attn_norm.weight", "norm_shift"),
    *_wb("model.layers.{L}.self_attn.q_proj", "blk.{L}.attn_q"),
    *_wb("model.layers.{L}.self_attn.k_proj", "blk.{L}.attn_k"),
    *_wb("model.layers.{L}.self_attn.v_proj", "blk.{L}.attn_v"),
    *_wb("model.layers.{L}.self_attn.o_proj", "blk.{L}.attn_output"),
    ("model.layers.{L}.self_attn.q_norm.weight", "blk.{L}.attn_q_norm.weight", "norm_shift"),
    ("model.layers.{L}.self_attn.k_norm.weight", "blk.{L}.attn_k_norm.weight", "norm_shift"),
    ("model.layers.{L}.post_attention_layernorm.weight", "blk.{L}.post_attention_norm.weight", "norm_shift"),
    ("model.layers.{L}.pre_feedforward_layernorm.weight", "blk.{L}.ffn_norm.weight", "norm_shift"),
    ("model.layers.{L}.post_feedforward_layernorm.weight", "blk.{L}.post_ffw_norm.weight", "norm_shift"),
    *_wb("model.layers.{L}.mlp.gate_proj", "blk.{L}.ffn_gate"),
    *_wb("model.layers.{L}.mlp.up_proj", "blk.{L}.ffn_up"),
    *_wb("model.layers.{L}.mlp.down_proj", "blk.{L}.ffn_down"),
)

# --- hyper-parameters ---------------------------------------------------------------------

# Canonical hyper-parameter -> GGUF key suffix (the key is "{arch}." + suffix), after
# gguf_writer.py add_context_length / add_embedding_length / ...
GGUF_HPARAM_KEYS: dict[str, str] = {
    "n_ctx": "context_length",
    "n_embd": "embedding_length",
    "n_ff": "feed_forward_length",
    "n_layer": "block_count",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "rope_theta": "rope.freq_base",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "ln_eps": "attention.layer_norm_epsilon",
    "rotary_dim": "rope.dimension_count",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "sliding_window": "attention.sliding_window",
    "vocab_size": "vocab_size",
    "orig_ctx": "rope.scaling.original_context_length",
}
# GGUF value type per canonical hyper-parameter (u32 ints, f32 floats), as llama.cpp writes them.
HPARAM_FLOATS = frozenset({"rope_theta", "rms_eps", "ln_eps"})

# HF config spellings per canonical hyper-parameter, preferred first (ARCHITECTURE.md
# "config spellings drift": transformers >= 5 nests rope settings in `rope_parameters`,
# Hub-era configs keep them top level).  A dotted entry is a nested path.
HF_HPARAM_KEYS: dict[str, tuple[str, ...]] = {
    "n_ctx": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "n_embd": ("hidden_size", "n_embd", "d_model"),
    "n_ff": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "n_layer": ("num_hidden_layers", "n_layer", "num_layers"),
    "n_head": ("num_attention_heads", "n_head", "num_heads"),
    "n_head_kv": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim",),
    "rope_theta": ("rope_parameters.rope_theta", "rope_parameters.full_attention.rope_theta", "rope_theta"),
    "rope_local_theta": ("rope_parameters.sliding_attention.rope_theta", "rope_local_base_freq"),
    "partial_rotary": ("rope_parameters.partial_rotary_factor", "partial_rotary_factor", "rotary_pct"),
    "rms_eps": ("rms_norm_eps", "layer_norm_eps", "norm_eps"),
    "ln_eps": ("layer_norm_epsilon", "layer_norm_eps", "norm_epsilon"),
    "sliding_window": ("sliding_window",),
    "vocab_size": ("vocab_size",),
    "orig_ctx": ("original_max_position_embeddings",),
    "tie": ("tie_word_embeddings",),
    "layer_types": ("layer_types",),
    "query_pre_attn_scalar": ("query_pre_attn_scalar",),
}


@dataclass(frozen=True)
class ArchSpec:
    """Everything the converters need to know about one GGUF architecture."""

    gguf_arch: str                       # general.architecture
    hf_model_types: tuple[str, ...]      # config.json model_type values that convert to it (first: GGUF -> HF)
    hf_architecture: str                 # config.json architectures[0] written GGUF -> HF
    tensors: tuple[TensorRule, ...]
    hparams: tuple[str, ...]             # canonical hyper-parameters written HF -> GGUF
    # GGUF -> HF config: the base is arch/gguf_config.config_from_gguf (generic HF keys); these
    # adjust it for the family's own config class.
    hf_rename: dict = field(default_factory=dict)        # generic HF key -> this family's key
    hf_from_gguf: dict = field(default_factory=dict)     # extra "{arch}.<suffix>" -> HF key
    hf_config_extra: dict = field(default_factory=dict)  # fixed HF config entries
    ff_default_mult: int | None = None   # n_ff = mult * n_embd when the HF config leaves it None (GPT-2)
    norm: str = "rms"                    # rms | layer (which epsilon key)
    rope: bool = True
    bias_switch: str | None = None       # HF config flag turning q/k/v(/o) biases on (llama attention_bias)
    bias_probe: str | None = None        # GGUF tensor whose presence sets bias_switch
    llamacpp_absent: tuple[str, ...] = ()  # GGUF names llama.cpp's graph has no slot for (file would not load)
    # Settings llama.cpp does not read from the file but hard-codes for the architecture
    # (canonical name -> value; "head_dim" means "equal to the head dim").  HF -> GGUF refuses a
    # config that differs (llama.cpp would run another model); GGUF -> HF writes them.
    llamacpp_fixed: dict = field(default_factory=dict)
    notes: str = ""


_LLAMA_HPARAMS = ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "rope_theta", "rms_eps",
                  "rotary_dim", "key_length", "value_length", "vocab_size")

ARCHS: tuple[ArchSpec, ...] = (
    ArchSpec("llama", ("llama", "mistral"), "LlamaForCausalLM", _llama_like(perm=True), _LLAMA_HPARAMS,
             hf_config_extra={"hidden_act": "silu"}, bias_switch="attention_bias", bias_probe="blk.0.attn_q.bias",
             notes="mistral converts to llama.cpp's llama architecture (as convert_hf_to_gguf.py does); "
                   "Q/K rows are permuted to interleaved rotary pairs"),
    ArchSpec("qwen2", ("qwen2",), "Qwen2ForCausalLM", _llama_like(perm=False), _LLAMA_HPARAMS,
             hf_config_extra={"hidden_act": "silu"}),
    # llama.cpp src/models/qwen3.cpp: q/k/v biases are optional, attn_output has no bias slot.
    ArchSpec("qwen3", ("qwen3",), "Qwen3ForCausalLM", _llama_like(perm=False, qk_norm=True), _LLAMA_HPARAMS,
             hf_config_extra={"hidden_act": "silu"}, bias_switch="attention_bias", bias_probe="blk.0.attn_q.bias",
             llamacpp_absent=("blk.{L}.attn_output.bias",)),
    ArchSpec("phi3", ("phi3",), "Phi3ForCausalLM", _PHI3, _LLAMA_HPARAMS + ("orig_ctx",),
             hf_from_gguf={"rope.scaling.original_context_length": "original_max_position_embeddings"},
             hf_config_extra={"hidden_act": "silu"}),
    ArchSpec("gpt2", ("gpt2",), "GPT2LMHeadModel", _GPT2,
             ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "ln_eps", "vocab_size"),
             hf_rename={"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                        "max_position_embeddings": "n_positions", "intermediate_size": "n_inner",
                        "num_key_value_heads": None, "head_dim": None},
             hf_config_extra={"activation_function": "gelu_new"}, ff_default_mult=4, norm="layer", rope=False),
    # llama.cpp src/models/gemma3*.cpp + llama-model.cpp: sliding-window rope base 10000
    # (rope_freq_base_train_swa), every 6th layer global (set_swa_pattern(6)), attention scaled by
    # 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim; the 27B exception is not handled).
    ArchSpec("gemma3", ("gemma3_text",), "Gemma3ForCausalLM", _GEMMA3, _LLAMA_HPARAMS + ("sliding_window",),
             hf_config_extra={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                              "attn_logit_softcapping": None},
             llamacpp_fixed={"rope_local_theta": 10000.0, "global_every": 6, "query_pre_attn_scalar": "head_dim"},
             bias_switch="attention_bias", bias_probe="blk.0.attn_q.bias",
             llamacpp_absent=("blk.{L}.attn_output.bias",),
             notes="norm weights are stored as 1 + w (Gemma3RMSNorm multiplies by 1 + w)"),
)


def by_gguf_arch(arch: str | None) -> ArchSpec | None:
    for a in ARCHS:
        if a.gguf_arch == arch:
            return a
    return None


def by_model_type(model_type: str | None) -> ArchSpec | None:
    for a in ARCHS:
        if model_type in a.hf_model_types:
            return a
    return None


def supported_model_types() -> list[str]:
    return [mt for a in ARCHS for mt in a.hf_model_types]


# --- name matching ------------------------------------------------------------------------


def template_regex(template: str) -> re.Pattern:
    """``blk.{L}.attn_q.weight`` -> a regex whose group 1 is the layer index."""
    return re.compile("^" + re.escape(template).replace(re.escape("{L}"), r"(\d+)") + "$")


@dataclass(frozen=True)
class NameMap:
    """Compiled matcher over one arch's rules, in one direction."""

    rules: tuple[TensorRule, ...]
    to_gguf: bool

    def match(self, name: str) -> tuple[str, TensorRule] | None:
        """``name`` -> (name on the other side, rule), or None when no rule matches."""
        for rule, rx in _compiled(self.rules, self.to_gguf):
            m = rx.match(name)
            if m:
                target = rule.gguf if self.to_gguf else rule.hf
                if m.groups():
                    target = target.replace("{L}", m.group(1))
                return target, rule
        return None


_CACHE: dict = {}


def _compiled(rules: tuple[TensorRule, ...], to_gguf: bool):
    key = (id(rules), to_gguf)
    got = _CACHE.get(key)
    if got is None:
        got = [(r, template_regex(r.hf if to_gguf else r.gguf)) for r in rules]
        _CACHE[key] = got
    return got


def hf_to_gguf_names(spec: ArchSpec) -> NameMap:
    return NameMap(spec.tensors, True)


def gguf_to_hf_names(spec: ArchSpec) -> NameMap:
    return NameMap(spec.tensors, False)


# --- HF config reading --------------------------------------------------------------------


def config_get(cfg: dict, keys: tuple[str, ...]):
    """First present, non-None value among ``keys`` (dotted keys walk nested dicts)."""
    for key in keys:
        cur = cfg
        for part in key.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                cur = None
                break
        if cur is not None and not isinstance(cur, dict):
            return cur
    return None


# GGUF general.file_type per --dtype (gguf constants.py LlamaFileType) and the ggml tensor type
# the 2-D weights get.  1-D tensors (norms, biases) are always F32, as llama.cpp's converter does.
DTYPES = {
    "f32": ("ALL_F32", "F32"),
    "f16": ("MOSTLY_F16", "F16"),
    "bf16": ("MOSTLY_BF16", "BF16"),
    "q8_0": ("MOSTLY_Q8_0", "Q8_0"),
}

# HF dtype names accepted on the GGUF -> HF side, with their safetensors spelling.
HF_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# --- settings llama.cpp hard-codes (ArchSpec.llamacpp_fixed) --------------------------------


def _layer_types(n_layer: int, every: int) -> list[str]:
    """Gemma 3's layout as llama.cpp assumes it: layer i is global iff (i + 1) % every == 0."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layer)]


def fixed_expected(key: str, value, hp: dict):
    """The HF config value that a llama.cpp constant stands for (compared with the HF config)."""
    if value == "head_dim":
        return hp["head_dim"]
    if key == "global_every":
        return _layer_types(hp["n_layer"], int(value))
    return value


def fixed_from_hf(key: str, cfg: dict):
    """The HF config's own value for a llama.cpp constant (None when the config does not say)."""
    if key == "global_every":
        return config_get(cfg, HF_HPARAM_KEYS["layer_types"]) and list(cfg["layer_types"])
    v = config_get(cfg, HF_HPARAM_KEYS[key])
    return float(v) if isinstance(v, (int, float)) and key.endswith("theta") else v


def fixed_to_hf(spec: ArchSpec, cfg: dict, hp: dict) -> None:
    """Write the HF config entries for an arch's llama.cpp constants (GGUF -> HF), in place."""
    fixed = spec.llamacpp_fixed
    if not fixed:
        return
    if "global_every" in fixed:
        cfg["layer_types"] = fixed_expected("global_every", fixed["global_every"], hp)
    if "query_pre_attn_scalar" in fixed:
        cfg["query_pre_attn_scalar"] = fixed_expected("query_pre_attn_scalar", fixed["query_pre_attn_scalar"], hp)
    if "rope_local_theta" in fixed:
        # transformers >= 5 nests rope settings per layer type (configuration_gemma3.py);
        # rope_local_base_freq is the transformers 4 spelling.
        theta = float(cfg.get("rope_theta") or hp.get("rope_theta") or 10000.0)
        local = float(fixed["rope_local_theta"])
        cfg["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": theta},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": local}}
        cfg["rope_local_base_freq"] = local
