"""Shard I/O for the writers: kernel copies of byte ranges, positional writes, hashing, the
background pre-copy of whole data sections, and the stage hook the crash tests pause at.

Nothing here knows a file format: callers pass offsets and lengths.
"""
from __future__ import annotations

import collections
import errno
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CkptError, WriteError
from ..safe_input import open_regular

__all__ = ["STAGE_OBSERVERS", "stage", "copy_range", "pwrite_all", "hash_range", "copy_file",
           "FdCache", "Precopy", "run_precopy", "write_computed"]

CHUNK = 16 << 20                # userspace copy chunk when copy_file_range is unavailable
PRECOPY_CHUNK = 256 << 20       # cancellation granularity of the background copy

# Called with each stage's name (writer module doc); the crash tests register a pause here.
STAGE_OBSERVERS: list = []


def stage(name: str) -> None:
    for observe in STAGE_OBSERVERS:
        observe(name)


def copy_range(src_fd: int, dst_fd: int, length: int, src_off: int, dst_off: int) -> None:
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
            buf = os.pread(src_fd, min(length, CHUNK), src_off)
            if not buf:
                raise WriteError(f"source ended while copying ({length} bytes short at offset {src_off})")
            n = 0
            while n < len(buf):
                n += os.pwrite(dst_fd, memoryview(buf)[n:], dst_off + n)
        length -= n
        src_off += n
        dst_off += n


def pwrite_all(fd: int, data: bytes | memoryview, off: int) -> None:
    mv = memoryview(data).cast("B")
    while len(mv):
        n = os.pwrite(fd, mv, off)
        mv = mv[n:]
        off += n


def hash_range(fd: int, start: int, end: int, h=None):
    h = h or hashlib.sha256()
    pos = start
    while pos < end:
        buf = os.pread(fd, min(end - pos, CHUNK), pos)
        if not buf:
            break
        h.update(buf)
        pos += len(buf)
    return h


def copy_file(src: Path, dst: Path) -> None:
    """Copy a side file (new ``dst``), fsync'd."""
    sfd = open_regular(src, what="side file")      # a FIFO among the side files would block the copy
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            copy_range(sfd, fd, os.fstat(sfd).st_size, 0, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(sfd)


def write_computed(fd: int, e, at: int, produce) -> None:
    """Write a computed entry's bytes (``produce(e)``: the bytes, or an iterator of pieces written one after
    the other) at ``at`` and remember their sha256 in ``e.digest`` for the reread check; the bytes are dropped
    right after (a piece once written)."""
    raw = produce(e)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        e.digest = hashlib.sha256(raw).digest()
        pwrite_all(fd, raw, at)
        return
    h, n = hashlib.sha256(), 0
    for piece in raw:
        if n + len(piece) > e.nbytes:
            break
        h.update(piece)
        pwrite_all(fd, piece, at + n)
        n += len(piece)
    else:
        if n == e.nbytes:
            e.digest = h.digest()
            return
    raise CkptError(f"computed more or fewer bytes than {e.dtype}{list(e.shape)} needs ({e.nbytes})", tensor=e.name)


class FdCache:
    """Read-only descriptors of source files, opened once each; -1 for a path that is not a local
    file (a remote or pickle source: read through the Checkpoint instead)."""

    def __init__(self):
        self._fds: dict[str, int] = {}

    def get(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY) if os.path.isfile(path) else -1
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Precopy:
    """One source shard's data section being copied ahead of time (``CheckpointWriter.begin_copy``)."""

    src: str
    dst: str
    data_start: int              # where the data section starts in dst
    src_data_start: int
    length: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _precopy_one(job: Precopy, cancel: threading.Event) -> None:
    fd = os.open(job.dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        sfd = os.open(job.src, os.O_RDONLY)
        try:
            done = 0
            while done < job.length and not cancel.is_set():
                n = min(job.length - done, PRECOPY_CHUNK)
                copy_range(sfd, fd, n, job.src_data_start + done, job.data_start + done)
                done += n
            if done < job.length:
                job.error = WriteError("cancelled")
        finally:
            os.close(sfd)
    finally:
        os.close(fd)


def run_precopy(queue: collections.deque, cancel: threading.Event) -> None:
    """Worker thread: take jobs off the shared ``queue`` until it is empty.

    Workers share the queue (deque.popleft is atomic); the writer waits on each job's own event,
    so it never depends on which worker took a job.  Errors are kept on the job and raised by
    the writer in the caller's thread.
    """
    while True:
        try:
            job = queue.popleft()
        except IndexError:
            return
        try:
            if cancel.is_set():
                job.error = WriteError("cancelled")
            else:
                _precopy_one(job, cancel)
        except BaseException as e:      # reported by commit, in the caller's thread
            job.error = e
        finally:
            job.done.set()
