"""HF folder (or .safetensors) -> GGUF that llama.cpp loads.

Two phases.  :func:`plan_hf_to_gguf` checks the source and decides everything the file holds:
every tensor's name, type, shape and size, and the key-values (:func:`gguf_kvs`).  Since sizes
follow from shape and type, every offset is known before any data is read, so the header block
is written first (:mod:`ckpt_surgeon.formats.write.gguf`, the one GGUF writing path, which
fold-bias's GGUF -> GGUF writer uses too) and then the data, streamed in chunks of rows by a few
threads (:mod:`.gguf_stream`): memory stays bounded by a few chunks, whatever the model size.
The bytes are those gguf-py's ``GGUFWriter`` wrote for the same plan (same key order and types,
32-byte alignment, zero padding after every tensor; ``tests/test_convert_stream.py``).  The
file is written beside the destination and renamed into place at the end; before that it is
re-parsed and every chunk's bytes are compared with what was written.

What is written mirrors llama.cpp's ``convert_hf_to_gguf.py`` for these families: names from
:mod:`.names`, llama-arch Q/K rows permuted (weights and biases), GPT-2 Conv1D weights
transposed, 1-D tensors (norms, biases) stored F32, 2-D weights in the requested type
(Q8_0 through :func:`~ckpt_surgeon.formats.quantize.quantize_q8_0`, bytes equal to gguf-py's
``quants.quantize``), ``rope.freq_base`` always written (llama.cpp
silently assumes 10000 when it is absent; Qwen2.5 needs 1e6), ``general.file_type``, and the
vocabulary from ``tokenizer.json`` (:mod:`.tokenizer`).
"""
from __future__ import annotations


import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arch.checked import COUNT, GGUF_BOUNDS, U32_MAX, Bounds
from ..arch.gguf_config import YARN_KEYS
from ..arch.rope import full_attention_rope
from ..errors import ConfigError, UnsupportedError
from ..formats.quant import ggml_types as GT
from ..formats.write import gguf as gw
from ..formats.hub import hf_cache
from ..progress import phase
from . import kept_blocks, output_path
from . import names as N
from .gguf_stream import verify_written, write_tensor_data
from .quant_plan import QUANT_ONLY, file_type_name
from .report import ConvertReport, TensorRecord
from .transforms import forward, lookup

# Source tensors that are not weights: buffers some exporters save (rotary caches, GPT-2's
# causal-mask buffers `attn.bias` / `attn.masked_bias` in transformers < 4.x exports).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.masked_bias")


@dataclass(frozen=True)
class _Planned:
    src: str
    dst: str
    transform: str
    shape: tuple
    ggml_type: str
    nbytes: int
    src_dtype: str
    stacked: tuple = ()     # expert rows: the HF tensors stacked (in expert order) into this one
    data: bytes | None = None  # a tensor made here, not read (llama3 rope factors: rope_freqs.weight)
    imatrix: object = None       # float32 importance weights (ne0 x experts) for llama.cpp's quantizer
    kept: str = ""               # an FP4 weight kept in this ggml type, its blocks moved bit for bit (kept_blocks)


def _targets(names: N.NameMap, absent: list, tnames: list, arch: str, path: str) -> list:
    """``(GGUF name, rule, HF names)`` per GGUF tensor, in source order: one HF name each, or every
    expert's (ordered by expert index, which must run 0..n-1) for an expert row, placed where its
    last expert tensor comes (llama.cpp's converters write a stack once they have every expert)."""
    out: dict[str, tuple] = {}
    experts: dict[str, dict[int, str]] = {}
    last: dict[str, int] = {}
    for pos, tname in enumerate(tnames):
        hit = names.match(tname)
        if hit is None:
            raise UnsupportedError(f"no GGUF name for this tensor in the {arch} mapping", path=path, tensor=tname)
        dst, rule = hit
        if any(rx.match(dst) for rx in absent):
            raise UnsupportedError(f"llama.cpp's {arch} graph has no {dst.split('.', 2)[-1]} tensor, so the "
                                   "file would not load ('wrong number of tensors')", path=path, tensor=tname)
        out.setdefault(dst, (dst, rule, (tname,)))
        last[dst] = pos
        if rule.experts:
            experts.setdefault(dst, {})[names.expert(tname)] = tname
    for dst, by_index in experts.items():
        if sorted(by_index) != list(range(len(by_index))):
            missing = sorted(set(range(max(by_index) + 1)) - set(by_index))
            raise ConfigError(f"experts {missing} are missing from the stack", path=path, tensor=by_index[min(by_index)])
        out[dst] = (dst, out[dst][1], tuple(by_index[i] for i in range(len(by_index))))
    return sorted(out.values(), key=lambda t: last[t[0]])


def _probe_hf_folder(folder: Path, cfg_path: str | None, isolate: bool) -> dict:
    """transformers' view of the folder (config with defaults, effective tokenizer.json, the
    model's tensor shapes): :func:`~.model_check.probe_folder`, with ``isolate`` in a short-lived
    child process (:func:`~.model_check.probe_folder_isolated`); answered from the cache when this
    config and tokenizer were probed before (:func:`~.model_check.probe_folder_cached`)."""
    from .model_check import probe_folder_cached
    if cfg_path is None:
        raise ConfigError("no config.json next to the weights: the architecture cannot be known",
                          path=str(folder), hint="HF -> GGUF needs the model folder with config.json")
    facts = probe_folder_cached(str(folder), cfg_path, isolate=isolate)
    if "config_error" in facts:
        raise ConfigError(f"transformers cannot read it ({facts['config_error']})", path=cfg_path)
    return facts


