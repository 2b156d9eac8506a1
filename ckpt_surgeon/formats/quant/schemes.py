"""Quantization schemes of Hugging Face checkpoints, as data, and their recognition.

A quantized checkpoint is the same model stored differently: per Linear, a packed weight and its
companion tensors (scales, zero points, group indices ...) stand for one dense ``[out, in]``
weight.  Each scheme below is one frozen :class:`Scheme` record (what the stored weight is called,
its companions, packing, group structure, what the scale means); :func:`detect` reads
``config.json`` (``quantization_config.quant_method``, or MLX's ``quantization`` key) and confirms
it against the tensors, giving a :class:`Quantization` (the method's parameters and, per logical
weight, a :class:`QuantTensor` naming its stored members).

The layouts are the producers' own (read, not copied):

* GPTQ (``auto_gptq`` / gptqmodel / auto-round's ``auto_gptq`` export; llama.cpp
  ``convert_hf_to_gguf.py`` ``dequant_gptq``): ``qweight`` int32 ``[in/pf, out]`` packed along
  the *input* axis, low bits first; ``qzeros`` int32 ``[G, out/pf]`` packed along the output axis;
  ``scales`` ``[G, out]``; ``g_idx`` int32 ``[in]`` (the group of each input column).
  ``w = s[g] * (q - z[g])`` where the stored zero is one less than the real one unless
  ``checkpoint_format`` is ``gptq_v2``.
* AWQ GEMM (AutoAWQ ``WQLinear_GEMM``): ``qweight`` int32 ``[in, out/pf]`` packed along the
  *output* axis in the interleaved order 0 2 4 6 1 3 5 7; ``qzeros`` likewise ``[G, out/pf]``;
  ``scales`` ``[G, out]``; ``w = (q - z) * s``.
* compressed-tensors (``compressors/quantized_compressors``): ``pack-quantized``:
  ``weight_packed`` int32 ``[out, in/pf]`` low bits first, values offset by ``2**(bits-1)``
  (symmetric) or by the zero point ``weight_zero_point`` packed along the output axis;
  ``weight_scale`` ``[out, G]``, ``weight_shape`` ``[2]``; ``float-quantized`` /
  ``int-quantized``: ``weight`` F8 / I8 times ``weight_scale`` (per tensor, channel, group or
  block).
* ``fp8`` (DeepSeek-V3 ``weight_scale_inv``, amax/448 per 128x128 block: ``w = q * s``;
  gptqmodel writes the reciprocal 448/amax under the same name: ``w = q / s``, decided per
  tensor by :func:`fp8_scale_reading`; AutoFP8 writes ``weight_scale``, amax/448 per tensor: ``w = q * s``).
* bitsandbytes: 4-bit ``weight`` uint8 ``[n/2, 1]`` (two codes per byte, high nibble first),
  ``weight.absmax`` per ``blocksize`` elements (itself 8-bit quantized with ``nested_absmax`` /
  ``nested_quant_map`` under double quantization), ``weight.quant_map`` (16 code values),
  ``weight.quant_state.bitsandbytes__nf4|fp4`` (JSON: shape, blocksize, dtype); 8-bit
  ``weight`` int8 ``[out, in]`` with ``SCB`` (row absmax): ``w = q * SCB / 127``.
* ``mxfp4`` (gpt-oss as OpenAI ships it; transformers' ``integrations/mxfp4.py``
  ``convert_moe_packed_tensors``): per stacked expert weight ``<name>_blocks`` uint8
  ``[E, rows, G, 16]`` (two E2M1 codes per byte, low nibble the even element) and ``<name>_scales``
  uint8 ``[E, rows, G]`` (E8M0: ``2**(s - 127)`` per 32 values); the logical weight is
  ``<name>`` ``[E, G*32, rows]`` (the blocks' last two axes swapped, transformers' bf16 layout).
* MLX affine (``mlx.core.quantize``): ``weight`` uint32 ``[out, in*bits/32]`` low bits first,
  ``scales`` and ``biases`` ``[out, in/group]``: ``w = scales * q + biases``.  MLX's ``biases``
  are these offsets, never the Linear's ``bias``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from ...errors import FormatError, UnsupportedError
from ...records import TensorInfo


@dataclass(frozen=True)
class Scheme:
    """How one kind of quantized Linear is stored."""

    key: str                      # our name for it (the kernel table's key)
    method: str                   # quant_method as config.json spells it ("mlx" for MLX's key)
    weight: str                   # stored name of the packed weight, relative to the module
    weight_dtypes: tuple          # safetensors dtypes that weight may have
    required: tuple               # companions that must be present (relative names)
    optional: tuple = ()          # companions that may be present
    packing: str = ""             # what the stored weight holds, for docs / inspect
    scale: str = ""               # what the scale means: the dequantization formula
    row_members: tuple = ()       # members whose axis 0 is the output row: q/k/v rows cut / join exactly
                                  # with them (qkv fuse / split); empty: the scheme cannot
    shared_members: tuple = ()    # members that are one value per tensor: joined only when q/k/v agree
    col_members: tuple = ()       # (role, packed) of members whose last axis is the output (GPTQ / AWQ's
                                  # [in, out] layout); packed: 32/bits outputs per int32 word


SCHEMES: dict[str, Scheme] = {s.key: s for s in (
    Scheme("gptq", "gptq", "qweight", ("I32",), ("qzeros", "scales"), ("g_idx", "bias"),
           "int32, bits packed along the input axis (rows of qweight), low bits first",
           "w = scales[g] * (q - (z + 1)) (z + 0 for checkpoint_format gptq_v2)",
           shared_members=("g_idx",), col_members=(("qweight", False), ("qzeros", True), ("scales", False))),
    Scheme("awq", "awq", "qweight", ("I32",), ("qzeros", "scales"), ("bias",),
           "int32, bits packed along the output axis in AWQ order 0 2 4 6 1 3 5 7",
           "w = (q - z) * scales[g]", col_members=(("qweight", True), ("qzeros", True), ("scales", False))),
    Scheme("ct-pack", "compressed-tensors", "weight_packed", ("I32",), ("weight_scale", "weight_shape"),
           ("weight_zero_point", "weight_g_idx"),
           "int32, bits packed along the input axis, low bits first, offset 2**(bits-1) or zero point",
           "w = (q - zp) * weight_scale[g]"),
    Scheme("ct-float", "compressed-tensors", "weight", ("F8_E4M3", "F8_E5M2"), ("weight_scale",),
           ("input_scale", "weight_zero_point", "weight_g_idx", "output_scale"),
           "float8 codes", "w = q * weight_scale (tensor / channel / group / block)",
           row_members=("weight", "weight_scale", "weight_zero_point"), shared_members=("input_scale", "output_scale")),
    Scheme("ct-int", "compressed-tensors", "weight", ("I8",), ("weight_scale",),
           ("input_scale", "weight_zero_point", "weight_g_idx", "output_scale"),
           "int8 codes", "w = (q - zp) * weight_scale (tensor / channel / group / block)",
           row_members=("weight", "weight_scale", "weight_zero_point"), shared_members=("input_scale", "output_scale")),
    Scheme("ct-nvfp4", "compressed-tensors", "weight_packed", ("U8",), ("weight_scale", "weight_global_scale"),
           ("input_global_scale",),
           "uint8, two E2M1 codes per byte (low nibble the even element), an F8_E4M3 scale per 16 values",
           "w = bf16(E2M1[code] * (weight_scale / weight_global_scale)): float32 quotient and product, rounded "
           "to bfloat16 as compressed-tensors returns it",
           row_members=("weight_packed", "weight_scale"), shared_members=("weight_global_scale", "input_global_scale")),
    Scheme("ct-mxfp4", "compressed-tensors", "weight_packed", ("U8",), ("weight_scale",), ("input_global_scale",),
           "uint8, two E2M1 codes per byte (low nibble the even element), an E8M0 scale per 32 values",
           "w = E2M1[code] * 2**(weight_scale - 127) (exact; bfloat16 as compressed-tensors returns it)",
           row_members=("weight_packed", "weight_scale"), shared_members=("input_global_scale",)),
    Scheme("ct-mxfp8", "compressed-tensors", "weight", ("F8_E4M3",), ("weight_scale",), (),
           "float8 codes, an E8M0 scale per 32 values",
           "w = q * 2**(weight_scale - 127) (exact; bfloat16 as compressed-tensors returns it)",
           row_members=("weight", "weight_scale")),
    Scheme("modelopt-nvfp4", "modelopt", "weight", ("U8",), ("weight_scale", "weight_scale_2"), ("input_scale",),
           "uint8, two E2M1 codes per byte (low nibble the even element), an F8_E4M3 scale per 16 values",
           "w = E2M1[code] * (weight_scale * weight_scale_2) (float32, ModelOpt's NVFP4QTensor.dequantize)",
           row_members=("weight", "weight_scale"), shared_members=("weight_scale_2", "input_scale")),
    Scheme("modelopt-fp8", "modelopt", "weight", ("F8_E4M3",), ("weight_scale",), ("input_scale",),
           "float8 codes", "w = q * weight_scale (per tensor; float32, ModelOpt's FP8QTensor.dequantize)",
           shared_members=("weight_scale", "input_scale")),
    Scheme("fp8", "fp8", "weight", ("F8_E4M3", "F8_E5M2"), ("weight_scale_inv",),
           ("activation_scale", "input_scale"),
           "float8 codes", "w = q * s (s = amax/448, DeepSeek) or q / s (s = 448/amax, gptqmodel), per block"),
    Scheme("bnb-4bit", "bitsandbytes", "weight", ("U8",), ("weight.absmax", "weight.quant_map"),
           ("weight.nested_absmax", "weight.nested_quant_map", "weight.quant_state.bitsandbytes__nf4",
            "weight.quant_state.bitsandbytes__fp4"),
           "uint8, two 4-bit codes per byte (high nibble first) over the flattened weight",
           "w = quant_map[code] * absmax[block]"),
    Scheme("bnb-int8", "bitsandbytes", "weight", ("I8",), ("SCB",), ("weight_format",),
           "int8 codes", "w = q * SCB[row] / 127",
           row_members=("weight", "SCB"), shared_members=("weight_format",)),
    Scheme("mxfp4", "mxfp4", "blocks", ("U8",), ("scales",), (),
           "uint8, two E2M1 codes per byte (low nibble first), 32 values per E8M0 scale, experts stacked",
           "w = E2M1[code] * 2**(scale - 127), [E, rows, in] stored, [E, in, rows] logical"),
    Scheme("mlx", "mlx", "weight", ("U32",), ("scales", "biases"), (),
           "uint32, bits packed along the input axis, low bits first",
           "w = scales[g] * q + biases[g]  (biases: MLX's offsets, not the Linear's bias)",
           row_members=("weight", "scales", "biases")),
)}

SUPPORTED_METHODS = ("awq", "gptq", "auto-round", "fp8", "compressed-tensors", "modelopt", "bitsandbytes", "mlx",
                     "mxfp4")


@dataclass(frozen=True)
class QuantTensor:
    """One logical weight and the stored tensors that make it."""

    logical: str                  # "<module>.weight"
    module: str                   # "<module>"
    scheme: str                   # Scheme.key
    members: tuple                # ((role, stored name), ...): role is the scheme's relative name
    shape: tuple                  # logical [out, in]
    bits: int
    group_size: int               # elements per scale along the input axis (-1 / 0: whole row; block schemes: 0)
    block: tuple = ()             # (rows, cols) for block scales
    params: tuple = ()            # scheme details as (key, value) pairs (zero offset, fp8 reading ...)

    def member(self, role: str) -> str | None:
        return dict(self.members).get(role)

    def param(self, key: str, default=None):
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint's quantization is (config confirmed by tensors)."""

    method: str                   # quant_method ("mlx" for MLX)
    format: str                   # compressed-tensors format, awq version, gptq checkpoint_format, bnb quant type ...
    bits: tuple                   # distinct bit widths of the quantized weights
    group_sizes: tuple            # distinct group sizes (-1: one group per row; 0: block / channel / tensor scales)
    symmetric: bool | None        # None: mixed or not stated
    schemes: tuple                # distinct Scheme keys in use
    tensors: dict = field(default_factory=dict)   # logical name -> QuantTensor
    hidden: frozenset = frozenset()               # stored names that are parts of a logical weight
    unquantized: tuple = ()       # modules the config leaves unquantized (ignore / modules_to_not_convert / lm_head)
    producer: str | None = None   # the tool named in the config, when it says
    config_key: str = "quantization_config"

    def scheme_of(self, logical: str) -> Scheme:
        return SCHEMES[self.tensors[logical].scheme]


