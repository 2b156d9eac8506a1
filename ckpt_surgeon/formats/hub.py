"""Hugging Face Hub repos as checkpoints, read by HTTP range (nothing is downloaded whole).

``open_hub_checkpoint("Qwen/Qwen2.5-7B")`` makes, on a cold cache, one API call to
resolve the revision to a commit sha and list the files, one GET each for
``config.json`` and ``model.safetensors.index.json``, one ranged GET per shard for
its safetensors header (a second only if the size estimate was short), and later,
when ``inspect`` calls :meth:`HubReader.prefetch`, a few ranged GETs for the bias
vectors, coalesced and issued in parallel.  For Qwen2.5-7B (15.2 GB in 4 shards)
that is about 0.4 MB (see ``benchmarks/bench_hub.py``).

huggingface_hub does the Hub-specific parts: its shared HTTP session
(``get_session``: connection pool, redirects, its offline guard), the headers
(``build_hf_headers``: user agent and the token from ``HF_TOKEN`` or the stored
login; built with its telemetry off, see :func:`hub_headers`) and its error parser (``hf_raise_for_status``, which turns ``X-Error-Code``
into ``RepositoryNotFoundError`` / ``GatedRepoError`` / ...).  Its module constants
are read once at import, so ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_HOME`` and
``HF_HUB_DOWNLOAD_TIMEOUT`` are read here from the environment on every call.

Retries follow huggingface_hub's ``http_backoff`` policy (network errors and
408/429/5xx, exponential backoff capped at 8x the base) in our own loop, for three
reasons: that helper reads the whole body into memory before we could look at the
status, which is unsafe when a server ignores ``Range`` and starts sending a 4 GB
file; its streaming twin cannot retry a connection that dies in the middle of the
body; and its retry warnings go to stderr, where the CLI promises one line per
error.  Ours checks the status first (206, or 200 = Range ignored), streams the
body, and after a reset asks only for the bytes still missing.

Cache: everything fetched is kept under :func:`cache_root` keyed by repo, commit
sha and file (``models--owner--name/<sha>/files/<file>/<start>-<end>.bin``), plus
``refs/<revision>`` -> sha as in huggingface_hub's own cache.  Content at a commit
never changes, so a second ``inspect`` of a branch makes one request (to resolve
the branch), of a full sha none, and with ``HF_HUB_OFFLINE=1`` none at all.

Tokens: only ever placed in the ``authorization`` header by ``build_hf_headers``;
no message, log line or cache file built here contains a header value.
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import numpy as np

from ..errors import ConfigError, FormatError, HubError, PickleRefusedError
from ..progress import bar, progress_enabled
from ..publish import Staging, write_file_atomic
from ..records import TensorInfo
from ..version import __version__
from . import gguf as gg
from . import hf_cache
from . import safetensors as st
from .magic import decide_kind
from .safe_input import loads_json
from .source import ShardSet, TensorSource

logger = logging.getLogger(__name__)

# Two ranges closer than this are fetched as one: a gap this small costs about what a
# separate request costs in request/response headers (~1-2 KB each way, more with the
# Hub's redirect to its CDN), so merging never loses bytes-wise and saves a round trip.
MERGE_GAP = 4096
# Safetensors header read when the tensor count is unknown (no index): a 3B model's
# header is ~35 KB.  With an index we estimate the header size from the names instead.
SPECULATIVE_HEADER = 64 * 1024
# Per-tensor JSON overhead beyond the name: `"":{"dtype":"BF16","shape":[152064,3584],
# "data_offsets":[1234567890,2345678901]},` is ~80 bytes; 96 covers 5-d shapes.
_HEADER_ENTRY_OVERHEAD = 96
_HEADER_FIXED_OVERHEAD = 64        # `{"__metadata__":{"format":"pt"}}` + padding to 8
# Parallel ranged GETs: the 84 bias ranges of a 7B model take ~6 round trips instead of 84
# (benchmarks/bench_hub.py --latency-ms 50: 1.8 s cold with 16 workers, 2.4 s with 8).
MAX_WORKERS = 16
MAX_SMALL_FILE = 64 * 1024 * 1024  # config.json / index.json larger than this are refused
_MEMORY_CHUNK = 1 << 20            # fetched chunks up to this size are also kept in memory
_RETRY_STATUS = (408, 429, 500, 502, 503, 504)   # as huggingface_hub's http_backoff
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _is_true(v: str | None) -> bool:
    return (v or "").strip().upper() in {"1", "ON", "YES", "TRUE"}   # huggingface_hub.constants._is_true


def cache_root() -> Path:
    """Where fetched ranges are kept: ``$CKPT_SURGEON_CACHE``, else ``$HF_HOME/ckpt-surgeon``.

    ``HF_HOME`` is resolved as huggingface_hub does (:func:`hf_cache.hf_home`).  We do not write
    inside ``HF_HUB_CACHE`` itself: ``hf cache scan`` reports every folder there that is
    not a complete-file repo cache as corrupted, and ours holds partial files.
    """
    own = os.environ.get("CKPT_SURGEON_CACHE")
    if own:
        return Path(os.path.expandvars(os.path.expanduser(own)))
    return hf_cache.hf_home() / "ckpt-surgeon"


@dataclass(frozen=True)
class HubSettings:
    """Environment read at call time (huggingface_hub reads its constants once, at import)."""

    endpoint: str
    offline: bool
    cache: Path
    retries: int
    backoff: float
    timeout: float
    progress: bool

    @classmethod
    def from_env(cls, progress: bool | None = None) -> "HubSettings":
        from huggingface_hub import constants
        endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        # The environment now, or huggingface_hub's import-time flag (its session refuses requests then).
        offline = (_is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
                   or bool(constants.HF_HUB_OFFLINE))
        return cls(endpoint=endpoint, offline=offline, cache=cache_root(),
                   retries=int(os.environ.get("CKPT_SURGEON_HUB_RETRIES", "5")),
                   backoff=float(os.environ.get("CKPT_SURGEON_HUB_BACKOFF", "1.0")),
                   timeout=float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10),
                   progress=progress_enabled(progress))

    @property
    def endpoint_shown(self) -> str:
        """The endpoint without any ``user:password@`` part, for messages."""
        u = urlsplit(self.endpoint)
        host = u.hostname or ""
        if u.port:
            host = f"{host}:{u.port}"
        return f"{u.scheme}://{host}{u.path}" if u.scheme else self.endpoint


# --------------------------------------------------------------------------- cache


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
            sha = (self.dir / "refs" / quote(revision, safe="")).read_text().strip()
        except OSError:
            return None
        return sha if _FULL_SHA.match(sha) else None

    def set_ref(self, revision: str, sha: str) -> None:
        if revision != sha:
            self._write(self.dir / "refs" / quote(revision, safe=""), sha.encode())

    def listing(self, sha: str) -> list[str] | None:
        try:
            files = json.loads((self.dir / sha / "files.json").read_text())
        except (OSError, ValueError):
            return None
        return files if isinstance(files, list) and all(isinstance(f, str) for f in files) else None

    def set_listing(self, sha: str, files: list[str]) -> None:
        self._write(self.dir / sha / "files.json", json.dumps(files).encode())

    def store(self, sha: str, filename: str) -> "RangeStore":
        return RangeStore(self, self.dir / sha / "files" / quote(filename, safe=""))


_CHUNK = re.compile(r"^(\d+)-(\d+)\.bin$")


class RangeStore:
    """Fetched byte ranges of one remote file at one commit (memory + disk), plus its size."""

    def __init__(self, cache: RepoCache, folder: Path):
        self._cache = cache
        self.dir = folder
        self._lock = threading.Lock()
        self._chunks: list[tuple[int, int, object]] = []   # (start, end, bytes | Path)
        self.meta: dict = {}
        try:
            self.meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            self.meta = {}
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


# --------------------------------------------------------------------------- HTTP


class _Retryable(Exception):
    """A 408/429/5xx answer: worth another try."""


_AGAIN = object()   # an attempt that wants another round without counting as a failure


def _parse_content_range(value: str | None) -> tuple[int | None, int | None, int | None]:
    """``bytes a-b/total`` -> (a, b inclusive, total); ``bytes */total`` -> (None, None, total)."""
    m = re.match(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", value or "")
    if not m:
        return None, None, None
    a, b, t = m.groups()
    return (int(a) if a else None, int(b) if b else None, int(t) if t and t != "*" else None)


def coalesce(ranges, gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """Merge [start, end) ranges that overlap or lie within ``gap`` bytes of each other."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


