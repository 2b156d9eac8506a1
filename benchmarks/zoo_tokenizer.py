"""diff's tokenizer verdict over the zoo: each zoo folder that llama.cpp's converter converts on the derived path
(the types ``benchmarks/results/zoo_derived.json`` classes identical), against llama.cpp's own GGUF of it
(``convert_hf_to_gguf.py``, tests/llamacpp_ref_convert.py).  A false alarm is a "differs" here: the GGUF is that
folder's conversion.  Prints one line per type and writes the figure (issue 48: 0 false alarms on every family).

    CKPT_SURGEON_FIXTURE_CACHE=... python benchmarks/zoo_tokenizer.py [model_type ...] [--json OUT]

Without model types: every type zoo_derived.json classes "identical f16 and q8_0" or "identical f16 only".
``--json OUT`` (default benchmarks/results/zoo_tokenizer.json, only for a whole run) is read by
benchmarks/report.py.  The comparison's seconds include the first read of each folder by llama.cpp's class
(a child process; later reads come from the transformers-answer cache), not the reference conversion.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def main(argv: list[str]) -> int:
    from llamacpp_src import llamacpp_source
    from zoo_derived import _meta, _option, folder_for, reference

    from ckpt_surgeon.analysis.tokenizer import compare_tokenizers, tokenizer
    json_out, argv = _option(argv, "--json", None)
    classes = json.loads((ROOT / "benchmarks" / "results" / "zoo_derived.json").read_text())["classes"]
    types = argv or classes.get("identical f16 and q8_0", []) + classes.get("identical f16 only", [])
    if json_out is None and not argv:
        json_out = str(ROOT / "benchmarks" / "results" / "zoo_tokenizer.json")
    root = llamacpp_source()
    os.environ.setdefault("CKPT_SURGEON_LLAMACPP_SRC", str(root))
    work = Path(tempfile.mkdtemp(prefix="zoo-tokenizer-"))
    rows = []
    for mt in types:
        src = folder_for(mt, work / "src")
        ref = work / "ref" / mt
        ref.mkdir(parents=True)
        why = reference(root, src, ref, ("f16",))
        if why:
            rows.append([mt, f"llama.cpp refuses: {why}", "", ""])
            print(f"{mt:28s} llama.cpp refuses: {why}", flush=True)
            continue
        t0 = time.perf_counter()
        d = compare_tokenizers(tokenizer(src), tokenizer(ref / "f16.gguf"))
        s = time.perf_counter() - t0
        verdict = d.line if d.compared else "not compared: " + d.line.removeprefix("tokenizer not compared ")
        departs = [n.split(" in ", 1)[1] for n in d.notes if "departs from the folder's files" in n]
        rows.append([mt, verdict, "; ".join(departs), f"{s:.1f}"])
        print(f"{mt:28s} {verdict}" + (f"  [llama.cpp departs from the files in {'; '.join(departs)}]"
                                       if departs else ""), flush=True)
    same = sum(r[1] == "tokenizer identical" for r in rows)
    alarms = [r[0] for r in rows if r[1].startswith("tokenizer differs")]
    unread = [r[0] for r in rows if r[1].startswith("not compared")]
    print(f"{len(rows)} types: identical {same}, differs {len(alarms)} ({' '.join(alarms)}), "
          f"not compared {len(unread)} ({' '.join(unread)})")
    if json_out:
        meta = _meta()
        fig = {"what": "diff's tokenizer verdict: each zoo folder on the derived path against llama.cpp's GGUF of it",
               "ours": f"{same} of {len(rows)} types identical; false alarms (differs): {len(alarms)}"
                       + (f" ({', '.join(alarms)})" if alarms else "")
                       + (f"; not compared: {', '.join(unread)} (a tokenizer module of the model's own)"
                          if unread else ""),
               "anchor": "llama.cpp's convert_hf_to_gguf.py on the same folder (the same llama-cpp-python sdist)",
               "ratio": f"{len(alarms)} false alarms in {len(rows)} types", "target": "0 false alarms",
               "machine": meta["machine"], "date": meta["date"][:10], "command": meta["command"],
               "details": [["type", "verdict", "llama.cpp's class departs from the folder's files in", "seconds"],
                           *rows]}
        Path(json_out).write_text(json.dumps({"section": "diff", "figures": [fig]}, indent=1, ensure_ascii=False)
                                  + "\n", encoding="utf-8")
        print(f"wrote {json_out}")
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