# Canonical hyper-parameters an HF config gives that have no GGUF key of their own.
_HF_ONLY_BOUNDS = {"head_dim": COUNT, "partial_rotary": Bounds("float", 0, 1, above=True)}


def _hparam_bounds(key: str) -> Bounds | None:
    suffix = N.GGUF_HPARAM_KEYS.get(key)
    return GGUF_BOUNDS[suffix] if suffix is not None else _HF_ONLY_BOUNDS.get(key)


def hf_hparam(cfg: dict, key: str, path: str | None):
    """The config value of canonical hyper-parameter ``key`` (its first spelling present, see
    :data:`names.HF_HPARAM_KEYS`), type- and range-checked where read: the bounds of its GGUF key
    (:data:`ckpt_surgeon.arch.checked.GGUF_BOUNDS`), integers also within the uint32 that
    llama.cpp stores them in.  None when the config does not give it."""
    found = N.config_find(cfg, N.HF_HPARAM_KEYS[key])
    if found is None:
        return None
    spelling, v = found
    bounds = _hparam_bounds(key)
    return bounds.check(spelling, v, path=path, integral_floats=True,
                        maximum=U32_MAX if bounds.kind == "int" else None)


def check_hparam_values(cfg: dict, path: str | None) -> None:
    """Every hyper-parameter the conversion reads, checked in the config as written (before
    transformers builds a config object from it, which fails on such values with its own errors)."""
    for key in N.HF_HPARAM_KEYS:
        if _hparam_bounds(key) is not None:
            hf_hparam(cfg, key, path)


def _rope_hparams(cfg: dict, hp: dict, head_dim: int, path: str, rotary_width: int | None = None) -> None:
    """RoPE hyper-parameters into ``hp``; a missing theta is refused (a scaled RoPE was, by
    :func:`_check_rope_scaling`).  ``rotary_width``: the width the model class rotates, where
    transformers said it (:func:`.model_check.rotary_widths`): the class decides whether a
    partial_rotary_factor applies (modeling_llama's default RoPE ignores one, modeling_phi's reads it)."""
    theta = hf_hparam(cfg, "rope_theta", path)
    if theta is None:
        raise ConfigError("config gives no rope theta (rope_parameters.rope_theta / rope_theta); llama.cpp would "
                          "silently use 10000", path=path)
    hp["rope_theta"] = theta
    local = hf_hparam(cfg, "rope_local_theta", path)
    if local is not None:
        hp["rope_local_theta"] = local
    partial = hf_hparam(cfg, "partial_rotary", path)
    hp["rotary_dim"] = rotary_width if rotary_width is not None else int(head_dim * (1.0 if partial is None else partial))
    hp["key_length"] = hp["value_length"] = head_dim


_ROPE_TYPE_KEYS = ("rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type")


def _check_rope_scaling(raw: dict, cfg: dict, path: str, allowed: tuple = ()) -> None:
    """A scaled RoPE (yarn, linear, ...) other than the family's ``allowed`` ones is refused, named
    by the key the config file spells it with (``raw``: config.json as written; transformers
    rewrites ``rope_scaling`` into ``rope_parameters`` in ``cfg``), as every refused setting is.
    Every spelling is checked, in both.  Phi-3's early configs spell longrope "su" (transformers
    and llama.cpp's converter read it as longrope)."""
    aliases = ("su",) if "longrope" in allowed else ()
    for conf in (raw, cfg):
        for key in _ROPE_TYPE_KEYS + _per_layer_type_keys(conf):
            # llama.cpp scales only the full-attention layers (its sliding layers keep scale 1)
            ok = ("default",) if ".sliding_attention." in key else ("default",) + tuple(allowed) + aliases
            rope_type = N.config_get(conf, (key,))
            if rope_type not in (None,) + ok:
                only = " or ".join(repr(t) for t in ok if t not in aliases)
                kind = "rope_type" if len(ok) > 1 else "plain RoPE: rope_type"
                raise UnsupportedError(f"{key} = {rope_type!r} is not converted (only {kind} {only})", path=path)


def _per_layer_type_keys(conf: dict) -> tuple:
    """``rope_parameters.<layer type>.rope_type`` for a transformers-5 config that nests its rope
    parameters per layer type (Gemma 3: full_attention / sliding_attention)."""
    rp = conf.get("rope_parameters")
    if not isinstance(rp, dict):
        return ()
    return tuple(f"rope_parameters.{t}.rope_type" for t, v in rp.items() if isinstance(v, dict))


# transformers' yarn parameter -> GGUF key suffix (TextModel.set_gguf_parameters writes each one
# the config has, although llama.cpp loads none of them for these architectures: a value other
# than the one it runs is refused, rope_yarn_mscale.check_yarn_as_llamacpp_runs); any other yarn
# parameter (mscale, mscale_all_dim, truncate ...) changes what transformers computes in ways no
# GGUF key says, and is refused.
_YARN_KEYS = {key: suffix for suffix, key in YARN_KEYS}
_ROPE_BASE_KEYS = ("rope_type", "rope_theta", "factor", "original_max_position_embeddings", "partial_rotary_factor")


