"""Benchmark: ``ckpt-surgeon inspect owner/name`` on a Qwen2.5-7B-shaped Hub repo vs downloading it.

The repo is the generated Qwen2.5-7B-shaped checkpoint (``make_qwen25_shape``: 28 layers,
bf16, 4 shards, ~15.2 GB) served by the test suite's local Hub look-alike
(``tests/hubserver.py``: model info API, ``resolve`` with the Hub's redirect to a CDN path,
HTTP Range) on 127.0.0.1.  Measured, each as a whole process:

* ours, cold cache: ``ckpt-surgeon inspect Qwen/Qwen2.5-7B-shape --format json``
* ours, warm cache (second run of the same branch) and offline (``HF_HUB_OFFLINE=1``)
* reference: fetching the weight files whole, which is what inspecting them takes today.
  ``--reference stream`` (default) reads every shard over HTTP and discards it (a lower
  bound of a download: no disk writes); ``--reference snapshot`` runs huggingface_hub's
  ``snapshot_download`` into a temporary folder (needs ~15 GB of free disk).

Printed: bytes fetched and requests (the server's own counters), wall time, and the ratios.
Target: < 5 MB fetched for the whole report.  Loopback has no latency; ``--latency-ms``
delays every answer to mimic a real round trip (requests then cost time, bytes hardly).

Usage: python benchmarks/bench_hub.py [--dir .bench/qwen2.5-7b-shape] [--reference stream|snapshot|none]
       [--latency-ms 0]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks.make_qwen25_shape import make_qwen25_shape  # noqa: E402
from hubserver import HubServer  # noqa: E402

REPO = "Qwen/Qwen2.5-7B-shape"

# The reference downloads run in their own process too, so that imports count alike.
STREAM = r"""
import sys
from huggingface_hub.utils import get_session
base, files = sys.argv[1], sys.argv[2:]
n = 0
for f in files:
    with get_session().stream("GET", f"{base}/resolve/main/{f}", follow_redirects=True) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes(1 << 20):
            n += len(chunk)
print(n)
"""
SNAPSHOT = r"""
import sys
from huggingface_hub import snapshot_download
p = snapshot_download(sys.argv[1], local_dir=sys.argv[2], allow_patterns=["*.safetensors", "*.json"])
print(p)
"""


def _env(hub: HubServer, cache: str, **extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))}
    # HF_HOME in the temp dir: huggingface_hub caches its user-agent registry there, not in the user's home.
    e.update({"HF_ENDPOINT": hub.url, "CKPT_SURGEON_CACHE": cache, "HF_HUB_DISABLE_PROGRESS_BARS": "1",
              "HF_HOME": str(Path(cache).parent / "hf-home"), **extra})
    return e


def _timed(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return wall, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(ROOT / ".bench" / "qwen2.5-7b-shape"),
                    help="where the generated checkpoint lives (made once if missing)")
    ap.add_argument("--reference", choices=("stream", "snapshot", "none"), default="stream",
                    help="how to measure fetching the whole files")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="delay every server answer (simulated round trip)")
    a = ap.parse_args()

    d = make_qwen25_shape(a.dir)
    shards = sorted(p.name for p in Path(d).glob("*.safetensors"))
    total = sum((Path(d) / s).stat().st_size for s in shards)
    with HubServer(idle_timeout=3600) as hub, tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        hub.latency = a.latency_ms / 1000
        hub.add_repo(REPO, d)
        cmd = [sys.executable, "-m", "ckpt_surgeon", "inspect", REPO, "--format", "json"]
        cache = str(Path(tmp) / "cache")
        rows = []
        for label, extra in (("ours, cold cache", {}), ("ours, warm cache", {}),
                             ("ours, offline", {"HF_HUB_OFFLINE": "1"})):
            hub.reset_stats()
            wall, p = _timed(cmd, _env(hub, cache, **extra))
            rep = json.loads(p.stdout)
            sent = sum(r.sent for r in hub.log if r.for_repo)
            rows.append((label, wall, sent, hub.repo_requests, rep["requests"], rep["bytes_read"]))
            if label == "ours, cold cache":
                cold = rep
        ref = None
        if a.reference != "none":
            hub.reset_stats()
            if a.reference == "stream":
                wall, _ = _timed([sys.executable, "-c", STREAM, f"{hub.url}/{REPO}", *shards], _env(hub, cache))
            else:
                wall, _ = _timed([sys.executable, "-c", SNAPSHOT, REPO, str(Path(tmp) / "snap")], _env(hub, cache))
            ref = (f"reference: {a.reference} whole files", wall, sum(r.sent for r in hub.log if r.for_repo),
                   hub.repo_requests, None, None)

    bias = sum(2 * (3584 + 512 + 512) for _ in range(cold["num_layers"]))
    print(f"repo: {REPO} served from {d} ({total / 1e9:.2f} GB in {len(shards)} shards; "
          f"{cold['layers_with_qkv_bias']} of {cold['num_layers']} layers with qkv bias; {bias:,} bias bytes)"
          + (f"; simulated latency {a.latency_ms:g} ms" if a.latency_ms else ""))
    print(f"{'run':<34}{'wall s':>9}{'bytes fetched':>16}{'requests':>10}{'% of repo':>12}")
    for label, wall, sent, nreq, *_ in rows + ([ref] if ref else []):
        print(f"{label:<34}{wall:>9.3f}{sent:>16,}{nreq:>10}{100 * sent / total:>11.4f}%")
    cold_row = rows[0]
    assert cold_row[2] == cold_row[5] and cold_row[3] == cold_row[4], "report counters disagree with the server's"
    if ref:
        print(f"ratio bytes (reference / ours cold): {ref[2] / cold_row[2]:,.0f}x   "
              f"wall (reference / ours cold): {ref[1] / cold_row[1]:.1f}x")
    ok = cold_row[2] < 5_000_000 and rows[1][3] <= 1 and rows[2][3] == 0
    print(f"targets (cold < 5 MB fetched, warm <= 1 request, offline 0 requests): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
