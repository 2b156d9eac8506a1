"""``verify`` on torch.distributed against one process, on every tiny family (issue 34's "same answer").

For each family of ``ckpt_surgeon.tiny`` (the registry's tiny models, ``tiny_names()``), the pair
the distributed tests compare (``tests/dist_util.py``: the tiny model made 4 layers deep, and a
copy with layer 1 perturbed) is scored in corpus mode (CTX 16 tokens x 7 chunks, float32, CPU):

1. once in one process (one thread, as each torchrun rank has);
2. under torchrun with 2 and 3 gloo ranks, ``--dist-mode data`` and ``--dist-mode pipeline``,
   one launch each, sequentially.

Each distributed report is compared with the one-process report as
``tests/test_verify_distributed.py`` compares them: every corpus statistic within
``dist_util.REL_TOL`` (1e-9 relative: float rounding in the summation order; the module's docstring
says why), the verdict and the notes (bar the distributed one) equal, that note naming the ranks
and the mode.  The table prints family x (data-2, data-3, pipeline-2, pipeline-3):

- ``same (r)``: r is the largest relative difference of any statistic (0 = bit for bit);
- ``differs (r at WHERE)``: a statistic out of tolerance, or something else unequal (r = -);
- ``refused: LINE``: the run ended with exactly one ``error:`` line (the one-process run's
  refusal fills the family's row);
- ``failed: ...``: anything else (a traceback, a time-out): a bug either way.

A pipeline cell that differs is also compared with one process run with ``--stream`` (the path a
pipeline computes as), appended as ``; vs one process --stream: same (r)`` or ``differs (...)``.

Usage: python benchmarks/sweep_verify_distributed.py [--families a,b] [--modes data,pipeline]
            [--worlds 2,3] [--work DIR] [--json FILE]
Run with PYTHONPATH=. and CKPT_SURGEON_FIXTURE_CACHE set to share the tiny-model cache.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import dist_util  # noqa: E402


def _outcome(proc) -> tuple:
    """``(kind, detail, report)`` of a finished run: ok with its JSON, refused with its one line,
    or failed with the last line of its stderr."""
    errs = dist_util.errors(proc.stderr)
    if proc.returncode in (0, 1):
        try:
            return "ok", "", json.loads(proc.stdout)
        except ValueError:
            pass
    if len(errs) == 1:
        return "refused", errs[0][len("error: "):], None
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return "failed", f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}", None


def compare(one: dict, dist: dict, ranks: int, mode: str) -> str:
    """The cell for a distributed report ``dist`` against the one-process report ``one``."""
    diffs = list(dist_util.rel_diffs(one["corpus"], dist["corpus"], "corpus"))
    worst = max((r for _, r in diffs if r is not None), default=0.0)
    bad = [(w, r) for w, r in diffs if r is None or r > dist_util.REL_TOL]
    note, named = dist_util.dist_note(dist.get("notes", []), ranks, mode)
    if one.get("passed") != dist.get("passed"):
        bad.append(("passed", None))
    if not named:
        bad.append((f"the distributed note ({note!r})", None))
    if one.get("notes") != [n for n in dist.get("notes", []) if n != note]:
        bad.append(("notes", None))
    if not bad:
        return f"same ({worst:.1e})" if worst else "same (0)"
    where, r = max(bad, key=lambda x: -1 if x[1] is None else x[1])
    return f"differs ({'-' if r is None else f'{r:.1e}'} at {where}; {len(bad)} item(s))"


def run_family(family: str, work: Path, ids: Path, cells: list) -> dict:
    """One family: the one-process run, then each (mode, ranks) of ``cells``; ``{cell: text}``."""
    from fixtures import fixture_path
    ref, cand = dist_util.pair(fixture_path(family), work / family)
    args = dist_util.corpus_args(ref, cand, ids)
    t0 = time.perf_counter()
    kind, detail, one = _outcome(dist_util.single(args))
    out = {"one": f"{time.perf_counter() - t0:.0f} s"}
    streamed: dict = {}
    # An unperturbed candidate runs the reference's computations bit for bit: KL exactly 0.  Any value above
    # float64 noise means it differs (granite's logits_scaling keeps its softmax near uniform: KL mean ~1e-6).
    if kind == "ok" and not one["corpus"]["kl"]["mean"] > 1e-12:
        kind, detail = "failed", "the candidate does not differ (KL mean 0): nothing is compared"
    for mode, ranks in cells:
        key = f"{mode}-{ranks}"
        if kind != "ok":
            out[key] = f"{kind} (one process): {detail}"
            continue
        t0 = time.perf_counter()
        try:
            dk, dd, dist = _outcome(dist_util.torchrun(ranks, [*args, "--dist-mode", mode]))
        except Exception as e:       # noqa: BLE001 - a time-out is a result of the sweep, not its end
            dk, dd, dist = "failed", f"{type(e).__name__}: {e}", None
        out[key] = compare(one, dist, ranks, mode) if dk == "ok" else f"{dk}: {dd}"
        if mode == "pipeline" and out[key].startswith("differs"):
            out[key] += "; " + _against_stream(args, dist, ranks, streamed)
        out[key + " s"] = round(time.perf_counter() - t0, 1)
    return out


def _against_stream(args, dist: dict, ranks: int, streamed: dict) -> str:
    """A pipeline computes as ``--stream`` does (layer by layer, the head in row blocks): when it
    differs from the in-memory run, the same comparison against one process streaming (run once
    per family) says whether the pipeline or the streamed path is what differs."""
    if "run" not in streamed:
        streamed["run"] = _outcome(dist_util.single([*args, "--stream"]))
    kind, detail, one = streamed["run"]
    if kind != "ok":
        return f"--stream {kind}: {detail}"
    return "vs one process --stream: " + compare(one, dist, ranks, "pipeline")


def table(rows: dict, cells: list) -> str:
    keys = [f"{m}-{n}" for m, n in cells]
    lines = ["| family | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for fam, row in rows.items():
        lines.append(f"| {fam} | " + " | ".join(row.get(k, "") for k in keys) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ckpt_surgeon.tiny import tiny_names
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="", help="comma-separated tiny names (default: every one)")
    ap.add_argument("--modes", default="data,pipeline")
    ap.add_argument("--worlds", default="2,3")
    ap.add_argument("--work", type=Path, default=None, help="where the pairs are made (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here (after each family)")
    a = ap.parse_args(argv)
    names = tiny_names()
    families = [f for f in a.families.split(",") if f] or names
    unknown = [f for f in families if f not in names]
    if unknown:
        ap.error(f"unknown tiny families {unknown}; known: {', '.join(names)}")
    cells = [(m, int(n)) for m in a.modes.split(",") if m for n in a.worlds.split(",") if n]
    work = a.work or Path(tempfile.mkdtemp(prefix="sweep-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    ids = dist_util.write_ids(work / "ids.json")
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    rows = {}
    for fam in families:
        rows[fam] = run_family(fam, work, ids, cells)
        print(f"{fam}: " + ", ".join(f"{k}={v}" for k, v in rows[fam].items()), flush=True)
        if a.json:               # after every family: a sweep cut short keeps what it measured
            a.json.write_text(json.dumps({"rows": rows, "wall_s": time.perf_counter() - t0,
                                          "load": [load0, os.getloadavg()]}, indent=1))
    wall = time.perf_counter() - t0
    print()
    print(table(rows, cells))
    print(f"\n{len(families)} families, {wall / 60:.1f} min; load average at start {load0[0]:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}; ctx {dist_util.CTX} x {dist_util.CHUNKS} chunks, float32, CPU")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "wall_s": wall, "load": [load0, os.getloadavg()]}, indent=1))
    bad = [f for f, r in rows.items() if any(str(v).startswith(("differs", "failed")) for v in r.values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