def _rope_scaling_kvs(cfg: dict, spec: N.ArchSpec, path: str | None) -> list:
    """``rope.scaling.*`` keys for a linear or yarn RoPE (the family's ``rope_scalings`` allow
    them; :func:`_check_rope_scaling` refused the others), as llama.cpp's converter writes them."""
    rp = full_attention_rope(cfg.get("rope_parameters"))
    kind = rp.get("rope_type")
    if kind not in ("linear", "yarn"):
        return []
    arch = spec.gguf_arch
    factor = rp.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ConfigError(f"rope_parameters.factor = {factor!r}: a {kind} RoPE needs a positive factor", path=path)
    kvs = [gw.KV(f"{arch}.rope.scaling.type", gw.VT.STRING, kind),
           gw.KV(f"{arch}.rope.scaling.factor", gw.VT.FLOAT32, float(factor))]
    if kind == "yarn":
        mscales = ("mscale", "mscale_all_dim") if spec.yarn_log_mul else ()
        extra = sorted(k for k in rp if k not in _ROPE_BASE_KEYS and k not in _YARN_KEYS and k not in mscales)
        if extra:
            raise UnsupportedError(f"rope_parameters.{extra[0]} = {rp[extra[0]]!r} is not converted (a yarn RoPE "
                                   f"converts with {', '.join(_YARN_KEYS)} only: GGUF has no key for it)", path=path)
        orig = rp.get("original_max_position_embeddings")
        if not isinstance(orig, int) or isinstance(orig, bool) or not 0 < orig <= U32_MAX:
            raise ConfigError(f"rope_parameters.original_max_position_embeddings = {orig!r}: a yarn RoPE needs it",
                              path=path)
        kvs.append(gw.KV(f"{arch}.rope.scaling.original_context_length", gw.VT.UINT32, orig))
        from .rope_yarn_mscale import check_yarn_as_llamacpp_runs, yarn_mscale_to_gguf
        if spec.yarn_log_mul:           # DeepSeek: mscale / mscale_all_dim (checked before any key is kept)
            log_mul = yarn_mscale_to_gguf(rp, arch, path)
        check_yarn_as_llamacpp_runs({k: rp.get(k) for k in _YARN_KEYS}, float(factor), arch, path=path,
                                    spelled={k: f"rope_parameters.{k}" for k in _YARN_KEYS},
                                    mscales=spec.yarn_log_mul)
        for key, suffix in _YARN_KEYS.items():
            if rp.get(key) is not None:
                kvs.append(gw.KV(f"{arch}.{suffix}", gw.VT.FLOAT32, float(rp[key])))
        if spec.yarn_log_mul:
            kvs += [gw.KV(k, gw.VT.FLOAT32, float(v)) for k, v in log_mul]
    return kvs


def _rope_freqs_planned(facts: dict, cfg: dict, path: str | None) -> list:
    """llama.cpp's ``rope_freqs.weight`` for a llama3-scaled RoPE (the child computed the factors
    with torch: :func:`~.rope_llama3.llama3_rope_factors`), written first as its converter does."""
    values = facts.get("rope_freqs")
    if values is None:
        if full_attention_rope(cfg.get("rope_parameters")).get("rope_type") == "llama3":
            raise ConfigError("rope_parameters.rope_type = 'llama3' without usable factor / low_freq_factor / "
                              "high_freq_factor / original_max_position_embeddings", path=path)
        return []
    arr = np.asarray(values, np.float32)
    return [_Planned("(rope_parameters: llama3)", "rope_freqs.weight", "none", arr.shape, "F32", arr.nbytes, "F32",
                     data=arr.tobytes())]


def _check_longrope_raw(raw: dict, path: str | None) -> None:
    """A longrope config's factor lists, as config.json spells them, checked before transformers
    reads them (:func:`.rope_longrope.check_factor_lists`)."""
    for spelling in ("rope_parameters", "rope_scaling"):
        rp = full_attention_rope(raw.get(spelling))
        if rp.get("rope_type", rp.get("type")) in ("longrope", "su"):
            from .rope_longrope import check_factor_lists
            check_factor_lists(rp, spelling, path)


def _longrope_parts(cfg: dict, raw: dict, spec: N.ArchSpec, hp: dict, path: str | None) -> tuple[list, list, list]:
    """llama.cpp's ``rope_factors_long`` / ``_short`` tensors, ``rope.scaling.attn_factor`` and the
    warnings for a longrope config (:mod:`.rope_longrope`); nothing for another RoPE."""
    rp = full_attention_rope(cfg.get("rope_parameters"))
    if rp.get("rope_type") != "longrope":
        return [], [], []
    from .rope_longrope import LONG, longrope_to_gguf
    raw_rp = full_attention_rope(raw.get("rope_parameters") or raw.get("rope_scaling"))
    # config.json's top-level original context, when its rope dict has none (the model class may not read it)
    raw_orig = None if "original_max_position_embeddings" in raw_rp else raw.get("original_max_position_embeddings")
    tensors, keys, warnings = longrope_to_gguf(rp, hp, spec.gguf_arch, mscales=spec.longrope_mscales, path=path,
                                               raw_orig=raw_orig)
    planned = [_Planned(f"(rope_parameters: {'long' if name == LONG else 'short'}_factor)", name, "none",
                        arr.shape, "F32", arr.nbytes, "F32", data=arr.tobytes()) for name, arr in tensors]
    return planned, [gw.KV(k, gw.VT.FLOAT32, float(v)) for k, v in keys], warnings