_TELEMETRY_LOCK = threading.Lock()


def hub_headers() -> dict:
    """huggingface_hub's request headers (``build_hf_headers``: the token from ``HF_TOKEN`` or the
    stored login, our user agent), without the request its user-agent code can make.

    With telemetry on (its default), ``build_hf_headers`` detects AI-agent harnesses from a
    registry it fetches from ``ENDPOINT/api/agent-harnesses`` whenever its copy in ``HF_HOME``
    is missing, older than a day or unwritable: a second, cached ``inspect`` would then cost two
    requests instead of the one that resolves the revision.  The headers are built with
    telemetry off for this call (what ``HF_HUB_DISABLE_TELEMETRY=1`` does: the user agent keeps
    library, hf_hub and python versions, drops torch version and agent name)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    with _TELEMETRY_LOCK:
        before = constants.HF_HUB_DISABLE_TELEMETRY
        constants.HF_HUB_DISABLE_TELEMETRY = True
        try:
            return build_hf_headers(library_name="ckpt-surgeon", library_version=__version__)
        finally:
            constants.HF_HUB_DISABLE_TELEMETRY = before


class HubClient:
    """HTTP for one repo: headers, counters, ranged GETs with retries, error mapping."""

    def __init__(self, repo_id: str, settings: HubSettings, revision: str | None, *, allow_full_download: bool = False):
        self.repo_id = repo_id
        self.settings = settings
        self.revision_given = revision
        self.revision = revision or "main"
        self.sha: str | None = None
        self.allow_full_download = allow_full_download
        self.bytes_read = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._headers: dict | None = None
        self._progress = None
        self._direct: dict[str, str] = {}   # filename -> CDN URL the Hub redirected it to

    # -- bookkeeping
    def _count(self, requests: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_read += nbytes
            if self._progress is not None and nbytes:
                self._progress.update(nbytes)

    def headers(self) -> dict:
        if self._headers is None:
            self._headers = hub_headers()
        return self._headers

    @property
    def has_token(self) -> bool:
        return "authorization" in {k.lower() for k in self.headers()}

    @property
    def source(self) -> str:
        """What reports show as the source: ``owner/name``, or ``owner/name@rev`` for an explicit revision."""
        return self.repo_id if self.revision_given is None else f"{self.repo_id}@{self.revision_given}"

    def label(self, filename: str | None = None) -> str:
        return f"{self.repo_id}/{filename}" if filename else f"{self.repo_id}@{self.revision}"

    def resolve_url(self, filename: str) -> str:
        return f"{self.settings.endpoint}/{self.repo_id}/resolve/{quote(self.sha or self.revision, safe='')}/{quote(filename)}"

    def _offline_error(self, what: str) -> HubError:
        return HubError(f"{what} is not in the ckpt-surgeon cache and HF_HUB_OFFLINE=1 forbids network access",
                        path=self.label(), hint=f"run once online, or unset HF_HUB_OFFLINE; cache: {self.settings.cache}")

    # -- error mapping
    def _map_hf_error(self, e: Exception, filename: str | None = None) -> HubError:
        from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                            RemoteEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)
        ep = self.settings.endpoint_shown
        page = f"{ep}/{self.repo_id}"
        if isinstance(e, GatedRepoError):
            if self.has_token:
                return HubError("is a gated repository and your token has not been granted access to it",
                                path=self.repo_id, hint=f"request access at {page}")
            return HubError("is a gated repository and no token was given",
                            path=self.repo_id, hint=f"accept its conditions at {page}, then set HF_TOKEN or run `hf auth login`")
        if isinstance(e, RevisionNotFoundError):
            return HubError(f"revision {self.revision!r} not found", path=self.repo_id,
                            hint="give a branch, tag or commit sha that exists")
        if isinstance(e, RemoteEntryNotFoundError):
            return HubError(f"file {filename!r} not found at revision {self.revision!r}", path=self.repo_id)
        if isinstance(e, RepositoryNotFoundError):
            if self.has_token:
                return HubError(f"repository not found on {ep}, or your token cannot access it", path=self.repo_id)
            return HubError(f"repository not found on {ep}", path=self.repo_id,
                            hint="check the name; a private repository also needs a token: set HF_TOKEN or run `hf auth login`")
        if isinstance(e, OfflineModeIsEnabled):
            return self._offline_error(filename or "this revision")
        if isinstance(e, HfHubHTTPError):
            status = e.response.status_code if getattr(e, "response", None) is not None else "error"
            what = f"fetching {filename}" if filename else "resolving the revision"
            return HubError(f"HTTP {status} from {ep} while {what}", path=self.label(filename))
        first = (str(e).strip().splitlines() or [""])[0]       # one line, whatever the library wrote
        return HubError(f"{type(e).__name__} while talking to {ep}: {first}", path=self.label(filename))

    def _network_error(self, e: Exception, what: str, filename: str | None, attempts: int) -> HubError:
        import httpx2
        if isinstance(e, httpx2.ConnectError):
            reason = "could not connect"
        elif isinstance(e, httpx2.TimeoutException):
            reason = f"no answer within {self.settings.timeout:g} s"
        elif isinstance(e, _Retryable):
            reason = f"the server answered {e}"
        else:   # ReadError / RemoteProtocolError: the peer reset or closed the connection mid-body
            reason = "the connection was reset or closed mid-transfer"
        logger.debug("last network error: %r", e)
        return HubError(f"{what} from {self.settings.endpoint_shown} failed {attempts} time(s): {reason}",
                        path=self.label(filename),
                        hint="check the network and retry; CKPT_SURGEON_HUB_RETRIES sets the number of retries")

    # -- requests
    def _retrying(self, attempt, what, filename: str | None = None):
        """Run ``attempt()`` until it returns something other than ``_AGAIN``.  Network failures
        and 408/429/5xx answers are retried with exponential backoff (as huggingface_hub's
        ``http_backoff``, whose retry warnings would go to stderr through its logger: the CLI
        promises one line per error, so ours go to our logger at INFO); Hub errors are mapped
        to one-line :class:`HubError` s."""
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
        failures = 0
        while True:
            try:
                out = attempt()
                if out is not _AGAIN:
                    return out
            except (HfHubHTTPError, OfflineModeIsEnabled) as e:
                raise self._map_hf_error(e, filename) from None
            except (httpx2.NetworkError, httpx2.TimeoutException, httpx2.RemoteProtocolError, _Retryable) as e:
                failures += 1
                if failures > self.settings.retries:
                    raise self._network_error(e, what(), filename, failures) from None
                wait = min(self.settings.backoff * 2 ** (failures - 1), 8 * self.settings.backoff)
                logger.info("%s: %s; retry %d/%d in %.2fs", self.label(filename), e, failures,
                            self.settings.retries, wait)
                time.sleep(wait)

    def revision_info(self) -> tuple[str, list[str]]:
        """One API call: the commit sha the revision points to, and the repo's files at it."""
        if self.settings.offline:
            raise self._offline_error("this revision")
        from huggingface_hub.utils import get_session, hf_raise_for_status
        url = f"{self.settings.endpoint}/api/models/{self.repo_id}/revision/{quote(self.revision, safe='')}"

        def attempt():
            r = get_session().get(url, headers=self.headers(), timeout=self.settings.timeout, follow_redirects=True)
            self._count(1 + len(r.history), len(r.content))
            if r.status_code in _RETRY_STATUS:
                raise _Retryable(f"HTTP {r.status_code}")
            hf_raise_for_status(r)
            return r

        r = self._retrying(attempt, lambda: "resolving the revision")
        try:
            data = r.json()
            sha = data["sha"]
            files = [s["rfilename"] for s in data.get("siblings") or []]
        except (ValueError, KeyError, TypeError):
            raise HubError(f"{self.settings.endpoint_shown} answered the revision request with something that is not "
                           "Hub model info (no 'sha' / 'siblings')", path=self.label()) from None
        if not isinstance(sha, str) or not _FULL_SHA.match(sha):
            raise HubError(f"the Hub returned an invalid commit sha {sha!r}", path=self.label())
        return sha, files

    def _same_origin(self, url: str) -> bool:
        a, b = urlsplit(url), urlsplit(self.settings.endpoint)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)

    def _target(self, filename: str) -> tuple[str, dict, bool]:
        """(url, headers, is_direct).  After the Hub has redirected a file to its CDN once, later
        ranges of that file go straight to the CDN URL (half the requests); the token is sent
        only to the endpoint's own origin, as httpx does when it follows the redirect itself."""
        with self._lock:
            direct = self._direct.get(filename)
        if direct is None:
            return self.resolve_url(filename), self.headers(), False
        if self._same_origin(direct):
            return direct, self.headers(), True
        return direct, {k: v for k, v in self.headers().items() if k.lower() != "authorization"}, True

    def get(self, filename: str, start: int, end: int | None, *, store: RangeStore | None = None,
            whole_ok: bool = False) -> tuple[bytes, int | None]:
        """Bytes [start, end) of a file (``end=None``: to the end of the file) -> (data, file size).

        The status is checked before any body byte is read; after a failure mid-body the retry
        asks only for the bytes still missing.  A 200 answer to a Range request means the server
        ignores Range: refused unless ``allow_full_download`` or ``whole_ok`` (small files); then
        the whole file is streamed into ``store`` and the slice returned from there.
        """
        if self.settings.offline:
            raise self._offline_error(f"{filename} bytes {start}-{'' if end is None else end - 1}")
        import httpx2
        from huggingface_hub.utils import get_session, hf_raise_for_status
        got = bytearray()
        total: list = [None]

        def attempt():
            pos = start + len(got)
            if end is not None and pos >= end:
                return bytes(got), total[0]
            url, base_headers, direct = self._target(filename)
            rng = f"bytes={pos}-" if end is None else f"bytes={pos}-{end - 1}"
            hdrs = {**base_headers, "Range": rng, "Accept-Encoding": "identity"}
            with get_session().stream("GET", url, headers=hdrs, timeout=self.settings.timeout,
                                      follow_redirects=True) as r:
                self._count(1 + len(r.history))
                if direct and r.status_code in (401, 403, 404, 410):
                    # The CDN URL expired (signed URLs live about an hour): go through the Hub again.
                    with self._lock:
                        self._direct.pop(filename, None)
                    return _AGAIN
                if r.status_code == 416:   # start at or past EOF
                    total[0] = _parse_content_range(r.headers.get("Content-Range"))[2]
                    return bytes(got), total[0]
                if r.status_code == 200:
                    return self._whole_file_answer(r, filename, start, end, store, whole_ok)
                if r.status_code in _RETRY_STATUS:
                    raise _Retryable(f"HTTP {r.status_code}")
                if r.status_code != 206:
                    r.read()
                    hf_raise_for_status(r)
                    raise HubError(f"unexpected HTTP {r.status_code} for a Range request", path=self.label(filename))
                if r.history and not direct:
                    with self._lock:
                        self._direct[filename] = str(r.url)
                a, b, total[0] = _parse_content_range(r.headers.get("Content-Range"))
                want_end = end if end is None or total[0] is None else min(end, total[0])
                if a != pos or (want_end is not None and b is not None and b + 1 != want_end):
                    raise HubError(f"asked for {rng} and the server sent "
                                   f"{r.headers.get('Content-Range') or 'no Content-Range'}", path=self.label(filename))
                for chunk in r.iter_bytes():
                    got.extend(chunk)
                    self._count(0, len(chunk))
                if b is not None and start + len(got) != b + 1:
                    raise httpx2.RemoteProtocolError(f"body ended after {start + len(got) - pos} of {b + 1 - pos} bytes")
                if end is None and total[0] is not None and start + len(got) < total[0]:
                    return _AGAIN
                return bytes(got), total[0]

        return self._retrying(
            attempt, lambda: "fetching the file" if whole_ok else f"fetching bytes {start}-{'' if end is None else end - 1}",
            filename)

    def _whole_file_answer(self, r, filename, start, end, store, whole_ok):
        """A 200 to a Range request: refuse, or stream the whole file into the cache and slice it."""
        size = r.headers.get("Content-Length")
        size_txt = f"{int(size):,} bytes" if size and size.isdigit() else "of unknown size"
        if not (self.allow_full_download or whole_ok):
            raise HubError(f"the server ignored the HTTP Range request and would send the whole file ({size_txt})",
                           path=self.label(filename), hint="pass --allow-full-download to download it anyway")
        target = store.full_file_target() if store is not None else None
        if target is None:
            fd, tmp_name = tempfile.mkstemp(prefix="ckpt-surgeon-")
            os.close(fd)
            target = Path(tmp_name)
        n = 0
        with Staging(target, folder=False) as staged:
            with open(staged.path, "wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
                    n += len(chunk)
                    self._count(0, len(chunk))
            staged.publish(replace=True)
        if size and size.isdigit() and n != int(size):
            raise HubError(f"the whole-file download ended after {n:,} of {int(size):,} bytes", path=self.label(filename))
        if store is not None:
            store.add_full(target, n)
        with open(target, "rb") as f:
            f.seek(start)
            data = f.read(max(0, (n if end is None else min(end, n)) - start))
        return data, n

    def fetch_many(self, jobs: list[tuple[str, int, int, RangeStore]], desc: str, *, whole_ok: bool = False) -> None:
        """Fetch [(file, start, end, store)] in parallel and put each answer in its store.

        ``whole_ok``: a server that ignores Range may send these files whole (small files)."""
        if not jobs:
            return
        progress = bar(self.settings.progress, total=sum(b - a for _, a, b, _ in jobs), desc=f"{self.repo_id} {desc}")
        self._progress = progress

        def one(job):
            f, a, b, store = job
            data, total = self.get(f, a, b, store=store, whole_ok=whole_ok)
            if total is not None:
                store.set_meta(size=total)
            if not store.covered(a, a + len(data)):
                store.put(a, data)

        try:
            if len(jobs) == 1:
                one(jobs[0])
            else:
                with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(jobs)),
                                        thread_name_prefix="ckpt-hub") as pool:
                    futures = [pool.submit(one, j) for j in jobs]
                    try:
                        for fut in futures:
                            fut.result()
                    except BaseException:
                        for fut in futures:
                            fut.cancel()
                        raise
        finally:
            self._progress = None
            progress.close()


