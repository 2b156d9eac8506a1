"""Benchmark: peak memory of HF -> GGUF, ours vs llama.cpp's convert_hf_to_gguf.py (issue 33 item 4).

Two Qwen2-shaped bf16 checkpoints of the same geometry (``make_qwen25_shape.py``: hidden 512,
8 / 2 heads of 64, ffn 2048, the real 151936-token Qwen2 vocabulary, untied head), ``deep8``
with 8 layers and ``deep`` with 64: the 64-layer model is ~5x its largest tensor (the
151936 x 512 embedding and head: 156 MB bf16, 311 MB f32), so a converter whose memory follows
the largest tensor shows the same peak on both, and one whose memory follows the model grows.

For each ``--dtypes`` entry (default ``f16,q8_0``) and each model, both converters run as fresh
processes (tests/llamacpp_src.py's sdist, its own gguf-py, for llama.cpp's); peak RSS is
sampled over the whole process tree (psutil, every 50 ms: our CLI asks transformers in a
short-lived child, which counts).  ``--split SIZE`` adds ``--split-max-size SIZE`` to both sides.
Ours runs once untimed first per model (the answer cache: a second conversion of a config
imports no transformers; ``--cold`` measures the first run instead).  Printed per dtype and model:
both peaks, ours / llama.cpp, the growth from 8 to 64 layers of each beside the model's, and the
target "peak RSS <= the largest tensor's f32 size + 300 MB".  Outputs are compared tensor by
tensor (the bytes must be identical).

Usage: python benchmarks/bench_convert_memory.py [--dtypes f16,q8_0] [--split 200M] [--cold]
           [--dir .bench] [--keep]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.bench_convert import _hf_source, _run_cmd  # noqa: E402
from benchmarks.make_qwen25_shape import SHAPES  # noqa: E402

MODELS = ("deep8", "deep")


def _largest_f32(shape: str) -> int:
    g = SHAPES[shape]
    return max(g.vocab * g.hidden, g.ffn * g.hidden, g.hidden * g.heads * g.head_dim) * 4


def _digests(files: list[Path]) -> dict:
    import hashlib

    from ckpt_surgeon.formats.gguf import open_gguf
    g = open_gguf(files[0])
    try:
        return {n: hashlib.sha256(g.read_bytes(i)).hexdigest() for n, i in g.tensors.items()}
    finally:
        g.close()


def _ours(src: Path, out: Path, dtype: str, split: str | None) -> dict:
    cmd = [sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(out), "--dtype", dtype,
           "--no-progress", "--force", "--name", "bench"]
    return _run_cmd(cmd + (["--split-max-size", split] if split else []))


def _theirs(llamacpp: Path, src: Path, out: Path, dtype: str, split: str | None) -> dict:
    cmd = [sys.executable, str(llamacpp / "convert_hf_to_gguf.py"), str(src), "--outtype", dtype, "--outfile", str(out)]
    return _run_cmd(cmd + (["--split-max-size", split] if split else []), pythonpath=str(llamacpp / "gguf-py"))


def _outputs(out: Path) -> list[Path]:
    return sorted(out.parent.glob(out.stem + "-*-of-*.gguf")) or [out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="f16,q8_0")
    ap.add_argument("--split", default=None, metavar="SIZE", help="--split-max-size for both converters")
    ap.add_argument("--cold", action="store_true", help="measure ours on its first run (transformers asked)")
    ap.add_argument("--dir", default=str(ROOT / ".bench"))
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    args = ap.parse_args()
    from llamacpp_src import llamacpp_source
    llamacpp = llamacpp_source()
    srcs = {m: _hf_source(m, Path(args.dir) / f"qwen2-{m}-shape", llamacpp) for m in MODELS}
    work = Path(tempfile.mkdtemp(prefix="bench-convert-memory-", dir=args.dir))
    try:
        for dtype in args.dtypes.split(","):
            _one_dtype(llamacpp, srcs, work, dtype, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _one_dtype(llamacpp: Path, srcs: dict, work: Path, dtype: str, args) -> None:
    peaks = {}
    for m, src in srcs.items():
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        out_o, out_t = work / f"ours-{m}-{dtype}.gguf", work / f"llamacpp-{m}-{dtype}.gguf"
        if not args.cold:
            _ours(src, out_o, dtype, args.split)
        o = _ours(src, out_o, dtype, args.split)
        t = _theirs(llamacpp, src, out_t, dtype, args.split)
        fo, ft = _outputs(out_o), _outputs(out_t)
        same = _digests(fo) == _digests(ft) and [p.name.replace("ours", "") for p in fo] == \
            [p.name.replace("llamacpp", "") for p in ft]
        peaks[m] = (o["sampled_rss_mb"], t["sampled_rss_mb"], size)
        target = _largest_f32(m) / 2**20 + 300
        print(f"{dtype:5} {m:6} ({size / 1e9:.2f} GB bf16, largest tensor {_largest_f32(m) / 2**20:.0f} MiB f32): "
              f"ours {o['sampled_rss_mb']:6.0f} MiB in {o['wall_s']:5.1f} s, llama.cpp {t['sampled_rss_mb']:6.0f} MiB "
              f"in {t['wall_s']:5.1f} s, ratio {o['sampled_rss_mb'] / t['sampled_rss_mb']:.2f}; target <= "
              f"{target:.0f} MiB: {'met' if o['sampled_rss_mb'] <= target else 'NOT met'}; {len(fo)} file(s), "
              f"tensors {'identical' if same else 'DIFFERENT'}", flush=True)
        for p in fo + ft:
            p.unlink()
    (o8, t8, s8), (o64, t64, s64) = peaks["deep8"], peaks["deep"]
    print(f"{dtype:5} growth 8 -> 64 layers (model +{(s64 - s8) / 2**20:.0f} MiB): ours {o64 - o8:+.0f} MiB, "
          f"llama.cpp {t64 - t8:+.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
