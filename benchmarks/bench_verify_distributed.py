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
3. Printed: each rank's peak RSS / the single-process peak (target < 0.6 at the 7B shape), also
   less the baseline RSS of a process that imports torch and transformers and loads nothing; the
   plan's 2-rank split and the share of both models' parameters each rank holds by the headers;
   the same accounting at the 7B shape's 28 layers (from its tensor shapes, not a run); the wall
   times and their ratio (2 CPU ranks on a 2-core machine: no gain is expected; on a GPU machine
   with 2 GPUs each rank takes one); and that the reports have the same KL mean.
   ``--modes pipeline`` skips the data-mode run (two ranks holding both models: twice the
   single-process memory on one machine).

Usage: python benchmarks/bench_verify_distributed.py [--shape small|0.5b|7b] [--data DIR]
            [--chunks 4] [--ctx 64] [--device cpu|cuda] [--no-single] [--modes pipeline,data] [--dtype bfloat16]
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


def baseline_rss(env: dict) -> int:
    """Peak RSS of a process that imports what a verify rank imports and loads nothing."""
    code = ("import resource, torch, transformers, ckpt_surgeon.verification.stream; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.split()[-1])


def split_report(ref: Path, single: float, peaks: dict, base: int) -> None:
    """The plan's blocks for 2 ranks and what each rank holds by the headers, against the measured
    peaks; then the same accounting at the 7B shape (28 layers), from its tensor shapes."""
    import numpy as np

    from benchmarks.make_qwen25_shape import SHAPES, tensor_specs
    from ckpt_surgeon.verification.dist_plan import blocks_for, layer_sizes, rank_weights
    s = layer_sizes([str(ref), str(ref)])
    both = sum(s.per_layer) + s.rest
    blocks = blocks_for(s.per_layer, 2, last=s.head)
    held = rank_weights(s.per_layer, blocks, last=s.head)
    print(f"plan: blocks {list(blocks)}; the last rank holds both heads ({s.head / both:.0%} of both models' "
          f"parameters); parameters held per rank / both models: " +
          ", ".join(f"rank {r} {h / both:.3f}" for r, h in enumerate(held)))
    for k in ("0", "1"):
        got = peaks.get(k, 0)
        print(f"pipeline rank {k} peak RSS / single-process in-memory: {got / single:.3f}; less the baseline on "
              f"both sides: {(got - base) / (single - base):.3f} (target < 0.6 at the 7B shape)")
    specs = tensor_specs(SHAPES["7b"])
    layer = sum(int(np.prod(d)) for n, d in specs if ".layers.0." in n)
    vocab_rows = [int(np.prod(d)) for n, d in specs if ".layers." not in n and d[0] == SHAPES["7b"].vocab]
    rest = sum(int(np.prod(d)) for n, d in specs if ".layers." not in n)
    per, head = [2 * layer] * SHAPES["7b"].layers, 2 * max(vocab_rows)
    b7 = blocks_for(per, 2, last=head)
    h7 = rank_weights(per, b7, last=head)
    total = sum(per) + 2 * rest
    print(f"7B shape, by the same accounting (float32, both models): one process {total * 4 / 2**30:.1f} GiB; "
          f"blocks {list(b7)}: " + ", ".join(f"rank {r} {h * 4 / 2**30:.1f} GiB ({h / total:.3f}x)"
                                             for r, h in enumerate(h7)))


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
    ap.add_argument("--modes", default="pipeline,data", help="the 2-rank runs, comma-separated (pipeline, data)")
    ap.add_argument("--dtype", default=None, help="verify's --dtype for every run (e.g. bfloat16; default: float32)")
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
            "--format", "json", "--max-mean-kl", "1e9", "--max-p99-kl", "1e9", "--min-same-top", "0",
            *(["--dtype", a.dtype] if a.dtype else [])]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29571",
                "-m", "ckpt_surgeon", "verify", *args]
    runs = {}
    if not a.no_single:
        one = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}     # one process: every core
        runs["single"] = run_per_process([sys.executable, "-m", "ckpt_surgeon", "verify", *args], one)
    for mode in a.modes.split(","):
        runs[mode] = run_per_process([*torchrun, "--dist-mode", mode], env)
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
    base = baseline_rss(env)
    print(f"baseline: a process with torch and transformers imported, nothing loaded: {_gib(base)}")
    if "pipeline" in runs:
        split_report(ref, single, runs["pipeline"]["peaks"], base)
    if "single" in runs and "data" in runs:
        print(f"speed, data mode: 2 ranks {runs['data']['wall']:.1f} s vs 1 process {runs['single']['wall']:.1f} s "
              f"(ratio {runs['single']['wall'] / runs['data']['wall']:.2f}x; {os.cpu_count()} CPU cores shared)")
    print("KL mean per run: " + ", ".join(f"{k} {v:.6g}" for k, v in kl.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
