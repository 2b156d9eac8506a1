"""The machine a benchmark ran on, as benchmarks/results/*.json records it: cores, CPU, GPU, RAM."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "not recorded"


def _gpu() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "none"
    return ", ".join(sorted(set(out.splitlines()))) or "none"


def _ram() -> str:
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return "not recorded"
    return f"{kib / 2 ** 20:.1f} GiB"


def machine(note: str = "") -> dict:
    """``{"cores", "cpu", "gpu", "ram"}`` of this machine (and ``note``, e.g. the load average)."""
    m = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
         "cpu": _cpu(), "gpu": _gpu(), "ram": _ram()}
    if note:
        m["note"] = note
    return m


def command() -> str:
    """The command line that is running, as one would type it again."""
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def load_note() -> str:
    try:
        return "load average %.1f at the start" % os.getloadavg()[0]
    except OSError:
        return ""
