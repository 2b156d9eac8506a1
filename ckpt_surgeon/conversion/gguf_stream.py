"""Streaming the tensor data of a planned HF -> GGUF conversion, in bounded memory.

The GGUF header (key-values, tensor infos, offsets) is known before any data is read
(:mod:`ckpt_surgeon.formats.write.gguf`, the one GGUF writing path), so every tensor's bytes can
go straight to their offset.  Each planned tensor is cut into chunks of whole rows (about
:data:`CHUNK_ELEMS` values; Q/K row permutations cut on head boundaries, GPT-2's transposed
Conv1D weights taken whole).  The main thread reads the chunks in file order (one sequential
stream over the source); a small thread pool decodes, transforms, encodes, hashes and
``pwrite``\\ s each chunk at its offset (numpy, zlib and pwrite release the GIL, so the cores
work in parallel).  At most ``2 x workers`` chunks are in flight, so memory stays bounded by a
few chunks whatever the model size — never a whole tensor, except Conv1D weights.

Every chunk's bytes are checksummed (CRC-32) when written.  With ``readback``, the worker reads
its chunk back right after writing it (still in the page cache, so the check costs a memory copy,
not a second pass over the disk) and compares; :func:`verify_chunks` then checks the arithmetic
that rules out a later write landing on it (every written range disjoint, each tensor's chunks
covering exactly its data range as parsed back).  Without ``readback`` it rereads the whole file
(in parallel too).  Rereading 15 GB after writing it is not the same check made later: on a
machine whose page cache cannot hold source and output, it reads the output back from the disk,
which on the 7B shape cost ~9 s of a ~30 s f16 conversion (docs/architecture.md).
"""
from __future__ import annotations

import collections
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..errors import FormatError
from ..formats import safetensors as st
from ..formats.quant.block_repack import q4_0_rows, repack_rows
from ..formats.quant.quantize import bf16_bits_to_f16, encode_rows
from ..formats.write.shard_io import pwrite_all
from . import kept_blocks
from .transforms import lookup

__all__ = ["Chunk", "write_tensor_data", "verify_chunks", "verify_written", "CHUNK_ELEMS"]

CHUNK_ELEMS = 1 << 21              # values per chunk: 8 MB as f32, the largest temporary
_MAX_WORKERS = 4                   # float / q8_0 outputs: the stream is read- and write-bound
# llama.cpp's k-quant / IQ kernels are CPU-bound (Q4_K ~16 M values per CPU-second here): one worker
# per core, as llama-quantize runs one thread per core (std::thread::hardware_concurrency), up to
# this many; 2 x workers chunks of ~13 MB in flight keep 16 workers near 0.4 GB
_MAX_KERNEL_WORKERS = 16
_RAW_DTYPES = ("F32", "F16", "BF16")   # read as stored bytes and decoded in the worker
# each planned tensor's transform record (.transforms) says how it may be cut: ``rows`` (a chunk of
# rows is transformed alone), ``heads`` (perm_q / perm_k act within heads: chunks are cut on head
# boundaries) or ``whole`` (conv1d's transpose, the fused-QKV reorders of BLOOM / GPT-NeoX move rows
# across the whole tensor); and whether it only moves values (BF16 -> F16 then skips float32)


def _workers(plan=()) -> int:
    """Worker threads for ``plan``: one per core up to :data:`_MAX_KERNEL_WORKERS` when a tensor goes
    through llama.cpp's kernels (ctypes releases the GIL for the call), else up to :data:`_MAX_WORKERS`."""
    kernel = any(getattr(p, "ggml_type", "F32") not in ("F32", "F16", "BF16", "Q8_0") for p in plan)
    return max(1, min(_MAX_KERNEL_WORKERS if kernel else _MAX_WORKERS, os.cpu_count() or 1))


def _digest(data, crc: int = 0) -> int:
    # CRC-32 per chunk (a few MB): the check is against our own mistakes (an offset, a length, a
    # chunk written over another) and I/O errors, not an adversary, and zlib's CRC runs several
    # times faster than a cryptographic hash (it is on the critical path twice: when writing and
    # when rereading), releasing the GIL like the rest of a worker's job.
    return zlib.crc32(data, crc)


