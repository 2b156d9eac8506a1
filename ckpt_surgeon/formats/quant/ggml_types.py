"""ggml tensor types: the one table of their facts, read by every GGUF reader, writer and planner.

A ggml type ``T`` stores a row of ``n`` values (ggml ``ne[0]``, the *last* numpy axis) as
``n / block_size`` blocks of ``type_size`` bytes (ggml ``type_traits``: ``blck_size``,
``type_size``; a type is quantized when a block holds more than one value).  The ids are the file
format's (``ggml.h`` ``enum ggml_type``).

Written once, here, as data: the same facts as gguf-py's (``gguf.constants``:
``GGMLQuantizationType`` for the ids and names, ``GGML_QUANT_SIZES`` for the block sizes), which
``tests/test_dequant.py`` checks row by row, and as the installed libggml's own traits (Q8_1 aside:
40 bytes here and in gguf-py, 36 in today's ggml; no quantizer writes Q8_1 to a file).  Not read
from gguf-py at run time: reading a GGUF (``inspect``) imports neither torch nor gguf-py
(``tests/test_gguf_reader.py``), and gguf-py's package import costs about 0.1 s.  Ids not listed
(4, 5: Q4_2 / Q4_3; the runtime-repacked 31-33, 36-38) were removed from the format: unknown.

The kernels behind the types are elsewhere: :mod:`.dequant` (ours, numpy), :mod:`.ggml_quant`
(llama.cpp's, through libggml), :mod:`.quantize` (Q8_0 and the float types).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GGMLType", "GGML_TYPES", "TYPES_BY_NAME", "ggml_type", "known", "block_size", "nbytes", "ik_llama_type"]


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str            # upper case, as gguf-py spells it: "Q4_K"
    block_size: int      # elements per block
    type_size: int       # bytes per block

    @property
    def quantized(self) -> bool:
        return self.block_size > 1

    def nbytes(self, numel: int) -> int:
        """Bytes of ``numel`` elements (``numel`` must be a multiple of ``block_size``)."""
        return numel // self.block_size * self.type_size


QK_K = 256       # elements per k-quant super-block (ggml-common.h)
# (id, name, elements per block, bytes per block): ggml.h ``enum ggml_type``, ggml.c ``type_traits``
_ROWS = (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", QK_K, 84), (11, "Q3_K", QK_K, 110), (12, "Q4_K", QK_K, 144), (13, "Q5_K", QK_K, 176),
    (14, "Q6_K", QK_K, 210), (15, "Q8_K", QK_K, 292), (16, "IQ2_XXS", QK_K, 66), (17, "IQ2_XS", QK_K, 74),
    (18, "IQ3_XXS", QK_K, 98), (19, "IQ1_S", QK_K, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", QK_K, 110),
    (22, "IQ2_S", QK_K, 82), (23, "IQ4_XS", QK_K, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", QK_K, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", QK_K, 54), (35, "TQ2_0", QK_K, 66), (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
)
GGML_TYPES: dict[int, GGMLType] = {r[0]: GGMLType(*r) for r in _ROWS}
TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


def known(t: int | str) -> bool:
    """Whether ``t`` (an id or a name) is a ggml type of the file format."""
    return (t in TYPES_BY_NAME) if isinstance(t, str) else (int(t) in GGML_TYPES)


def ggml_type(t: int | str | GGMLType) -> GGMLType:
    """Look a type up by id, name or record.  ``KeyError`` if unknown."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        return TYPES_BY_NAME[t]
    return GGML_TYPES[int(t)]


def block_size(t: int | str) -> int:
    """Elements per block of type ``t`` (1 for the float and integer types)."""
    return ggml_type(t).block_size


def nbytes(t: int | str, shape) -> int:
    """Bytes of a tensor of type ``t`` and ``shape`` (its last axis a whole number of blocks)."""
    n = 1
    for d in shape:
        n *= int(d)
    return ggml_type(t).nbytes(n)


# Types only ik_llama.cpp (the fork) defines: its ggml.h ``enum ggml_type`` (read at commit b50efcc of
# ikawrakow/ik_llama.cpp), as data.  Its own quantizations (IQ2_K ... IQ6_K, the IQ*_KS family, Q6_0, the
# ternary IQ*_BN) and its row-interleaved repacks (``_R4`` / ``_R8`` / ``_R16``) live at ids llama.cpp's ggml
# never used: 98-99, 133-199 and 200-399.  Later ik_llama.cpp types (the *_KT trellis family ...) fall in
# the same ranges and are named by id.
_IK_LLAMA = {
    98: "Q8_0_X4", 99: "Q8_1_X4", 133: "Q6_0", 134: "IQ1_BN", 135: "IQ2_BN", 136: "Q8_K64", 137: "IQ2_K",
    138: "IQ3_K", 139: "IQ4_K", 140: "IQ5_K", 141: "IQ6_K", 142: "IQ2_TN", 143: "IQ1_TN", 144: "IQ4_KS",
    145: "IQ2_KS", 146: "IQ4_KSS", 147: "Q8_K16", 148: "Q8_K32", 149: "Q8_KR8", 150: "Q8_K128", 151: "Q8_KV",
    202: "Q4_0_R8", 206: "Q5_0_R4", 208: "Q8_0_R8", 210: "Q2_K_R4", 211: "Q3_K_R4", 212: "Q4_K_R4",
    213: "Q5_K_R4", 214: "Q6_K_R4", 216: "IQ2_XXS_R4", 217: "IQ2_XS_R4", 218: "IQ3_XXS_R4", 219: "IQ1_S_R4",
    220: "IQ4_NL_R4", 221: "IQ3_S_R4", 222: "IQ2_S_R4", 223: "IQ4_XS_R8", 229: "IQ1_M_R4", 230: "BF16_R16",
    233: "Q6_0_R4", 335: "IQ2_BN_R4", 337: "IQ2_K_R4", 338: "IQ3_K_R4", 339: "IQ4_K_R4", 340: "IQ5_K_R4",
    344: "IQ4_KS_R4", 398: "Q8_KV_R8", 399: "Q8_K_R8",
}


def ik_llama_type(tid: int) -> str | None:
    """The name of an ik_llama.cpp-only type id (``type id N`` for one of its ranges not named above), or
    None for an id outside them."""
    if tid in GGML_TYPES:
        return None
    if tid in _IK_LLAMA:
        return _IK_LLAMA[tid]
    return f"type id {tid}" if 98 <= tid <= 99 or 133 <= tid <= 399 else None
