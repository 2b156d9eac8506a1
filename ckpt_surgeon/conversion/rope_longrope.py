"""Phi-3's long-context RoPE (``rope_type: longrope``) <-> GGUF.

transformers (``modeling_rope_utils._compute_longrope_parameters``) divides each rotary
frequency by a per-dimension factor, ``short_factor`` for sequences up to
``original_max_position_embeddings`` and ``long_factor`` past it, and multiplies cos and sin by
an attention factor, ``sqrt(1 + ln(s) / ln(original))`` with ``s = max_position_embeddings /
original`` unless the config gives ``attention_factor`` (Phi-3.5-MoE's ``modeling_phimoe``
instead takes ``short_mscale`` / ``long_mscale`` from the config, by the same length rule).

llama.cpp's converter (``Phi3MiniModel.generate_extra_tensors``) writes the two factor lists as
F32 tensors ``rope_factors_long.weight`` / ``rope_factors_short.weight`` and the attention factor
as ``rope.scaling.attn_factor``, always computed by that formula from the context lengths.
llama.cpp then differs from transformers in two ways no file can change:

* it picks the factor list by its *context size* (``n_ctx`` above the original context: long),
  transformers by the *sequence length*; the two agree when ``n_ctx`` is at most the original
  context (short factors) or the sequence is longer than it (long factors).  transformers'
  Phimoe (5.24) runs the short factors at every length: its rotary embedding recomputes the
  frequencies without the sequence length;
* it applies the one attention factor at every length, where Phi-3.5-MoE's ``long_mscale``
  (1.243 as released, vs 1.190) applies past the original context.

HF -> GGUF therefore refuses a config whose short-context attention factor is not the formula's
(an ``attention_factor`` or ``short_mscale`` llama.cpp would not apply) and warns about the
rest; GGUF -> HF writes the parameters llama.cpp runs.
"""
from __future__ import annotations

import math

import numpy as np

from ..arch.checked import POSITIVE, Bounds
from ..errors import ConfigError, UnsupportedError

__all__ = ["LONG", "SHORT", "check_factor_lists", "longrope_to_gguf", "longrope_from_gguf", "llamacpp_attn_factor"]

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
_ORIG = Bounds("int", 2, 1 << 40)


def llamacpp_attn_factor(max_pos: int, orig: int) -> float:
    """The attention factor llama.cpp's converter writes (``Phi3MiniModel``, float64)."""
    scale = max_pos / orig
    return math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0


def _same_f32(a: float, b: float) -> bool:
    """Equal once stored as float32 (the GGUF key's type)."""
    return np.float32(a) == np.float32(b)


def check_factor_lists(rp: dict, spelling: str, path: str | None) -> None:
    """Both factor lists of a longrope rope dict as config.json spells it (``spelling``:
    rope_scaling / rope_parameters) are lists of finite positive numbers: checked before
    transformers reads the config (whose own checks fail on some such values without naming
    the key)."""
    for key in ("long_factor", "short_factor"):
        v = rp.get(key)
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{spelling}.{key} is {v!r}; a longrope RoPE needs a list of factors, one per rotary pair",
                              path=path)
        for i, x in enumerate(v):
            POSITIVE.check(f"{spelling}.{key}[{i}]", x, path=path)


def _factors(rp: dict, key: str, n: int, path: str | None) -> np.ndarray:
    v = rp.get(key)
    name = f"rope_parameters.{key}"
    if not isinstance(v, (list, tuple)) or len(v) != n:
        shown = f"{len(v)} values" if isinstance(v, (list, tuple)) else repr(v)
        raise ConfigError(f"{name} is {shown}; a longrope RoPE needs {n} (one per rotary pair)", path=path)
    return np.asarray([POSITIVE.check(f"{name}[{i}]", x, path=path) for i, x in enumerate(v)], np.float32)