# --------------------------------------------------------------------------- reader


class HubRanges:
    """The byte source (:class:`~ckpt_surgeon.formats.source.ByteSource`) behind every file of a
    Hub checkpoint: ranges fetched by HTTP and kept in the cache.  One object per repo, shared by
    its files' readers, so its counters (the client's: headers, config and ranges) are counted once
    and a prefetch over several files goes out as one parallel batch."""

    def __init__(self, client: HubClient, stores: dict):
        self.client = client
        self._stores = stores   # label -> (remote filename, RangeStore)

    @property
    def bytes_read(self) -> int:
        return self.client.bytes_read

    @property
    def requests(self) -> int:
        return self.client.requests

    def read_into(self, info: TensorInfo, out: memoryview) -> None:
        filename, store = self._stores[info.file]
        data = store.get(info.start, info.end)
        if data is None:
            self.client.fetch_many([(filename, info.start, info.end, store)], "tensor")
            data = store.get(info.start, info.end)
        if data is None or len(data) != info.nbytes:
            raise HubError(f"the server sent {0 if data is None else len(data)} of the {info.nbytes} bytes of this tensor",
                           path=info.file, tensor=info.name)
        out[:] = data

    def prefetch(self, infos) -> None:
        """Fetch the data of ``infos`` now: one coalesced, parallel batch (cached ranges skipped)."""
        per_file: dict[str, list] = {}
        for info in infos:
            if info.file in self._stores and not self._stores[info.file][1].covered(info.start, info.end):
                per_file.setdefault(info.file, []).append((info.start, info.end))
        jobs = []
        for label, ranges in per_file.items():
            filename, store = self._stores[label]
            jobs += [(filename, a, b, store) for a, b in coalesce(ranges)]
        self.client.fetch_many(jobs, "tensors")

    def close(self) -> None:
        """Nothing is held open: every request is its own."""


