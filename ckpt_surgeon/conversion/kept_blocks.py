"""HF -> GGUF: quantized weights kept in ggml's block types: FP4 as llama.cpp's converter keeps it, int4 where it
refuses the checkpoint.

llama.cpp's ``convert_hf_to_gguf.py`` (``ModelBase._generate_nvfp4_tensors``, ``_repack_nvfp4``) writes an
NVFP4 Linear (compressed-tensors ``nvfp4-pack-quantized`` or ModelOpt NVFP4 / W4A16_NVFP4) as one NVFP4
tensor (codes and block scales moved bit for bit), plus ``<name>.scale`` (F32 ``[1]``: ModelOpt's
``weight_scale_2``, or ``1 / weight_global_scale`` for compressed-tensors, whose global scale divides) and
``<name>.input_scale`` (``input_scale``, or ``1 / input_global_scale``), each left out when it is 1
(``_scale_is_trivial``), which llama.cpp multiplies in at run time; the file type becomes MOSTLY_NVFP4 for an
f32 / f16 / bf16 outtype, and a ModelOpt W4A16_NVFP4 tensor is listed under ``general.tensor_extra.prec_a4``
(false: no 4-bit activations).  The same here, for every scheme :data:`~..formats.quant.block_repack.KEPT`
names: MXFP4 too (compressed-tensors ``mxfp4-pack-quantized``, which llama.cpp's converter refuses; ggml
has the type, so its blocks are moved as well), in a checkpoint of one scheme or of several config groups.

A compressed-tensors checkpoint of several config groups (which llama.cpp's converter refuses unless every group
is NVFP4) keeps its symmetric int4 groups (``pack-quantized``, group a multiple of 32, every scale an f16 value)
as Q4_0, the same values (``formats/quant/block_repack.py``); where llama.cpp's converter reads a
pack-quantized checkpoint it dequantizes it, and so does this (byte-identical to it).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import UnsupportedError
from ..formats.quant.block_repack import KEPT, f16_exact
from ..formats.quant.ggml_types import ggml_type
from .transforms import lookup

__all__ = ["kept_type", "refuse_requantizing", "scale_tensors", "read_rows", "prec_a4_names", "file_type"]

# llama.cpp's LlamaFileType for a file whose weights are kept FP4 (gguf-py constants: MOSTLY_MXFP4_MOE 38,
# MOSTLY_NVFP4 39; the installed gguf-py predates 39)
_FILE_TYPES = {"NVFP4": 39, "MXFP4": 38}


def _qt(ck, src: str):
    q = getattr(ck, "quantization", None)
    return None if q is None else q.tensors.get(src)


def kept_type(ck, src: str, transform: str, shape: tuple) -> str | None:
    """The ggml type HF weight ``src`` is kept in, or None (dequantized: another scheme; moved by a transform
    other than "as it is"; a row that is not whole blocks; int4 outside a mixed-precision checkpoint, or with
    a zero point, a g_idx or a scale f16 cannot hold)."""
    t = _qt(ck, src)
    gt = KEPT.get(t.scheme) if t is not None else None
    if gt is None and t is not None and t.scheme == "ct-pack" and _q4_0_exact(ck, t):
        gt = "Q4_0"
    if gt is None or lookup(transform).name != "none" or len(shape) != 2 or shape[-1] % ggml_type(gt).block_size:
        return None
    return gt


def _q4_0_exact(ck, t) -> bool:
    q = ck.quantization
    return (len({dict(x.params).get("group") for x in q.tensors.values()}) > 1 and q.method == "compressed-tensors"
            and t.bits == 4 and t.group_size > 0 and t.group_size % 32 == 0 and t.member("weight_zero_point") is None
            and t.member("weight_g_idx") is None and f16_exact(ck.read_stored(t.member("weight_scale"))))


def refuse_requantizing(plan, dtype: str, path) -> None:
    """A llama.cpp quantized file type would quantize the kept blocks again: refused in one line, as
    llama-quantize refuses requantizing MXFP4."""
    p = next((p for p in plan if getattr(p, "kept", "")), None)
    if p is not None:
        raise UnsupportedError(f"is stored quantized, kept {p.kept} in the GGUF; --dtype {dtype} would quantize "
                               "it again: convert with --dtype f16, bf16, f32 or q8_0", path=path, tensor=p.src)


def _scalar(ck, name: str) -> np.float32:
    return np.float32(np.asarray(ck.read_stored(name), np.float32).reshape(-1)[0])


def scale_tensors(ck, src: str, dst: str) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, F32 ``[1]``) of the per-tensor scales llama.cpp writes beside a kept weight ``dst``."""
    t = _qt(ck, src)
    if t is None or t.scheme not in ("ct-nvfp4", "modelopt-nvfp4"):
        return []
    out = []
    if t.scheme == "ct-nvfp4":
        # compressed-tensors' global scales divide: llama.cpp writes their float32 reciprocals
        pairs = (("scale", "weight_global_scale", True), ("input_scale", "input_global_scale", True))
    else:
        pairs = (("scale", "weight_scale_2", False), ("input_scale", "input_scale", False))
    base = dst[:-len(".weight")] if dst.endswith(".weight") else dst
    for suffix, role, inverse in pairs:
        m = t.member(role)
        if m is None:
            continue
        v = _scalar(ck, m)
        if inverse:
            v = np.float32(1) / v
        if abs(float(v) - 1.0) < 1e-6:     # llama.cpp's _scale_is_trivial: not written
            continue
        out.append((f"{base}.{suffix}", np.array([v], np.float32)))
    return out


