"""Run a command that pauses at a named writer stage, so a test can SIGKILL it there.

The pause lives here, on the test side: the writer only calls its ``STAGE_OBSERVERS`` at each
stage (``temp-created``, ``data-copied:<i>``, ``shard-written:<i>``, ``before-rename``; the HF -> GGUF
converter also ``header-written``).  With
``CKPT_SURGEON_PAUSE_AT`` naming a stage, this launcher registers an observer that writes
``CKPT_SURGEON_PAUSE_FILE`` (pid and stage) and sleeps there, then runs the command.

Usage: python tests/pause_at.py -m MODULE ARGS...   |   python tests/pause_at.py -c CODE ARGS...
"""
from __future__ import annotations

import os
import runpy
import sys
import time

from ckpt_surgeon.formats.write import writer


def _pause(name: str) -> None:
    if name != os.environ.get("CKPT_SURGEON_PAUSE_AT"):
        return
    marker = os.environ.get("CKPT_SURGEON_PAUSE_FILE")
    if marker:
        with open(marker, "w") as f:
            f.write(f"{os.getpid()} {name}\n")
    time.sleep(3600)


def main() -> None:
    writer.STAGE_OBSERVERS.append(_pause)
    mode, target, *args = sys.argv[1:]
    if mode == "-m":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "-c":
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    else:
        raise SystemExit(f"usage: {sys.argv[0]} -m MODULE ARGS... | -c CODE ARGS...")


if __name__ == "__main__":
    main()
