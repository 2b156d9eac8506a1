"""GGUF output as one file or as llama.cpp's split set (``--split-max-size`` / ``--split-max-tensors``).

The rules are those of llama.cpp's converter (``convert_hf_to_gguf.py --split-max-size`` /
``--split-max-tensors``, through gguf-py's ``GGUFWriter``), derived from their behaviour and
checked byte for byte against it (tests/test_split_output.py):

* **Sizes**: ``N`` bytes, or ``N`` followed by ``K`` / ``M`` / ``G`` (decimal: 1000, 10^6, 10^9,
  as the converter's ``split_str_to_n_bytes``).  Anything else, zero or a negative number is
  refused in one line (the converter reads ``0`` as "no split"; here an option given is a split asked for).
* **Boundaries**: tensors are taken in file order; a new shard starts before a tensor when the
  current shard already holds ``max_tensors`` tensors, or when its tensor bytes (unpadded) plus
  this tensor's would exceed ``max_size``.  A shard always holds at least one tensor, so a tensor
  larger than ``max_size`` gets a shard of its own.
* **A small first part** (``--no-tensor-first-split``, gguf-py's ``small_first_shard``): an empty part
  comes first, holding the model's keys and no tensor, and the tensors are cut as above from part 2
  on; with neither size nor count given that is two files, the keys and the tensors.
* **Names**: ``OUT`` = ``dir/stem.gguf`` gives ``dir/stem-00001-of-0000N.gguf`` ...
  (``%s-%05d-of-%05d.gguf``, llama.cpp's ``llama_split_path``).  When the plan holds a single
  shard the file is ``OUT`` itself, without split keys (gguf-py: "Model fails split requirements,
  not splitting"), and a warning says so.
* **Metadata**: shard 1 holds every key of the model, then ``split.no`` (u16), ``split.count``
  (u16), ``split.tensors.count`` (i32); every other shard holds only those three keys.  Each shard
  is a complete GGUF: its tensor infos, offsets from its own data section, each tensor padded to
  the alignment, the file ending on an alignment boundary.

Writing goes through :func:`write_gguf_outputs`, the one path of both GGUF writers (HF -> GGUF and
GGUF -> GGUF): each shard's chunks are read back as written and the file re-parsed; only when every
shard is complete are they renamed into place, in order.  An error before that removes everything
written: no shard is left behind.  One file goes through a temp beside it (:mod:`ckpt_surgeon.publish`);
a split set through one hidden folder, which a killed run leaves for the next run of the same
conversion to resume from (:mod:`.split_resume`).

Memory: one shard open at a time, its data streamed chunk by chunk (:mod:`.gguf_stream`), so
splitting adds nothing to the bound.  Disk: the shards are the only copy written.
"""
from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import OutputExistsError, UnsupportedError
from ..formats.quant import ggml_types as GT
from ..formats.write import gguf as gw
from ..formats.gguf import DEFAULT_ALIGNMENT, parse_split_name, split_part_name
from ..formats.write.shard_io import pwrite_all, stage
from ..progress import bar
from ..publish import Staging, refuse_onto_inputs

__all__ = ["SplitRequest", "parse_split_size", "split_request", "shard_ranges", "shard_paths", "split_kv_bytes",
           "check_split_destination", "write_gguf_outputs", "SetBar", "SPLIT_SIZE_HELP"]

SPLIT_SIZE_HELP = "N bytes, or N followed by K, M or G (powers of 1000, as llama.cpp's converter)"
_UNITS = {"K": 1000, "M": 1000 ** 2, "G": 1000 ** 3}


@dataclass(frozen=True)
class SplitRequest:
    """What ``--split-max-size`` / ``--split-max-tensors`` ask (0: no limit of that kind)."""

    max_size: int = 0
    max_tensors: int = 0
    small_first: bool = False       # --no-tensor-first-split: part 1 holds the keys only

    def to_dict(self) -> dict:
        return {"max_size": self.max_size, "max_tensors": self.max_tensors, "small_first": self.small_first}


def parse_split_size(text) -> int:
    """``--split-max-size`` in bytes: ``N``, ``NK``, ``NM`` or ``NG`` (decimal units)."""
    s = str(text).strip()
    digits, unit = (s[:-1], _UNITS[s[-1]]) if s[-1:] in _UNITS else (s, 1)
    if not digits.isdigit() or not digits.isascii():
        raise UnsupportedError(f"--split-max-size {text!r} is not a size ({SPLIT_SIZE_HELP}, e.g. 4G or 500M)")
    n = int(digits) * unit
    if n <= 0:
        raise UnsupportedError(f"--split-max-size {text!r} must be positive (omit the option for one file)")
    return n


