"""Benchmark: ``analyze --kv-cache`` (static) and ``kv-equalize`` on a Qwen2.5-7B-shaped checkpoint.

* static prediction: :func:`ckpt_surgeon.analysis.kv_cache.kv_cache_report` for q4_0 and q8_0 in a child
  process (the time of the report itself, best of ``--inner``, and of the whole ``analyze --kv-cache``
  command with its imports); target (issue 32): under 2 s.
* kv-equalize vs fold-bias: ``kv-equalize SRC -o OUT --cache-type-k q4_0 --cache-type-v q8_0`` against
  ``fold-bias SRC -o OUT --k --approximate --max-logit-change 0.01`` (both read every W_q and stream the
  whole model through the writer), wall time and peak RSS; targets: <= 1.1x fold-bias's time, < 1 GB.

``--sparse`` builds the shape with file holes for the big weights (fast to make, no 15 GB on disk; reads
of holes cost no I/O, and fold-bias's kernel copy skips them while kv-equalize writes the rescaled weights as
real bytes: the write ratio then flatters fold-bias; ``--shape small`` writes real bytes in 0.5 GB).

``--repeat N`` runs fold-bias and kv-equalize (each ``--scales`` kind) alternately N times and prints each run
(wall, CPU = user + system of the process and its threads, peak RSS) and the medians, with the load average
(the machine is shared: compare within one run).

``--kbias concentrated`` builds the shape with the boundary layers' key bias in 4 low-frequency rotary pairs per
kv head (make_qwen25_shape.py), the profile kv-equalize rewrites (at the 7b geometry its guard passes layers 0
and 27: Q/K weights and biases rewritten and turned); the default ``random`` spreads it, and the guard keeps
every layer, so kv-equalize then writes what fold-bias writes.  Each kv-equalize run prints how many tensors
it changed.

Usage: python benchmarks/bench_kv.py [--dir .bench/qwen2.5-7b-shape] [--sparse] [--shape 7b] [--inner 3] [--no-write]
                                     [--repeat N] [--scales pow2,continuous] [--kbias random|concentrated]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._proc import run  # noqa: E402  (wall time + peak RSS of a child process)
from benchmarks.make_qwen25_shape import make_qwen25_shape  # noqa: E402

REPO = str(Path(__file__).resolve().parent.parent)
STATIC = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.analysis.kv_cache import kv_cache_report
best = None
with open_checkpoint(sys.argv[1]) as ck:
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        r = kv_cache_report(ck, "q4_0,q8_0")
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
print(json.dumps({"seconds": best, "at_risk": r.at_risk("q4_0"), "torch": "torch" in sys.modules}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="default: .bench/qwen2.5-7b-shape (-KBIAS unless random)")
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--shape", default="7b", help="7b | 0.5b | small (make_qwen25_shape.py)")
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="only the static prediction")
    ap.add_argument("--repeat", type=int, default=1, help="alternate fold-bias / kv-equalize runs this many times")
    ap.add_argument("--scales", default="pow2", help="kv-equalize --scales kinds to time, a comma list")
    ap.add_argument("--kbias", default="random", help="key-bias profile: random | concentrated (make_qwen25_shape.py)")
    a = ap.parse_args(argv)
    a.dir = a.dir or ".bench/qwen2.5-7b-shape" + ("" if a.kbias == "random" else f"-{a.kbias}")
    src = make_qwen25_shape(a.dir, sparse=a.sparse, quiet=True, shape=a.shape, kbias=a.kbias)
    res = json.loads(run([sys.executable, "-c", STATIC, str(src), REPO, str(a.inner)])["stdout"])
    print(f"static kv_cache_report (q4_0,q8_0): {res['seconds']:.2f} s (best of {a.inner}); at risk {res['at_risk']}; "
          f"torch imported: {res['torch']}")
    cli = [sys.executable, "-m", "ckpt_surgeon"]
    cmd = run(cli + ["analyze", str(src), "--kv-cache", "q4_0,q8_0", "--format", "json"])
    print(f"analyze --kv-cache command: {cmd['wall']:.2f} s wall, {cmd['rss'] / 2**20:.0f} MiB peak RSS")
    if a.no_write:
        return 0
    timed(cli, src, Path(a.dir).parent, a.repeat, a.scales.split(","))
    return 0


def timed(cli, src, parent: Path, repeat: int, scales: list[str]) -> None:
    """fold-bias and kv-equalize (each kind of scales) alternately, ``repeat`` times; medians at the end."""
    jobs = {"fold-bias": ["fold-bias", str(src), "--k", "--approximate", "--max-logit-change", "0.01"]}
    for sc in scales:
        jobs[f"kv-equalize {sc}"] = ["kv-equalize", str(src), "--cache-type-k", "q4_0", "--cache-type-v", "q8_0",
                                     "--scales", sc]
    res: dict = {k: [] for k in jobs}
    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-", dir=parent))
    try:
        for i in range(repeat):
            for name, args in jobs.items():
                load = os.getloadavg()[0]
                r = run(cli + args + ["-o", str(tmp / "out"), "--format", "json"], sync=True)
                shutil.rmtree(tmp / "out")
                res[name].append(r)
                changed = len(json.loads(r["stdout"]).get("tensors_changed", [])) if name != "fold-bias" else None
                print(f"run {i + 1} {name}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU ({r['user']:.1f} user + "
                      f"{r['sys']:.1f} sys), {r['rss'] / 2**20:.0f} MiB "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})"
                      + (f"; {changed} tensors changed" if changed is not None else ""), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: (statistics.median(r["wall"] for r in v), statistics.median(r["cpu"] for r in v),
               max(r["rss"] for r in v), statistics.median(r["user"] for r in v)) for k, v in res.items()}
    fb = med["fold-bias"]
    for k, (w, c, rss, u) in med.items():
        print(f"median {k}: {w:.1f} s wall ({w / fb[0]:.2f}x fold-bias), {c:.1f} s CPU ({c / fb[1]:.2f}x), "
              f"{u:.1f} s user ({u / fb[3]:.2f}x), peak {rss / 2**20:.0f} MiB")


if __name__ == "__main__":
    raise SystemExit(main())
