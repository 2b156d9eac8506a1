"""The derived path over the zoo: every zoo architecture outside the native registry that llama.cpp's
converter registers, converted by ``convert --engine llama.cpp`` and by llama.cpp's own
``convert_hf_to_gguf.py`` (tests/llamacpp_ref_convert.py) on the same tiny folder; prints one line per
architecture and outtype: identical (whole file, byte for byte), differs, or who refused and why.

    CKPT_SURGEON_FIXTURE_CACHE=... python benchmarks/zoo_derived.py [model_type ...] [--outtypes f16,q8_0] [--json OUT]
    python benchmarks/zoo_derived.py --summarize RUN.json [RUN.json ...] [--json MERGED]

Without model types: every derived model type the zoo lists (fixtures/zoo.py's mappings; the ones it
cannot build are reported as unbuildable).  ``--json OUT`` also writes the per-type results there
(``{"<type>/<outtype>": {"status", "llama.cpp", "ours", "seconds"}}``, the two sides' refusals' last
lines; ``_meta``: date, commit, transformers).  Where llama.cpp's converter stops at the first outtype
(its process ends there) and ours refuses it too, the other outtypes are recorded as the same, not run.

``--summarize`` merges runs, or an earlier ``--summarize`` output with runs (a later file's type replaces an
earlier's; each entry keeps its run's commit),
puts every model type in one class (identical f16 and q8_0, identical f16 only, DIFFERS, ours refuses,
both refuse, llama.cpp refuses while ours converts, unbuildable) and prints the share identical at both
outtypes of the types llama.cpp's converter converts.

The zoo's folders (fixtures/zoo.py) carry no tokenizer: tests/derived_util.py copies the tiny llama fixture's BPE
tokenizer in, or a SentencePiece / WordPiece one for the families that ship one (llama.cpp pads the vocabulary up to
the config's vocab_size as it does for real models), and gives the folder the Hub's form where llama.cpp's class reads
it: the class llama.cpp registers (an encoder's base model), config keys and values, tensor names and storage.
llama.cpp's converter is told the pre-tokenizer name (tests/test_llamacpp_converter.py ``_pre_tokenizer``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def folder_for(model_type: str, dest: Path) -> Path:
    from derived_util import zoo_folder
    return zoo_folder(model_type, dest)


def reference(root: Path, folder: Path, out: Path, outtypes) -> str:
    from test_llamacpp_converter import _pre_tokenizer
    env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "llamacpp_ref_convert.py"), str(root), str(folder), str(out),
                        _pre_tokenizer(folder), *outtypes], capture_output=True, text=True, env=env)
    return "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:160]


def _option(argv, name, default):
    if name not in argv:
        return default, argv
    i = argv.index(name)
    return argv[i + 1], argv[:i] + argv[i + 2:]


def _meta() -> dict:
    import datetime
    import transformers
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    from benchmarks.machine import command, load_note, machine     # what benchmarks/report.py reads
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "transformers": transformers.__version__, "machine": machine(load_note()), "command": command()}


def classify(entries: dict) -> str:
    """One class for a type's ``{outtype: entry}``."""
    st = [e["status"] for e in entries.values()]
    if all(x == "identical" for x in st):
        return "identical f16 and q8_0" if {"f16", "q8_0"} <= set(entries) else "identical (" + ",".join(entries) + ")"
    if "DIFFERS" in st:
        return "DIFFERS"
    if entries.get("f16", {}).get("status") == "identical":
        return "identical f16 only"
    if "ours refuses" in st:
        return "ours refuses"
    if "llama.cpp refuses" in st:
        return "llama.cpp refuses, ours converts"
    return "both refuse"


def summarize(paths, json_out=None) -> dict:
    by_type, runs = {}, []
    for p in paths:
        data = json.loads(Path(p).read_text())
        if "types" in data and "runs" in data:      # an earlier --summarize output: its runs and types, renumbered
            first = len(runs)
            runs.extend(data["runs"])
            by_type.update({mt: {ot: {**e, "run": first + e["run"]} for ot, e in entries.items()}
                            for mt, entries in data["types"].items()})
            continue
        meta = data.pop("_meta", {})
        runs.append(meta)
        fresh = {}
        for key, e in data.items():
            mt, _, ot = key.partition("/")
            fresh.setdefault(mt, {})[ot or "-"] = {**e, "run": len(runs) - 1}
        by_type.update(fresh)
    classes = {}
    for mt in sorted(by_type):
        c = "unbuildable" if "-" in by_type[mt] else classify(by_type[mt])
        classes.setdefault(c, []).append(mt)
    for c, types in sorted(classes.items()):
        print(f"{c} ({len(types)}): {' '.join(types)}")
    ok = len(classes.get("identical f16 and q8_0", []))
    denom = sum(len(v) for c, v in classes.items() if c not in ("both refuse", "unbuildable"))
    built = sum(len(v) for c, v in classes.items() if c != "unbuildable")
    print(f"{len(by_type)} types; llama.cpp's converter converts {denom}; identical f16 and q8_0: {ok} "
          f"({100 * ok / max(denom, 1):.1f} % of those; {100 * ok / max(built, 1):.1f} % of the {built} the zoo builds)")
    merged = {"runs": runs, "classes": classes, "types": by_type}
    if json_out:
        Path(json_out).write_text(json.dumps(merged, indent=1) + "\n")
    return merged