def split_request(max_size=None, max_tensors=None, small_first: bool = False) -> SplitRequest | None:
    """The request the options make, or None when none is given."""
    if max_size is None and max_tensors is None and not small_first:
        return None
    size = parse_split_size(max_size) if max_size is not None else 0
    if max_tensors is not None:
        if isinstance(max_tensors, bool) or not isinstance(max_tensors, int) or max_tensors <= 0:
            raise UnsupportedError(f"--split-max-tensors {max_tensors!r} must be a positive whole number of tensors")
    return SplitRequest(size, int(max_tensors or 0), bool(small_first))


def shard_ranges(sizes: Sequence[int], req: SplitRequest | None) -> list[tuple[int, int]]:
    """``[start, stop)`` tensor index ranges of the shards, by gguf-py's rule (module docstring)."""
    first = [(0, 0)] if req is not None and req.small_first else []
    if not sizes:
        return first + [(0, 0)]
    ranges, start, held = first, 0, 0
    for i, n in enumerate(sizes):
        if req is not None and i > start and (
                (req.max_tensors and i - start >= req.max_tensors) or (req.max_size and held + n > req.max_size)):
            ranges.append((start, i))
            start, held = i, 0
        held += n
    ranges.append((start, len(sizes)))
    return ranges


def shard_paths(out: Path, count: int) -> list[Path]:
    """The file of each shard: ``OUT`` itself for one, else ``stem-0000i-of-0000n.gguf`` beside it."""
    if count == 1:
        return [out]
    stem = out.name[:-len(".gguf")] if out.name.endswith(".gguf") else out.name
    return [out.with_name(split_part_name(stem, i, count)) for i in range(count)]


def split_kv_bytes(no: int, count: int, total: int) -> bytes:
    """The three split keys of shard ``no``, with gguf-py's / gguf-split's types."""
    return gw.encode_kvs([gw.KV("split.no", gw.VT.UINT16, no), gw.KV("split.count", gw.VT.UINT16, count),
                          gw.KV("split.tensors.count", gw.VT.INT32, total)])


def _existing_parts(out: Path) -> list[Path]:
    stem = out.name[:-len(".gguf")] if out.name.endswith(".gguf") else out.name
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    return sorted(out.parent / n for n in names if (p := parse_split_name(n)) is not None and p[0] == stem)


def check_split_destination(out: Path, sources: list[str], force: bool) -> None:
    """Before any work: a split output whose parts (any count) already exist is refused without ``force``."""
    parts = _existing_parts(out)
    for p in parts:
        refuse_onto_inputs(p, sources)
    if parts and not force:
        raise OutputExistsError(f"split output already exists ({len(parts)} part file(s) named "
                                f"{parts[0].name} ...)", path=str(out), hint="pass --force to replace them")


@dataclass(frozen=True)
class _Shard:
    path: Path
    plan: tuple
    layout: gw.GGUFLayout


def _layouts(out: Path, kv: bytes, kv_count: int, plan: Sequence, req: SplitRequest | None, alignment: int,
             version: int) -> list[_Shard]:
    ranges = shard_ranges([p.nbytes for p in plan], req)
    paths = shard_paths(out, len(ranges))
    shards = []
    for i, ((a, b), path) in enumerate(zip(ranges, paths)):
        part = tuple(plan[a:b])
        slots = [gw.Slot(p.dst, p.shape, GT.ggml_type(p.ggml_type).id, p.nbytes) for p in part]
        if len(ranges) == 1:
            head_kv, count = kv, kv_count
        else:
            own = split_kv_bytes(i, len(ranges), len(plan))
            head_kv, count = (kv + own, kv_count + 3) if i == 0 else (own, 3)
        shards.append(_Shard(path, part, gw.layout(head_kv, count, slots, alignment=alignment, version=version)))
    return shards


