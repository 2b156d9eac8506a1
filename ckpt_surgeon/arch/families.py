"""Architecture knowledge, as data: the one registry.

One :class:`Family` per model family owns every per-family fact the tool uses:

- HF roles: where each layer's attention tensors live (HF names, relative to an optional prefix
  such as ``model.`` / ``transformer.`` / ``bert.``), the fused-QKV layout, the position encoding
  and norm placement, the config keys that switch biases / soft-capping / kv heads;
- GGUF: the ``general.architecture`` names, whether llama.cpp's converter permutes Q/K rows, the
  norm weight offset, the HF config class and epsilon key a GGUF file converts back to;
- conversion (:class:`Conversion`): the HF tensors llama.cpp's converter writes, with their
  transforms and hyper-parameters.  GGUF tensor names are *not* written here: they are derived
  from gguf-py's own tables (``TensorNameMap``, ``TENSOR_NAMES``) in :mod:`ckpt_surgeon.arch.gguf_names`.

Analysis, surgery and conversion read these records; nothing else branches on a model name
(``tests/test_registry.py`` fails on a family-name literal anywhere else in ``ckpt_surgeon/``).
Adding a family is adding one :class:`Family` row here.

Patterns: ``{L}`` stands for the layer index.  A role names a module path; the
matcher appends ``.weight`` / ``.bias``.  GGUF files use one naming for every
architecture (gguf-py ``constants.py`` ``MODEL_TENSOR`` / ``TENSOR_NAMES``), derived in
:mod:`ckpt_surgeon.arch.gguf_names`.

Sources per family (transformers 5 modeling files): modeling_qwen2, modeling_llama,
modeling_mistral, modeling_qwen3, modeling_gemma2, modeling_gemma3, modeling_phi3, modeling_phi,
modeling_gpt2, modeling_gpt_neox, modeling_bloom, modeling_falcon, modeling_bert,
modeling_starcoder2, modeling_olmo2; conversion rows: llama.cpp ``convert_hf_to_gguf.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Roles a family may define.  Separate projections or one fused projection.
ROLES = ("q", "k", "v", "qkv", "o", "q_norm", "k_norm", "sinks", "attn_norm")
# "attn_norm" is the norm whose output feeds the attention projections (pre-norm models); the
# redundancy analysis bounds |q| with it.  A role's module may be a tuple of alternatives.


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]          # config.json "model_type" values
    gguf_archs: tuple[str, ...]           # general.architecture values
    layer: str                            # layer prefix pattern, e.g. "layers.{L}."
    roles: dict                           # role -> module path under the layer prefix
    position: str = "rope"                # rope | absolute | alibi | none
    norm_placement: str = "pre"           # pre | post (is the attention *input* normalised?)
    qk_norm: bool = False                 # a norm follows the q/k projection
    # fused layout: either a fixed string or a tuple of (config key, value, layout) rules + default
    fused_layout: str | None = None
    fused_layout_rules: tuple = ()
    conv1d: bool = False                  # GPT-2 Conv1D: weights stored [in, out]
    gguf_qk_permuted: bool = False        # llama.cpp converter permutes Q/K rows (interleaved pairs)
    # rotary pairing of the HF checkpoint itself: rotate_half (i, i + d/2) or interleaved (2i, 2i+1),
    # e.g. modeling_cohere's rotate_half works on interleaved pairs
    rope_pairs: str = "rotate_half"
    # config keys (checked in order; first present wins).  None entries are skipped.
    position_rules: tuple = ()            # (config key, value, position type) overrides
    attention_bias_key: str | None = None  # switch that turns q/k/v(/o) biases on
    bias_note: str = ""                   # human note shown by inspect/analyze
    softcap_key: str | None = None        # attention logit soft-capping (not shift-invariant)
    # (conditions, value): kv head count forced when every config condition holds
    kv_heads_rules: tuple = ()
    # attention-input norm kind: "rms" | "layer" | None (no norm feeds the projections / unknown).
    input_norm: str | None = "rms"
    # HF stores gamma - offset for this family's RMSNorm (modeling_gemma3: x * (1 + w)); GGUF
    # files store the full gamma (llama.cpp's converter adds the 1).
    norm_weight_offset: float = 0.0
    # Multi-head latent attention (MLA, modeling_deepseek_v2): keys and values are expanded from a
    # compressed latent, so there is no key or value projection and the query / output widths are
    # not heads x head_dim (q: heads x (qk_nope + qk_rope), o: heads x v_head_dim).  The roles here
    # serve conversion and localisation only: on HF files the attention layout for analysis is the
    # one derived from transformers' module tree (arch/derive/derived.py, as for an architecture outside the
    # registry), and no shape check applies the heads x head_dim rule to q or o.
    latent_attention: bool = False
    # --- surgery data (ckpt_surgeon/surgery) ---
    # modules (under the layer prefix) besides the attention roles whose ``.bias`` exists only when
    # ``attention_bias_key`` is true (fold-bias --delete may drop them all, never some)
    bias_switch_extra: tuple = ()
    # how `qkv split` re-declares this family as another architecture (first matching ArchRewrite)
    unfused_as: tuple = ()
    # --- residual stream (analysis/consumers.py, fold-bias --center) ---
    # True: every module that reads the sums the residual-writing tensors (attention output, MLP
    # output, embeddings) are added into is a centering LayerNorm, so their mean components are
    # invisible; False: some reader is not (RMSNorm, a projection, an unnormalised head);
    # None: not established.  Cited per family (transformers 5 modeling files).
    residual_readers_centering: bool | None = None
    # (config key, value, reason): when the config has that value, some reader of the residual
    # stream is not a centering norm after all (the reason names it), whatever the field above says
    residual_readers_rules: tuple = ()
    extra: dict = field(default_factory=dict)
    # --- GGUF / conversion data ---
    hf_class: str | None = None           # config ``architectures[0]`` written for a GGUF of this family
    ln_eps_key: str = "layer_norm_eps"    # HF key of the LayerNorm epsilon (GGUF attention.layer_norm_epsilon)
    # parameter-less buffers some exports save under the layer prefix (not weights, not biases)
    buffers: tuple = ()
    # roles whose module is where `qkv split` / `qkv fuse` writes, not a module transformers builds
    surgery_roles: tuple = ()
    conversion: "Conversion | None" = None  # HF <-> GGUF conversion (None: not converted here)


# Per-tensor transforms HF -> GGUF (inverses GGUF -> HF), see ckpt_surgeon.conversion.names.
TRANSFORMS = ("none", "perm_q", "perm_k", "conv1d", "norm_shift", "row", "qkv_per_head", "qkv_grouped")
# One HF tensor written as several GGUF tensors (joined back GGUF -> HF), see
# ckpt_surgeon.conversion.splits: kind -> number of parts.
SPLIT_KINDS = {"mla_kv_b": 2, "qkv_grouped_llama": 3}


@dataclass(frozen=True)
class Split:
    """A conversion row whose one HF tensor ``hf`` becomes ``len(parts)`` GGUF tensors.  ``parts``:
    the HF spellings llama.cpp's converter gives the pieces before naming them (gguf-py's
    ``TensorNameMap`` names each), in the order ``kind``'s split function returns them."""

    hf: str
    kind: str
    parts: tuple


