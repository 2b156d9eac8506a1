"""How the derived path starts its Python children: ``python -m MODULE REQUEST`` with this package
first on ``PYTHONPATH``, output captured, the caller reading the child's report file afterwards.

One place for the two children (:mod:`.child`, which runs llama.cpp's converter class, and
:mod:`.probe_child`, which learns its inverse).  A host that keeps torch and transformers imported
can start them its own way with :func:`set_launcher` (a launcher takes ``argv`` without the
interpreter, the environment and ``die_with_parent``, and returns a ``subprocess.CompletedProcess``);
the test suite forks them from a preloaded server (tests/forkserver.py), which saves the ~8 s of
CPU each fresh interpreter spends importing torch and transformers.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

__all__ = ["run_module", "set_launcher"]


def _die_with_parent() -> None:
    """In the child, before it runs: end with this process (Linux ``PR_SET_PDEATHSIG``), so that a
    killed ``convert`` stops its writer too and a rerun resumes a split set instead of finding it locked."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)    # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _subprocess_launcher(argv: list, env: dict, die_with_parent: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                          preexec_fn=_die_with_parent if die_with_parent else None)


_LAUNCHER: Callable = _subprocess_launcher


def set_launcher(launcher: Callable | None) -> None:
    """Start the children with ``launcher`` from now on (``None``: a fresh interpreter again)."""
    global _LAUNCHER
    _LAUNCHER = launcher or _subprocess_launcher


def run_module(module: str, request: Path, *, die_with_parent: bool = False) -> subprocess.CompletedProcess:
    """``python -m MODULE REQUEST`` with this package importable, and how it ended."""
    pkg_root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p))
    return _LAUNCHER(["-m", module, str(request)], env, die_with_parent)
