"""Issue 33's scale-shape target, on the path ``convert`` takes for DeepSeek-V3 (derived: llama.cpp's
``DeepseekV2Model`` plans, our reader / quantizer / splitter write).

DeepSeek-V3's real tensor count and layout -- 61 layers (3 dense, 58 MoE) + the stored MTP layer,
256 routed experts + 1 shared, MLA, one safetensors file per layer -- at tiny widths, FP8 block
source (fixtures/dsv3_fp8.py), converted to q4_k_m split into 4 parts (``--split-max-tensors``: the
only split llama.cpp's route cuts at the same tensors, since llama-quantize keeps the f32 parts'
boundaries).  Against llama.cpp's route: ``convert_hf_to_gguf.py --outtype f32`` split the same way,
then ``llama-quantize --keep-split`` (llama-cpp-python's ``llama_model_quantize``).  Printed: wall
time and peak RSS of each (the whole process tree, psutil, sampled every 50 ms), the disk each
route writes besides its final parts (llama.cpp: its f32 set; ours: nothing -- the parts are
written into one hidden folder and renamed), and whether every part holds the same tensors with
the same bytes.

    python benchmarks/bench_convert_dsv3_shape.py [--work DIR] [--layers 61 --experts 256] [--keep]
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks._proc import tree_measured as measured  # noqa: E402


def n_gguf_tensors(layers: int, dense: int) -> int:
    """DeepSeek-V3's GGUF tensor count (llama.cpp's deepseek2): 3 + 13 per dense layer + 18 per MoE layer."""
    return 3 + 13 * dense + 18 * (layers - dense)


def llamacpp_route(src: Path, work: Path, per_part: int) -> tuple[list[Path], dict]:
    import llama_cpp
    from llamacpp_src import llamacpp_source
    root = llamacpp_source()
    (work / "f32").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
    conv = measured([sys.executable, str(ROOT / "tests" / "llamacpp_ref_split.py"), str(root), str(src),
                     str(work / "f32" / "m.gguf"), "gpt-2", "f32", "--split-max-tensors", str(per_part)],
                    env=env, watch=work / "f32")
    f32 = sorted((work / "f32").glob("m-*.gguf"))
    t0 = time.perf_counter()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.keep_split = True
    (work / "lq").mkdir()
    if llama_cpp.llama_model_quantize(str(f32[0]).encode(), str(work / "lq" / "m").encode(), ctypes.byref(params)):
        raise SystemExit("llama_model_quantize failed")
    quant_wall = time.perf_counter() - t0
    parts = sorted((work / "lq").glob("m-*.gguf"))
    return parts, {"convert": conv, "quantize_wall": quant_wall, "f32_bytes": sum(p.stat().st_size for p in f32)}


def same_parts(ours: list[Path], theirs: list[Path]) -> tuple[bool, int]:
    from ckpt_surgeon.checkpoint import open_checkpoint
    n = 0
    if len(ours) != len(theirs):
        return False, 0
    for a_path, b_path in zip(ours, theirs):
        with open_checkpoint(a_path) as a, open_checkpoint(b_path) as b:
            pa = [k for k, i in a.tensors.items() if i.file == str(a_path)]
            pb = [k for k, i in b.tensors.items() if i.file == str(b_path)]
            if pa != pb or any((a.tensors[k].dtype, a.read_raw(k)) != (b.tensors[k].dtype, b.read_raw(k)) for k in pa):
                return False, n
            n += len(pa)
    return True, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    from fixtures.build_fixtures import fixture_path
    from fixtures.dsv3_fp8 import write_dsv3_fp8
    from llamacpp_src import llamacpp_source
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-dsv3-"))
    src = work / "dsv3-fp8"
    if not src.exists():
        t0 = time.perf_counter()
        write_dsv3_fp8(src, layers=a.layers, experts=a.experts, tokenizer_from=fixture_path("llama"))
        print(f"source written in {time.perf_counter() - t0:.0f} s", flush=True)
    n_src = sum(1 for _ in __import__("json").loads((src / "model.safetensors.index.json").read_text())["weight_map"])
    src_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    total = n_gguf_tensors(a.layers, 3)
    per_part = math.ceil(total / 4)
    print(f"source: {n_src} tensors, {src_bytes / 2**20:.0f} MiB FP8 block safetensors in {len(list(src.glob('*.safetensors')))} files; "
          f"GGUF: {total} tensors, --split-max-tensors {per_part} (4 parts)", flush=True)
    for d in ("ours", "f32", "lq"):
        shutil.rmtree(work / d, ignore_errors=True)
    (work / "ours").mkdir()
    env = dict(os.environ, CKPT_SURGEON_LLAMACPP_SRC=str(llamacpp_source()),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    ours = measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(work / "ours" / "m.gguf"),
                     "--dtype", "q4_k_m", "--split-max-tensors", str(per_part), "--no-progress"], env=env,
                    watch=work / "ours")
    ours_parts = sorted((work / "ours").glob("m-*.gguf"))
    out_bytes = sum(p.stat().st_size for p in ours_parts)
    print(f"ours (convert, one pass): {ours['wall']:.1f} s, peak RSS {ours['rss'] / 2**20:.0f} MiB (process tree), "
          f"{len(ours_parts)} parts, {out_bytes / 2**20:.1f} MiB; most bytes on disk during the run "
          f"{ours['disk'] / 2**20:.1f} MiB", flush=True)
    theirs, lc = llamacpp_route(src, work, per_part)
    print(f"llama.cpp (convert_hf_to_gguf.py --outtype f32 + llama-quantize --keep-split): converter "
          f"{lc['convert']['wall']:.1f} s, peak RSS {lc['convert']['rss'] / 2**20:.0f} MiB, f32 set "
          f"{lc['f32_bytes'] / 2**20:.0f} MiB on disk; quantize {lc['quantize_wall']:.1f} s (in this process)", flush=True)
    ok, n = same_parts(ours_parts, theirs)
    print(f"identical: {ok} ({len(theirs)} parts, {n} tensors compared by type and bytes)")
    if not a.keep and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
