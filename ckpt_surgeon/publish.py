"""Publishing outputs atomically: temp beside the destination, fsync, rename; stale temps removed.

Every writer (the checkpoint writer, HF -> GGUF conversion, the Hub cache, ``--output`` reports)
goes through :class:`Staging`:

1. **Temp beside the destination**, named ``.<dest name>.ckpt-surgeon-<pid>-<random>.tmp``, in
   the destination's own folder: ``rename`` is atomic only within one filesystem, so a reader
   sees either the old destination or the complete new one, never half of it.
2. **fsync** every file and folder written, then **rename** (``os.replace`` for a file; for a
   folder that replaces an old one, the old one is renamed aside to ``....old`` first and removed
   after the new one is in place), then fsync the parent folder so the rename itself is durable.
3. **Stale temps are removed by the next write to the same destination.**  A run killed by
   SIGKILL, OOM or power loss cannot clean up after itself, so its temp stays behind (1.7 GB after
   13 killed conversions, in one audit).  huggingface_hub has the same problem with downloads: it
   writes ``<blob>.incomplete`` while holding a file lock and renames it when complete, and the next
   download of that file takes the lock and deals with the ``.incomplete`` a killed process left
   (``file_download.py``, ``_download_to_tmp_and_move``).  We do the same with the temp itself: its
   owner holds an exclusive ``flock`` on it for its whole life.  The kernel releases the lock when
   the owner dies, however it dies, so the next :class:`Staging` for the same destination removes
   every temp whose lock it can take.  A PID alone could not decide this: PIDs are reused
   (containers restart them from 1) and a killed process that nobody reaped is a zombie that
   ``kill(pid, 0)`` still reports as alive.  The one window where a live temp is unlocked (between
   creating it and locking it, microseconds) is covered by the PID: a temp is removed only when its
   lock is free *and* its owner is not running or the temp is older than :data:`GRACE_SECONDS`.
"""
from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from .errors import OutputExistsError, RefusedError, WriteError

TAG = "ckpt-surgeon"
GRACE_SECONDS = 60.0
# .<dest>.ckpt-surgeon-<pid>-<hex>.tmp | .old; the writer's earlier ".<dest>.ckpt-surgeon-<pid>-old" too
_NAME = re.compile(r"^\.(?P<dest>.+)\." + TAG + r"-(?P<pid>\d+)(?:-[0-9a-f]+\.(?:tmp|old)|-old)$")


def fsync_path(p: str | os.PathLike) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and folder under ``root`` and ``root`` itself."""
    for dirpath, dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                fsync_path(p)
        for d in dirs:
            fsync_path(os.path.join(dirpath, d))
    fsync_path(root)


def _owner_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (killed but not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def sweep_stale(dest: str | os.PathLike) -> list[str]:
    """Remove the temps that killed runs left beside ``dest`` (see the module doc); returns their names."""
    dest = Path(dest)
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return []
    removed = []
    for n in names:
        m = _NAME.match(n)
        if m is None or m["dest"] != dest.name:
            continue
        p = dest.parent / n
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not _lock(fd):
                continue                      # its owner is alive and holds it
            young = time.time() - os.fstat(fd).st_mtime < GRACE_SECONDS
            if young and _owner_running(int(m["pid"])):
                continue                      # just created, not locked yet
            _remove(p)
            removed.append(n)
        finally:
            os.close(fd)
    return removed


def _link_new(src: Path, dest: Path) -> bool:
    """Publish a file without ever clobbering: ``link`` fails if ``dest`` appeared since the check
    (``rename`` would replace it).  False on a filesystem without hard links (then the caller's
    check-then-replace is the best there is)."""
    try:
        os.link(src, dest)
    except FileExistsError:
        raise OutputExistsError("appeared while writing; pass --force to replace it", path=dest) from None
    except OSError:
        return False
    os.unlink(src)
    return True


class Staging:
    """A temp file or folder beside ``dest``, locked by this process until published or discarded.

    ``with Staging(dest, folder=True) as s:`` write into ``s.path``, then ``s.publish()``; leaving
    the block with an exception (or without publishing) removes the temp.
    """

    def __init__(self, dest: str | os.PathLike, *, folder: bool, mode: int | None = None):
        self.dest = Path(dest)
        self.folder = folder
        sweep_stale(self.dest)
        self.path = self.dest.parent / f".{self.dest.name}.{TAG}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        if folder:
            os.mkdir(self.path, 0o755 if mode is None else mode)
        else:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644 if mode is None else mode))
        self._fd: int | None = os.open(self.path, os.O_RDONLY)
        _lock(self._fd)

    # -- publish ---------------------------------------------------------------

    def publish(self, *, replace: bool, member: str | None = None) -> None:
        """fsync and rename the temp (or, with ``member``, the one file of that name inside the temp
        folder) to ``dest``.  ``replace=False``: a ``dest`` that appeared meanwhile is an
        OutputExistsError and nothing is published."""
        if os.path.lexists(self.dest) and not replace:
            raise OutputExistsError("appeared while writing; pass --force to replace it", path=self.dest)
        if member is not None or not self.folder:
            src = self.path / member if member is not None else self.path
            fsync_path(src)
            if replace or not _link_new(src, self.dest):
                os.replace(src, self.dest)
            fsync_path(self.dest.parent)
            self.discard()
            return
        fsync_tree(self.path)
        old = None
        if os.path.lexists(self.dest):
            old = self.dest.parent / f".{self.dest.name}.{TAG}-{os.getpid()}-{secrets.token_hex(4)}.old"
            os.rename(self.dest, old)
        os.rename(self.path, self.dest)
        self._release()
        fsync_path(self.dest.parent)
        if old is not None:
            _remove(old)

    # -- cleanup -----------------------------------------------------------------

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        """Remove the temp (idempotent)."""
        if self._fd is None:
            return
        _remove(self.path)
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.discard()
        return False


def write_file_atomic(dest: str | os.PathLike, data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``dest`` through a :class:`Staging` file; ``replace=False``: an existing
    ``dest`` is an OutputExistsError, never overwritten."""
    with Staging(dest, folder=False) as s:
        with open(s.path, "wb") as f:
            f.write(data)
        s.publish(replace=replace)


