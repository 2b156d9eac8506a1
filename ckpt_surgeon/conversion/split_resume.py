"""Resuming a killed split conversion at part granularity (issue 33 item 4).

A split set is written part by part into one hidden folder beside the output,
``.<OUT name>.ckpt-surgeon-parts/`` (its own lock file held for the run's whole life, so two
runs never share it).  Each finished part -- written, every chunk read back, re-parsed -- is
fsync'd, renamed into that folder under its final name and recorded in ``state.json`` with its
size and CRC-32 and the set's fingerprint.  When every part is there they are renamed into place,
in order, and the folder is removed.

* **Killed** (SIGKILL, OOM, power loss): the folder stays.  The next run of the same conversion
  (same fingerprint: every part's header block -- keys, tensor names, types, shapes, offsets --
  and each input file's path, size and modification time) takes the lock, **checks** each
  recorded part (size, and the CRC-32 of its bytes read again) and keeps it, then writes from the
  first part that is missing or fails the check.  A different conversion into the same output
  clears the folder first.
  Ctrl-C counts as a kill: the finished parts stay.
* **Failed** (an error: a bad tensor, a full disk, a part that does not read back): the folder
  is removed with everything in it, as every writer does; nothing is left.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Callable, Sequence

from ..errors import OutputExistsError
from ..formats.write.shard_io import stage
from ..publish import fsync_path, write_file_atomic

__all__ = ["PartsDir", "fingerprint", "parts_dir"]

_TAG = ".ckpt-surgeon-parts"


def parts_dir(out: Path) -> Path:
    return out.parent / f".{out.name}{_TAG}"


def fingerprint(heads: Sequence[bytes], inputs: Sequence[str]) -> str:
    """What must be equal for a finished part to be reused: the parts' header blocks and the inputs."""
    h = hashlib.sha256()
    for head in heads:
        h.update(len(head).to_bytes(8, "little") + head)
    for p in inputs:
        try:
            st = os.stat(p)
            h.update(f"{os.path.realpath(p)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        except OSError:
            h.update(f"{p}\0missing\0".encode())
    return h.hexdigest()


def _crc_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


class PartsDir:
    """The locked hidden folder of one split output (see the module doc)."""

    def __init__(self, out: Path, fp: str):
        self.path = parts_dir(out)
        self.fp = fp
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise OutputExistsError("another conversion is writing this output now", path=str(out)) from None
        self.state = self._load()

    def _load(self) -> dict:
        try:
            state = json.loads((self.path / "state.json").read_text())
        except (OSError, ValueError):
            state = None
        if not isinstance(state, dict) or state.get("fingerprint") != self.fp or not isinstance(state.get("parts"), dict):
            for p in self.path.iterdir():                    # another conversion's parts: not ours to reuse
                if p.name != "lock":
                    p.unlink()
            state = {"fingerprint": self.fp, "parts": {}}
        return state

    def finished(self, name: str) -> bool:
        """Whether part ``name`` was finished by an earlier run and its bytes check out."""
        rec = self.state["parts"].get(name)
        p = self.path / name
        if not isinstance(rec, dict) or not p.is_file():
            return False
        if p.stat().st_size != rec.get("size") or _crc_file(p) != rec.get("crc"):
            self.state["parts"].pop(name, None)
            return False
        return True

    def temp(self, name: str) -> Path:
        p = self.path / f"{name}.partial"
        if p.exists():
            p.unlink()
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return p

    def keep(self, name: str) -> None:
        """Part ``name`` is complete and checked: fsync'd, renamed into place in the folder, recorded."""
        tmp, final = self.path / f"{name}.partial", self.path / name
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(self.path)
        self.state["parts"][name] = {"size": final.stat().st_size, "crc": _crc_file(final)}
        write_file_atomic(self.path / "state.json", json.dumps(self.state).encode())

    def publish(self, dests: Sequence[Path]) -> None:
        """Rename every part to its destination (in order), then remove the folder; a rename refused
        midway takes back the ones already renamed."""
        done: list[Path] = []
        try:
            for d in dests:
                os.replace(self.path / d.name, d)
                done.append(d)
            fsync_path(dests[0].parent)
        except BaseException:
            for d in done:
                os.replace(d, self.path / d.name)
            raise
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def write_resumable(out: Path, shards: Sequence, inputs: Sequence[str], write_one: Callable, wbar) -> list[int]:
    """Write the parts of ``shards`` (each with ``path``, ``layout``, ``plan``) through a
    :class:`PartsDir`: ``write_one(tmp, shard, i)`` writes and checks part ``i`` into ``tmp``.
    Returns the indices of the parts reused from a killed run."""
    parts = PartsDir(out, fingerprint([sh.layout.head for sh in shards], inputs))
    reused = []
    try:
        for i, sh in enumerate(shards):
            wbar.at_shard(i)
            if parts.finished(sh.path.name):
                reused.append(i)
                wbar.update(sum(p.nbytes for p in sh.plan))
                stage(f"shard-reused:{i}")
                continue
            write_one(parts.temp(sh.path.name), sh, i)
            parts.keep(sh.path.name)
            stage(f"shard-written:{i}")
        stage("before-rename")
        parts.publish([sh.path for sh in shards])
    except Exception:
        parts.remove()          # a failure: nothing is left
        raise
    except BaseException:
        parts.close()           # Ctrl-C: the finished parts stay for the next run, as after a kill
        raise
    return reused
