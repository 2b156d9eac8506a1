"""Writing GGUF: key-value encoding, tensor infos, the header block and the data layout.

The one GGUF writing path, shared by the GGUF -> GGUF checkpoint writer (fold-bias & co.) and by
HF -> GGUF conversion.  Layout of the file (llama.cpp ``ggml/src/gguf.cpp``, ``gguf_write_to_buf``;
gguf-py ``GGUFWriter`` writes the same bytes)::

    "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x     (string key, u32 value type, value)
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml type, u64 offset)
    zero padding up to a multiple of the alignment
    tensor data, each tensor at its offset (a multiple of the alignment), zero padding between

A string is a u64 byte length and the UTF-8 bytes; an array is the u32 item type, a u64 count
and the items.  Everything is little-endian.  Every tensor's offset follows from the sizes of the
tensors before it, so the whole header is known before any data is written: :func:`layout`
builds it, the caller writes each tensor's bytes at its offset, one tensor at a time (bounded
memory), and :func:`write_padding` fills the gaps with explicit zeros.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Sequence

import numpy as np

from ..gguf import DEFAULT_ALIGNMENT, GGUF_MAGIC, VALUE_TYPES, ggml_layout_message, ggml_layout_problem
from .shard_io import pwrite_all

__all__ = ["GGUF_VERSION", "KV", "Slot", "GGUFLayout", "encode_string", "encode_kv", "encode_kvs", "layout",
           "write_padding", "VT"]

GGUF_VERSION = 3                 # what llama.cpp and gguf-py write today


class VT(IntEnum):
    """GGUF value type ids (gguf.h ``enum gguf_type``; the reader's :data:`~.gguf.VALUE_TYPES`)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_NUMPY = {tid: np.dtype(dt) for tid, (_, dt, _) in VALUE_TYPES.items() if dt is not None}


@dataclass(frozen=True)
class KV:
    """One key-value pair to write: ``vtype`` a :class:`VT` id; arrays give ``item_type``."""

    key: str
    vtype: int
    value: Any
    item_type: int | None = None


@dataclass(frozen=True)
class Slot:
    """One tensor's entry in the tensor-info section: numpy-order ``shape``, ggml type id, size."""

    name: str
    shape: tuple
    type_id: int
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    head: bytes                  # header, key-values and tensor infos, zero-padded to data_start
    data_start: int
    offsets: tuple               # absolute file offset of each tensor's data
    end: int                     # file size
    alignment: int

    def gaps(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        """Byte ranges between (and, when ``end`` is past the last tensor, after) the tensors."""
        out, prev = [], self.data_start
        for off, n in zip(self.offsets, sizes):
            if off > prev:
                out.append((prev, off))
            prev = off + n
        if self.end > prev:
            out.append((prev, self.end))
        return out


def encode_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return len(b).to_bytes(8, "little") + b


def _scalar(vtype: int, value) -> bytes:
    if vtype == VT.STRING:
        return encode_string(value)
    if vtype == VT.BOOL:
        # gguf-py packs a bool with struct's "?", which stores any value's truth: llama.cpp's converter writes
        # ERNIE 4.5's add_space_prefix, None in its tokenizer, as false
        return bytes([bool(value)])
    dt = _NUMPY.get(vtype)
    if dt is None:
        raise ValueError(f"GGUF value type {vtype} is not a scalar type")
    return np.asarray(value, dtype=dt).tobytes()


def _value(vtype: int, value, item_type: int | None) -> bytes:
    if vtype != VT.ARRAY:
        return _scalar(vtype, value)
    if item_type is None:
        raise ValueError("a GGUF array needs its item type")
    head = item_type.to_bytes(4, "little") + len(value).to_bytes(8, "little")
    if item_type == VT.STRING:
        return head + b"".join(encode_string(v) for v in value)
    if item_type == VT.ARRAY:
        raise ValueError("nested GGUF arrays are not written")
    if item_type == VT.BOOL:
        return head + bytes(bool(v) for v in value)
    return head + np.asarray(value, dtype=_NUMPY[item_type]).tobytes()


def encode_kv(kv: KV) -> bytes:
    """One key-value pair as stored (key, u32 type, value); a value its type cannot hold (None for an integer)
    is a ``ValueError`` naming the key."""
    try:
        value = _value(kv.vtype, kv.value, kv.item_type)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"GGUF key {kv.key!r}: value {kv.value!r} cannot be stored as GGUF type {kv.vtype} "
                         f"({type(e).__name__}: {e})") from e
    return encode_string(kv.key) + kv.vtype.to_bytes(4, "little") + value


def encode_kvs(kvs: Sequence[KV]) -> bytes:
    keys = [kv.key for kv in kvs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"GGUF key {dup!r} given twice")
    return b"".join(encode_kv(kv) for kv in kvs)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def layout(kv_bytes: bytes, kv_count: int, slots: Sequence[Slot], *, alignment: int = DEFAULT_ALIGNMENT,
           version: int = GGUF_VERSION, pad_end: bool = True) -> GGUFLayout:
    """The header block and every tensor's offset.  ``pad_end``: the file ends on an alignment
    boundary after the last tensor (as gguf-py writes it); else right after the last tensor."""
    infos = bytearray()
    offsets, pos = [], 0
    for s in slots:
        pos = _align(pos, alignment)
        offsets.append(pos)
        infos += encode_string(s.name) + len(s.shape).to_bytes(4, "little")
        for d in reversed(s.shape):            # ggml ne: innermost first
            infos += int(d).to_bytes(8, "little")
        infos += int(s.type_id).to_bytes(4, "little") + pos.to_bytes(8, "little")
        pos += s.nbytes
    if pad_end:
        pos = _align(pos, alignment)
    head = (GGUF_MAGIC + version.to_bytes(4, "little") + len(slots).to_bytes(8, "little")
            + kv_count.to_bytes(8, "little") + kv_bytes + bytes(infos))
    data_start = _align(len(head), alignment)
    head += b"\0" * (data_start - len(head))
    # Never write a file ggml's loader refuses (issue 24): the offsets above follow its rule by
    # construction; this states the rule where the offsets are made, in ggml's own terms.
    problem = ggml_layout_problem([(s.name, o, s.nbytes) for s, o in zip(slots, offsets)], alignment)
    if problem is not None:
        raise AssertionError(ggml_layout_message(problem, alignment))
    return GGUFLayout(head, data_start, tuple(data_start + o for o in offsets), data_start + pos, alignment)


def write_padding(fd: int, lay: GGUFLayout, sizes: Sequence[int]) -> None:
    """Alignment padding between tensors (and after the last): explicit zeros, no reliance on
    file holes (a file copied without its holes must keep the same bytes)."""
    for a, b in lay.gaps(sizes):
        pwrite_all(fd, b"\0" * (b - a), a)