# --------------------------------------------------------------------------- open


def _choose_weights(files: list[str], file: str | None, client: HubClient) -> tuple[str, list[str]]:
    """-> (kind, files): kind in index | safetensors | gguf | sniff."""
    fs = set(files)
    if file:
        if file not in fs:
            shown = ", ".join(sorted(f for f in files if f.endswith((".safetensors", ".gguf", ".json")))[:6])
            raise HubError(f"file {file!r} not found at revision {client.revision!r}", path=client.repo_id,
                           hint=f"files there include: {shown}" if shown else None)
        if file.endswith(".index.json"):
            return "index", [file]
        return "sniff", [file]
    if "model.safetensors.index.json" in fs:
        return "index", ["model.safetensors.index.json"]
    if "model.safetensors" in fs:
        return "safetensors", ["model.safetensors"]
    root = sorted(f for f in files if "/" not in f)
    sts = [f for f in root if f.endswith(".safetensors")]
    if sts:
        return "safetensors", sts
    ggufs = [f for f in root if f.endswith(".gguf")]
    # The parts of one split GGUF (name-00001-of-00003.gguf ...) are one model.
    groups = gg.group_gguf_names(ggufs)
    if len(groups) == 1:
        return "gguf", [groups[0][0]]
    if len(groups) > 1 and all(len(g) == 1 for g in groups):
        raise HubError(f"repository holds {len(ggufs)} GGUF files ({', '.join(ggufs[:4])}{' ...' if len(ggufs) > 4 else ''})",
                       path=client.label(), hint="pick one with --file")
    if len(groups) > 1:
        raise HubError(f"repository holds {len(groups)} GGUF models ({gg.describe_gguf_groups(groups)})",
                       path=client.label(), hint="pick one with --file; any part of a split GGUF selects all its parts")
    pickles = [f for f in root if f.endswith(_PICKLE_SUFFIXES)]
    if pickles:
        raise PickleRefusedError(f"holds only pickle weights ({pickles[0]}); they are never read remotely because "
                                 "unpickling can run arbitrary code", path=client.label(),
                                 hint="download it and convert to safetensors, or pick a safetensors/GGUF repo")
    raise HubError("no model.safetensors, sharded safetensors index or .gguf file in this repository", path=client.label())