def _qcfg(config: dict) -> tuple[dict | None, str]:
    q = config.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") is not None:
        return q, "quantization_config"
    m = config.get("quantization")
    if isinstance(m, dict) and ("bits" in m or "group_size" in m):
        return {**m, "quant_method": "mlx"}, "quantization"
    return None, ""


def config_method(config: dict | None) -> str | None:
    """The quantization method config.json declares, or None."""
    if not isinstance(config, dict):
        return None
    q, _ = _qcfg(config)
    return None if q is None else str(q.get("quant_method"))


def activation_quantization(config: dict | None) -> str | None:
    """The activation quantization a checkpoint asks its runtime for, in words, or None for a
    weight-only scheme.  Read from the config as each runtime reads it: compressed-tensors'
    ``config_groups[*].input_activations`` (W8A8, FP8 dynamic / block); ``fp8``'s
    ``activation_scheme`` (DeepSeek-V3: ``dynamic``, per token and 128-wide group; gptqmodel's FP8
    writes none and runs weight-only); bitsandbytes 8-bit (LLM.int8: every Linear input quantized
    to int8 per row, columns with an outlier above ``llm_int8_threshold`` kept in float16)."""
    q, _ = _qcfg(config) if isinstance(config, dict) else (None, "")
    if q is None:
        return None
    method = str(q.get("quant_method")).lower()
    groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
    if method == "compressed-tensors" or (method == "modelopt" and groups):
        # ModelOpt's export writes config_groups too (static input scales: input_scale)
        acts = [g.get("input_activations") for g in groups.values() if isinstance(g, dict)]
        words = list(dict.fromkeys(_act_words(a) for a in acts if isinstance(a, dict)))
        return "; ".join(words) or None
    if method == "modelopt":
        algos = [str(q.get("quant_algo"))] + [str(v.get("quant_algo")) for v in (q.get("quantized_layers") or {}).values()
                                              if isinstance(v, dict)]
        words = list(dict.fromkeys(_MODELOPT_ACTS[a] for a in algos if a in _MODELOPT_ACTS))
        return "; ".join(words) or None
    if method == "fp8":
        scheme = q.get("activation_scheme")
        if scheme in ("dynamic", "static"):
            return f"float8, {scheme}" + (" per token and 128-wide group" if scheme == "dynamic" else " per tensor")
        return None
    if method == "bitsandbytes" and (q.get("load_in_8bit") or q.get("_load_in_8bit")):
        return (f"LLM.int8: int8 per row, outlier columns above {q.get('llm_int8_threshold', 6.0)} kept in "
                "float16")
    return None