def _check_llamacpp_fixed(cfg: dict, spec: N.ArchSpec, hp: dict, path: str) -> None:
    """Settings llama.cpp hard-codes for the family must match the config's."""
    for key, value in spec.llamacpp_fixed.items():
        want = N.fixed_expected(key, value, hp)
        got = N.fixed_from_hf(key, cfg)
        if got != want:
            raise UnsupportedError(f"llama.cpp's {spec.gguf_arch} assumes {key} = {want} (it is not stored in the "
                                   f"file), but this config has {got}; llama.cpp would run a different model",
                                   path=path)


def _check_llamacpp_needs(cfg: dict, spec: N.ArchSpec, path: str) -> None:
    """Settings llama.cpp's graph runs one way only (no GGUF key stores them): another value is
    refused by its config key, before the tensors it adds or drops are looked at."""
    for key, value, why, *absent in spec.llamacpp_needs:
        got = cfg.get(key, *absent)     # a 4th item: what the model class assumes when the key is absent
        if got != value:
            raise UnsupportedError(f"{key} = {got!r} is not converted ({why}); only {key} = {value!r} is", path=path)


def hparams_from_config(cfg: dict, spec: N.ArchSpec, n_vocab: int, path: str,
                        rotary_width: int | None = None) -> dict:
    """Canonical hyper-parameters (see :data:`names.GGUF_HPARAM_KEYS`) from an HF config dict,
    each checked where read (:func:`hf_hparam`); ``rotary_width``: see :func:`_rope_hparams`."""
    # keys the family's config class does not have (BLOOM: num_key_value_heads): transformers ignores
    # a stray one in config.json, and so does llama.cpp's converter (issue 24)
    absent = {k for k, v in spec.hf_rename.items() if v is None}
    cfg = {k: v for k, v in cfg.items() if k not in absent}

    def get(key):
        return hf_hparam(cfg, key, path)

    hp: dict = {}
    for key in ("n_embd", "n_layer", "n_head", "n_ctx"):
        v = get(key)
        if v is None and key in spec.hparam_fallback:
            v = hp[spec.hparam_fallback[key]]
        if v is None:
            raise ConfigError(f"config has none of {', '.join(N.HF_HPARAM_KEYS[key])}", path=path)
        hp[key] = v
    hp["n_head_kv"] = N.kv_heads(spec, cfg, get("n_head_kv") or hp["n_head"])
    head_dim = get("head_dim") or hp["n_embd"] // hp["n_head"]
    n_ff = get("n_ff")
    if n_ff is None and spec.ff_default_mult:
        n_ff = spec.ff_default_mult * hp["n_embd"]
    if n_ff is None:
        raise ConfigError(f"config has none of {', '.join(N.HF_HPARAM_KEYS['n_ff'])}", path=path)
    hp["n_ff"] = n_ff
    if spec.rope:
        _rope_hparams(cfg, hp, head_dim, path, rotary_width)
    eps_key = "rms_eps" if spec.norm == "rms" else "ln_eps"
    eps = get(eps_key)
    if eps is None:
        raise ConfigError("config gives no norm epsilon", path=path)
    hp[eps_key] = eps
    hp["vocab_size"] = int(n_vocab)
    for key in ("sliding_window", "orig_ctx"):
        v = get(key)
        if v is not None:
            hp[key] = v
    hp["head_dim"] = head_dim
    for key in N.OPTIONAL_HPARAMS:
        v = get(key)
        if v is not None:
            hp[key] = float(v) if key in N.HPARAM_FLOATS else bool(v) if key in N.HPARAM_BOOLS else int(v)
    for key, value in spec.hparam_unset.items():
        hp.setdefault(key, value)
    _sum_hparams(cfg, spec, hp, path)
    for key in spec.hparam_required:
        if key not in hp:
            raise UnsupportedError(f"config gives no {' / '.join(N.HF_HPARAM_KEYS[key])}; llama.cpp's {spec.gguf_arch} "
                                   "applies it anyway (with its own default), so it would run a different model",
                                   path=path)
    _check_llamacpp_fixed(cfg, spec, hp, path)
    return hp


def _sum_hparams(cfg: dict, spec: N.ArchSpec, hp: dict, path: str) -> None:
    """Hyper-parameters that are sums of HF config keys (``hparam_sums``: DeepSeek-V2's MLA widths),
    the keys themselves kept in ``hp`` for the tensor transforms; then the fixed ``gguf_values``."""
    for key, parts in spec.hparam_sums.items():
        vals = []
        for part in parts:
            v = COUNT.check(part, cfg.get(part), path=path, integral_floats=True, maximum=U32_MAX) \
                if cfg.get(part) is not None else None
            if v is None:
                raise ConfigError(f"config gives no {part}", path=path)
            hp[part] = int(v)
            vals.append(int(v))
        hp[key] = sum(vals)
    hp.update(spec.gguf_values)


