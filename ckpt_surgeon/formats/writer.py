"""Streaming, atomic safetensors writer shared by surgery and conversion.

API (everything else in this module is internal)::

    from ckpt_surgeon.formats.writer import CheckpointWriter

    with CheckpointWriter(out, source=ckpt, force=False) as w:    # ckpt: a Checkpoint, or None
        w.put("model.layers.0.self_attn.k_proj.bias", array)        # replace a tensor (cast once to its dtype)
        w.put("x.qkv_proj.weight", lambda: big(), dtype="BF16",     # a new tensor, computed lazily,
              shape=(192, 64), like="x.q_proj.weight")              #   written where x.q_proj.weight was
        w.drop("x.k_proj.weight")                                   # not written
        w.copy("a.weight", as_name="b.weight")                      # raw bytes under another name
        w.set_config(new_config)                                    # config.json (default: copied)
        w.add_file("tokenizer.json", text_or_bytes)                 # any side file
        w.record("fold-bias", {"k": True})                          # goes into __metadata__
    w.result                                                        # WriteResult (frozen record)

Every source tensor not named by ``put`` / ``drop`` / ``copy`` is copied as raw bytes
(``copy_untouched=False`` turns that off, for converters that declare everything).  On leaving the
``with`` block without an exception the output is laid out, written, fsync'd, checked by rereading
and renamed into place; with an exception the temp dir is removed and ``OUT`` is untouched.

Output shape
    ``OUT`` ending in ``.safetensors`` -> one file.  Otherwise a folder sharded like the source
    (same shard file names; ``model.safetensors.index.json`` rewritten when the source had one or
    the output has several shards), or cut every ``max_shard_bytes`` when given (names
    ``model-00001-of-0000N.safetensors``).  New tensors go where their ``like`` tensor was; new
    tensors without ``like`` are appended to the last shard.  Side files of a source folder
    (config, tokenizer, generation config, READMEs, sub-folders such as ``1_Pooling/``) are copied
    recursively, except weight files (``*.safetensors``, ``*.bin``, ``*.gguf`` ...), which would be
    stale after surgery; they are listed in ``result.skipped_files``.

Values
    ``put`` takes an array (or a zero-argument callable returning one, called once, when its bytes
    are written, so at most one computed tensor is alive at a time), or raw ``bytes``.  Float arrays
    (compute them in float64/float32) are cast *once* to the target dtype with round-to-nearest-even
    (BF16 directly from the float64 bits: no double rounding through float32, see
    :func:`cast_to_dtype`).  The target dtype defaults to the dtype of the source tensor of the same
    name, or of ``like``.

Speed path
    A shard whose tensors keep their names, dtypes, shapes and order (values change only) is not
    re-streamed: its data section is copied by the kernel with ``os.copy_file_range`` (a reflink on
    copy-on-write filesystems when offsets are block-aligned, an in-kernel copy otherwise) and only
    the changed tensors' byte ranges are rewritten with ``pwrite``.  The new header is padded with
    spaces (valid JSON whitespace, as safetensors itself pads) so that the data section keeps its
    offset modulo 4096 and block-aligned reflinks stay possible.  Other shards are streamed tensor by
    tensor; raw copies use ``copy_file_range`` per tensor range, so no userspace buffer holds them.

Metadata
    ``__metadata__`` keeps the source's entries, keeps/sets ``format: pt`` and adds ``ckpt_surgeon``:
    a JSON string ``{"version", "operations": [{"op", "params"}...] (earlier ckpt-surgeon operations
    recorded in the source come first), "source": {"name", "hash", "hash_scope", "total_bytes"}}``.
    Source hash: sha256 streamed over every source file's bytes (``hash_scope: "full"``) when the
    source holds at most ``FULL_HASH_LIMIT`` bytes (1 GiB); above that, hashing would cost one more
    full read of the model (more than the whole surgery on the speed path), so the hash covers every
    file's name, size and header bytes plus the bytes of the tensors that were changed or dropped
    (``hash_scope: "headers+changed"``).  ``source_hash="full"`` forces the full hash.

Checks (reread after writing, before the rename)
    Every output header is parsed and validated again; names, dtypes, shapes match what was
    declared; every computed tensor's bytes hash to what was written; raw copies are compared with
    the source: every byte when the output holds at most ``FULL_CHECK_LIMIT`` bytes (1 GiB) or
    ``check="full"``, else three 64 KiB windows (start, middle, end) of every copied tensor, which
    catches offset/length mistakes without a second full read (``check="sampled"``).

Atomicity
    Everything is written into ``.<OUT name>.ckpt-surgeon-<pid>-<random>.tmp`` beside ``OUT``
    (same filesystem, so the final ``rename`` is atomic), every file and the directory are fsync'd,
    then the temp is renamed to ``OUT`` and the parent directory fsync'd, following the same
    reasoning as huggingface_hub's download path (write an ``.incomplete`` file, rename when done):
    a reader never sees a half-written ``OUT``, whatever kills the process.  A killed run leaves
    only its hidden temp dir, removed by the next run into the same ``OUT`` (its owner's lock is
    gone; :mod:`ckpt_surgeon.publish` does all of this for every writer).
    ``OUT`` is never overwritten without ``force=True`` (:class:`OutputExistsError`, raised before
    any work); with ``force`` an existing folder is moved aside, the new one renamed in, the old
    one removed (a kill between the two renames leaves the old folder in a hidden
    ``.<OUT name>.ckpt-surgeon-<pid>-<random>.old`` beside it, removed by the next run).  ``OUT`` may not be the source or contain it.
    Sources are only ever opened read-only.  ``OSError`` while writing (disk full, file too large,
    permission denied) becomes :class:`~ckpt_surgeon.errors.WriteError` naming the file, after the
    temp dir is removed; free space is checked before writing starts.

Stages: the writer calls every function in :data:`STAGE_OBSERVERS` with the name of each stage
it reaches (``temp-created``, ``data-copied:<i>``, ``shard-written:<i>``, ``before-rename``;
i = shard index).  Nothing is registered by default; the crash tests register one that pauses
there so they can SIGKILL the process at a known point (``tests/pause_at.py``).
"""
from __future__ import annotations

import collections
import errno
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

import numpy as np

from ..errors import CkptError, OutputExistsError, UnsupportedError, WriteError
from ..progress import NO_BAR, bar
from ..publish import Staging, sweep_stale
from ..records import TensorInfo
from . import safetensors as st
from .safe_input import loads_json, open_regular, read_json

__all__ = ["CheckpointWriter", "open_writer", "WriteResult", "ShardResult", "cast_to_dtype", "FULL_HASH_LIMIT", "FULL_CHECK_LIMIT"]

FULL_HASH_LIMIT = 1 << 30
FULL_CHECK_LIMIT = 1 << 30
_ALIGN = 4096                   # data-section offset kept modulo this on the speed path
_CHUNK = 16 << 20               # userspace copy chunk when copy_file_range is unavailable
_WINDOW = 64 << 10              # sampled check window
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx",
                   ".onnx_data", ".ot", ".tflite", ".pkl", ".npz")