def _estimate_header(names: list[str]) -> int:
    return 8 + _HEADER_FIXED_OVERHEAD + sum(len(n.encode()) + _HEADER_ENTRY_OVERHEAD for n in names)


def _read_small(client: HubClient, cache: RepoCache, wanted: dict[str, str]) -> dict[str, dict]:
    """Fetch small JSON files ({filename: "config" | "index"}) in one parallel batch and parse them."""
    stores = {f: cache.store(client.sha, f) for f in wanted}
    jobs = [(f, 0, MAX_SMALL_FILE + 1, s) for f, s in stores.items()
            if not (isinstance(s.meta.get("size"), int) and s.covered(0, s.meta["size"]))]
    client.fetch_many(jobs, "config", whole_ok=True)
    out = {}
    for f, what in wanted.items():
        label = client.label(f)
        size = stores[f].meta.get("size")
        data = stores[f].get(0, size) if isinstance(size, int) else None
        if data is None:
            raise HubError("was not fully received", path=label)
        if len(data) > MAX_SMALL_FILE:
            raise HubError(f"is larger than {MAX_SMALL_FILE >> 20} MB, which no {what} file is", path=label)
        exc = FormatError if what == "index" else ConfigError   # the classes local files raise
        obj = loads_json(data, path=label, error=exc, max_bytes=MAX_SMALL_FILE)
        if not isinstance(obj, dict):
            raise exc("is not a JSON object", path=label)
        out[f] = obj
    return out