@dataclass(frozen=True)
class Conversion:
    """How llama.cpp's converter (``convert_hf_to_gguf.py``) writes a family, and how it converts back.

    ``tensors``: ``(HF tensor template, transform)`` rows; the GGUF name of each row is derived
    from gguf-py's ``TensorNameMap`` for ``gguf_arch`` (:func:`ckpt_surgeon.arch.gguf_names.gguf_tensor_name`).
    ``gguf_arch``: the architecture written (default: the family's first ``gguf_archs``; Mistral
    is written as llama, as llama.cpp's converter does).  ``hparams``: canonical hyper-parameters
    written (``names.GGUF_HPARAM_KEYS``).  GGUF -> HF config: the base is
    :func:`ckpt_surgeon.arch.gguf_config.config_from_gguf`; ``hf_rename`` (generic key -> this
    family's key, None drops it), ``hf_from_gguf`` (extra ``{arch}.<suffix>`` -> HF key) and
    ``hf_config_extra`` (fixed entries) adjust it.  ``ff_default_mult``: n_ff = mult * n_embd when
    the HF config leaves it None (GPT-2).  ``llamacpp_absent``: GGUF names llama.cpp's graph has
    no slot for (the file would not load).  ``llamacpp_fixed``: settings llama.cpp hard-codes for
    the architecture instead of reading them (canonical name -> value; "head_dim" / "n_head" mean "equal to
    the head dim / query head count"): HF -> GGUF refuses a config that differs, GGUF -> HF writes them.
    ``hparam_unset``: canonical hyper-parameter -> the value written when the HF config leaves it
    None (Phi-3's sliding_window 0, "to distinguish Phi-4"); GGUF -> HF reads that value back as None.
    ``gguf_when``: for a family written as another family's architecture with tensors of its own
    (Mixtral as llama), the ``{arch}.<key>`` whose presence makes a GGUF of that arch read back as
    this family (``expert_count``).  ``gguf_strings``: fixed string keys the reference writes
    (Command-R's ``rope.scaling.type = none``).  ``hparam_fallback``: what the reference writes
    for a hyper-parameter the config does not have (BLOOM's context length: ``seq_length`` or else
    the embedding width, ``BloomModel.set_gguf_parameters``).
    ``hparam_required``: hyper-parameters the config must give (llama.cpp's graph applies them
    unconditionally and defaults them when the file lacks them: Gemma 2's soft-capping values).
    ``model_types``: the family's model types this conversion applies to (default: all; Gemma 3's
    multimodal ``gemma3`` config is not a text model).
    ``llamacpp_needs``: ``(HF config key, value, why)``: llama.cpp's graph runs only that value of a
    setting that no GGUF key stores (Falcon's ``bias``, ``parallel_attn``, ``alibi``): HF -> GGUF
    refuses a config with another value, naming the key, before any tensor is looked at; GGUF -> HF
    writes the value.  An optional fourth item is the value the model class assumes when the
    config omits the key (Phi-3.5-MoE's ``tie_word_embeddings``: False).  ``hparam_sums``: hyper-parameters that are sums of HF config keys (DeepSeek-V2's
    key_length = kv_lora_rank + qk_rope_head_dim); GGUF -> HF solves them back.  ``gguf_values``:
    hyper-parameters the reference writes with a fixed value (DeepSeek-V2's head_count_kv 1: MLA as
    MQA).  A tensor row may be a :class:`Split` (one HF tensor, several GGUF tensors).
    ``hf_float32``: HF tensors transformers keeps float32 in half-precision models (DeepSeek-V2's
    router), written F32 by GGUF -> HF at any ``--dtype``.
    ``hf_config_cases``: ``(condition, entries)`` rows for GGUF -> HF, the first
    whose condition holds adds its entries to the config; a condition is ``{}`` (always),
    ``{"tensor": GGUF name}`` (the file holds it) or ``{hyper-parameter: value}`` (a value or
    ``"n_head"``, as in ``llamacpp_fixed``) -- which of Falcon's layouts a file is.  A tensor row
    may carry a third item, the module's HF spelling in configs where ``hf_alt_when = (key, value)``
    holds (Falcon's ``input_layernorm`` where new-decoder files have ``ln_mlp``; both are llama.cpp's
    ``attn_norm``): HF -> GGUF reads either spelling, GGUF -> HF writes the one the config builds.
    ``eps_norm``: the epsilon key llama.cpp reads when it is not the one the HF norm kind implies
    (Phi-3.5-MoE: ``nn.LayerNorm`` built from ``rms_norm_eps``, written as
    ``attention.layer_norm_rms_epsilon`` by ``Phi3MiniModel.set_gguf_parameters``).
    """

    tensors: tuple
    hparams: tuple
    gguf_arch: str | None = None
    hf_rename: dict = field(default_factory=dict)
    hf_from_gguf: dict = field(default_factory=dict)
    hf_config_extra: dict = field(default_factory=dict)
    ff_default_mult: int | None = None
    llamacpp_absent: tuple = ()
    llamacpp_fixed: dict = field(default_factory=dict)
    hparam_unset: dict = field(default_factory=dict)
    gguf_when: str | None = None          # metadata key suffix that selects this family reading gguf_arch back
    gguf_strings: dict = field(default_factory=dict)   # fixed "{arch}.<suffix>" string keys written HF -> GGUF
    hparam_fallback: dict = field(default_factory=dict)  # hyper-parameter -> the one it copies when the config lacks it
    hparam_required: tuple = ()           # hyper-parameters the config must give (no llama.cpp default is the model's)
    llamacpp_differs: str = ""            # llama.cpp's graph computes another function: warned in both directions
    notes: str = ""
    model_types: tuple | None = None      # which of the family's model types convert (default: all)
    llamacpp_needs: tuple = ()            # (HF config key, the value llama.cpp runs, why): others refused
    hf_config_cases: tuple = ()           # (condition, HF config entries): the first that holds (GGUF -> HF)
    hf_alt_when: tuple | None = None      # (HF config key, value): tensor rows use their alternative spelling
    eps_norm: str | None = None           # "rms" | "layer": which epsilon key is written (default: input_norm's)
    # HF tensor templates transformers keeps float32 in a float16 / bfloat16 model (the model class's
    # ``_keep_in_fp32_modules(_strict)``; tests/test_convert.py checks them against what it saves):
    # GGUF -> HF writes them F32 whatever --dtype, so that HF -> GGUF -> HF gives back its bytes
    hf_float32: tuple = ()
    hparam_sums: dict = field(default_factory=dict)    # hyper-parameter -> HF keys it is the sum of (MLA widths)
    gguf_values: dict = field(default_factory=dict)    # hyper-parameter -> value written whatever the config
    # False: GGUF -> HF only, into another family's transformers class (InternLM2, whose own HF
    # checkpoints need trust_remote_code: no transformers class of its own reads them here)
    hf_to_gguf: bool = True
    # scaled RoPE types converted (rope_type values; every other one is refused): "llama3" is
    # llama.cpp's rope_freqs.weight tensor (conversion/rope_llama3.py), "longrope" its
    # rope_factors_long / _short tensors and rope.scaling.attn_factor (conversion/rope_longrope.py)
    rope_scalings: tuple = ()
    # longrope's attention factor is the config's short_mscale / long_mscale (modeling_phimoe)
    longrope_mscales: bool = False
    # yarn with DeepSeek's mscale / mscale_all_dim as rope.scaling.yarn_log_multiplier (conversion/rope_yarn_mscale.py)
    yarn_log_mul: bool = False
    # False: HF -> GGUF only (InternLM2's own HF layout; its GGUF files read back through the
    # architecture's other conversion, as LlamaForCausalLM)
    gguf_to_hf: bool = True
    # HF -> GGUF of a model transformers has no class for: (model_type, config key renames) of the
    # transformers architecture computing the same function, which answers the checkpoint check
    # (its tensors, mapped through both conversions of the GGUF architecture) and reads the tokenizer
    hf_equivalent: tuple | None = None
    # the vocabulary walks tokenizer.model piece by piece with these quirks (conversion/tokenizer/spm.py
    # spm_model_vocab: InternLM2Model.set_vocab's "\x00" -> "🐉", [UNUSED*] pieces, <|im_end|> as eos)
    spm_quirks: dict | None = None


def _wb(hf: str, transform: str = "none", bias: bool = True) -> list[tuple]:
    """A module's ``.weight`` and (optionally) ``.bias`` rows (Conv1D biases are vectors: no transpose)."""
    rows = [(f"{hf}.weight", transform)]
    if bias:
        rows.append((f"{hf}.bias", "none" if transform == "conv1d" else transform))
    return rows


def _qkvo(layer: str, o: str = "o_proj", pq: str = "none", pk: str = "none", o_bias: bool = True) -> tuple:
    """``{layer}.q_proj`` / ``k_proj`` / ``v_proj`` / ``{o}`` rows, weights and (optional) biases."""
    return (*_wb(f"{layer}.q_proj", pq), *_wb(f"{layer}.k_proj", pk), *_wb(f"{layer}.v_proj"),
            *_wb(f"{layer}.{o}", bias=o_bias))


_DENSE_MLP = (*_wb("model.layers.{L}.mlp.gate_proj"), *_wb("model.layers.{L}.mlp.up_proj"),
              *_wb("model.layers.{L}.mlp.down_proj"))


def _moe_mlp(block: str, names: tuple = ("gate_proj", "up_proj", "down_proj"), shared: bool = False) -> tuple:
    """A sparse MoE block (modeling_qwen2_moe / modeling_qwen3_moe / modeling_olmoe / modeling_mixtral
    checkpoints): the router ``{block}.gate`` and per-expert gate / up / down projections, one
    HF tensor per expert (``{E}``) that llama.cpp stacks into ``ffn_*_exps``; with ``shared``,
    Qwen2-MoE's always-on shared expert and its sigmoid gate (``ffn_*_shexp``, ``ffn_gate_inp_shexp``)."""
    p = f"model.layers.{{L}}.{block}"
    rows = [(f"{p}.gate.weight", "none")] + [(f"{p}.experts.{{E}}.{n}.weight", "none") for n in names]
    if shared:
        rows += [(f"{p}.shared_expert.{n}.weight", "none") for n in ("gate_proj", "up_proj", "down_proj")]
        rows.append((f"{p}.shared_expert_gate.weight", "row"))
    return tuple(rows)


def _llama_like_tensors(perm: bool, qk_norm: bool = False, mlp: tuple = _DENSE_MLP) -> tuple:
    """Llama-style decoder (modeling_llama / modeling_qwen2 / modeling_qwen3 / modeling_mistral);
    llama.cpp's ``LlamaModel.modify_tensors`` permutes Q/K rows (``LlamaModel.permute``)."""
    pq, pk = ("perm_q", "perm_k") if perm else ("none", "none")
    rows = [
        ("model.embed_tokens.weight", "none"),
        ("model.norm.weight", "none"),
        ("lm_head.weight", "none"),
        ("model.layers.{L}.input_layernorm.weight", "none"),
        *_qkvo("model.layers.{L}.self_attn", pq=pq, pk=pk),
        ("model.layers.{L}.post_attention_layernorm.weight", "none"),
        *mlp,
    ]
    if qk_norm:
        rows += [("model.layers.{L}.self_attn.q_norm.weight", "none"),
                 ("model.layers.{L}.self_attn.k_norm.weight", "none")]
    return tuple(rows)


# rope_local_theta: the sliding-window layers' theta, written when the config has one
# (TextModel.set_gguf_parameters: rope_parameters["sliding_attention"]["rope_theta"]).
_LLAMA_HPARAMS = ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "rope_theta", "rope_local_theta",
                  "rms_eps", "rotary_dim", "key_length", "value_length", "vocab_size")
