"""The on-disk cache of what was fetched from the Hub by range.

Everything fetched is kept under :func:`~.settings.cache_root` keyed by repo, commit
sha and file (``models--owner--name/<sha>/files/<file>/<start>-<end>.bin``), plus
``refs/<revision>`` -> sha as in huggingface_hub's own cache.  Content at a commit
never changes, so a second ``inspect`` of a branch makes one request (to resolve
the branch), of a full sha none, and with ``HF_HUB_OFFLINE=1`` none at all.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from urllib.parse import quote

from ...errors import CkptError
from ...publish import write_file_atomic
from .settings import FULL_SHA
from ..safe_input import read_json, read_regular

logger = logging.getLogger("ckpt_surgeon.formats.hub")   # one logger for the Hub (messages as before the split)

_MEMORY_CHUNK = 1 << 20            # fetched chunks up to this size are also kept in memory


# Cache files are read like any untrusted input (formats/safe_input.py: regular files only, JSON
# with size / depth / number limits); one that is missing, corrupt or hostile is a cache miss:
# it is fetched again and rewritten.
_MAX_REF = 4096
_MAX_META = 1 << 20
_MAX_LISTING = 64 << 20            # a repo listing (the largest Hub repos list ~100k files)


def _cached_json(path: Path, max_bytes: int):
    """Parsed JSON of a cache file, or None (missing, unreadable, not JSON, past the limits)."""
    try:
        return read_json(path, max_bytes=max_bytes, require_object=False)
    except (CkptError, OSError):
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    """Temp beside ``path`` + rename (:mod:`ckpt_surgeon.publish`): a reader never sees half a chunk,
    and two processes writing the same chunk (same bytes: content at a commit is immutable) both win."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(path, data)


class RepoCache:
    """On-disk cache of one repo: ``refs/<rev>`` -> sha, ``<sha>/files.json``, ``<sha>/files/<file>/``."""

    def __init__(self, root: Path, repo_id: str):
        self.dir = root / ("models--" + repo_id.replace("/", "--"))
        self.writable = True

    def _write(self, path: Path, data: bytes) -> bool:
        """Best effort: a read-only cache must not stop an inspect, it only costs requests next time."""
        if not self.writable:
            return False
        try:
            _atomic_write(path, data)
            return True
        except OSError as e:
            self.writable = False
            logger.warning("cache %s is not writable (%s); continuing without caching", self.dir, e.strerror or e)
            return False

    def ref(self, revision: str) -> str | None:
        try:
            sha = read_regular(self.dir / "refs" / quote(revision, safe=""), max_bytes=_MAX_REF).decode().strip()
        except (CkptError, OSError, UnicodeDecodeError):
            return None
        return sha if FULL_SHA.match(sha) else None

    def set_ref(self, revision: str, sha: str) -> None:
        if revision != sha:
            self._write(self.dir / "refs" / quote(revision, safe=""), sha.encode())

    def listing(self, sha: str) -> list[str] | None:
        files = _cached_json(self.dir / sha / "files.json", _MAX_LISTING)
        return files if isinstance(files, list) and all(isinstance(f, str) for f in files) else None

    def set_listing(self, sha: str, files: list[str]) -> None:
        self._write(self.dir / sha / "files.json", json.dumps(files).encode())

    def store(self, sha: str, filename: str) -> "RangeStore":
        return RangeStore(self, self.dir / sha / "files" / quote(filename, safe=""))


_CHUNK = re.compile(r"^(\d+)-(\d+)\.bin$")


_MAX_FILE_SIZE = 1 << 50       # 1 PiB: no remote file is larger; a larger "size" is not ours


def _checked_meta(meta) -> dict:
    """meta.json as written by :meth:`RangeStore.set_meta`, with every value the readers use
    type- and range-checked: a size or header length that is not a whole number in range is
    dropped (so that file's ranges are fetched again), as a corrupt cache file is a cache miss."""
    if not isinstance(meta, dict):
        return {}
    out = dict(meta)
    for key in ("size", "header_len"):
        v = out.get(key)
        if key in out and not (type(v) is int and 0 <= v <= _MAX_FILE_SIZE):
            del out[key]
    if "full" in out and type(out["full"]) is not bool:
        del out["full"]
    return out