class SetBar:
    """One bar over the whole set: bytes (tqdm's rate and ETA), plus ``tensor k/N`` and the shard."""

    def __init__(self, progress, plan: Sequence, out: Path, shards: int):
        verb = "quantizing + writing" if any(GT.ggml_type(p.ggml_type).quantized for p in plan) else "writing"
        self._bar = bar(progress, total=sum(p.nbytes for p in plan), desc=f"{verb} {out.name}")
        self._ends, total = [], 0
        for p in plan:
            total += p.nbytes
            self._ends.append(total)
        self._done, self._shard, self._shards = 0, 0, shards

    def at_shard(self, i: int) -> None:
        self._shard = i

    def update(self, n: int) -> None:
        self._done += n
        post = getattr(self._bar, "set_postfix_str", None)
        if post is not None:
            shard = f", shard {self._shard + 1}/{self._shards}" if self._shards > 1 else ""
            post(f"tensor {bisect_right(self._ends, self._done)}/{len(self._ends)}{shard}", refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()


WriteData = Callable[[int, Sequence, Sequence[int], object], list]
Verify = Callable[[Path, Path, Sequence, list, bool], None]


def write_gguf_outputs(out: Path, kv: bytes, kv_count: int, plan: Sequence, write_data: WriteData, *,
                       verify: Verify | None, req: SplitRequest | None = None, progress=False,
                       alignment: int = DEFAULT_ALIGNMENT,
                       version: int = gw.GGUF_VERSION, warnings: list | None = None,
                       inputs: Sequence[str] = ()) -> list[Path]:
    """Write ``plan`` (records with ``dst``, ``shape``, ``ggml_type``, ``nbytes``) as ``out`` or
    as its split set; returns the files written, in order.

    ``kv`` / ``kv_count``: the model's key-value section as stored.  ``write_data(fd, part, offsets,
    bar)`` writes the part's tensor data at its offsets and returns its chunks;
    ``verify(tmp, final, part, chunks, first)`` checks one written shard (``first``: it carries the
    model's keys).  Every shard is published only after all are written and verified.  A split
    set goes through :mod:`.split_resume` (``inputs``: the files read, part of the fingerprint
    that lets a rerun reuse the parts a killed run finished)."""
    shards = _layouts(out, kv, kv_count, plan, req, alignment, version)
    if req is not None and len(shards) == 1 and warnings is not None and len(plan) > 1:
        warnings.append("the split options leave the whole model in one shard: written as one file, without "
                        "split keys (as llama.cpp's converter)")
    wbar = SetBar(progress, plan, out, len(shards))
    if len(shards) > 1:
        from .split_resume import write_resumable

        def one(tmp, sh, i):
            _write_shard(tmp, sh, write_data, verify, wbar, first=i == 0)
        try:
            reused = write_resumable(out, shards, inputs, one, wbar)
        finally:
            wbar.close()
        if reused and warnings is not None:
            warnings.append(f"resumed: {len(reused)} of {len(shards)} parts finished by an interrupted run were "
                            "checked (size and CRC-32 of every byte) and kept")
        return [sh.path for sh in shards]
    stagings: list[Staging] = []
    try:
        for i, sh in enumerate(shards):
            stagings.append(Staging(sh.path, folder=False))
            wbar.at_shard(i)
            _write_shard(stagings[-1].path, sh, write_data, verify, wbar, first=i == 0)
            stage(f"shard-written:{i}")
        wbar.close()
        stage("before-rename")
        _publish_all(stagings)
    except BaseException:
        wbar.close()
        for s in stagings:
            s.discard()
        raise
    return [sh.path for sh in shards]


def _write_shard(tmp: Path, sh: _Shard, write_data: WriteData, verify: Verify | None, wbar, *, first: bool) -> None:
    fd = os.open(tmp, os.O_RDWR)     # read too: each chunk is read back as written
    try:
        stage("temp-created")        # the writer's stages (formats/write/writer.py): the crash tests pause here
        pwrite_all(fd, sh.layout.head, 0)
        stage("header-written")      # a partial file: header, no tensor data yet
        # padding before the data: a padding range wrongly computed over data would be overwritten
        # by it, and the data is what each chunk's readback checks
        gw.write_padding(fd, sh.layout, [p.nbytes for p in sh.plan])
        chunks = write_data(fd, sh.plan, sh.layout.offsets, wbar)
        os.ftruncate(fd, sh.layout.end)
    finally:
        os.close(fd)
    if verify is not None:
        verify(tmp, sh.path, sh.plan, chunks, first)


def _publish_all(stagings: list[Staging]) -> None:
    """Rename every shard into place (the destinations were checked before any work); a failure
    midway removes the ones already renamed, so a set is never left half published."""
    done: list[Path] = []
    try:
        for s in stagings:
            s.publish(replace=True)
            done.append(s.dest)
    except BaseException:
        for p in done:
            try:
                os.unlink(p)
            except OSError:
                pass
        raise
