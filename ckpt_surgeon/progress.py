"""Progress bars: one rule for every long-running operation.

``progress=None`` (every command's default) means *on only when stderr is a terminal*, so a
script or a pipe gets clean stderr without asking; ``CKPT_SURGEON_PROGRESS=1/0`` overrides that
default, and ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (huggingface_hub's switch) turns every bar
off.  An explicit ``True``/``False`` (the CLI's ``--progress/--no-progress``) wins over the
terminal test and ``CKPT_SURGEON_PROGRESS``.

Bars go to stderr through tqdm; library code never prints anything else.  Besides :func:`bar` (a count of
bytes or items), :func:`steps` wraps an iterable (layers, prompts), :func:`counter` counts what a loop ticks off
(tokens), and :func:`phase` names an uncountable step (loading a model, a reference pass) with its time, under the
same rule: every phase of a command longer than a few seconds shows one of them (issue 36 item 14).

On a stderr that is not a terminal, by default (``progress=None``, ``CKPT_SURGEON_PROGRESS`` unset) no bar is
drawn, but a step still running after :data:`LINE_AFTER` seconds (``CKPT_SURGEON_PROGRESS_AFTER``) is said in plain
lines, as pip and huggingface_hub do: ``desc ...`` then ``desc: 63.2 s`` for a phase, ``desc: 120/528 tok (12 s)``
every ``LINE_AFTER`` seconds for a count (issue 50 item 7: a 7-minute verify printed nothing at all to a log).
A short step prints nothing; ``CKPT_SURGEON_PROGRESS=0`` or ``--no-progress`` silences the lines too.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager

LINE_AFTER = 10.0          # seconds a step runs before a non-terminal stderr hears of it (and between its lines)

_TRUE = {"1", "ON", "YES", "TRUE"}   # huggingface_hub.constants._is_true


def _is_true(v: str | None) -> bool:
    return (v or "").strip().upper() in _TRUE


def progress_mode(progress: bool | None) -> str:
    """``"bars"`` (tqdm on stderr), ``"lines"`` (plain lines for the long steps only: the default on a stderr that
    is not a terminal) or ``"off"``, for a ``progress`` argument (True / False / None = automatic)."""
    if _is_true(os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")):
        return "off"
    if progress is not None:
        return "bars" if progress else "off"
    flag = os.environ.get("CKPT_SURGEON_PROGRESS")
    if flag is not None:
        return "bars" if _is_true(flag) else "off"
    try:
        return "bars" if sys.stderr.isatty() else "lines"
    except (AttributeError, ValueError):      # replaced or closed stderr
        return "off"


def progress_enabled(progress: bool | None) -> bool:
    """Resolve a ``progress`` argument (True / False / None = automatic) to whether bars are drawn."""
    return progress_mode(progress) == "bars"


def line_after() -> float:
    """:data:`LINE_AFTER`, or ``CKPT_SURGEON_PROGRESS_AFTER`` seconds (0: every step is said, at once)."""
    try:
        return max(0.0, float(os.environ.get("CKPT_SURGEON_PROGRESS_AFTER", LINE_AFTER)))
    except ValueError:
        return LINE_AFTER


def _line(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):       # a closed or replaced stderr: nothing to say it on
        pass


class _Lines:
    """A count said in plain lines: ``desc: n/total unit (s)`` once the step has run :func:`line_after` seconds,
    then at most every that many seconds, and a last line at the end when any was said."""

    def __init__(self, *, total: int | None, desc: str, unit: str):
        self.total, self.desc, self.unit = total, desc, unit
        self.n, self.t0, self.said = 0, time.perf_counter(), False
        self.after = line_after()
        self.last = self.t0

    def _text(self) -> str:
        n, total, unit = self.n, self.total, self.unit
        if unit == "B":          # bytes as MB, as a bar scales them
            n, total, unit = round(n / 1e6), round(total / 1e6) if total else total, "MB"
        count = f"{n}/{total}" if total else f"{n}"
        return f"{self.desc}: {count} {unit} ({time.perf_counter() - self.t0:.0f} s)"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.after and (self.said or now - self.t0 >= self.after):
            self.last, self.said = now, True
            _line(self._text())

    def close(self) -> None:
        if self.said:
            self.said = False
            _line(self._text() + ", done")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
    """A tqdm bar on stderr (bytes scaled as kB/MB/GB when ``unit="B"``), plain lines for a long count on a
    non-terminal (:class:`_Lines`), or a silent stand-in."""
    mode = progress_mode(progress)
    if mode == "lines":
        return _Lines(total=total, desc=desc, unit=unit)
    if mode == "off":
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
    same rule as :func:`bar`; in ``lines`` mode only a step still running after :func:`line_after` seconds is
    said (its start line then, its time at the end).  Steps that can be counted use :func:`steps`."""
    mode = progress_mode(progress)
    if mode == "off":
        yield
        return
    t0 = time.perf_counter()
    if mode == "bars":
        say(progress, f"{desc} ...")
        yield
        say(progress, f"{desc}: {time.perf_counter() - t0:.1f} s")
        return
    said = threading.Event()

    def announce():
        said.set()
        _line(f"{desc} ...")
    after = line_after()
    timer = None
    if after <= 0:
        announce()
    else:
        timer = threading.Timer(after, announce)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        if said.is_set():
            _line(f"{desc}: {time.perf_counter() - t0:.1f} s")


def steps(progress: bool | None, items: Iterable, *, desc: str, total: int | None = None, unit: str = "it"):
    """``items`` with a bar on stderr over them (layers, prompts, chunks), lines for a long loop on a non-terminal,
    or ``items`` itself when progress is off."""
    mode = progress_mode(progress)
    if mode == "off":
        return items
    if mode == "lines":
        return _counted(items, _Lines(total=total if total is not None else _len(items), desc=desc, unit=unit))
    from tqdm.auto import tqdm
    return tqdm(items, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)


def _len(items) -> int | None:
    try:
        return len(items)
    except TypeError:
        return None


def _counted(items: Iterable, lines: _Lines):
    with lines:
        for x in items:
            yield x
            lines.update(1)


class Tally:
    """A count a loop ticks off (tokens of several prompts, several models): ``tick(n)`` steps done, ``close()``
    at the end; a bar, lines on a non-terminal for a long count, or nothing (:func:`progress_mode`)."""

    def __init__(self, progress: bool | None, *, total: int, desc: str, unit: str = "it"):
        self.b = bar(progress, total=total, desc=desc, unit=unit)

    def tick(self, n: int = 1) -> None:
        if n > 0:
            self.b.update(n)

    def close(self) -> None:
        self.b.close()


@contextmanager
def counter(progress: bool | None, *, total: int, desc: str, unit: str = "it"):
    """A :class:`Tally` closed at the end of the ``with``."""
    t = Tally(progress, total=total, desc=desc, unit=unit)
    try:
        yield t
    finally:
        t.close()
