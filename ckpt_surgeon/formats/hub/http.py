"""HTTP to the Hub for one repo: headers, counters, ranged GETs with retries, error mapping.

huggingface_hub does the Hub-specific parts: its shared HTTP session
(``get_session``: connection pool, redirects, its offline guard), the headers
(``build_hf_headers``: user agent and the token from ``HF_TOKEN`` or the stored
login; built with its telemetry off, see :func:`hub_headers`) and its error parser (``hf_raise_for_status``, which turns ``X-Error-Code``
into ``RepositoryNotFoundError`` / ``GatedRepoError`` / ...).  The environment is read on every
call (:mod:`.settings`).

Retries follow huggingface_hub's ``http_backoff`` policy (network errors and
408/429/5xx, exponential backoff capped at 8x the base) in our own loop, for three
reasons: that helper reads the whole body into memory before we could look at the
status, which is unsafe when a server ignores ``Range`` and starts sending a 4 GB
file; its streaming twin cannot retry a connection that dies in the middle of the
body; and its retry warnings go to stderr, where the CLI promises one line per
error.  Ours checks the status first (206, or 200 = Range ignored), streams the
body, and after a reset asks only for the bytes still missing.

Tokens: only ever placed in the ``authorization`` header by ``build_hf_headers``;
no message, log line or cache file built here contains a header value.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit

from ...errors import HubError
from ...progress import bar
from ...publish import Staging
from ...version import __version__
from .range_cache import RangeStore
from .settings import FULL_SHA, HubSettings

logger = logging.getLogger("ckpt_surgeon.formats.hub")   # one logger for the Hub (messages as before the split)

# Two ranges closer than this are fetched as one: a gap this small costs about what a
# separate request costs in request/response headers (~1-2 KB each way, more with the
# Hub's redirect to its CDN), so merging never loses bytes-wise and saves a round trip.
MERGE_GAP = 4096
# Parallel ranged GETs: the 84 bias ranges of a 7B model take ~6 round trips instead of 84
# (benchmarks/bench_hub.py --latency-ms 50: 1.8 s cold with 16 workers, 2.4 s with 8).
MAX_WORKERS = 16
_RETRY_STATUS = (408, 429, 500, 502, 503, 504)   # as huggingface_hub's http_backoff


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
        # Offline, both caches are read (the Hugging Face one first: hub.open_hub), so both are named.
        from .hf_cache import hub_cache
        return HubError(f"{what} is in neither the ckpt-surgeon cache nor the Hugging Face cache, and HF_HUB_OFFLINE=1 "
                        "forbids network access", path=self.label(),
                        hint=f"run once online, or unset HF_HUB_OFFLINE; caches: {self.settings.cache} (ckpt-surgeon), "
                             f"{hub_cache()} (Hugging Face)")

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
        if isinstance(e, httpx2.ConnectError) and self.requests == 0:
            # Never reached the endpoint (no route, refused, no DNS): offline, or SOURCE was meant as a
            # local path.  Said at once: retrying a machine with no network costs seconds for nothing.
            return HubError(f"{what} from {self.settings.endpoint_shown} failed: could not connect (offline?); "
                            "it is not a local file or folder either", path=self.label(filename),
                            hint="check the path, or the network; HF_HUB_OFFLINE=1 reads the caches only")
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
                if failures > self.settings.retries or (isinstance(e, httpx2.ConnectError) and self.requests == 0):
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
        if not isinstance(sha, str) or not FULL_SHA.match(sha):
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
                b, total[0] = self._checked_content_range(r, filename, pos, end, rng)
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

    def _checked_content_range(self, r, filename: str, pos: int, end: int | None,
                               rng: str) -> tuple[int | None, int | None]:
        """A 206 answer's Content-Range must start at ``pos`` and end where ``rng`` asked (or at
        the end of the file) -> (its last byte, the file size)."""
        a, b, total = _parse_content_range(r.headers.get("Content-Range"))
        want_end = end if end is None or total is None else min(end, total)
        if a != pos or (want_end is not None and b is not None and b + 1 != want_end):
            raise HubError(f"asked for {rng} and the server sent "
                           f"{r.headers.get('Content-Range') or 'no Content-Range'}", path=self.label(filename))
        return b, total

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
