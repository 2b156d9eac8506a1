"""Benchmark: static ``ckpt-surgeon analyze`` on a Qwen2.5-7B-shaped checkpoint vs a hand-written script.

Both run as whole processes (imports included):

* ours:      ``ckpt-surgeon analyze DIR --format json`` (numpy only: reads the q/k/v biases, and
  W_q + the input norm of every layer with a rotary key bias, computes classes, energy split and
  the per-pair bound)
* reference: what a power user writes for the same numbers with torch: ``safe_open`` each shard,
  read W_q, the norm and the biases of every layer, batched ``torch.linalg.matrix_norm(ord=2)``
  over the 2-row blocks, the same bound formula.

Printed: wall time (best of --repeat), peak RSS, bytes read (ours: the reader's exact counter;
reference: the bytes of the tensors it asks for), the ratios, and whether the two agree on the
largest bound (they compute the same formula; a mismatch means one of them is wrong).
Targets: RSS < 300 MB (the budget fold-bias inherits), reads <= 5 % of the checkpoint.

Usage: python benchmarks/bench_analyze.py [--dir .bench/qwen2.5-7b-shape] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._proc import run  # noqa: E402  (wall time + peak RSS of a child process)
from benchmarks.make_qwen25_shape import make_qwen25_shape  # noqa: E402

REFERENCE = r"""
import glob, json, math, sys, torch
from safetensors import safe_open
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
H, G, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
hd = D // H
theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
L = cfg["max_position_embeddings"]
w = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
fac = torch.clamp(w * L, max=2.0)
files = {}
for f in sorted(glob.glob(d + "/*.safetensors")):
    with safe_open(f, "pt") as s:
        for k in s.keys():
            files[k] = f
def get(k):
    with safe_open(files[k], "pt") as s:
        return s.get_tensor(k).double()
worst = 0.0
for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    wq = get(p + "self_attn.q_proj.weight") * get(p + "input_layernorm.weight")
    bq, bk = get(p + "self_attn.q_proj.bias"), get(p + "self_attn.k_proj.bias")
    wq = wq.view(H, 2, hd // 2, D).transpose(1, 2)              # [H, P, 2, D]: rotate_half pairs
    qhat = torch.linalg.matrix_norm(wq, ord=2) * math.sqrt(D) + bq.view(H, 2, hd // 2).transpose(1, 2).norm(dim=-1)
    bj = bk.view(G, 2, hd // 2).transpose(1, 2).norm(dim=-1)[torch.arange(H) // (H // G)]
    worst = max(worst, float((qhat * bj * fac / math.sqrt(hd)).sum(-1).max()))
print(json.dumps({"bound_all_max": worst}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    d = make_qwen25_shape(a.dir)
    total = sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))
    out = Path(tempfile.mkdtemp(prefix="bench-analyze-")) / "analyze.json"   # the report is > 200 kB
    exe = [sys.executable, "-m", "ckpt_surgeon", "analyze", str(d), "--format", "json", "--output", str(out)]
    ref = [sys.executable, "-c", REFERENCE, str(d)]
    ours = min((run(exe) for _ in range(a.repeat)), key=lambda r: r["wall"])
    theirs = min((run(ref) for _ in range(a.repeat)), key=lambda r: r["wall"])
    rep = json.loads(out.read_text())
    out.unlink()
    out.parent.rmdir()
    ours_max = max(lr["bound_all"] for lr in rep["layers"] if lr["bound_all"] is not None)
    ref_max = json.loads(theirs["stdout"])["bound_all_max"]
    cfg = json.loads((Path(d) / "config.json").read_text())
    D, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    ref_bytes = n * 2 * (D * D + D + D + 2 * 512)          # bf16 W_q, norm, q and k bias per layer
    print(f"checkpoint: {d} ({total / 1e9:.2f} GB, {n} layers)")
    print(f"{'tool':<30}{'wall s':>9}{'peak RSS MB':>13}{'bytes read':>16}{'% of ckpt':>11}")
    print(f"{'ckpt-surgeon analyze':<30}{ours['wall']:>9.3f}{ours['rss'] / 1e6:>13.1f}{rep['bytes_read']:>16,}"
          f"{100 * rep['bytes_read'] / total:>10.3f}%")
    print(f"{'hand-written script (torch)':<30}{theirs['wall']:>9.3f}{theirs['rss'] / 1e6:>13.1f}{ref_bytes:>16,}"
          f"{100 * ref_bytes / total:>10.3f}%")
    print(f"ratio wall (reference / ours): {theirs['wall'] / ours['wall']:.2f}x   "
          f"RSS (reference / ours): {theirs['rss'] / ours['rss']:.2f}x")
    agree = abs(ours_max - ref_max) <= 1e-9 * max(1.0, ref_max)
    print(f"largest bound_all: ours {ours_max:.6g}, reference {ref_max:.6g} -> {'agree' if agree else 'DISAGREE'}")
    ok = ours["rss"] < 300e6 and rep["bytes_read"] <= 0.05 * total and agree
    print(f"targets (RSS < 300 MB, reads <= 5 %, same bound): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
