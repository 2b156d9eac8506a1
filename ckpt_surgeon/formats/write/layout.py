"""Layout of a checkpoint writer's output: which tensor goes to which shard, in what order, the
safetensors header bytes, and the side files (config, index, tokenizer ...) that go with them.

Pure planning over declarations and the source's tensor index: nothing here writes data.
The rules are the writer's (see :mod:`ckpt_surgeon.formats.write.writer`, "Output shape").
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

import numpy as np

from ...errors import CkptError, UnsupportedError
from ...records import TensorInfo

__all__ = ["Entry", "Producer", "ShardResult", "WriteResult", "Shard", "header_bytes", "source_order",
           "plan_shards", "patchable", "side_file_plan", "index_bytes", "WEIGHT_SUFFIXES", "INDEX_NAME"]

ALIGN = 4096                    # data-section offset kept modulo this on the speed path
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
class Entry:
    """One output tensor as declared (mutable only in ``digest``, set when its bytes are written)."""

    name: str
    dtype: str
    shape: tuple
    nbytes: int
    raw: TensorInfo | None = None          # raw copy from this source tensor
    producer: Producer | None = None       # computed
    anchor: str | None = None              # source tensor whose slot it takes
    digest: bytes | None = None            # sha256 of the computed bytes, set when written


# (output file name, entries in data order, source file it mirrors or None)
Shard = tuple


# ----------------------------------------------------------------------------- safetensors header

def header_bytes(entries: list[Entry], metadata: dict, *, min_len: int = 0, congruent_to: int | None = None,
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
        # 8 + n == congruent_to (mod ALIGN)
        n += (congruent_to - 8 - n) % ALIGN
    else:
        n += (-(8 + n)) % 8
    return n.to_bytes(8, "little") + js + b" " * (n - len(js))


# ----------------------------------------------------------------------------- shards

def source_order(source, src_tensors: dict) -> list[tuple[str, list[TensorInfo]]]:
    """Source files (in name order) with their tensors in data order."""
    if source is None:
        return []
    by_file: dict[str, list[TensorInfo]] = {f: [] for f in source.files}
    for info in src_tensors.values():
        by_file.setdefault(info.file, []).append(info)
    # shard files in name order (model-00001-of-... first): new tensors go to the last one
    return [(f, sorted(v, key=lambda i: i.start)) for f, v in sorted(by_file.items(), key=lambda kv: os.path.basename(kv[0]))]


@dataclass(frozen=True)
class Declared:
    """What the writer was told, as the layout needs it."""

    entries: dict            # name -> Entry (put / copy)
    dropped: frozenset
    copy_untouched: bool
    raw_ok: Callable[[TensorInfo], bool]
    fmt: str                 # "safetensors" | "GGUF" (for messages)


def _groups(order, d: Declared) -> list[tuple[str, list[Entry]]]:
    """Entries grouped by the source file whose slots they take, in data order; new tensors
    without ``like`` appended to the last group."""
    anchored: dict[str, list[Entry]] = {}
    loose: list[Entry] = []
    for e in d.entries.values():
        if e.anchor is not None:
            anchored.setdefault(e.anchor, []).append(e)
        else:
            loose.append(e)
    groups: list[tuple[str, list[Entry]]] = []
    for fpath, infos in order:
        ents: list[Entry] = []
        for info in infos:
            # the source tensor itself (unless replaced, dropped or moved by like=), then the
            # tensors declared in its slot, in declaration order
            if d.copy_untouched and info.name not in d.dropped and info.name not in d.entries:
                if not d.raw_ok(info):
                    raise UnsupportedError(f"cannot copy a {info.dtype} tensor into {d.fmt} as raw bytes; "
                                           "dequantize it and put() the values", path=info.file, tensor=info.name)
                ents.append(Entry(info.name, info.dtype, tuple(info.shape), info.nbytes, raw=info, anchor=info.name))
            ents.extend(anchored.get(info.name, []))
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
    return groups


def _cut(flat: list[Entry], max_shard_bytes: int) -> list[Shard]:
    """Re-shard every ``max_shard_bytes`` (``model-00001-of-0000N.safetensors``)."""
    cut: list[list[Entry]] = [[]]
    size = 0
    for e in flat:
        if cut[-1] and size + e.nbytes > max_shard_bytes:
            cut.append([])
            size = 0
        cut[-1].append(e)
        size += e.nbytes
    if len(cut) == 1:
        return [("model.safetensors", cut[0], None)]
    n = len(cut)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", c, None) for i, c in enumerate(cut)]


def plan_shards(source, src_tensors: dict, d: Declared, *, out: Path, single_file: bool,
                max_shard_bytes: int | None) -> list[Shard]:
    """Output shards: (file name, entries in data order, source file it mirrors or None)."""
    groups = _groups(source_order(source, src_tensors), d)
    if single_file:
        src = groups[0][0] if len(groups) == 1 and source is not None else None
        return [(out.name, [e for _, ents in groups for e in ents], src)]
    if max_shard_bytes:
        return _cut([e for _, ents in groups for e in ents], max_shard_bytes)
    names = [os.path.basename(f) for f, _ in groups]
    if len(set(names)) != len(names):
        raise CkptError("source shards share a file name; pass max_shard_bytes to re-shard", path=out)
    if source is not None and source.format not in ("safetensors",):
        # e.g. a .gguf or pickle source: its file name is not a safetensors shard name
        names = ["model.safetensors"] if len(groups) == 1 else [
            f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    srcs = [f if source is not None and source.format == "safetensors" else None for f, _ in groups]
    return [(n, ents, src) for n, (_, ents), src in zip(names, groups, srcs)]


def patchable(ents: list[Entry], src_file: str | None, src_tensors: dict) -> bool:
    """Can this output shard be a kernel copy of ``src_file`` patched at the changed tensors?

    Yes when it lists the same tensors (names, dtypes, shapes, order) as the source shard, so
    every data offset is unchanged; raw entries must be copies of the same source tensor.
    """
    if not ents or src_file is None or not os.path.isfile(src_file):
        return False
    src = sorted((i for i in src_tensors.values() if i.file == src_file), key=lambda i: i.start)
    if len(src) != len(ents):
        return False
    for e, s in zip(ents, src):
        if e.name != s.name or e.dtype != s.dtype or e.shape != tuple(s.shape):
            return False
        if e.raw is not None and (e.raw.file != s.file or e.raw.start != s.start):
            return False
    return True


# ----------------------------------------------------------------------------- side files

def side_file_plan(src_dir: Path, weight_files: set, skip: Callable[[str], bool]) -> tuple[list, list]:
    """Side files of a source folder to copy, as (path, relative path), and the weight files
    left behind (relative paths).  Weight files would be stale after surgery; the index is
    rewritten; ``skip(rel)``: files the caller writes itself."""
    copy, skipped = [], []
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".ckpt-surgeon", ".git", ".cache")))
        for fn in sorted(files):
            p = Path(root) / fn
            rel = p.relative_to(src_dir).as_posix()
            if fn == INDEX_NAME or fn.endswith(WEIGHT_SUFFIXES) or os.path.realpath(p) in weight_files:
                if fn != INDEX_NAME and os.path.realpath(p) not in weight_files:
                    skipped.append(rel)
                continue
            if not skip(rel):
                copy.append((p, rel))
    return copy, skipped


def index_bytes(shards: list[Shard], meta: dict) -> bytes:
    """``model.safetensors.index.json`` for ``shards``; ``meta``: the source index's metadata."""
    meta = dict(meta)
    meta["total_size"] = sum(e.nbytes for _, ents, _ in shards for e in ents)
    if "total_parameters" in meta:     # transformers >= 5 records it; keep it true
        meta["total_parameters"] = sum(int(np.prod(e.shape, dtype=np.int64)) for _, ents, _ in shards for e in ents)
    wm = {e.name: fname for fname, ents, _ in shards for e in ents}
    return (json.dumps({"metadata": meta, "weight_map": dict(sorted(wm.items()))}, indent=2) + "\n").encode()