def _act_words(a: dict) -> str:
    """One compressed-tensors ``input_activations`` entry in words.  ``dynamic: local`` (NVFP4 W4A4):
    the per-group scales are computed at runtime under the static global scale ``input_global_scale``."""
    dyn = a.get("dynamic")
    gs = a.get("group_size")
    strategy = a.get("strategy") or ("group" if gs else "tensor")
    per = f"group of {gs}" if gs and strategy in ("group", "tensor_group") else strategy
    how = ("dynamic" if dyn is True else "static" if dyn != "local" else "dynamic")
    tail = " under a static global scale (input_global_scale)" if dyn == "local" else ""
    return f"{a.get('type', 'int')} {a.get('num_bits', 8)}-bit, {how} per {per}{tail}"


# ModelOpt's activation quantization per quant_algo, when config.json has no config_groups
# (hf_quant_config.json only): static per-tensor input_scale; FP8_PER_CHANNEL_PER_TOKEN quantizes them per token at
# run time (no input_scale is written)
_MODELOPT_ACTS = {"NVFP4": "float 4-bit, static per group of 16", "FP8": "float 8-bit, static per tensor",
                  "FP8_PER_CHANNEL_PER_TOKEN": "float 8-bit, dynamic per token"}


def _modules_of(tensors, suffix: str) -> list[str]:
    return [n[:-len(suffix) - 1] for n in tensors if n.endswith("." + suffix)]


def _err(msg: str, path, tensor=None, scheme=None, cls=FormatError):
    where = f" ({scheme})" if scheme else ""
    return cls(msg + where, path=path, tensor=tensor)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _BadValue(Exception):
    pass


