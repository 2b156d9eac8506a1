"""Dequantization of Hugging Face quantized Linears to dense float32 ``[out, in]`` (numpy, vectorised,
no torch), one kernel per :class:`~ckpt_surgeon.formats.quant.schemes.Scheme`.

Each kernel takes the :class:`~ckpt_surgeon.formats.quant.schemes.QuantTensor` and ``get(role)``,
the decoded stored member (float types widened to float32, integer types as stored).  Products are
formed in float32 from the same operands as the producer's reference (and as llama.cpp's
``convert_hf_to_gguf.py`` ``dequant_model`` where it handles the scheme: ``scale.float() *
(q - z).float()``), so those results are bit-identical; ``tests/test_quant_read.py`` compares each
kernel with the producing library's own dequantization.
"""
from __future__ import annotations

import json
from typing import Callable

import numpy as np

from ...errors import FormatError
from .schemes import QuantTensor

Get = Callable[[str], np.ndarray]

# AutoAWQ packs the eight 4-bit values of a word in the order 0 2 4 6 1 3 5 7 (awq/utils/packing_utils.py);
# reading shift 4*i gives column ORDER[i], so column c is at shift position REVERSE[c].
_AWQ_REVERSE = {4: np.array([0, 4, 1, 5, 2, 6, 3, 7]), 8: np.array([0, 2, 1, 3]), 2: None}