_SILU = {"hidden_act": "silu"}
# MoE keys (TextModel.set_gguf_parameters: expert_count / expert_used_count; Qwen2MoeModel: the
# expert and shared-expert FFN widths)
_MOE_HPARAMS = ("n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp")

# One object for both families written as llama.cpp's llama architecture.
_LLAMA_CONVERSION = Conversion(
    _llama_like_tensors(perm=True), _LLAMA_HPARAMS, gguf_arch="llama", hf_config_extra=_SILU,
    rope_scalings=("llama3", "linear", "yarn"),
    notes="mistral converts to llama.cpp's llama architecture (as convert_hf_to_gguf.py does); "
          "Q/K rows are permuted to interleaved rotary pairs")

_PHI3_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    ("model.norm.weight", "none"),
    ("lm_head.weight", "none"),
    ("model.layers.{L}.input_layernorm.weight", "none"),
    # [Q; K; V] rows, the same concat layout on both sides (modeling_phi3 / llama.cpp phi3).
    *_wb("model.layers.{L}.self_attn.qkv_proj"),
    *_wb("model.layers.{L}.self_attn.o_proj"),
    ("model.layers.{L}.post_attention_layernorm.weight", "none"),
    # [gate; up] rows: llama.cpp's phi3 graph splits ffn_up in halves (LLM_FFN_SWIGLU on a fused up).
    *_wb("model.layers.{L}.mlp.gate_up_proj"),
    *_wb("model.layers.{L}.mlp.down_proj"),
)

# GPT2Model in convert_hf_to_gguf.py stores Conv1D weights transposed back to [out, in].
_GPT2_TENSORS = (
    ("transformer.wte.weight", "none"),
    ("transformer.wpe.weight", "none"),
    *_wb("transformer.ln_f"),
    ("lm_head.weight", "none"),
    *_wb("transformer.h.{L}.ln_1"),
    *_wb("transformer.h.{L}.attn.c_attn", "conv1d"),
    *_wb("transformer.h.{L}.attn.c_proj", "conv1d"),
    *_wb("transformer.h.{L}.ln_2"),
    *_wb("transformer.h.{L}.mlp.c_fc", "conv1d"),
    *_wb("transformer.h.{L}.mlp.c_proj", "conv1d"),
)

# Gemma3Model in convert_hf_to_gguf.py adds norm_shift = 1.0 to every *norm.weight (Gemma's
# RMSNorm multiplies by 1 + w; llama.cpp multiplies by w).  Its "remove OOV rows in token_embd"
# is not mirrored: it keeps every token in the vocabulary, so a padded embedding trimmed that way
# no longer loads in llama.cpp (tests/test_llamacpp_converter.py shows it).
_GEMMA3_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    ("model.norm.weight", "norm_shift"),
    ("lm_head.weight", "none"),
    ("model.layers.{L}.input_layernorm.weight", "norm_shift"),
    *_qkvo("model.layers.{L}.self_attn"),
    ("model.layers.{L}.self_attn.q_norm.weight", "norm_shift"),
    ("model.layers.{L}.self_attn.k_norm.weight", "norm_shift"),
    ("model.layers.{L}.post_attention_layernorm.weight", "norm_shift"),
    ("model.layers.{L}.pre_feedforward_layernorm.weight", "norm_shift"),
    ("model.layers.{L}.post_feedforward_layernorm.weight", "norm_shift"),
    *_DENSE_MLP,
)

# Gemma2Model in convert_hf_to_gguf.py (conversion/gemma.py): every *norm.weight + 1 (Gemma2RMSNorm
# multiplies by 1 + w), lm_head skipped (tied: llama.cpp's gemma2 reads token_embd as the head),
# no q/k norm; post_attention_layernorm is attn_post_norm, pre/post_feedforward_layernorm
# ffn_norm / ffn_post_norm (gguf-py TensorNameMap for MODEL_ARCH.GEMMA2).
_GEMMA2_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    ("model.norm.weight", "norm_shift"),
    ("model.layers.{L}.input_layernorm.weight", "norm_shift"),
    *_qkvo("model.layers.{L}.self_attn"),
    ("model.layers.{L}.post_attention_layernorm.weight", "norm_shift"),
    ("model.layers.{L}.pre_feedforward_layernorm.weight", "norm_shift"),
    ("model.layers.{L}.post_feedforward_layernorm.weight", "norm_shift"),
    *_DENSE_MLP,
)

# modeling_starcoder2: LayerNorms with biases, c_fc / c_proj MLP, biases on every linear (use_bias).
_STARCODER2_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    *_wb("model.norm"),
    ("lm_head.weight", "none"),
    *_wb("model.layers.{L}.input_layernorm"),
    *_qkvo("model.layers.{L}.self_attn"),
    *_wb("model.layers.{L}.post_attention_layernorm"),
    *_wb("model.layers.{L}.mlp.c_fc"),
    *_wb("model.layers.{L}.mlp.c_proj"),
)

# modeling_olmo2: no input norm; q/k RMSNorm over the whole projection, norms after attention and MLP.
_OLMO2_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    ("model.norm.weight", "none"),
    ("lm_head.weight", "none"),
    *_qkvo("model.layers.{L}.self_attn"),
    ("model.layers.{L}.self_attn.q_norm.weight", "none"),
    ("model.layers.{L}.self_attn.k_norm.weight", "none"),
    ("model.layers.{L}.post_attention_layernorm.weight", "none"),
    ("model.layers.{L}.post_feedforward_layernorm.weight", "none"),
    *_DENSE_MLP,
)

# modeling_phi (Phi-2): parallel block, one LayerNorm, q/k/v/dense and fc1/fc2 all biased, biased lm_head.
_PHI2_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    *_wb("model.final_layernorm"),
    *_wb("lm_head"),
    *_wb("model.layers.{L}.input_layernorm"),
    *_qkvo("model.layers.{L}.self_attn", o="dense"),
    *_wb("model.layers.{L}.mlp.fc1"),
    *_wb("model.layers.{L}.mlp.fc2"),
)

# modeling_gpt_neox: per-head interleaved query_key_value, which llama.cpp's GPTNeoXModel reorders
# to [Q; K; V] (weights and biases).
_GPT_NEOX_TENSORS = (
    ("gpt_neox.embed_in.weight", "none"),
    *_wb("gpt_neox.final_layer_norm"),
    ("embed_out.weight", "none"),
    *_wb("gpt_neox.layers.{L}.input_layernorm"),
    *_wb("gpt_neox.layers.{L}.post_attention_layernorm"),
    *_wb("gpt_neox.layers.{L}.attention.query_key_value", "qkv_per_head"),
    *_wb("gpt_neox.layers.{L}.attention.dense"),
    *_wb("gpt_neox.layers.{L}.mlp.dense_h_to_4h"),
    *_wb("gpt_neox.layers.{L}.mlp.dense_4h_to_h"),
)

# modeling_bloom: embedding LayerNorm, per-head interleaved query_key_value (reordered to [Q; K; V]
# by llama.cpp's BloomModel), biases everywhere, ALiBi, tied head.
_BLOOM_TENSORS = (
    ("transformer.word_embeddings.weight", "none"),
    *_wb("transformer.word_embeddings_layernorm"),
    *_wb("transformer.ln_f"),
    ("lm_head.weight", "none"),
    *_wb("transformer.h.{L}.input_layernorm"),
    *_wb("transformer.h.{L}.self_attention.query_key_value", "qkv_per_head"),
    *_wb("transformer.h.{L}.self_attention.dense"),
    *_wb("transformer.h.{L}.post_attention_layernorm"),
    *_wb("transformer.h.{L}.mlp.dense_h_to_4h"),
    *_wb("transformer.h.{L}.mlp.dense_4h_to_h"),
)