def _weight_type(dtype: str, shape: tuple, name: str, dst: str, warnings: list) -> str:
    """The ggml type llama.cpp's converter gives tensor ``dst`` (``ModelBase.prepare_tensors``):
    F32 for 1-D tensors, ``*_norm.weight``, anything not named ``.weight`` and the always-F32
    kinds (:func:`~ckpt_surgeon.arch.gguf_names.f32_tensor_templates`); else the --dtype type."""
    from ..arch.gguf_names import f32_tensor_templates
    ggml = N.DTYPES[dtype][1]
    if len(shape) < 2 or dst.endswith("_norm.weight") or not dst.endswith(".weight"):
        return "F32"
    if any(N.template_regex(t).match(dst) for t in f32_tensor_templates()):
        return "F32"
    if ggml == "Q8_0" and shape[-1] % 32:
        # llama.cpp's converter falls back the same way for rows that are not whole Q8_0 blocks.
        warnings.append(f"{name}: row size {shape[-1]} is not a multiple of 32; stored F16 instead of Q8_0")
        return "F16"
    return ggml


@dataclass(frozen=True)
class GGUFPlan:
    """Everything an HF -> GGUF conversion writes, decided before any tensor data is read."""

    spec: N.ArchSpec
    cfg: dict                    # the HF config as a dict (transformers' defaults filled in)
    hp: dict                     # canonical hyper-parameters (names.GGUF_HPARAM_KEYS)
    vocab: object                # tokenizer.GGUFVocab
    tensors: tuple               # _Planned, in file order
    kvs: tuple                   # formats.gguf_write.KV, in file order
    warnings: tuple


def _embedding_shape(got: dict, spec: N.ArchSpec) -> tuple | None:
    """The shape of the HF tensor that becomes ``token_embd.weight`` (None if there is none)."""
    names = N.hf_to_gguf_names(spec)
    for tname, shape in got.items():
        hit = names.match(tname)
        if hit is not None and hit[0] == "token_embd.weight":
            return tuple(shape)
    return None


def _plan_tensors(ck, got: dict, spec: N.ArchSpec, dtype: str, src: Path, warnings: list, hp: dict | None) -> list:
    """Every source tensor's GGUF name, transform, shape, type and size, in llama.cpp's file order
    (a Split row's parts one after the other, each made from the whole HF tensor; left out while
    ``hp`` is None, a first pass that only checks names and shapes)."""
    from .splits import part_shape

    names = N.hf_to_gguf_names(spec)
    absent = [N.template_regex(t) for t in spec.llamacpp_absent]
    plan: list[_Planned] = []
    for dst, rule, tnames in _targets(names, absent, _source_order(ck, got), spec.gguf_arch, str(src)):
        info = ck.tensors[tnames[0]]
        shape = lookup(rule.transform).gguf_shape(info.shape)
        if rule.experts:
            odd = next((t for t in tnames if tuple(ck.tensors[t].shape) != tuple(info.shape)), None)
            if odd is not None:
                raise ConfigError(f"expert shapes differ ({list(ck.tensors[odd].shape)} vs {list(info.shape)} "
                                  f"of {tnames[0]}); they cannot be stacked", path=str(src), tensor=odd)
            shape = (len(tnames),) + shape
        if rule.split and hp is None:
            continue
        if rule.split:
            layer = N.template_regex(rule.gguf).match(dst).groupdict().get("L")
            fell = []       # parts stored F16 instead of Q8_0: one warning for their one HF tensor
            for i, part in enumerate(rule.parts):
                pdst = part.replace("{L}", layer) if layer is not None else part
                pshape = part_shape(rule.part_transform(i), shape, hp)
                scratch: list = []
                gt = _weight_type(dtype, pshape, tnames[0], pdst, scratch)
                if scratch:
                    fell.append((pdst, pshape[-1]))
                plan.append(_Planned(tnames[0], pdst, rule.part_transform(i), pshape, gt, GT.nbytes(gt, pshape),
                                     info.dtype))
            if fell:
                sizes = "/".join(dict.fromkeys(str(r) for _, r in fell))
                warnings.append(f"{tnames[0]}: row size {sizes} of {', '.join(p for p, _ in fell)} is not a multiple "
                                "of 32; stored F16 instead of Q8_0")
            continue
        gt = _weight_type(dtype, shape, tnames[0], dst, warnings)
        kept = None if rule.experts else kept_blocks.kept_type(ck, tnames[0], rule.transform, shape)
        if kept:
            plan.append(_Planned(tnames[0], dst, rule.transform, shape, kept, GT.nbytes(kept, shape), info.dtype,
                                 kept=kept))
            for sname, value in kept_blocks.scale_tensors(ck, tnames[0], dst):
                plan.append(_Planned(f"{tnames[0]} ({sname.rsplit('.', 1)[1]})", sname, "none", (1,), "F32", 4, "F32",
                                     data=value.tobytes()))
            continue
        label = rule.hf.replace("{L}", dst.split(".")[1]).replace("{E}", f"{{0..{len(tnames) - 1}}}") \
            if rule.experts else tnames[0]
        plan.append(_Planned(label, dst, rule.transform, shape, gt, GT.nbytes(gt, shape), info.dtype,
                             tnames if rule.experts else ()))
    return plan


