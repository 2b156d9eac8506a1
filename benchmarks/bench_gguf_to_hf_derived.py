"""GGUF -> HF on the derived path (llama.cpp's class inverted by probing it): time and peak memory on a model
far larger than the tests', and the round trip checked tensor by tensor.

    python benchmarks/bench_gguf_to_hf_derived.py [--hidden 2048] [--layers 8] [--vocab 32768]
                                                  [--code DIR]   # another checkout, for an A/B run

A random OLMo (transformers' OlmoConfig; llama.cpp's ``OlmoModel`` is outside our registry, and permutes Q/K)
is written as bf16 safetensors, converted HF -> GGUF at f32 by ``convert`` (the derived path, byte-identical
to llama.cpp's converter), then back with ``--config``, as a fresh process whose process tree's peak RSS is
sampled.  Printed beside it: the model's and its largest tensor's float32 size (the memory a whole-model
gather needs, and the one a per-group gather needs), and whether every tensor came back bit for bit.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    import numpy as np
    from bench_convert_derived import build
    from benchmarks._proc import tree_measured
    from llamacpp_src import llamacpp_source

    from ckpt_surgeon.checkpoint import open_checkpoint
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--code", type=Path, default=ROOT, help="the ckpt-surgeon checkout whose GGUF -> HF is measured")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(a.code.resolve()), CKPT_SURGEON_LLAMACPP_SRC=str(llamacpp_source()))
    work = Path(tempfile.mkdtemp(prefix="bench-g2h-", dir=a.work))
    try:
        src = build(work / "olmo", a.hidden, a.layers, a.vocab)
        gguf = work / "olmo.f32.gguf"
        # run from the scratch folder: ``python -m`` puts the working directory first on sys.path, which must not
        # shadow --code's checkout with this one
        os.chdir(work)
        r = tree_measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(gguf), "--dtype",
                           "f32", "--no-progress"], env)
        with open_checkpoint(src) as ck:
            sizes = [int(np.prod(i.shape)) * 4 for i in ck.tensors.values()]
        print(f"OLMo hidden {a.hidden} x {a.layers} layers, vocab {a.vocab}: {sum(sizes) / 2**20:,.0f} MiB as f32, "
              f"largest tensor {max(sizes) / 2**20:,.0f} MiB; HF -> GGUF f32 {r['wall']:.1f} s", flush=True)
        back = work / "back"
        t = tree_measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(gguf), "-o", str(back),
                           "--config", str(src), "--no-progress"], env)
        same = True
        with open_checkpoint(src) as x, open_checkpoint(back) as y:
            same = sorted(x.tensors) == sorted(y.tensors) and all(
                np.array_equal(x.read(n).astype(np.float32).view(np.uint32), y.read(n).view(np.uint32))
                for n in x.tensors)
        print(f"GGUF -> HF ({a.code}): {t['wall']:.1f} s wall, {t['cpu']:.1f} s CPU, peak RSS "
              f"{t['rss'] / 2**20:,.0f} MiB   round trip {'identical' if same else 'DIFFERENT'}", flush=True)
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
