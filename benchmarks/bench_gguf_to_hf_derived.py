"""GGUF -> HF on the derived path (llama.cpp's class inverted by probing it): time and peak memory on a model
far larger than the tests', and the round trip checked tensor by tensor.

    python benchmarks/bench_gguf_to_hf_derived.py [--hidden 2048] [--layers 8] [--vocab 32768]
                                                  [--code DIR]   # another checkout, for an A/B run
    python benchmarks/bench_gguf_to_hf_derived.py --from-shape .bench/qwen2.5-7b-shape --outtype bf16 --work DIR

``--from-shape``: instead of the random OLMo, the Qwen2.5-shaped bf16 shards of ``make_qwen25_shape.py`` (7B: 15.2 GB)
under a Seed-OSS config (llama.cpp's ``SeedOssModel``, outside our registry), as bench_convert_derived.py does;
``--outtype bf16`` keeps the GGUF and the HF folder written back (``--dtype bfloat16``) at the source's size; the
round trip is then bf16 -> bf16, still bit for bit (tensors the GGUF keeps in F32, the norms, are exact in bf16).

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
    from bench_convert_derived import build, from_shape
    from benchmarks._proc import tree_measured
    from llamacpp_src import llamacpp_source

    from ckpt_surgeon.checkpoint import open_checkpoint
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--code", type=Path, default=ROOT, help="the ckpt-surgeon checkout whose GGUF -> HF is measured")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    ap.add_argument("--from-shape", type=Path, default=None, help="a make_qwen25_shape.py folder, as Seed-OSS")
    ap.add_argument("--outtype", default="f32", choices=("f32", "bf16", "f16"), help="the GGUF's type (default f32)")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(a.code.resolve()), CKPT_SURGEON_LLAMACPP_SRC=str(llamacpp_source()))
    work = Path(tempfile.mkdtemp(prefix="bench-g2h-", dir=a.work)).resolve()     # absolute: the runs chdir into it
    try:
        if a.from_shape:
            src = from_shape(a.from_shape.resolve(), work / "seed_oss")
            what = f"Seed-OSS over {a.from_shape.name}"
        else:
            src = build(work / "olmo", a.hidden, a.layers, a.vocab)
            what = f"OLMo hidden {a.hidden} x {a.layers} layers, vocab {a.vocab}"
        gguf = work / f"model.{a.outtype}.gguf"
        # run from the scratch folder: ``python -m`` puts the working directory first on sys.path, which must not
        # shadow --code's checkout with this one
        os.chdir(work)
        r = tree_measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(gguf), "--dtype",
                           a.outtype, "--no-progress"], env)
        with open_checkpoint(src) as ck:
            sizes = [int(np.prod(i.shape)) * 4 for i in ck.tensors.values()]
        print(f"{what}: {sum(sizes) / 2**20:,.0f} MiB as f32, largest tensor {max(sizes) / 2**20:,.0f} MiB; "
              f"HF -> GGUF {a.outtype} {r['wall']:.1f} s, peak RSS {r['rss'] / 2**20:,.0f} MiB", flush=True)
        back = work / "back"
        hf_dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.outtype]
        t = tree_measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(gguf), "-o", str(back),
                           "--config", str(src), "--dtype", hf_dtype, "--no-progress"], env)
        same = True
        with open_checkpoint(src) as x, open_checkpoint(back) as y:
            same = sorted(x.tensors) == sorted(y.tensors) and all(
                np.array_equal(x.read(n).astype(np.float32).view(np.uint32), y.read(n).astype(np.float32).view(np.uint32))
                for n in x.tensors)
        print(f"GGUF -> HF ({a.code}): {t['wall']:.1f} s wall, {t['cpu']:.1f} s CPU, peak RSS "
              f"{t['rss'] / 2**20:,.0f} MiB   round trip {'identical' if same else 'DIFFERENT'}", flush=True)
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