def longrope_to_gguf(rp: dict, hp: dict, arch: str, *, mscales: bool, path: str | None, raw_orig=None):
    """``(tensors, kvs, warnings)`` for a longrope config: ``[(name, float32 array)]`` in the
    converter's order (long, short), ``[(key, float)]`` and what llama.cpp runs differently.
    ``rp``: the rope parameters as transformers reads them (what llama.cpp's converter reads
    too); ``mscales``: the model class reads ``short_mscale`` / ``long_mscale`` (modeling_phimoe);
    ``raw_orig``: config.json's top-level ``original_max_position_embeddings``, named in the
    refusal when transformers did not read it (PhimoeConfig has no such field)."""
    n = hp["rotary_dim"] // 2
    long_f, short_f = _factors(rp, "long_factor", n, path), _factors(rp, "short_factor", n, path)
    orig = _ORIG.check("rope_parameters.original_max_position_embeddings", rp.get("original_max_position_embeddings"),
                       path=path, integral_floats=True)
    max_pos = hp["n_ctx"]
    ours = llamacpp_attn_factor(max_pos, orig)
    formula = f"sqrt(1 + ln({max_pos} / {orig}) / ln({orig})) = {ours:.6g}" if max_pos > orig else "1"
    if mscales:
        short_key, long_key = "short_mscale", "long_mscale"
        short_v, long_v = (POSITIVE.check(f"rope_parameters.{k}", rp.get(k), path=path) for k in (short_key, long_key))
    else:
        short_key = long_key = "attention_factor"
        if rp.get("attention_factor") is not None:
            short_v = long_v = POSITIVE.check("rope_parameters.attention_factor", rp["attention_factor"], path=path)
        else:   # transformers: the formula with `factor`, else max_position_embeddings / original
            f = POSITIVE.check("rope_parameters.factor", rp.get("factor", max_pos / orig), path=path)
            short_v = long_v = math.sqrt(1 + math.log(f) / math.log(orig)) if f > 1.0 else 1.0
            short_key = long_key = "factor" if "factor" in rp else "attention factor"
    if not _same_f32(short_v, ours):
        hint = None
        if raw_orig is not None and raw_orig != orig:
            hint = (f"transformers reads original_max_position_embeddings as {orig}, not config.json's top-level "
                    f"{raw_orig}, which this config class does not read: if {raw_orig} is meant, give it inside "
                    "rope_scaling")
        raise UnsupportedError(f"longrope {short_key} gives attention factor {short_v:.6g}, but llama.cpp applies "
                               f"{formula} (rope.scaling.attn_factor, from max_position_embeddings / "
                               f"original_max_position_embeddings as its converter computes it): it would run "
                               "a different model", path=path, hint=hint)
    if mscales:
        pick = (f"llama.cpp runs the long longrope factors when n_ctx > {orig}; transformers' Phimoe runs the short "
                "ones at every length (its rotary embedding recomputes them without the sequence length)")
    else:
        pick = (f"llama.cpp picks the longrope factors by its context size (the long ones when n_ctx > {orig}), "
                "transformers by the sequence length")
    warnings = [f"{pick}: run llama.cpp with n_ctx <= {orig} for the short factors"]
    if not _same_f32(long_v, ours):
        warnings.append(f"llama.cpp applies attention factor {ours:.6g} at every length; transformers applies "
                        f"rope_parameters.{long_key} = {long_v:.6g} past {orig} tokens, so their logits differ there")
    return [(LONG, long_f), (SHORT, short_f)], [(f"{arch}.rope.scaling.attn_factor", ours)], warnings


def longrope_from_gguf(long_f, short_f, attn_factor: float | None, orig: int | None, max_pos: int, *,
                       rotary_dim: int, mscales: bool, path: str | None) -> dict:
    """transformers' rope parameters for llama.cpp's longrope tensors and attention factor."""
    long_f, short_f = (np.asarray(a, np.float32).reshape(-1) for a in (long_f, short_f))
    for name, a in ((LONG, long_f), (SHORT, short_f)):
        if a.size != rotary_dim // 2 or not (np.isfinite(a).all() and (a > 0).all()):
            raise UnsupportedError(f"{a.size} values (want {rotary_dim // 2}, each finite and > 0) are not longrope "
                                   "factors", path=path, tensor=name)
    if orig is None:
        raise UnsupportedError("longrope factors without rope.scaling.original_context_length: the length that "
                               "picks long or short factors is unknown", path=path, tensor=LONG)
    formula = llamacpp_attn_factor(max_pos, orig)
    af = 1.0 if attn_factor is None else float(attn_factor)     # llama.cpp's default
    if _same_f32(af, formula):
        af = formula                                            # the float64 value the converter rounded
    rp = {"rope_type": "longrope", "long_factor": [float(x) for x in long_f],
          "short_factor": [float(x) for x in short_f], "original_max_position_embeddings": int(orig)}
    if mscales:
        rp["short_mscale"] = rp["long_mscale"] = af     # llama.cpp applies one factor at every length
    elif af != formula:
        rp["attention_factor"] = af
    return rp