def _int(v, default):
    """A config value that must be an integer: ``default`` when absent, refused when it is not one
    (a wrong value is never replaced by a default)."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise _BadValue(v)
    return int(v)


def _unquantized_list(q: dict) -> tuple:
    out = []
    for key in ("ignore", "modules_to_not_convert", "llm_int8_skip_modules", "modules_in_block_to_quantize_not",
                "exclude_modules"):
        v = q.get(key)
        if isinstance(v, (list, tuple)):
            out += [str(x) for x in v]
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------
# per-scheme discovery: which modules, their members, shapes checked against bits x group size

def _members(tensors, module: str, scheme: Scheme, path, *, extra_required=()) -> tuple:
    roles = [scheme.weight, *scheme.required, *extra_required]
    missing = [r for r in roles if f"{module}.{r}" not in tensors]
    if missing:
        raise _err(f"{', '.join(missing)} missing: a quantized weight is never read without its scales",
                   path, f"{module}.{scheme.weight}", scheme.key)
    opt = [r for r in scheme.optional if f"{module}.{r}" in tensors]
    return tuple((r, f"{module}.{r}") for r in [*roles, *opt])


def _shape(tensors, name):
    return tuple(tensors[name].shape)


def _gptq_like(tensors, q: dict, key: str, path, zero_offset: int) -> dict:
    s = SCHEMES[key]
    bits_cfg = _int(q.get("bits", q.get("w_bit")), None)
    gs_cfg = _int(q.get("group_size", q.get("q_group_size")), None)
    out = {}
    for mod in _modules_of(tensors, "qweight"):
        members = _members(tensors, mod, s, path)
        qw, sc, qz = (_shape(tensors, f"{mod}.{r}") for r in ("qweight", "scales", "qzeros"))
        name = f"{mod}.qweight"
        if len(qw) != 2 or len(sc) != 2 or len(qz) != 2:
            raise _err(f"qweight {list(qw)}, scales {list(sc)}, qzeros {list(qz)} are not all 2-D", path, name, key)
        if bits_cfg not in (2, 4, 8):
            raise _err(f"bits = {bits_cfg}: only 2, 4 and 8-bit packing is read", path, name, key, UnsupportedError)
        pf = 32 // bits_cfg
        if key == "gptq":
            n_in, n_out = qw[0] * pf, qw[1]
        else:
            n_in, n_out = qw[0], qw[1] * pf
        groups = sc[0]
        gs = gs_cfg if gs_cfg not in (None, 0) else -1
        want_groups = 1 if gs <= 0 else _cdiv(n_in, gs)
        if sc[1] != n_out or groups != want_groups or qz != (groups, _cdiv(n_out, pf)):
            raise _err(f"packed shape contradicts bits x group size: qweight {list(qw)} at {bits_cfg} bits is "
                       f"[{n_out}, {n_in}], so scales should be [{want_groups}, {n_out}] and qzeros "
                       f"[{want_groups}, {_cdiv(n_out, pf)}] for group size {gs}; they are {list(sc)} and {list(qz)}",
                       path, name, key)
        gi = dict(members).get("g_idx")
        if gi and _shape(tensors, gi) != (n_in,):
            raise _err(f"g_idx has shape {list(_shape(tensors, gi))}, the weight has {n_in} input columns", path, gi, key)
        out[f"{mod}.weight"] = QuantTensor(f"{mod}.weight", mod, key, members, (n_out, n_in), bits_cfg, gs,
                                           params=(("zero_offset", zero_offset),))
    return out


def _gptq(tensors, q, path):
    fmt = str(q.get("checkpoint_format", "gptq"))
    if fmt not in ("gptq", "gptq_v2"):
        raise _err(f"checkpoint_format {fmt!r} is not read (gptq, gptq_v2 are)", path, None, "gptq", UnsupportedError)
    return _gptq_like(tensors, q, "gptq", path, 1 if fmt == "gptq" else 0), fmt


def _awq(tensors, q, path):
    ver = str(q.get("version", "gemm")).lower()
    if ver != "gemm":
        raise _err(f"AWQ version {ver!r} is not read (GEMM is)", path, None, "awq", UnsupportedError)
    return _gptq_like(tensors, q, "awq", path, 0), "gemm"


def _auto_round(tensors, q, path):
    pf = str(q.get("packing_format", "auto_round:auto_gptq"))
    if "awq" in pf:
        return _gptq_like(tensors, q, "awq", path, 0), pf
    if "gptq" in pf:
        # auto-round's own format packs as auto_gptq does, the zero point stored one less (v1);
        # checked element-exact against auto-round 0.16.1's own QuantLinear
        return _gptq_like(tensors, q, "gptq", path, 1), pf
    raise _err(f"packing_format {pf!r} is not read", path, None, "auto-round", UnsupportedError)


def _ct_groups(q: dict, path) -> dict:
    """compressed-tensors' ``config_groups`` that quantize weights: name -> group (a dict with
    ``weights``, ``targets``, maybe its own ``format``)."""
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict):
        groups = {}
    out = {str(k): g for k, g in groups.items() if isinstance(g, dict) and isinstance(g.get("weights"), dict)}
    if not out:
        raise _err("compressed-tensors config has no config_groups with weights", path, None, "compressed-tensors",
                   UnsupportedError)
    return out


def _ct_symmetric(q: dict, path) -> bool | None:
    """The weights' ``symmetric`` when every group agrees, else None."""
    vals = {bool(g["weights"].get("symmetric", True)) for g in _ct_groups(q, path).values()}
    return vals.pop() if len(vals) == 1 else None


# A target naming a module class rather than a module: compressed-tensors matches it against the module's
# torch class (compressed_tensors.utils.match._match_class); a checkpoint holds no classes, and a module
# stored quantized is a Linear, so "Linear" claims every quantized module.
_CLASS_TARGETS = ("Linear",)


# Fused modules as vLLM names them (its models' ``packed_modules_mapping``), which compressed-tensors'
# ``match_name(name, target, fused)`` matches through their shards: a group targeting q/k/v by name or
# pattern targets the fused qkv_proj that ``qkv fuse`` writes.
_FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def ct_target_matches(target: str, module: str) -> bool:
    """Whether a compressed-tensors ``targets`` entry names ``module``: ``re:`` patterns by
    ``re.match`` and plain names exactly (compressed_tensors.utils.match.match_name; a fused module
    through any of its shards, as vLLM matches it), ``Linear`` any quantized module."""
    if target in _CLASS_TARGETS:
        return True
    head, _, last = module.rpartition(".")
    if last in _FUSED_SHARDS:
        return any(ct_target_matches(target, f"{head}.{sh}" if head else sh) for sh in _FUSED_SHARDS[last])
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == module


def _ct_group_of(groups: dict, mod: str, path, tensor: str):
    """The one config group that targets ``mod`` (None when none does).  A module two groups claim is
    refused: which scheme applies would be a guess.  (An ``ignore`` entry naming a module stored
    quantized is lint's finding: the tensors say how it is stored.)"""
    hits = [g for g, grp in groups.items()
            if any(ct_target_matches(str(t), mod) for t in (grp.get("targets") or ()))]
    if len(hits) > 1:
        raise _err(f"config groups {', '.join(repr(h) for h in hits)} both target module {mod}: which scheme "
                   "applies is ambiguous", path, tensor, "compressed-tensors")
    return hits[0] if hits else None


def _ct_pack(tensors, mod, w, path) -> QuantTensor:
    s = SCHEMES["ct-pack"]
    bits = _int(w.get("num_bits"), 8)
    strategy = str(w.get("strategy", "tensor"))
    gs = _int(w.get("group_size"), 0) or 0
    if bits not in (2, 4, 8):
        raise _err(f"num_bits = {bits}: only 2, 4 and 8-bit packing is read", path, f"{mod}.weight_packed", s.key,
                   UnsupportedError)
    pf = 32 // bits
    members = _members(tensors, mod, s, path)
    name = f"{mod}.weight_packed"
    wp, sc = _shape(tensors, name), _shape(tensors, f"{mod}.weight_scale")
    if tensors[f"{mod}.weight_shape"].numel != 2:
        raise _err("weight_shape does not hold 2 values", path, f"{mod}.weight_shape", s.key)
    n_out = wp[0] if len(wp) == 2 else -1
    n_in_max = wp[1] * pf if len(wp) == 2 else -1
    g = gs if strategy == "group" and gs > 0 else -1
    # the logical shape is in weight_shape (read later); here the packed width must hold it
    if len(wp) != 2 or len(sc) != 2 or sc[0] != n_out or (g > 0 and not (n_in_max - pf < sc[1] * g <= n_in_max + g - 1)):
        raise _err(f"packed shape contradicts bits x group size: weight_packed {list(wp)} at {bits} bits "
                   f"holds up to [{n_out}, {n_in_max}], weight_scale is {list(sc)} for group size {g}",
                   path, name, s.key)
    return QuantTensor(f"{mod}.weight", mod, s.key, members, (n_out, n_in_max), bits, g,
                       params=(("symmetric", bool(w.get("symmetric", True))),))


