"""``verify`` on torch.distributed (issue 34): memory per rank in pipeline mode and the speed of
2 ranks against 1 process, corpus mode, on a Qwen2.5-shaped pair.

Steps:

1. The Qwen2.5-shaped checkpoint (``make_qwen25_shape.py``: ``--shape 7b`` is the 7B geometry,
   ~15 GB bf16; ``0.5b`` / ``small`` the 0.5B geometry with 24 / 8 layers) is made once in
   ``--data``; the candidate is the copy with one layer's key bias moved (``bench_verify.py``).
2. Three runs of ``verify REF CAND --corpus-ids ids.json --ctx C --device D``, each a child
   process tree whose RSS is sampled every 50 ms per process (psutil):
   - one process with both models in memory (the single-process in-memory figure); skipped, and
     its figure taken from the plan's estimate, when ``--no-single`` or when it cannot fit;
   - ``torchrun --nproc-per-node 2 ... --dist-mode pipeline``: each rank's own peak RSS;
   - ``torchrun --nproc-per-node 2 ... --dist-mode data``: the wall time against one process.
3. Printed: each rank's peak RSS / the single-process peak (target < 0.6 at the 7B shape), the
   wall times and their ratio (2 CPU ranks on a 2-core machine: no gain is expected; on a GPU
   machine with 2 GPUs each rank takes one), and that the three reports have the same KL mean.

Usage: python benchmarks/bench_verify_distributed.py [--shape small|0.5b|7b] [--data DIR]
            [--chunks 4] [--ctx 64] [--device cpu|cuda] [--no-single]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_per_process(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``: wall time and the peak RSS of each process of its tree, keyed by RANK (or
    "main" for a process without one)."""
    import psutil
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peaks: dict = {}
    stop = threading.Event()

    def sample():
        try:
            root = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                try:
                    key = "root" if p.pid == proc.pid else p.environ().get("RANK", "other")
                    peaks[key] = max(peaks.get(key, 0), p.memory_info().rss)
                except psutil.Error:
                    pass
            stop.wait(0.05)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    stop.set()
    th.join()
    return {"wall": time.perf_counter() - t0, "peaks": peaks, "rc": proc.returncode, "stdout": out.decode(),
            "stderr": err.decode()}


def _candidate(ref: Path, out: Path, layer: int) -> Path:
    """``bench_verify.perturbed_copy`` (one key bias element moved); a one-shard checkpoint gets the
    index that function reads written beside the copy's source first, in a scratch folder."""
    from benchmarks.bench_verify import perturbed_copy
    if (ref / "model.safetensors.index.json").exists():
        return perturbed_copy(ref, out, layer)
    from ckpt_surgeon.checkpoint import open_checkpoint
    view = out.with_name(out.name + "-src")
    if not view.exists():
        tmp = out.with_name(out.name + "-src.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in ref.iterdir():
            if not f.name.startswith("."):
                os.link(f, tmp / f.name)
        ck = open_checkpoint(str(ref))
        names = list(ck.tensors)
        ck.close()
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {n: "model.safetensors" for n in names}}))
        tmp.rename(view)
    cand = perturbed_copy(view, out, layer)
    (cand / "model.safetensors.index.json").unlink(missing_ok=True)
    return cand


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="small", choices=["small", "0.5b", "7b"])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-single", action="store_true", help="skip the one-process in-memory run (7B on a small machine)")
    a = ap.parse_args()

    import numpy as np
    import psutil

    from benchmarks.bench_verify import _default_data
    from benchmarks.make_qwen25_shape import SHAPES, make_qwen25_shape
    data = a.data or _default_data()
    ref = make_qwen25_shape(data / f"qwen2.5-{a.shape}-shape", shape=a.shape)
    layer = SHAPES[a.shape].layers // 2
    cand = _candidate(ref, data / f"qwen2.5-{a.shape}-shape-kbias-L{layer}", layer)
    ids = data / f"dist-ids-{a.chunks}x{a.ctx}.json"
    ids.write_text(json.dumps(np.random.default_rng(0).integers(0, 151643, size=a.chunks * a.ctx).tolist()))
    print(f"machine: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, load average "
          f"{os.getloadavg()[0]:.1f}; shape {a.shape}, {a.chunks} chunks of {a.ctx} tokens, device {a.device}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))          # torchrun gives each rank OMP_NUM_THREADS=1
    args = [str(ref), str(cand), "--corpus-ids", str(ids), "--ctx", str(a.ctx), "--device", a.device,
            "--format", "json", "--max-mean-kl", "1e9", "--max-p99-kl", "1e9", "--min-same-top", "0"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29571",
                "-m", "ckpt_surgeon", "verify", *args]
    runs = {}
    if not a.no_single:
        one = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}     # one process: every core
        runs["single"] = run_per_process([sys.executable, "-m", "ckpt_surgeon", "verify", *args], one)
    runs["pipeline"] = run_per_process([*torchrun, "--dist-mode", "pipeline"], env)
    runs["data"] = run_per_process([*torchrun, "--dist-mode", "data"], env)
    kl = {}
    for name, r in runs.items():
        if r["rc"] != 0:
            print(f"{name}: exit {r['rc']}\n{r['stderr'][-2000:]}")
            return 1
        kl[name] = json.loads(r["stdout"])["corpus"]["kl"]["mean"]
        ranks = {k: v for k, v in r["peaks"].items() if k != "root"} if name != "single" else \
            {"process": r["peaks"].get("root", 0)}
        print(f"{name:9s} wall {r['wall']:7.1f} s   peak RSS " + ", ".join(
            f"{'rank ' + k if k != 'process' else k} {_gib(v)}" for k, v in sorted(ranks.items())))
    single = runs["single"]["peaks"].get("root") if "single" in runs else None
    if single is None:
        single = 2 * sum(f.stat().st_size for f in Path(ref).glob("*.safetensors")) * 2 * 1.25
        print(f"single-process in-memory figure not measured: the plan's estimate {_gib(single)} "
              "(both models in float32 x 1.25 headroom)")
    for k in ("0", "1"):
        print(f"pipeline rank {k} peak RSS / single-process in-memory: "
              f"{runs['pipeline']['peaks'].get(k, 0) / single:.3f} (target < 0.6 at the 7B shape)")
    if "single" in runs:
        print(f"speed, data mode: 2 ranks {runs['data']['wall']:.1f} s vs 1 process {runs['single']['wall']:.1f} s "
              f"(ratio {runs['single']['wall'] / runs['data']['wall']:.2f}x; {os.cpu_count()} CPU cores shared)")
    print("KL mean per run: " + ", ".join(f"{k} {v:.6g}" for k, v in kl.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