class RangeStore:
    """Fetched byte ranges of one remote file at one commit (memory + disk), plus its size."""

    def __init__(self, cache: RepoCache, folder: Path):
        self._cache = cache
        self.dir = folder
        self._lock = threading.Lock()
        self._chunks: list[tuple[int, int, object]] = []   # (start, end, bytes | Path)
        self.meta: dict = _checked_meta(_cached_json(folder / "meta.json", _MAX_META))
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        for n in names:
            m = _CHUNK.match(n)
            if m:
                self._chunks.append((int(m.group(1)), int(m.group(2)), folder / n))
        if self.meta.get("full") and (folder / "full").is_file() and isinstance(self.meta.get("size"), int):
            self._chunks.append((0, self.meta["size"], folder / "full"))

    def set_meta(self, **kw) -> None:
        with self._lock:
            if all(self.meta.get(k) == v for k, v in kw.items()):
                return
            self.meta.update(kw)
            data = json.dumps(self.meta).encode()
        self._cache._write(self.dir / "meta.json", data)

    def covered(self, a: int, b: int) -> bool:
        return self._plan(a, b) is not None

    def _plan(self, a: int, b: int):
        """Chunks that together cover [a, b), or None.  Greedy: at each position take the chunk
        reaching furthest."""
        with self._lock:
            chunks = list(self._chunks)
        pos, plan = a, []
        while pos < b:
            best = None
            for c in chunks:
                if c[0] <= pos < c[1] and (best is None or c[1] > best[1]):
                    best = c
            if best is None:
                return None
            plan.append((pos, min(b, best[1]), best))
            pos = min(b, best[1])
        return plan

    def get(self, a: int, b: int) -> bytes | None:
        if b <= a:
            return b""
        plan = self._plan(a, b)
        if plan is None:
            return None
        out = bytearray()
        for lo, hi, (cs, ce, src) in plan:
            if isinstance(src, (bytes, bytearray)):
                out += src[lo - cs:hi - cs]
                continue
            try:   # a disk chunk: trust it only if its length is what its name says
                with open(src, "rb") as f:
                    if os.fstat(f.fileno()).st_size != ce - cs:
                        raise OSError("chunk has the wrong size")
                    f.seek(lo - cs)
                    piece = f.read(hi - lo)
            except OSError:
                with self._lock:
                    self._chunks = [c for c in self._chunks if c[2] != src]
                return self.get(a, b)
            if len(piece) != hi - lo:
                return None
            out += piece
        return bytes(out)

    def put(self, a: int, data: bytes) -> None:
        if not data:
            return
        b = a + len(data)
        path = self.dir / f"{a}-{b}.bin"
        on_disk = self._cache._write(path, data)
        with self._lock:
            # Small chunks (headers, biases) stay in memory too; big ones (whole weights read through a
            # hub Checkpoint) are read back from disk so memory does not grow with the model.
            self._chunks.append((a, b, path if on_disk and len(data) > _MEMORY_CHUNK else bytes(data)))

    def prefix(self) -> bytes:
        """The longest cached prefix [0, k) of the file."""
        with self._lock:
            chunks = sorted(self._chunks, key=lambda c: c[0])
        pos = 0
        for a, b, _ in chunks:
            if a <= pos < b:
                pos = b
        size = self.meta.get("size")
        if isinstance(size, int):
            pos = min(pos, size)
        return self.get(0, pos) or b""

    def full_file_target(self) -> Path | None:
        """Where a whole-file download goes (None when the cache is not writable)."""
        if not self._cache.writable:
            return None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return self.dir / "full"

    def add_full(self, path: Path, size: int) -> None:
        with self._lock:
            self._chunks.append((0, size, path))
        if path.parent == self.dir:
            self.set_meta(size=size, full=True)
