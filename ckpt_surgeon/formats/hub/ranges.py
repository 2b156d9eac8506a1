"""Hugging Face Hub repos as checkpoints, read by HTTP range (nothing is downloaded whole).

``open_checkpoint("Qwen/Qwen2.5-7B")`` (:func:`open_hub`) makes, on a cold cache, one API call to
resolve the revision to a commit sha and list the files, one GET each for
``config.json`` and ``model.safetensors.index.json``, one ranged GET per shard for
its safetensors header (a second only if the size estimate was short), and later,
when ``inspect`` calls :meth:`HubRanges.prefetch`, a few ranged GETs for the bias
vectors, coalesced and issued in parallel.  For Qwen2.5-7B (15.2 GB in 4 shards)
that is about 0.4 MB (see ``benchmarks/bench_hub.py``).

This module is the reader: which weights a repo holds, their headers (validated exactly as
local files are, by the same safetensors and GGUF readers over :class:`HubRanges`), and
GGUF on the Hub.  Beside it: the environment (:mod:`.settings`), the on-disk range cache
(:mod:`.range_cache`) and the HTTP client with its retries (:mod:`.http`).
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, FormatError, HubError, PickleRefusedError
from ...records import TensorInfo
from .. import gguf as gg
from . import hf_cache
from .. import safetensors as st
from .range_cache import RangeStore, RepoCache
from .http import MERGE_GAP, HubClient, coalesce  # noqa: F401  (MERGE_GAP: public, with coalesce)
from .settings import FULL_SHA, HubSettings, cache_root  # noqa: F401  (cache_root: public, docs/hub.md)
from ..magic import decide_kind
from ..safe_input import loads_json
from ..source import ShardSet, TensorSource

# Safetensors header read when the tensor count is unknown (no index): a 3B model's
# header is ~35 KB.  With an index we estimate the header size from the names instead.
SPECULATIVE_HEADER = 64 * 1024
# Per-tensor JSON overhead beyond the name: `"":{"dtype":"BF16","shape":[152064,3584],
# "data_offsets":[1234567890,2345678901]},` is ~80 bytes; 96 covers 5-d shapes.
_HEADER_ENTRY_OVERHEAD = 96
_HEADER_FIXED_OVERHEAD = 64        # `{"__metadata__":{"format":"pt"}}` + padding to 8
MAX_SMALL_FILE = 64 * 1024 * 1024  # config.json / index.json larger than this are refused
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


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


def _fetch_whole(client: HubClient, cache: RepoCache, filename: str) -> bytes:
    """One small file of the repo, whole (at most MAX_SMALL_FILE bytes), through the range cache."""
    store = cache.store(client.sha, filename)
    if not (isinstance(store.meta.get("size"), int) and store.covered(0, store.meta["size"])):
        client.fetch_many([(filename, 0, MAX_SMALL_FILE + 1, store)], "tokenizer", whole_ok=True)
    size = store.meta.get("size")
    data = store.get(0, size) if isinstance(size, int) else None
    if data is None:
        raise HubError("was not fully received", path=client.label(filename))
    if len(data) > MAX_SMALL_FILE:
        raise HubError(f"is larger than {MAX_SMALL_FILE >> 20} MB, which no tokenizer file is",
                       path=client.label(filename))
    return data


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
    sha = rev if FULL_SHA.match(rev) else None
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
    side_files: object = None                # hub-safetensors: the tokenizer files beside the weights (RemoteFiles)


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
    from ..side_files import RemoteFiles
    side = RemoteFiles(client.label(base) if base else client.source, files,
                       lambda name: _fetch_whole(client, cache, name), base)
    return HubOpened(client.source, "hub-safetensors", reader, config,
                     client.label(cfg_name) if config is not None else None, warnings, _hub_summary(client),
                     side_files=side)


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
