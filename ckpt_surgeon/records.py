"""Frozen records that cross module lines.

``TensorInfo`` describes one tensor of any source format.  Shapes are always in
numpy / PyTorch order (outermost first); the GGUF reader reverses ggml's ``ne``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def finite_or_none(x) -> float | None:
    """A record's float as JSON allows it: NaN and +-Inf (a NaN-producing model, an empty max)
    become None (``null``), so the JSON a report writes stays valid."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str               # safetensors spelling ("F32", "BF16" ...) or GGUF type name ("Q4_K", "F16" ...)
    shape: tuple[int, ...]   # numpy order
    file: str                # path of the file that holds it (or the remote file name for hub sources)
    start: int               # absolute byte offset of the data in that file
    end: int                 # absolute end offset (exclusive)
    missing: bool = False    # data lies (partly) past EOF of a truncated file
    quantized: bool = False  # GGUF block-quantized type

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ReadStats:
    """What a source has read so far (bytes of tensor data and header bytes, requests for remote)."""

    bytes_read: int = 0
    requests: int = 0
    extra: dict = field(default_factory=dict)