@dataclass(frozen=True)
class Chunk:
    """Bytes written for one chunk of one tensor: ``[start, end)`` of the output file."""

    tensor: str
    start: int
    end: int
    digest: int                  # CRC-32 of the bytes


def _row_ranges(p, shape: tuple, hp: dict) -> list[tuple[int, int, int, int]]:
    """(row start, row stop, heads in the chunk or 0, output bytes) over the source rows
    (``shape``: the source tensor's) of planned tensor ``p``."""
    rows = shape[0] if shape else 1
    whole = [(0, rows, 0, p.nbytes)]
    rec = lookup(p.transform)
    if len(shape) < 2 or rec.chunking == "whole":
        return whole
    cols = int(np.prod(shape[1:]))
    per_row = p.nbytes // rows              # row-wise transforms keep the row count
    if rec.chunking == "heads":
        n_head = hp[rec.needs[0]]
        if rows % n_head or (rows // n_head) % 2:
            return whole                    # the transform refuses it, with the whole tensor's numbers
        hd = rows // n_head
        step = max(1, CHUNK_ELEMS // (hd * cols))          # heads per chunk
        return [(h * hd, min(h + step, n_head) * hd, min(h + step, n_head) - h, (min(h + step, n_head) - h) * hd * per_row)
                for h in range(0, n_head, step)]
    step = max(1, CHUNK_ELEMS // max(1, cols))
    return [(a, min(a + step, rows), 0, (min(a + step, rows) - a) * per_row) for a in range(0, rows, step)]


def _source_ranges(ck, p, hp: dict) -> list[tuple[int, int, int, int]]:
    """:func:`_row_ranges`, except for a quantized HF weight (FP8 blocks, GPTQ ...): its reader
    dequantizes the whole tensor for any row range, so it is read once, whole (memory: that one
    tensor as float32; time: one dequantization, not one per chunk)."""
    q = getattr(ck, "quantization", None)
    shape = _src_shape(ck, p)
    if getattr(p, "kept", ""):          # FP4 blocks repacked from the stored codes, row range by row range
        return _row_ranges(p, shape, hp)
    if q is not None and getattr(p, "data", None) is None and p.src in q.tensors \
            and not ck.reader.rows_readable(p.src):    # (FP4 / MX weights dequantize row range by row range)
        return [(0, shape[0] if shape else 1, 0, p.nbytes)]
    return _row_ranges(p, shape, hp)


def _parts(p) -> tuple:
    """A stacked expert tensor (``p.stacked``: the HF tensors in expert order) is written expert
    after expert: stacking on a new leading axis concatenates their bytes, in every type (a Q8_0
    block never crosses a row).  Any other planned tensor is its own single part."""
    stacked = getattr(p, "stacked", ())
    if not stacked:
        return (p,)
    n = len(stacked)
    im = getattr(p, "imatrix", None)
    ne0 = p.shape[-1]
    # each expert quantized with its own slice of the importance matrix (llama-quant.cpp imatrix_for_row)
    return tuple(replace(p, src=t, stacked=(), shape=tuple(p.shape[1:]), nbytes=p.nbytes // n,
                         imatrix=None if im is None else im[i * ne0:(i + 1) * ne0])
                 for i, t in enumerate(stacked))


class _Job:
    """One chunk: its source (stored bytes or decoded values), where it goes, how to make it."""

    __slots__ = ("p", "heads", "at", "nbytes", "src", "info", "first")

    def __init__(self, p, heads, at, nbytes, src, info, first=0):
        self.p, self.heads, self.at, self.nbytes, self.src, self.info = p, heads, at, nbytes, src, info
        self.first = first          # the chunk's first source row (an expert index for a 3-D tensor)


def _src_shape(ck, p) -> tuple:
    return tuple(p.shape) if getattr(p, "data", None) is not None else tuple(ck.tensors[p.src].shape)


def _read(ck, p, a: int, b: int):
    """Rows a:b of ``p``'s source in the main thread: the stored bytes for float safetensors
    (decoded by the worker), else the decoded values (a tensor made by the converter: its own)."""
    if getattr(p, "data", None) is not None:
        return np.frombuffer(p.data, np.float32).reshape(p.shape)[a:b], None
    if getattr(p, "kept", ""):
        return kept_blocks.read_rows(ck, p.src, a, b), None
    info = ck.tensors[p.src]
    rows = info.shape[0] if info.shape else 1
    if ck.format == "safetensors" and info.dtype in _RAW_DTYPES and not info.quantized:   # a quantized weight: its values
        per_row = info.nbytes // max(rows, 1)
        buf = np.empty((b - a) * per_row, np.uint8)
        ck.read_rows_into(p.src, a, b, buf)
        return buf, (replace(info, shape=(b - a,) + tuple(info.shape[1:])) if info.shape else info)
    if (a, b) == (0, rows):
        return ck.read(p.src), None
    return ck.read_rows(p.src, a, b), None


def _run(job: _Job, fd: int, hp: dict, transform: Callable, labels: tuple[str, str], readback: bool) -> Chunk:
    p = job.p
    if getattr(p, "kept", ""):
        data = q4_0_rows(*job.src) if p.kept == "Q4_0" else repack_rows(p.kept, *job.src)
        job.src = None
        return _write(job, fd, data, labels, readback)
    rec = lookup(p.transform)
    bits = job.info is not None and job.info.dtype == "BF16" and p.ggml_type == "F16" and rec.moves_only
    if bits:            # move the stored bfloat16 bits, convert them at the end (bf16_bits_to_f16)
        arr = job.src.view(np.uint16).reshape(job.info.shape)
    else:
        arr = st.decode(job.src, job.info) if job.info is not None else job.src
    job.src = None
    if job.heads:       # a whole number of heads: permute within them, as over the whole tensor
        hp = dict(hp, n_head=job.heads, n_head_kv=job.heads)
    if rec.stored_bytes:
        data = np.ascontiguousarray(arr).view(np.uint8)
    else:
        arr = transform(arr, p.transform, hp, path=labels[0], tensor=p.src)
        data = bf16_bits_to_f16(arr) if bits else encode_rows(arr, p.ggml_type, getattr(p, "imatrix", None),
                                                              job.first)
    del arr
    return _write(job, fd, data, labels, readback)


def _write(job: _Job, fd: int, data: np.ndarray, labels: tuple[str, str], readback: bool) -> Chunk:
    p = job.p
    if data.nbytes != job.nbytes:  # a bug here would corrupt every following offset
        raise FormatError(f"encoded {data.nbytes} bytes, planned {job.nbytes}", path=labels[1], tensor=p.dst)
    mv = memoryview(data).cast("B")
    chunk = Chunk(p.dst, job.at, job.at + job.nbytes, _digest(mv))
    pwrite_all(fd, mv, job.at)
    if readback and not _check_one(fd, chunk):
        raise FormatError("bytes read back differ from the bytes written", path=labels[1], tensor=p.dst)
    return chunk


def write_tensor_data(fd: int, ck, plan, offsets, hp: dict, transform: Callable, *, labels: tuple[str, str],
                      progress=None, workers: int | None = None, readback: bool = False) -> list[Chunk]:
    """Write every planned tensor's data at its offset; returns the chunks written, in order.

    ``transform(arr, kind, hp, path=, tensor=)``: HF values -> GGUF values (numpy order), applied
    per chunk (row-wise transforms) or per tensor (``conv1d``).  ``labels``: (source, output) paths
    for messages.  ``progress``: a bar (``update(n)``).  ``readback``: each chunk is read back
    and compared as soon as it is written (``fd`` must be open for reading too).
    """
    workers = workers or _workers(plan)
    done: list[Chunk] = []
    pending: collections.deque = collections.deque()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-surgeon-gguf")

    def collect_oldest():
        c = pending.popleft().result()
        done.append(c)
        if progress is not None:
            progress.update(c.end - c.start)

    try:
        for planned, off in zip(plan, offsets):
            at = off
            for p in _parts(planned):
                for a, b, heads, nbytes in _source_ranges(ck, p, hp):
                    src, info = _read(ck, p, a, b)
                    pending.append(pool.submit(_run, _Job(p, heads, at, nbytes, src, info, a), fd, hp, transform,
                                               labels, readback))
                    del src
                    at += nbytes
                    while len(pending) >= 2 * workers:
                        collect_oldest()
        while pending:
            collect_oldest()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
    return done


_READBACK = 1 << 20     # read back in 1 MiB pieces, into one buffer per worker thread
_local = threading.local()


def _check_one(fd: int, c: Chunk) -> bool:
    buf = getattr(_local, "buf", None)
    if buf is None:         # once per thread: no allocation per chunk beside the chunk's own buffers
        buf = _local.buf = memoryview(bytearray(_READBACK))
    crc, pos = 0, c.start
    while pos < c.end:
        got = os.preadv(fd, [buf[:min(c.end - pos, _READBACK)]], pos)
        if not got:
            return False
        crc = _digest(buf[:got], crc)
        pos += got
    return crc == c.digest


def _disjoint(chunks: list[Chunk], label: str) -> None:
    ordered = sorted(chunks, key=lambda c: c.start)
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            raise FormatError(f"written ranges overlap ({a.tensor} ends at {a.end}, this one starts at {b.start})",
                              path=label, tensor=b.tensor)


def verify_chunks(path, chunks: list[Chunk], tensors: dict, *, label: str, workers: int | None = None,
                  reread: bool = True) -> None:
    """Check the written file: the chunks of each tensor cover exactly its data range as parsed
    back (``tensors``: name -> TensorInfo), no two written ranges overlap, and (``reread``) every
    chunk's bytes, read again, hash to what was written (skip it only when each chunk was read
    back as it was written: ``write_tensor_data(readback=True)``)."""
    span: dict[str, list[int]] = {}
    for c in chunks:
        lo_hi = span.setdefault(c.tensor, [c.start, c.start])
        if c.start != lo_hi[1]:
            raise FormatError("written chunks are not contiguous", path=label, tensor=c.tensor)
        lo_hi[1] = c.end
    for name in set(span) | set(tensors):
        info, (lo, hi) = tensors.get(name), span.get(name, (None, None))
        if info is None or (info.start, info.end) != (lo, hi):
            raise FormatError("tensor data range differs from the plan after writing", path=label, tensor=name)
    _disjoint(chunks, label)
    if not reread:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=workers or _workers()) as pool:
            for c, ok in zip(chunks, pool.map(lambda c: _check_one(fd, c), chunks)):
                if not ok:
                    raise FormatError("bytes read back differ from the bytes written", path=label, tensor=c.tensor)
    finally:
        os.close(fd)


def verify_written(tmp, out, tensors, chunks, *, architecture: str | None = None) -> None:
    """Re-parse the written file ``tmp`` with our validated GGUF reader (every offset, size and
    alignment checked), compare each planned tensor's type and shape (``tensors``: records with
    ``dst``, ``ggml_type``, ``shape``) and the chunks' bytes (each read back as written) with the
    plan; ``architecture``: the ``general.architecture`` it must carry.  ``out``: the name in messages."""
    from ..errors import CkptError
    from ..formats.gguf import GGUFFile
    try:
        g = GGUFFile(tmp)
    except CkptError as e:
        raise FormatError(f"the written file does not parse ({e.detail})", path=str(out)) from None
    try:
        got = g.tensors
        if len(got) != len(tensors):
            raise FormatError(f"wrote {len(got)} tensors, planned {len(tensors)}", path=str(out))
        for p in tensors:
            info = got.get(p.dst)
            if info is None or info.missing or info.dtype != p.ggml_type or tuple(info.shape) != tuple(p.shape):
                raise FormatError("tensor info differs from the plan after writing", path=str(out), tensor=p.dst)
        verify_chunks(tmp, chunks, got, label=str(out), reread=False)    # each chunk was read back as written
        if architecture is not None and g.metadata.get("general.architecture") != architecture:
            raise FormatError("general.architecture did not survive writing", path=str(out))
    finally:
        g.close()
