"""Output paths for the converters: refuse to overwrite without ``force`` or to write onto the
input, and publish atomically (temp beside the destination + ``os.replace``).

Why beside the destination: ``os.replace`` is atomic only within one filesystem, and a reader
must see either the old output or the complete new one, never half a file (the same reasoning
as huggingface_hub's ``_create_symlink`` / download-to-``.incomplete``-then-rename path).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import OutputExistsError, RefusedError


def check_output(out: Path, sources: list[str], force: bool) -> None:
    """``out`` may be written: not an input, and absent unless ``force``."""
    real_out = os.path.realpath(out)
    for s in sources:
        rs = os.path.realpath(s)
        if real_out == rs or rs.startswith(real_out.rstrip(os.sep) + os.sep):
            raise RefusedError("the output would overwrite the input", path=str(out),
                               hint="choose another output path: inputs are never modified")
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError("already exists", path=str(out), hint="pass --force to replace it")
    if not out.parent.exists():
        raise OutputExistsError("the folder to write into does not exist", path=str(out.parent))


def temp_file_beside(out: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    return Path(tmp)


def temp_dir_beside(out: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))


def fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_file(tmp: Path, out: Path) -> None:
    fsync_path(tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


def publish_dir(tmp: Path, out: Path) -> None:
    """Replace ``out`` (absent, or an old output when forced) by the finished ``tmp`` folder.

    A folder cannot be swapped in one ``os.replace`` when the destination exists, so the old
    one is renamed aside first and deleted only after the new one is in place.
    """
    for f in tmp.iterdir():
        if f.is_file():
            fsync_path(f)
    os.chmod(tmp, 0o755)
    old = None
    if out.exists() or out.is_symlink():
        if out.is_dir() and not out.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "x")
        else:
            out.unlink()
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def discard(tmp: Path | None) -> None:
    if tmp is None:
        return
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp.exists():
        tmp.unlink()
