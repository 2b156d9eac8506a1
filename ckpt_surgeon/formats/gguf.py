"""GGUF: validated, fast header parsing and lazy tensor reads (numpy only; no torch, no gguf-py).

Layout (llama.cpp ``ggml/include/gguf.h``, ``ggml/src/gguf.cpp``; all little endian)::

    "GGUF" | u32 version (2, 3) | u64 n_tensors | u64 n_kv
    n_kv x      (string key | u32 value type | value)
    n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset)
    padding to ``general.alignment`` (default 32) | tensor data (offsets relative to here)

    string = u64 length | bytes (UTF-8, no terminator)
    array  = u32 item type | u64 count | items (items may themselves be arrays)

Why our own parser: gguf-py's ``GGUFReader`` builds one numpy view per array *element*
(~5 s for a 49k-token vocabulary, ~44 s for a 262k one).  Here numeric arrays are one
``np.frombuffer`` each and a string array is one tight pass over its length prefixes
that records offsets; the strings are decoded only when accessed (:class:`StringArray`).

Validation happens before any tensor byte is trusted (same spirit as
``formats/safetensors.py``): magic, version, every count bounded by the bytes that remain
(a count of 2**60 is rejected before anything is allocated), string and array lengths
inside the file, known value types, ``general.alignment`` a uint32 power of two, at most
4 dims, a row length that is whole blocks, byte sizes below 2**63, offsets aligned and
non-overlapping, unique names.  Unknown ggml type ids are *not* fatal: the tensor is
listed with dtype ``UNKNOWN_<id>`` and a warning, and only reading it fails.

Truncated files (a download cut short): if the header itself is cut, a
:class:`~ckpt_surgeon.errors.TruncatedError` says where.  If only tensor data is missing,
the file opens: every tensor whose bytes end past EOF has ``missing=True``,
``missing_bytes`` says how many bytes the header promises beyond EOF, and reading such a
tensor raises ``TruncatedError`` naming it — never a numpy reshape error.

Split GGUFs (llama.cpp ``gguf-split``: ``name-00001-of-00003.gguf`` ...): every part is a
complete GGUF file with its own tensor subset (offsets relative to its own data section);
part 1 carries the model's metadata, and every part carries ``split.no`` (u16, 0-based),
``split.count`` (u16) and ``split.tensors.count`` (i32, tensors over all parts).
:func:`open_gguf` opened on any part reads every part's header and returns a
:class:`SplitGGUF` whose ``tensors`` are the union (each ``TensorInfo.file`` its part) and
whose metadata is part 1's; see :func:`split_part_names` and :func:`merge_split_headers`.
"""
from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, SourceNotFoundError, TruncatedError, UnsupportedError
from ..records import TensorInfo
from .quant import dequant as dq
from .quant import ggml_types as GT
from .safe_input import open_regular
from .source import ByteSource, FileSource, LocalBytes, ShardSet

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 16        # arrays of arrays deeper than this are refused (stack safety)
_FIXED = 24                   # magic + version + two u64 counts

# GGUF value types (gguf.h ``enum gguf_type``): id -> (name, numpy dtype or None, minimum bytes)
VALUE_TYPES = {
    0: ("UINT8", "<u1", 1), 1: ("INT8", "<i1", 1), 2: ("UINT16", "<u2", 2), 3: ("INT16", "<i2", 2),
    4: ("UINT32", "<u4", 4), 5: ("INT32", "<i4", 4), 6: ("FLOAT32", "<f4", 4), 7: ("BOOL", "<u1", 1),
    8: ("STRING", None, 8), 9: ("ARRAY", None, 12), 10: ("UINT64", "<u8", 8), 11: ("INT64", "<i8", 8),
    12: ("FLOAT64", "<f8", 8),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7
_STRUCT_CODES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_STRUCT = {k: struct.Struct(c) for k, c in _STRUCT_CODES.items()}
# Minimum bytes of one KV pair (empty key, 1-byte value) and of one tensor info
# (empty name, 0 dims, type, offset): used to bound the header counts by the file size.
_MIN_KV = 8 + 4 + 1
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8

# llama.cpp ``enum llama_ftype`` (include/llama.h): general.file_type -> name.
FILE_TYPES = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
    9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
    29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 1024: "GUESSED",
}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class NeedMoreBytes(Exception):
    """Raised by :func:`parse_header` when the buffer holds only a prefix of a larger file
    and the header continues past it: fetch at least ``needed`` bytes and parse again
    (used by remote readers that get the header by HTTP range requests)."""

    def __init__(self, needed: int):
        self.needed = needed
        super().__init__(f"need at least {needed} bytes of the file")