def _ct_scaled(tensors, mod, w, path) -> QuantTensor | None:
    """float-quantized / int-quantized / naive-quantized: codes times a scale; None for a weight stored
    dense beside a scale."""
    strategy = str(w.get("strategy", "tensor"))
    gs = _int(w.get("group_size"), 0) or 0
    block = tuple(_int(x, 0) for x in (w.get("block_structure") or ()))
    wname = f"{mod}.weight"
    if wname not in tensors:
        raise _err("weight_scale without its weight", path, f"{mod}.weight_scale", "compressed-tensors")
    dt = tensors[wname].dtype
    key = "ct-float" if dt.startswith("F8") else "ct-int" if dt == "I8" else None
    if key is None:
        return None    # an unquantized weight with a scale (a dense module in a mixed checkpoint)
    s = SCHEMES[key]
    members = _members(tensors, mod, s, path)
    shp = _shape(tensors, wname)
    sc = _shape(tensors, f"{mod}.weight_scale")
    scale_ok, g, blk = _check_scale(shp, sc, strategy, gs, block)
    if not scale_ok:
        raise _err(f"weight_scale {list(sc)} does not fit weight {list(shp)} for strategy {strategy}"
                   + (f" block {list(block)}" if block else f" group size {gs}" if gs else ""), path,
                   f"{mod}.weight_scale", s.key)
    return QuantTensor(wname, mod, key, members, shp, 8, g, blk, params=(("strategy", strategy),))


def fp4_logical(tensors, mod: str, key: str, weight: str, group: int, scale_dtypes: tuple, path) -> QuantTensor:
    """An FP4 (E2M1) weight: ``weight`` uint8 ``[out, in/2]`` (two codes a byte) and ``weight_scale``
    ``[out, in/group]`` of one of ``scale_dtypes`` (F8_E4M3 for NVFP4, E8M0 as U8 for MXFP4); the
    logical shape ``[out, in]``.  A scale of another shape or dtype is refused, naming both."""
    s = SCHEMES[key]
    members = _members(tensors, mod, s, path)
    name, sname = f"{mod}.{weight}", f"{mod}.weight_scale"
    wp, sc = _shape(tensors, name), _shape(tensors, sname)
    if tensors[name].dtype != "U8":
        raise _err(f"is {tensors[name].dtype}, not uint8 (two E2M1 codes a byte)", path, name, s.key)
    if len(wp) != 2:
        raise _err(f"packed FP4 weight {list(wp)} is not 2-D", path, name, s.key)
    n_out, n_in = wp[0], wp[1] * 2
    if sc != (n_out, _cdiv(n_in, group)) or n_in % group:
        raise _err(f"FP4 scale shape wrong: weight_scale {list(sc)}, the weight [{n_out}, {n_in}] in groups of "
                   f"{group} needs [{n_out}, {_cdiv(n_in, group)}]", path, sname, s.key)
    if tensors[sname].dtype not in scale_dtypes:
        raise _err(f"is {tensors[sname].dtype}, not {' / '.join(scale_dtypes)}", path, sname, s.key)
    for r in ("weight_global_scale", "weight_scale_2", "input_global_scale", "input_scale"):
        m = dict(members).get(r)
        if m and tensors[m].numel != 1:
            raise _err(f"holds {tensors[m].numel} values, a per-tensor scale holds one", path, m, s.key)
    return QuantTensor(f"{mod}.weight", mod, key, members, (n_out, n_in), 4, group)


def _ct_nvfp4(tensors, mod, w, path) -> QuantTensor:
    return fp4_logical(tensors, mod, "ct-nvfp4", "weight_packed", _int(w.get("group_size"), 16) or 16,
                       ("F8_E4M3",), path)


def _ct_mxfp4(tensors, mod, w, path) -> QuantTensor:
    return fp4_logical(tensors, mod, "ct-mxfp4", "weight_packed", _int(w.get("group_size"), 32) or 32, ("U8",), path)


def _ct_mxfp8(tensors, mod, w, path) -> QuantTensor | None:
    s = SCHEMES["ct-mxfp8"]
    wname, sname = f"{mod}.weight", f"{mod}.weight_scale"
    if wname not in tensors:
        raise _err("weight_scale without its weight", path, sname, s.key)
    if not tensors[wname].dtype.startswith("F8"):
        return None
    members = _members(tensors, mod, s, path)
    gs = _int(w.get("group_size"), 32) or 32
    shp, sc = _shape(tensors, wname), _shape(tensors, sname)
    if len(shp) != 2 or sc != (shp[0], _cdiv(shp[1], gs)) or tensors[sname].dtype != "U8":
        raise _err(f"weight_scale {tensors[sname].dtype} {list(sc)} is not one E8M0 (uint8) exponent per {gs} values "
                   f"of weight {list(shp)}", path, sname, s.key)
    return QuantTensor(wname, mod, s.key, members, shp, 8, gs)


# compressed-tensors format -> (the stored member that marks a module of it, its reader)
_CT_FORMATS = {
    "pack-quantized": ("weight_packed", _ct_pack),
    "float-quantized": ("weight_scale", _ct_scaled),
    "int-quantized": ("weight_scale", _ct_scaled),
    "naive-quantized": ("weight_scale", _ct_scaled),
    "nvfp4-pack-quantized": ("weight_packed", _ct_nvfp4),
    "mxfp4-pack-quantized": ("weight_packed", _ct_mxfp4),
    "mxfp8-quantized": ("weight_scale", _ct_mxfp8),
}


def _compressed_tensors(tensors, q, path):
    """Each Linear takes the scheme of the config group that targets it (``targets``: names, ``re:``
    patterns, ``Linear``), in that group's ``format`` (or the checkpoint's); ``ignore`` leaves modules
    dense.  Several groups with different formats (``format: mixed-precision``) are read group by group."""
    top = str(q.get("format", ""))
    groups = _ct_groups(q, path)
    fmts = {g: str(grp.get("format") or top) for g, grp in groups.items()}  # a group may name its own format
    for g, f in fmts.items():
        if f not in _CT_FORMATS:
            raise _err(f"compressed-tensors format {f!r} is not read ({', '.join(_CT_FORMATS)} are)", path, None,
                       "compressed-tensors", UnsupportedError)
    marks = sorted({m for m, _ in _CT_FORMATS.values()})
    mods = sorted({mod for m in marks for mod in _modules_of(tensors, m)})
    out = {}
    for mod in mods:
        mark = next(m for m in marks if f"{mod}.{m}" in tensors)
        g = _ct_group_of(groups, mod, path, f"{mod}.{mark}")
        if g is None:
            if mark == "weight_packed" or tensors.get(f"{mod}.weight") is not None and \
                    tensors[f"{mod}.weight"].dtype.startswith(("F8", "I8")):
                raise _err("is stored quantized but no config group targets it", path,
                           f"{mod}.{mark}", "compressed-tensors")
            continue
        want, read = _CT_FORMATS[fmts[g]]
        if f"{mod}.{want}" not in tensors:
            raise _err(f"config group {g!r} ({fmts[g]}) targets it, but {want} is not stored", path,
                       f"{mod}.{mark}", "compressed-tensors")
        qt = read(tensors, mod, groups[g]["weights"], path)
        if qt is not None:
            out[qt.logical] = replace(qt, params=(*qt.params, ("group", g), ("format", fmts[g])))
    used = sorted({dict(t.params)["format"] for t in out.values()})
    fmt = used[0] if len(used) == 1 else f"{top or 'mixed-precision'}: {', '.join(used)}"
    return out, fmt


