"""Progress of a derived child, shown by the parent: the child appends lines to a file, the parent
follows it and draws the bar (:mod:`ckpt_surgeon.progress`'s rule: on when stderr is a terminal,
``--progress/--no-progress``, ``CKPT_SURGEON_PROGRESS``).

Why a file and not the child's stderr: the child's output is captured (its last line names a crash),
and it may be started by any launcher (:mod:`.spawn`); a file the parent reads works with all of them.
Lines, one event each::

    phase <text>               a step without a count (llama.cpp's class planning the tensors)
    total <bytes> <tensors>    the plan is known: the bar's size
    done <bytes>               one tensor written (encoded, at its offset)
"""
from __future__ import annotations

import threading
from pathlib import Path

from ...progress import bar, progress_enabled, say

__all__ = ["Feed", "follow"]


class Feed:
    """The child's side: events appended to ``path`` (nothing when ``path`` is None)."""

    def __init__(self, path: str | None):
        self._f = open(path, "a", encoding="utf-8", buffering=1) if path else None

    def _put(self, line: str) -> None:
        if self._f is not None:
            self._f.write(line + "\n")

    def phase(self, text: str) -> None:
        self._put("phase " + " ".join(text.split()))

    def total(self, nbytes: int, tensors: int) -> None:
        self._put(f"total {int(nbytes)} {int(tensors)}")

    def done(self, nbytes: int) -> None:
        self._put(f"done {int(nbytes)}")


class follow:
    """The parent's side, a context manager around the child's run: a thread reads ``path`` as it grows
    and drives one bar (bytes, rate, ETA; ``tensor k/N`` beside).  Does nothing when bars are off."""

    def __init__(self, path: Path, progress, desc: str, period: float = 0.2):
        self.path, self.progress, self.desc, self.period = Path(path), progress, desc, period
        self._stop = threading.Event()
        self._thread = None
        self._bar = None
        self._tensors = self._done = 0

    def __enter__(self):
        if progress_enabled(self.progress):
            self._thread = threading.Thread(target=self._run, name="derived-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._bar is not None:
            getattr(self._bar, "refresh", lambda: None)()   # the last state drawn (tqdm skips updates < 0.1 s apart)
            self._bar.close()

    def _run(self) -> None:
        pos, pending = 0, ""
        while True:
            stopping = self._stop.wait(self.period)
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            pos += len(chunk)
            pending += chunk.decode("utf-8", "replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                self._event(line)
            if stopping:
                return

    def _event(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "phase":
            say(self.progress, rest)
        elif kind == "total":
            nbytes, tensors = (int(x) for x in rest.split())
            self._bar, self._tensors = bar(self.progress, total=nbytes, desc=self.desc), tensors
        elif kind == "done" and self._bar is not None:
            self._done += 1
            post = getattr(self._bar, "set_postfix_str", None)
            if post is not None:
                post(f"tensor {self._done}/{self._tensors}", refresh=False)
            self._bar.update(int(rest))