def _headers(client: HubClient, cache: RepoCache, shards: dict[str, list[str] | None]) -> tuple[dict, dict]:
    """Fetch and validate the safetensors header of each shard (in parallel).

    -> ({filename: SafetensorsHeader}, {filename: RangeStore})."""
    stores = {f: cache.store(client.sha, f) for f in shards}

    def known(f):
        m = stores[f].meta
        n, size = m.get("header_len"), m.get("size")
        if isinstance(n, int) and isinstance(size, int) and stores[f].covered(0, min(size, 8 + n)):
            return stores[f].get(0, min(size, 8 + n)), size
        return None

    # Round 1: a speculative range per shard sized from its tensor names (or 64 KB).
    jobs = []
    for f, names in shards.items():
        if known(f) is None:
            est = _estimate_header(names) if names else SPECULATIVE_HEADER
            if not stores[f].covered(0, est):
                jobs.append((f, 0, est, stores[f]))
    client.fetch_many(jobs, "headers")
    # Round 2: the rest of any header longer than the estimate.
    jobs = []
    for f, names in shards.items():
        if known(f) is not None:
            continue
        size = stores[f].meta.get("size")
        head = stores[f].prefix()
        if len(head) >= 8 and isinstance(size, int):
            n = int.from_bytes(head[:8], "little")
            if n <= st.MAX_HEADER_SIZE and 8 + n <= size and len(head) < 8 + n:
                jobs.append((f, len(head), 8 + n, stores[f]))
    client.fetch_many(jobs, "headers")
    out = {}
    for f in shards:
        size = stores[f].meta.get("size")
        head = stores[f].prefix()
        if not isinstance(size, int):
            size = len(head)
        n = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
        hdr = st.parse_header_bytes(client.label(f), head[:8 + n] if len(head) >= 8 else head, size)
        stores[f].set_meta(header_len=hdr.header_len, size=size)
        out[f] = hdr
    return out, stores


def _sniff_remote(client: HubClient, cache: RepoCache, filename: str) -> str:
    store = cache.store(client.sha, filename)
    if not store.covered(0, 8):
        client.fetch_many([(filename, 0, SPECULATIVE_HEADER, store)], "header")
    size = store.meta.get("size", 64)
    head = store.get(0, min(64, size)) or store.get(0, min(8, size)) or b""
    kind = decide_kind(head, size if isinstance(size, int) else len(head), client.label(filename))
    if kind == "pickle":
        raise PickleRefusedError("is a pickle checkpoint; it is never read remotely because unpickling can run arbitrary code",
                                 path=client.label(filename), hint="download it and convert to safetensors")
    return kind