def _check_scale(shp, sc, strategy, gs, block) -> tuple[bool, int, tuple]:
    """Whether a scale of shape ``sc`` fits a 2-D weight ``shp`` (returns ok, group size, block)."""
    if len(shp) != 2:
        return False, 0, ()
    n = 1
    for d in sc:
        n *= d
    if n == 1:
        return True, 0, ()
    out_, in_ = shp
    if strategy == "block" or block:
        b = tuple(int(x) for x in block) if block else (0, 0)
        if len(b) != 2 or min(b) <= 0:
            return False, 0, ()
        return tuple(sc) == (_cdiv(out_, b[0]), _cdiv(in_, b[1])), 0, b
    if tuple(sc) in ((out_, 1), (out_,)):
        return True, 0, ()
    if strategy == "group" and gs > 0:
        return tuple(sc) == (out_, _cdiv(in_, gs)), gs, ()
    return False, 0, ()


# The names fp8 checkpoints give a Linear's block / tensor scale (``weight_scale_inv``'s meaning) and its static
# activation scale, as transformers' FineGrainedFP8 loader renames them (quantizer_finegrained_fp8
# ``update_weight_conversions``: ``.qscale_weight`` as Mistral's releases spell it, ``.scale`` as
# DeepSeek-V4-Flash does; ``.qscale_act``, Mistral's activation scale, unused like ``activation_scale``), and
# AutoFP8's ``weight_scale`` (neuralmagic's ``*-FP8`` releases of 2024: ``quant_method: fp8`` with
# ``activation_scheme`` and ``ignored_layers``, one amax/448 scale per tensor, which its ``FP8StaticLinear`` /
# ``FP8DynamicLinear`` and vLLM's ``Fp8LinearMethod`` multiply: ``weight.to(dtype) * weight_scale``).
_FP8_SCALE_NAMES = ("weight_scale_inv", "qscale_weight", "scale", "weight_scale")
_FP8_ACT_NAMES = ("activation_scale", "input_scale", "qscale_act")


def _fp8_members(tensors, mod: str, sname: str) -> tuple:
    acts = [(r if r != "qscale_act" else "activation_scale", f"{mod}.{r}") for r in _FP8_ACT_NAMES
            if f"{mod}.{r}" in tensors]
    return (("weight", f"{mod}.weight"), ("weight_scale_inv", f"{mod}.{sname}"), *acts)


def _fp8(tensors, q, path):
    bs = q.get("weight_block_size")
    block = tuple(_int(x, 0) for x in bs) if isinstance(bs, (list, tuple)) and len(bs) == 2 else ()
    if bs is not None and (not block or min(block) <= 0):
        raise _err(f"weight_block_size {bs!r} is not two positive integers", path, None, "fp8")
    s = SCHEMES["fp8"]
    out = {}
    for spelling in _FP8_SCALE_NAMES:
        for mod in _modules_of(tensors, spelling):
            wname, sname = f"{mod}.weight", f"{mod}.{spelling}"
            if wname in out:
                raise _err(f"has two scales ({out[wname].member('weight_scale_inv').rsplit('.', 1)[1]} and "
                           f"{spelling})", path, wname, s.key)
            if spelling == "scale" and (wname not in tensors or not tensors[wname].dtype.startswith("F8")):
                continue        # a norm's own ``scale`` parameter, not an fp8 scale
            if wname not in tensors:
                raise _err(f"{spelling} without its weight: a quantized weight is never read without its codes", path,
                           sname, s.key)
            shp, sc = _shape(tensors, wname), _shape(tensors, sname)
            if not tensors[wname].dtype.startswith("F8"):
                raise _err(f"weight is {tensors[wname].dtype}, not float8, beside {spelling}", path, wname, s.key)
            ok, _, blk = _check_scale(shp, sc, "block" if block else "tensor", 0, block)
            if not ok:
                raise _err(f"{spelling} {list(sc)} does not fit weight {list(shp)} with weight_block_size "
                           f"{list(block)}", path, sname, s.key)
            params = (("fp8_reading", "multiply"),) if spelling == "weight_scale" else ()   # AutoFP8: amax/448
            if tensors[sname].dtype == "U8":
                # UE8M0 scales stored as bytes (scale_fmt "ue8m0"): transformers' FineGrainedFP8 loader views them
                # as float8_e8m0fnu, 2**(e - 127); bytes without that declaration have no meaning to read
                if q.get("scale_fmt") != "ue8m0":
                    raise _err("is uint8 but quantization_config has no scale_fmt: \"ue8m0\": its meaning cannot be "
                               "established", path, sname, s.key)
                params = (("ue8m0", True),)
            out[wname] = QuantTensor(wname, mod, s.key, _fp8_members(tensors, mod, spelling), shp, 8, 0, blk,
                                     params=params)
    return out, "e4m3" if not q.get("fmt") else str(q.get("fmt"))


# ModelOpt's quant_algo -> the scheme its tensors are stored in (modelopt.torch.export: NVFP4 and
# W4A16_NVFP4 write NVFP4QTensor's packing, FP8 a float8 weight and a per-tensor scale,
# FP8_PER_CHANNEL_PER_TOKEN one scale per output row: ``to_quantized_weight`` divides by ``scale[:, None]``).
# Not read: its fp8_pb_wo export (a 4-D weight_scale no ModelOpt reader takes back), AWQ and W4A8 algos.
_MODELOPT_ALGOS = {"NVFP4": "modelopt-nvfp4", "W4A16_NVFP4": "modelopt-nvfp4", "FP8": "modelopt-fp8",
                   "FP8_PER_CHANNEL_PER_TOKEN": "modelopt-fp8"}


