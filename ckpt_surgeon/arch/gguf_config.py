"""GGUF metadata -> a Hugging Face style config dict (as data, one table per concern).

llama.cpp's converter (``convert_hf_to_gguf.py``) writes HF hyper-parameters under
``{arch}.*`` keys (gguf-py ``constants.py`` ``Keys.LLM`` / ``Keys.Attention`` /
``Keys.Rope``).  This module inverts that: the result uses the keys transformers'
configs use (``num_hidden_layers``, ``num_attention_heads`` ...) so that
:func:`ckpt_surgeon.arch.resolve.resolve` and the GGUF -> HF converter read GGUF and
safetensors sources the same way.  Rope settings are written in both spellings
(top-level ``rope_theta`` and transformers-5 ``rope_parameters``, as
``modeling_rope_utils.convert_rope_params_to_dict`` reads them).

Nothing here branches on an architecture name: per-architecture facts (HF model type, model
class, LayerNorm epsilon key, bias switch) are fields of the registry's
:class:`~ckpt_surgeon.arch.families.Family` rows, looked up by ``general.architecture``.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from . import families as F
from .checked import GGUF_BOUNDS, TOKEN_ID, ZERO_MEANS_NONE, Bounds, describe, gguf_hparam, gguf_value
from .gguf_clip import clip_arch, clip_config


def _by_arch(attr: str) -> dict:
    """general.architecture -> one registry field, for every family that reads a GGUF arch."""
    out = {}
    for fam in F.FAMILIES:
        for arch in fam.gguf_archs:
            # a family with no transformers model type of its own (InternLM2) reads back as the
            # one its conversion writes (llama)
            types = fam.model_types or (fam.conversion.model_types if fam.conversion else None) or (None,)
            value = types[0] if attr == "model_type" else getattr(fam, attr)
            if value is not None:
                out.setdefault(arch, value)
    return out


# general.architecture -> HF model_type (transformers ``configuration_*.py``).
ARCH_MODEL_TYPE = _by_arch("model_type")
# general.architecture -> HF model class (config ``architectures``).
ARCH_HF_CLASS = _by_arch("hf_class")

# "{arch}.<suffix>" -> HF key, for every architecture (gguf-py Keys.LLM / Keys.Attention).
ARCH_KEYS = (
    ("block_count", "num_hidden_layers"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("embedding_length", "hidden_size"),
    ("feed_forward_length", "intermediate_size"),
    ("context_length", "max_position_embeddings"),
    ("attention.sliding_window", "sliding_window"),
    ("vocab_size", "vocab_size"),
    ("use_parallel_residual", "use_parallel_residual"),
    ("attention.causal", "is_causal"),
    ("expert_count", "num_experts"),                # Mixtral spells it num_local_experts (hf_rename)
    ("expert_used_count", "num_experts_per_tok"),
    ("expert_feed_forward_length", "moe_intermediate_size"),
    ("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
)

# Float multipliers: "{arch}.<suffix>" -> HF key (Granite's names; Cohere renames logits_scaling;
# Gemma 2's soft-capping values).
FLOAT_KEYS = (
    ("attention.scale", "attention_multiplier"),
    ("embedding_scale", "embedding_multiplier"),
    ("residual_scale", "residual_multiplier"),
    ("logit_scale", "logits_scaling"),
    ("attn_logit_softcapping", "attn_logit_softcapping"),
    ("final_logit_softcapping", "final_logit_softcapping"),
)

# Norm epsilon: GGUF key suffix -> HF key.  RMSNorm models use rms_norm_eps; LayerNorm
# models spell it per family (GPT-2/BLOOM/Falcon: layer_norm_epsilon; StarCoder2: norm_epsilon).
EPS_KEYS = (("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
            ("attention.layer_norm_epsilon", "layer_norm_eps"))
EPS_KEY_BY_ARCH = _by_arch("ln_eps_key")

# Tokenizer keys (gguf-py Keys.Tokenizer) -> HF config keys.
TOKENIZER_KEYS = (
    ("tokenizer.ggml.bos_token_id", "bos_token_id", TOKEN_ID),
    ("tokenizer.ggml.eos_token_id", "eos_token_id", TOKEN_ID),
    ("tokenizer.ggml.padding_token_id", "pad_token_id", TOKEN_ID),
    ("tokenizer.ggml.token_type_count", "type_vocab_size", Bounds("int", 0, 1 << 16)),
)

# GGUF yarn keys -> transformers' yarn rope parameters (TextModel.set_gguf_parameters writes them
# from the config's attention_factor / beta_fast / beta_slow when it has them).
YARN_KEYS = (("rope.scaling.yarn_attn_factor", "attention_factor"), ("rope.scaling.yarn_beta_fast", "beta_fast"),
             ("rope.scaling.yarn_beta_slow", "beta_slow"))
# GGUF rope scaling type -> transformers rope_type.
ROPE_SCALING_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn", "longrope": "longrope"}


def _uniform(value):
    """Per-layer arrays (e.g. head_count_kv in some files) -> one value (the largest when layers differ)."""
    if isinstance(value, list):
        return value[0] if all(v == value[0] for v in value) else max(value)
    return value


def _attention_free_layers(cfg: dict, metadata: dict, arch: str | None, path: str | None) -> None:
    """A file outside the registry with 0 kv heads in some layer or all (Mamba 2, NemotronH, GraniteHybrid):
    ``layer_kv_heads``, the per-layer count (arch/kv_layers.py caches no K / V there), and no head counts in
    the config when no layer has any (the heads default above must not invent them)."""
    if arch is None or arch in ARCH_HF_CLASS:
        return
    n = metadata.get(f"{arch}.block_count")
    kv = metadata.get(f"{arch}.attention.head_count_kv", metadata.get(f"{arch}.attention.head_count"))
    if not isinstance(n, int) or kv is None:
        return
    per = list(kv) if isinstance(kv, (list, tuple)) else [kv] * n
    if len(per) != n or all(per):
        return
    cfg["layer_kv_heads"] = [int(v) for v in per]
    if not any(per):
        cfg.pop("num_key_value_heads", None)
        cfg.pop("num_attention_heads", None) if not metadata.get(f"{arch}.attention.head_count") else None


def config_from_gguf(metadata: dict, tensors: dict | None = None, *, path: str | None = None, read=None) -> dict:
    """HF-style config dict from GGUF ``metadata`` (and tensor names, for tied embeddings / biases).
    ``read(info) -> array``: reads the few tensors that hold config settings (Phi-3's longrope
    factors), which then appear in ``rope_parameters`` as transformers spells them."""
    tensors = tensors or {}
    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    cfg: dict = {"model_type": ARCH_MODEL_TYPE.get(arch, arch)}
    if arch is not None and arch == clip_arch():
        # an mmproj file: no text stack, one sub-config per encoder (clip.vision.* / clip.audio.*)
        return {**cfg, **clip_config(metadata, path=path)}
    if arch in ARCH_HF_CLASS:
        cfg["architectures"] = [ARCH_HF_CLASS[arch]]
    for suffix, key in ARCH_KEYS:
        v = _uniform(gguf_hparam(metadata, arch, suffix, path=path, per_layer=GGUF_BOUNDS[suffix].kind == "int",
                                 zero_means_none=arch not in ARCH_HF_CLASS))
        if v is not None and not (v == 0 and suffix in ZERO_MEANS_NONE):     # 0 in every layer: no such part
            cfg[key] = v
    if "num_attention_heads" in cfg and "num_key_value_heads" not in cfg:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    _attention_free_layers(cfg, metadata, arch, path)
    for suffix, key in FLOAT_KEYS:
        v = gguf_hparam(metadata, arch, suffix, path=path)
        if v is not None:
            cfg[key] = f32_decimal(v)
    for suffix, key in EPS_KEYS:
        v = gguf_hparam(metadata, arch, suffix, path=path)
        if v is not None:
            cfg[EPS_KEY_BY_ARCH.get(arch, key) if key == "layer_norm_eps" else key] = f32_decimal(v)

    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    key_len = gguf_hparam(metadata, arch, "attention.key_length", path=path)
    head_dim = key_len if key_len is not None else (hidden // heads if heads and hidden else None)
    if head_dim is not None:
        cfg["head_dim"] = int(head_dim)

    _rope_keys(cfg, metadata, arch, head_dim, path)
    if read is not None and tensors and all(n in tensors for n in LONGROPE_TENSORS) and "rope_parameters" in cfg:
        _longrope_keys(cfg, metadata, arch, tensors, read, path)
    _vocab_keys(cfg, metadata, tensors, path)
    if tensors:
        _tensor_keys(cfg, arch, tensors)
    return cfg


_F32_MAX = float(np.finfo(np.float32).max)


def f32_decimal(v) -> float:
    """A GGUF FLOAT32 value as the shortest decimal that reads back as the same float32: 1e-05, not
    its exact float64 widening 9.999999747378752e-06 (issue 36: a converted config.json held the
    latter).  Writing it to a GGUF again gives the same bits; a value no float32 holds is kept."""
    f = float(v)
    # beyond float32's range no float32 holds it: kept, and never cast (numpy would overflow to inf)
    if not math.isfinite(f) or abs(f) > _F32_MAX or float(np.float32(f)) != f:
        return f
    return float(np.format_float_positional(np.float32(f), unique=True, trim="0"))


def _rope_keys(cfg: dict, metadata: dict, arch: str | None, head_dim, path: str | None) -> None:
    """rope_theta, partial_rotary_factor, rope_scaling and rope_parameters into ``cfg``."""
    theta = gguf_hparam(metadata, arch, "rope.freq_base", path=path)
    rope_dim = gguf_hparam(metadata, arch, "rope.dimension_count", path=path)
    if theta is not None or rope_dim is not None:
        rp: dict = {"rope_type": "default", "rope_theta": float(theta) if theta is not None else 10000.0}
        cfg["rope_theta"] = rp["rope_theta"]
        if rope_dim is not None and head_dim:
            rp["partial_rotary_factor"] = cfg["partial_rotary_factor"] = rope_dim / head_dim
        stype = gguf_hparam(metadata, arch, "rope.scaling.type", path=path)
        factor = gguf_hparam(metadata, arch, "rope.scaling.factor", path=path)
        if stype is not None and stype != "none":
            rp["rope_type"] = ROPE_SCALING_TYPES.get(stype, stype)
            if factor is not None:
                rp["factor"] = f32_decimal(factor)
            orig = gguf_hparam(metadata, arch, "rope.scaling.original_context_length", path=path)
            if orig is not None:
                rp["original_max_position_embeddings"] = int(orig)
            for suffix, key in YARN_KEYS:
                v = gguf_hparam(metadata, arch, suffix, path=path)
                if v is not None:
                    rp[key] = f32_decimal(v)
            cfg["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        cfg["rope_parameters"] = rp


# llama.cpp's longrope factor tensors (Phi3MiniModel.generate_extra_tensors)
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def _longrope_keys(cfg: dict, metadata: dict, arch: str | None, tensors: dict, read, path: str | None) -> None:
    """A longrope file's factors, original context and attention factor (what llama.cpp applies:
    ``rope.scaling.attn_factor``, 1 when absent) into ``rope_parameters``."""
    rp = cfg["rope_parameters"]
    rp["rope_type"] = "longrope"
    rp["long_factor"], rp["short_factor"] = ([float(x) for x in read(tensors[n]).reshape(-1)] for n in LONGROPE_TENSORS)
    orig = gguf_hparam(metadata, arch, "rope.scaling.original_context_length", path=path)
    if orig is not None:
        rp["original_max_position_embeddings"] = int(orig)
    af = gguf_hparam(metadata, arch, "rope.scaling.attn_factor", path=path)
    rp["attention_factor"] = float(af) if af is not None else 1.0
    cfg["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}


def _vocab_keys(cfg: dict, metadata: dict, tensors: dict, path: str | None) -> None:
    """vocab_size (token list, else the embedding's rows) and the tokenizer's special ids into ``cfg``."""
    if "vocab_size" not in cfg:
        toks = metadata.get("tokenizer.ggml.tokens")
        if toks is not None:
            if isinstance(toks, str) or not hasattr(toks, "__len__"):
                raise ConfigError(f"GGUF metadata key 'tokenizer.ggml.tokens' is {describe(toks)}; it must be a list "
                                  "of strings", path=path)
            cfg["vocab_size"] = len(toks)
        elif "token_embd.weight" in tensors:
            cfg["vocab_size"] = int(tensors["token_embd.weight"].shape[0])
    for mkey, key, bounds in TOKENIZER_KEYS:
        v = gguf_value(metadata, mkey, bounds, path=path)
        if v is not None:
            cfg[key] = v


def _tensor_keys(cfg: dict, arch: str | None, tensors: dict) -> None:
    """What the tensor names say: tied embeddings, attention biases."""
    cfg["tie_word_embeddings"] = "output.weight" not in tensors
    fam = F.by_gguf_arch(arch)
    if fam and fam.attention_bias_key:
        cfg[fam.attention_bias_key] = any(
            n.startswith("blk.") and n.endswith((".attn_q.bias", ".attn_k.bias", ".attn_v.bias", ".attn_qkv.bias"))
            for n in tensors)
