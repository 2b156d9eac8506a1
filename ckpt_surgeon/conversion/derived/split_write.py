"""Split output on the derived path (``--split-max-size`` / ``--split-max-tensors``), child side.

llama.cpp's class plans the file (:mod:`.child`: key-values, tensor infos in its order, types);
this module hands that plan to the native path's splitter, :func:`~..split_output.write_gguf_outputs`,
so the parts, their boundaries, names and ``split.*`` keys follow the same rules as on the native
path (gguf-py's ``GGUFWriter`` rules, checked against ``convert_hf_to_gguf.py --split-max-size``),
a killed run resumes at its first unfinished part (:mod:`..split_resume`), and an error leaves
nothing.  Each tensor is encoded once (``encode``), written at its offset, read back and compared
(CRC-32), then every part is re-parsed and checked against the plan before any is renamed into place.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["PlannedTensor", "write_split_set"]

_READBACK = 1 << 20


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the class's plan, as the splitter reads it (numpy-order ``shape``, our type name)."""

    dst: str
    shape: tuple
    ggml_type: str
    nbytes: int

    def to_dict(self) -> dict:
        return {"dst": self.dst, "shape": list(self.shape), "ggml_type": self.ggml_type, "nbytes": self.nbytes}


def _crc_at(fd: int, start: int, n: int) -> int:
    buf = memoryview(bytearray(min(n, _READBACK) or 1))
    crc, pos, end = 0, start, start + n
    while pos < end:
        got = os.preadv(fd, [buf[:min(end - pos, _READBACK)]], pos)
        if not got:
            break
        crc = zlib.crc32(buf[:got], crc)
        pos += got
    return crc if pos == end else -1


def _writer(encode: Callable, label: str):
    """``write_data`` for the splitter: each tensor encoded, written, read back (CRC-32)."""
    from ...errors import FormatError
    from ...formats.write.shard_io import pwrite_all
    from ..gguf_stream import Chunk

    def write_data(fd, part, offsets, wbar):
        chunks = []
        for rec, off in zip(part, offsets):
            crc, pos = 0, off
            try:
                for piece in encode(rec.dst):         # checked pieces (child.counted), written as encoded
                    crc = zlib.crc32(piece, crc)
                    pwrite_all(fd, piece, pos)
                    pos += piece.nbytes
            except ValueError as e:
                raise FormatError(str(e), path=label, tensor=rec.dst) from None
            if _crc_at(fd, off, rec.nbytes) != crc:
                raise FormatError("bytes read back differ from the bytes written", path=label, tensor=rec.dst)
            chunks.append(Chunk(rec.dst, off, off + rec.nbytes, crc))
            if wbar is not None:
                wbar.update(rec.nbytes)
        return chunks
    return write_data


def write_split_set(out: Path, kv_bytes: bytes, kv_count: int, plan: Sequence[PlannedTensor], encode: Callable,
                    *, max_size: int, max_tensors: int, alignment: int, architecture: str, small_first: bool = False,
                    inputs: Sequence[str], warnings: list) -> list[Path]:
    """Write ``plan`` as llama.cpp's split set of ``out`` (or ``out`` itself when one part holds
    it); ``encode(name)`` gives a tensor's file bytes as byte views in order.  Returns the files written, in order."""
    from ..gguf_stream import verify_written
    from ..split_output import SplitRequest, write_gguf_outputs

    def verify(tmp, final, part, chunks, first):
        verify_written(tmp, final, part, chunks, architecture=architecture if first else None)

    return write_gguf_outputs(out, kv_bytes, kv_count, list(plan), _writer(encode, str(out)), verify=verify,
                              req=SplitRequest(max_size, max_tensors, small_first), progress=False, alignment=alignment,
                              warnings=warnings, inputs=inputs)
