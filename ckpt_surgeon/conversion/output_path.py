"""Output paths for the converters: refuse to overwrite without ``force`` or to write onto the
input.  Publishing (temp beside the destination, fsync, rename, stale temps) is
:mod:`ckpt_surgeon.publish`'s, shared by every writer.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import OutputExistsError
from ..publish import refuse_onto_inputs


def check_output(out: Path, sources: list[str], force: bool) -> None:
    """``out`` may be written: not an input, and absent unless ``force``."""
    refuse_onto_inputs(out, sources)       # the one rule of every output (publish.py)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError("already exists", path=str(out), hint="pass --force to replace it")
    if not out.parent.exists():
        raise OutputExistsError("the folder to write into does not exist", path=str(out.parent))
