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

Usage: python benchmarks/bench_kv.py [--dir .bench/qwen2.5-7b-shape] [--sparse] [--shape 7b] [--inner 3] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import shutil
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
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--shape", default="7b", help="7b | 0.5b | small (make_qwen25_shape.py)")
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="only the static prediction")
    a = ap.parse_args(argv)
    src = make_qwen25_shape(a.dir, sparse=a.sparse, quiet=True, shape=a.shape)
    res = json.loads(run([sys.executable, "-c", STATIC, str(src), REPO, str(a.inner)])["stdout"])
    print(f"static kv_cache_report (q4_0,q8_0): {res['seconds']:.2f} s (best of {a.inner}); at risk {res['at_risk']}; "
          f"torch imported: {res['torch']}")
    cli = [sys.executable, "-m", "ckpt_surgeon"]
    cmd = run(cli + ["analyze", str(src), "--kv-cache", "q4_0,q8_0", "--format", "json"])
    print(f"analyze --kv-cache command: {cmd['wall']:.2f} s wall, {cmd['rss'] / 2**20:.0f} MiB peak RSS")
    if a.no_write:
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-", dir=Path(a.dir).parent))
    try:
        eq = run(cli + ["kv-equalize", str(src), "-o", str(tmp / "eq"), "--cache-type-k", "q4_0", "--cache-type-v",
                        "q8_0", "--format", "json"], sync=True)
        shutil.rmtree(tmp / "eq")
        fb = run(cli + ["fold-bias", str(src), "-o", str(tmp / "fb"), "--k", "--approximate", "--max-logit-change",
                        "0.01", "--format", "json"], sync=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"kv-equalize: {eq['wall']:.1f} s, {eq['rss'] / 2**20:.0f} MiB; fold-bias --k --approximate: "
          f"{fb['wall']:.1f} s, {fb['rss'] / 2**20:.0f} MiB; ratio {eq['wall'] / fb['wall']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
