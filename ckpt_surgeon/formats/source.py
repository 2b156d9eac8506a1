"""The reader protocol: what every format reader offers and :class:`~ckpt_surgeon.checkpoint.Checkpoint`
consumes.  Nothing here knows a format; the formats import this module, never the reverse.

Two levels:

* :class:`ByteSource`: where stored bytes come from.  :class:`LocalBytes` reads a local file with
  ``os.preadv``; the Hub's range reader (``formats/hub``) fetches HTTP ranges.  It counts the
  bytes (and requests) it costs.
* :class:`TensorSource`: a checkpoint's tensors over one or more files: names and infos
  (``tensors``), ``metadata``, decoded ``read``, stored ``read_bytes`` / ``read_into``, byte
  counters, ``prefetch`` and ``close``.  :class:`FileSource` is one file whose bytes come from a
  byte source (a safetensors file, a GGUF file, local or remote); :class:`ShardSet` reads several
  files as one (safetensors shards, the parts of a split GGUF).

Byte ranges: ``read_bytes`` / ``read_into`` accept any :class:`TensorInfo` whose ``[start, end)``
lies inside a listed tensor of the same file, so a caller reads rows ``a:b`` of a tensor by
passing a narrowed info (``Checkpoint.read_rows``); ``read`` decodes such a slice when it is whole
rows (a quantized GGUF row is whole blocks).

The optional members have their defaults in :class:`SourceBase` (no requests, no prefetch, no
warnings, nothing to close): a reader states what it does, and the checkpoint never probes for
attributes.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import FormatError, TruncatedError
from ..records import TensorInfo
from .safe_input import open_regular


@runtime_checkable
class ByteSource(Protocol):
    """Stored bytes of tensors, from a local file or a remote one."""

    @property
    def bytes_read(self) -> int: ...

    @property
    def requests(self) -> int: ...

    def read_into(self, info: TensorInfo, out: memoryview) -> None:
        """Bytes ``[info.start, info.end)`` of ``info.file`` into ``out`` (exactly that long)."""

    def prefetch(self, infos: Iterable[TensorInfo]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class TensorSource(Protocol):
    """A checkpoint's tensors, read lazily (see the module doc)."""

    @property
    def tensors(self) -> Mapping[str, TensorInfo]:
        """Names -> infos (numpy-order shapes, absolute byte ranges, ``file`` = one of ``files``)."""

    @property
    def metadata(self) -> Mapping: ...

    @property
    def files(self) -> tuple[str, ...]: ...

    @property
    def bytes_read(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def warnings(self) -> tuple[str, ...]: ...

    @property
    def missing_bytes(self) -> int: ...

    def read(self, info: TensorInfo) -> np.ndarray:
        """Decoded (BF16/F8 widened, GGUF dequantized), numpy shape order."""

    def read_bytes(self, info: TensorInfo) -> bytes:
        """The stored bytes."""

    def read_into(self, info: TensorInfo, out) -> None:
        """The stored bytes into a caller's writable buffer of exactly ``info.nbytes`` bytes."""

    def prefetch(self, infos: Iterable[TensorInfo]) -> None: ...

    def close(self) -> None: ...


def exact_view(out, info: TensorInfo) -> memoryview:
    """``out`` as a flat byte view, refused unless it holds exactly ``info``'s bytes."""
    mv = memoryview(out).cast("B")
    n = info.end - info.start
    if mv.nbytes != n:
        raise ValueError(f"buffer holds {mv.nbytes} bytes, tensor '{info.name}' has {n}")
    return mv


class SourceBase:
    """Defaults for a :class:`TensorSource`'s optional members.  A subclass provides ``tensors``,
    ``files``, ``bytes_read``, ``read`` and ``read_bytes``."""

    metadata: Mapping = MappingProxyType({})
    warnings: tuple[str, ...] = ()
    missing_bytes: int = 0
    requests: int = 0            # HTTP requests: local readers make none

    def read_into(self, info: TensorInfo, out) -> None:
        exact_view(out, info)[:] = self.read_bytes(info)

    def prefetch(self, infos: Iterable[TensorInfo]) -> None:
        """Local readers read one tensor at a time as cheaply as in a batch: nothing to do."""

    def close(self) -> None:
        """Nothing held open by default."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalBytes:
    """A local file read by ``os.preadv`` straight into the caller's buffer (no intermediate
    ``bytes``; one buffer can be reused for many tensors).  ``bytes_read`` starts at the header
    bytes its reader parsed."""

    requests = 0

    def __init__(self, path: str, bytes_read: int = 0):
        self.path = path
        self.bytes_read = bytes_read
        self._fd: int | None = None

    def read_into(self, info: TensorInfo, out: memoryview) -> None:
        if self._fd is None:
            self._fd = open_regular(self.path)
        n = info.end - info.start
        done = 0
        while done < n:
            got = os.preadv(self._fd, [out[done:done + min(n - done, 1 << 30)]], info.start + done)
            if not got:
                pos = info.start + done
                raise TruncatedError(f"file ended at byte {pos:,} while reading a tensor that ends at {info.end:,} "
                                     "(file changed while open?)", path=self.path, tensor=info.name,
                                     missing_bytes=info.end - pos, tensors=(info.name,))
            done += got
        self.bytes_read += n

    def prefetch(self, infos: Iterable[TensorInfo]) -> None:
        """A local file is read when asked."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):  # best effort; Checkpoint.close() is the normal path
        try:
            self.close()
        except Exception:
            pass