def plan_hf_to_gguf(ck, src: Path, dtype: str, *, name: str | None = None, out: Path | None = None,
                    force: bool = False, isolate: bool = False, imatrix=None) -> GGUFPlan:
    """Check the source and plan the file: names, types, shapes, sizes, key-values.  ``out``:
    checked as a destination (absent unless ``force``, not an input) before the config is read.
    ``isolate``: see :func:`hf_to_gguf_report`.  ``imatrix``: an importance matrix file for a
    quantized ``dtype`` (:mod:`.imatrix`)."""
    from .quant_plan import check_quant_request
    check_quant_request(dtype, imatrix)
    folder, raw = _checked_source(ck, src, out, force)
    facts, spec, cfg = _transformers_facts(ck, folder, raw, isolate)
    got = _checked_against_transformers(ck, src, facts, spec, raw, cfg)

    warnings: list[str] = [spec.llamacpp_differs] if spec.llamacpp_differs else []
    base = "f32" if dtype in QUANT_ONLY else dtype       # llama.cpp quantizes from an F32 file
    _plan_tensors(ck, got, spec, base, src, [], None)   # names and shapes judged before the config values
    emb = _embedding_shape(got, spec)
    if emb is None:
        raise ConfigError("no token embedding tensor", path=str(src))
    widths = facts.get("rotary_widths") or []
    hp = hparams_from_config(cfg, spec, emb[0], ck.config_path, widths[0] if len(widths) == 1 else None)
    longrope, longrope_kvs, longrope_warnings = _longrope_parts(cfg, raw, spec, hp, ck.config_path)
    warnings += longrope_warnings
    plan = (_rope_freqs_planned(facts, cfg, ck.config_path) + longrope
            + _plan_tensors(ck, got, spec, base, src, warnings, hp))
    if dtype in QUANT_ONLY:
        from .quant_plan import quantize_plan
        kept_blocks.refuse_requantizing(plan, dtype, str(src))
        plan = quantize_plan(plan, dtype, spec.gguf_arch, hp, imatrix, warnings, str(src))
    vocab = _vocab(folder, emb[0], cfg, facts, spec)
    # general.name: llama.cpp keys some tokenizer quirks on it (llama-vocab.cpp: a name containing
    # "phi3" / "phi-3" requires Phi-3's <s>, </s>, <unk> tokens), so it is the caller's to choose.
    name = name if name is not None else hf_cache.display_name(folder)
    from .tokenizer import check_name_for_llamacpp
    check_name_for_llamacpp(name, vocab, ck.config_path)
    kvs = gguf_kvs(spec, hp, dtype, name, vocab)
    kvs += _rope_scaling_kvs(cfg, spec, ck.config_path) + longrope_kvs
    ftype = kept_blocks.file_type(plan, dtype)
    if ftype is not None:
        kvs = [gw.KV(k.key, k.vtype, ftype) if k.key == "general.file_type" else k for k in kvs]
    a4 = kept_blocks.prec_a4_names(ck, plan)
    if a4:      # after the hyper-parameters and the vocabulary, where llama.cpp's prepare_metadata adds them
        kvs += [gw.KV("general.tensor_extra.name", gw.VT.ARRAY, a4, gw.VT.STRING),
                gw.KV("general.tensor_extra.prec_a4", gw.VT.ARRAY, [False] * len(a4), gw.VT.BOOL)]
    return GGUFPlan(spec, cfg, hp, vocab, tuple(plan), tuple(kvs), tuple(warnings))


def _checked_source(ck, src: Path, out: Path | None, force: bool) -> tuple[Path, dict]:
    """(the HF folder, its config.json as written), after the checks that need no transformers:
    an HF source, config values and layer count, the destination, no remote code we cannot map."""
    if ck.naming != "hf":
        raise UnsupportedError("is already GGUF; convert it to an HF folder instead (output a folder path)",
                               path=str(src))
    # config values and layer count checked before any work; every shape is compared with the
    # transformers model below, with that check's own message
    ck.layout(shapes=False)
    folder = src if src.is_dir() else src.parent
    if out is not None:
        output_path.check_output(out, list(ck.files) + [str(folder / "config.json")], force)
    check_hparam_values(ck.config or {}, ck.config_path)
    raw = ck.config or {}
    if raw.get("auto_map") and N.by_model_type(raw.get("model_type")) is None:
        # remote code (InternLM2 ...): transformers would ask to run it; say what is unsupported
        raise UnsupportedError(f"model_type {raw.get('model_type')!r} needs remote code (auto_map) and has no "
                               f"GGUF mapping here (supported: {', '.join(N.supported_model_types())})",
                               path=ck.config_path)
    _check_longrope_raw(raw, ck.config_path)
    return folder, raw


