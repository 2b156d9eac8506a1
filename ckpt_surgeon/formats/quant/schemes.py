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
  tensor by :func:`fp8_scale_reading`).
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
from dataclasses import dataclass, field

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

SUPPORTED_METHODS = ("awq", "gptq", "auto-round", "fp8", "compressed-tensors", "bitsandbytes", "mlx", "mxfp4")


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
    if method == "compressed-tensors":
        groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
        acts = [g.get("input_activations") for g in groups.values() if isinstance(g, dict)]
        acts = [a for a in acts if isinstance(a, dict)]
        if not acts:
            return None
        a = acts[0]
        how = "dynamic" if a.get("dynamic") else "static"
        gs = f" of {a['group_size']}" if a.get("strategy") == "group" and a.get("group_size") else ""
        return f"{a.get('type', 'int')} {a.get('num_bits', 8)}-bit, {how} per {a.get('strategy', 'tensor')}{gs}"
    if method == "fp8":
        scheme = q.get("activation_scheme")
        if scheme in ("dynamic", "static"):
            return f"float8, {scheme}" + (" per token and 128-wide group" if scheme == "dynamic" else " per tensor")
        return None
    if method == "bitsandbytes" and (q.get("load_in_8bit") or q.get("_load_in_8bit")):
        return (f"LLM.int8: int8 per row, outlier columns above {q.get('llm_int8_threshold', 6.0)} kept in "
                "float16")
    return None


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
    for key in ("ignore", "modules_to_not_convert", "llm_int8_skip_modules", "modules_in_block_to_quantize_not"):
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


def _ct_group(q: dict, path) -> dict:
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict):
        groups = {}
    ws = [g.get("weights") for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    if not ws:
        raise _err("compressed-tensors config has no config_groups with weights", path, None, "compressed-tensors",
                   UnsupportedError)
    if len({json.dumps(w, sort_keys=True) for w in ws}) > 1:
        raise _err(f"{len(ws)} different weight config groups: only one is read", path, None, "compressed-tensors",
                   UnsupportedError)
    return ws[0]


def _compressed_tensors(tensors, q, path):
    fmt = str(q.get("format", ""))
    w = _ct_group(q, path)
    fmt = str(w.get("format") or fmt)  # a group may name its own format (compressed-tensors >= 0.10)
    bits = _int(w.get("num_bits"), 8)
    strategy = str(w.get("strategy", "tensor"))
    gs = _int(w.get("group_size"), 0) or 0
    block = tuple(_int(x, 0) for x in (w.get("block_structure") or ()))
    out = {}
    if fmt == "pack-quantized":
        s = SCHEMES["ct-pack"]
        if bits not in (2, 4, 8):
            raise _err(f"num_bits = {bits}: only 2, 4 and 8-bit packing is read", path, None, s.key, UnsupportedError)
        pf = 32 // bits
        for mod in _modules_of(tensors, "weight_packed"):
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
            out[f"{mod}.weight"] = QuantTensor(f"{mod}.weight", mod, s.key, members, (n_out, n_in_max), bits, g,
                                               params=(("symmetric", bool(w.get("symmetric", True))),))
        return out, fmt
    if fmt in ("float-quantized", "int-quantized", "naive-quantized"):
        for mod in _modules_of(tensors, "weight_scale"):
            wname = f"{mod}.weight"
            if wname not in tensors:
                raise _err("weight_scale without its weight", path, f"{mod}.weight_scale", "compressed-tensors")
            dt = tensors[wname].dtype
            key = "ct-float" if dt.startswith("F8") else "ct-int" if dt == "I8" else None
            if key is None:
                continue    # an unquantized weight with a scale (a dense module in a mixed checkpoint)
            s = SCHEMES[key]
            members = _members(tensors, mod, s, path)
            shp = _shape(tensors, wname)
            sc = _shape(tensors, f"{mod}.weight_scale")
            scale_ok, g, blk = _check_scale(shp, sc, strategy, gs, block)
            if not scale_ok:
                raise _err(f"weight_scale {list(sc)} does not fit weight {list(shp)} for strategy {strategy}"
                           + (f" block {list(block)}" if block else f" group size {gs}" if gs else ""), path,
                           f"{mod}.weight_scale", s.key)
            out[wname] = QuantTensor(wname, mod, key, members, shp, 8, g, blk,
                                     params=(("strategy", strategy),))
        return out, fmt
    raise _err(f"compressed-tensors format {fmt!r} is not read (pack-quantized, float-quantized, int-quantized, "
               "naive-quantized are)", path, None, "compressed-tensors", UnsupportedError)


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


def _fp8(tensors, q, path):
    bs = q.get("weight_block_size")
    block = tuple(_int(x, 0) for x in bs) if isinstance(bs, (list, tuple)) and len(bs) == 2 else ()
    if bs is not None and (not block or min(block) <= 0):
        raise _err(f"weight_block_size {bs!r} is not two positive integers", path, None, "fp8")
    s = SCHEMES["fp8"]
    out = {}
    for mod in _modules_of(tensors, "weight_scale_inv"):
        members = _members(tensors, mod, s, path)
        wname = f"{mod}.weight"
        shp, sc = _shape(tensors, wname), _shape(tensors, f"{mod}.weight_scale_inv")
        if not tensors[wname].dtype.startswith("F8"):
            raise _err(f"weight is {tensors[wname].dtype}, not float8, beside weight_scale_inv", path, wname, s.key)
        ok, _, blk = _check_scale(shp, sc, "block" if block else "tensor", 0, block)
        if not ok:
            raise _err(f"weight_scale_inv {list(sc)} does not fit weight {list(shp)} with weight_block_size "
                       f"{list(block)}", path, f"{mod}.weight_scale_inv", s.key)
        out[wname] = QuantTensor(wname, mod, s.key, members, shp, 8, 0, blk)
    return out, "e4m3" if not q.get("fmt") else str(q.get("fmt"))


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
    "fp8": _fp8, "bitsandbytes": _bnb, "mlx": _mlx, "mxfp4": _mxfp4,
}


def _producer(q: dict) -> str | None:
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
            sym = _ct_group(q, path).get("symmetric")
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
                ".weight.quant_map")


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
