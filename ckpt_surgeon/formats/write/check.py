"""Reread checks of what a writer wrote, before anything is published.

Every output header is parsed and validated again by the readers; names, dtypes and shapes must
match what was declared; every computed tensor's bytes must hash to what was written; raw
copies are compared with the source (all bytes, or three windows each: start, middle, end).
"""
from __future__ import annotations

import os

from ...errors import WriteError
from .. import gguf as gg
from .. import safetensors as st
from .shard_io import FdCache, hash_range

__all__ = ["check_written_entry", "verify_safetensors_shard", "verify_gguf_file"]

WINDOW = 64 << 10              # sampled check window


def check_written_entry(fd: int, g, e, path: str, src_fd: int | None, full: bool) -> None:
    """Reread check of one written tensor ``g`` (as parsed back) against its declaration ``e``.

    dtype and shape must match; a computed tensor's bytes must hash to what was written; a
    copied tensor's bytes must equal the source's (all of them with ``full``, else three
    windows: start, middle, end).  ``src_fd`` None: the source file is gone, nothing to compare.
    """
    if g.dtype != e.dtype or tuple(g.shape) != e.shape:
        raise WriteError(f"reread check failed: written as {g.dtype}{list(g.shape)}, declared "
                         f"{e.dtype}{list(e.shape)}", path=path, tensor=e.name)
    if e.raw is None:
        if hash_range(fd, g.start, g.end).digest() != e.digest:
            raise WriteError("reread check failed: the computed tensor's bytes differ from what was written",
                             path=path, tensor=e.name)
        return
    if src_fd is None:
        return
    if full:
        same = hash_range(fd, g.start, g.end).digest() == hash_range(src_fd, e.raw.start, e.raw.end).digest()
    else:
        n = e.nbytes
        spots = {0, max(0, n // 2 - WINDOW // 2), max(0, n - WINDOW)}
        same = all(os.pread(fd, min(WINDOW, n - s), g.start + s)
                   == os.pread(src_fd, min(WINDOW, n - s), e.raw.start + s) for s in spots)
    if not same:
        raise WriteError("reread check failed: copied bytes differ from the source", path=path, tensor=e.name)


def _check_names(path, got, ents) -> None:
    if [g.name for g in got] != [e.name for e in ents]:
        raise WriteError("reread check failed: the written header lists other tensors than declared", path=path)


def verify_safetensors_shard(path, ents: list, full: bool) -> None:
    got = list(st.read_header(path).tensors.values())
    _check_names(path, got, ents)
    fd = os.open(path, os.O_RDONLY)
    try:
        with FdCache() as src_fds:
            for g, e in zip(got, ents):
                sfd = None
                if e.raw is not None and os.path.isfile(e.raw.file):
                    sfd = src_fds.get(e.raw.file)
                check_written_entry(fd, g, e, path, sfd, full)
    finally:
        os.close(fd)


def verify_gguf_file(path, ents: list, src_header, history_key: str, full: bool) -> None:
    """A GGUF written from ``src_header``'s file: same tensors as declared, the history key
    present, every carried-over key with its type, and the tensors' bytes as above."""
    hdr = gg.read_header(path)
    got = list(hdr.tensors.values())
    _check_names(path, got, ents)
    if dict(hdr.metadata).get(history_key) is None:
        raise WriteError("reread check failed: the history key is missing", path=path)
    for key in src_header.metadata:
        if key != history_key and hdr.fields[key].type != src_header.fields[key].type:
            raise WriteError(f"reread check failed: metadata key {key} changed type", path=path)
    fd = os.open(path, os.O_RDONLY)
    sfd = os.open(src_header.path, os.O_RDONLY)
    try:
        for g, e in zip(got, ents):
            check_written_entry(fd, g, e, path, sfd, full)
    finally:
        os.close(fd)
        os.close(sfd)
