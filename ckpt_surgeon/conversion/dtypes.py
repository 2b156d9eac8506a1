"""The output dtype names ``convert`` accepts, in both directions (CLI and API)."""
from __future__ import annotations

from .quant_mix import QUANT_FTYPES
from ..errors import UnsupportedError

# Output dtype spellings accepted by both directions (CLI and API): the HF names and the GGUF names.
_TO_HF = {"float32": "float32", "f32": "float32", "float16": "float16", "f16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}
_TO_GGUF = {"f32": "f32", "float32": "f32", "f16": "f16", "float16": "f16", "bf16": "bf16",
            "bfloat16": "bf16", "q8_0": "q8_0"}
# llama.cpp's quantized file types (llama-quantize's names, any case): conversion/quant_mix.py
_TO_GGUF.update({f: f for f in QUANT_FTYPES})


def normalize_dtype(dtype: str | None, to_gguf: bool) -> str:
    """The output dtype in the target's spelling (``None``: f16 for GGUF, float32 for HF)."""
    if dtype is None:
        return "f16" if to_gguf else "float32"
    table = _TO_GGUF if to_gguf else _TO_HF
    got = table.get(str(dtype).lower())
    if got is None:
        where = "a GGUF file" if to_gguf else "an HF folder"
        known = sorted(set(table.values()), key=lambda t: (t in QUANT_FTYPES, t))
        raise UnsupportedError(f"--dtype {dtype!r} cannot be written to {where} (choose {', '.join(known)})")
    return got