def main(argv):
    from llamacpp_src import llamacpp_source
    from ckpt_surgeon.conversion import convert
    from ckpt_surgeon.conversion.derived import architecture_table
    from ckpt_surgeon.errors import CkptError
    from fixtures.zoo import zoo_mapping
    outtypes, argv = _option(argv, "--outtypes", "f16,q8_0")
    outtypes = outtypes.split(",")
    json_out, argv = _option(argv, "--json", None)
    root = llamacpp_source()
    os.environ.setdefault("CKPT_SURGEON_LLAMACPP_SRC", str(root))
    derived = {r.model_type for r in architecture_table() if r.engine == "derived" and r.model_type}
    types = argv or sorted(derived & set(zoo_mapping()))
    work = Path(tempfile.mkdtemp(prefix="zoo-derived-"))
    results = {"_meta": {**_meta(), "outtypes": outtypes}}
    from derived_util import REMOTE_TOKENIZER
    for mt in types:
        try:
            folder = folder_for(mt, work / "src")
        except Exception as e:  # noqa: BLE001 -- unbuildable zoo entry: reported, not fatal
            results[mt] = {"status": "unbuildable", "why": str(e)[:160]}
            print(f"{mt:28s} unbuildable: {str(e)[:120]}", flush=True)
            continue
        ref = work / "ref" / mt
        ref.mkdir(parents=True)
        t0 = time.perf_counter()
        why_ref = reference(root, folder, ref, outtypes)
        for k, ot in enumerate(outtypes):
            if why_ref and k and results[f"{mt}/{outtypes[0]}"]["status"] == "both refuse":
                # llama.cpp's process stopped at the first outtype; ours refused it too: not run again
                results[f"{mt}/{ot}"] = {**results[f"{mt}/{outtypes[0]}"], "not_rerun": True}
                print(f"{mt:28s} {ot:5s} both refuse (as {outtypes[0]}; not run again)", flush=True)
                continue
            ours = work / "ours" / mt / f"{ot}.gguf"
            ours.parent.mkdir(parents=True, exist_ok=True)
            try:
                # a folder with its own tokenizer module (derived_util.REMOTE_TOKENIZER: ours, written for the test)
                convert(folder, ours, ot, engine="llama.cpp", trust_remote_code=mt in REMOTE_TOKENIZER)
                why_ours = ""
            except CkptError as e:
                why_ours = str(e)[-160:]
            except Exception as e:  # noqa: BLE001 -- a crash on our side is a result to report, not the sweep's end
                why_ours = f"CRASH {type(e).__name__}: {str(e)[-140:]}"
            if why_ref or why_ours:
                status = "both refuse" if why_ref and why_ours else ("llama.cpp refuses" if why_ref else "ours refuses")
                line = f"{status}: {why_ref or why_ours}" + (f" | ours: {why_ours}" if why_ref and why_ours else "")
            else:
                same = (ref / f"{ot}.gguf").read_bytes() == ours.read_bytes()
                status = "identical" if same else "DIFFERS"
                line = status
            results[f"{mt}/{ot}"] = {"status": status, "llama.cpp": why_ref, "ours": why_ours,
                                     "seconds": round(time.perf_counter() - t0, 1)}
            print(f"{mt:28s} {ot:5s} {line}", flush=True)
        if json_out:   # after every type: a killed sweep keeps what it measured
            Path(json_out).write_text(json.dumps(results, indent=1) + "\n")
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {json_out or work / 'results.json'}")


if __name__ == "__main__":
    if "--summarize" in sys.argv:
        out, rest = _option(sys.argv[1:], "--json", None)
        summarize([a for a in rest if a != "--summarize"], out)
    else:
        main(sys.argv[1:])
