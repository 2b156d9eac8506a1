"""safetensors: validated header parsing and lazy tensor reads (no torch).

Layout (https://github.com/huggingface/safetensors, ``safetensors/src/tensor.rs``):
``u64 little-endian N`` | ``N bytes of JSON`` | data.  The JSON maps tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` relative to the data section,
plus an optional ``__metadata__`` map of strings.

Like the Rust core we validate the *whole* header before any tensor byte is
trusted: header length sane and inside the file, JSON well formed, no duplicate
names, every dtype known, sizes checked with exact integer arithmetic (Python ints
cannot overflow; we still bound them by the file size), offsets contiguous and
covering the data section exactly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, TruncatedError
from ..records import TensorInfo
from .safe_input import loads_json, open_regular
from .source import FileSource, LocalBytes

# Header length limit, as in safetensors' Rust core (MAX_HEADER_SIZE = 100_000_000).
MAX_HEADER_SIZE = 100_000_000

# dtype -> bits per element.  Every dtype the safetensors format defines
# (safetensors/src/tensor.rs `Dtype`), sub-byte float formats included.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# dtypes numpy reads natively (no extra package); BF16 / F8 go through helpers below.
_NUMPY_NATIVE = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "I64": np.int64, "U64": np.uint64, "F64": np.float64, "C64": np.complex64,
}
# the float8 dtypes, named as ml_dtypes and torch name them
ML_DTYPES = {"F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu"}
# torch dtype name -> safetensors dtype, for the dtypes both have plainly (pickles, the GGUF -> HF probe's integers)
TORCH_TO_ST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
               "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def dtype_nbytes(dtype: str, numel: int) -> int:
    """Byte size of ``numel`` elements; sub-byte types must fill whole bytes (as in the Rust core)."""
    bits = DTYPE_BITS[dtype] * numel
    if bits % 8:
        raise ValueError(f"{numel} elements of {dtype} do not fill whole bytes")
    return bits // 8


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    header_len: int
    data_start: int          # absolute offset of the data section (8 + header_len)
    file_size: int
    metadata: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)   # name -> TensorInfo (absolute offsets), file order


def _short(v, limit: int = 80) -> str:
    """``repr`` of a header value for a message, cut to ``limit`` characters."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 5] + " ...]" if r.startswith("[") else r[:limit - 4] + " ..."


def _json_type(v) -> str:
    return {dict: "JSON object", list: "JSON array", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)


def _checked_metadata(obj: dict, path: str) -> dict:
    """Pop and validate ``__metadata__`` from the parsed header object (a map of strings to strings)."""
    metadata = obj.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise FormatError("__metadata__ is not an object", path=path)
    for k, v in metadata.items():
        # the format's __metadata__ is a map of strings to strings (safetensors' Rust core:
        # HashMap<String, String>), and it is copied into outputs: refuse anything else here
        if not isinstance(v, str):
            raise FormatError(f"__metadata__ value of {_short(k)} is a {_json_type(v)}; the safetensors format "
                              "allows only strings", path=path)
    return metadata


def _checked_entry(path: str, name: str, ent) -> tuple:
    """Validate one tensor entry of the header -> ``(begin, end, name, dtype, shape)`` (offsets data-relative)."""
    if not isinstance(ent, dict) or not {"dtype", "shape", "data_offsets"} <= set(ent):
        raise FormatError("header entry lacks dtype/shape/data_offsets", path=path, tensor=name)
    dtype, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise FormatError(f"unknown dtype {_short(dtype)} (known: {', '.join(DTYPE_BITS)})", path=path, tensor=name)
    if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise FormatError(f"shape {_short(shape)} is not a list of non-negative integers", path=path, tensor=name)
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
        raise FormatError(f"data_offsets {_short(offs)} is not a pair of non-negative integers", path=path, tensor=name)
    b, e = offs
    if e < b:
        raise FormatError(f"data_offsets [{b}, {e}] end before they begin", path=path, tensor=name)
    # Python ints are exact; the product stops growing once it exceeds what the offsets hold
    # (a shape of 100,000 huge dimensions would otherwise cost quadratic time), never allocated.
    numel, cap = (0 if 0 in shape else 1), max((e - b) * 8, 1 << 256)
    for d in shape:
        numel *= d
        if numel > cap:
            break
    try:
        need = dtype_nbytes(dtype, numel) if numel <= cap else None
    except ValueError as err:
        raise FormatError(str(err), path=path, tensor=name) from None
    if need != e - b:
        needs = f"{need}" if need is not None else f"more than {e - b}"
        raise FormatError(f"size mismatch: shape {_short(shape)} of {dtype} needs {needs} bytes but data_offsets [{b}, {e}] "
                          f"hold {e - b}", path=path, tensor=name)
    return (b, e, name, dtype, tuple(shape))


def _check_coverage(path: str, entries: list, data_len: int) -> None:
    """The sorted entries must tile the data section exactly: no overlap, no gap, no shortfall, no excess."""
    pos = 0
    prev = None
    for b, e, name, _, _ in entries:
        if b < pos:
            raise FormatError(f"data_offsets [{b}, {e}] overlap tensor '{prev}' (which ends at {pos})", path=path, tensor=name)
        if b > pos:
            where = f"after tensor '{prev}'" if prev else "at the start of the data section"
            raise FormatError(f"data_offsets [{b}, {e}] leave a gap of {b - pos} bytes {where}: offsets must be contiguous",
                              path=path, tensor=name)
        pos, prev = e, name
    if pos > data_len:
        cut = [name for b, e, name, _, _ in entries if e > data_len]
        raise TruncatedError(
            f"file is truncated: the header promises {pos} bytes of data but only {data_len} are present "
            f"({pos - data_len} bytes missing; {len(cut)} tensor(s) affected, first '{cut[0]}')",
            path=path, missing_bytes=pos - data_len, tensors=tuple(cut))
    if pos < data_len:
        raise FormatError(f"{data_len - pos} bytes after the last tensor are not covered by the header: offsets must cover the data exactly",
                          path=path)


def parse_header_bytes(path: str, head: bytes, file_size: int) -> SafetensorsHeader:
    """Validate ``head`` (the first 8 + N bytes of a file of ``file_size`` bytes).

    Shared by the local reader and the hub reader (which gets the same bytes by HTTP range).
    """
    if file_size < 8:
        raise FormatError(f"file is too small to be safetensors ({file_size} bytes; the 8-byte header length is missing)", path=path)
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER_SIZE:
        raise FormatError(f"header length {n} exceeds the {MAX_HEADER_SIZE // 1_000_000} MB limit: not a safetensors file or corrupted", path=path)
    if 8 + n > file_size:
        raise FormatError(f"header length {n} runs past the end of the file ({file_size} bytes): file truncated or not safetensors", path=path)
    raw = head[8:8 + n]
    if len(raw) < n:
        raise FormatError(f"header needs {n} bytes but only {len(raw)} were read", path=path)
    obj = loads_json(raw, path=path, error=FormatError, max_bytes=MAX_HEADER_SIZE, what="header", duplicates_tensor=True)
    if not isinstance(obj, dict):
        raise FormatError(f"header is JSON but not an object (got {type(obj).__name__})", path=path)
    metadata = _checked_metadata(obj, path)
    data_start = 8 + n
    data_len = file_size - data_start
    entries = [_checked_entry(path, name, ent) for name, ent in obj.items()]
    entries.sort()
    _check_coverage(path, entries, data_len)
    tensors = {}
    for b, e, name, dtype, shape in entries:
        tensors[name] = TensorInfo(name=name, dtype=dtype, shape=shape, file=path,
                                   start=data_start + b, end=data_start + e)
    return SafetensorsHeader(path=path, header_len=n, data_start=data_start, file_size=file_size,
                             metadata=metadata, tensors=tensors)


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Read and validate the header of a local file (reads 8 + N bytes, nothing else)."""
    path = os.fspath(path)
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(8)
        n = int.from_bytes(first, "little") if len(first) == 8 else 0
        rest = f.read(n) if 0 < n <= MAX_HEADER_SIZE and 8 + n <= size else b""
    return parse_header_bytes(path, first + rest, size)


def decode(buf: bytes | memoryview | np.ndarray, info: TensorInfo) -> np.ndarray:
    """Bytes of one tensor -> numpy array of its shape.

    BF16 is widened to float32 by a 16-bit shift (exact); F8 types go through
    ml_dtypes (imported only when needed).  No torch.
    """
    raw = np.frombuffer(buf, dtype=np.uint8)
    dt = info.dtype
    if dt in _NUMPY_NATIVE:
        arr = raw.view(_NUMPY_NATIVE[dt])
    elif dt == "BF16":
        # one pass, one allocation: uint16 -> uint32 widened and shifted straight into the result
        arr = np.left_shift(raw.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
    elif dt in ML_DTYPES:
        import ml_dtypes
        arr = raw.view(getattr(ml_dtypes, ML_DTYPES[dt])).astype(np.float32)
    else:
        raise FormatError(f"reading dtype {dt} as numbers is not supported (the header is valid; statistics need F4/F6 support)",
                          path=info.file, tensor=info.name)
    return arr.reshape(info.shape)


class SafetensorsFile(FileSource):
    """A validated safetensors file (its parsed ``header``) whose bytes come from a byte source:
    a local file (:class:`LocalFile`) or the Hub's HTTP ranges.  Reads touch only the bytes of
    the requested tensor; ``bytes_read`` counts header and tensor bytes so benchmarks and tests
    can check the budget."""

    def decode(self, raw: np.ndarray, info: TensorInfo, **options) -> np.ndarray:
        return decode(raw, info)


class LocalFile(SafetensorsFile):
    """A local safetensors file, read with ``os.preadv`` straight into the caller's buffer
    (``read_into``: any writable C-contiguous buffer of exactly the tensor's size)."""

    def __init__(self, path: str | os.PathLike):
        header = read_header(path)
        super().__init__(header, LocalBytes(header.path, 8 + header.header_len))


def check_weight_map(tensors: dict, shards: dict, weight_map: dict, index_path: str, *, same_file) -> tuple[str, ...]:
    """An index's ``weight_map`` against the shards' own headers: every tensor it lists is in the
    shard it names (``shards``: shard file -> the names the map gives it; ``same_file(a, b)``
    compares a ``TensorInfo.file`` with a shard), else FormatError.  -> warnings: tensors the
    shards hold that the map does not list."""
    for shard, names in shards.items():
        for tname in names:
            info = tensors.get(tname)
            if info is None or not same_file(info.file, shard):
                raise FormatError(f"weight_map says this tensor is in {os.path.basename(shard)}, but that file does not "
                                  "hold it", path=index_path, tensor=tname)
    unlisted = sorted(set(tensors) - set(weight_map))
    if unlisted:
        return (f"{len(unlisted)} tensor(s) in the shards are not in {os.path.basename(index_path)}'s weight_map: "
                f"{unlisted[:3]}",)
    return ()