class FileSource(SourceBase, ABC):
    """One file's tensors: its validated ``header`` (``path``, ``tensors``, ``metadata``) and a
    :class:`ByteSource` for the stored bytes (shared by several files of one remote repo, so its
    counters are the repo's).  A format provides :meth:`decode`, and may check a tensor before its
    bytes are read (:meth:`check`)."""

    def __init__(self, header, data: ByteSource):
        self.header = header
        self.path = header.path
        self.data = data

    @property
    def tensors(self) -> Mapping[str, TensorInfo]:
        return self.header.tensors

    @property
    def metadata(self) -> Mapping:
        return self.header.metadata

    @property
    def files(self) -> tuple[str, ...]:
        return (self.path,)

    @property
    def bytes_read(self) -> int:
        return self.data.bytes_read

    @property
    def requests(self) -> int:
        return self.data.requests

    def check(self, info: TensorInfo) -> None:
        """Refuse a tensor whose bytes cannot be read (before any byte is fetched)."""

    @abstractmethod
    def decode(self, raw: np.ndarray, info: TensorInfo, **options) -> np.ndarray:
        """The stored bytes ``raw`` (a fresh uint8 array) as numbers of ``info``'s shape."""

    def read_into(self, info: TensorInfo, out) -> None:
        view = exact_view(out, info)
        self.check(info)
        self.data.read_into(info, view)

    def read_bytes(self, info: TensorInfo) -> bytes:
        buf = bytearray(info.end - info.start)
        self.read_into(info, buf)
        return bytes(buf)

    def read(self, info: TensorInfo, **options) -> np.ndarray:
        """Decoded; ``options`` go to the format's :meth:`decode` (GGUF: ``threads``)."""
        buf = np.empty(info.end - info.start, np.uint8)     # decode views it (native dtypes): no copy
        self.read_into(info, buf)
        return self.decode(buf, info, **options)

    def prefetch(self, infos: Iterable[TensorInfo]) -> None:
        self.data.prefetch(infos)

    def close(self) -> None:
        self.data.close()


def _distinct(objs) -> list:
    return list({id(o): o for o in objs}.values())


class ShardSet(SourceBase):
    """Several :class:`FileSource` s read as one: ``tensors`` is their union (a name in two files
    is refused), reads go to the part named by ``info.file``, and the byte counters are summed
    once per distinct byte source (the files of one Hub repo share one)."""

    what = "checkpoint"      # for the message about a file that is not a part

    def __init__(self, parts, *, tensors: dict | None = None, metadata: Mapping | None = None,
                 warnings: tuple[str, ...] | None = None):
        self.parts = tuple(parts)
        self._by_file = {p.path: p for p in self.parts}
        self.tensors = self._union() if tensors is None else tensors
        if metadata is None:
            metadata = {}
            for p in self.parts:
                metadata.update(p.metadata)
        self.metadata = metadata
        self.warnings = tuple(w for p in self.parts for w in p.warnings) if warnings is None else warnings

    def _union(self) -> dict:
        tensors: dict[str, TensorInfo] = {}
        for p in self.parts:
            for name, info in p.tensors.items():
                if name in tensors:
                    raise FormatError(f"tensor appears in two files ({tensors[name].file} and {p.path})",
                                      path=p.path, tensor=name)
                tensors[name] = info
        return tensors

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(p.path for p in self.parts)

    @property
    def missing_bytes(self) -> int:
        return sum(p.missing_bytes for p in self.parts)

    @property
    def bytes_read(self) -> int:
        return sum(d.bytes_read for d in _distinct(p.data for p in self.parts))

    @property
    def requests(self) -> int:
        return sum(d.requests for d in _distinct(p.data for p in self.parts))

    def part(self, info: TensorInfo) -> FileSource:
        part = self._by_file.get(info.file)
        if part is None:
            raise FormatError(f"{info.file} is not a part of this {self.what}", path=self.parts[0].path, tensor=info.name)
        return part

    def read(self, info: TensorInfo) -> np.ndarray:
        return self.part(info).read(info)

    def read_bytes(self, info: TensorInfo) -> bytes:
        return self.part(info).read_bytes(info)

    def read_into(self, info: TensorInfo, out) -> None:
        self.part(info).read_into(info, out)

    def prefetch(self, infos: Iterable[TensorInfo]) -> None:
        """One batch per byte source: a Hub repo's ranges over several files go out together."""
        batches: dict[int, tuple] = {}
        for info in infos:
            data = self.part(info).data
            batches.setdefault(id(data), (data, []))[1].append(info)
        for data, group in batches.values():
            data.prefetch(group)

    def close(self) -> None:
        for p in self.parts:
            p.close()