def modelopt_quant_config(hf_quant: dict) -> dict | None:
    """The ``quantization_config`` a ModelOpt ``hf_quant_config.json`` stands for (releases whose
    config.json has none): its ``quantization`` section with ``quant_method: modelopt``."""
    prod = hf_quant.get("producer") if isinstance(hf_quant, dict) else None
    sect = hf_quant.get("quantization") if isinstance(hf_quant, dict) else None
    if not isinstance(sect, dict) or not isinstance(prod, dict) or str(prod.get("name", "")).lower() != "modelopt":
        return None
    return {**sect, "quant_method": "modelopt", "producer": prod}


def _modelopt(tensors, q, path):
    """ModelOpt (``quant_method: modelopt``): ``quant_algo`` for the checkpoint, or per module in
    ``quantized_layers`` (``MIXED_PRECISION``); NVFP4 / W4A16_NVFP4: ``weight`` uint8 codes,
    ``weight_scale`` F8_E4M3 per 16, ``weight_scale_2`` F32 per tensor (multiplied); FP8: ``weight``
    float8, ``weight_scale`` F32 per tensor; ``input_scale`` when activations are quantized."""
    algo = str(q.get("quant_algo") or "")
    layers = q.get("quantized_layers") if isinstance(q.get("quantized_layers"), dict) else {}
    gs0 = _int(q.get("group_size"), 16) or 16
    out = {}
    for mod in _modules_of(tensors, "weight_scale"):
        wname = f"{mod}.weight"
        if wname not in tensors:
            raise _err("weight_scale without its weight", path, f"{mod}.weight_scale", "modelopt")
        entry = layers.get(mod) if isinstance(layers.get(mod), dict) else None
        a = str(entry.get("quant_algo")) if entry else algo
        key = _MODELOPT_ALGOS.get(a)
        if key is None:
            why = ("MIXED_PRECISION without a quantized_layers entry for this module" if a == "MIXED_PRECISION"
                   else f"quant_algo {a!r} is not read ({', '.join(_MODELOPT_ALGOS)} are)")
            raise _err(why, path, wname, "modelopt", UnsupportedError)
        dt = tensors[wname].dtype
        if key == "modelopt-nvfp4":
            if dt != "U8":
                raise _err(f"quant_algo {a} stores uint8 codes, this weight is {dt}", path, wname, key)
            gs = _int(entry.get("group_size"), gs0) if entry else gs0
            qt = fp4_logical(tensors, mod, key, "weight", gs, ("F8_E4M3",), path)
        else:
            if not dt.startswith("F8"):
                raise _err(f"quant_algo {a} stores float8 codes, this weight is {dt}", path, wname, key)
            members = _members(tensors, mod, SCHEMES[key], path)
            shp, sc = _shape(tensors, wname), _shape(tensors, f"{mod}.weight_scale")
            ok, _, _ = _check_scale(shp, sc, "channel", 0, ())
            if not ok:
                raise _err(f"weight_scale {list(sc)} is neither one scale per tensor nor one per row of weight "
                           f"{list(shp)}", path, f"{mod}.weight_scale", key)
            qt = QuantTensor(wname, mod, key, members, shp, 8, 0)
        out[wname] = replace(qt, params=(*qt.params, ("algo", a)))
    used = sorted({dict(t.params)["algo"] for t in out.values()})
    return out, (used[0] if len(used) == 1 and algo != "MIXED_PRECISION" else f"{algo}: {', '.join(used)}")


def _bnb(tensors, q, path):
    out = {}
    fmt = None
    for mod in _modules_of(tensors, "weight.absmax"):
        s = SCHEMES["bnb-4bit"]
        members = _members(tensors, mod, s, path)
        qs = [r for r, _ in members if r.startswith("weight.quant_state.")]
        if not qs:
            raise _err("weight.quant_state.bitsandbytes__nf4|fp4 missing (shape and block size)", path,
                       f"{mod}.weight", s.key)
        qtype = qs[0].rsplit("__", 1)[1]
        fmt = fmt or qtype
        bs = _int(q.get("bnb_4bit_blocksize"), 64) or 64
        n = tensors[f"{mod}.weight"].numel * 2
        out[f"{mod}.weight"] = QuantTensor(f"{mod}.weight", mod, s.key, members, (), 4, bs,
                                           params=(("quant_type", qtype), ("packed_elements", n)))
    for mod in _modules_of(tensors, "SCB"):
        s = SCHEMES["bnb-int8"]
        members = _members(tensors, mod, s, path)
        shp, scb = _shape(tensors, f"{mod}.weight"), _shape(tensors, f"{mod}.SCB")
        if len(shp) != 2 or scb != (shp[0],):
            raise _err(f"SCB {list(scb)} does not give one scale per row of weight {list(shp)}", path, f"{mod}.SCB", s.key)
        if tensors[f"{mod}.weight"].dtype != "I8":
            raise _err(f"weight is {tensors[f'{mod}.weight'].dtype}, not int8, beside SCB", path, f"{mod}.weight", s.key)
        out[f"{mod}.weight"] = QuantTensor(f"{mod}.weight", mod, s.key, members, shp, 8, 0)
        fmt = fmt or "int8"
    return out, fmt or ("nf4" if q.get("load_in_4bit") else "int8")


