"""GGUF <-> Hugging Face: tensor names, per-tensor transforms and hyper-parameter keys.

One :class:`ArchSpec` per GGUF architecture, *built from the registry*
(:mod:`ckpt_surgeon.arch.families`: each family's :class:`~ckpt_surgeon.arch.families.Conversion`).
Both directions read the same rows, so a name that converts one way converts back the other
way; nothing in ``hf_to_gguf`` / ``gguf_to_hf`` branches on an architecture name.

Where the rows come from:

- HF tensor names and transforms: the registry (after llama.cpp ``convert_hf_to_gguf.py``:
  ``LlamaModel.modify_tensors`` permutes Q/K rows for llama/mistral only; ``GPT2Model`` stores
  Conv1D weights transposed back to ``[out, in]``; ``Gemma3Model`` adds ``norm_shift = 1.0`` to
  every ``*norm.weight``).
- GGUF tensor names: derived here from gguf-py's own tables, ``TensorNameMap`` (the HF spellings
  per architecture that llama.cpp's converter uses) and ``TENSOR_NAMES`` (the GGUF templates), never
  typed by hand.  A registry row gguf-py cannot name is an error at import.
- hyper-parameter keys: ``gguf_writer.py`` ``add_*`` methods (``{arch}.context_length`` ...)
  and each model's ``set_gguf_parameters``.

Transforms (the registry names them; each is written once, forward and inverse, in
:mod:`ckpt_surgeon.conversion.transforms`): ``perm_q`` / ``perm_k`` (llama's rotary row order),
``conv1d`` (GPT-2's transposed weights), ``norm_shift`` (Gemma's ``1 + w``), ``row`` (an HF
``[1, n]`` weight that llama.cpp's quantizer may re-write 1-D), ``qkv_per_head`` / ``qkv_grouped``
(fused QKV rows reordered to ``[Q; K; V]``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..arch import families as F
from ..arch.gguf_names import gguf_roles, gguf_tensor_name

# --- tensor rules -------------------------------------------------------------------------

TRANSFORMS = F.TRANSFORMS


@dataclass(frozen=True)
class TensorRule:
    """One HF name pattern <-> one GGUF name pattern.  ``{L}`` is the layer index; ``{E}`` (HF
    side only) an expert index: the HF tensors of every expert are one GGUF tensor, stacked on a
    new leading axis in expert order (llama.cpp ``Qwen2MoeModel.modify_tensors``: ``torch.stack``)."""

    hf: str
    gguf: str
    transform: str = "none"
    hf_alt: str | None = None    # the HF spelling where the arch's ``hf_alt_when`` holds (same GGUF name)
    split: str | None = None     # a Split row's kind (ckpt_surgeon.conversion.splits)
    parts: tuple = ()            # a Split row's GGUF names, in part order (``gguf`` is the first)

    @property
    def experts(self) -> bool:
        return "{E}" in self.hf

    def part_transform(self, i: int) -> str:
        """The per-tensor transform that makes part ``i`` of a Split row (``mla_kv_b:1``)."""
        return f"{self.split}:{i}"


def _split_rule(gguf_arch: str, row: F.Split) -> TensorRule:
    if F.SPLIT_KINDS.get(row.kind) != len(row.parts):
        raise ValueError(f"registry: split {row.kind!r} of {row.hf} is not a known kind with {len(row.parts)} parts")
    names = tuple(gguf_tensor_name(gguf_arch, p) for p in row.parts)
    if None in names:
        raise ValueError(f"registry: gguf-py's TensorNameMap has no {gguf_arch} name for a part of {row.hf}")
    return TensorRule(row.hf, names[0], "none", split=row.kind, parts=names)


def _tensor_rules(gguf_arch: str, rows: tuple) -> tuple[TensorRule, ...]:
    out = []
    for row in rows:
        if isinstance(row, F.Split):
            out.append(_split_rule(gguf_arch, row))
            continue
        hf, transform, *alt = row
        if transform not in TRANSFORMS:
            raise ValueError(f"registry: unknown transform {transform!r} for {hf}")
        g = gguf_tensor_name(gguf_arch, hf)
        if g is None:
            raise ValueError(f"registry: gguf-py's TensorNameMap has no {gguf_arch} name for {hf}")
        for a in alt:
            if gguf_tensor_name(gguf_arch, a) != g:
                raise ValueError(f"registry: {a} (the alternative of {hf}) is not {g} in gguf-py's TensorNameMap")
        out.append(TensorRule(hf, g, transform, alt[0] if alt else None))
    return tuple(out)


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
    "rope_local_theta": "rope.freq_base_swa",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "ln_eps": "attention.layer_norm_epsilon",
    "rotary_dim": "rope.dimension_count",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "sliding_window": "attention.sliding_window",
    "vocab_size": "vocab_size",
    "orig_ctx": "rope.scaling.original_context_length",
    "n_expert": "expert_count",
    "n_expert_used": "expert_used_count",
    "n_ff_exp": "expert_feed_forward_length",
    "n_ff_shexp": "expert_shared_feed_forward_length",
    "attention_scale": "attention.scale",
    "embedding_scale": "embedding_scale",
    "residual_scale": "residual_scale",
    "logit_scale": "logit_scale",
    "parallel_residual": "use_parallel_residual",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
    "n_dense_lead": "leading_dense_block_count",
    "q_lora_rank": "attention.q_lora_rank",
    "kv_lora_rank": "attention.kv_lora_rank",
    "key_length_mla": "attention.key_length_mla",
    "value_length_mla": "attention.value_length_mla",
    "n_shexp": "expert_shared_count",
    "expert_weights_scale": "expert_weights_scale",
    "n_expert_group": "expert_group_count",
    "n_expert_group_used": "expert_group_used_count",
}
# GGUF value type per canonical hyper-parameter (u32 ints, f32 floats), as llama.cpp writes them.
HPARAM_BOOLS = frozenset({"parallel_residual"})
HPARAM_FLOATS = frozenset({"rope_theta", "rope_local_theta", "rms_eps", "ln_eps", "attention_scale",
                           "embedding_scale", "residual_scale", "logit_scale", "attn_softcap", "final_softcap",
                           "expert_weights_scale"})

# HF config spellings per canonical hyper-parameter, preferred first.  Config spellings drift:
# transformers >= 5 nests rope settings in `rope_parameters` (modeling_rope_utils.py
# convert_rope_params_to_dict), Hub-era configs keep them top level.  A dotted entry is a nested path.
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
    "n_expert": ("num_experts", "num_local_experts", "n_routed_experts"),
    "n_expert_used": ("num_experts_per_tok",),
    "n_ff_exp": ("moe_intermediate_size",),
    "n_ff_shexp": ("shared_expert_intermediate_size",),
    "norm_topk_prob": ("norm_topk_prob",),
    "attention_scale": ("attention_multiplier",),
    "embedding_scale": ("embedding_multiplier",),
    "residual_scale": ("residual_multiplier",),
    "logit_scale": ("logits_scaling", "logit_scale"),
    "parallel_residual": ("use_parallel_residual",),
    "attn_softcap": ("attn_logit_softcapping",),
    "final_softcap": ("final_logit_softcapping",),
    "n_dense_lead": ("first_k_dense_replace",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "n_shexp": ("n_shared_experts",),
    "expert_weights_scale": ("routed_scaling_factor",),
    "n_expert_group": ("n_group",),
    "n_expert_group_used": ("topk_group",),
}
# Keys read even where the model's config class does not declare them (issue 24): transformers'
# modeling code asks for head_dim by name (modeling_qwen2: ``getattr(config, "head_dim", None) or
# hidden_size // num_attention_heads``; Qwen3-MoE's config saves one it does not declare), and
# llama.cpp's converter reads these two context lengths, which change no computed value, from
# config.json (BloomModel: ``seq_length``; PhiMoeModel, a Phi3MiniModel: ``original_max_position_embeddings``).
# Families whose class ignores one of them say so in the registry (``hf_rename`` to None).
UNDECLARED_READ = frozenset({"head_dim", "seq_length", "original_max_position_embeddings"})


def class_config(cfg: dict, declared) -> dict:
    """``cfg`` (transformers' ``to_dict()``) as the model class reads it: without the top-level keys
    its config class does not declare (``declared``: :func:`.model_check.declared_config_keys`;
    None keeps everything), but for :data:`UNDECLARED_READ`.  transformers keeps such a key as a
    plain attribute that no code of the class reads: a stray ``rotary_pct`` in a Llama config.json,
    or GPT-2's ``intermediate_size`` (it reads ``n_inner``), must not be read here either."""
    if declared is None:
        return cfg
    keep = set(declared) | UNDECLARED_READ
    return {k: v for k, v in cfg.items() if k in keep}


# Hyper-parameters written only when the config has them (MoE sizes, Granite's multipliers,
# Gemma 2's soft-capping; an arch's ``hparam_required`` refuses a config without them).
OPTIONAL_HPARAMS = ("n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp", "attention_scale", "embedding_scale",
                    "residual_scale", "logit_scale", "parallel_residual", "attn_softcap", "final_softcap",
                    "n_dense_lead", "q_lora_rank", "kv_lora_rank", "n_shexp", "expert_weights_scale",
                    "n_expert_group", "n_expert_group_used")


@dataclass(frozen=True)
class ArchSpec:
    """Everything the converters need to know about one GGUF architecture (a view of the
    registry: see :class:`ckpt_surgeon.arch.families.Conversion` for the fields' meaning)."""

    gguf_arch: str                       # general.architecture
    hf_model_types: tuple[str, ...]      # config.json model_type values that convert to it (first: GGUF -> HF)
    hf_architecture: str                 # config.json architectures[0] written GGUF -> HF
    tensors: tuple[TensorRule, ...]
    hparams: tuple[str, ...]             # canonical hyper-parameters written HF -> GGUF
    hf_rename: dict = field(default_factory=dict)        # generic HF key -> this family's key
    hf_from_gguf: dict = field(default_factory=dict)     # extra "{arch}.<suffix>" -> HF key
    hf_config_extra: dict = field(default_factory=dict)  # fixed HF config entries
    ff_default_mult: int | None = None   # n_ff = mult * n_embd when the HF config leaves it None (GPT-2)
    norm: str = "rms"                    # rms | layer (which epsilon key)
    rope: bool = True
    bias_switch: str | None = None       # HF config flag turning q/k/v(/o) biases on (llama attention_bias)
    bias_probe: str | None = None        # GGUF tensor whose presence sets bias_switch
    llamacpp_absent: tuple[str, ...] = ()  # GGUF names llama.cpp's graph has no slot for (file would not load)
    llamacpp_fixed: dict = field(default_factory=dict)
    hparam_unset: dict = field(default_factory=dict)
    gguf_strings: dict = field(default_factory=dict)    # fixed "{arch}.<suffix>" string keys written
    hparam_fallback: dict = field(default_factory=dict)  # hyper-parameter -> the one it copies when absent
    hparam_required: tuple = ()          # hyper-parameters the config must give
    gguf_when: str | None = None         # read back as this spec when "{arch}.<gguf_when>" is in the metadata
    kv_heads_rules: tuple = ()           # the family's (conditions, kv head count) rules (Falcon multi_query)
    llamacpp_needs: tuple = ()           # (HF config key, value llama.cpp runs, why)
    hf_config_cases: tuple = ()          # (condition, HF config entries), the first that holds (GGUF -> HF)
    hf_alt_when: tuple | None = None     # (HF config key, value): tensor rows use their hf_alt spelling
    llamacpp_differs: str = ""           # llama.cpp's graph computes another function (warned both ways)
    hf_float32: tuple = ()               # HF tensor templates kept float32 at any HF dtype (GGUF -> HF)
    hparam_sums: dict = field(default_factory=dict)   # hyper-parameter -> HF keys it is the sum of
    gguf_values: dict = field(default_factory=dict)   # hyper-parameter -> value written whatever the config
    hf_to_gguf: bool = True              # False: read GGUF -> HF only (InternLM2 as Llama)
    rope_scalings: tuple = ()            # scaled rope types converted ("llama3": rope_freqs.weight)
    longrope_mscales: bool = False       # longrope's attention factor: short_mscale / long_mscale
    yarn_log_mul: bool = False           # yarn's mscale / mscale_all_dim as rope.scaling.yarn_log_multiplier
    gguf_to_hf: bool = True              # False: HF -> GGUF only (InternLM2's own layout)
    hf_equivalent: tuple | None = None   # (model_type, key renames) transformers checks a class-less HF model as
    spm_quirks: dict | None = None       # the vocabulary from tokenizer.model, with the converter's quirks
    notes: str = ""


def _spec(gguf_arch: str, fams: list) -> ArchSpec:
    """The spec of one GGUF architecture from the families written as it (the first one owns it)."""
    fam = fams[0]
    conv = fam.conversion
    probe = None
    if fam.attention_bias_key:
        probe = "blk.0." + gguf_roles()["q"] + ".bias"
    return ArchSpec(
        gguf_arch, tuple(mt for f in fams for mt in (f.conversion.model_types or f.model_types)), fam.hf_class,
        _tensor_rules(gguf_arch, conv.tensors), conv.hparams, hf_rename=conv.hf_rename,
        hf_from_gguf=conv.hf_from_gguf, hf_config_extra=conv.hf_config_extra,
        ff_default_mult=conv.ff_default_mult, norm=conv.eps_norm or ("layer" if fam.input_norm == "layer" else "rms"),
        rope=fam.position == "rope", bias_switch=fam.attention_bias_key, bias_probe=probe,
        llamacpp_absent=conv.llamacpp_absent, llamacpp_fixed=conv.llamacpp_fixed,
        hparam_unset=conv.hparam_unset, gguf_when=conv.gguf_when,
        gguf_strings=conv.gguf_strings, hparam_fallback=conv.hparam_fallback, kv_heads_rules=fam.kv_heads_rules,
        llamacpp_needs=conv.llamacpp_needs, hf_config_cases=conv.hf_config_cases, hf_alt_when=conv.hf_alt_when,
        hparam_required=conv.hparam_required, hparam_sums=conv.hparam_sums, gguf_values=conv.gguf_values,
        hf_float32=conv.hf_float32, llamacpp_differs=conv.llamacpp_differs, hf_to_gguf=conv.hf_to_gguf,
        rope_scalings=conv.rope_scalings, longrope_mscales=conv.longrope_mscales,
        yarn_log_mul=conv.yarn_log_mul, gguf_to_hf=conv.gguf_to_hf, hf_equivalent=conv.hf_equivalent,
        spm_quirks=conv.spm_quirks, notes=conv.notes)


def _archs() -> tuple[ArchSpec, ...]:
    groups: dict[str, list] = {}
    variants = []
    for fam in F.FAMILIES:
        if fam.conversion is None:
            continue
        target = fam.conversion.gguf_arch or (fam.gguf_archs[0] if fam.gguf_archs else None)
        if target is None:
            raise ValueError(f"registry: family {fam.name} converts but names no GGUF architecture")
        if fam.conversion.gguf_when or not fam.conversion.gguf_to_hf:
            # its own tensor table: chosen by a metadata key (Mixtral), or for HF -> GGUF only (InternLM2)
            variants.append(_spec(target, [fam]))
            continue
        groups.setdefault(target, []).append(fam)
    # the family that reads the architecture back (by_gguf_arch) owns its spec
    for target, fams in groups.items():
        owner = F.by_gguf_arch(target)
        if owner in fams:
            fams.sort(key=lambda f: f is not owner)
    return tuple(_spec(target, fams) for target, fams in groups.items()) + tuple(variants)


ARCHS: tuple[ArchSpec, ...] = _archs()


def by_gguf_arch(arch: str | None, metadata: dict | None = None) -> ArchSpec | None:
    """The spec that reads GGUF architecture ``arch`` back: a variant whose ``gguf_when`` key the
    ``metadata`` has (a llama file with ``llama.expert_count`` is Mixtral), else the arch's own."""
    for a in ARCHS:
        if a.gguf_arch == arch and a.gguf_when and metadata is not None and f"{arch}.{a.gguf_when}" in metadata:
            return a
    for a in ARCHS:
        if a.gguf_arch == arch and not a.gguf_when and a.gguf_to_hf:
            return a
    return None


def by_model_type(model_type: str | None) -> ArchSpec | None:
    """The spec an HF folder of ``model_type`` converts to (GGUF -> HF-only specs excluded)."""
    for a in ARCHS:
        if a.hf_to_gguf and model_type in a.hf_model_types:
            return a
    return None


def supported_model_types() -> list[str]:
    return list(dict.fromkeys(mt for a in ARCHS if a.hf_to_gguf for mt in a.hf_model_types))


# --- name matching ------------------------------------------------------------------------


def template_regex(template: str) -> re.Pattern:
    """``blk.{L}.attn_q.weight`` -> a regex with the layer index as group ``L`` (and an expert
    index ``{E}`` as group ``E``)."""
    rx = re.escape(template)
    for key in ("L", "E"):
        rx = rx.replace(re.escape("{" + key + "}"), rf"(?P<{key}>\d+)")
    return re.compile("^" + rx + "$")


@dataclass(frozen=True)
class NameMap:
    """Compiled matcher over one arch's rules, in one direction."""

    rules: tuple[TensorRule, ...]
    to_gguf: bool
    alt: bool = False     # GGUF -> HF: write each rule's hf_alt spelling where it has one

    def match(self, name: str) -> tuple[str, TensorRule] | None:
        """``name`` -> (name on the other side, rule), or None when no rule matches.  An expert
        row's HF name keeps ``{E}`` (GGUF -> HF: one per expert); see :meth:`expert`."""
        for rule, rx in _compiled(self.rules, self.to_gguf):
            m = rx.match(name)
            if m:
                target = rule.gguf if self.to_gguf else (rule.hf_alt or rule.hf) if self.alt else rule.hf
                if "L" in m.groupdict():
                    target = target.replace("{L}", m.group("L"))
                return target, rule
        return None

    def part(self, name: str) -> int | None:
        """GGUF -> HF: which part of a Split row the GGUF ``name`` is (0 makes the HF tensor, joining
        all parts; the others are read by it), else None."""
        for rule, rx in _compiled(self.rules, self.to_gguf):
            if rule.split and rx.match(name):
                return next(i for i, p in enumerate(rule.parts) if template_regex(p).match(name))
        return None

    def expert(self, name: str) -> int | None:
        """The expert index in an HF ``name`` of an expert row (HF -> GGUF), else None."""
        for rule, rx in _compiled(self.rules, self.to_gguf):
            m = rx.match(name)
            if m:
                return int(m.group("E")) if "E" in m.groupdict() else None
        return None


_CACHE: dict = {}


def _compiled(rules: tuple[TensorRule, ...], to_gguf: bool):
    key = (id(rules), to_gguf)
    got = _CACHE.get(key)
    if got is None:
        got = [(r, template_regex(r.hf if to_gguf else r.gguf)) for r in rules]
        # HF -> GGUF reads a module under either of its spellings
        got += [(r, template_regex(r.hf_alt)) for r in rules if to_gguf and r.hf_alt]
        # GGUF -> HF: every part of a Split row names its one HF tensor
        got += [(r, template_regex(p)) for r in rules if not to_gguf for p in r.parts[1:]]
        _CACHE[key] = got
    return got


def hf_to_gguf_names(spec: ArchSpec) -> NameMap:
    return NameMap(spec.tensors, True)


def gguf_to_hf_names(spec: ArchSpec, cfg: dict | None = None) -> NameMap:
    """GGUF -> HF names for the HF config ``cfg`` will be (its ``hf_alt_when`` picks the spelling)."""
    when = spec.hf_alt_when
    return NameMap(spec.tensors, False, alt=when is not None and cfg is not None and cfg.get(when[0]) == when[1])


def kv_heads(spec: ArchSpec, cfg: dict, default: int) -> int:
    """The kv head count of an HF config (:func:`ckpt_surgeon.arch.families.kv_heads`)."""
    return F.kv_heads(spec.kv_heads_rules, cfg, default)


def _case_holds(cond: dict, hp: dict, tensors) -> bool:
    for key, value in cond.items():
        if key == "tensor":
            if value not in tensors:
                return False
        elif hp.get(key) != (hp.get(value) if value == "n_head" else value):
            return False
    return True


def hf_config_case(spec: ArchSpec, hp: dict, tensors) -> dict:
    """The HF config entries of the first ``hf_config_cases`` row whose condition holds for a GGUF's
    hyper-parameters and tensor names (``{}`` when none does)."""
    return next((dict(entries) for cond, entries in spec.hf_config_cases if _case_holds(cond, hp, tensors)), {})


# --- HF config reading --------------------------------------------------------------------


def config_find(cfg: dict, keys: tuple[str, ...], *, objects: bool = True) -> tuple[str, object] | None:
    """(spelling, value) of the first present, non-None value among ``keys`` (dotted keys walk
    nested dicts); ``objects=False`` passes over dict values."""
    for key in keys:
        cur = cfg
        for part in key.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                cur = None
                break
        if cur is not None and (objects or not isinstance(cur, dict)):
            return key, cur
    return None


def config_get(cfg: dict, keys: tuple[str, ...]):
    """First present, non-None value among ``keys`` (dotted keys walk nested dicts), dicts passed over."""
    found = config_find(cfg, keys, objects=False)
    return found[1] if found is not None else None


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
    if value in ("head_dim", "n_head"):
        return hp[value]
    if key == "global_every":
        return _layer_types(hp["n_layer"], int(value))
    return value


def fixed_from_hf(key: str, cfg: dict):
    """The HF config's own value for a llama.cpp constant (None when the config does not say)."""
    if key == "global_every":
        v = config_get(cfg, HF_HPARAM_KEYS["layer_types"])
        return list(v) if isinstance(v, (list, tuple)) else v     # anything else: compared, and refused
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
        # the file's rope scaling (llama.cpp applies it to the full-attention layers only)
        full = {k: v for k, v in (cfg.get("rope_parameters") or {}).items() if k != "partial_rotary_factor"}
        cfg["rope_parameters"] = {"full_attention": dict(full, rope_type=full.get("rope_type", "default"),
                                                         rope_theta=theta),
                                  "sliding_attention": {"rope_type": "default", "rope_theta": local}}
        cfg["rope_local_base_freq"] = local
    for key, value in fixed.items():
        if key not in ("global_every", "query_pre_attn_scalar", "rope_local_theta"):
            cfg[HF_HPARAM_KEYS[key][0]] = fixed_expected(key, value, hp)
