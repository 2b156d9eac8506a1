"""HF -> GGUF: FP4 weights kept in ggml's FP4 types, as llama.cpp's converter keeps them.

llama.cpp's ``convert_hf_to_gguf.py`` (``ModelBase._generate_nvfp4_tensors``, ``_repack_nvfp4``) writes an
NVFP4 Linear (compressed-tensors ``nvfp4-pack-quantized`` or ModelOpt NVFP4 / W4A16_NVFP4) as one NVFP4
tensor (codes and block scales moved bit for bit), plus ``<name>.scale`` (F32 ``[1]``: ModelOpt's
``weight_scale_2``, or ``1 / weight_global_scale`` for compressed-tensors, whose global scale divides) and
``<name>.input_scale`` (``input_scale``, or ``1 / input_global_scale``), each left out when it is 1
(``_scale_is_trivial``), which llama.cpp multiplies in at run time; the file type becomes MOSTLY_NVFP4 for an
f32 / f16 / bf16 outtype, and a ModelOpt W4A16_NVFP4 tensor is listed under ``general.tensor_extra.prec_a4``
(false: no 4-bit activations).  The same here, for every scheme :data:`~..formats.quant.fp4_blocks.KEPT`
names: MXFP4 too (compressed-tensors ``mxfp4-pack-quantized``, which llama.cpp's converter refuses; ggml
has the type, so its blocks are moved as well), in a checkpoint of one scheme or of several config groups.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import UnsupportedError
from ..formats.quant.fp4_blocks import KEPT
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
    """The FP4 ggml type HF weight ``src`` is kept in, or None (not FP4; moved by a transform other than
    "as it is"; a row that is not whole blocks: those are dequantized as before)."""
    t = _qt(ck, src)
    if t is None or t.scheme not in KEPT:
        return None
    gt = KEPT[t.scheme]
    if lookup(transform).name != "none" or len(shape) != 2 or shape[-1] % ggml_type(gt).block_size:
        return None
    return gt


def refuse_requantizing(plan, dtype: str, path) -> None:
    """A llama.cpp quantized file type would quantize the kept FP4 blocks again: refused in one line, as
    llama-quantize refuses requantizing MXFP4."""
    p = next((p for p in plan if getattr(p, "kept", "")), None)
    if p is not None:
        raise UnsupportedError(f"is stored {p.kept}, kept {p.kept} in the GGUF; --dtype {dtype} would quantize it "
                               "again: convert with --dtype f16, bf16, f32 or q8_0", path=path, tensor=p.src)


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


def read_rows(ck, src: str, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows a:b of a kept weight's stored codes and scale bytes (uint8), read from the stored tensors."""
    t = _qt(ck, src)
    weight = t.member("weight_packed") or t.member("weight")
    out = []
    for name in (weight, t.member("weight_scale")):
        info = ck.stored_tensors[name]
        per_row = info.nbytes // info.shape[0]
        sub = replace(info, dtype="U8", shape=(b - a, per_row), start=info.start + a * per_row,
                      end=info.start + b * per_row)
        out.append(np.frombuffer(ck.reader.stored.read_bytes(sub), np.uint8).reshape(b - a, per_row))
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
    kinds = {getattr(p, "kept", "") for p in plan} - {""}
    if dtype not in ("f32", "f16", "bf16") or not kinds:
        return None
    return _FILE_TYPES["NVFP4" if "NVFP4" in kinds else "MXFP4"]
