"""Progress bars: one rule for every long-running operation.

``progress=None`` (every command's default) means *on only when stderr is a terminal*, so a
script or a pipe gets clean stderr without asking; ``CKPT_SURGEON_PROGRESS=1/0`` overrides that
default, and ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (huggingface_hub's switch) turns every bar
off.  An explicit ``True``/``False`` (the CLI's ``--progress/--no-progress``) wins over the
terminal test and ``CKPT_SURGEON_PROGRESS``.

Bars go to stderr through tqdm; library code never prints anything else.
"""
from __future__ import annotations

import os
import sys

_TRUE = {"1", "ON", "YES", "TRUE"}   # huggingface_hub.constants._is_true


def _is_true(v: str | None) -> bool:
    return (v or "").strip().upper() in _TRUE


def progress_enabled(progress: bool | None) -> bool:
    """Resolve a ``progress`` argument (True / False / None = automatic) to a yes or no."""
    if _is_true(os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")):
        return False
    if progress is not None:
        return bool(progress)
    flag = os.environ.get("CKPT_SURGEON_PROGRESS")
    if flag is not None:
        return _is_true(flag)
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):      # replaced or closed stderr
        return False


class _NoBar:
    """What :func:`bar` returns when bars are off: same calls, no output."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


NO_BAR = _NoBar()


def bar(progress: bool | None, *, total: int | None, desc: str, unit: str = "B"):
    """A tqdm bar on stderr (bytes scaled as kB/MB/GB when ``unit="B"``), or a silent stand-in."""
    if not progress_enabled(progress):
        return NO_BAR
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False)
