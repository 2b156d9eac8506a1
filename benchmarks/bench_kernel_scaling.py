"""How llama.cpp's quantization kernels scale with threads on this machine (issue 26's speed floor).

``convert --dtype q4_k_m`` spends nearly all its time in ``ggml_quantize_chunk`` (the k-quant kernels
of the ggml library llama-cpp-python ships), called from worker threads (ctypes releases the GIL).
This script measures that kernel alone: a 7B-shaped matrix's rows (4096 x 11008 float32, seeded
normal) quantized to Q4_K and Q6_K by 1, 2, 4 ... N threads, each taking row chunks of the size
the converter uses.  It prints values per second per thread count and the speed-up over one thread,
with the machine's cores and threads per core (``lscpu``), so that the converter's own effective
parallelism (bench_convert.py) can be read against what the kernel reaches on the same machine.

    python benchmarks/bench_kernel_scaling.py [--rows 11008] [--cols 4096] [--threads 1,2,4,8,16]
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import threading
import time

import numpy as np


def _lscpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "lscpu unavailable"
    keep = ("Model name", "CPU(s):", "Thread(s) per core", "Core(s) per socket", "Socket(s)")
    return "; ".join(line.split(":", 1)[0].strip() + ": " + line.split(":", 1)[1].strip()
                     for line in out.splitlines() if line.startswith(keep))


def run(x: np.ndarray, name: str, threads: int, chunk_rows: int) -> float:
    """Seconds to quantize every row of ``x`` to ``name`` with ``threads`` workers."""
    from ckpt_surgeon.formats.quant.ggml_quant import quantize_rows
    jobs: queue.Queue = queue.Queue()
    for a in range(0, x.shape[0], chunk_rows):
        jobs.put(a)

    errors: list = []

    def work():
        while True:
            try:
                a = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                quantize_rows(x[a:a + chunk_rows], name)
            except Exception as e:   # noqa: BLE001 - re-raised in the main thread: no figure from a failed run
                errors.append(e)
                return

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=11008)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--types", default="Q4_K,Q6_K")
    n = os.cpu_count() or 1
    ap.add_argument("--threads", default=",".join(str(t) for t in (1, 2, 4, 8, 12, 16, 24, 32) if t <= n))
    args = ap.parse_args(argv)
    from ckpt_surgeon.conversion.gguf_stream import CHUNK_ELEMS
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols), dtype=np.float32)
    chunk_rows = max(1, CHUNK_ELEMS // args.cols)
    print(f"machine: {_lscpu()}; os.cpu_count() {n}")
    print(f"matrix {args.rows} x {args.cols} float32, chunks of {chunk_rows} rows (the converter's)")
    for name in args.types.split(","):
        base = None
        for t in (int(s) for s in args.threads.split(",")):
            s = min(run(x, name, t, chunk_rows) for _ in range(2))
            base = base or s
            print(f"{name} threads {t:3d}: {s:7.3f} s  {x.size / s / 1e6:8.1f} M values/s  speed-up {base / s:5.2f}x",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
