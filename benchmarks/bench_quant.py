"""Benchmark: dequantization of quantized HF Linears (``ckpt_surgeon.formats.quant.kernels``).

Melements/s per scheme on one 7B-class MLP projection (``--rows 18944 --cols 3584``, Qwen2.5-7B's
``gate_proj``) made of random codes and float16 scales (the kernels' cost does not depend on the
values): GPTQ 4-bit group 128 (in-order and act-order ``g_idx``), AWQ GEMM 4-bit, compressed-tensors
pack-quantized 4-bit, MLX affine 4-bit (bfloat16 arithmetic), FP8 block 128x128, bitsandbytes NF4.
Best of ``--repeat``.  No target is set by the issue; this is the figure to watch when the kernels
change (a 7B checkpoint holds ~200 such matrices' worth of elements).

Usage: python benchmarks/bench_quant.py [--repeat 3] [--rows 18944 --cols 3584]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckpt_surgeon.formats.quant.kernels import dequantize  # noqa: E402
from ckpt_surgeon.formats.quant.schemes import QuantTensor  # noqa: E402


def _cases(rows: int, cols: int, rng):
    i32 = lambda *shape: rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int64).astype(np.int32)  # noqa: E731
    f16 = lambda *shape: rng.random(shape, dtype=np.float32).astype(np.float16).astype(np.float32)  # noqa: E731
    G = cols // 128
    order = (np.arange(cols) // 128).astype(np.int32)
    gptq = {"qweight": i32(cols // 8, rows), "qzeros": i32(G, rows // 8), "scales": f16(G, rows), "g_idx": order}
    yield "gptq 4-bit g128", QuantTensor("w", "m", "gptq", tuple((r, r) for r in gptq), (rows, cols), 4, 128,
                                         params=(("zero_offset", 1),)), gptq
    act = dict(gptq, g_idx=rng.permutation(order).astype(np.int32))
    yield "gptq 4-bit act-order", QuantTensor("w", "m", "gptq", tuple((r, r) for r in act), (rows, cols), 4, 128,
                                              params=(("zero_offset", 1),)), act
    awq = {"qweight": i32(cols, rows // 8), "qzeros": i32(G, rows // 8), "scales": f16(G, rows)}
    yield "awq gemm 4-bit", QuantTensor("w", "m", "awq", tuple((r, r) for r in awq), (rows, cols), 4, 128), awq
    ct = {"weight_packed": i32(rows, cols // 8), "weight_scale": f16(rows, G),
          "weight_shape": np.array([rows, cols], np.int64)}
    yield "ct pack 4-bit", QuantTensor("w", "m", "ct-pack", tuple((r, r) for r in ct), (rows, cols), 4, 128), ct
    mlx = {"weight": i32(rows, cols // 8).view(np.uint32), "scales": f16(rows, cols // 64), "biases": f16(rows, cols // 64)}
    yield "mlx 4-bit (bf16)", QuantTensor("w", "m", "mlx", tuple((r, r) for r in mlx), (rows, cols), 4, 64,
                                          params=(("compute", "BF16"),)), mlx
    fp8 = {"weight": rng.normal(0, 100, (rows, cols)).astype(np.float32),
           "weight_scale_inv": f16(-(-rows // 128), -(-cols // 128))}
    yield "fp8 block 128", QuantTensor("w", "m", "fp8", tuple((r, r) for r in fp8), (rows, cols), 8, 0, (128, 128),
                                       params=(("fp8_reading", "multiply"),)), fp8
    n = rows * cols
    state = np.frombuffer(json.dumps({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16",
                                      "shape": [rows, cols]}).encode(), np.uint8)
    bnb = {"weight": rng.integers(0, 256, (n // 2, 1), dtype=np.uint8), "weight.absmax": f16(n // 64),
           "weight.quant_map": np.sort(rng.random(16).astype(np.float32)),
           "weight.quant_state.bitsandbytes__nf4": state}
    yield "bnb nf4", QuantTensor("w", "m", "bnb-4bit", tuple((r, r) for r in bnb), (rows, cols), 4, 64), bnb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=18944)
    ap.add_argument("--cols", type=int, default=3584)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for label, qt, arrs in _cases(a.rows, a.cols, rng):
        times = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            w = dequantize(qt, lambda r, arrs=arrs: arrs[r])
            times.append(time.perf_counter() - t)
        assert w.shape == (a.rows, a.cols)
        print(f"{label:24s} {min(times):6.2f} s  {a.rows * a.cols / min(times) / 1e6:7.1f} Melem/s")


if __name__ == "__main__":
    main()
