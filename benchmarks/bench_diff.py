"""Benchmark: ``ckpt-surgeon diff A B`` on two checkpoints that differ in one tensor vs plain
sequential reads of the same files.

The pair is written once: A holds ``--tensors`` bf16 matrices totalling ``--mb`` MiB (random
values, 7B-like 4096-wide rows), B is A with one tensor in the middle changed.  Measured, each
as a whole process (imports included):

* ours:      ``ckpt-surgeon diff A B --format json``
* reference: reading both files front to back with ``readinto`` into one 8 MiB buffer (the
  sequential read speed of whatever holds the files: page cache on a warm run, the disk on a
  cold one) in the same run.

Printed: wall time, peak RSS, throughput, and ours / reference speed (target >= 0.8).  The
issue's target is two 15 GB files at >= 80 % of the disk's speed with RSS < 300 MB; ``--mb``
scales the pair (files larger than RAM measure the disk, smaller ones the page cache).

``--pair A B`` diffs two existing checkpoints instead (files or folders; e.g. the 7B-shaped folder
of ``make_qwen25_shape.py`` and a copy of it with one tensor's bytes changed), the issue's setting.

Usage: python benchmarks/bench_diff.py [--dir .bench/diff-pair] [--mb 512] [--repeat 3] [--pair A B]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._proc import run  # noqa: E402

READ_ALL = r"""
import sys
buf = bytearray(8 << 20)
n = 0
for p in sys.argv[1:]:
    with open(p, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            n += k
print(n)
"""

EXIT_1_OK = "import subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; sys.exit(0 if rc in (0, 1) else rc)"


def make_pair(d: Path, mb: int, n_tensors: int) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file
    a, b = d / "a.safetensors", d / "b.safetensors"
    if a.is_file() and b.is_file():
        return a, b
    d.mkdir(parents=True, exist_ok=True)
    rows = max(1, (mb << 20) // (n_tensors * 4096 * 2))
    rng = np.random.default_rng(0)
    # random bf16 values from random finite float32s (no NaN payloads, so values compare normally)
    block = torch.from_numpy(rng.standard_normal((rows, 4096), dtype=np.float32)).to(torch.bfloat16)
    tensors = {f"model.layers.{i}.mlp.w.weight": torch.roll(block, i, 0).contiguous() for i in range(n_tensors)}
    save_file(tensors, str(a))
    tensors[f"model.layers.{n_tensors // 2}.mlp.w.weight"] = torch.flip(block, (0,)).contiguous()
    save_file(tensors, str(b))
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/diff-pair")
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"), help="diff these two existing checkpoints instead")
    a = ap.parse_args()
    pa, pb = (Path(p) for p in a.pair) if a.pair else make_pair(Path(a.dir), a.mb, a.tensors)
    files = [f for p in (pa, pb) for f in ([p] if p.is_file() else sorted(p.glob("*.safetensors")))]
    total = sum(f.stat().st_size for f in files)
    # diff exits 1 when the checkpoints differ (as they do here): a shim turns that into 0 for run()
    ours = min((run([sys.executable, "-c", EXIT_1_OK, sys.executable, "-m", "ckpt_surgeon", "diff", str(pa), str(pb),
                     "--format", "json"]) for _ in range(a.repeat)), key=lambda r: r["wall"])
    ref = min((run([sys.executable, "-c", READ_ALL, *map(str, files)]) for _ in range(a.repeat)),
              key=lambda r: r["wall"])
    rep = json.loads(ours["stdout"])
    changed = [t["name"] for t in rep["tensors"] if t["status"] != "identical"]
    print(f"pair: {total / 2**30:,.2f} GiB in {len(files)} files, {len(rep['tensors'])} tensors, changed: {changed}")
    for name, r in (("ours (diff)", ours), ("reference (sequential read)", ref)):
        print(f"{name:30s} wall {r['wall']:.2f} s  {total / r['wall'] / 2**20:,.0f} MiB/s  "
              f"peak RSS {r['rss'] / 2**20:,.0f} MiB")
    print(f"speed ours / reference: {ref['wall'] / ours['wall']:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
