"""Benchmark: ``ckpt-surgeon inspect`` on a Qwen2.5-7B-shaped checkpoint vs the power-user script.

Both run as whole processes (imports included, which is what a user waits for):

* ours:      ``ckpt-surgeon inspect DIR --format json``
* reference: the 10-line script a power user writes (safe_open each shard with
  torch, read every ``.bias``, take norms) — measured at 3.2 s on this machine
  class when the issue was filed, mostly importing torch.

Printed per tool: wall time (best of --repeat), peak RSS of the process, bytes of
checkpoint data read (ours: the reader's own counter, which is exact; reference:
the bytes of the bias tensors it asks for, a lower bound since safetensors mmaps),
and the ratios.  Targets: wall < 1 s, reads < 0.1 % of the checkpoint, RSS < 300 MB.

Usage: python benchmarks/bench_inspect.py [--dir .bench/qwen2.5-7b-shape] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._proc import run  # noqa: E402  (wall time + peak RSS of a child process)
from benchmarks.make_qwen25_shape import make_qwen25_shape  # noqa: E402

REFERENCE = r"""
import glob, sys, torch
from safetensors import safe_open
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with safe_open(f, "pt") as s:
        for k in s.keys():
            if k.endswith(".bias"):
                t = s.get_tensor(k).float()
                print(k, float(t.norm()), float(t.abs().max()))
"""

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    d = make_qwen25_shape(a.dir)
    total = sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))
    exe = [sys.executable, "-m", "ckpt_surgeon", "inspect", str(d), "--format", "json"]
    ref = [sys.executable, "-c", REFERENCE, str(d)]
    ours_runs = [run(exe) for _ in range(a.repeat)]
    ref_runs = [run(ref) for _ in range(a.repeat)]
    ours = min(ours_runs, key=lambda r: r["wall"])
    theirs = min(ref_runs, key=lambda r: r["wall"])
    rep = json.loads(ours["stdout"])
    ours_bytes = rep["bytes_read"]
    bias_bytes = sum(2 * (3584 + 512 + 512) for _ in range(28))
    print(f"checkpoint: {d} ({total / 1e9:.2f} GB, {rep['num_layers']} layers, {rep['layers_with_qkv_bias']} with qkv bias)")
    print(f"{'tool':<28}{'wall s':>9}{'peak RSS MB':>13}{'bytes read':>14}{'% of ckpt':>11}")
    print(f"{'ckpt-surgeon inspect':<28}{ours['wall']:>9.3f}{ours['rss'] / 1e6:>13.1f}{ours_bytes:>14,}{100 * ours_bytes / total:>10.5f}%")
    print(f"{'power-user script (torch)':<28}{theirs['wall']:>9.3f}{theirs['rss'] / 1e6:>13.1f}{bias_bytes:>14,}{100 * bias_bytes / total:>10.5f}%")
    print(f"ratio wall (reference / ours): {theirs['wall'] / ours['wall']:.2f}x   "
          f"RSS (reference / ours): {theirs['rss'] / ours['rss']:.2f}x")
    ok = ours["wall"] < 1.0 and ours_bytes < 0.001 * total and ours["rss"] < 300e6
    print(f"targets (wall < 1 s, reads < 0.1 %, RSS < 300 MB): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