# modeling_falcon (FalconModel.modify_tensors in llama.cpp's converter): the fused query_key_value
# grouped per kv head [kv, q_per_kv + 2, d] (also the 7B multi-query [Q; K; V] with kv = 1 and the
# per-head [h, 3, d] with kv = h), reordered to [Q; K; V]; LayerNorms with biases; no linear biases
# (llama.cpp's falcon graph has no slot for them).  New-decoder files have ln_attn (-> attn_norm_2,
# read by attention) and ln_mlp (-> attn_norm, read by the MLP); the others one input_layernorm.
_FALCON_LN = "transformer.h.{L}.input_layernorm"
_FALCON_TENSORS = (
    ("transformer.word_embeddings.weight", "none"),
    *_wb("transformer.ln_f"),
    ("lm_head.weight", "none"),
    *_wb("transformer.h.{L}.ln_attn"),
    ("transformer.h.{L}.ln_mlp.weight", "none", f"{_FALCON_LN}.weight"),
    ("transformer.h.{L}.ln_mlp.bias", "none", f"{_FALCON_LN}.bias"),
    ("transformer.h.{L}.self_attention.query_key_value.weight", "qkv_grouped"),
    ("transformer.h.{L}.self_attention.dense.weight", "none"),
    ("transformer.h.{L}.mlp.dense_h_to_4h.weight", "none"),
    ("transformer.h.{L}.mlp.dense_4h_to_h.weight", "none"),
)
# GGUF -> HF: which FalconConfig a file is.  attn_norm_2 only in new-decoder files (Falcon-40B/180B);
# else one kv head is Falcon-7B's multi_query, kv = heads the old MHA layout, anything else a
# new-decoder model with one norm (Falcon2-11B: num_ln_in_parallel_attn 1).  modeling_falcon builds
# input_layernorm for num_ln_in_parallel_attn 1 in both architectures.
_FALCON_CASES = (
    ({"tensor": "blk.0.attn_norm_2.weight"},
     {"new_decoder_architecture": True, "multi_query": False, "num_ln_in_parallel_attn": 2}),
    ({"n_head_kv": 1}, {"new_decoder_architecture": False, "multi_query": True, "num_ln_in_parallel_attn": 1}),
    ({"n_head_kv": "n_head"},
     {"new_decoder_architecture": False, "multi_query": False, "num_ln_in_parallel_attn": 1}),
    ({}, {"new_decoder_architecture": True, "multi_query": False, "num_ln_in_parallel_attn": 1}),
)
# llama.cpp src/models/falcon.cpp: RoPE (NEOX), GELU MLP without biases, attention and MLP added
# to the same input (parallel); none of these is a GGUF key.
# llama-model.cpp LLM_ARCH_PHIMOE creates attn_q/k/v/output biases, output.bias and output.weight
# as required tensors (measured: a file without any of them fails to load), and modeling_phimoe's
# sparsemixer routes to exactly 2 experts whatever num_experts_per_tok says, while llama.cpp routes
# to expert_used_count: another count would run a different model in each.
_PHIMOE_NEEDS = (
    ("attention_bias", True, "llama.cpp's phimoe graph requires attn_q/k/v/output biases, so the file would not "
                             "load"),
    ("lm_head_bias", True, "llama.cpp's phimoe graph requires an output.bias tensor, so the file would not load",
     False),
    ("tie_word_embeddings", False, "llama.cpp's phimoe graph requires its own output.weight, so the file would not "
                                   "load", False),
    ("num_experts_per_tok", 2, "modeling_phimoe's sparsemixer always routes to 2 experts, llama.cpp to "
                               "num_experts_per_tok"),
)
_FALCON_NEEDS = (
    ("bias", False, "llama.cpp's falcon graph has no bias on attn_qkv, attn_output, ffn_up or ffn_down, "
                    "so the file would not load"),
    ("parallel_attn", True, "llama.cpp's falcon graph always runs attention and MLP in parallel on the same "
                            "input; it would run a different model"),
    ("alibi", False, "llama.cpp's falcon graph applies RoPE, not ALiBi; it would run a different model"),
    ("activation", "gelu", "llama.cpp's falcon graph hard-codes a GELU MLP; it would run a different model"),
)

# DeepSeek-V2 (modeling_deepseek_v2 checkpoints; llama.cpp conversion/deepseek.py DeepseekV2Model).
# MLA: without a query LoRA (V2-Lite) q_proj is plain attn_q; kv_a_proj_with_mqa makes the kv latent
# plus the shared rotary key (attn_kv_a_mqa), kv_a_layernorm normalises the latent; kv_b_proj
# [h * (nope + v), kv_lora] is split per head into attn_k_b [h, kv_lora, nope] (transposed, for
# llama.cpp's absorbed MLA) and attn_v_b [h, v, kv_lora].  Leading dense layers (first_k_dense_replace)
# keep a dense MLP; the others route over experts plus always-on shared experts (no shared gate).
_DSV2_ATTN = "model.layers.{L}.self_attn"
_DEEPSEEK2_TENSORS = (
    ("model.embed_tokens.weight", "none"),
    ("model.norm.weight", "none"),
    ("lm_head.weight", "none"),
    ("model.layers.{L}.input_layernorm.weight", "none"),
    ("model.layers.{L}.post_attention_layernorm.weight", "none"),
    (f"{_DSV2_ATTN}.q_proj.weight", "none"),
    (f"{_DSV2_ATTN}.q_a_proj.weight", "none"),
    (f"{_DSV2_ATTN}.q_a_layernorm.weight", "none"),
    (f"{_DSV2_ATTN}.q_b_proj.weight", "none"),
    (f"{_DSV2_ATTN}.kv_a_proj_with_mqa.weight", "none"),
    (f"{_DSV2_ATTN}.kv_a_layernorm.weight", "none"),
    Split(f"{_DSV2_ATTN}.kv_b_proj.weight", "mla_kv_b",
          (f"{_DSV2_ATTN}.k_b_proj.weight", f"{_DSV2_ATTN}.v_b_proj.weight")),
    (f"{_DSV2_ATTN}.o_proj.weight", "none"),
    *_DENSE_MLP,
    ("model.layers.{L}.mlp.gate.weight", "none"),
    *((f"model.layers.{{L}}.mlp.experts.{{E}}.{n}.weight", "none") for n in ("gate_proj", "up_proj", "down_proj")),
    *((f"model.layers.{{L}}.mlp.shared_experts.{n}.weight", "none") for n in ("gate_proj", "up_proj", "down_proj")),
)
# DeepseekV2Model.set_gguf_parameters: MLA written as MQA (head_count_kv 1, key_length
# kv_lora + rope, value_length kv_lora: the cache holds the latent), the per-head widths as *_mla.
_DEEPSEEK2_HPARAMS = ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "rope_theta", "rms_eps",
                      "n_expert", "n_expert_used", "n_expert_group", "n_expert_group_used", "key_length",
                      "value_length", "n_dense_lead", "vocab_size", "q_lora_rank", "kv_lora_rank",
                      "key_length_mla", "value_length_mla", "n_ff_exp", "n_shexp", "expert_weights_scale",
                      "expert_weights_norm", "rotary_dim")
# canonical hyper-parameter -> the HF config keys whose sum it is (both directions: GGUF -> HF
# solves for the keys one unknown at a time)
_DEEPSEEK2_SUMS = {"key_length": ("kv_lora_rank", "qk_rope_head_dim"), "value_length": ("kv_lora_rank",),
                   "key_length_mla": ("qk_nope_head_dim", "qk_rope_head_dim"), "value_length_mla": ("v_head_dim",),
                   "rotary_dim": ("qk_rope_head_dim",)}
# transformers' DeepseekV2TopkRouter: softmax scores, top-k, times routed_scaling_factor; it never
# reads norm_topk_prob (llama.cpp renormalises when the file has expert_weights_norm, which its
# converter writes for norm_topk_prob true) and only "greedy" / "group_limited_greedy" top-k.
_DEEPSEEK2_NEEDS = (
    ("norm_topk_prob", False, "transformers' DeepseekV2 ignores it while llama.cpp would renormalise the top-k "
                              "weights; the two would run different models"),
    ("topk_method", "greedy", "group-limited routing is not checked against llama.cpp here"),
)

# Granite's multipliers (GraniteModel.set_gguf_parameters: *_multiplier -> *_scale keys).
_GRANITE_HPARAMS = ("attention_scale", "embedding_scale", "residual_scale", "logit_scale")


@dataclass(frozen=True)
class ArchRewrite:
    """A family written as another transformers architecture after a layout change.

    Used by ``qkv split`` (Phi-3 -> Llama/Mistral).  ``when_set``: the rewrite applies when this
    config key is set (not None), e.g. Phi-3's ``sliding_window``, which Mistral honours and
    Llama ignores.  ``tensor_splits``: (module, (first-half module, second-half module)) row
    splits that the target architecture needs (Phi-3 ``gate_up_proj`` -> ``gate_proj`` +
    ``up_proj``, modeling_phi3 ``Phi3MLP``: ``gate, up = gate_up_proj(x).chunk(2, -1)``).
    ``drop_config_keys``: source-only config keys removed.  The target rotates whole heads with
    the default rotary kinds, so partial rotary or other rope types are refused.
    """

    model_type: str
    architectures: tuple
    when_set: str | None = None
    tensor_splits: tuple = ()
    drop_config_keys: tuple = ()
    rope_types: tuple = ("default",)