INDEX_NAME = "model.safetensors.index.json"

Producer = Union[np.ndarray, bytes, Callable[[], "np.ndarray | bytes"]]


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True)
class ShardResult:
    file: str                # file name inside OUT (or OUT itself for single-file output)
    tensors: int
    bytes: int               # file size
    mode: str                # "patch" (kernel copy + changed ranges) | "stream"
    changed: int             # tensors written from computed values

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class WriteResult:
    out: str
    shards: tuple            # ShardResult per output file
    tensors_copied: int
    tensors_computed: int
    tensors_dropped: int
    bytes_written: int
    files_copied: tuple      # side files (relative paths)
    skipped_files: tuple     # weight files of the source folder not carried over
    source_hash: str | None
    hash_scope: str | None
    check_scope: str
    seconds: float

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["shards"] = [s.to_dict() for s in self.shards]
        d["files_copied"] = list(self.files_copied)
        d["skipped_files"] = list(self.skipped_files)
        return d


@dataclass
class _Entry:
    name: str
    dtype: str
    shape: tuple
    nbytes: int
    raw: TensorInfo | None = None          # raw copy from this source tensor
    producer: Producer | None = None       # computed
    anchor: str | None = None              # source tensor whose slot it takes
    digest: bytes | None = None            # sha256 of the computed bytes, set when written


PRECOPY_RESERVE = 1 << 16       # begin_copy(): room left for the new header (bytes, multiple of 4096)
_PRECOPY_CHUNK = 256 << 20      # cancellation granularity of the background copy
_PRECOPY_MAX_THREADS = 4        # shards copied at once by begin_copy() (capped by the CPU count)


@dataclass
class _Precopy:
    src: str
    dst: str
    data_start: int              # where the data section starts in dst
    src_data_start: int
    length: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


# ----------------------------------------------------------------------------- casting

_NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
              "U64": np.uint64, "BOOL": np.bool_}