def _mlx(tensors, q, path):
    s = SCHEMES["mlx"]
    gs0, bits0 = _int(q.get("group_size"), 64), _int(q.get("bits"), 4)
    mode = str(q.get("mode", "affine"))
    if mode != "affine":
        raise _err(f"MLX quantization mode {mode!r} is not read (affine is)", path, None, s.key, UnsupportedError)
    out = {}
    for mod in _modules_of(tensors, "scales"):
        if f"{mod}.biases" not in tensors and f"{mod}.weight" in tensors:
            raise _err("biases (MLX's offsets) missing beside scales", path, f"{mod}.weight", s.key)
        members = _members(tensors, mod, s, path)
        over = q.get(mod)
        gs, bits = (_int(over.get("group_size"), gs0), _int(over.get("bits"), bits0)) if isinstance(over, dict) else (gs0, bits0)
        name = f"{mod}.weight"
        wp, sc, bi = (_shape(tensors, f"{mod}.{r}") for r in ("weight", "scales", "biases"))
        if tensors[name].dtype != "U32":
            raise _err(f"weight is {tensors[name].dtype}, not uint32, beside MLX scales", path, name, s.key)
        if bits not in (2, 4, 8):
            raise _err(f"bits = {bits}: only 2, 4 and 8-bit packing is read", path, name, s.key, UnsupportedError)
        n_in = wp[-1] * 32 // bits if wp else 0
        if len(wp) != 2 or sc != bi or sc != (wp[0], n_in // gs if gs else -1) or n_in % gs:
            raise _err(f"packed shape contradicts bits x group size: weight {list(wp)} at {bits} bits is "
                       f"[{wp[0] if wp else '?'}, {n_in}], so scales/biases should be [{wp[0] if wp else '?'}, "
                       f"{n_in // gs if gs else '?'}] for group size {gs}; they are {list(sc)} / {list(bi)}",
                       path, name, s.key)
        out[name] = QuantTensor(name, mod, s.key, members, (wp[0], n_in), bits, gs,
                                params=(("compute", tensors[f"{mod}.scales"].dtype),))
    return out, "affine"


def _mxfp4(tensors, q, path):
    s = SCHEMES["mxfp4"]
    out = {}
    for bname in sorted(n for n in tensors if n.endswith("_blocks")):
        logical = bname[:-len("_blocks")]
        sname = f"{logical}_scales"
        if sname not in tensors:
            raise _err("scales missing beside the MXFP4 blocks", path, bname, s.key)
        b, sc = _shape(tensors, bname), _shape(tensors, sname)
        for n in (bname, sname):
            if tensors[n].dtype != "U8":
                raise _err(f"is {tensors[n].dtype}, not uint8 (MXFP4 codes and E8M0 scales)", path, n, s.key)
        if len(b) != 4 or b[-1] != 16 or sc != b[:-1]:
            raise _err(f"blocks {list(b)} / scales {list(sc)} are not gpt-oss's stacked-expert layout [E, rows, G, 16] "
                       "/ [E, rows, G]", path, bname, s.key)
        out[logical] = QuantTensor(logical, logical.rsplit(".", 1)[0], s.key, (("blocks", bname), ("scales", sname)),
                                   (b[0], b[2] * 32, b[1]), 4, 32)
    return out, "e2m1"


_DETECTORS = {
    "gptq": _gptq, "awq": _awq, "auto-round": _auto_round, "compressed-tensors": _compressed_tensors,
    "fp8": _fp8, "bitsandbytes": _bnb, "mlx": _mlx, "mxfp4": _mxfp4, "modelopt": _modelopt,
}


def _producer(q: dict) -> str | None:
    prod = q.get("producer")
    if isinstance(prod, dict) and prod.get("name"):     # ModelOpt: {"name": "modelopt", "version": ...}
        return " ".join(str(prod[k]) for k in ("name", "version") if prod.get(k))
    for k in ("quantizer", "packing_format", "autoround_version", "_load_in_4bit", "provider"):
        v = q.get(k)
        if isinstance(v, list) and v:
            return str(v[0])
        if isinstance(v, str) and k != "_load_in_4bit":
            return v
    meta = q.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("quantizer"), list) and meta["quantizer"]:
        return str(meta["quantizer"][0])
    return None


def detect(config: dict | None, tensors: dict[str, TensorInfo], path: str | None = None) -> Quantization | None:
    """The checkpoint's quantization (None for a dense checkpoint).  The config names the method;
    the tensors confirm it: every packed weight has its scales (else :class:`FormatError`), its
    packed shape agrees with bits x group size, and a method whose tensors are absent is refused."""
    q, key = _qcfg(config) if isinstance(config, dict) else (None, "")
    if q is None:
        return None
    method = str(q.get("quant_method")).lower()
    if method not in _DETECTORS:
        raise _err(f"quant_method {method!r} is not supported (supported: {', '.join(SUPPORTED_METHODS)})",
                   path, None, None, UnsupportedError)
    try:
        qt, fmt = _DETECTORS[method](tensors, q, path)
    except _BadValue as e:
        raise _err(f"{key} holds {e.args[0]!r} where an integer is needed (bits, group size, block size)", path,
                   None, method) from None
    if not qt:
        raise _err(f"config.json declares {key}.quant_method = {method!r}, but no tensor is stored that way "
                   "(no packed weight with its scales)", path, None, method)
    codes = ("U8", "I8", "U32", "I32", "F8_E4M3", "F8_E5M2")
    for n, i in tensors.items():
        # a weight stored as codes that no scheme claimed has lost its scales: never read as values
        if n.endswith(".weight") and n not in qt and i.dtype in codes:
            raise _err(f"stored as {i.dtype} codes with no scales beside it: scales missing", path, n,
                       next((t.scheme for t in qt.values()), method))
    hidden = set()
    for t in qt.values():
        for role, name in t.members:
            if role != "bias" and name != t.logical:     # (bnb / fp8 / MLX keep the weight's own name)
                hidden.add(name)
    unq = _unquantized_list(q)
    if q.get("lm_head") is False or (method != "mlx" and "lm_head.weight" in tensors and "lm_head.weight" not in qt
                                     and "lm_head" not in unq):
        unq = (*unq, "lm_head")
    sym = q.get("sym", q.get("symmetric"))
    if method == "compressed-tensors":
        try:
            sym = _ct_symmetric(q, path)
        except FormatError:
            sym = None
    elif method == "awq":
        sym = not q.get("zero_point", True)
    return Quantization(method=method, format=str(fmt), bits=tuple(sorted({t.bits for t in qt.values()})),
                        group_sizes=tuple(sorted({t.group_size for t in qt.values()})),
                        symmetric=None if sym is None else bool(sym),
                        schemes=tuple(sorted({t.scheme for t in qt.values()})), tensors=qt,
                        hidden=frozenset(hidden), unquantized=unq, producer=_producer(q), config_key=key)


# Stored names only a quantized Linear has (its packed weight or a companion of it).
_QUANT_TELLS = (".qweight", ".qzeros", ".weight_packed", ".weight_scale_inv", ".SCB", ".weight.absmax",
                ".weight.quant_map", ".weight_global_scale", ".weight_scale_2", ".qscale_weight")


def undeclared(config: dict | None, tensors) -> str | None:
    """A tensor that only a quantized checkpoint stores, in a checkpoint whose config declares no
    quantization (its codes would otherwise be read as weights), or None."""
    if config_method(config) is not None:
        return None
    for n in tensors:
        if n.endswith(_QUANT_TELLS) or (n.endswith(".biases") and n[:-7] + ".scales" in tensors):
            return n
    return None


def module_matches(pattern: str, module: str) -> bool:
    """Whether an ignore-list entry names ``module`` (compressed-tensors ``re:`` patterns, a plain
    name, or a trailing name such as ``lm_head``)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern or module.endswith("." + pattern) or module.split(".")[-1] == pattern