def resolve_revision(client: HubClient, cache: RepoCache) -> list[str]:
    """Set ``client.sha`` to the commit the revision points to and return the repo's files at it.

    One API call online for a branch or tag; none for a full sha already listed in the cache;
    none offline (answered from the cache, or a :class:`HubError` naming the cache)."""
    rev = client.revision
    sha = rev if _FULL_SHA.match(rev) else None
    files = cache.listing(sha) if sha else None
    if files is None:
        if client.settings.offline:
            sha = sha or cache.ref(rev)
            files = cache.listing(sha) if sha else None
            if files is None:
                raise client._offline_error("this revision")
        else:
            sha, files = client.revision_info()
            cache.set_ref(rev, sha)
            cache.set_listing(sha, files)
    client.sha = sha
    return files


@dataclass(frozen=True)
class HubOpened:
    """What a Hub repo id opens as: remote readers (``format`` ``hub-safetensors`` | ``hub-gguf``)
    with the config fetched beside the weights, or, when the Hugging Face cache holds every file
    the remote path would read, the ``local`` path to open instead (``warnings`` says so)."""

    source: str                              # owner/name, or owner/name@rev for an explicit revision
    format: str = "local"
    reader: TensorSource | None = None
    config: dict | None = None               # hub-safetensors: config.json beside the weights
    config_path: str | None = None
    warnings: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
    local: Path | None = None


def open_hub(repo_id: str, *, revision: str | None = None, file: str | None = None,
             allow_full_download: bool = False, progress: bool | None = None) -> HubOpened:
    """Open a Hub model repo, reading only headers (what ``open_checkpoint("owner/name")`` uses).

    ``revision``: branch, tag or commit sha (default ``main``); ``file``: one file to use
    (a GGUF in a GGUF repo, one .safetensors, or an index); ``allow_full_download``: accept
    a server that ignores HTTP Range; ``progress``: progress bars on stderr (default: when
    stderr is a terminal, or ``CKPT_SURGEON_PROGRESS=1``).  Tensor data is fetched lazily by
    ``read`` or in one batch by ``prefetch``.
    """
    settings = HubSettings.from_env(progress)
    client = HubClient(repo_id, settings, revision, allow_full_download=allow_full_download)
    cache = RepoCache(settings.cache, repo_id)

    # 0. offline, a snapshot in the Hugging Face cache answers without any request
    if settings.offline:
        local = _from_hf_cache(client, client.revision, file)
        if local is not None:
            return local

    # 1. revision -> commit sha and file list (no request for a cached full sha; none offline)
    files = resolve_revision(client, cache)
    local = _from_hf_cache(client, client.sha, file)   # this commit fully downloaded already: read it there
    if local is not None:
        return local

    # 2. which weights
    kind, chosen = _choose_weights(files, file, client)
    if kind == "sniff":
        kind = _sniff_remote(client, cache, chosen[0])
    if kind == "gguf":
        return _open_hub_gguf(client, cache, chosen[0], files)
    return _open_hub_safetensors(client, cache, kind, chosen, files)


def _index_shards(client: HubClient, index: str, wm, files) -> dict[str, list[str]]:
    """A remote index's weight_map checked against the repo's files -> {shard file: tensor names}."""
    index_label = client.label(index)
    if not isinstance(wm, dict) or not wm:
        raise FormatError("has no weight_map object", path=index_label)
    base = posixpath.dirname(index)
    fs = set(files)
    shards: dict[str, list[str]] = {}
    for tname, rel in wm.items():
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or ".." in rel.split("/"):
            raise FormatError(f"weight_map names {rel!r}, which is not a plain file inside the repository",
                              path=index_label, tensor=tname)
        full = posixpath.join(base, rel) if base else rel
        if full not in fs:
            raise FormatError(f"weight_map names shard {rel!r}, which does not exist at this revision",
                              path=index_label, tensor=tname)
        shards.setdefault(full, []).append(tname)
    return shards


def _open_hub_safetensors(client: HubClient, cache: RepoCache, kind: str, chosen: list[str], files) -> HubOpened:
    """Safetensors weights (one file, several, or the shards an index names) and the config beside them."""
    # config (beside the weights) and the index: one parallel round trip
    base = posixpath.dirname(chosen[0])
    cfg_name = posixpath.join(base, "config.json") if base else "config.json"
    wanted = {cfg_name: "config"} if cfg_name in files else {}
    if kind == "index":
        wanted[chosen[0]] = "index"
    small = _read_small(client, cache, wanted)
    config = small.get(cfg_name)
    wm = small[chosen[0]].get("weight_map") if kind == "index" else None
    shards = _index_shards(client, chosen[0], wm, files) if kind == "index" else {f: None for f in chosen}

    # headers (parallel, validated exactly as local files are)
    headers, stores = _headers(client, cache, shards)
    ranges = HubRanges(client, {client.label(f): (f, stores[f]) for f in shards})
    reader = ShardSet([st.SafetensorsFile(headers[f], ranges) for f in shards])
    warnings = ()
    if wm is not None:
        warnings = st.check_weight_map(reader.tensors, {client.label(f): names for f, names in shards.items()},
                                       wm, client.label(chosen[0]), same_file=str.__eq__)
    return HubOpened(client.source, "hub-safetensors", reader, config,
                     client.label(cfg_name) if config is not None else None, warnings, _hub_summary(client))


