"""Progress bars: one rule for every long-running operation.

``progress=None`` (every command's default) means *on only when stderr is a terminal*, so a
script or a pipe gets clean stderr without asking; ``CKPT_SURGEON_PROGRESS=1/0`` overrides that
default, and ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (huggingface_hub's switch) turns every bar
off.  An explicit ``True``/``False`` (the CLI's ``--progress/--no-progress``) wins over the
terminal test and ``CKPT_SURGEON_PROGRESS``.

Bars go to stderr through tqdm; library code never prints anything else.  Besides :func:`bar` (a count of
bytes or items), :func:`steps` wraps an iterable (layers, prompts) and :func:`phase` names an uncountable step
(loading a model, a reference pass) with its time, under the same rule: every phase of a command longer than a
few seconds shows one of them (issue 36 item 14).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from contextlib import contextmanager

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


def say(progress: bool | None, message: str) -> None:
    """One line on stderr when bars are on (``tqdm.write``: an open bar is redrawn below it)."""
    if progress_enabled(progress):
        from tqdm.auto import tqdm
        tqdm.write(message, file=sys.stderr)


@contextmanager
def phase(progress: bool | None, desc: str):
    """A step of a long command that has no count to show (loading a model, asking transformers, a
    reference pass): ``desc ...`` on stderr when it starts and ``desc: 12.3 s`` when it ends, under the
    same rule as :func:`bar` (silent when bars are off).  Steps that can be counted use :func:`steps`."""
    if not progress_enabled(progress):
        yield
        return
    t0 = time.perf_counter()
    say(progress, f"{desc} ...")
    yield
    say(progress, f"{desc}: {time.perf_counter() - t0:.1f} s")


def steps(progress: bool | None, items: Iterable, *, desc: str, total: int | None = None, unit: str = "it"):
    """``items`` with a bar on stderr over them (layers, prompts, chunks), or ``items`` itself when bars are off."""
    if not progress_enabled(progress):
        return items
    from tqdm.auto import tqdm
    return tqdm(items, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