_PHI3_TO = (
    ArchRewrite("mistral", ("MistralForCausalLM",), when_set="sliding_window",
                tensor_splits=(("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),),
                drop_config_keys=("embd_pdrop", "resid_pdrop", "original_max_position_embeddings", "auto_map")),
    ArchRewrite("llama", ("LlamaForCausalLM",),
                tensor_splits=(("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),),
                drop_config_keys=("embd_pdrop", "resid_pdrop", "original_max_position_embeddings", "auto_map",
                                  "sliding_window")),
)

# "qkv": where `qkv fuse` puts the fused [Q; K; V] projection (not a transformers module: for
# runtimes that want one attn_qkv); such families get fused_layout="concat" for reading it back.
_LLAMA_ROLES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "qkv": "self_attn.qkv_proj", "attn_norm": "input_layernorm"}
_QKNORM_ROLES = dict(_LLAMA_ROLES, q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")

_FUSE_OUT = ("qkv",)          # unfused families: "qkv" is where `qkv fuse` writes
_SPLIT_OUT = ("q", "k", "v")   # fused families: q/k/v are where `qkv split` writes

# Every spelling of a kv head count (CONFIG_KEYS["num_kv_heads"]): an MHA family's config class has
# none of them, so a stray one in its config.json (num_kv_heads in a GPT-NeoX config) is ignored, as
# transformers ignores it (issue 24); hf_rename maps each to None (absent_config_keys)
_NO_KV_KEYS = {"num_key_value_heads": None, "num_kv_heads": None, "n_head_kv": None, "multi_query_group_num": None}

# llama-vocab.cpp (llama_vocab::impl::load, "set attributes by model/tokenizer/architecture name"):
# a lower-cased general.name containing one of these strings makes llama.cpp look up each of the
# tokens with token_to_id.at(), which throws for one the vocabulary lacks ("error loading model
# vocabulary: unordered_map::at"): (name substrings, tokens it then requires).
LLAMACPP_NAME_TOKENS = ((("phi-3", "phi3"), ("<unk>", "<s>", "</s>", "<|endoftext|>")),)

# llama.cpp's graphs for these architectures create only the fused blk.N.attn_qkv (src/models/gpt2.cpp,
# bloom.cpp, gptneox.cpp, falcon.cpp call create_tensor(LLM_TENSOR_ATTN_QKV), not create_tensor_qkv,
# which also takes separate q/k/v): a GGUF with attn_q / attn_k / attn_v does not load ("tensor
# 'blk.0.attn_qkv.weight' not found"), so `qkv split` of such a GGUF is refused.
_FUSED_QKV_ONLY = tuple(f"blk.{{L}}.attn_{r}.{kind}" for kind in ("weight", "bias") for r in "qkv")


FAMILIES: tuple[Family, ...] = (
    # residual readers: modeling_qwen2: Qwen2RMSNorm input/post_attention_layernorm, model.norm
    Family("qwen2", ("qwen2",), ("qwen2",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           bias_note="Qwen2 keeps q/k/v biases (o_proj has none); RoPE is applied after the biased projection",
           hf_class="Qwen2ForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=False), _LLAMA_HPARAMS, hf_config_extra=_SILU,
                                 rope_scalings=("linear", "yarn")),
           residual_readers_centering=False),
    # residual readers: modeling_llama: LlamaRMSNorm everywhere
    Family("llama", ("llama",), ("llama",), "layers.{L}.", _LLAMA_ROLES, gguf_qk_permuted=True, fused_layout="concat",
           attention_bias_key="attention_bias", hf_class="LlamaForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=_LLAMA_CONVERSION,
           residual_readers_centering=False),
    # residual readers: modeling_mistral: MistralRMSNorm everywhere
    Family("mistral", ("mistral",), (), "layers.{L}.", _LLAMA_ROLES, gguf_qk_permuted=True, fused_layout="concat",
           hf_class="MistralForCausalLM", surgery_roles=_FUSE_OUT, conversion=_LLAMA_CONVERSION,
           residual_readers_centering=False),
    # InternLM2 (llama.cpp src/models/internlm2.cpp): llama's graph -- RMSNorm, rotary on
    # interleaved pairs (LLAMA_ROPE_TYPE_NORM: q/k rows permuted, InternLM2Model.modify_tensors splits
    # the fused wqkv and applies LlamaModel.permute), SwiGLU, untied output -- with no bias slot but
    # the optional q/k/v ones.  InternLM2's HF checkpoints run only with trust_remote_code
    # (modeling_internlm2 is not in transformers), so GGUF -> HF writes the same function as
    # LlamaForCausalLM; biases are refused (llama's attention_bias would add an o_proj bias too).
    # (no "qkv" role: gguf-py's internlm2 has no attn_qkv, and `qkv fuse` is not offered on it)
    Family("internlm2", (), ("internlm2",), "layers.{L}.", {r: m for r, m in _LLAMA_ROLES.items() if r != "qkv"},
           gguf_qk_permuted=True, hf_class="LlamaForCausalLM",
           conversion=Conversion(
               tuple(r for r in _llama_like_tensors(perm=True) if not r[0].endswith(".bias")), _LLAMA_HPARAMS,
               gguf_arch="internlm2", hf_config_extra=dict(_SILU, attention_bias=False), model_types=("llama",),
               hf_to_gguf=False,
               notes="GGUF -> HF only, written as LlamaForCausalLM (same graph); Q/K rows un-permuted as for llama"),
           residual_readers_centering=False),
    # InternLM2's own HF checkpoints (modeling_internlm2, remote code: no transformers class):
    # HF -> GGUF as llama.cpp's InternLM2Model writes them -- tok_embeddings / output, the fused
    # wqkv [kv, q_per_kv + 2, d] (Falcon's grouped layout) split into attn_q / attn_k / attn_v with
    # llama's Q/K permutation (InternLM2 rotates halves like llama), wo, w1 / w3 / w2.  The checkpoint
    # is checked against the LlamaForCausalLM its config describes (bias -> attention_bias), the
    # model llama.cpp's internlm2 graph and the GGUF -> HF direction run.
    # residual readers: modeling_internlm2: InternLM2RMSNorm everywhere
    Family("internlm2_hf", ("internlm2",), (), "layers.{L}.",
           {"qkv": "attention.wqkv", "o": "attention.wo", "attn_norm": "attention_norm"},
           fused_layout="grouped", gguf_qk_permuted=True, attention_bias_key="bias",
           conversion=Conversion(
               (("model.tok_embeddings.weight", "none"), ("model.norm.weight", "none"), ("output.weight", "none"),
                ("model.layers.{L}.attention_norm.weight", "none"),
                Split("model.layers.{L}.attention.wqkv.weight", "qkv_grouped_llama",
                      tuple(f"model.layers.{{L}}.self_attn.{p}_proj.weight" for p in "qkv")),
                ("model.layers.{L}.attention.wo.weight", "none"), ("model.layers.{L}.ffn_norm.weight", "none"),
                *((f"model.layers.{{L}}.feed_forward.{w}.weight", "none") for w in ("w1", "w3", "w2"))),
               _LLAMA_HPARAMS, gguf_arch="internlm2", gguf_to_hf=False,
               hf_equivalent=("llama", {"bias": "attention_bias"}),
               spm_quirks={"replace": {"\x00": "\U0001f409"}, "unused_prefix": "[UNUSED", "chat_eos": "<|im_end|>"},
               llamacpp_needs=(("bias", False, "llama.cpp's internlm2 graph has no attn_output bias slot"),),
               notes="HF -> GGUF only (GGUF -> HF writes LlamaForCausalLM); wqkv split into attn_q / attn_k / "
                     "attn_v as llama.cpp's converter does"),
           residual_readers_centering=False),
    # llama.cpp src/models/qwen3.cpp: q/k/v biases are optional, attn_output has no bias slot.
    # residual readers: modeling_qwen3: Qwen3RMSNorm everywhere
    Family("qwen3", ("qwen3",), ("qwen3",), "layers.{L}.", _QKNORM_ROLES, qk_norm=True, fused_layout="concat",
           attention_bias_key="attention_bias", hf_class="Qwen3ForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=False, qk_norm=True), _LLAMA_HPARAMS,
                                 hf_config_extra=_SILU, llamacpp_absent=("blk.{L}.attn_output.bias",),
                                 rope_scalings=("linear", "yarn")),
           residual_readers_centering=False),
    # llama.cpp src/models/gemma3*.cpp + llama-model.cpp: sliding-window rope base 10000
    # (rope_freq_base_train_swa), every 6th layer global (set_swa_pattern(6)), attention scaled by
    # 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim; the 27B exception is not handled).
    # residual readers: modeling_gemma3: Gemma3RMSNorm everywhere
    Family("gemma3", ("gemma3_text", "gemma3"), ("gemma3",), "layers.{L}.", _QKNORM_ROLES, qk_norm=True, fused_layout="concat",
           attention_bias_key="attention_bias", softcap_key="attn_logit_softcapping", norm_weight_offset=1.0,
           hf_class="Gemma3ForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               _GEMMA3_TENSORS, _LLAMA_HPARAMS + ("sliding_window",),
               hf_config_extra={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                                "attn_logit_softcapping": None},
               llamacpp_fixed={"rope_local_theta": 10000.0, "global_every": 6, "query_pre_attn_scalar": "head_dim"},
               llamacpp_absent=("blk.{L}.attn_output.bias",), model_types=("gemma3_text",),
               # Gemma 3 4B / 12B / 27B: linear factor 8 on the full-attention layers only, as
               # llama.cpp's gemma3 applies rope.scaling.factor (its sliding layers keep scale 1)
               rope_scalings=("linear",),
               notes="norm weights are stored as 1 + w (Gemma3RMSNorm multiplies by 1 + w)"),
           residual_readers_centering=False),
    # Gemma 2 (modeling_gemma2): Gemma2RMSNorm x * (1 + w) before and after attention and MLP, no
    # q/k norm, attention and final logits soft-capped (cap * tanh(x / cap)), sliding and full layers
    # alternating, embeddings scaled by sqrt(hidden), tied head.  llama.cpp (llama-model.cpp
    # LLM_ARCH_GEMMA2): set_swa_pattern(2) (layer i slides iff (i + 1) % 2 != 0), attention scaled by
    # 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim; the 27B exception is not handled), soft-capping
    # always applied with defaults 50 / 30 when the file has no value.
    # residual readers: modeling_gemma2: Gemma2RMSNorm everywhere
    Family("gemma2", ("gemma2",), ("gemma2",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           attention_bias_key="attention_bias", softcap_key="attn_logit_softcapping", norm_weight_offset=1.0,
           hf_class="Gemma2ForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               _GEMMA2_TENSORS, _LLAMA_HPARAMS + ("sliding_window", "attn_softcap", "final_softcap"),
               hf_config_extra={"hidden_activation": "gelu_pytorch_tanh"},
               llamacpp_fixed={"global_every": 2, "query_pre_attn_scalar": "head_dim"},
               llamacpp_absent=("blk.{L}.attn_output.bias",),
               hparam_required=("attn_softcap", "final_softcap"),
               notes="norm weights are stored as 1 + w (Gemma2RMSNorm multiplies by 1 + w)"),
           residual_readers_centering=False),
    # modeling_olmo2: post-norm only (post_attention_layernorm / post_feedforward_layernorm), so no attn_norm role.
    # residual readers: modeling_olmo2: attention reads the raw stream; Olmo2RMSNorm after each sublayer
    Family("olmo2", ("olmo2",), ("olmo2",), "layers.{L}.",
           {r: m for r, m in _QKNORM_ROLES.items() if r != "attn_norm"}, qk_norm=True, norm_placement="post",
           fused_layout="concat",
           attention_bias_key="attention_bias", input_norm=None, hf_class="Olmo2ForCausalLM", surgery_roles=_FUSE_OUT,
           # src/models/olmo2.cpp: q/k/v biases optional (create_tensor_qkv), no attn_output bias
           conversion=Conversion(_OLMO2_TENSORS, _LLAMA_HPARAMS, hf_config_extra=_SILU,
                                 llamacpp_absent=("blk.{L}.attn_output.bias",)),
           residual_readers_centering=False),
    # residual readers: modeling_starcoder2: nn.LayerNorm input/post_attention_layernorm, model.norm
    Family("starcoder2", ("starcoder2",), ("starcoder2",), "layers.{L}.", _LLAMA_ROLES, attention_bias_key="use_bias",
           input_norm="layer", fused_layout="concat",
           bias_switch_extra=("mlp.c_fc", "mlp.c_proj"),   # modeling_starcoder2: bias=config.use_bias
           hf_class="Starcoder2ForCausalLM", ln_eps_key="norm_epsilon", surgery_roles=_FUSE_OUT,
           conversion=Conversion(_STARCODER2_TENSORS, _LLAMA_HPARAMS + ("ln_eps",),
                                 hf_config_extra={"hidden_act": "gelu_pytorch_tanh"}),
           residual_readers_centering=True),
    # residual readers: modeling_phi3: Phi3RMSNorm everywhere
    Family("phi3", ("phi3",), ("phi3",), "layers.{L}.",
           {"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "attn_norm": "input_layernorm",
            "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj"},   # q/k/v: after `qkv split`
           fused_layout="concat", unfused_as=_PHI3_TO, hf_class="Phi3ForCausalLM", surgery_roles=_SPLIT_OUT,
           conversion=Conversion(
               _PHI3_TENSORS, _LLAMA_HPARAMS + ("orig_ctx", "sliding_window"), hf_config_extra=_SILU,
               hparam_unset={"sliding_window": 0},   # Phi3MiniModel.set_gguf_parameters
               hf_from_gguf={"rope.scaling.original_context_length": "original_max_position_embeddings"},
               rope_scalings=("longrope",)),   # Phi-3-128k, Phi-3.5-mini, Phi-4-mini
           residual_readers_centering=False),
    # residual readers: modeling_phi: the parallel block reads input_layernorm (nn.LayerNorm); final_layernorm feeds lm_head
    Family("phi", ("phi",), ("phi2",), "layers.{L}.",
           {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.dense",
            "q_norm": "self_attn.q_layernorm", "k_norm": "self_attn.k_layernorm", "attn_norm": "input_layernorm"},
           input_norm="layer", hf_class="PhiForCausalLM",
           # Phi2Model.set_gguf_parameters writes head_count_kv = head_count: MHA only (as Phi-2 is)
           conversion=Conversion(_PHI2_TENSORS, ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv",
                                                 "rope_theta", "ln_eps", "rotary_dim", "vocab_size"),
                                 hf_config_extra={"hidden_act": "gelu_new"}, llamacpp_fixed={"n_head_kv": "n_head"}),
           bias_note="Phi-2 rotates only partial_rotary_factor of each head; the rest of the key bias is exactly redundant",
           residual_readers_centering=True),
    # q/k/v roles of fused families name where `qkv split` writes the parts (no transformers module
    # reads them; `qkv fuse` restores the original layout bit for bit).
    # residual readers: modeling_gpt2: ln_1, ln_2, ln_f are nn.LayerNorm; the (tied) head reads ln_f
    Family("gpt2", ("gpt2",), ("gpt2",), "h.{L}.", {"qkv": "attn.c_attn", "o": "attn.c_proj", "attn_norm": "ln_1",
                                                   "q": "attn.q_proj", "k": "attn.k_proj", "v": "attn.v_proj"},
           position="absolute", fused_layout="concat", conv1d=True, input_norm="layer",
           bias_note="attn.bias / attn.masked_bias are causal-mask buffers, not learned biases",
           hf_class="GPT2LMHeadModel", ln_eps_key="layer_norm_epsilon", surgery_roles=_SPLIT_OUT,
           buffers=("attn.bias", "attn.masked_bias"),
           conversion=Conversion(
               _GPT2_TENSORS, ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "ln_eps", "vocab_size"),
               hf_rename={"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                          "max_position_embeddings": "n_positions", "intermediate_size": "n_inner",
                          **_NO_KV_KEYS, "head_dim": None},
               hf_config_extra={"activation_function": "gelu_new"}, ff_default_mult=4,
               llamacpp_absent=_FUSED_QKV_ONLY),
           residual_readers_centering=True),
    # residual readers: modeling_gpt_neox: both use_parallel_residual branches read a LayerNorm; final_layer_norm
    Family("gpt_neox", ("gpt_neox",), ("gptneox",), "layers.{L}.",
           {"qkv": "attention.query_key_value", "o": "attention.dense", "attn_norm": "input_layernorm",
            "q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj"},
           fused_layout="per_head", input_norm="layer", hf_class="GPTNeoXForCausalLM", surgery_roles=_SPLIT_OUT,
           conversion=Conversion(_GPT_NEOX_TENSORS, ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "rope_theta",
                                                     "rotary_dim", "parallel_residual", "ln_eps", "vocab_size"),
                                 hf_config_extra={"hidden_act": "gelu"},
                                 # GPTNeoXConfig has no kv head count (MHA): modeling_gpt_neox never
                                 # reads one, so a stray one in config.json is ignored here too (its rotary
                                 # embedding does read a head_dim: that one is kept)
                                 hf_rename=dict(_NO_KV_KEYS), llamacpp_absent=_FUSED_QKV_ONLY),
           residual_readers_centering=True),
    # residual readers: modeling_bloom: word_embeddings_layernorm, input/post_attention_layernorm, ln_f (LayerNorm)
    Family("bloom", ("bloom",), ("bloom",), "h.{L}.",
           {"qkv": "self_attention.query_key_value", "o": "self_attention.dense", "attn_norm": "input_layernorm",
            "q": "self_attention.q_proj", "k": "self_attention.k_proj", "v": "self_attention.v_proj"},
           position="alibi", fused_layout="per_head", input_norm="layer",
           hf_class="BloomForCausalLM", ln_eps_key="layer_norm_epsilon", surgery_roles=_SPLIT_OUT,
           conversion=Conversion(
               _BLOOM_TENSORS, ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "ln_eps", "vocab_size"),
               ff_default_mult=4, hparam_fallback={"n_ctx": "n_embd"},
               hf_rename={"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", **_NO_KV_KEYS,
                          "head_dim": None, "intermediate_size": None, "max_position_embeddings": None},
               llamacpp_absent=_FUSED_QKV_ONLY),     # BLOOM is MHA: head_count_kv = head_count, as BloomModel writes it
           residual_readers_centering=True),
    # residual readers: modeling_falcon: ln_attn/ln_mlp or input_layernorm, post_attention_layernorm, ln_f (LayerNorm)
    Family("falcon", ("falcon", "RefinedWeb", "RefinedWebModel"), ("falcon",), "h.{L}.",
           {"qkv": "self_attention.query_key_value", "o": "self_attention.dense",
            "q": "self_attention.q_proj", "k": "self_attention.k_proj", "v": "self_attention.v_proj",
            # new_decoder_architecture with two parallel norms feeds attention from ln_attn
            "attn_norm": ("ln_attn", "input_layernorm")},
           fused_layout="per_head", input_norm="layer",
           fused_layout_rules=(("new_decoder_architecture", True, "grouped"), ("multi_query", True, "concat")),
           position_rules=(("alibi", True, "alibi"),), attention_bias_key="bias",
           # modeling_falcon: num_kv_heads is used only with new_decoder_architecture or
           # without multi_query; multi_query alone means one shared k/v head.
           kv_heads_rules=(({"multi_query": True, "new_decoder_architecture": False}, 1),),
           bias_switch_extra=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),   # modeling_falcon: bias=config.bias
           hf_class="FalconForCausalLM", ln_eps_key="layer_norm_epsilon", surgery_roles=_SPLIT_OUT,
           # FalconModel.set_gguf_parameters writes context_length 2048 and feed_forward_length
           # 4 * hidden whatever the config says; we write the config's values (the same for
           # Falcon-7B/40B; llama.cpp sizes ffn_up from the key)
           conversion=Conversion(
               _FALCON_TENSORS, ("n_ctx", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "rope_theta", "ln_eps",
                                 "vocab_size"),
               ff_default_mult=4, gguf_strings={"tensor_data_layout": "jploski"},
               hf_rename={"num_key_value_heads": "num_kv_heads", "intermediate_size": "ffn_hidden_size",
                          "head_dim": None},
               llamacpp_needs=_FALCON_NEEDS, hf_config_cases=_FALCON_CASES,
               hf_alt_when=("num_ln_in_parallel_attn", 1), llamacpp_absent=_FUSED_QKV_ONLY),
           residual_readers_centering=True),
    # residual readers: modeling_opt: self_attn_layer_norm / final_layer_norm per layer and the
    # decoder's final_layer_norm (nn.LayerNorm) read the pre-LN stream; the (tied) head reads the last.
    # _remove_final_layer_norm drops that last norm; do_layer_norm_before=False (OPT-350m) lets the first
    # attention read the summed embeddings unnormalised.
    Family("opt", ("opt",), (), "layers.{L}.",
           {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.out_proj",
            "attn_norm": "self_attn_layer_norm"},
           position="absolute", input_norm="layer", attention_bias_key="enable_bias",
           bias_switch_extra=("fc1", "fc2"),   # modeling_opt: bias=config.enable_bias on every linear
           hf_class="OPTForCausalLM",
           residual_readers_centering=True,
           residual_readers_rules=(
               ("_remove_final_layer_norm", True,
                "the output head reads the residual stream without a final LayerNorm (_remove_final_layer_norm)"),
               ("do_layer_norm_before", False,
                "post-norm OPT: the first attention reads the summed embeddings without a norm"))),
    # --- MoE decoders: llama-style attention, a routed expert FFN per layer.  llama.cpp hard-codes
    # whether the top-k routing weights are renormalised (build_moe_ffn's norm_w: false in
    # src/models/qwen2moe.cpp and olmoe.cpp, true in qwen3moe.cpp and llama.cpp's Mixtral path).
    # residual readers: modeling_qwen2_moe: Qwen2MoeRMSNorm everywhere
    Family("qwen2_moe", ("qwen2_moe",), ("qwen2moe",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           attention_bias_key="qkv_bias", hf_class="Qwen2MoeForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=False, mlp=_moe_mlp("mlp", shared=True)),
                                 _LLAMA_HPARAMS + _MOE_HPARAMS, hf_config_extra=_SILU,
                                 llamacpp_fixed={"norm_topk_prob": False}),
           residual_readers_centering=False),
    # residual readers: modeling_qwen3_moe: Qwen3MoeRMSNorm everywhere
    Family("qwen3_moe", ("qwen3_moe",), ("qwen3moe",), "layers.{L}.", _QKNORM_ROLES, qk_norm=True,
           fused_layout="concat", attention_bias_key="attention_bias", hf_class="Qwen3MoeForCausalLM",
           surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=False, qk_norm=True, mlp=_moe_mlp("mlp")),
                                 _LLAMA_HPARAMS + _MOE_HPARAMS, hf_config_extra=_SILU,
                                 llamacpp_absent=("blk.{L}.attn_output.bias",),
                                 llamacpp_fixed={"norm_topk_prob": True}),
           residual_readers_centering=False),
    # modeling_olmoe: q_norm / k_norm over the whole projection (not per head), pre-norm layers.
    # residual readers: modeling_olmoe: OlmoeRMSNorm everywhere
    Family("olmoe", ("olmoe",), ("olmoe",), "layers.{L}.", _QKNORM_ROLES, qk_norm=True, fused_layout="concat",
           attention_bias_key="attention_bias", hf_class="OlmoeForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=False, qk_norm=True, mlp=_moe_mlp("mlp")),
                                 _LLAMA_HPARAMS + _MOE_HPARAMS, hf_config_extra=_SILU,
                                 llamacpp_absent=("blk.{L}.attn_output.bias",),
                                 # src/models/olmoe.cpp: attn_k_norm is n_embd wide, so no GQA
                                 llamacpp_fixed={"norm_topk_prob": False, "n_head_kv": "n_head"}),
           residual_readers_centering=False),
    # DeepSeek-V2 / V2-Lite (modeling_deepseek_v2): MLA attention, no key or value projection of its
    # own (keys and values come from the kv latent; no biases: attention_bias false as released),
    # RoPE on a decoupled qk_rope_head_dim slice, rotary pairs interleaved natively (apply_rotary_emb
    # views (2i, 2i+1) as complex numbers; llama.cpp's deepseek2 rotates them the same way: no permutation).
    # residual readers: modeling_deepseek_v2: DeepseekV2RMSNorm everywhere
    Family("deepseek_v2", ("deepseek_v2",), ("deepseek2",), "layers.{L}.",
           {"q": "self_attn.q_proj", "o": "self_attn.o_proj", "attn_norm": "input_layernorm"},
           rope_pairs="interleaved", hf_class="DeepseekV2ForCausalLM", latent_attention=True,
           bias_note="MLA: keys and values are expanded from a compressed latent (kv_b_proj) with a decoupled "
                     "rotary key; there is no key projection and no key bias",
           conversion=Conversion(
               _DEEPSEEK2_TENSORS, _DEEPSEEK2_HPARAMS, hparam_sums=_DEEPSEEK2_SUMS, gguf_values={"n_head_kv": 1},
               # modeling_deepseek_v2: _keep_in_fp32_modules_strict = ["gate.weight"] (DeepseekV2TopkRouter
               # creates its weight float32 and routes in float32)
               hf_float32=("model.layers.{L}.mlp.gate.weight",),
               hf_config_extra=_SILU, hf_rename={"num_experts": "n_routed_experts", "head_dim": None,
                                                  # the rotary width is qk_rope_head_dim itself
                                                  "partial_rotary_factor": None},
               hf_from_gguf={"leading_dense_block_count": ("first_k_dense_replace", 0),
                             "attention.q_lora_rank": ("q_lora_rank", None),
                             "expert_shared_count": ("n_shared_experts", 0),
                             "expert_weights_scale": ("routed_scaling_factor", 1.0),
                             "expert_group_count": ("n_group", None), "expert_group_used_count": ("topk_group", None)},
               llamacpp_fixed={"n_head_kv": "n_head"},
               llamacpp_needs=(("attention_bias", False, "llama.cpp's deepseek2 graph has no attention bias slots"),
                               ("mlp_bias", False, "llama.cpp's deepseek2 graph has no MLP bias slots"),
                               *_DEEPSEEK2_NEEDS),
               rope_scalings=("yarn",), yarn_log_mul=True,    # DeepSeek-V2 / V2-Lite: factor 40, mscale 0.707
               notes="kv_b_proj is written as attn_k_b (per head, transposed) and attn_v_b, as llama.cpp's "
                     "converter does for its absorbed MLA; head_count_kv is 1 (MLA as MQA)"),
           residual_readers_centering=False),
    # Mixtral: llama.cpp's LlamaModel writes it as llama (Q/K permuted) with stacked experts; the
    # top-k weights are always renormalised, as llama.cpp's llama graph does (norm_w true).
    # residual readers: modeling_mixtral: MixtralRMSNorm everywhere
    Family("mixtral", ("mixtral",), (), "layers.{L}.", _LLAMA_ROLES, gguf_qk_permuted=True, fused_layout="concat",
           hf_class="MixtralForCausalLM", surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               _llama_like_tensors(perm=True, mlp=_moe_mlp("block_sparse_moe", ("w1", "w3", "w2"))),
               _LLAMA_HPARAMS + _MOE_HPARAMS, gguf_arch="llama", gguf_when="expert_count", hf_config_extra=_SILU,
               hf_rename={"num_experts": "num_local_experts"}),
           residual_readers_centering=False),
    # Phi-3.5-MoE (modeling_phimoe; llama.cpp's PhiMoeModel, a Phi3MiniModel with stacked experts):
    # separate q/k/v (not Phi-3's qkv_proj), not permuted; nn.LayerNorm with biases everywhere (eps
    # from rms_norm_eps, written as the rms epsilon); lm_head bias; block_sparse_moe gate + w1/w3/w2.
    # llama.cpp's phimoe graph is its phi3 graph (src/models/phi3.cpp): LLM_NORM_RMS plus the norm
    # biases (no mean subtraction) and softmax top-k renormalised routing where transformers runs
    # sparsemixer: the file is llama.cpp's, the logits are not transformers' (docs/convert.md).
    # residual readers: modeling_phimoe: nn.LayerNorm input/post_attention_layernorm and model.norm
    Family("phimoe", ("phimoe",), ("phimoe",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           attention_bias_key="attention_bias", input_norm="layer", hf_class="PhimoeForCausalLM",
           surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               (("model.embed_tokens.weight", "none"), *_wb("model.norm"), *_wb("lm_head"),
                *_wb("model.layers.{L}.input_layernorm"), *_qkvo("model.layers.{L}.self_attn"),
                *_wb("model.layers.{L}.post_attention_layernorm"),
                *_moe_mlp("block_sparse_moe", ("w1", "w3", "w2"))),
               _LLAMA_HPARAMS + ("orig_ctx", "sliding_window", "n_expert", "n_expert_used"),
               hf_config_extra=_SILU, hf_rename={"num_experts": "num_local_experts"}, eps_norm="rms",
               hparam_unset={"sliding_window": 0},   # Phi3MiniModel.set_gguf_parameters
               hf_from_gguf={"rope.scaling.original_context_length": "original_max_position_embeddings"},
               llamacpp_needs=_PHIMOE_NEEDS, rope_scalings=("longrope",), longrope_mscales=True,
               llamacpp_differs="llama.cpp runs phimoe with its phi3 graph: RMS norm plus the LayerNorm bias (no mean "
                                "subtraction) and softmax top-2 routing where transformers runs LayerNorm and "
                                "sparsemixer, so its logits are not transformers' (4.8e-2 relative on a tiny model; "
                                "docs/convert.md)"),
           residual_readers_centering=True),
    # Granite: llama with four multipliers (attention, embedding, residual, logits); llama.cpp's
    # GraniteModel is a LlamaModel (Q/K permuted) and ignores head_dim.
    # residual readers: modeling_granite: GraniteRMSNorm everywhere
    Family("granite", ("granite",), ("granite",), "layers.{L}.", _LLAMA_ROLES, gguf_qk_permuted=True,
           fused_layout="concat", attention_bias_key="attention_bias", hf_class="GraniteForCausalLM",
           surgery_roles=_FUSE_OUT,
           conversion=Conversion(_llama_like_tensors(perm=True), _LLAMA_HPARAMS + _GRANITE_HPARAMS,
                                 hf_config_extra=_SILU),
           residual_readers_centering=False),
    # Command-R (modeling_cohere): parallel attention + MLP from one CohereLayerNorm (no bias), rotary
    # pairs interleaved natively (llama.cpp's command-r rotates (2i, 2i+1): no permutation), tied
    # embeddings, logits scaled by logit_scale.  residual readers: CohereLayerNorm (centering) everywhere.
    Family("cohere", ("cohere",), ("command-r",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           rope_pairs="interleaved",
           attention_bias_key="attention_bias", input_norm="layer", hf_class="CohereForCausalLM",
           surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               (("model.embed_tokens.weight", "none"), ("model.norm.weight", "none"),
                ("model.layers.{L}.input_layernorm.weight", "none"),
                *_qkvo("model.layers.{L}.self_attn"), *_DENSE_MLP),
               _LLAMA_HPARAMS + ("ln_eps", "logit_scale"), hf_config_extra=_SILU,
               hf_rename={"logits_scaling": "logit_scale"}, gguf_strings={"rope.scaling.type": "none"}),
           # CohereLayerNorm subtracts the mean (in float32, whatever the model dtype): a c·1 shift of
           # every residual-writing bias changes a float64 model's logits by ~1e-7 relative, the
           # norm's own float32 rounding (measured on a 2-layer model with attention_bias=True)
           residual_readers_centering=True),
    # StableLM (modeling_stablelm): LayerNorms with biases, partial rotary, optional q/k/v biases
    # (use_qkv_bias), sequential or parallel residual (use_parallel_residual).  The per-head
    # q/k LayerNorms of qk_layernorm models are not converted (no row: such a model is refused).
    # residual readers: nn.LayerNorm input/post_attention_layernorm and model.norm
    Family("stablelm", ("stablelm",), ("stablelm",), "layers.{L}.", _LLAMA_ROLES, fused_layout="concat",
           attention_bias_key="use_qkv_bias", input_norm="layer", hf_class="StableLmForCausalLM",
           surgery_roles=_FUSE_OUT,
           conversion=Conversion(
               (("model.embed_tokens.weight", "none"), *_wb("model.norm"), ("lm_head.weight", "none"),
                *_wb("model.layers.{L}.input_layernorm"),
                *_qkvo("model.layers.{L}.self_attn", o_bias=False),
                *_wb("model.layers.{L}.post_attention_layernorm"), *_DENSE_MLP),
               _LLAMA_HPARAMS + ("ln_eps", "parallel_residual"), hf_config_extra=_SILU),
           residual_readers_centering=True),
    # residual readers: modeling_bert: post-LN, sublayer output + residual feeds LayerNorm; embeddings sum too
    Family("bert", ("bert",), ("bert",), "layer.{L}.",
           {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
            "o": "attention.output.dense"},
           position="absolute", norm_placement="post", input_norm=None,
           bias_note="post-norm: LayerNorm's beta does not make the q/k/v biases redundant",
           hf_class="BertModel",
           residual_readers_centering=True),
)

