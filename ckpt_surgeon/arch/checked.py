"""Checked reads of untrusted config.json / GGUF metadata values: type and range where read.

Every count, width, length, rope parameter and epsilon that a command takes from a user's
``config.json`` or a GGUF's key-values passes through one of these before it is used: a
string where a count belongs, a boolean where an integer belongs, a NaN epsilon or a head count
of -1 or 2**64 - 1 is one :class:`~ckpt_surgeon.errors.ConfigError` naming the file and the key
(one line, exit code 2 in the CLI), never a ``TypeError`` later, a loop over 10**12 layers or a
value silently written into an output.

:data:`GGUF_BOUNDS` holds the type and range of every ``{arch}.<suffix>`` hyper-parameter key
(gguf-py ``constants.py`` ``Keys.LLM`` / ``Keys.Attention`` / ``Keys.Rope``); the GGUF -> config
mapping (:mod:`.gguf_config`), the layout resolver (:mod:`.resolve`) and both converters read
through it, so one key has one rule wherever it is read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

# Upper bounds, checked before anything loops over or allocates by a value (the largest public
# models: ~200 layers, hidden 16k-25k, 128 heads, 10M-token contexts, vocabularies of 256k).
MAX_LAYERS = 100_000
MAX_WIDTH = 1 << 24
MAX_POSITIONS = 1 << 40
MAX_VOCAB = 1 << 31
U32_MAX = 2 ** 32 - 1                       # llama.cpp writes every count as a GGUF uint32
F32_MAX = 3.4028234663852886e38             # ... and every float as a float32


def describe(v) -> str:
    """``v`` as an error message shows it: a short repr and what kind of value it is."""
    if isinstance(v, float):
        kind = ("not a number" if math.isnan(v) else "infinite" if math.isinf(v) else
                "a float" if v.is_integer() else "a fraction")
    elif isinstance(v, (list, tuple)) or hasattr(v, "tolist"):
        kind = "a list"
    else:
        kind = {str: "a string", bool: "a boolean", dict: "an object"}.get(type(v), type(v).__name__)
    if isinstance(v, (list, tuple)) and len(v) > 8:
        shown = repr(list(v[:8]))[:-1] + ", ...]"
    else:
        shown = repr(v)
    return f"{shown if len(shown) <= 40 else shown[:36] + ' ...'} ({kind})"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Bounds:
    """Type and range of one value: ``kind`` int | float | bool | str; ``minimum`` / ``maximum``
    inclusive (``above``: the minimum itself is excluded, e.g. a positive rope theta)."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False

    def _want(self, maximum) -> str:
        if self.kind in ("bool", "str"):
            return "a boolean" if self.kind == "bool" else "a string"
        if self.kind == "int":
            return "an integer"
        lo, hi = self.minimum, maximum
        if lo == 0 and self.above and hi is None:
            return "a finite positive number"
        if lo is None and hi is None:
            return "a finite number"
        if hi is None:
            return f"a finite number {'above' if self.above else 'of at least'} {lo:g}"
        if self.above:
            return f"a finite number above {lo:g}" + (f" and at most {hi:g}" if hi is not None else "")
        return f"a finite number between {lo:g} and {hi:g}"

    def check(self, name: str, v, *, path: str | None, integral_floats: bool = False, maximum=None, what: str = ""):
        """``v`` checked (and returned as int / float / bool); ``name`` starts the message.
        ``integral_floats``: accept ``4.0`` for an integer (JSON writers produce it);
        ``maximum`` narrows the upper bound (a writer's field width)."""
        hi = self.maximum if maximum is None else (maximum if self.maximum is None else min(maximum, self.maximum))
        if self.kind in ("bool", "str"):
            if not isinstance(v, bool if self.kind == "bool" else str):
                raise ConfigError(f"{name} is {describe(v)}; it must be {self._want(hi)}{what}", path=path)
            return v
        if self.kind == "int":
            if integral_floats and isinstance(v, float) and v.is_integer():
                v = int(v)
            if not _is_int(v):
                raise ConfigError(f"{name} is {describe(v)}; it must be an integer{what}", path=path)
            if not self.minimum <= v <= hi:
                raise ConfigError(f"{name} is {v:,}; it must be between {self.minimum:,} and {hi:,}{what}",
                                  path=path)
            return v
        if not (_is_number(v) and math.isfinite(float(v))):
            raise ConfigError(f"{name} is {describe(v)}; it must be {self._want(hi)}{what}", path=path)
        low_ok = self.minimum is None or (v > self.minimum if self.above else v >= self.minimum)
        if not (low_ok and (hi is None or v <= hi)):
            raise ConfigError(f"{name} is {v:g}; it must be {self._want(hi)}{what}", path=path)
        return float(v)


COUNT = Bounds("int", 1, MAX_WIDTH)       # heads, widths, head dims
POSITIONS = Bounds("int", 1, MAX_POSITIONS)
POSITIVE = Bounds("float", 0, None, above=True)
EPSILON = Bounds("float", 0, 1)
FRACTION = Bounds("float", 0, 1)

