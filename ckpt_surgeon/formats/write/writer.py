"""Streaming, atomic safetensors writer shared by surgery and conversion.

API (everything else in this module is internal)::

    from ckpt_surgeon.formats.write.writer import CheckpointWriter

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
i = shard index; the HF -> GGUF converter calls the same, plus ``header-written``).  Nothing is registered by default; the crash tests register one that pauses
there so they can SIGKILL the process at a known point (``tests/pause_at.py``).
"""
from __future__ import annotations

import collections
import errno
import hashlib
import json
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import CkptError, OutputExistsError, UnsupportedError, WriteError
from ...progress import NO_BAR, bar
from ...publish import Staging, fsync_path, refuse_onto_inputs, sweep_stale
from ...records import TensorInfo
from . import gguf as gw
from .. import safetensors as st
from ..safe_input import loads_json, read_json
from .shard_io import (STAGE_OBSERVERS, FdCache, Precopy, copy_file, copy_range, hash_range, pwrite_all,
                       run_precopy, stage, write_computed)
from .cast import cast_to_dtype
from .check import verify_gguf_file, verify_safetensors_shard
from .layout import (INDEX_NAME, WEIGHT_SUFFIXES, Declared, Entry, Producer, ShardResult, WriteResult,
                           header_bytes, index_bytes, patchable, plan_shards, side_file_plan, source_order)

__all__ = ["CheckpointWriter", "GGUFCheckpointWriter", "open_writer", "WriteResult", "ShardResult", "cast_to_dtype",
           "FULL_HASH_LIMIT", "FULL_CHECK_LIMIT", "PRECOPY_RESERVE", "STAGE_OBSERVERS", "recorded_operations",
           "GGUF_HISTORY_KEY", "WEIGHT_SUFFIXES", "INDEX_NAME", "Producer"]

FULL_HASH_LIMIT = 1 << 30
FULL_CHECK_LIMIT = 1 << 30
PRECOPY_RESERVE = 1 << 16       # begin_copy(): room left for the new header (bytes, multiple of 4096)
_PRECOPY_MAX_THREADS = 4        # shards copied at once by begin_copy() (capped by the CPU count)


def recorded_operations(raw: str) -> list[dict]:
    """The ``operations`` list of a ``ckpt_surgeon`` history record (a JSON string in the source's
    metadata, so untrusted): parsed with limits, anything malformed read as no history."""
    try:
        obj = loads_json(raw, what="ckpt_surgeon history")
    except CkptError:
        return []
    ops = obj.get("operations") if isinstance(obj, dict) else None
    return [op for op in ops if isinstance(op, dict)] if isinstance(ops, list) else []


def _os_error(e: OSError, out: Path) -> WriteError:
    """An OSError while writing, as one WriteError naming the file and what to do."""
    where = e.filename or out
    what = e.strerror or str(e)
    hint = None
    if e.errno == errno.ENOSPC:
        hint = "free some space or write to another filesystem; nothing was written"
    elif e.errno == errno.EFBIG:
        hint = "the file size limit was reached (ulimit -f or filesystem limit); nothing was written"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = f"check write permission on {out.parent}; nothing was written"
    return WriteError(f"cannot write the output: {what}", path=where, hint=hint)