_ML = {"BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}


def _f64_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 bit patterns, round-to-nearest-even in one step.

    Rounding float64 -> float32 -> bfloat16 rounds twice and can land on the wrong side of a
    tie; instead round the float64 mantissa (52 bits) to bfloat16's 7 in integer arithmetic
    (add half an ulp minus one, plus the lowest kept bit: RNE), after which the value is exactly a
    bfloat16 and the conversion below is exact.  bfloat16 subnormals (|x| < 2**-126) and
    non-finite values go through ml_dtypes' own conversion.
    """
    import ml_dtypes

    a = np.ascontiguousarray(a, dtype=np.float64)
    u = a.view(np.uint64)
    keep = (u >> np.uint64(45)) & np.uint64(1)
    r = ((u + np.uint64((1 << 44) - 1) + keep) & ~np.uint64((1 << 45) - 1)).view(np.float64)
    small_or_bad = ~np.isfinite(a) | (np.abs(a) < 2.0 ** -126)
    r = np.where(small_or_bad, a, r)
    # r is exactly representable (or beyond the finite range -> inf, which is RNE's answer too).
    with np.errstate(over="ignore"):
        return r.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def cast_to_dtype(arr: np.ndarray, dtype: str) -> bytes:
    """Cast ``arr`` once to the safetensors ``dtype`` and return its little-endian bytes.

    Floats: round-to-nearest-even from whatever precision ``arr`` has (numpy's float64->float16
    and ->float32 casts round directly; BF16 via :func:`_f64_to_bf16_bits`).  Integer/bool targets
    require an array of that exact kind (no silent float->int truncation).
    """
    arr = np.asarray(arr)
    if dtype == "BF16":
        if arr.dtype == np.float32 or arr.dtype == np.float16:
            arr = arr.astype(np.float64)     # exact widening, then one rounding
        if arr.dtype.name == "bfloat16":
            return np.ascontiguousarray(arr).view(np.uint16).astype("<u2").tobytes()
        return _f64_to_bf16_bits(arr.astype(np.float64)).astype("<u2").tobytes()
    if dtype in ("F32", "F16", "F64"):
        if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
            raise TypeError(f"cannot store a {arr.dtype} array as {dtype}")
        if arr.dtype.name == "bfloat16":
            arr = arr.astype(np.float32)
        return np.ascontiguousarray(arr.astype(_NP_DTYPES[dtype]).astype(np.dtype(_NP_DTYPES[dtype]).newbyteorder("<"))).tobytes()
    if dtype in _NP_DTYPES:
        want = np.dtype(_NP_DTYPES[dtype])
        if arr.dtype.kind != want.kind:
            raise TypeError(f"cannot store a {arr.dtype} array as {dtype} without an explicit conversion")
        return np.ascontiguousarray(arr.astype(want.newbyteorder("<"))).tobytes()
    if dtype in _ML:
        import ml_dtypes
        return np.ascontiguousarray(arr.astype(np.float32).astype(getattr(ml_dtypes, _ML[dtype]))).tobytes()
    raise TypeError(f"writing dtype {dtype} from numbers is not supported (pass raw bytes)")


# ----------------------------------------------------------------------------- helpers

def recorded_operations(raw: str) -> list[dict]:
    """The ``operations`` list of a ``ckpt_surgeon`` history record (a JSON string in the source's
    metadata, so untrusted): parsed with limits, anything malformed read as no history."""
    try:
        obj = loads_json(raw, what="ckpt_surgeon history")
    except CkptError:
        return []
    ops = obj.get("operations") if isinstance(obj, dict) else None
    return [op for op in ops if isinstance(op, dict)] if isinstance(ops, list) else []


# Called with each stage's name (module doc); the crash tests register a pause here.
STAGE_OBSERVERS: list = []


def _stage(name: str) -> None:
    for observe in STAGE_OBSERVERS:
        observe(name)


def _copy_range(src_fd: int, dst_fd: int, length: int, src_off: int, dst_off: int) -> None:
    """Copy ``length`` bytes between files by the kernel (``copy_file_range``), else in chunks."""
    use_kernel = hasattr(os, "copy_file_range")
    while length > 0:
        if use_kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, min(length, 1 << 30), src_off, dst_off)
            except OSError as e:
                if e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                    use_kernel = False
                    continue
                raise
            if n == 0:
                raise WriteError(f"source ended while copying ({length} bytes short at offset {src_off}); "
                                 "was it modified during the run?")
        else:
            buf = os.pread(src_fd, min(length, _CHUNK), src_off)
            if not buf:
                raise WriteError(f"source ended while copying ({length} bytes short at offset {src_off})")
            n = 0
            while n < len(buf):
                n += os.pwrite(dst_fd, memoryview(buf)[n:], dst_off + n)
        length -= n
        src_off += n
        dst_off += n


def _pwrite_all(fd: int, data: bytes | memoryview, off: int) -> None:
    mv = memoryview(data)
    while len(mv):
        n = os.pwrite(fd, mv, off)
        mv = mv[n:]
        off += n


def _hash_range(fd: int, start: int, end: int, h=None):
    h = h or hashlib.sha256()
    pos = start
    while pos < end:
        buf = os.pread(fd, min(end - pos, _CHUNK), pos)
        if not buf:
            break
        h.update(buf)
        pos += len(buf)
    return h


def _header_bytes(entries: list[_Entry], metadata: dict, *, min_len: int = 0, congruent_to: int | None = None,
                  data_start: int | None = None) -> bytes | None:
    """JSON header (tensors in data order) padded with spaces: to 8 bytes (as safetensors does), so
    that the data section starts at ``congruent_to`` modulo 4096 (speed path), or exactly at
    ``data_start`` (None if it does not fit there)."""
    hdr = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for e in entries:
        hdr[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [pos, pos + e.nbytes]}
        pos += e.nbytes
    js = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if data_start is not None:
        if 8 + len(js) > data_start:
            return None
        n = data_start - 8
        return n.to_bytes(8, "little") + js + b" " * (n - len(js))
    n = max(len(js), min_len)
    if congruent_to is not None:
        # 8 + n == congruent_to (mod _ALIGN)
        n += (congruent_to - 8 - n) % _ALIGN
    else:
        n += (-(8 + n)) % 8
    return n.to_bytes(8, "little") + js + b" " * (n - len(js))


# ----------------------------------------------------------------------------- the writer

class CheckpointWriter:
    """Declare tensors, then write them all atomically on ``commit()`` / leaving the ``with`` block."""

    def __init__(self, out: str | os.PathLike, source=None, *, force: bool = False,
                 copy_untouched: bool = True, max_shard_bytes: int | None = None,
                 copy_side_files: bool = True, check: str = "auto", source_hash: str = "auto",
                 before_publish: Callable[[], None] | None = None, progress: bool | None = False):
        if check not in ("auto", "full", "sampled"):
            raise ValueError(f"check must be auto|full|sampled, not {check!r}")
        if source_hash not in ("auto", "full", "headers"):
            raise ValueError(f"source_hash must be auto|full|headers, not {source_hash!r}")
        self.out = Path(os.path.abspath(os.fspath(out)))
        self.source = source
        self.force = force
        self.copy_untouched = copy_untouched and source is not None
        self.max_shard_bytes = max_shard_bytes
        self.copy_side_files_enabled = copy_side_files
        self.check = check
        self.source_hash_mode = source_hash
        # Called after everything is written, fsync'd and reread, just before the temp output is
        # renamed into place: a last gate (e.g. the converter's model check running meanwhile);
        # raising there discards the temp output, so nothing is published.
        self.before_publish = before_publish
        # Bar over the tensor bytes written (ckpt_surgeon.progress: None = only on a terminal).
        self.progress = progress
        self._bar = NO_BAR
        self.single_file = self.out.name.endswith((".safetensors", ".gguf"))
        self.result: WriteResult | None = None
        self._entries: dict[str, _Entry] = {}
        self._dropped: set[str] = set()
        self._config: dict | None = None
        self._files: dict[str, bytes] = {}
        self._ops: list[dict] = []
        self._committed = False
        self._tmp: Path | None = None
        self._staging: Staging | None = None
        self._pre: dict = {}                      # shard name -> _Precopy (begin_copy)
        self._pre_threads: list[threading.Thread] = []
        self._pre_cancel = threading.Event()
        self._src_tensors: dict = dict(source.tensors) if source is not None else {}
        self._check_destination()

    # -- declarations --------------------------------------------------------

    def put(self, name: str, data: Producer, *, dtype: str | None = None, shape=None, like: str | None = None) -> None:
        """Write ``name`` from computed values (array, raw bytes, or a callable returning one)."""
        anchor = like if like is not None else (name if name in self._src_tensors else None)
        if anchor is not None and anchor not in self._src_tensors:
            raise CkptError(f"like={anchor!r} is not a tensor of the source", tensor=name)
        ref = self._src_tensors.get(anchor) if anchor else None
        if dtype is None:
            if ref is None:
                raise CkptError("put() of a new tensor needs dtype=", tensor=name)
            dtype = ref.dtype
        if not self._known_dtype(dtype):
            raise CkptError(f"unknown {self.FORMAT} dtype {dtype!r}", tensor=name)
        if shape is None:
            if isinstance(data, np.ndarray):
                shape = data.shape
            elif name in self._src_tensors:
                shape = self._src_tensors[name].shape
            else:
                raise CkptError("put() of a lazily computed new tensor needs shape=", tensor=name)
        shape = tuple(int(d) for d in shape)
        self._declare(_Entry(name, dtype, shape, self._nbytes(dtype, shape, name), producer=data, anchor=anchor))

    def copy(self, name: str, *, as_name: str | None = None, dtype: str | None = None, shape=None) -> None:
        """Copy the raw bytes of source tensor ``name`` (optionally renamed / reinterpreted)."""
        info = self._src_tensors.get(name)
        if info is None:
            raise CkptError("copy() names a tensor the source does not have", tensor=name)
        dtype = dtype or info.dtype
        if not self._known_dtype(dtype):
            raise CkptError(f"raw copy as dtype {dtype!r}: not a {self.FORMAT} dtype (dequantize and put() instead)",
                            tensor=name)
        shape = tuple(shape) if shape is not None else tuple(info.shape)
        need = self._nbytes(dtype, shape, name)
        if need != info.nbytes:
            raise CkptError(f"raw copy as {dtype}{list(shape)} needs {need} bytes, "
                            f"the source tensor has {info.nbytes}", tensor=name)
        out_name = as_name or name
        self._declare(_Entry(out_name, dtype, shape, info.nbytes, raw=info, anchor=name))

    def drop(self, name: str) -> None:
        """Do not write source tensor ``name`` (unless it is put()/copied under its own name)."""
        if name not in self._src_tensors:
            raise CkptError("drop() names a tensor the source does not have", tensor=name)
        self._dropped.add(name)

    def set_config(self, config: dict) -> None:
        """Write this ``config.json`` instead of copying the source's."""
        self._config = dict(config)

    def add_file(self, relpath: str, data: bytes | str) -> None:
        """Write a side file (relative path inside OUT); replaces a copied one of the same name."""
        rel = Path(relpath)
        if rel.is_absolute() or ".." in rel.parts:
            raise CkptError(f"side file {relpath!r} must be a relative path inside the output")
        self._files[rel.as_posix()] = data.encode("utf-8") if isinstance(data, str) else bytes(data)

    def record(self, op: str, params: dict | None = None) -> None:
        """Note an operation (and its parameters) in every shard's ``__metadata__['ckpt_surgeon']``."""
        self._ops.append({"op": op, "params": dict(params or {})})

    def begin_copy(self) -> bool:
        """Optional: start copying the source shards' data now, in background threads (one shard
        each, up to min(CPUs, 4) at once), while the caller is still planning (e.g. fold-bias's
        analysis).  Shards that turn out patchable at commit (same tensors, values changed only)
        then only get their header and changed ranges written; the others are streamed as usual
        and their early copy is discarded.  The data is
        placed ``PRECOPY_RESERVE`` bytes after its source offset (a multiple of 4096, so block-aligned
        reflinks stay possible), which leaves room for the new header.  Returns whether copying
        started (safetensors sources sharded like the output only).
        """
        if (self.source is None or self.source.format != "safetensors" or self.max_shard_bytes
                or self._pre_threads):
            return False
        files = [f for f, _ in self._source_order()]
        if self.single_file and len(files) != 1:
            return False
        names = [self.out.name] if self.single_file else [os.path.basename(f) for f in files]
        try:
            self._sweep_stale()
            self._check_space(sum(os.path.getsize(f) for f in files) + PRECOPY_RESERVE * len(files))
            self._make_tmp()
            for name, f in zip(names, files):
                hdr = st.read_header(f)
                self._pre[name] = _Precopy(src=f, dst=str(self._shard_path(name)), data_start=hdr.data_start + PRECOPY_RESERVE,
                                           src_data_start=hdr.data_start, length=hdr.file_size - hdr.data_start)
        except OSError as e:
            self._cleanup()
            raise self._os_error(e) from None
        except BaseException:
            self._cleanup()
            raise
        # One shard per thread: the in-kernel copy is CPU-bound (page cache to page cache), so on a
        # 2-core machine two concurrent copies take ~0.6x the time of one after the other.
        queue = collections.deque(self._pre.values())
        n = max(1, min(len(queue), os.cpu_count() or 1, _PRECOPY_MAX_THREADS))
        self._pre_threads = [threading.Thread(target=self._precopy_run, args=(queue,), daemon=True,
                                              name=f"ckpt-surgeon-precopy-{k}") for k in range(n)]
        for t in self._pre_threads:
            t.start()
        return True

    def _precopy_run(self, queue: collections.deque) -> None:
        # workers share the queue (deque.popleft is atomic); commit() pops jobs from self._pre and
        # waits on each job's own event, so it never depends on which worker took a job
        while True:
            try:
                job = queue.popleft()
            except IndexError:
                return
            try:
                if self._pre_cancel.is_set():
                    job.error = WriteError("cancelled")
                else:
                    fd = os.open(job.dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    try:
                        sfd = os.open(job.src, os.O_RDONLY)
                        try:
                            done = 0
                            while done < job.length and not self._pre_cancel.is_set():
                                n = min(job.length - done, _PRECOPY_CHUNK)
                                _copy_range(sfd, fd, n, job.src_data_start + done, job.data_start + done)
                                done += n
                            if done < job.length:
                                job.error = WriteError("cancelled")
                        finally:
                            os.close(sfd)
                    finally:
                        os.close(fd)
            except BaseException as e:      # reported by commit, in the caller's thread
                job.error = e
            finally:
                job.done.set()

    def _stop_precopy(self) -> None:
        if self._pre_threads:
            self._pre_cancel.set()
            for t in self._pre_threads:
                t.join()
            self._pre_threads = []

    # -- format hooks (overridden by GGUFCheckpointWriter) -----------------------

    FORMAT = "safetensors"

    def _known_dtype(self, dtype: str) -> bool:
        return dtype in st.DTYPE_BITS

    def _nbytes(self, dtype: str, shape: tuple, name: str) -> int:
        n = 1
        for d in shape:
            n *= int(d)
        try:
            return st.dtype_nbytes(dtype, n)
        except ValueError as e:
            raise CkptError(str(e), tensor=name) from None

    def _raw_ok(self, info: TensorInfo) -> bool:
        return not info.quantized and info.dtype in st.DTYPE_BITS

    def _declare(self, e: _Entry) -> None:
        if e.name in self._entries:
            raise CkptError("declared twice for the output", tensor=e.name)
        self._entries[e.name] = e

    # -- context manager -----------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self._cleanup()
        return False

    def abort(self) -> None:
        self._cleanup()

    # -- destination checks --------------------------------------------------

    def _source_paths(self) -> list[str]:
        if self.source is None:
            return []
        paths = [os.path.realpath(f) for f in self.source.files if os.path.exists(f)]
        if os.path.exists(self.source.source):
            paths.append(os.path.realpath(self.source.source))
        return paths

    def _check_destination(self) -> None:
        out_real = os.path.realpath(self.out)
        for p in self._source_paths():
            if p == out_real or p.startswith(out_real + os.sep) or out_real.startswith(p + os.sep):
                raise CkptError("the output would overwrite or sit inside the source; choose another -o path",
                                path=self.out)
        if os.path.lexists(self.out) and not self.force:
            raise OutputExistsError("already exists; pass --force to replace it", path=self.out)
        if self.single_file and self.out.is_dir():
            raise CkptError("is a folder but the name ends in .safetensors; remove it or choose another -o path",
                            path=self.out)
        parent = self.out.parent
        if not parent.is_dir():
            raise WriteError("the parent folder does not exist (or is not a folder)", path=parent)

    # -- commit --------------------------------------------------------------

    def commit(self) -> WriteResult:
        if self._committed:
            return self.result
        t0 = time.perf_counter()
        try:
            self._sweep_stale()
            shards = self._layout()
            if (not self._pre and self._tmp is None and len(shards) > 1
                    and all(self._patchable(ents, src) for _, ents, src in shards)):
                self.begin_copy()   # values-only change: copy the shards' data in parallel threads
            total = sum(4096 + sum(e.nbytes for e in ents) for _, ents, _ in shards)
            if self._tmp is None:       # begin_copy() checked already (and its copies now use the space)
                self._check_space(total)
            hash_hex, scope = self._source_hash()
            metadata_extra = self._metadata(hash_hex, scope)
            if self._tmp is None:
                self._make_tmp()
            check_full = self.check == "full" or (self.check == "auto" and total <= FULL_CHECK_LIMIT)
            results = []
            with bar(self.progress, total=sum(e.nbytes for _, ents, _ in shards for e in ents),
                     desc=f"writing {self.out.name}") as self._bar:
                for i, (fname, ents, src_file) in enumerate(shards):
                    results.append(self._write_shard(i, fname, ents, src_file, metadata_extra))
            self._bar = NO_BAR
            for fname, _, _ in shards:
                fd = os.open(self._shard_path(fname), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            for name, pre in list(self._pre.items()):     # early copies no output shard used
                pre.done.wait()
                if os.path.exists(pre.dst):
                    os.unlink(pre.dst)
                del self._pre[name]
            for fname, ents, _ in shards:
                self._verify_shard(fname, ents, check_full)
            files_copied, skipped = self._write_side_files(shards)
            _stage("before-rename")
            if self.before_publish is not None:
                self.before_publish()
            self._rename_into_place()
        except OSError as e:
            self._cleanup()
            raise self._os_error(e) from None
        except BaseException:
            self._cleanup()
            raise
        self._committed = True
        self._pre_threads = []
        n_raw = sum(1 for _, ents, _ in shards for e in ents if e.raw is not None)
        n_put = sum(1 for _, ents, _ in shards for e in ents if e.raw is None)
        out_names = {e.name for _, ents, _ in shards for e in ents}
        n_drop = sum(1 for n in self._src_tensors if n not in out_names) if self.source is not None else 0
        self.result = WriteResult(
            out=str(self.out), shards=tuple(results), tensors_copied=n_raw, tensors_computed=n_put,
            tensors_dropped=n_drop, bytes_written=sum(r.bytes for r in results), files_copied=tuple(files_copied),
            skipped_files=tuple(skipped), source_hash=hash_hex, hash_scope=scope,
            check_scope="full" if check_full else "sampled", seconds=time.perf_counter() - t0)
        return self.result

    def _os_error(self, e: OSError) -> WriteError:
        where = e.filename or self.out
        what = e.strerror or str(e)
        hint = None
        if e.errno == errno.ENOSPC:
            hint = "free some space or write to another filesystem; nothing was written"
        elif e.errno == errno.EFBIG:
            hint = "the file size limit was reached (ulimit -f or filesystem limit); nothing was written"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            hint = f"check write permission on {self.out.parent}; nothing was written"
        return WriteError(f"cannot write the output: {what}", path=where, hint=hint)

    # -- layout --------------------------------------------------------------

    def _source_order(self) -> list[tuple[str, list[TensorInfo]]]:
        """Source files (in index order) with their tensors in data order."""
        if self.source is None:
            return []
        by_file: dict[str, list[TensorInfo]] = {f: [] for f in self.source.files}
        for info in self._src_tensors.values():
            by_file.setdefault(info.file, []).append(info)
        # shard files in name order (model-00001-of-... first): new tensors go to the last one
        return [(f, sorted(v, key=lambda i: i.start)) for f, v in sorted(by_file.items(), key=lambda kv: os.path.basename(kv[0]))]

    def _layout(self) -> list[tuple[str, list[_Entry], str | None]]:
        """Output shards: (file name, entries in data order, source file it mirrors or None)."""
        anchored: dict[str, list[_Entry]] = {}
        loose: list[_Entry] = []
        for e in self._entries.values():
            if e.anchor is not None:
                anchored.setdefault(e.anchor, []).append(e)
            else:
                loose.append(e)
        groups: list[tuple[str, list[_Entry]]] = []
        for fpath, infos in self._source_order():
            ents: list[_Entry] = []
            for info in infos:
                # the source tensor itself (unless replaced, dropped or moved by like=), then the
                # tensors declared in its slot, in declaration order
                mine = anchored.get(info.name, [])
                if (self.copy_untouched and info.name not in self._dropped and info.name not in self._entries):
                    if not self._raw_ok(info):
                        raise UnsupportedError(f"cannot copy a {info.dtype} tensor into {self.FORMAT} as raw bytes; "
                                               "dequantize it and put() the values", path=info.file, tensor=info.name)
                    ents.append(_Entry(info.name, info.dtype, tuple(info.shape), info.nbytes, raw=info, anchor=info.name))
                ents.extend(mine)
            groups.append((fpath, ents))
        if not groups:
            groups.append(("model.safetensors", []))
        groups[-1][1].extend(loose)
        seen: set[str] = set()
        for _, ents in groups:
            for e in ents:
                if e.name in seen:
                    raise CkptError("would be written twice (a renamed or new tensor collides with a source tensor); "
                                    "drop() the source tensor first", tensor=e.name)
                seen.add(e.name)

        if self.single_file:
            src = groups[0][0] if len(groups) == 1 and self.source is not None else None
            return [(self.out.name, [e for _, ents in groups for e in ents], src)]
        if self.max_shard_bytes:
            flat = [e for _, ents in groups for e in ents]
            cut: list[list[_Entry]] = [[]]
            size = 0
            for e in flat:
                if cut[-1] and size + e.nbytes > self.max_shard_bytes:
                    cut.append([])
                    size = 0
                cut[-1].append(e)
                size += e.nbytes
            if len(cut) == 1:
                return [("model.safetensors", cut[0], None)]
            n = len(cut)
            return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", c, None) for i, c in enumerate(cut)]
        names = [os.path.basename(f) for f, _ in groups]
        if len(set(names)) != len(names):
            raise CkptError("source shards share a file name; pass max_shard_bytes to re-shard", path=self.out)
        if self.source is not None and self.source.format not in ("safetensors",):
            # e.g. a .gguf or pickle source: its file name is not a safetensors shard name
            names = ["model.safetensors"] if len(groups) == 1 else [
                f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        srcs = [f if self.source is not None and self.source.format == "safetensors" else None for f, _ in groups]
        return [(n, ents, src) for n, (_, ents), src in zip(names, groups, srcs)]

    # -- space, hash, metadata ---------------------------------------------

    def _check_space(self, need: int) -> None:
        try:
            sv = os.statvfs(self.out.parent)
        except OSError:
            return
        free = sv.f_bavail * sv.f_frsize
        if need > free:
            raise WriteError(f"not enough free space: the output needs about {need:,} bytes, "
                             f"{free:,} are free", path=self.out.parent,
                             hint="free some space or write to another filesystem; nothing was written")

    def _changed_source_tensors(self) -> list[TensorInfo]:
        out = []
        for name, info in self._src_tensors.items():
            e = self._entries.get(name)
            if name in self._dropped or (e is not None and e.raw is None):
                out.append(info)
        return sorted(out, key=lambda i: (i.file, i.start))

    def _source_hash(self) -> tuple[str | None, str | None]:
        if self.source is None or self.source.format not in ("safetensors", "gguf"):
            return None, None
        files = [f for f in self.source.files if os.path.isfile(f)]
        total = sum(os.path.getsize(f) for f in files)
        full = self.source_hash_mode == "full" or (self.source_hash_mode == "auto" and total <= FULL_HASH_LIMIT)
        h = hashlib.sha256()
        for f in files:
            size = os.path.getsize(f)
            h.update(f"{os.path.basename(f)}\0{size}\0".encode())
            fd = os.open(f, os.O_RDONLY)
            try:
                if full:
                    _hash_range(fd, 0, size, h)
                else:
                    hdr_end = min(size, self._header_end(f, fd))
                    _hash_range(fd, 0, hdr_end, h)
            finally:
                os.close(fd)
        if not full:
            for info in self._changed_source_tensors():
                fd = os.open(info.file, os.O_RDONLY)
                try:
                    h.update(f"{info.name}\0".encode())
                    _hash_range(fd, info.start, info.end, h)
                finally:
                    os.close(fd)
        return "sha256:" + h.hexdigest(), ("full" if full else "headers+changed")

    def _header_end(self, path: str, fd: int) -> int:
        """End of the metadata part of a file: safetensors 8 + N; GGUF: first tensor's data offset."""
        first = os.pread(fd, 8, 0)
        if first[:4] == b"GGUF":
            starts = [i.start for i in self._src_tensors.values() if i.file == path]
            return min(starts) if starts else os.fstat(fd).st_size
        return 8 + int.from_bytes(first, "little")

    def _metadata(self, hash_hex, scope) -> dict:
        from .. import __version__
        prior = []
        base: dict = {}
        if self.source is not None and self.source.format == "safetensors":
            base = {k: v for k, v in (self.source.metadata or {}).items() if isinstance(v, str)}
            if "ckpt_surgeon" in base:
                prior = recorded_operations(base["ckpt_surgeon"])
        entry = {"version": __version__, "operations": prior + self._ops}
        if self.source is not None:
            entry["source"] = {"name": os.path.basename(os.path.normpath(self.source.source)), "hash": hash_hex,
                               "hash_scope": scope}
        base["format"] = "pt"
        base["ckpt_surgeon"] = json.dumps(entry, sort_keys=True, default=str)
        return base

    # -- writing -------------------------------------------------------------

    def _sweep_stale(self) -> None:
        """Remove temps killed runs left beside OUT (before the free-space check: they use space)."""
        sweep_stale(self.out)

    def _make_tmp(self) -> None:
        self._staging = Staging(self.out, folder=True)
        self._tmp = self._staging.path
        _stage("temp-created")

    def _shard_path(self, fname: str) -> Path:
        return self._tmp / fname

    def _produce(self, e: _Entry) -> bytes:
        data = e.producer
        if callable(data):
            data = data()
        if isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            arr = np.asarray(data)
            if tuple(arr.shape) != e.shape:
                raise CkptError(f"computed shape {list(arr.shape)} differs from the declared {list(e.shape)}", tensor=e.name)
            raw = cast_to_dtype(arr, e.dtype)
        if len(raw) != e.nbytes:
            raise CkptError(f"computed {len(raw)} bytes, {e.dtype}{list(e.shape)} needs {e.nbytes}", tensor=e.name)
        return raw

    def _patchable(self, ents: list[_Entry], src_file: str | None) -> bool:
        """Can this output shard be a kernel copy of ``src_file`` patched at the changed tensors?

        Yes when it lists the same tensors (names, dtypes, shapes, order) as the source shard, so
        every data offset is unchanged; raw entries must be copies of the same source tensor.
        """
        if not ents or src_file is None or not os.path.isfile(src_file):
            return False
        src = sorted((i for i in self._src_tensors.values() if i.file == src_file), key=lambda i: i.start)
        if len(src) != len(ents):
            return False
        for e, s in zip(ents, src):
            if e.name != s.name or e.dtype != s.dtype or e.shape != tuple(s.shape):
                return False
            if e.raw is not None and (e.raw.file != s.file or e.raw.start != s.start):
                return False
        return True

    def _write_shard(self, i: int, fname: str, ents: list[_Entry], src_file: str | None, metadata: dict) -> ShardResult:
        path = self._shard_path(fname)
        patch = self._patchable(ents, src_file)
        pre = self._pre.pop(fname, None)
        pre_header = None
        if pre is not None:
            pre.done.wait()
            if pre.error is not None:
                raise pre.error
            if patch and pre.src == src_file:
                pre_header = _header_bytes(ents, metadata, data_start=pre.data_start)
            if pre_header is None:          # not usable: start this shard afresh
                os.unlink(path)
        flags = os.O_WRONLY if pre_header is not None else os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = os.open(path, flags, 0o644)
        try:
            if patch:
                if pre_header is not None:  # data already copied by begin_copy()
                    header = pre_header
                    _pwrite_all(fd, header, 0)
                else:
                    src_hdr = st.read_header(src_file)
                    header = _header_bytes(ents, metadata, congruent_to=src_hdr.data_start)
                    _pwrite_all(fd, header, 0)
                    sfd = os.open(src_file, os.O_RDONLY)
                    try:
                        _copy_range(sfd, fd, src_hdr.file_size - src_hdr.data_start, src_hdr.data_start, len(header))
                    finally:
                        os.close(sfd)
                data_start = len(header)
                _stage(f"data-copied:{i}")
                pos = data_start
                for e in ents:
                    if e.raw is None:
                        raw = self._produce(e)
                        e.digest = hashlib.sha256(raw).digest()
                        _pwrite_all(fd, raw, pos)
                        del raw
                    pos += e.nbytes
                    self._bar.update(e.nbytes)
                mode = "patch"
            else:
                header = _header_bytes(ents, metadata)
                _pwrite_all(fd, header, 0)
                pos = len(header)
                fds: dict[str, int] = {}
                try:
                    for e in ents:
                        if e.raw is not None:
                            sfd = fds.get(e.raw.file)
                            if sfd is None:
                                sfd = fds[e.raw.file] = os.open(e.raw.file, os.O_RDONLY) if os.path.isfile(e.raw.file) else -1
                            if sfd >= 0:
                                _copy_range(sfd, fd, e.nbytes, e.raw.start, pos)
                            else:   # remote / pickle source: whatever the Checkpoint can give
                                _pwrite_all(fd, self.source.read_raw(e.raw.name), pos)
                        else:
                            raw = self._produce(e)
                            e.digest = hashlib.sha256(raw).digest()
                            _pwrite_all(fd, raw, pos)
                            del raw
                        pos += e.nbytes
                        self._bar.update(e.nbytes)
                finally:
                    for sfd in fds.values():
                        if sfd >= 0:
                            os.close(sfd)
                mode = "stream"
            os.ftruncate(fd, pos)
            # no fsync here: commit() fsyncs every shard after all are written, so the kernel
            # flushes one shard while the next is being copied
        finally:
            os.close(fd)
        _stage(f"shard-written:{i}")
        return ShardResult(file=fname if not self.single_file else str(self.out), tensors=len(ents), bytes=pos,
                           mode=mode, changed=sum(1 for e in ents if e.raw is None))

    def _verify_shard(self, fname: str, ents: list[_Entry], full: bool) -> None:
        path = self._shard_path(fname)
        hdr = st.read_header(path)
        got = list(hdr.tensors.values())
        if [g.name for g in got] != [e.name for e in ents]:
            raise WriteError("reread check failed: the written header lists other tensors than declared", path=path)
        fd = os.open(path, os.O_RDONLY)
        src_fds: dict[str, int] = {}
        try:
            for g, e in zip(got, ents):
                sfd = None
                if e.raw is not None and os.path.isfile(e.raw.file):
                    sfd = src_fds.get(e.raw.file)
                    if sfd is None:
                        sfd = src_fds[e.raw.file] = os.open(e.raw.file, os.O_RDONLY)
                _check_written_entry(fd, g, e, path, sfd, full)
        finally:
            os.close(fd)
            for sfd in src_fds.values():
                os.close(sfd)

    def _write_side_files(self, shards) -> tuple[list[str], list[str]]:
        copied, skipped = [], []
        if self.single_file:
            if self._config is not None and self.source is not None and self._config != self.source.config:
                raise UnsupportedError("a single .safetensors output cannot carry the changed config.json; "
                                       "write to a folder instead (an -o path without .safetensors)", path=self.out)
            return copied, skipped
        written: set[str] = set()
        src_dir = Path(self.source.source) if self.source is not None and os.path.isdir(self.source.source) else None
        weight_files = {os.path.realpath(f) for f in (self.source.files if self.source is not None else ())}
        if src_dir is not None and self.copy_side_files_enabled:
            for root, dirs, files in os.walk(src_dir):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".ckpt-surgeon", ".git", ".cache")))
                for fn in sorted(files):
                    p = Path(root) / fn
                    rel = p.relative_to(src_dir).as_posix()
                    if (fn == INDEX_NAME or fn.endswith(WEIGHT_SUFFIXES) or os.path.realpath(p) in weight_files):
                        if fn != INDEX_NAME and os.path.realpath(p) not in weight_files:
                            skipped.append(rel)
                        continue
                    if rel in self._files or (rel == "config.json" and self._config is not None):
                        continue
                    dst = self._tmp / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    self._copy_file(p, dst)
                    copied.append(rel)
                    written.add(rel)
        cfg = self._config
        if cfg is None and self.source is not None and self.source.config is not None and "config.json" not in written \
                and "config.json" not in self._files:
            cfg = self.source.config   # a single-file source with config.json beside it
        if cfg is not None:
            self._files["config.json"] = (json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
        # index: when the source had one or the output has several shards
        src_had_index = bool(self.source is not None and src_dir is not None and (src_dir / INDEX_NAME).is_file())
        if len(shards) > 1 or (src_had_index and not self.max_shard_bytes):
            meta = {}
            if src_had_index:
                meta = read_json(src_dir / INDEX_NAME).get("metadata")   # validated when the source was opened
                meta = dict(meta) if isinstance(meta, dict) else {}
            meta["total_size"] = sum(e.nbytes for _, ents, _ in shards for e in ents)
            if "total_parameters" in meta:     # transformers >= 5 records it; keep it true
                meta["total_parameters"] = sum(int(np.prod(e.shape, dtype=np.int64)) for _, ents, _ in shards for e in ents)
            wm = {e.name: fname for fname, ents, _ in shards for e in ents}
            self._files[INDEX_NAME] = (json.dumps({"metadata": meta, "weight_map": dict(sorted(wm.items()))},
                                                  indent=2) + "\n").encode()
        for rel, data in self._files.items():
            dst = self._tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _pwrite_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            if rel not in copied:
                copied.append(rel)
        return copied, skipped

    def _copy_file(self, src: Path, dst: Path) -> None:
        sfd = open_regular(src, what="side file")      # a FIFO among the side files would block the copy
        try:
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _copy_range(sfd, fd, os.fstat(sfd).st_size, 0, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            os.close(sfd)

    def _rename_into_place(self) -> None:
        # fsync'd and renamed by the publish module; a single-file OUT is the one file in the temp dir
        self._staging.publish(replace=self.force, member=self.out.name if self.single_file else None)
        self._staging, self._tmp = None, None

    def _cleanup(self) -> None:
        self._stop_precopy()
        if self._staging is not None:
            self._staging.discard()
        self._staging, self._tmp = None, None


# ----------------------------------------------------------------------------- GGUF

GGUF_HISTORY_KEY = "ckpt_surgeon.history"
_GGUF_STRING = 8


def _gguf_string(b: bytes) -> bytes:
    return len(b).to_bytes(8, "little") + b


class GGUFCheckpointWriter(CheckpointWriter):
    """GGUF -> GGUF with the same API (``put`` / ``copy`` / ``drop`` / ``record``).

    The source must be a GGUF file: its key-value section is carried over byte for byte (every
    key keeps its exact type), plus one string key ``ckpt_surgeon.history`` (the same JSON as the
    safetensors ``ckpt_surgeon`` entry; an earlier one is replaced, its operations kept).  Tensor
    infos are rewritten for the output tensors (file order kept; offsets aligned to the source's
    ``general.alignment``).  Untouched tensors keep their ggml type and bytes (kernel copies of
    each tensor's byte range); ``put`` takes float values for F32/F16/BF16 tensors (biases are
    F32 in GGUF) or raw bytes of any ggml type.  Layout of the file: llama.cpp ``gguf.cpp``
    (see ``formats/gguf.py``).  No config.json or side files: set_config/add_file raise.
    """

    FORMAT = "GGUF"

    def __init__(self, out, source=None, **kw):
        if source is not None and source.format == "gguf" and len(source.files) > 1:
            # A split source (llama.cpp gguf-split parts) would need a split output or a merged
            # key-value section (part 1's keys minus split.*); neither is written yet.
            raise UnsupportedError(f"is a split GGUF ({len(source.files)} parts); split GGUF sources cannot be written "
                                   "as GGUF yet: convert to safetensors first (ckpt-surgeon convert) or merge the parts "
                                   "with llama-gguf-split --merge", path=source.source)
        if source is None or source.format != "gguf" or len(source.files) != 1:
            raise UnsupportedError("GGUF output needs a GGUF source file (its metadata is carried over); "
                                   "use `ckpt-surgeon convert` to make a GGUF from a Hugging Face folder", path=out)
        kw.pop("max_shard_bytes", None)
        kw.pop("copy_side_files", None)
        super().__init__(out, source, **kw)
        from . import gguf as gg
        self._gg = gg
        self._src_header = gg.read_header(source.files[0])

    def _known_dtype(self, dtype: str) -> bool:
        from .dequant import TYPES_BY_NAME
        return dtype in TYPES_BY_NAME

    def _nbytes(self, dtype: str, shape: tuple, name: str) -> int:
        from .dequant import ggml_type
        t = ggml_type(dtype)
        n = 1
        for d in shape:
            n *= int(d)
        if not shape or shape[-1] % t.block_size:
            raise CkptError(f"row length {shape[-1] if shape else 0} is not a multiple of the {dtype} block size "
                            f"{t.block_size}", tensor=name)
        return t.nbytes(n)

    def _raw_ok(self, info: TensorInfo) -> bool:
        return self._known_dtype(info.dtype)

    def set_config(self, config: dict) -> None:
        if config != (self.source.config or {}):
            raise UnsupportedError("a GGUF output carries its configuration in GGUF metadata; config.json changes "
                                   "cannot be written to it", path=self.out)

    def add_file(self, relpath, data) -> None:
        raise UnsupportedError("a GGUF output is a single file; side files cannot be added", path=self.out)

    def _metadata(self, hash_hex, scope) -> dict:
        from .. import __version__
        prior = []
        old = (self.source.metadata or {}).get(GGUF_HISTORY_KEY)
        if isinstance(old, str):
            prior = recorded_operations(old)
        entry = {"version": __version__, "operations": prior + self._ops,
                 "source": {"name": os.path.basename(self.source.source), "hash": hash_hex, "hash_scope": scope}}
        return {"ckpt_surgeon": json.dumps(entry, sort_keys=True, default=str)}

    def _kv_bytes(self) -> tuple[bytes, int]:
        """The source's key-value pairs as stored (minus an old history key), and their count."""
        h = self._src_header
        info_size = 0
        for name, info in h.tensors.items():
            info_size += 8 + len(name.encode("utf-8")) + 4 + 8 * len(info.shape) + 4 + 8
        kv_end = h.header_end - info_size
        with open(h.path, "rb") as f:
            f.seek(24)
            kv = f.read(kv_end - 24)
            first = next(iter(h.tensors), None)
            if first is not None:
                f.seek(kv_end)
                n = int.from_bytes(f.read(8), "little")
                if n != len(first.encode("utf-8")) or f.read(n) != first.encode("utf-8"):
                    raise WriteError("could not locate the end of the key-value section (unexpected tensor-info "
                                     "encoding)", path=h.path)
        count = h.kv_count
        fld = h.fields.get(GGUF_HISTORY_KEY)
        if fld is not None:
            starts = sorted(x.offset for x in h.fields.values())
            nxt = next((o for o in starts if o > fld.offset), kv_end)
            kv = kv[: fld.offset - 24] + kv[nxt - 24:]
            count -= 1
        return kv, count

    def _write_shard(self, i, fname, ents, src_file, metadata) -> ShardResult:
        from .dequant import ggml_type
        h = self._src_header
        align = h.alignment
        path = self._shard_path(fname)
        kv, count = self._kv_bytes()
        hist = _gguf_string(GGUF_HISTORY_KEY.encode()) + _GGUF_STRING.to_bytes(4, "little") + \
            _gguf_string(metadata["ckpt_surgeon"].encode("utf-8"))
        infos = bytearray()
        offsets, pos = [], 0
        for e in ents:
            pos = (pos + align - 1) // align * align
            offsets.append(pos)
            nb = e.name.encode("utf-8")
            infos += _gguf_string(nb) + len(e.shape).to_bytes(4, "little")
            for d in reversed(e.shape):            # ggml ne: innermost first
                infos += int(d).to_bytes(8, "little")
            infos += ggml_type(e.dtype).id.to_bytes(4, "little") + pos.to_bytes(8, "little")
            pos += e.nbytes
        head = (b"GGUF" + h.version.to_bytes(4, "little") + len(ents).to_bytes(8, "little")
                + (count + 1).to_bytes(8, "little") + kv + hist + bytes(infos))
        data_start = (len(head) + align - 1) // align * align
        head += b"\0" * (data_start - len(head))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _pwrite_all(fd, head, 0)
            sfd = os.open(h.path, os.O_RDONLY)
            try:
                for e, off in zip(ents, offsets):
                    at = data_start + off
                    if e.raw is not None:
                        _copy_range(sfd, fd, e.nbytes, e.raw.start, at)
                    else:
                        raw = self._produce(e)
                        e.digest = hashlib.sha256(raw).digest()
                        _pwrite_all(fd, raw, at)
                        del raw
                    self._bar.update(e.nbytes)
                end = data_start + pos
                # alignment padding between tensors: explicit zeros (no reliance on file holes)
                gaps = []
                prev = data_start
                for e, off in zip(ents, offsets):
                    if data_start + off > prev:
                        gaps.append((prev, data_start + off))
                    prev = data_start + off + e.nbytes
                for a, b in gaps:
                    _pwrite_all(fd, b"\0" * (b - a), a)
            finally:
                os.close(sfd)
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
        _stage(f"shard-written:{i}")
        return ShardResult(file=str(self.out), tensors=len(ents), bytes=end, mode="stream",
                           changed=sum(1 for e in ents if e.raw is None))

    def _verify_shard(self, fname, ents, full) -> None:
        path = self._shard_path(fname)
        hdr = self._gg.read_header(path)
        got = list(hdr.tensors.values())
        if [g.name for g in got] != [e.name for e in ents]:
            raise WriteError("reread check failed: the written header lists other tensors than declared", path=path)
        if dict(hdr.metadata).get(GGUF_HISTORY_KEY) is None:
            raise WriteError("reread check failed: the history key is missing", path=path)
        for key, val in self._src_header.metadata.items():
            if key != GGUF_HISTORY_KEY and hdr.fields[key].type != self._src_header.fields[key].type:
                raise WriteError(f"reread check failed: metadata key {key} changed type", path=path)
        fd = os.open(path, os.O_RDONLY)
        sfd = os.open(self._src_header.path, os.O_RDONLY)
        try:
            for g, e in zip(got, ents):
                _check_written_entry(fd, g, e, path, sfd, full)
        finally:
            os.close(fd)
            os.close(sfd)

    def _write_side_files(self, shards):
        return [], []


def _check_written_entry(fd: int, g, e, path: str, src_fd: int | None, full: bool) -> None:
    """Reread check of one written tensor ``g`` (as parsed back) against its declaration ``e``.

    dtype and shape must match; a computed tensor's bytes must hash to what was written; a
    copied tensor's bytes must equal the source's (all of them with ``full``, else three
    windows: start, middle, end).  ``src_fd`` None: the source file is gone, nothing to compare.
    """
    if g.dtype != e.dtype or tuple(g.shape) != e.shape:
        raise WriteError(f"reread check failed: written as {g.dtype}{list(g.shape)}, declared "
                         f"{e.dtype}{list(e.shape)}", path=path, tensor=e.name)
    if e.raw is None:
        if _hash_range(fd, g.start, g.end).digest() != e.digest:
            raise WriteError("reread check failed: the computed tensor's bytes differ from what was written",
                             path=path, tensor=e.name)
        return
    if src_fd is None:
        return
    if full:
        same = _hash_range(fd, g.start, g.end).digest() == _hash_range(src_fd, e.raw.start, e.raw.end).digest()
    else:
        n = e.nbytes
        spots = {0, max(0, n // 2 - _WINDOW // 2), max(0, n - _WINDOW)}
        same = all(os.pread(fd, min(_WINDOW, n - s), g.start + s)
                   == os.pread(src_fd, min(_WINDOW, n - s), e.raw.start + s) for s in spots)
    if not same:
        raise WriteError("reread check failed: copied bytes differ from the source", path=path, tensor=e.name)


def open_writer(out, source=None, **kw):
    """The writer for ``out``: GGUF when it ends in ``.gguf``, else safetensors (file or folder)."""
    if os.fspath(out).endswith(".gguf"):
        return GGUFCheckpointWriter(out, source, **kw)
    return CheckpointWriter(out, source, **kw)