# ------------------------------------------------------------------ outputs never touch inputs
# Every output path of every command (reports, checkpoints, GGUFs, saved references, plot folders)
# is checked here against every input before any work (issue 36: ``inspect M -o
# M/model.safetensors --force`` destroyed the weights it had just read).

# Files a reader takes from beside a single weight file (a .safetensors file opened alone reads
# its folder's config.json; verify and convert read the tokenizer and generation config there).
BESIDE_WEIGHTS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "spiece.model",
                  "sentencepiece.bpe.model", "vocab.txt", "vocab.json", "merges.txt", "chat_template.jinja",
                  "chat_template.json", "preprocessor_config.json", "processor_config.json",
                  "model.safetensors.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SPLIT_GGUF = re.compile(r"^(?P<prefix>.+)-\d{5}-of-\d{5}\.gguf$")
_WALK_LIMIT = 10_000        # entries of one input folder resolved one by one (symlinked HF cache blobs)


def input_footprint(source: str | os.PathLike) -> tuple[set[str], set[str]]:
    """(folders, files): the real paths (symlinks resolved) that reading ``source`` may touch.
    A folder counts whole, and every symlink inside it counts where it points; a file counts with
    its companions (the other parts of a split GGUF; a weight file's config and tokenizer beside
    it).  A source that is not a local path (a Hub id) touches nothing here."""
    src = os.fspath(source)
    if not src or not os.path.exists(src):
        return set(), set()
    real = os.path.realpath(src)
    if os.path.isdir(real):
        folders, files, seen = {real}, set(), 0
        for root, dirs, names in os.walk(src):
            for n in dirs + names:
                seen += 1
                p = os.path.join(root, n)
                if os.path.islink(p):
                    (folders if os.path.isdir(p) else files).add(os.path.realpath(p))
            if seen > _WALK_LIMIT:
                break
        return folders, files
    files = {real}
    folder, name = os.path.split(src)
    folder = folder or "."
    m = _SPLIT_GGUF.match(name)
    try:
        beside = os.listdir(folder) if m or name.endswith(_WEIGHT_SUFFIXES) else []
    except OSError:
        beside = []
    for n in beside:
        part = _SPLIT_GGUF.match(n)
        if (m and part and part["prefix"] == m["prefix"]) or (not m and n in BESIDE_WEIGHTS):
            files.add(os.path.realpath(os.path.join(folder, n)))
    return set(), files


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def refuse_onto_inputs(out: str | os.PathLike, sources, *, into: bool = False) -> None:
    """RefusedError when writing ``out`` could change an input, whatever ``--force`` says: ``out``
    is an input file, lies inside an input folder, or (``into=False``: ``out`` is replaced whole) is
    a folder holding an input.  ``into=True``: ``out`` is a folder files are written into."""
    real = os.path.realpath(out)
    folders, files = set(), set()
    for s in sources:
        if s is not None:
            fo, fi = input_footprint(s)
            folders |= fo
            files |= fi
    what = None
    if real in files or real in folders:
        what = "overwrite the input"
    elif any(_inside(real, f) for f in folders):
        f = min(f for f in folders if _inside(real, f))
        kind = "folder" if os.path.isdir(real) else "file"       # M/1_Pooling is a folder (issue 50 item 9)
        what = (f"overwrite a {kind} of the input folder {f}" if os.path.lexists(real) else
                f"be written inside the input folder {f}")
    elif not into and any(_inside(f, real) for f in files | folders):
        what = f"replace a folder holding the input {min(f for f in files | folders if _inside(f, real))}"
    if what is not None:
        raise RefusedError(f"the output would {what}", path=os.fspath(out),
                           hint="choose a path outside every input: inputs are never modified, even with --force")


def check_writable(out: str | os.PathLike, *, into: bool = False) -> None:
    """WriteError, before any work, when ``out`` cannot be created: the folder it goes into (for
    ``into``, the nearest existing folder of ``out`` itself) is missing or refuses a new file.  A
    probe file is created and removed there (``os.access`` says yes to root on a read-only folder)."""
    folder = Path(os.path.abspath(out))
    folder = folder if into else folder.parent
    while into and not folder.exists() and folder.parent != folder:
        folder = folder.parent
    if not folder.is_dir():
        raise WriteError("the folder to write into does not exist (or is not a folder)", path=folder)
    probe = folder / f".{Path(out).name or 'out'}.{TAG}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        raise WriteError(f"cannot write the output: {e.strerror or e}", path=folder,
                         hint=f"check write permission on {folder}; nothing was written") from None
    os.unlink(probe)
