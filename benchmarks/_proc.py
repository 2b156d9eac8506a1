"""Run a command as a whole process and measure it: wall time, peak RSS and CPU time (user + system).

Shared by the benchmark scripts.  The wrapper process has exactly one child, so
``RUSAGE_CHILDREN``'s ``ru_maxrss`` is that child's peak (KiB on Linux).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
rss, cpu = ru.ru_maxrss * 1024, ru.ru_utime + ru.ru_stime
print(json.dumps({"wall": wall, "rss": rss, "cpu": cpu, "user": ru.ru_utime, "sys": ru.ru_stime, "rc": p.returncode, "stdout": p.stdout.decode()[-400000:],
                  "stderr": p.stderr.decode()[-4000:]}))
"""


def run(cmd: list[str], *, sync: bool = False) -> dict:
    """``{"wall", "rss", "cpu", "user", "sys", "rc", "stdout", "stderr"}`` of ``cmd``; exits on a non-zero status.

    ``sync``: flush dirty pages first (not timed), so a run does not pay for the previous
    run's deleted output still being written back (seen: a first ``cp -r`` at 25 s, the same
    copy 10 s later).
    """
    if sync:
        os.sync()
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    if res["rc"] != 0:
        raise SystemExit(f"command failed ({res['rc']}): {' '.join(cmd)}\n{res['stderr']}")
    return res


class TreePeak:
    """While the block runs: the peak RSS of process ``pid`` and all its descendants together (psutil, the
    sum over the tree sampled every 50 ms), in ``.rss`` bytes."""

    def __init__(self, pid: int, period: float = 0.05):
        import threading
        self.pid, self.period, self.rss = pid, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil
        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                tree = [proc, *proc.children(recursive=True)]
                self.rss = max(self.rss, sum(q.memory_info().rss for q in tree if q.is_running()))
            except psutil.Error:
                pass
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def tree_measured(cmd: list[str], env: dict | None = None, watch=None) -> dict:
    """Run ``cmd``: wall time, CPU time (user + system of it and every descendant it waited for), peak RSS of
    its whole process tree (:class:`TreePeak`: a parent and the child it runs the work in count together),
    and the largest byte count seen under the folder ``watch``."""
    import resource
    import threading
    import time
    from pathlib import Path

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    disk, stop = [0], threading.Event()

    def watch_disk():
        while not stop.wait(0.05):
            disk[0] = max(disk[0], sum(f.stat().st_size for f in Path(watch).rglob("*") if f.is_file()))
    th = threading.Thread(target=watch_disk, daemon=True)
    if watch is not None:
        th.start()
    with TreePeak(p.pid) as peak:
        _, err = p.communicate()
    stop.set()
    if watch is not None:
        th.join()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{err[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "rss": peak.rss, "disk": disk[0], "stderr": err}