def _transformers_facts(ck, folder: Path, raw: dict, isolate: bool) -> tuple[dict, N.ArchSpec, dict]:
    """(what transformers says of the folder, the GGUF architecture spec, the config as transformers
    reads it); a model without a transformers class is asked as the one computing the same function."""
    own = N.by_model_type(raw.get("model_type"))
    if own is not None and own.hf_equivalent:
        # no transformers class (remote code): transformers answers for the model computing the same
        from .equivalent import equivalent_folder, equivalent_shapes
        with equivalent_folder(folder, raw, own) as eq:
            facts = _probe_hf_folder(eq, ck.config_path, isolate)
        if "shapes" in facts:
            facts["shapes"] = equivalent_shapes(facts["shapes"], own)
        spec = own
        cfg = facts.get("config", {})
    else:
        facts = _probe_hf_folder(folder, ck.config_path, isolate)
        cfg = facts["config"]
        spec = N.by_model_type(cfg.get("model_type"))
    if spec is None:
        raise UnsupportedError(f"model_type {cfg.get('model_type')!r} has no GGUF mapping here "
                               f"(supported: {', '.join(N.supported_model_types())})", path=ck.config_path)
    # every hyper-parameter read as the model class reads it: a key its config class does not declare
    # (another family's spelling, a made-up one) is ignored, as transformers ignores it (issue 24)
    return facts, spec, N.class_config(cfg, facts.get("config_keys"))


def _checked_against_transformers(ck, src: Path, facts: dict, spec: N.ArchSpec, raw: dict, cfg: dict) -> dict:
    """The checkpoint's tensor shapes (name -> shape), after checking that llama.cpp runs what the
    config asks and that the tensors are exactly the model transformers builds from the config."""
    from .model_check import check_tensors
    if spec.rope:
        _check_rope_scaling(ck.config or {}, cfg, ck.config_path, spec.rope_scalings)
    _check_llamacpp_needs(raw if spec.hf_equivalent else cfg, spec, ck.config_path)
    if "shapes_error" in facts:
        raise ConfigError(f"transformers cannot build a model from this config ({facts['shapes_error']})",
                          path=ck.config_path)
    expected = {k: tuple(v) for k, v in facts["shapes"].items()}
    got = {n: tuple(i.shape) for n, i in ck.tensors.items() if not n.endswith(_IGNORED_SUFFIXES)}
    what = f"{facts['config_class'].replace('Config', '')} model"
    if spec.hf_equivalent:
        what = f"{raw.get('model_type')} checkpoint (checked as the {what} it computes)"
    check_tensors(expected, got, path=str(src), what=what)
    return got


def _vocab(folder: Path, n_vocab: int, cfg: dict, facts: dict, spec: N.ArchSpec):
    """The GGUF vocabulary: from tokenizer.json as transformers runs it, or walked from
    tokenizer.model with a converter's quirks (``spec.spm_quirks``)."""
    from .tokenizer import hf_vocab, spm_model_vocab
    vocab = hf_vocab(folder, n_vocab, cfg, effective_json=facts["tokenizer_json"])
    if spec.spm_quirks is not None:
        vocab = spm_model_vocab(vocab, folder, spec.spm_quirks)
    return vocab


def _write_planned(ck, plan: GGUFPlan, src: Path, out: Path, *, verify: bool, progress, split=None,
                   warnings: list | None = None, inputs=()) -> list[Path]:
    """Write the planned file (or, with ``split``, its split set: :mod:`.split_output`) through
    temps beside the output: the header block, then the tensor data streamed chunk by chunk
    (:mod:`.gguf_stream`), reread, renamed into place.  Returns the files written."""
    from .split_output import write_gguf_outputs

    def data(fd, part, offsets, wbar):
        return write_tensor_data(fd, ck, part, offsets, plan.hp, forward, labels=(str(src), str(out)),
                                 progress=wbar, readback=verify)

    def check(tmp, final, part, chunks, first):
        verify_written(tmp, final, part, chunks, architecture=plan.spec.gguf_arch if first else None)

    return write_gguf_outputs(out, gw.encode_kvs(plan.kvs), len(plan.kvs), plan.tensors, data,
                              verify=check if verify else None, req=split, progress=progress, warnings=warnings,
                              inputs=inputs)


def hf_to_gguf_report(src, out_path, dtype: str = "f16", force: bool = False, *, name: str | None = None,
                      verify: bool = True, progress: bool | None = False, isolate: bool = False,
                      imatrix=None, split=None) -> ConvertReport:
    """Convert and return the :class:`ConvertReport` (see :func:`hf_to_gguf`).  ``progress``: a
    bar over the bytes written on stderr (None: only when stderr is a terminal).

    ``isolate``: ask transformers (config defaults, the tokenizer it runs, the model's tensor
    shapes) in a short-lived child process, unless this process has imported torch and
    transformers already.  The CLI does: transformers, a 150k-token tokenizer and the model
    classes are ~450 MB resident for a few seconds, given back when the child ends, and this
    process, which streams the tensors, never holds them.  Off (the default for library calls),
    the same questions are answered here (cheaper when the caller has transformers loaded).

    ``split``: a :class:`~.split_output.SplitRequest` (``--split-max-size`` / ``--split-max-tensors``):
    the output is llama.cpp's split set ``OUT-00001-of-0000N.gguf`` ... (:mod:`.split_output`)."""
    from ..checkpoint import open_checkpoint

    from .dtypes import normalize_dtype

    t0 = time.perf_counter()
    dtype = normalize_dtype(dtype, to_gguf=True)
    src = Path(src)
    out = Path(out_path)
    ck = open_checkpoint(src)
    try:
        if split is not None:
            from .split_output import check_split_destination
            check_split_destination(out, list(ck.files), force)
        with phase(progress, f"planning {out.name}: config, tokenizer and tensor set checked with transformers"):
            plan = plan_hf_to_gguf(ck, src, dtype, name=name, out=out, force=force, isolate=isolate, imatrix=imatrix)
        warnings = list(plan.warnings)
        inputs = [*ck.files, *(p for p in (ck.config_path, imatrix) if p)]     # a resumed set's fingerprint
        files = _write_planned(ck, plan, src, out, verify=verify, progress=progress, split=split, warnings=warnings,
                               inputs=[os.fspath(p) for p in inputs])
    finally:
        ck.close()
    spec, hp = plan.spec, plan.hp
    tied = not any(p.dst == "output.weight" for p in plan.tensors)
    records = tuple(TensorRecord(p.src, p.dst, p.transform, p.src_dtype, p.ggml_type, p.shape) for p in plan.tensors)
    written = {f"{spec.gguf_arch}.{N.GGUF_HPARAM_KEYS[k]}": v for k, v in hp.items() if k in N.GGUF_HPARAM_KEYS}
    return ConvertReport("hf->gguf", str(src), str(files[0]), spec.gguf_arch, plan.cfg.get("model_type"), dtype,
                         len(plan.tensors), sum(f.stat().st_size for f in files), time.perf_counter() - t0, tied,
                         plan.vocab.model, records, tuple(warnings), written, tuple(str(f) for f in files))


