"""Benchmark: an NVFP4 7B-shaped folder converted to dense bf16 and to GGUF in bounded memory (issue 49).

The source is the Qwen2.5-7B geometry of ``make_qwen25_shape.py`` (28 layers, hidden 3584, ffn 18944, vocab
152064, 4 shards) stored as llmcompressor writes NVFP4A16 (``compressed-tensors``, ``nvfp4-pack-quantized``,
the fixture ``fixtures/quant/ct_nvfp4a16``'s quantization_config): every decoder Linear as ``weight_packed``
U8 ``[out, in/2]``, ``weight_scale`` F8_E4M3 ``[out, in/16]``, ``weight_global_scale`` F32 ``[1]``;
embeddings, head, norms and biases bf16; llama.cpp's qwen2 vocabulary as tokenizer.json.  Codes are random
bytes (a reused random block), block scales random normal E4M3 values, global scales random: the values do
not matter to memory, the layout does.  ~5.9 GB.

Runs, each a fresh process, peak RSS sampled over the process tree every 50 ms (``bench_convert._run_cmd``):

* ``convert SRC -o DENSE --dtype bfloat16`` (the dense HF folder, ~15 GB written);
* ``convert SRC -o OUT.gguf --dtype f16`` (NVFP4 kept NVFP4, embeddings / head f16);
* with ``--reference``: llama.cpp's ``convert_hf_to_gguf.py --outtype f16`` on the same folder (the
  llama-cpp-python sdist's, tests/llamacpp_src.py), and the two GGUF files compared tensor by tensor.

The target: each of ours below 1 GiB peak RSS.  Results go to ``benchmarks/results/fp4_memory.json``.

Usage: python benchmarks/bench_fp4_memory.py [--shape 7b|small] [--dir .bench] [--reference] [--keep]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.bench_convert import _run_cmd, _tensor_digests, qwen2_tokenizer  # noqa: E402
from benchmarks.make_qwen25_shape import SHAPES, _bf16, _fill_value, config, tensor_specs  # noqa: E402

LINEAR = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
          "up_proj.weight", "down_proj.weight")
TARGET_MB = 1024


def _nvfp4_specs(shape) -> list[tuple[str, str, tuple]]:
    """(name, dtype, shape) of the stored tensors, in the base model's order."""
    out = []
    for name, dims in tensor_specs(shape):
        if name.startswith("model.layers.") and name.endswith(LINEAR):
            stem = name[:-len(".weight")]
            o, i = dims
            out += [(stem + ".weight_packed", "U8", (o, i // 2)), (stem + ".weight_scale", "F8_E4M3", (o, i // 16)),
                    (stem + ".weight_global_scale", "F32", (1,))]
        else:
            out.append((name, "BF16", dims))
    return out


_SIZE = {"U8": 1, "F8_E4M3": 1, "F32": 4, "BF16": 2}


def make_nvfp4_shape(out: Path, shape: str) -> Path:
    """The NVFP4 folder (see the module doc), written once (``.complete`` marks it)."""
    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    geo = SHAPES[shape]
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, 1 << 25, dtype=np.uint8).tobytes()                 # 32 MB of random codes
    # block scales: positive E4M3 values around 2^-7 .. 2^-3 (normal, finite: no 0x7F NaN)
    scales = np.frombuffer(np.abs(rng.standard_normal(1 << 22) * 0.02 + 0.02).astype(np.float32).tobytes(),
                           np.float32)
    import torch
    scale_bytes = torch.from_numpy(scales.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()
    bf16_block = _bf16(rng.standard_normal(1 << 24) * 0.02)
    specs = _nvfp4_specs(geo)
    total = sum(int(np.prod(d)) * _SIZE[t] for _, t, d in specs)
    target = total / geo.shards
    shards, cur, size = [], [], 0
    for spec in specs:
        nb = int(np.prod(spec[2])) * _SIZE[spec[1]]
        if cur and size + nb > target and len(shards) < geo.shards - 1:
            shards.append(cur)
            cur, size = [], 0
        cur.append(spec)
        size += nb
    shards.append(cur)
    weight_map = {}
    for si, shard in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dt, dims in shard:
            nb = int(np.prod(dims)) * _SIZE[dt]
            header[name] = {"dtype": dt, "shape": list(dims), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(out / fname, "wb") as f:
            f.write(len(hb).to_bytes(8, "little") + hb)
            for name, dt, dims in shard:
                nb = int(np.prod(dims)) * _SIZE[dt]
                if dt == "F32":
                    f.write(np.array([rng.uniform(2e3, 3e4)], np.float32).tobytes())     # 448 * 6 / amax
                    continue
                val = _fill_value(name, dims, rng, geo.layers, "random", geo.head_dim) if dt == "BF16" else None
                block = {"U8": codes, "F8_E4M3": scale_bytes, "BF16": bf16_block}[dt]
                if val is not None:
                    f.write(val)
                    continue
                left = nb
                while left:
                    k = min(left, len(block))
                    f.write(block[:k])
                    left -= k
        print(f"wrote {fname} ({(out / fname).stat().st_size / 1e9:.2f} GB)", file=sys.stderr)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    q = json.loads((ROOT / "fixtures" / "quant" / "ct_nvfp4a16" / "config.json").read_text())["quantization_config"]
    (out / "config.json").write_text(json.dumps({**config(geo), "quantization_config": q}, indent=2))
    (out / ".complete").write_text("ok\n")
    return out


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def _figures(shape: str, source_bytes: int, runs: dict, load: str) -> dict:
    """The results file benchmarks/report.py reads (section convert): one figure per output."""
    from benchmarks.machine import command, machine
    ref = runs.get("llamacpp_gguf_f16")
    common = {"machine": machine(load), "date": datetime.date.today().isoformat(), "command": command()}
    src = f"an NVFP4 {shape}-shaped folder (compressed-tensors NVFP4A16 layout, {source_bytes / 1e9:.1f} GB)"
    dense, gguf = runs["dense_bf16"], runs["gguf_f16"]
    figs = [{"what": f"convert {src} to a dense bfloat16 folder, streamed",
             "ours": f"{dense['peak_rss_mb']:.0f} MiB peak RSS, {dense['wall_s']:.0f} s",
             "anchor": f"the target: < {TARGET_MB} MiB", "ratio": f"{dense['peak_rss_mb'] / TARGET_MB:.2f}x of it",
             **common},
            {"what": f"convert {src} to GGUF f16 (NVFP4 kept)",
             "ours": f"{gguf['peak_rss_mb']:.0f} MiB peak RSS, {gguf['wall_s']:.0f} s"
                     + ("; tensors identical to llama.cpp's" if runs.get("gguf_tensors_identical") else ""),
             "anchor": (f"llama.cpp's convert_hf_to_gguf.py: {ref['peak_rss_mb']:.0f} MiB, {ref['wall_s']:.0f} s"
                        if ref else f"the target: < {TARGET_MB} MiB"),
             "ratio": (f"{gguf['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x its memory, "
                       f"{gguf['wall_s'] / ref['wall_s']:.2f}x its time" if ref else
                       f"{gguf['peak_rss_mb'] / TARGET_MB:.2f}x of the target"),
             **common}]
    return {"section": "convert", "figures": figs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench")
    ap.add_argument("--reference", action="store_true", help="also run llama.cpp's converter and compare")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    args = ap.parse_args()
    from tests.llamacpp_src import llamacpp_source

    from benchmarks.machine import load_note
    load = load_note()
    llamacpp = llamacpp_source()
    src = make_nvfp4_shape(args.dir / f"nvfp4-{args.shape}-shape", args.shape)
    qwen2_tokenizer(src, llamacpp)
    work = args.dir / f"nvfp4-{args.shape}-out"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cli = [sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "--no-progress", "--force"]
    runs = {}
    for label, extra in (("dense_bf16", ["-o", str(work / "dense"), "--dtype", "bfloat16"]),
                         ("gguf_f16", ["-o", str(work / "ours.gguf"), "--dtype", "f16", "--name", "bench"])):
        r = _run_cmd(cli + extra)
        out = work / ("dense" if label == "dense_bf16" else "ours.gguf")
        runs[label] = {"wall_s": round(r["wall_s"], 1), "peak_rss_mb": round(r["sampled_rss_mb"], 1),
                       "output_bytes": _size(out), "below_target": r["sampled_rss_mb"] < TARGET_MB}
        print(f"{label}: {r['wall_s']:.1f} s, peak RSS {r['sampled_rss_mb']:.0f} MiB, "
              f"{_size(out) / 1e9:.2f} GB written", file=sys.stderr)
        if label == "dense_bf16" and not args.keep:
            shutil.rmtree(out)
    if args.reference:
        script = llamacpp / "convert_hf_to_gguf.py"
        env_path = str(llamacpp / "gguf-py")
        os.environ["NO_LOCAL_GGUF"] = "1"
        r = _run_cmd([sys.executable, str(script), str(src), "--outfile", str(work / "ref.gguf"), "--outtype", "f16"],
                     pythonpath=env_path)
        a, b = _tensor_digests(work / "ours.gguf"), _tensor_digests(work / "ref.gguf")
        runs["llamacpp_gguf_f16"] = {"wall_s": round(r["wall_s"], 1), "peak_rss_mb": round(r["sampled_rss_mb"], 1),
                                     "output_bytes": _size(work / "ref.gguf")}
        runs["gguf_tensors_identical"] = a == b
        print(f"llama.cpp: {r['wall_s']:.1f} s, peak RSS {r['sampled_rss_mb']:.0f} MiB; tensors identical: {a == b}",
              file=sys.stderr)
    result = _figures(args.shape, _size(src), runs, load)
    res = ROOT / "benchmarks" / "results" / "fp4_memory.json"
    res.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
