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
