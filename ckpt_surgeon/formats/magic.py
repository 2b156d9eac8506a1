"""What kind of checkpoint file is this?  Decided by the first bytes, never by the name alone.

* GGUF: ``b"GGUF"`` (llama.cpp ``GGUF_MAGIC``).
* safetensors: a little-endian u64 header length N, then a JSON object: byte 8 is ``{``
  (the Rust core writes no leading whitespace; we allow it, as its parser does).
* pickle: a zip archive (``PK``, ``torch.save``'s default since 1.6) or a raw pickle
  (protocol opcode ``\\x80``).

The name is only a tie-breaker for files that match no magic: a ``.gguf`` or ``.safetensors``
name sends the file to that parser, whose message then says exactly which check failed
("magic is b'GGUX', expected b'GGUF'").  Any other unrecognised file is refused with a
description of what its first bytes look like, so a damaged GGUF is not reported as a
safetensors file with an absurd header length.
"""
from __future__ import annotations

import os

from ..errors import FormatError
from .safe_input import open_regular

GGUF_MAGIC = b"GGUF"
_WS = b" \t\r\n"


def _looks_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8 and head[8:].lstrip(_WS)[:1] == b"{"


def kind_of_bytes(head: bytes, size: int) -> str | None:
    """``"gguf"`` | ``"safetensors"`` | ``"pickle"`` from the first (up to 64) bytes, or None."""
    if head[:4] == GGUF_MAGIC:
        return "gguf"
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "pickle"
    if _looks_safetensors(head, size):
        return "safetensors"
    return None


def describe(head: bytes, size: int) -> str:
    """What an unrecognised file looks like, for the error message."""
    if size == 0:
        return "the file is empty"
    shown = repr(head[:16]) + (" ..." if size > 16 else "")
    if len(head) >= 8 and int.from_bytes(head[4:8], "little") in (2, 3) and head[:4] != GGUF_MAGIC:
        return (f"it starts like a GGUF file with a damaged magic (bytes 4-7 read as GGUF version "
                f"{int.from_bytes(head[4:8], 'little')}, but the magic is {head[:4]!r}, not {GGUF_MAGIC!r}); "
                f"first bytes {shown}")
    if head[:1] in (b"{", b"[") or head.lstrip(_WS)[:1] in (b"{", b"["):
        return f"it looks like a JSON text, not a weights file; first bytes {shown}"
    if len(head) >= 8:
        n = int.from_bytes(head[:8], "little")
        if n > size - 8:
            return (f"read as safetensors, its 8-byte header length would be {n:,}, more than the file's {size:,} "
                    f"bytes; first bytes {shown}")
    return f"first bytes {shown}"


def decide_kind(head: bytes, size: int, name: str) -> str:
    """The kind of a file of ``size`` bytes named ``name`` that starts with ``head`` (its first 64
    bytes, or all of a shorter file): by magic, then by name; FormatError when neither fits."""
    kind = kind_of_bytes(head, size)
    if kind is not None:
        return kind
    low = name.lower()
    if low.endswith(".gguf"):
        return "gguf"
    if low.endswith(".safetensors"):
        return "safetensors"
    raise FormatError(f"is not a safetensors, GGUF or pickle file: {describe(head, size)}", path=name)


def file_kind(path: str | os.PathLike) -> str:
    """The kind of the local file at ``path`` (see the module doc); FormatError when none fits."""
    path = os.fspath(path)
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 64, 0)
    finally:
        os.close(fd)
    return decide_kind(head, size, path)