def read_rows(ck, src: str, a: int, b: int) -> tuple:
    """Rows a:b of a kept weight, read from the stored tensors: FP4 codes and scale bytes (uint8); int4: the
    int32 words, the scales as float32 and the group size (:func:`~..formats.quant.block_repack.q4_0_rows`)."""
    t = _qt(ck, src)
    weight = t.member("weight_packed") or t.member("weight")
    out = []
    for name in (weight, t.member("weight_scale")):
        info = ck.stored_tensors[name]
        per_row = info.nbytes // info.shape[0]
        sub = replace(info, dtype="U8", shape=(b - a, per_row), start=info.start + a * per_row,
                      end=info.start + b * per_row)
        out.append(np.frombuffer(ck.reader.stored.read_bytes(sub), np.uint8).reshape(b - a, per_row))
    if t.scheme == "ct-pack":        # int32 words; the scales decoded (bf16 / f16 / f32) to float32
        rows = replace(ck.stored_tensors[t.member("weight_scale")], shape=(b - a,) + tuple(
            ck.stored_tensors[t.member("weight_scale")].shape[1:]))
        from ..formats import safetensors as st
        return out[0].view("<i4"), st.decode(out[1].reshape(-1), rows), t.group_size
    return out[0], out[1]


def prec_a4_names(ck, plan) -> list[str]:
    """GGUF names of kept tensors whose producer says their activations stay 16-bit (ModelOpt
    W4A16_NVFP4: llama.cpp's ``_tag_prec_a4``), sorted as llama.cpp writes them."""
    names = []
    for p in plan:
        t = _qt(ck, p.src) if getattr(p, "kept", "") else None
        if t is not None and t.scheme == "modelopt-nvfp4" and t.param("algo") == "W4A16_NVFP4":
            names.append(p.dst)
    return sorted(names)


def file_type(plan, dtype: str) -> int | None:
    """MOSTLY_NVFP4 / MOSTLY_MXFP4_MOE for an f32 / f16 / bf16 file holding kept FP4 weights (llama.cpp's
    ``ModelBase.prepare_metadata``), else None (the outtype's own)."""
    kinds = {getattr(p, "kept", "") for p in plan}
    if dtype not in ("f32", "f16", "bf16"):
        return None
    return next((_FILE_TYPES[k] for k in ("NVFP4", "MXFP4") if k in kinds), None)