class StringArray(Sequence):
    """A GGUF string array, decoded lazily.  Behaves like a read-only ``list[str]``.

    Holds one ``bytes`` copy of the array's region and the start/length of every string;
    ``arr[i]`` decodes one string (UTF-8; invalid bytes are kept losslessly as surrogate
    escapes, see :meth:`raw`).  Equality with any sequence compares element-wise.
    """

    __slots__ = ("_data", "_starts", "_lens")

    def __init__(self, data: bytes, starts: np.ndarray, lens: np.ndarray):
        self._data, self._starts, self._lens = data, starts, lens

    def __len__(self) -> int:
        return len(self._starts)

    def _one(self, i: int) -> str:
        s = int(self._starts[i])
        return self._data[s:s + int(self._lens[i])].decode("utf-8", "surrogateescape")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._one(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("StringArray index out of range")
        return self._one(i % n)

    def __iter__(self):
        data = self._data
        for s, ln in zip(self._starts.tolist(), self._lens.tolist()):
            yield data[s:s + ln].decode("utf-8", "surrogateescape")

    def raw(self, i: int) -> bytes:
        """The undecoded bytes of string ``i``."""
        s = int(self._starts[i])
        return self._data[s:s + int(self._lens[i])]

    def tolist(self) -> list[str]:
        data = self._data
        return [data[s:s + ln].decode("utf-8", "surrogateescape")
                for s, ln in zip(self._starts.tolist(), self._lens.tolist())]

    def __eq__(self, other) -> bool:
        if isinstance(other, StringArray):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], len={len(self)})"


@dataclass(frozen=True)
class GGUFField:
    """Where a metadata value came from: its GGUF type (and item type/count for arrays)."""

    key: str
    type: str                      # VALUE_TYPES name, e.g. "UINT32", "ARRAY"
    item_type: str | None = None   # arrays: type of the items
    count: int | None = None       # arrays: number of items
    offset: int = 0                # absolute offset of the key-value pair


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    file_size: int
    alignment: int
    tensor_count: int
    kv_count: int
    metadata: dict                 # key -> value (scalars, lists, StringArray, nested lists)
    fields: dict                   # key -> GGUFField
    tensors: dict                  # name -> TensorInfo (file order)
    ggml_type_ids: dict            # name -> ggml type id (as stored)
    header_end: int                # end of the tensor-info section
    data_start: int                # start of tensor data (header_end rounded up to alignment)
    missing_bytes: int = 0         # bytes the header promises beyond EOF
    warnings: tuple = ()
    ggml_layout: tuple | None = None   # (tensor, offset, expected): where ggml's loader refuses the layout

    @property
    def architecture(self) -> str | None:
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None

    @property
    def missing_tensors(self) -> tuple[str, ...]:
        return tuple(n for n, t in self.tensors.items() if t.missing)