def unpack_last(a: np.ndarray, bits: int) -> np.ndarray:
    """int32/uint32 ``[..., n]`` -> uint8 ``[..., n * 32/bits]``: value j of word k is element k*pf + j
    (low bits first)."""
    w = np.ascontiguousarray(a).view(np.uint32)
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    return ((w[..., None] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.uint8).reshape(*w.shape[:-1], -1)


def unpack_first(a: np.ndarray, bits: int) -> np.ndarray:
    """int32 ``[n, m]`` packed along the first axis -> uint8 ``[n * 32/bits, m]`` (one pass per
    field straight into the output: no full-size uint32 temporary)."""
    w = np.ascontiguousarray(a).view(np.uint32)
    pf = 32 // bits
    out = np.empty((w.shape[0], pf, w.shape[1]), np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for j in range(pf):
        np.bitwise_and(w >> np.uint32(bits * j), mask, out=out[:, j, :], casting="unsafe")
    return out.reshape(-1, w.shape[1])


def _group_index(qt: QuantTensor, n_in: int, get: Get, role: str | None) -> np.ndarray:
    if role and qt.member(role):
        g = get(role).astype(np.int64)
        return g
    gs = qt.group_size if qt.group_size > 0 else n_in
    return np.arange(n_in) // gs


def check_g_idx(qt: QuantTensor, g: np.ndarray, groups: int, path=None) -> None:
    if g.size and (g.min() < 0 or g.max() >= groups):
        raise FormatError(f"g_idx holds group {int(g.min()) if g.min() < 0 else int(g.max())}, outside 0..{groups - 1} "
                          f"({qt.scheme})", path=path, tensor=qt.member("g_idx") or qt.member("weight_g_idx"))


def dq_gptq(qt: QuantTensor, get: Get) -> np.ndarray:
    """GPTQ: ``w[o, i] = s[g_i, o] * (q[i, o] - (z[g_i, o] + offset))``."""
    bits = qt.bits
    q = unpack_first(get("qweight"), bits)                          # [in, out]
    z = unpack_last(get("qzeros"), bits)[:, :q.shape[1]].astype(np.int16) + qt.param("zero_offset", 1)
    s = get("scales").astype(np.float32)
    g = _group_index(qt, q.shape[0], get, "g_idx")
    check_g_idx(qt, g, s.shape[0])
    n_in, n_out = q.shape
    gs = qt.group_size if qt.group_size > 0 else n_in
    if n_in % gs == 0 and np.array_equal(g, np.arange(n_in) // gs):
        # g_idx in order (no act-order): broadcast each group's scale and zero instead of gathering
        # them per column; the same float32 product of the same operands
        # the codes are transposed to [out, in] while one byte each (a quarter of a float32
        # transpose); same operands, same float32 products
        qt_ = np.ascontiguousarray(q.T).reshape(n_out, -1, gs)
        d = np.subtract(qt_, np.ascontiguousarray(z.T)[:, :, None], dtype=np.int16)
        w = np.multiply(np.ascontiguousarray(s.T)[:, :, None], d, dtype=np.float32)
        return w.reshape(n_out, n_in)
    return np.ascontiguousarray((s[g] * (q.astype(np.int16) - z[g]).astype(np.float32)).T)


def dq_awq(qt: QuantTensor, get: Get) -> np.ndarray:
    """AWQ GEMM: ``w[o, i] = (q[i, o] - z[g_i, o]) * s[g_i, o]`` with the interleaved packing order."""
    bits = qt.bits
    rev = _AWQ_REVERSE.get(bits)
    q = unpack_last(get("qweight"), bits)                           # [in, out] in packing order
    z = unpack_last(get("qzeros"), bits)
    if rev is not None:
        pf = 32 // bits
        q = q.reshape(q.shape[0], -1, pf)[:, :, rev].reshape(q.shape[0], -1)
        z = z.reshape(z.shape[0], -1, pf)[:, :, rev].reshape(z.shape[0], -1)
    s = get("scales").astype(np.float32)
    g = _group_index(qt, q.shape[0], get, None)
    return np.ascontiguousarray(((q.astype(np.int16) - z[g].astype(np.int16)).astype(np.float32) * s[g]).T)


def dq_ct_pack(qt: QuantTensor, get: Get) -> np.ndarray:
    """compressed-tensors pack-quantized: ``w = (q - zp) * s`` (zp = 2**(bits-1) when symmetric),
    ``weight_shape`` giving the logical shape (the packed width is padded to whole words)."""
    bits = qt.bits
    out_, in_ = (int(x) for x in get("weight_shape").reshape(-1))
    q = unpack_last(get("weight_packed"), bits)[:out_, :in_].astype(np.int16)
    s = get("weight_scale").astype(np.float32)
    if qt.member("weight_zero_point"):
        zp = unpack_first(get("weight_zero_point"), bits)[:out_].astype(np.int16)   # packed along the output axis
    else:
        zp = None
    g = _group_index(qt, in_, get, "weight_g_idx")
    check_g_idx(qt, g, s.shape[1])
    off = (np.int16(1 << (bits - 1)) if zp is None else zp[:, g])
    return (q - off).astype(np.float32) * s[:, g]


def _expand(scale: np.ndarray, shape: tuple, qt: QuantTensor) -> np.ndarray:
    """A tensor / channel / group / block scale broadcast to the weight's ``[out, in]``."""
    out_, in_ = shape
    s = scale.astype(np.float32)
    if s.size == 1:
        return s.reshape(1, 1)
    if qt.block:
        b0, b1 = qt.block
        return np.repeat(np.repeat(s, b0, axis=0), b1, axis=1)[:out_, :in_]
    if qt.group_size > 0:
        return np.repeat(s.reshape(out_, -1), qt.group_size, axis=1)[:, :in_]
    return s.reshape(out_, 1)


def fp8_scale_reading(s: np.ndarray) -> str | None:
    """How an ``fp8`` checkpoint's ``weight_scale_inv`` is meant, from its values.

    DeepSeek-V3 stores amax/448 (dequantize by multiplying); gptqmodel stores 448/amax under the
    same name (dividing).  The stored codes are the same in both (a block's largest code is 448
    either way), so the scale's own magnitude decides: a weight's block amax is far below the
    float8 range for any trained Linear, so amax/448 < 1 and 448/amax > 1.  All blocks below 1:
    ``multiply``; all above 1: ``divide``; otherwise None (the caller refuses: no guessing)."""
    s = np.asarray(s, np.float32)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        return None
    if np.all(s < 1):
        return "multiply"
    if np.all(s > 1):
        return "divide"
    return None


def dq_scaled(qt: QuantTensor, get: Get, role: str) -> np.ndarray:
    """float8 / int8 codes times their scale (``w = q * s``), or ``(q - zp) * s`` with a zero point,
    or ``q / s`` for an fp8 reciprocal scale."""
    q = get("weight")
    s = get(role)
    if qt.param("ue8m0"):           # E8M0 exponents stored as bytes (fp8 scale_fmt "ue8m0")
        s = _e8m0(s)
    shape = q.shape
    if qt.param("fp8_reading") == "divide":
        # w = q / s: the reciprocal of gptqmodel's 448/amax, formed once per block
        return q.astype(np.float32) / _expand(s, shape, qt)
    e = _expand(s, shape, qt)
    if qt.member("weight_zero_point"):
        zp = _expand(get("weight_zero_point").astype(np.float32), shape, qt)
        return (q.astype(np.float32) - zp) * e
    return q.astype(np.float32) * e


def bnb_quant_state(raw: np.ndarray) -> dict:
    """The JSON blob bitsandbytes stores as ``weight.quant_state.bitsandbytes__<type>``."""
    return json.loads(np.asarray(raw, np.uint8).tobytes().decode("utf-8"))


def dq_bnb4(qt: QuantTensor, get: Get) -> np.ndarray:
    """bitsandbytes 4-bit: ``w = quant_map[code] * absmax[block]`` over the flattened weight (high
    nibble first); double quantization: ``absmax = nested_quant_map[a] * nested_absmax[block/256] +
    offset`` (bitsandbytes ``functional.dequantize_4bit`` / ``dequantize_blockwise``), rounded to the
    quant state's dtype as ``dequantize_4bit`` returns it."""
    role = next(r for r, _ in qt.members if r.startswith("weight.quant_state."))
    st = bnb_quant_state(get(role))
    shape = tuple(int(x) for x in st["shape"])
    n = int(np.prod(shape))
    bs = int(st.get("blocksize", qt.group_size))
    packed = get("weight").reshape(-1)
    codes = np.empty(packed.size * 2, np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 15
    codes = codes[:n]
    absmax = get("weight.absmax")
    if qt.member("weight.nested_absmax"):
        nbs = int(st.get("nested_blocksize", 256))
        nabs = get("weight.nested_absmax").astype(np.float32)
        nmap = get("weight.nested_quant_map").astype(np.float32)
        a = absmax.reshape(-1).astype(np.int64)
        absmax = nmap[a] * np.repeat(nabs, nbs)[:a.size] + np.float32(st.get("nested_offset", 0.0))
    absmax = absmax.astype(np.float32).reshape(-1)
    qmap = get("weight.quant_map").astype(np.float32)
    if absmax.size != -(-n // bs):
        raise FormatError(f"weight.absmax holds {absmax.size} blocks, the weight's {n} elements in blocks of {bs} "
                          f"need {-(-n // bs)} ({qt.scheme})", tensor=qt.member("weight.absmax"))
    # dequantize_4bit returns the quant state's dtype (the model's compute dtype): one float32
    # product rounded to it
    dt = {"bfloat16": "BF16", "float16": "F16"}.get(str(st.get("dtype", "")).replace("torch.", ""))
    return round_to(qmap[codes] * np.repeat(absmax, bs)[:n], dt).reshape(shape)


def dq_bnb_int8(qt: QuantTensor, get: Get) -> np.ndarray:
    """bitsandbytes LLM.int8: ``w = q * SCB[row] * (1/127)`` (``functional.int8_vectorwise_dequant``:
    the product with the row absmax first, then with 1/127 as float32)."""
    q = get("weight").astype(np.float32)
    scb = get("SCB").astype(np.float32).reshape(-1, 1)
    return (q * scb) * np.float32(7.874015718698502e-3)


def round_to(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """float32 values rounded to ``dtype`` (BF16 / F16, round to nearest even) and widened back
    (exact): arithmetic done in that type, one operation at a time."""
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        u = np.ascontiguousarray(x, np.float32).view(np.uint32)
        r = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) & np.uint32(0xFFFF0000)
        nan = np.isnan(x)
        if nan.any():
            r[nan] = np.uint32(0x7FC00000)
        return r.view(np.float32)
    return x


def dq_mlx(qt: QuantTensor, get: Get) -> np.ndarray:
    """MLX affine: ``w = scales * q + biases`` per group of ``group_size`` input columns, each
    operation rounded to the scales' dtype as ``mlx.core.dequantize`` does (its CPU kernel
    computes in that type: a bfloat16 product, then a bfloat16 sum)."""
    q = unpack_last(get("weight"), qt.bits).astype(np.float32)
    out_, in_ = q.shape
    gs = qt.group_size
    dt = qt.param("compute")
    s = get("scales").astype(np.float32)[:, :, None]
    b = get("biases").astype(np.float32)[:, :, None]
    return round_to(round_to(q.reshape(out_, in_ // gs, gs) * s, dt) + b, dt).reshape(out_, in_)


def dq_mxfp4(qt: QuantTensor, get: Get) -> np.ndarray:
    """gpt-oss's stacked experts (transformers' ``convert_moe_packed_tensors``): byte k of a block holds
    elements 2k (low nibble) and 2k + 1 (high), each an E2M1 value times ``2**(scale - 127)`` (ldexp: exact
    in float32, inf past its range as there); ``[E, rows, G*32]`` with its last two axes swapped."""
    from .dequant import E2M1_VALUES
    blocks, scales = get("blocks"), get("scales")
    vals = np.empty(blocks.shape[:-1] + (32,), np.float32)
    vals[..., 0::2] = E2M1_VALUES[blocks & 0x0F]
    vals[..., 1::2] = E2M1_VALUES[blocks >> 4]
    with np.errstate(over="ignore"):
        vals = np.ldexp(vals, (scales.astype(np.int32) - 127)[..., None]).astype(np.float32, copy=False)
    e, rows, g = scales.shape
    return vals.reshape(e, rows, g * 32).transpose(0, 2, 1)


def fp4_codes(packed: np.ndarray) -> np.ndarray:
    """uint8 ``[out, in/2]`` -> E2M1 codes uint8 ``[out, in]``: byte k holds element 2k in its low nibble
    and 2k + 1 in its high one (compressed-tensors ``pack_fp4_to_uint8``, ModelOpt ``NVFP4QTensor``)."""
    p = np.ascontiguousarray(packed, np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1], 2), np.uint8)
    np.bitwise_and(p, 15, out=out[..., 0])
    np.right_shift(p, 4, out=out[..., 1])
    return out.reshape(*p.shape[:-1], -1)


# rows of an FP4 weight decoded at a time: about this many values, so the temporaries (codes, one float32
# product) stay a few MB whatever the tensor (a 7B model's MLP weight is 68 M values)
_FP4_CHUNK = 1 << 20


def _fp4_dense(packed: np.ndarray, scale: np.ndarray, bf16: bool) -> np.ndarray:
    """E2M1 codes (two a byte) times a per-group float32 ``scale`` ``[out, groups]``, float32 ``[out, in]``,
    each product rounded to bfloat16 when ``bf16``; decoded a few rows at a time into the one output."""
    from .dequant import E2M1_VALUES
    out_, half = packed.shape
    n_in = half * 2
    g = scale.shape[1]
    w = np.empty((out_, n_in), np.float32)
    step = max(1, _FP4_CHUNK // max(n_in, 1))
    for a in range(0, out_, step):
        b = min(a + step, out_)
        rows = w[a:b]
        np.take(E2M1_VALUES, fp4_codes(packed[a:b]), out=rows)
        rows.reshape(b - a, g, n_in // g)[...] *= scale[a:b, :, None]
        if bf16:
            rows[...] = round_to(rows, "BF16")
    return w


def dq_ct_nvfp4(qt: QuantTensor, get: Get) -> np.ndarray:
    """compressed-tensors ``nvfp4-pack-quantized`` (``NVFP4PackedCompressor.decompress``): the block scale
    divided by the global scale in float32 (``scale / global_scale``: a bfloat16 scale over a float32
    ``[1]`` tensor promotes to float32), the E2M1 value times it in float32, rounded to bfloat16
    (``unpack_fp4_from_uint8`` returns bfloat16 and ``dequantize`` returns that dtype)."""
    scale = get("weight_scale").astype(np.float32) / get("weight_global_scale").astype(np.float32).reshape(())
    return _fp4_dense(get("weight_packed"), scale, bf16=True)


def _e8m0(s: np.ndarray) -> np.ndarray:
    """E8M0 exponents (uint8) -> ``2**(s - 127)`` as float32 (exact; 255 -> inf as ``2.0 ** 128``)."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)


def dq_ct_mxfp4(qt: QuantTensor, get: Get) -> np.ndarray:
    """compressed-tensors ``mxfp4-pack-quantized`` (``MXFP4PackedCompressor``): E2M1 value times
    ``2**(e - 127)`` (``decompress_mx_scale``), computed in bfloat16 there, exact (a power of two times
    a 2-bit mantissa) but for the subnormal / infinite ends, rounded to bfloat16 here as there."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _fp4_dense(get("weight_packed"), _e8m0(get("weight_scale")), bf16=True)


def _per_group(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``values[o, g*G + j] * scale[o, g]`` in float32 (G = in / groups)."""
    out_, in_ = values.shape
    g = scale.shape[1]
    return (values.reshape(out_, g, in_ // g) * scale.astype(np.float32)[:, :, None]).reshape(out_, in_)


def dq_ct_mxfp8(qt: QuantTensor, get: Get) -> np.ndarray:
    """compressed-tensors ``mxfp8-quantized`` (``MXFP8QuantizationCompressor``): float8 code times
    ``2**(e - 127)`` per 32 values, in bfloat16 there (exact), rounded to bfloat16 here as there."""
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(_per_group(get("weight").astype(np.float32), _e8m0(get("weight_scale"))), "BF16")


def dq_modelopt_nvfp4(qt: QuantTensor, get: Get) -> np.ndarray:
    """ModelOpt NVFP4 (``NVFP4QTensor.dequantize``): ``per_block_scale = weight_scale.float() *
    weight_scale_2`` (float32), then the E2M1 value times it (float32)."""
    scale = get("weight_scale").astype(np.float32) * get("weight_scale_2").astype(np.float32).reshape(())
    return _fp4_dense(get("weight"), scale, bf16=False)


def dq_modelopt_fp8(qt: QuantTensor, get: Get) -> np.ndarray:
    """ModelOpt FP8 (``FP8QTensor.dequantize``): ``q.float() * weight_scale`` (per tensor or per row)."""
    q = get("weight").astype(np.float32)
    s = get("weight_scale").astype(np.float32)
    return q * (s.reshape(()) if s.size == 1 else s.reshape(-1, 1))


KERNELS: dict[str, Callable[[QuantTensor, Get], np.ndarray]] = {
    "ct-nvfp4": dq_ct_nvfp4,
    "ct-mxfp4": dq_ct_mxfp4,
    "ct-mxfp8": dq_ct_mxfp8,
    "modelopt-nvfp4": dq_modelopt_nvfp4,
    "modelopt-fp8": dq_modelopt_fp8,
    "gptq": dq_gptq,
    "awq": dq_awq,
    "ct-pack": dq_ct_pack,
    "ct-float": lambda qt, get: dq_scaled(qt, get, "weight_scale"),
    "ct-int": lambda qt, get: dq_scaled(qt, get, "weight_scale"),
    "fp8": lambda qt, get: dq_scaled(qt, get, "weight_scale_inv"),
    "bnb-4bit": dq_bnb4,
    "bnb-int8": dq_bnb_int8,
    "mlx": dq_mlx,
    "mxfp4": dq_mxfp4,
}


def dequantize(qt: QuantTensor, get: Get) -> np.ndarray:
    """The dense float32 ``[out, in]`` weight of one quantized Linear."""
    return KERNELS[qt.scheme](qt, get)