# Configs without ``architectures``: model types whose checkpoints are bare encoders (read by
# ckpt_surgeon.verification.kinds; anything else is treated as a causal LM).
ENCODER_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra",
                                 "deberta", "deberta-v2", "camembert", "albert", "nomic_bert", "modernbert"})

@dataclass(frozen=True)
class ClipProjector:
    """How llama.cpp runs the encoder of an mmproj file (``general.architecture`` ``clip``: the vision /
    audio projector file llama.cpp and Ollama ship beside a VLM) of some projector types: which graph,
    and what that graph does with positions.  The file itself does not say (its tensors and
    ``clip.*`` keys are the same for a learned-position SigLIP and a 2-D rotary Qwen2-VL tower);
    llama.cpp decides in ``tools/mtmd/clip.cpp`` ``clip_get_graph_builder`` (projector type -> graph
    class) and the graph's ``build()`` in ``tools/mtmd/models/<graph>.cpp``: ``build_vit`` adds a
    learned table (``learned_pos_embd``) and rotates q / k only through its ``add_pos`` callback
    (``build_rope_2d``, ``ggml_rope_multi`` in vision mode: every dimension, rows and columns).
    tests/test_mmproj.py checks each row against those sources (a rotary graph mentions rope, an
    absolute one does not)."""

    types: tuple[str, ...]        # clip.projector_type / clip.vision.projector_type / clip.audio.projector_type
    graph: str                    # clip.cpp graph class
    position: str                 # absolute (a table added to the input, no rotation) | rope
    rope_axes: int | None = None  # rope: position coordinates the rotation reads (2: image rows and columns)