# "{arch}.<suffix>" -> bounds, for every hyper-parameter key the tools read or write.
GGUF_BOUNDS: dict[str, Bounds] = {
    "block_count": Bounds("int", 0, MAX_LAYERS),
    "embedding_length": COUNT,
    "feed_forward_length": COUNT,
    "attention.head_count": COUNT,
    "attention.head_count_kv": COUNT,
    "attention.key_length": COUNT,
    "attention.value_length": COUNT,
    "rope.dimension_count": Bounds("int", 0, MAX_WIDTH),
    "context_length": POSITIONS,
    "attention.sliding_window": Bounds("int", 0, MAX_POSITIONS),
    "rope.scaling.original_context_length": POSITIONS,
    "vocab_size": Bounds("int", 1, MAX_VOCAB),
    "rope.freq_base": Bounds("float", 0, F32_MAX, above=True),
    "rope.freq_base_swa": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.factor": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.yarn_attn_factor": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.yarn_beta_fast": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.yarn_beta_slow": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.attn_factor": Bounds("float", 0, F32_MAX, above=True),
    "rope.scaling.yarn_log_multiplier": Bounds("float", 0, F32_MAX, above=True),
    "attention.layer_norm_rms_epsilon": EPSILON,
    "attention.layer_norm_epsilon": EPSILON,
    "use_parallel_residual": Bounds("bool"),
    "attention.causal": Bounds("bool"),
    "rope.scaling.type": Bounds("str"),
    "tensor_data_layout": Bounds("str"),         # Falcon's "jploski" (FalconModel.set_gguf_parameters)
    # MoE (expert_used_count <= expert_count is for transformers to judge) and Granite / Command-R scales
    "expert_count": COUNT,
    "expert_used_count": COUNT,
    "expert_feed_forward_length": COUNT,
    "expert_shared_feed_forward_length": COUNT,
    "attention.scale": POSITIVE,
    "embedding_scale": POSITIVE,
    "residual_scale": POSITIVE,
    "logit_scale": POSITIVE,
    # Gemma 2: cap * tanh(x / cap) on attention scores and final logits (llama.cpp divides by the cap)
    "attn_logit_softcapping": POSITIVE,
    "final_logit_softcapping": POSITIVE,
    # DeepSeek-V2 (DeepseekV2Model.set_gguf_parameters): MLA widths, dense lead, shared experts, routing
    "leading_dense_block_count": Bounds("int", 0, MAX_LAYERS),
    "attention.kv_lora_rank": COUNT,
    "attention.q_lora_rank": COUNT,
    "attention.key_length_mla": COUNT,
    "attention.value_length_mla": COUNT,
    # sliding-window layers' own head sizes (llama-model.cpp: n_embd_head_k_swa, default the full layers')
    "attention.key_length_swa": COUNT,
    "attention.value_length_swa": COUNT,
    "expert_shared_count": Bounds("int", 0, MAX_WIDTH),
    "expert_weights_scale": POSITIVE,
    "expert_weights_norm": Bounds("bool"),
    "expert_group_count": COUNT,
    "expert_group_used_count": COUNT,
    # mmproj files (clip.vision.* / clip.audio.*, read by arch/gguf_clip.py): the same suffixes, plus these
    "attention.head_dim": COUNT,
    "projector_type": Bounds("str"),
}
# A file outside the registry may lack a part in some layers or all: llama.cpp writes
# {arch}.attention.head_count = 0 and feed_forward_length = 0 for an attention-free, FFN-free model (Mamba 2:
# Mamba2Model.set_gguf_parameters), and per-layer head counts and widths with 0 for a hybrid's recurrent or
# FFN-less layers (NemotronH, GraniteHybrid: its runtime tells them apart by n_head_kv(il) == 0).  Registry
# families have attention and an FFN in every layer: for them a 0 stays refused (GGUF_BOUNDS).
ZERO_MEANS_NONE = {"attention.head_count": Bounds("int", 0, MAX_WIDTH),
                   "attention.head_count_kv": Bounds("int", 0, MAX_WIDTH),
                   "feed_forward_length": Bounds("int", 0, MAX_WIDTH)}
TOKEN_ID = Bounds("int", 0, 2 ** 64 - 1)  # tokenizer.ggml.*_token_id (compared with the vocabulary where used)


def gguf_value(metadata: dict, key: str, bounds: Bounds, *, path: str | None, per_layer: bool = False):
    """``metadata[key]`` checked against ``bounds`` (None when absent).  ``per_layer``: an
    integer array (one value per layer, as some files store head counts) is accepted, each
    item checked, and returned as a list."""
    v = metadata.get(key)
    if v is None:
        return None
    name = f"GGUF metadata key '{key}'"
    if per_layer and isinstance(v, (list, tuple)):
        if not v:
            raise ConfigError(f"{name} is an empty list; it must be {bounds._want(bounds.maximum)} (or one per layer)",
                              path=path)
        return [bounds.check(name, x, path=path) for x in v]
    return bounds.check(name, v, path=path)


def gguf_hparam(metadata: dict, arch: str, suffix: str, *, path: str | None, per_layer: bool = False,
                zero_means_none: bool = False):
    """``{arch}.<suffix>`` checked against :data:`GGUF_BOUNDS` (a suffix without bounds is a bug);
    ``zero_means_none``: the keys of :data:`ZERO_MEANS_NONE` may be 0 (an architecture outside the registry)."""
    bounds = ZERO_MEANS_NONE.get(suffix, GGUF_BOUNDS[suffix]) if zero_means_none else GGUF_BOUNDS[suffix]
    return gguf_value(metadata, f"{arch}.{suffix}", bounds, path=path, per_layer=per_layer)


def config_int(cfg: dict, keys, *, path: str | None, minimum: int, maximum: int, what: str = ""):
    """The first of ``keys`` present in ``cfg`` as an integer in ``[minimum, maximum]`` (None if
    absent); a string, boolean, list, fraction or out-of-range value is a ConfigError naming it."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return Bounds("int", minimum, maximum).check(k, v, path=path, integral_floats=True, what=what)
    return None


def config_float(cfg: dict, keys, *, path: str | None, positive: bool = False, maximum: float | None = None):
    """The first of ``keys`` present as a finite number (None if absent), at most ``maximum``
    when given; else a ConfigError."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return (POSITIVE if positive else Bounds("float")).check(k, v, path=path, maximum=maximum)
    return None