def hf_cache_target(client: HubClient, revision: str, file: str | None) -> tuple[Path, Path] | None:
    """(snapshot, path to open) when the Hugging Face cache holds every file the remote path would
    read at ``revision`` (a branch, tag or sha), as transformers' ``from_pretrained`` would use
    them; else None."""
    snap = hf_cache.snapshot_dir(client.repo_id, revision)
    if snap is None:
        return None
    try:
        kind, chosen = _choose_weights(hf_cache.listing(snap), file, client)
    except (HubError, PickleRefusedError):
        return None          # not there (or not usable) locally: the remote path decides and explains
    target = hf_cache.local_target(snap, kind, chosen)
    return None if target is None else (snap, target)


def _from_hf_cache(client: HubClient, revision: str, file: str | None) -> HubOpened | None:
    """The local path for :func:`hf_cache_target`, or None."""
    found = hf_cache_target(client, revision, file)
    if found is None:
        return None
    return HubOpened(client.source, local=found[1],
                     warnings=(f"{client.repo_id}: read from the local Hugging Face cache ({found[0]})",))


# First range of a GGUF header: the metadata holds the tokenizer (SmolLM2's 49k-token header is
# 1.8 MB, a 152k-token Qwen2.5 one ~6 MB); a short first range grows by doubling.
GGUF_FIRST_RANGE = 2 << 20
# First range of the header of a later part of a split GGUF: gguf-split writes only the three
# split.* keys and that part's tensor table there (~60 bytes per tensor: a few KB to ~100 KB).
GGUF_PART_FIRST_RANGE = 256 << 10


def _gguf_headers(client: HubClient, stores: dict, first_range: int) -> dict:
    """Fetch the GGUF headers of several files ({filename: RangeStore}) by growing ranges until
    ``gguf.parse_header`` stops asking for more; each round's ranges go out as one parallel batch.
    -> {filename: GGUFHeader}."""
    have = {f: s.prefix() for f, s in stores.items()}
    out: dict = {}
    while True:
        jobs = []
        for f, store in stores.items():
            if f in out:
                continue
            size = store.meta.get("size")
            if have[f] and isinstance(size, int):
                try:
                    out[f] = gg.parse_header(have[f], client.label(f), size)
                    continue
                except gg.NeedMoreBytes as e:
                    want = min(size, max(e.needed, 2 * len(have[f])))
            else:
                want = max(first_range, 2 * len(have[f]))
            jobs.append((f, len(have[f]), want, store))
        if not jobs:
            return out
        client.fetch_many(jobs, "header" if len(jobs) == 1 else "headers")
        for f, _, _, store in jobs:
            more = store.prefix()
            if len(more) <= len(have[f]):
                raise HubError(f"the server sent no bytes past {len(have[f]):,} while the GGUF header needs more",
                               path=client.label(f))
            have[f] = more


def _gguf_header(client: HubClient, store: RangeStore, filename: str):
    """Fetch one GGUF header by growing ranges (see :func:`_gguf_headers`)."""
    return _gguf_headers(client, {filename: store}, GGUF_FIRST_RANGE)[filename]


def _open_hub_gguf(client: HubClient, cache: RepoCache, filename: str, files=()) -> HubOpened:
    """A GGUF in a Hub repo, or, when ``filename`` is any part of a split GGUF, the whole set: the
    other parts are found by name in the file list and their headers fetched by range (a
    ``GGUF_PART_FIRST_RANGE`` range each, all at once)."""
    label = client.label(filename)
    store = cache.store(client.sha, filename)
    header = _gguf_header(client, store, filename)
    names = gg.split_part_names(posixpath.basename(filename), header)
    if names is None:
        g = gg.GGUFFile(header=header, data=HubRanges(client, {label: (filename, store)}))
    else:
        base = posixpath.dirname(filename)
        parts = [posixpath.join(base, n) if base else n for n in names]
        listed = set(files)
        for f in parts:
            if f not in listed:
                raise HubError(f"split part missing at revision {client.revision!r} (expected beside "
                               f"{posixpath.basename(filename)})", path=client.label(f))
        stores = {f: (store if f == filename else cache.store(client.sha, f)) for f in parts}
        headers = _gguf_headers(client, {f: s for f, s in stores.items() if f != filename}, GGUF_PART_FIRST_RANGE)
        headers[filename] = header
        ranges = HubRanges(client, {client.label(f): (f, stores[f]) for f in parts})
        g = gg.SplitGGUF([gg.GGUFFile(header=headers[f], data=ranges) for f in parts])
    return HubOpened(client.source, "hub-gguf", g, summary=_hub_summary(client))


def _hub_summary(client: HubClient) -> dict:
    return {"hub_repo": client.repo_id, "hub_revision": client.revision, "hub_commit": client.sha}