CLIP_PROJECTORS: tuple[ClipProjector, ...] = (
    # models/siglip.cpp: build_vit(inp, ..., learned_pos_embd = model.position_embeddings, nullptr)
    ClipProjector(("gemma3", "idefics3", "lfm2", "janus_pro", "phi4"), "clip_graph_siglip", "absolute"),
    # models/llava.cpp: its own layer loop; inp + get_rows(position_embeddings, positions), no rotation
    ClipProjector(("mlp", "ldp", "ldpv2", "adapter"), "clip_graph_llava", "absolute"),
    # models/whisper-enc.cpp: Whisper's encoder, a view of position_embeddings as the learned table
    ClipProjector(("ultravox", "voxtral", "qwen2a", "glma", "meralion", "musicflamingo"), "clip_graph_whisper_enc",
                  "absolute"),
    # models/internvl.cpp: build_vit(..., model.position_embeddings, nullptr)
    ClipProjector(("internvl",), "clip_graph_internvl", "absolute"),
    # models/pixtral.cpp: add_pos = build_rope_2d(cur, pos_h, pos_w, rope_theta)
    ClipProjector(("pixtral", "lightonocr"), "clip_graph_pixtral", "rope", 2),
    # models/qwen2vl.cpp: ggml_rope_multi(..., d_head/2, mrope_sections, GGML_ROPE_TYPE_VISION) on Q and K
    ClipProjector(("qwen2vl_merger", "qwen2.5vl_merger"), "clip_graph_qwen2vl", "rope", 2),
    # models/qwen3vl.cpp: a learned table resized to the image, and the same vision rope on Q and K
    ClipProjector(("qwen3vl_merger",), "clip_graph_qwen3vl", "rope", 2),
    # models/llama4.cpp, models/kimivl.cpp: a learned table and build_rope_2d
    ClipProjector(("llama4",), "clip_graph_llama4", "rope", 2),
    ClipProjector(("kimivl",), "clip_graph_kimivl", "rope", 2),
)


