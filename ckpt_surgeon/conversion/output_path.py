"""Output paths for the converters: refuse to overwrite without ``force`` or to write onto the
input.  Publishing (temp beside the destination, fsync, rename, stale temps) is
:mod:`ckpt_surgeon.publish`'s, shared by every writer.
"""
from __future__ import annotations

import os
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