def hf_to_gguf(src, out_path, dtype: str = "f16", force: bool = False, *, name: str | None = None,
               imatrix=None) -> Path:
    """Convert an HF folder (config.json + safetensors + tokenizer.json) to one GGUF file.

    ``dtype``: ``f32`` | ``f16`` | ``bf16`` | ``q8_0`` for 2-D weights (1-D tensors stay F32), or
    one of llama.cpp's quantized file types (``q4_k_m`` ...: :data:`~ckpt_surgeon.conversion.quant_mix.FTYPES`),
    each tensor's type then chosen by llama.cpp's mixture rules and quantized by its kernels, with
    the importance matrix file ``imatrix`` if given.
    ``name``: ``general.name`` (default: the folder's name).
    Returns the output path (:func:`ckpt_surgeon.convert` returns the full report).  Raises
    :class:`~ckpt_surgeon.errors.CkptError` subclasses on bad input; nothing is written then.

    Example::

        from ckpt_surgeon import hf_to_gguf
        hf_to_gguf("Qwen2.5-0.5B", "qwen.q4_k_m.gguf", dtype="q4_k_m")     # = llama-quantize's bytes
    """
    return Path(hf_to_gguf_report(src, out_path, dtype=dtype, force=force, name=name, imatrix=imatrix).output)


def _source_order(ck, names) -> list[str]:
    """HF tensor names in the order llama.cpp's converter meets them (``ModelBase.index_tensors``):
    the weight files by name, and within each file the tensors by name (gguf-py's
    ``SafetensorsLocal`` sorts them).  The GGUF tensors follow that order (:func:`_targets`), so a
    split output cuts the parts where ``convert_hf_to_gguf.py --split-max-size`` cuts them."""
    return sorted(names, key=lambda n: (os.path.basename(ck.tensors[n].file), n))


# vocabulary value kinds (tokenizer.GGUFVocab.key_values) -> GGUF value type, item type
_KV_KINDS = {"str": (gw.VT.STRING, None), "u32": (gw.VT.UINT32, None), "bool": (gw.VT.BOOL, None),
             "str[]": (gw.VT.ARRAY, gw.VT.STRING), "i32[]": (gw.VT.ARRAY, gw.VT.INT32),
             "f32[]": (gw.VT.ARRAY, gw.VT.FLOAT32)}


def gguf_kvs(spec: N.ArchSpec, hp: dict, dtype: str, name: str, vocab) -> list[gw.KV]:
    """The key-value pairs, in the order llama.cpp's converter writes them (gguf-py's
    ``GGUFWriter``: ``general.architecture`` first), with gguf-py's types."""
    import gguf
    kvs = [gw.KV("general.architecture", gw.VT.STRING, spec.gguf_arch),
           gw.KV("general.name", gw.VT.STRING, name),
           gw.KV("general.file_type", gw.VT.UINT32, int(gguf.LlamaFileType[file_type_name(dtype)])),
           gw.KV("general.quantization_version", gw.VT.UINT32, gguf.GGML_QUANT_VERSION)]
    for key in spec.hparams:
        if key not in hp:
            continue
        full = f"{spec.gguf_arch}.{N.GGUF_HPARAM_KEYS[key]}"
        if key in N.HPARAM_FLOATS:
            kvs.append(gw.KV(full, gw.VT.FLOAT32, float(hp[key])))
        elif key in N.HPARAM_BOOLS:
            kvs.append(gw.KV(full, gw.VT.BOOL, bool(hp[key])))
        else:
            kvs.append(gw.KV(full, gw.VT.UINT32, int(hp[key])))
    for suffix, value in spec.gguf_strings.items():
        kvs.append(gw.KV(f"{spec.gguf_arch}.{suffix}", gw.VT.STRING, value))
    for key, value, kind in vocab.key_values():
        vtype, item = _KV_KINDS[kind]
        kvs.append(gw.KV(key, vtype, value, item))
    return kvs