def _check_space(parent: Path, need: int) -> None:
    try:
        sv = os.statvfs(parent)
    except OSError:
        return
    free = sv.f_bavail * sv.f_frsize
    if need > free:
        raise WriteError(f"not enough free space: the output needs about {need:,} bytes, "
                         f"{free:,} are free", path=parent,
                         hint="free some space or write to another filesystem; nothing was written")


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
        self._entries: dict[str, Entry] = {}
        self._dropped: set[str] = set()
        self._config: dict | None = None
        self._files: dict[str, bytes] = {}
        self._left_out: set[str] = set()        # source side files not copied (leave_out)
        self._ops: list[dict] = []
        self._committed = False
        self._tmp: Path | None = None
        self._staging: Staging | None = None
        self._pre: dict = {}                      # shard name -> Precopy (begin_copy)
        self._pre_threads: list[threading.Thread] = []
        self._pre_cancel = threading.Event()
        self._src_tensors: dict = dict(source.stored_tensors) if source is not None else {}
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
        self._declare(Entry(name, dtype, shape, self._nbytes(dtype, shape, name), producer=data, anchor=anchor))

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
        self._declare(Entry(out_name, dtype, shape, info.nbytes, raw=info, anchor=name))

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

    def leave_out(self, relpath: str) -> None:
        """Do not copy the source's side file ``relpath`` (one that would contradict the output: a quantizer's
        config beside a dense folder)."""
        self._left_out.add(Path(relpath).as_posix())

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
        files = [f for f, _ in source_order(self.source, self._src_tensors)]
        if self.single_file and len(files) != 1:
            return False
        names = [self.out.name] if self.single_file else [os.path.basename(f) for f in files]
        with self._cleanup_on_failure():
            self._sweep_stale()
            _check_space(self.out.parent, sum(os.path.getsize(f) for f in files) + PRECOPY_RESERVE * len(files))
            self._make_tmp()
            for name, f in zip(names, files):
                hdr = st.read_header(f)
                self._pre[name] = Precopy(src=f, dst=str(self._shard_path(name)), data_start=hdr.data_start + PRECOPY_RESERVE,
                                          src_data_start=hdr.data_start, length=hdr.file_size - hdr.data_start)
        # One shard per thread: the in-kernel copy is CPU-bound (page cache to page cache), so on a
        # 2-core machine two concurrent copies take ~0.6x the time of one after the other.
        queue = collections.deque(self._pre.values())
        n = max(1, min(len(queue), os.cpu_count() or 1, _PRECOPY_MAX_THREADS))
        self._pre_threads = [threading.Thread(target=run_precopy, args=(queue, self._pre_cancel), daemon=True,
                                              name=f"ckpt-surgeon-precopy-{k}") for k in range(n)]
        for t in self._pre_threads:
            t.start()
        return True

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

    def _declare(self, e: Entry) -> None:
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
        refuse_onto_inputs(self.out, self._source_paths())     # the one rule of every output (publish.py)
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
        with self._cleanup_on_failure():
            self._sweep_stale()
            shards = self._layout()
            total = self._prepare(shards)
            hash_hex, scope = self._source_hash()
            metadata_extra = self._metadata(hash_hex, scope)
            if self._tmp is None:
                self._make_tmp()
            check_full = self.check == "full" or (self.check == "auto" and total <= FULL_CHECK_LIMIT)
            results = self._write_shards(shards, metadata_extra)
            for fname, ents, _ in shards:
                self._verify_shard(fname, ents, check_full)
            files_copied, skipped = self._write_side_files(shards)
            stage("before-rename")
            if self.before_publish is not None:
                self.before_publish()
            self._rename_into_place()
        self._committed = True
        self._pre_threads = []
        self.result = self._result(shards, results, files_copied, skipped, hash_hex, scope, check_full, t0)
        return self.result

    def _prepare(self, shards) -> int:
        """Start the background copy where it pays, check free space; returns the output's size bound."""
        if (not self._pre and self._tmp is None and len(shards) > 1
                and all(self._patchable(ents, src) for _, ents, src in shards)):
            self.begin_copy()   # values-only change: copy the shards' data in parallel threads
        total = sum(4096 + sum(e.nbytes for e in ents) for _, ents, _ in shards)
        if self._tmp is None:       # begin_copy() checked already (and its copies now use the space)
            _check_space(self.out.parent, total)
        return total

    def _write_shards(self, shards, metadata_extra) -> list[ShardResult]:
        """Every shard written and fsync'd (after all are written: the kernel flushes one shard
        while the next is copied); early copies no shard used removed."""
        results = []
        with bar(self.progress, total=sum(e.nbytes for _, ents, _ in shards for e in ents),
                 desc=f"writing {self.out.name}") as self._bar:
            for i, (fname, ents, src_file) in enumerate(shards):
                results.append(self._write_shard(i, fname, ents, src_file, metadata_extra))
        self._bar = NO_BAR
        for fname, _, _ in shards:
            fsync_path(self._shard_path(fname))
        for name, pre in list(self._pre.items()):     # early copies no output shard used
            pre.done.wait()
            if os.path.exists(pre.dst):
                os.unlink(pre.dst)
            del self._pre[name]
        return results

    def _result(self, shards, results, files_copied, skipped, hash_hex, scope, check_full, t0) -> WriteResult:
        n_raw = sum(1 for _, ents, _ in shards for e in ents if e.raw is not None)
        n_put = sum(1 for _, ents, _ in shards for e in ents if e.raw is None)
        out_names = {e.name for _, ents, _ in shards for e in ents}
        n_drop = sum(1 for n in self._src_tensors if n not in out_names) if self.source is not None else 0
        return WriteResult(
            out=str(self.out), shards=tuple(results), tensors_copied=n_raw, tensors_computed=n_put,
            tensors_dropped=n_drop, bytes_written=sum(r.bytes for r in results), files_copied=tuple(files_copied),
            skipped_files=tuple(skipped), source_hash=hash_hex, hash_scope=scope,
            check_scope="full" if check_full else "sampled", seconds=time.perf_counter() - t0)

    # -- layout --------------------------------------------------------------

    def _layout(self) -> list[tuple[str, list[Entry], str | None]]:
        """Output shards: (file name, entries in data order, source file it mirrors or None)."""
        declared = Declared(self._entries, frozenset(self._dropped), self.copy_untouched, self._raw_ok, self.FORMAT)
        return plan_shards(self.source, self._src_tensors, declared, out=self.out, single_file=self.single_file,
                           max_shard_bytes=self.max_shard_bytes)

    def _patchable(self, ents: list[Entry], src_file: str | None) -> bool:
        return patchable(ents, src_file, self._src_tensors)

    # -- hash, metadata ------------------------------------------------------

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
                hash_range(fd, 0, size if full else min(size, self._header_end(f, fd)), h)
            finally:
                os.close(fd)
        if not full:
            with FdCache() as fds:
                for info in self._changed_source_tensors():
                    h.update(f"{info.name}\0".encode())
                    hash_range(fds.get(info.file), info.start, info.end, h)
        return "sha256:" + h.hexdigest(), ("full" if full else "headers+changed")

    def _header_end(self, path: str, fd: int) -> int:
        """End of the metadata part of a file: safetensors 8 + N; GGUF: first tensor's data offset."""
        first = os.pread(fd, 8, 0)
        if first[:4] == b"GGUF":
            starts = [i.start for i in self._src_tensors.values() if i.file == path]
            return min(starts) if starts else os.fstat(fd).st_size
        return 8 + int.from_bytes(first, "little")

    def _history(self, prior_raw) -> dict:
        """The ``ckpt_surgeon`` record: version, earlier operations (from ``prior_raw``) + ours."""
        from ...version import __version__
        prior = recorded_operations(prior_raw) if isinstance(prior_raw, str) else []
        return {"version": __version__, "operations": prior + self._ops}

    def _metadata(self, hash_hex, scope) -> dict:
        base: dict = {}
        if self.source is not None and self.source.format == "safetensors":
            base = {k: v for k, v in (self.source.metadata or {}).items() if isinstance(v, str)}
        entry = self._history(base.get("ckpt_surgeon"))
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
        stage("temp-created")

    def _shard_path(self, fname: str) -> Path:
        return self._tmp / fname

    def _produce(self, e: Entry):
        """The entry's bytes; or, when its callable returns an iterator (a large tensor computed a slab at a
        time), an iterator of byte pieces, each array cast as a whole tensor would be (the writer checks that
        they add up to the declared size)."""
        data = e.producer
        if callable(data):
            data = data()
        if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) and hasattr(data, "__next__"):
            return (p if isinstance(p, (bytes, bytearray, memoryview)) else cast_to_dtype(np.asarray(p), e.dtype)
                    for p in data)
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

    def _take_precopy(self, fname, patch: bool, src_file, ents, metadata) -> bytes | None:
        """The header for a shard whose data begin_copy() already copied, or None (its early copy,
        if any, removed: the shard is written afresh)."""
        pre = self._pre.pop(fname, None)
        if pre is None:
            return None
        pre.done.wait()
        if pre.error is not None:
            raise pre.error
        pre_header = None
        if patch and pre.src == src_file:
            pre_header = header_bytes(ents, metadata, data_start=pre.data_start)
        if pre_header is None:          # not usable: start this shard afresh
            os.unlink(self._shard_path(fname))
        return pre_header

    def _write_shard(self, i: int, fname: str, ents: list[Entry], src_file: str | None, metadata: dict) -> ShardResult:
        patch = self._patchable(ents, src_file)
        pre_header = self._take_precopy(fname, patch, src_file, ents, metadata)
        flags = os.O_WRONLY if pre_header is not None else os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = os.open(self._shard_path(fname), flags, 0o644)
        try:
            if patch:
                pos = self._write_patched(fd, i, ents, src_file, metadata, pre_header)
            else:
                pos = self._write_streamed(fd, ents, metadata)
            os.ftruncate(fd, pos)
            # no fsync here: commit() fsyncs every shard after all are written, so the kernel
            # flushes one shard while the next is being copied
        finally:
            os.close(fd)
        stage(f"shard-written:{i}")
        return ShardResult(file=fname if not self.single_file else str(self.out), tensors=len(ents), bytes=pos,
                           mode="patch" if patch else "stream", changed=sum(1 for e in ents if e.raw is None))

    def _write_patched(self, fd, i, ents, src_file, metadata, pre_header) -> int:
        """Speed path: the source shard's data section copied by the kernel (or already copied by
        begin_copy()), then only the changed tensors' ranges rewritten.  Returns the file size."""
        if pre_header is not None:  # data already copied by begin_copy()
            header = pre_header
            pwrite_all(fd, header, 0)
        else:
            src_hdr = st.read_header(src_file)
            header = header_bytes(ents, metadata, congruent_to=src_hdr.data_start)
            pwrite_all(fd, header, 0)
            sfd = os.open(src_file, os.O_RDONLY)
            try:
                copy_range(sfd, fd, src_hdr.file_size - src_hdr.data_start, src_hdr.data_start, len(header))
            finally:
                os.close(sfd)
        stage(f"data-copied:{i}")
        pos = len(header)
        for e in ents:
            if e.raw is None:
                write_computed(fd, e, pos, self._produce)
            pos += e.nbytes
            self._bar.update(e.nbytes)
        return pos

    def _write_streamed(self, fd, ents, metadata) -> int:
        """Header, then every tensor in order: raw copies by range, computed ones produced one at a time."""
        header = header_bytes(ents, metadata)
        pwrite_all(fd, header, 0)
        pos = len(header)
        with FdCache() as fds:
            for e in ents:
                if e.raw is not None:
                    sfd = fds.get(e.raw.file)
                    if sfd >= 0:
                        copy_range(sfd, fd, e.nbytes, e.raw.start, pos)
                    else:   # remote / pickle source: whatever the Checkpoint can give
                        pwrite_all(fd, self.source.read_raw(e.raw.name), pos)
                else:
                    write_computed(fd, e, pos, self._produce)
                pos += e.nbytes
                self._bar.update(e.nbytes)
        return pos

    def _verify_shard(self, fname: str, ents: list[Entry], full: bool) -> None:
        verify_safetensors_shard(self._shard_path(fname), ents, full)

    # -- side files ----------------------------------------------------------

    def _write_side_files(self, shards) -> tuple[list[str], list[str]]:
        if self.single_file:
            if self._config is not None and self.source is not None and self._config != self.source.config:
                raise UnsupportedError("a single .safetensors output cannot carry the changed config.json; "
                                       "write to a folder instead (an -o path without .safetensors)", path=self.out)
            return [], []
        src_dir = Path(self.source.source) if self.source is not None and os.path.isdir(self.source.source) else None
        copied, skipped = self._copy_side_files(src_dir)
        self._declare_config(copied)
        # index: when the source had one or the output has several shards
        src_had_index = bool(self.source is not None and src_dir is not None and (src_dir / INDEX_NAME).is_file())
        if len(shards) > 1 or (src_had_index and not self.max_shard_bytes):
            meta = {}
            if src_had_index:
                meta = read_json(src_dir / INDEX_NAME).get("metadata")   # validated when the source was opened
                meta = dict(meta) if isinstance(meta, dict) else {}
            self._files[INDEX_NAME] = index_bytes(shards, meta)
        for rel, data in self._files.items():
            dst = self._tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pwrite_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            if rel not in copied:
                copied.append(rel)
        return copied, skipped

    def _copy_side_files(self, src_dir: Path | None) -> tuple[list[str], list[str]]:
        """Side files of a source folder copied into the temp output (config, tokenizer, READMEs,
        sub-folders); weight files are left behind and listed."""
        if src_dir is None or not self.copy_side_files_enabled:
            return [], []
        weight_files = {os.path.realpath(f) for f in (self.source.files if self.source is not None else ())}
        plan, skipped = side_file_plan(src_dir, weight_files,
                                       lambda rel: rel in self._files or rel in self._left_out
                                       or (rel == "config.json" and self._config is not None))
        for p, rel in plan:
            dst = self._tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            copy_file(p, dst)
        return [rel for _, rel in plan], skipped

    def _declare_config(self, copied: list[str]) -> None:
        cfg = self._config
        if cfg is None and self.source is not None and self.source.config is not None and "config.json" not in copied \
                and "config.json" not in self._files:
            cfg = self.source.config   # a single-file source with config.json beside it
        if cfg is not None:
            self._files["config.json"] = (json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()

    def _rename_into_place(self) -> None:
        # fsync'd and renamed by the publish module; a single-file OUT is the one file in the temp dir
        self._staging.publish(replace=self.force, member=self.out.name if self.single_file else None)
        self._staging, self._tmp = None, None

    @contextlib.contextmanager
    def _cleanup_on_failure(self):
        """Any failure inside removes the temp output; an OSError becomes one WriteError naming OUT."""
        try:
            yield
        except OSError as e:
            self._cleanup()
            raise _os_error(e, self.out) from None
        except BaseException:
            self._cleanup()
            raise

    def _cleanup(self) -> None:
        self._stop_precopy()
        if self._staging is not None:
            self._staging.discard()
        self._staging, self._tmp = None, None


# ----------------------------------------------------------------------------- GGUF

GGUF_HISTORY_KEY = "ckpt_surgeon.history"


def carried_kv_bytes(h, drop_key: str) -> tuple[bytes, int]:
    """The key-value pairs of GGUF header ``h`` as stored (minus ``drop_key``), and their count."""
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
    fld = h.fields.get(drop_key)
    if fld is not None:
        starts = sorted(x.offset for x in h.fields.values())
        nxt = next((o for o in starts if o > fld.offset), kv_end)
        kv = kv[: fld.offset - 24] + kv[nxt - 24:]
        count -= 1
    return kv, count


class GGUFCheckpointWriter(CheckpointWriter):
    """GGUF -> GGUF with the same API (``put`` / ``copy`` / ``drop`` / ``record``).

    The source must be a GGUF file: its key-value section is carried over byte for byte (every
    key keeps its exact type), plus one string key ``ckpt_surgeon.history`` (the same JSON as the
    safetensors ``ckpt_surgeon`` entry; an earlier one is replaced, its operations kept).  Tensor
    infos are rewritten for the output tensors (file order kept; offsets aligned to the source's
    ``general.alignment``).  Untouched tensors keep their ggml type and bytes (kernel copies of
    each tensor's byte range); ``put`` takes float values for F32/F16/BF16 tensors (biases are
    F32 in GGUF) or raw bytes of any ggml type.  Layout of the file: :mod:`.gguf` (the one
    GGUF writing path, shared with HF -> GGUF conversion).  No config.json or side files:
    set_config/add_file raise.
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
        from .. import gguf as gg
        self._src_header = gg.read_header(source.files[0])

    def _known_dtype(self, dtype: str) -> bool:
        from ..quant.ggml_types import known
        return known(dtype)

    def _nbytes(self, dtype: str, shape: tuple, name: str) -> int:
        from ..quant.ggml_types import ggml_type
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
        entry = self._history((self.source.metadata or {}).get(GGUF_HISTORY_KEY))
        entry["source"] = {"name": os.path.basename(self.source.source), "hash": hash_hex, "hash_scope": scope}
        return {"ckpt_surgeon": json.dumps(entry, sort_keys=True, default=str)}

    def _layout_gguf(self, ents, metadata) -> gw.GGUFLayout:
        """The source's key-values as stored, the history key, the output tensors' infos."""
        from ..quant.ggml_types import ggml_type
        h = self._src_header
        kv, count = carried_kv_bytes(h, GGUF_HISTORY_KEY)
        hist = gw.encode_kv(gw.KV(GGUF_HISTORY_KEY, gw.VT.STRING, metadata["ckpt_surgeon"]))
        slots = [gw.Slot(e.name, e.shape, ggml_type(e.dtype).id, e.nbytes) for e in ents]
        # no padding after the last tensor: the file ends with its data (as llama.cpp's gguf.cpp)
        return gw.layout(kv + hist, count + 1, slots, alignment=h.alignment, version=h.version, pad_end=False)

    def _write_shard(self, i, fname, ents, src_file, metadata) -> ShardResult:
        lay = self._layout_gguf(ents, metadata)
        fd = os.open(self._shard_path(fname), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pwrite_all(fd, lay.head, 0)
            sfd = os.open(self._src_header.path, os.O_RDONLY)
            try:
                for e, at in zip(ents, lay.offsets):
                    if e.raw is not None:
                        copy_range(sfd, fd, e.nbytes, e.raw.start, at)
                    else:
                        write_computed(fd, e, at, self._produce)
                    self._bar.update(e.nbytes)
                gw.write_padding(fd, lay, [e.nbytes for e in ents])
            finally:
                os.close(sfd)
            os.ftruncate(fd, lay.end)
            os.fsync(fd)
        finally:
            os.close(fd)
        stage(f"shard-written:{i}")
        return ShardResult(file=str(self.out), tensors=len(ents), bytes=lay.end, mode="stream",
                           changed=sum(1 for e in ents if e.raw is None))

    def _verify_shard(self, fname, ents, full) -> None:
        verify_gguf_file(self._shard_path(fname), ents, self._src_header, GGUF_HISTORY_KEY, full)

    def _write_side_files(self, shards):
        return [], []


def open_writer(out, source=None, **kw):
    """The writer for ``out``: GGUF when it ends in ``.gguf``, else safetensors (file or folder).
    A GGUF source is written as a GGUF only: its tensors keep GGUF names and ggml types, which no
    safetensors loader reads (issue 36: ``qkv fuse model.gguf -o folder`` wrote such a folder, or
    failed on a Q8_0 dtype)."""
    if os.fspath(out).endswith(".gguf"):
        return GGUFCheckpointWriter(out, source, **kw)
    if source is not None and getattr(source, "naming", None) == "gguf":
        src = source.files[0] if source.files else source.source
        raise UnsupportedError("is a GGUF file, so the output is a GGUF file too: give -o a path ending in .gguf "
                               f"(-o {Path(os.fspath(out)).name.removesuffix('.safetensors')}.gguf); for an HF "
                               f"folder, convert first (ckpt-surgeon convert {src} -o FOLDER) and run this on FOLDER",
                               path=src)
    return CheckpointWriter(out, source, **kw)