def clip_projector(projector_type: str | None) -> ClipProjector | None:
    """The :data:`CLIP_PROJECTORS` row of an mmproj projector type (None: not in the registry)."""
    return next((p for p in CLIP_PROJECTORS if projector_type in p.types), None)


# GGUF layer prefix, the same for every architecture (gguf-py TENSOR_NAMES "blk.{bid}.*"; the role
# names under it are read from gguf-py in ckpt_surgeon.arch.gguf_names).
GGUF_LAYER = "blk.{L}."

# Generic patterns tried for architectures not in the registry (name-only recognition).
GENERIC_ROLES = {
    "q": ("q_proj", "query", "q", "wq", "attention.wq", "attn.q_proj"),
    "k": ("k_proj", "key", "k", "wk", "attention.wk", "attn.k_proj"),
    "v": ("v_proj", "value", "v", "wv", "attention.wv", "attn.v_proj"),
    "qkv": ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv", "in_proj"),
}

# HF config keys, in order of preference (transformers >= 5 and Hub-era spellings both).
CONFIG_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "head_dim": ("head_dim",),
    "max_positions": ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len", "n_ctx"),
    "rope_theta": ("rope_theta", "rotary_emb_base", "rope_base"),
    "partial_rotary": ("partial_rotary_factor", "rotary_pct"),
}


def by_name(name: str | None) -> Family | None:
    """The registry record whose ``name`` is ``name`` (a layout's ``family``), None if none is."""
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    return None


def absent_config_keys(fam: Family | None) -> frozenset:
    """Generic HF config keys that ``fam``'s config class does not have (its conversion's
    ``hf_rename`` maps them to None: BLOOM, GPT-2 have no num_key_value_heads).  transformers
    ignores such a key when config.json carries it, so readers of heads and sizes must too."""
    conv = fam.conversion if fam is not None else None
    return frozenset(k for k, v in (conv.hf_rename if conv else {}).items() if v is None)


def kv_heads(rules: tuple, cfg: dict, default):
    """A config's kv head count: ``default`` (what it says) unless one of a family's
    ``kv_heads_rules`` holds (modeling_falcon: ``multi_query`` without ``new_decoder_architecture``
    is one kv head, whatever ``num_kv_heads`` says)."""
    for conds, value in rules:
        if all(bool(cfg.get(k)) == v for k, v in conds.items()):
            default = value
    return default


def by_model_type(model_type: str | None) -> Family | None:
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    return None


def by_gguf_arch(arch: str | None) -> Family | None:
    for fam in FAMILIES:
        if arch in fam.gguf_archs:
            return fam
    return None


def by_architectures(archs) -> Family | None:
    """Fallback on config ``architectures`` (e.g. ``Qwen2ForCausalLM``)."""
    for a in archs or ():
        low = a.lower()
        for fam in FAMILIES:
            for mt in fam.model_types:
                if low.startswith(mt.replace("_", "")) or low.startswith(mt):
                    return fam
    return None
