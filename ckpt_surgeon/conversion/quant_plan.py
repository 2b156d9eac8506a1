"""Planning a quantized GGUF (``--dtype q4_k_m`` ...): each tensor's type by llama.cpp's mixture
(:mod:`ckpt_surgeon.conversion.quant_mix`), its size, its importance-matrix slice.

The plan of the F32 file llama.cpp's converter would write is retyped as ``llama_model_quantize``
retypes that file, so the data streamed afterwards (:mod:`.gguf_stream`) is quantized chunk by
chunk with llama.cpp's kernels (:mod:`ckpt_surgeon.formats.quant.ggml_quant`): no intermediate file.
q8_0 keeps the converter's own plan and kernel (llama.cpp's converter's ``--outtype q8_0``).
"""
from __future__ import annotations

from dataclasses import replace

from .quant_mix import FTYPES, QUANT_FTYPES, MixModel, tensor_types
from ..errors import UnsupportedError
from ..formats.quant.ggml_types import nbytes as ggml_nbytes

__all__ = ["QUANT_ONLY", "file_type_name", "check_quant_request", "quantize_plan", "mixture", "ggml_shape"]

# file types planned by the mixture and llama.cpp's kernels (q8_0: the converter's own, see above)
QUANT_ONLY = tuple(f for f in QUANT_FTYPES if f != "q8_0")
_BASE = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16"}


def file_type_name(dtype: str) -> str:
    """gguf-py ``LlamaFileType`` member for ``general.file_type``."""
    return _BASE[dtype] if dtype in _BASE else FTYPES[dtype][0]


def check_quant_request(dtype: str, imatrix) -> None:
    """Before any work: llama.cpp's kernels are there for a quantized type, and an importance
    matrix is only given with one."""
    if imatrix is not None and dtype not in QUANT_FTYPES:
        raise UnsupportedError(f"--imatrix applies to quantized types, not --dtype {dtype}")
    if dtype in QUANT_ONLY:
        from ..formats.quant import ggml_quant
        ggml_quant.lib()


def ggml_shape(shape: tuple) -> tuple:
    """The shape llama-quantize writes: ``gguf_add_tensor`` stores ``ggml_n_dims`` dimensions, so
    size-1 outer dimensions are dropped (Qwen2-MoE's ``ffn_gate_inp_shexp`` [1, n_embd], written
    2-D by llama.cpp's converter, comes out 1-D).  Same bytes, same tensor for llama.cpp."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def mixture(entries: list, dtype: str, arch: str, hp: dict, imatrix_path, path: str) -> tuple[dict, dict]:
    """``entries``: ``(GGUF name, numpy shape, source ggml type)``.  Returns (name -> TensorType,
    name -> importance weights) after every check llama.cpp makes before writing (imatrix from
    another model, a type that needs an imatrix without one)."""
    model = MixModel(arch, int(hp["n_layer"]), int(hp["n_head"]), int(hp["n_head"] if hp.get("n_head_kv") is None else hp["n_head_kv"]),
                     int(hp.get("n_expert") or 0))
    im = None
    if imatrix_path is not None:
        from .imatrix import read_imatrix
        im = read_imatrix(imatrix_path)
    types = tensor_types(entries, dtype, model, has_imatrix=im is not None)
    weights = {}
    if im is not None:
        from .imatrix import imatrix_for_plan
        src = {n: t for n, _, t in entries}
        weights = imatrix_for_plan(im, [(n, s, types[n].ggml_type != src[n]) for n, s, _ in entries],
                                   str(imatrix_path))
    for n, _, _ in entries:
        t = types[n]
        if t.quantize and t.needs_imatrix and n not in weights:
            raise UnsupportedError(f"--dtype {dtype} makes it {t.ggml_type}, which llama.cpp makes only with an "
                                   "importance matrix (--imatrix FILE from llama-imatrix)", path=path, tensor=n)
    return types, weights


def quantize_plan(plan: list, dtype: str, arch: str, hp: dict, imatrix_path, warnings: list, path: str) -> list:
    """The F32 plan retyped for file type ``dtype`` (sizes and importance weights with it)."""
    types, weights = mixture([(p.dst, tuple(p.shape), p.ggml_type) for p in plan], dtype, arch, hp, imatrix_path,
                             path)
    out = []
    fell = []
    for p in plan:
        t = types[p.dst]
        if t.fell_back:
            fell.append(f"{p.dst} ({t.ggml_type})")
        out.append(replace(p, ggml_type=t.ggml_type, nbytes=ggml_nbytes(t.ggml_type, p.shape), shape=ggml_shape(p.shape),
                           imatrix=weights.get(p.dst)))
    if fell:
        warnings.append(f"{len(fell)} tensor(s) have rows that are not whole blocks of the mixture's type and fall "
                        f"back as llama.cpp does: {', '.join(fell[:4])}{' ...' if len(fell) > 4 else ''}")
    return out

