"""Benchmark: the static distance profile (``analyze --distance-profile``) on a Qwen2.5-7B-shaped
checkpoint, against a hand-written torch script computing the same ``f_b(Δ)``.

* ours:      a child process that opens the checkpoint and runs
  :func:`ckpt_surgeon.analysis.distance_profile.distance_profile` (every layer and query head,
  the 48-point grid, the summaries, the model-level numbers); it prints the time of the profile
  itself (best of ``--inner``), whether torch was imported (it must not be), and the profile of
  layer 0 for the agreement check.
* reference: ``safe_open`` each shard with torch, read the q and k biases of every layer, and
  evaluate ``s Σ_j Re(z_j(b_q) conj z_j(b_k) e^{iΔθ_j})`` on the same grid (no summaries).

Target (issue 25): the profile under 1 s on the 7B shape.  The whole ``analyze --distance-profile``
command also runs the static key-bias analysis, which reads W_q (see bench_analyze.py).

Usage: python benchmarks/bench_profile.py [--dir .bench/qwen2.5-7b-shape] [--repeat 3] [--inner 3]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._proc import run  # noqa: E402  (wall time + peak RSS of a child process)
from benchmarks.make_qwen25_shape import make_qwen25_shape  # noqa: E402

OURS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.analysis.distance_profile import distance_profile
best = None
with open_checkpoint(sys.argv[1]) as ck:
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        p = distance_profile(ck)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
heads = sum(len(lp.heads) for lp in p.layers)
print(json.dumps({"profile_s": best, "torch": "torch" in sys.modules, "heads": heads,
                  "deltas": [float(d) for d in p.deltas], "f0": [list(map(float, h.f)) for h in p.layers[0].heads]}))
"""

REFERENCE = r"""
import glob, json, math, sys, torch
from safetensors import safe_open
d, deltas = sys.argv[1], torch.tensor(json.loads(sys.argv[2]), dtype=torch.float64)
cfg = json.load(open(d + "/config.json"))
H, G, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
hd = D // H
theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
w = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
ph = torch.exp(1j * torch.outer(w, deltas))
files = {}
for f in sorted(glob.glob(d + "/*.safetensors")):
    with safe_open(f, "pt") as s:
        for k in s.keys():
            files[k] = f
def get(k):
    with safe_open(files[k], "pt") as s:
        return s.get_tensor(k).double()
out = []
for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}.self_attn."
    bq, bk = get(p + "q_proj.bias").view(H, hd), get(p + "k_proj.bias").view(G, hd)
    zq = torch.complex(bq[:, : hd // 2], bq[:, hd // 2:])
    zk = torch.complex(bk[:, : hd // 2], bk[:, hd // 2:])[torch.arange(H) // (H // G)]
    f = (zq * zk.conj()) @ ph * hd ** -0.5
    out.append(f.real)
print(json.dumps({"f0": out[0].tolist()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inner", type=int, default=3, help="profile runs per process (best taken)")
    a = ap.parse_args()
    d = make_qwen25_shape(a.dir)
    repo = str(Path(__file__).resolve().parent.parent)
    ours = min((run([sys.executable, "-c", OURS, str(d), repo, str(a.inner)]) for _ in range(a.repeat)),
               key=lambda r: r["wall"])
    res = json.loads(ours["stdout"])
    theirs = min((run([sys.executable, "-c", REFERENCE, str(d), json.dumps(res["deltas"])]) for _ in range(a.repeat)),
                 key=lambda r: r["wall"])
    ref = json.loads(theirs["stdout"])
    err = max(abs(x - y) for a_, b_ in zip(res["f0"], ref["f0"]) for x, y in zip(a_, b_))
    scale = max(abs(x) for row in ref["f0"] for x in row)
    cfg = json.loads((Path(d) / "config.json").read_text())
    print(f"checkpoint: {d} ({cfg['num_hidden_layers']} layers, {res['heads']} query heads profiled, "
          f"{len(res['deltas'])} distances)")
    print(f"{'tool':<36}{'wall s':>9}{'peak RSS MB':>13}")
    print(f"{'ours (process, imports included)':<36}{ours['wall']:>9.3f}{ours['rss'] / 1e6:>13.1f}")
    print(f"{'reference torch script (process)':<36}{theirs['wall']:>9.3f}{theirs['rss'] / 1e6:>13.1f}")
    print(f"ratio wall (reference / ours): {theirs['wall'] / ours['wall']:.2f}x")
    print(f"the profile itself (best of {a.inner}, summaries and model level included): {res['profile_s']:.3f} s; "
          f"torch imported: {res['torch']}")
    agree = err <= 1e-9 * max(1.0, scale)
    print(f"layer 0 f(Δ): max |ours - reference| = {err:.3g} (scale {scale:.3g}) -> {'agree' if agree else 'DISAGREE'}")
    ok = res["profile_s"] < 1.0 and not res["torch"] and agree
    print(f"targets (profile < 1 s, no torch, same values): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
