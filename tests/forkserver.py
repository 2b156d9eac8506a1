"""A fork server for the suite's Python subprocesses that import torch and transformers.

Importing torch and ``transformers.modeling_utils`` costs about 8 s of CPU on this project's 2-core
machine, and the suite starts Python processes that need them many times: llama.cpp's own
``convert_hf_to_gguf.py`` for every reference file, and the ranks of the distributed ``verify`` tests.
Like ``multiprocessing``'s forkserver with ``set_forkserver_preload``, one server per pytest worker
imports them once; each run is a ``fork()`` of it that then does what ``python SCRIPT ARGS`` or
``python -m MODULE ARGS`` does: its own environment, working directory, ``sys.path`` (the script's
folder, then ``PYTHONPATH``), ``sys.argv``, stdout / stderr to files, the script or module run as
``__main__``, its exit status (``SystemExit`` as the interpreter maps it, ``os._exit``'s own, 1 on an uncaught exception
with the traceback on stderr).  The server imports only third-party libraries, never ``ckpt_surgeon``
or ``gguf`` (llama.cpp's runner insists on its own gguf-py), so the code under test starts fresh.

The suite also hands :func:`launcher` to the derived convert path (``spawn.set_launcher``, in
tests/conftest.py), whose children import llama.cpp's converter and with it torch.  Processes a test
starts to kill, time or measure (memory) stay plain subprocesses.

``run`` has ``subprocess.run``'s shape (``capture_output=True, text=True`` always); ``start`` returns a
handle with ``wait`` / ``kill`` / ``returncode``.  ``CKPT_SURGEON_TEST_NO_FORK=1`` (or a platform
without ``fork`` / ``pidfd_open``) runs every call as a plain subprocess instead.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = ("numpy", "torch", "transformers", "transformers.modeling_utils", "safetensors.torch", "tokenizers")
_LOCK = threading.Lock()
_SERVER: subprocess.Popen | None = None


def enabled() -> bool:
    return (os.environ.get("CKPT_SURGEON_TEST_NO_FORK") != "1" and hasattr(os, "fork")
            and hasattr(os, "pidfd_open"))


# --- the server (runs in its own process) ---------------------------------------------------------

def _child_path(argv: list, env: dict, cwd: str, base: list) -> list:
    """sys.path as ``python ARGV`` would start with it under ``env`` in ``cwd``."""
    first = cwd if argv[0] == "-m" else os.path.dirname(os.path.abspath(os.path.join(cwd, argv[0])))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [first, *[os.path.abspath(os.path.join(cwd, p)) for p in extra], *base]


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _child(req: dict, base: list) -> None:
    """In the forked child: become ``python ARGV`` and exit with its status (never returns)."""
    import atexit
    import importlib
    import runpy
    import traceback
    code = 1
    real_exit = os._exit

    def _exit(status: int) -> None:      # the status recorded, then the process ends (never returns); also the
        # child's os._exit, so that one ending itself that way (a distributed rank) has its status too
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            Path(req["rc"]).write_text(str(status))
        finally:
            real_exit(status)

    os._exit = _exit
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)     # the server ignores it; subprocess.wait must not
        os.setpgrp()                                      # killed as a group, with any children of its own
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(os.open(req["out"], os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(req["err"], os.O_WRONLY | os.O_TRUNC), 2)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        argv = req["argv"]
        sys.path[:] = _child_path(argv, req["env"], req["cwd"], base)
        importlib.invalidate_caches()        # folders written since the server started
        threads = req["env"].get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:     # OpenMP read the server's value when torch loaded
            sys.modules["torch"].set_num_threads(int(threads))
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:     # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        _exit(code)


def serve() -> None:
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("gguf", "ckpt_surgeon"))
    if leaked:
        raise SystemExit(f"forkserver: the preload imported {leaked[:3]}; the children would not start fresh")
    base = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)         # children are reaped by the kernel
    requests, replies = sys.stdin, sys.stdout
    for line in requests:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req, base)
        replies.write(f"{pid}\n")
        replies.flush()


# --- the client (runs in the pytest worker) --------------------------------------------------------

def _server() -> subprocess.Popen:
    global _SERVER
    if _SERVER is None or _SERVER.poll() is not None:
        _SERVER = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=dict(os.environ, PYTHONPATH=""))
    return _SERVER


class Forked:
    """A running forked ``python ARGV`` (the fields subprocess.Popen / CompletedProcess have)."""

    def __init__(self, argv: list, env: dict | None = None, cwd=None):
        self.args = [sys.executable, *argv]
        self._dir = tempfile.mkdtemp(prefix="forkserver-")
        self._files = {k: os.path.join(self._dir, k) for k in ("out", "err", "rc")}
        for k in ("out", "err"):
            Path(self._files[k]).touch()
        req = {"argv": [str(a) for a in argv], "env": dict(os.environ if env is None else env),
               "cwd": os.path.abspath(cwd or os.getcwd()), **self._files}
        with _LOCK:
            srv = _server()
            srv.stdin.write(json.dumps(req) + "\n")
            srv.stdin.flush()
            line = srv.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"forkserver died before starting {argv!r}")
        self.pid = int(line)
        try:
            self._fd = os.pidfd_open(self.pid)
        except ProcessLookupError:      # already gone (and reaped): its rc file says how it ended
            self._fd = None
        self.returncode = None
        self.stdout = self.stderr = None

    def poll(self):
        if self.returncode is None and (self._fd is None or select.select([self._fd], [], [], 0)[0]):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if self._fd is not None and not select.select([self._fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _finish(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        rc = Path(self._files["rc"])
        # killed before writing its status: -9 as subprocess reports a SIGKILL (the signal is not known here)
        self.returncode = int(rc.read_text()) if rc.exists() and rc.read_text() else -signal.SIGKILL
        self.stdout = Path(self._files["out"]).read_text(errors="replace")
        self.stderr = Path(self._files["err"]).read_text(errors="replace")
        for p in self._files.values():
            Path(p).unlink(missing_ok=True)
        os.rmdir(self._dir)


def start(argv: list, env: dict | None = None, cwd=None):
    """``python ARGV`` (ARGV without the interpreter: ``[script, ...]`` or ``["-m", module, ...]``),
    forked from the server, or a plain ``subprocess.Popen`` when forking is off."""
    if not enabled():
        return subprocess.Popen([sys.executable, *map(str, argv)], env=env, cwd=cwd, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return Forked(list(argv), env, cwd)


def run(argv: list, env: dict | None = None, cwd=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *ARGV], capture_output=True, text=True, ...)`` through the server."""
    proc = start(argv, env, cwd)
    try:
        if isinstance(proc, Forked):
            proc.wait(timeout)
            out, err = proc.stdout, proc.stderr
        else:
            out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait() if isinstance(proc, Forked) else proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_all(procs: list, timeout: float | None = None) -> list:
    """Wait for every process of :func:`start` (a whole group of ranks: on a timeout each is killed,
    then TimeoutExpired) -> their ``subprocess.CompletedProcess`` in order."""
    import time
    end = None if timeout is None else time.monotonic() + timeout
    done = []
    try:
        for p in procs:
            left = None if end is None else max(0.0, end - time.monotonic())
            if isinstance(p, Forked):
                p.wait(left)
                done.append(subprocess.CompletedProcess(p.args, p.returncode, p.stdout, p.stderr))
            else:
                out, err = p.communicate(timeout=left)
                done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait() if isinstance(p, Forked) else p.communicate()
        raise
    return done


def launcher(argv: list, env: dict, die_with_parent: bool) -> subprocess.CompletedProcess:
    """For :func:`ckpt_surgeon.conversion.derived.spawn.set_launcher`: the derived path's children, forked.
    (``die_with_parent`` needs nothing here: the parent is the server, which ends with the worker.)"""
    return run(argv, env=env)


if __name__ == "__main__":
    serve()
