"""``analyze --distance-profile --measure --device cuda`` on a lent GPU machine: the measured
profile on CUDA equals the one on the CPU, and its parts add up to the measured mean logit.

Made for a machine with a GPU, no internet and a Python whose packages may not include this
project (imported from the checkout).  Builds the tiny qwen2 and qwen2_long fixtures into a temp
dir, then per fixture and dtype (float32, float64) measures the profile on ``--device`` and on the
CPU, and prints per run: the worst ``|mean logit - sum of parts|`` (float32 rotary angles in
transformers: ~1e-7 relative), and the largest difference of the measured terms between the two
devices relative to their scale.  Exit 0 when every residual and every device difference is
within its tolerance (float64: 1e-7 relative, because transformers computes the rotary cos/sin
in float32 even in a float64 model, so the two devices' float32 rope kernels differ at float32
rounding: 8.4e-9 measured on an H200 on 2026-11-26, where the first guess of 1e-9 failed;
float32: 1e-4 relative: different kernels sum in different orders), 1 otherwise.

Usage: python benchmarks/gpu_profile.py [--device cuda]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOL = {"float64": 1e-7, "float32": 1e-4}


def _terms(prof) -> np.ndarray:
    out = []
    for lp in prof.layers:
        for h in lp.heads:
            for _, v in list(h.mean.series()) + list(h.cov.series()):
                out.append(np.nan_to_num(np.asarray(v, dtype=np.float64), nan=0.0))
    return np.concatenate(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    import torch
    import transformers
    from ckpt_surgeon.analysis.distance_measure import measure_profile
    from ckpt_surgeon.analysis.distance_profile import distance_profile
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.tiny import build_tiny
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {torch.cuda.get_device_name(0) if a.device == 'cuda' else a.device}")
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("qwen2", "qwen2_long"):
            src = build_tiny(name, Path(tmp) / name)
            with open_checkpoint(src) as ck:
                static = distance_profile(ck, context=256, deltas="0,1,2,4,8,16,32,64,128,255")
            for dtype in ("float32", "float64"):
                got = {}
                for dev in (a.device, "cpu"):
                    p = measure_profile(src, static, dtype=dtype, device=dev, max_tokens=200)
                    got[dev] = p
                res = max(h.cov.residual for lp in got[a.device].layers for h in lp.heads)
                scale = max(np.nanmax(np.abs(h.cov.mean_logit)) for lp in got[a.device].layers for h in lp.heads)
                t_dev, t_cpu = _terms(got[a.device]), _terms(got["cpu"])
                diff = float(np.abs(t_dev - t_cpu).max() / max(1.0, np.abs(t_cpu).max()))
                ok = res <= 1e-5 * (1 + scale) and diff <= TOL[dtype]
                print(f"{name:<11}{dtype:<9} residual {res:.3g} (mean logit scale {scale:.3g})  "
                      f"{a.device} vs cpu: {diff:.3g} relative  {'ok' if ok else 'NOT OK'}")
                if not ok:
                    bad.append(f"{name} {dtype}")
    print("ALL AS EXPECTED" if not bad else "UNEXPECTED: " + ", ".join(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