class _Parser:
    """Cursor over the header bytes with EOF checks that name what was being read."""

    def __init__(self, buf, path: str, file_size: int):
        self.buf = buf
        self.avail = len(buf)
        self.path = path
        self.size = file_size
        self.pos = 0
        self.where = "the file header"

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end <= self.avail:
            return
        if end > self.size:
            raise TruncatedError(
                f"file is truncated or corrupt: reading the {what} at byte {self.pos:,} needs {n:,} bytes, but the file "
                f"ends at byte {self.size:,} (inside {self.where})", path=self.path, missing_bytes=end - self.size)
        raise NeedMoreBytes(end)   # only a prefix of the file is in the buffer

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of the {what}")
        self.need(n, f"{what} ({n:,}-byte string)")
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def text(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{what} is not valid UTF-8 ({raw[:40]!r})", path=self.path) from None

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALAR_STRUCT:
            st = _SCALAR_STRUCT[vtype]
            self.need(st.size, what)
            v = st.unpack_from(self.buf, self.pos)[0]
            self.pos += st.size
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.raw_string(what).decode("utf-8", "surrogateescape")
        if vtype == _ARRAY:
            return self.array(what, depth)[0]
        raise FormatError(f"{what} has unknown value type {vtype} (known: 0-12)", path=self.path)

    def array(self, what: str, depth: int):
        if depth >= MAX_ARRAY_NESTING:
            raise FormatError(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep", path=self.path)
        itype = self.u32(f"item type of the {what}")
        if itype not in VALUE_TYPES:
            raise FormatError(f"{what} is an array of unknown value type {itype} (known: 0-12)", path=self.path)
        count = self.u64(f"item count of the {what}")
        name, dtype, min_size = VALUE_TYPES[itype]
        remaining = self.size - self.pos
        if count * min_size > remaining:
            # Checked before anything is allocated: a corrupt count of 2**60 stops here.
            raise TruncatedError(
                f"{what}: array of {count:,} {name} items needs at least {count * min_size:,} bytes, but only "
                f"{remaining:,} remain before the end of the file at byte {self.size:,} (truncated file or corrupt count)",
                path=self.path, missing_bytes=count * min_size - remaining)
        if dtype is not None:
            nbytes = count * min_size
            self.need(nbytes, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += nbytes
            out = arr.astype(bool).tolist() if itype == _BOOL else arr.tolist()
            return out, itype, count
        if itype == _STRING:
            return self.string_array(count, what), itype, count
        return [self.array(f"{what}[{i}]", depth + 1)[0] for i in range(count)], itype, count

    def string_array(self, count: int, what: str) -> StringArray:
        """One pass over ``count`` length-prefixed strings; decoding is deferred."""
        buf, start, limit = self.buf, self.pos, self.avail
        unpack = _U64.unpack_from
        lens = [0] * count
        pos = start
        try:
            # Hot loop (262k iterations for a Gemma-3 vocabulary): no checks inside; a length
            # that runs past the buffer makes a later unpack fail or ends the loop past the limit.
            for i in range(count):
                n = unpack(buf, pos)[0]
                lens[i] = n
                pos += 8 + n
        except (struct.error, OverflowError):   # OverflowError: a length near 2**63 moved pos past ssize_t
            pos = limit + 1
        if pos > limit:
            # Error path only: walk again with every read checked, to name the exact item.
            self.pos = start
            for i in range(count):
                self.raw_string(f"{what}[{i}]")
            raise AssertionError("unreachable: string overrun not detected")  # pragma: no cover
        lens_a = np.array(lens, dtype=np.int64)
        starts = np.cumsum(lens_a + 8) - lens_a          # relative to start: after each length prefix
        data = bytes(buf[start:pos])
        self.pos = pos
        return StringArray(data, starts, lens_a)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _parse_preamble(p: _Parser, buf, path: str, file_size: int) -> tuple[int, int, int]:
    """Magic, version and the two counts -> ``(version, n_tensors, n_kv)``."""
    if file_size < 4 or p.avail < 4:
        if p.avail < min(4, file_size):
            raise NeedMoreBytes(4)
        raise FormatError(f"not a GGUF file: only {file_size} bytes, too short for the 4-byte magic", path=path)
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise FormatError(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}", path=path)
    p.pos = 4
    version = p.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            raise FormatError(f"big-endian GGUF (version {version >> 24}) is not supported", path=path)
        raise FormatError(f"unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})",
                          path=path)
    n_tensors = p.u64("tensor count")
    n_kv = p.u64("key-value count")
    need = n_tensors * _MIN_TENSOR_INFO + n_kv * _MIN_KV
    if need > file_size - _FIXED:
        raise FormatError(
            f"header declares {n_tensors:,} tensors and {n_kv:,} key-value pairs, which need at least "
            f"{_FIXED + need:,} bytes, but the file has {file_size:,} (corrupt count or truncated file)", path=path)
    return version, n_tensors, n_kv


def _parse_metadata(p: _Parser, path: str, n_kv: int) -> tuple[dict, dict]:
    """The ``n_kv`` key-value pairs -> ``(metadata, fields)``."""
    metadata, fields = {}, {}
    for i in range(n_kv):
        p.where = f"the metadata, key-value pair {i + 1} of {n_kv}"
        start = p.pos
        key = p.text(f"key {i + 1} of {n_kv}")
        p.where = f"the metadata, key-value pair {i + 1} of {n_kv} ('{key}')"
        if key in metadata:
            raise FormatError(f"metadata key '{key}' appears twice (pairs at bytes {fields[key].offset} and {start})", path=path)
        vtype = p.u32(f"type of '{key}'")
        if vtype not in VALUE_TYPES:
            raise FormatError(f"metadata key '{key}' has unknown value type {vtype} (known: 0-12)", path=path)
        if vtype == _ARRAY:
            val, itype, count = p.array(f"value of '{key}'", 0)
            fields[key] = GGUFField(key, "ARRAY", VALUE_TYPES[itype][0], count, start)
        else:
            val = p.value(vtype, f"value of '{key}'")
            fields[key] = GGUFField(key, VALUE_TYPES[vtype][0], offset=start)
        metadata[key] = val
    return metadata, fields


def _checked_alignment(metadata: dict, fields: dict, path: str) -> int:
    """``general.alignment`` (a power-of-two UINT32) or the default."""
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        f = fields["general.alignment"]
        alignment = metadata["general.alignment"]
        if f.type != "UINT32":
            raise FormatError(f"general.alignment must be a UINT32, not {f.type}", path=path)
        if alignment == 0 or alignment & (alignment - 1):
            raise FormatError(f"general.alignment {alignment} is not a power of two", path=path)
    return alignment


def _parse_tensor_table(p: _Parser, buf, path: str, n_tensors: int) -> list:
    """The tensor-info table -> ``[(name, ne, type_id, offset), ...]`` in file order."""
    infos = []
    names: dict[str, int] = {}
    for i in range(n_tensors):
        p.where = f"the tensor table, tensor {i + 1} of {n_tensors}"
        name = p.text(f"name of tensor {i + 1} of {n_tensors}")
        p.where = f"the tensor table, tensor {i + 1} of {n_tensors} ('{name}')"
        if name in names:
            raise FormatError(f"tensor table lists this tensor twice (entries {names[name] + 1} and {i + 1})",
                              path=path, tensor=name)
        names[name] = i
        n_dims = p.u32(f"dimension count of '{name}'")
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise FormatError(f"has {n_dims} dimensions (1 to {MAX_DIMS} allowed)", path=path, tensor=name)
        p.need(8 * n_dims, f"dimensions of '{name}'")
        ne = struct.unpack_from(f"<{n_dims}Q", buf, p.pos)
        p.pos += 8 * n_dims
        type_id = p.u32(f"type of '{name}'")
        offset = p.u64(f"data offset of '{name}'")
        infos.append((name, ne, type_id, offset))
    return infos


def _tensor_records(infos: list, path: str, file_size: int, data_start: int,
                    alignment: int) -> tuple[dict, dict, list, list]:
    """Validate each table entry -> ``(tensors, type_ids, warnings, spans)``; spans are the known-size byte ranges."""
    tensors, type_ids, warnings, spans = {}, {}, [], []
    for name, ne, type_id, offset in infos:
        numel = 1
        for d in ne:
            numel *= d
        if max(ne) >= 1 << 63 or numel >= 1 << 63:
            raise FormatError(f"dimensions {list(ne)} hold {numel:,} elements, beyond the 2**63 limit", path=path, tensor=name)
        if numel == 0:
            # ggml has no empty tensors: llama.cpp's loader divides by each ne[i] when it checks
            # the element count (gguf.cpp), and no model weight has a zero-length axis.
            raise FormatError(f"has a zero dimension ({list(ne)}, innermost first): an empty tensor is not a model "
                              "weight", path=path, tensor=name)
        if offset % alignment:
            raise FormatError(f"data offset {offset} is not a multiple of the alignment {alignment}", path=path, tensor=name)
        t = GT.GGML_TYPES.get(type_id)
        start = data_start + offset
        ik = GT.ik_llama_type(type_id) if t is None else None
        if ik is not None:
            raise UnsupportedError(f"is stored as {ik} (ggml type id {type_id}), a type only ik_llama.cpp defines: "
                                   "this file is for ik_llama.cpp, not llama.cpp / ggml", path=path, tensor=name)
        if t is None:
            dtype, end, quant = f"UNKNOWN_{type_id}", start, False
            warnings.append(f"tensor '{name}' has unknown ggml type id {type_id}: it is listed, but its size and "
                            "values are unknown")
        else:
            if ne[0] % t.block_size:
                raise FormatError(f"row length {ne[0]} is not a multiple of the {t.name} block size {t.block_size}",
                                  path=path, tensor=name)
            nbytes = t.nbytes(numel)
            if nbytes >= 1 << 63:
                raise FormatError(f"{list(ne)} x {t.name} is {nbytes:,} bytes, beyond the 2**63 limit", path=path, tensor=name)
            dtype, end, quant = t.name, start + nbytes, t.quantized
            spans.append((start, end, name))
        tensors[name] = TensorInfo(name=name, dtype=dtype, shape=tuple(int(d) for d in reversed(ne)), file=path,
                                   start=start, end=end, missing=end > file_size, quantized=quant)
        type_ids[name] = type_id
    return tensors, type_ids, warnings, spans


def _missing_bytes(spans: list, tensors: dict, warnings: list, path: str, file_size: int,
                   header_end: int, data_start: int) -> int:
    """Refuse overlapping data ranges; count the bytes missing past the end (a warning names them)."""
    spans.sort()
    prev_end, prev_name = 0, None
    for start, end, name in spans:
        if prev_name is not None and start < prev_end and end > start:
            raise FormatError(f"data bytes [{start - data_start}, {end - data_start}) overlap tensor '{prev_name}' "
                              f"(which ends at {prev_end - data_start})", path=path, tensor=name)
        if end > prev_end:
            prev_end, prev_name = end, name
    # A file without tensors (llama.cpp's vocab-only GGUFs) may end right after its header,
    # without the padding up to the (empty) data section: nothing is missing.
    promised = max([data_start if spans else header_end] + [e for _, e, _ in spans])
    missing_bytes = max(0, promised - file_size)
    if missing_bytes:
        cut = [n for n, t in sorted(tensors.items(), key=lambda kv: kv[1].start) if t.missing]
        warnings.append(f"file is truncated: {missing_bytes:,} bytes of tensor data are missing; {len(cut)} of "
                        f"{len(tensors)} tensor(s) lie past the end of the file (first '{cut[0]}')")
    return missing_bytes


def ggml_layout_problem(entries, alignment: int) -> tuple[str, int, int] | None:
    """Where a tensor-data layout breaks ggml's rule -> ``(tensor, offset, expected)``, else None.

    ggml's loader (``gguf_init_from_file_impl`` in ggml/src/gguf.cpp) requires the data of the
    tensors in tensor-info order, each padded to the alignment: tensor i must start where tensor
    i-1's padded bytes end, else it fails with "tensor '...' has offset X, expected Y" and
    llama.cpp cannot load the file.  ``entries``: ``(name, offset relative to the data section,
    nbytes or None)`` in tensor-info order; a size that is unknown (unknown ggml type) ends the
    check there (ggml refuses that type anyway)."""
    expected = 0
    for name, offset, nbytes in entries:
        if offset != expected:
            return name, int(offset), expected
        if nbytes is None:
            return None
        expected += _align(nbytes, alignment)
    return None


def ggml_layout_message(problem: tuple[str, int, int], alignment: int) -> str:
    name, offset, expected = problem
    return (f"tensor '{name}' has data offset {offset}, but ggml's loader expects {expected} (tensor data must follow "
            f"the tensor-info order, each tensor padded to {alignment} bytes): llama.cpp refuses to load this file")


def parse_header(buf, path: str, file_size: int) -> GGUFHeader:
    """Parse and validate a GGUF header from ``buf`` (the file, or a prefix of it).

    ``file_size`` is the size of the whole file.  If ``buf`` is a prefix and the header
    runs past it, :class:`NeedMoreBytes` is raised (remote readers fetch more and retry).
    """
    path = os.fspath(path)
    p = _Parser(buf, path, file_size)
    version, n_tensors, n_kv = _parse_preamble(p, buf, path, file_size)
    metadata, fields = _parse_metadata(p, path, n_kv)
    alignment = _checked_alignment(metadata, fields, path)
    infos = _parse_tensor_table(p, buf, path, n_tensors)
    header_end = p.pos
    data_start = _align(header_end, alignment)
    tensors, type_ids, warnings, spans = _tensor_records(infos, path, file_size, data_start, alignment)
    missing_bytes = _missing_bytes(spans, tensors, warnings, path, file_size, header_end, data_start)
    problem = ggml_layout_problem(
        [(name, offset, None if tensors[name].dtype.startswith("UNKNOWN_") else tensors[name].nbytes)
         for name, _, _, offset in infos], alignment)
    if problem is not None:
        warnings.append(ggml_layout_message(problem, alignment))
    return GGUFHeader(path=path, version=version, file_size=file_size, alignment=alignment, tensor_count=n_tensors,
                      kv_count=n_kv, metadata=metadata, fields=fields, tensors=tensors, ggml_type_ids=type_ids,
                      header_end=header_end, data_start=data_start, missing_bytes=missing_bytes,
                      warnings=tuple(warnings), ggml_layout=problem)


# First read when opening a local file; the header of a 262k-token vocabulary is ~5 MB.
_FIRST_READ = 16 << 20


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse the header of a local file, reading only the header's bytes (in growing reads)."""
    path = os.fspath(path)
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = f.read(min(size, _FIRST_READ))
        while True:
            try:
                return parse_header(buf, path, size)
            except NeedMoreBytes as e:
                want = min(size, max(e.needed, 2 * len(buf)))
                more = f.read(want - len(buf))
                if not more:   # the file shrank while we read it
                    raise FormatError(f"file ended at byte {len(buf):,} while its header was being read "
                                      f"(it was {size:,} bytes when opened)", path=path) from None
                buf += more


class _GGUFReading:
    """What both GGUF readers (one file, a split set) show beyond the reader protocol, through
    ``header`` (part 1's for a split set, where gguf-split writes the model's metadata)."""

    header: GGUFHeader

    @property
    def architecture(self) -> str | None:
        return self.header.architecture

    @property
    def paths(self) -> tuple[str, ...]:
        """The files this reader reads (one; a :class:`SplitGGUF` has one per part)."""
        return self.files

    def read_torch(self, info: TensorInfo, dtype: str = "float32"):
        """The tensor as a ``torch.Tensor`` (float32 or bfloat16); imports torch."""
        return _to_torch(self.read(info), dtype)


class GGUFFile(_GGUFReading, FileSource):
    """A validated GGUF file with lazy tensor reads.

    ``read(info)`` returns float32 (dequantized; integer and F64 tensors in their own
    dtype) in numpy shape order; ``read_bytes(info)`` the stored bytes.  ``bytes_read``
    counts header and tensor bytes.

    ``GGUFFile(path)`` reads a local file (``os.preadv``).  Other byte sources (the Hub's HTTP
    ranges) pass an already parsed ``header`` and their ``data``
    (:class:`~ckpt_surgeon.formats.source.ByteSource`); the checks, truncation messages and
    dequantization stay here.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, header: GGUFHeader | None = None,
                 data: ByteSource | None = None):
        if (path is None) == (header is None) or (header is None) != (data is None):
            raise TypeError("GGUFFile needs a path, or a parsed header and its byte source")
        if header is None:
            header = read_header(path)
            data = LocalBytes(header.path, header.header_end)   # the header bytes parsed
        super().__init__(header, data)

    @property
    def missing_bytes(self) -> int:
        return self.header.missing_bytes

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.header.warnings

    def check(self, info: TensorInfo) -> None:
        self._ggml_type(info)

    def _ggml_type(self, info: TensorInfo) -> GT.GGMLType:
        t = GT.TYPES_BY_NAME.get(info.dtype)
        if t is None:
            tid = self.header.ggml_type_ids.get(info.name)
            raise FormatError(f"has unknown ggml type id {tid}; its data cannot be read", path=self.path, tensor=info.name)
        if info.missing:
            have = max(0, self.header.file_size - info.start)
            raise TruncatedError(
                f"data lies past the end of the truncated file: bytes {info.start:,}..{info.end:,} are needed but the "
                f"file ends at byte {self.header.file_size:,} ({info.end - info.start - have:,} of "
                f"{info.end - info.start:,} bytes missing)",
                path=self.path, tensor=info.name, missing_bytes=info.end - info.start - have, tensors=(info.name,))
        return t

    def decode(self, raw: np.ndarray, info: TensorInfo, *, threads: int | None = None) -> np.ndarray:
        t = self._ggml_type(info)
        if t.name == "F32":
            return raw.view(np.float32).reshape(info.shape)
        if t.name in dq.NATIVE_DTYPES:
            return raw.view(dq.NATIVE_DTYPES[t.name]).reshape(info.shape)
        try:
            return dq.dequantize(raw, t, info.shape, threads=threads)
        except NotImplementedError as e:
            raise FormatError(str(e), path=self.path, tensor=info.name) from None


def _to_torch(arr: np.ndarray, dtype: str):
    import torch

    t = torch.from_numpy(arr)
    return t if dtype in ("float32", torch.float32) and t.dtype == torch.float32 else t.to(
        {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype, dtype))


# --------------------------------------------------------------------------- split GGUFs
#
# llama.cpp ``tools/gguf-split/gguf-split.cpp`` writes part i (0-based) of n as
# ``{prefix}-{i+1:05d}-of-{n:05d}.gguf`` (``llama_split_path``).  Each part is a complete GGUF
# whose tensor offsets are relative to its own data section; part 1 gets every metadata key of
# the model (``gguf_set_kv``), and every part gets the three keys below.  The loader
# (``src/llama-model-loader.cpp``) reads part 1, finds the others by name from its split.no /
# split.count (``llama_split_prefix`` + ``llama_get_list_splits``), checks each part's split.no,
# refuses a tensor name seen twice, and compares the total with part 1's split.tensors.count.

SPLIT_NO = "split.no"                        # u16: this part's index, 0-based
SPLIT_COUNT = "split.count"                  # u16: number of parts
SPLIT_TENSORS_COUNT = "split.tensors.count"  # i32: tensors over all parts
_INT_VALUE_TYPES = frozenset({"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"})
# split.no / split.count: gguf-split writes UINT16 (gguf-py ``Keys.Split``, llama.cpp reads them
# into a uint16_t); a UINT8 or UINT32 is accepted, a signed or 64-bit type is not.
_SPLIT_INDEX_TYPES = frozenset({"UINT8", "UINT16", "UINT32"})
# Part numbers in names are 5 digits ("%05d"): at most 99,999 parts.  Checked before any list of
# part names is built (a split.count of 2**32 - 1 would be a 4-billion-name list).
MAX_SPLIT_PARTS = 99_999
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_part_name(prefix: str, no: int, count: int) -> str:
    """File name of part ``no`` (0-based) of ``count``: llama.cpp ``llama_split_path``'s
    ``"%s-%05d-of-%05d.gguf"`` (the numbers in names are 1-based)."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def parse_split_name(name: str) -> tuple[str, int, int] | None:
    """``(prefix, no, count)`` (``no`` 0-based) when the file name ``name`` follows the split
    naming, else None.  Names only: whether a file is a part is decided by its split keys."""
    m = _SPLIT_NAME.match(name)
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count or split_part_name(m["prefix"], no - 1, count) != name:
        return None
    return m["prefix"], no - 1, count


def group_gguf_names(names) -> list[tuple[str, ...]]:
    """GGUF file names (basenames) grouped by model: the parts of one split set (same prefix and
    part count) form one group in part order; every other name is a group of its own.  Groups
    are sorted by their first name."""
    sets: dict[tuple[str, int], list[tuple[int, str]]] = {}
    single = []
    for n in sorted(set(names)):
        parsed = parse_split_name(n)
        if parsed is None:
            single.append((n,))
        else:
            sets.setdefault((parsed[0], parsed[2]), []).append((parsed[1], n))
    groups = single + [tuple(n for _, n in sorted(v)) for v in sets.values()]
    return sorted(groups, key=lambda g: g[0])


def describe_gguf_groups(groups, limit: int = 4) -> str:
    """``"a.gguf, b-00001-of-00002.gguf (+1 part)"``: one entry per model, for error messages."""
    shown = [g[0] if len(g) == 1 else f"{g[0]} (+{len(g) - 1} part{'s' if len(g) > 2 else ''})" for g in groups[:limit]]
    return ", ".join(shown) + (" ..." if len(groups) > limit else "")


@dataclass(frozen=True)
class SplitKeys:
    """The ``split.*`` keys of one part."""

    no: int
    count: int
    tensors_count: int | None   # llama.cpp requires it in part 1; gguf-split writes it in every part


def split_keys(header: GGUFHeader) -> SplitKeys | None:
    """The split keys of a header, or None for an ordinary file: no ``split.count``, or one <= 1
    (llama.cpp then loads the file alone; ``llama-gguf-split --merge`` writes split.count 0)."""
    md, path = header.metadata, header.path
    if SPLIT_COUNT not in md:
        return None
    vals = {}
    for key in (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT):
        if key in md:
            ftype = header.fields[key].type
            if ftype not in _INT_VALUE_TYPES:
                raise FormatError(f"metadata key '{key}' must be an integer (gguf-split writes "
                                  f"{'INT32' if key == SPLIT_TENSORS_COUNT else 'UINT16'}), not {ftype}", path=path)
            if key != SPLIT_TENSORS_COUNT and ftype not in _SPLIT_INDEX_TYPES:
                raise FormatError(f"metadata key '{key}' must be an unsigned integer of at most 32 bits (gguf-split "
                                  f"writes UINT16), not {ftype}", path=path)
            vals[key] = int(md[key])
    count = vals[SPLIT_COUNT]
    if count <= 1:
        return None
    if count > MAX_SPLIT_PARTS:
        raise FormatError(f"split.count is {count:,}, over the {MAX_SPLIT_PARTS:,} parts a split GGUF can have "
                          "(part numbers in names are 5 digits)", path=path)
    no = vals.get(SPLIT_NO)
    if no is None:
        raise FormatError(f"split.count is {count} but the split.no key is missing (every part of a split GGUF "
                          "has it)", path=path)
    if not 0 <= no < count:
        raise FormatError(f"split.no is {no}, outside 0..{count - 1} for split.count {count}", path=path)
    return SplitKeys(no, count, vals.get(SPLIT_TENSORS_COUNT))


def split_part_names(name: str, header: GGUFHeader) -> list[str] | None:
    """File names of every part (in part order) of the split GGUF whose part ``name`` (the file's
    own name, no folder) has ``header``; None when it is an ordinary GGUF.

    As llama.cpp's ``llama_split_prefix``, the name must end in ``-{no+1:05d}-of-{count:05d}.gguf``
    for the header's own split.no / split.count: the other parts are found by name.
    """
    keys = split_keys(header)
    if keys is None:
        return None
    post = f"-{keys.no + 1:05d}-of-{keys.count:05d}.gguf"
    if len(name) <= len(post) or not name.endswith(post):
        raise FormatError(f"is part {keys.no + 1} of a {keys.count}-part split GGUF (split.no {keys.no}, split.count "
                          f"{keys.count}), but its name does not end in '{post}', so the other parts cannot be found",
                          path=header.path, hint="keep the file names llama-gguf-split gave the parts")
    prefix = name[:-len(post)]
    return [split_part_name(prefix, i, keys.count) for i in range(keys.count)]


def _base(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def merge_split_headers(headers: Sequence[GGUFHeader]) -> tuple[dict, tuple[str, ...]]:
    """Validate the headers of a split set (in part order) as one model -> (tensors, warnings).

    ``tensors`` is the union over the parts in part order (each ``TensorInfo.file`` its part);
    ``warnings`` are the parts' own (a truncated part), prefixed with the part's name.  Checks,
    llama.cpp's (``llama_model_loader``) first: every part's split.no is its position, no tensor
    name in two parts, the total equals part 1's split.tensors.count; then ours: every part has
    split keys and the same split.count, and a split.tensors.count or general.architecture a
    later part carries agrees with part 1's.
    """
    first = headers[0]
    n = len(headers)
    name0 = _base(first.path)
    tensors: dict[str, TensorInfo] = {}
    warnings: list[str] = []
    total = None
    for i, h in enumerate(headers):
        k = split_keys(h)
        if k is None:
            raise FormatError(f"has no split keys (split.count > 1): it is not part {i + 1} of the {n}-part split GGUF "
                              f"{name0} belongs to", path=h.path)
        if k.count != n:
            raise FormatError(f"split.count is {k.count}, but the part names say {n} parts (-of-{n:05d}): the parts "
                              "come from different splits", path=h.path)
        if k.no != i:
            raise FormatError(f"split.no is {k.no} (part {k.no + 1}), but its name says part {i + 1} of {n}", path=h.path)
        if i == 0:
            total = k.tensors_count
        elif k.tensors_count is not None and total is not None and k.tensors_count != total:
            raise FormatError(f"split.tensors.count is {k.tensors_count}, but part 1 ({name0}) says {total}: the parts "
                              "come from different splits", path=h.path)
        if i and h.architecture is not None and h.architecture != first.architecture:
            raise FormatError(f"general.architecture is {h.architecture!r}, but part 1 ({name0}) says "
                              f"{first.architecture!r}", path=h.path)
        for tname, info in h.tensors.items():
            if tname in tensors:
                raise FormatError(f"is also in {_base(tensors[tname].file)}: a tensor may be in one part only",
                                  path=h.path, tensor=tname)
            tensors[tname] = info
        warnings.extend(f"{_base(h.path)}: {w}" for w in h.warnings)
    if total is None:
        raise FormatError(f"is part 1 of a {n}-part split GGUF but has no split.tensors.count key", path=first.path)
    if total != len(tensors):
        raise FormatError(f"split.tensors.count is {total}, but the {n} parts hold {len(tensors)} tensors",
                          path=first.path)
    return tensors, tuple(warnings)


class SplitGGUF(_GGUFReading, ShardSet):
    """The parts of a split GGUF read as one model, with :class:`GGUFFile`'s reading interface.

    ``header`` / ``metadata`` / ``path`` are part 1's (gguf-split writes the model metadata there
    only); ``tensors`` is the union over the parts, validated by :func:`merge_split_headers`;
    ``read(info)`` / ``read_bytes(info)`` go to the part named by ``info.file``.  ``parts`` are
    :class:`GGUFFile` objects, local or over the Hub's ranges (whose parts share one byte source,
    so a prefetch covering several parts goes out as one batch and bytes are counted once).
    """

    what = "split GGUF"

    def __init__(self, parts: Sequence[GGUFFile]):
        self.headers = tuple(p.header for p in parts)
        tensors, warnings = merge_split_headers(self.headers)
        super().__init__(parts, tensors=tensors, metadata=self.headers[0].metadata, warnings=warnings)
        self.header = self.headers[0]
        self.path = self.header.path

    def read(self, info: TensorInfo, *, threads: int | None = None) -> np.ndarray:
        return self.part(info).read(info, threads=threads)


def open_gguf(path: str | os.PathLike) -> GGUFFile | SplitGGUF:
    """Open a local GGUF (header only): the file itself, or, when it is any part of a split GGUF,
    the whole set, its parts found beside it by name (llama.cpp ``llama_get_list_splits``)."""
    g = GGUFFile(path)
    try:
        names = split_part_names(os.path.basename(g.path), g.header)
        if names is None:
            return g
        folder = os.path.dirname(g.path)
        paths = [os.path.join(folder, n) for n in names]
        for p in paths:
            if not os.path.isfile(p):
                raise SourceNotFoundError(f"split part missing (expected beside {os.path.basename(g.path)})", path=p)
    except BaseException:
        g.close()
        raise
    parts: list[GGUFFile] = []
    try:
        for p in paths:
            parts.append(g if p == os.path.join(folder, os.path.basename(g.path)) else GGUFFile(p))
        return SplitGGUF(parts)
    except BaseException:
        for q in parts:
            q.close()
        g.close()
        raise


def file_summary(header: GGUFHeader) -> dict:
    """The few facts ``inspect`` shows about a GGUF file (``file_metadata`` in the JSON report)."""
    md = header.metadata
    arch = header.architecture
    ft = md.get("general.file_type")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = md.get(f"{arch}.vocab_size") if arch else None
    if vocab is None and tokens is not None:
        vocab = len(tokens)
    theta = md.get(f"{arch}.rope.freq_base") if arch else None
    return {
        "name": md.get("general.name"),
        "architecture": arch,
        "context_length": md.get(f"{arch}.context_length") if arch else None,
        "rope_theta": float(theta) if theta is not None else None,
        "file_type": FILE_TYPES.get(ft, f"UNKNOWN_{ft}") if isinstance(ft, int) else None,
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "vocab_size": vocab,
        "gguf_version": header.version,
        "alignment": header.alignment,
        "tensor_count": header.tensor_count,
        "kv_count": header.kv_count,
    }


def gguf_summary(g: GGUFFile | SplitGGUF) -> dict:
    """:func:`file_summary` of a reader; a split set adds ``split_count`` and ``split_files``
    (part names in order) and counts ``tensor_count`` over all parts."""
    out = file_summary(g.header)
    if isinstance(g, SplitGGUF):
        out["tensor_count"] = len(g.tensors)
        out["split_count"] = len(g.parts)
        out["split_files"] = [_base(p) for p in g.paths]
    return out
