"""Write docs/benchmarks.md from benchmarks/results/*.json: every measured figure in one place.

    python benchmarks/report.py            # rewrite docs/benchmarks.md
    python benchmarks/report.py --check    # exit 1 when it is out of date (tests/test_docs.py does the same)

Each figure says what was measured, the anchor it is compared with (a reference tool measured in the
same run, or a target), the ratio, the machine (cores, CPU, GPU), the date and the command that
reproduces it.  Two kinds of result files are read:

* ``{"section": ..., "figures": [{"what", "ours", "anchor", "ratio", "machine", "date", "command",
  optional "target", "details"}]}``: figures written down from a run (``details``: rows of a small
  table, the first row its header);
* the zoo sweeps' own outputs, normalised here: ``zoo_derived.json`` (``runs``, ``classes``, ``types``,
  written by ``benchmarks/zoo_derived.py``) and ``zoo_gguf_to_hf.json`` (model type -> ``status``, with
  the run under ``_run``, written by ``benchmarks/zoo_gguf_to_hf.py``).

A file or figure that lacks one of those keys is an error naming it: a figure without its machine,
date or command is not reproducible.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "benchmarks.md"
REQUIRED = ("what", "ours", "anchor", "ratio", "machine", "date", "command")
MACHINE = ("cores", "cpu", "gpu")
SECTIONS = ("inspect", "gguf", "analyze", "fold-bias", "kv-equalize", "verify", "convert", "diff")


def _zoo_derived(data: dict) -> dict:
    """zoo_derived.json's merged runs as one figure: byte-identical types at every outtype of the run."""
    run = data["runs"][0]
    classes = {k: len(v) for k, v in data["classes"].items()}
    built = sum(n for k, n in classes.items() if k != "unbuildable")
    same = next((n for k, n in classes.items() if k.startswith("identical") and "only" not in k), 0)
    converted = same + sum(n for k, n in classes.items() if k.startswith("we refuse"))
    outtypes = " and ".join(run["outtypes"])
    return {"what": f"HF -> GGUF on the derived path over every zoo model type it builds, at {outtypes}",
            "ours": f"{same} of {built} types byte-identical at {outtypes}; "
                    + "; ".join(f"{k}: {n}" for k, n in classes.items() if not k.startswith("identical")),
            "anchor": "llama.cpp's convert_hf_to_gguf.py (the same llama-cpp-python sdist)",
            "ratio": f"{same / built:.1%} of the built types ({same} of {converted} that llama.cpp converts)",
            "target": ">= 95 %", "machine": run["machine"], "date": run["date"][:10], "command": run["command"]}


def _zoo_gguf_to_hf(data: dict) -> dict:
    run = data["_run"]
    counts = Counter(v["status"] for k, v in data.items() if not k.startswith("_"))
    trips = counts.pop("round trip", 0)
    return {"what": "GGUF -> HF with --config on the derived path: every zoo type whose forward conversion "
                    "is identical",
            "ours": f"{trips} round trips bit-exact on every tensor; "
                    + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())),
            "anchor": "the original folder's tensors (float32 values; packed forms byte for byte)",
            "ratio": f"{trips} of {trips + counts.get('refused', 0)} invertible or refused in one line",
            "machine": run["machine"], "date": run["date"][:10], "command": run["command"]}


def load() -> dict[str, list[dict]]:
    """Section -> its figures, from every results file, checked."""
    out: dict[str, list[dict]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if "figures" in data:
            section, figures = data["section"], data["figures"]
        elif "runs" in data and "classes" in data:
            section, figures = "convert", [_zoo_derived(data)]
        elif "_run" in data:
            section, figures = "convert", [_zoo_gguf_to_hf(data)]
        else:
            raise ValueError(f"{path.name}: not a results file this report knows (no figures, runs or _run)")
        if section not in SECTIONS:
            raise ValueError(f"{path.name}: section {section!r} is not one of {SECTIONS}")
        for i, fig in enumerate(figures):
            missing = [k for k in REQUIRED if not fig.get(k)] + [f"machine.{k}" for k in MACHINE
                                                                if not isinstance(fig.get("machine"), dict)
                                                                or k not in fig["machine"]]
            if missing:
                raise ValueError(f"{path.name}: figure {i} ({fig.get('what', '?')!r}) lacks {', '.join(missing)}")
            out.setdefault(section, []).append({**fig, "file": path.name})
    return out


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _machine(m: dict) -> str:
    gpu = m["gpu"] if m["gpu"] not in ("none", None, "") else "no GPU"
    text = f"{m['cores']} cores, {m['cpu']}, {gpu}" + (f", {m['ram']}" if m.get("ram") else "")
    return text + (f" ({m['note']})" if m.get("note") else "")


def render() -> str:
    sections = load()
    lines = ["# Measured figures", "",
             "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; do not edit by hand "
             "(tests/test_docs.py checks that this page is current).  Benchmarks are scripts in `benchmarks/` that "
             "print ratios against a reference tool measured in the same run; the suite never times anything.  "
             "Most figures come from a 2-core development machine shared with other work, where wall times vary "
             "by up to 2x between runs: compare ratios, not seconds.", ""]
    for section in SECTIONS:
        figs = sections.get(section)
        if not figs:
            continue
        lines += [f"## {section}", "", "| what | ours | anchor | ratio | machine | date | reproduce |",
                  "|---|---|---|---|---|---|---|"]
        for f in figs:
            ratio = f["ratio"] + (f"; target {f['target']}" if f.get("target") else "")
            lines.append("| " + " | ".join(_cell(x) for x in (f["what"], f["ours"], f["anchor"], ratio,
                                                                   _machine(f["machine"]), f["date"])) +
                         f" | `{_cell(f['command'])}` |")
        for f in figs:
            if f.get("details"):
                head, *rows = f["details"]
                lines += ["", f"{f['what']}:", "", "| " + " | ".join(_cell(h) for h in head) + " |",
                          "|" + "---|" * len(head)]
                lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if "--check" in argv:
        if current != text:
            print("docs/benchmarks.md is out of date: run python benchmarks/report.py")
            return 1
        return 0
    if current != text:
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
