"""GGUF -> HF on the derived path over the zoo: every zoo architecture outside the native registry
that llama.cpp's converter registers, converted HF -> GGUF at f32 by the derived path (byte-identical
to llama.cpp's converter: benchmarks/zoo_derived.py) and back with ``--config`` (the folder's own
config.json); prints one line per architecture: round trip bit-exact on every tensor (float ones as float32, the
others byte for byte as stored), refused (why),
or the forward conversion itself refused.

    CKPT_SURGEON_FIXTURE_CACHE=... python benchmarks/zoo_gguf_to_hf.py [model_type ...] [--json OUT]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def round_trip(folder: Path, work: Path) -> tuple[str, str]:
    import numpy as np
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.conversion import convert
    from ckpt_surgeon.errors import CkptError
    gguf, back = work / "m.f32.gguf", work / "back"
    try:
        from derived_util import REMOTE_TOKENIZER      # a folder with its own tokenizer module (ours, for the test)
        convert(folder, gguf, "f32", engine="llama.cpp", trust_remote_code=folder.name in REMOTE_TOKENIZER)
    except CkptError as e:
        return "forward refused", str(e)[-200:]
    try:
        convert(gguf, back, config=folder)
    except CkptError as e:
        return "refused", str(e)[-240:]
    with open_checkpoint(folder) as a, open_checkpoint(back) as b:
        if sorted(a.tensors) != sorted(b.tensors):
            return "DIFFERS", f"tensor names {sorted(set(a.tensors) ^ set(b.tensors))[:3]}"
        for n in a.tensors:
            if a.tensors[n].dtype not in ("F64", "F32", "F16", "BF16"):     # integers, a release's packed form
                if (a.tensors[n].dtype, a.read_raw(n)) != (b.tensors[n].dtype, b.read_raw(n)):
                    return "DIFFERS", n
                continue
            x, y = a.read(n).astype(np.float32), b.read(n)
            if x.shape != y.shape or not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
                return "DIFFERS", n
    return "round trip", ""


def main(argv):
    from llamacpp_src import llamacpp_source
    from zoo_derived import folder_for
    from ckpt_surgeon.conversion.derived import architecture_table
    out_json = None
    if "--json" in argv:
        i = argv.index("--json")
        out_json, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    os.environ.setdefault("CKPT_SURGEON_LLAMACPP_SRC", str(llamacpp_source()))
    derived = {r.model_type for r in architecture_table() if r.engine == "derived" and r.model_type}
    work = Path(tempfile.mkdtemp(prefix="zoo-g2h-"))
    import datetime

    import transformers
    from benchmarks.machine import command, load_note, machine     # what benchmarks/report.py reads
    results = {"_run": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        "transformers": transformers.__version__, "machine": machine(load_note()),
                        "command": command()}}
    for mt in argv or sorted(derived):
        try:
            folder = folder_for(mt, work / "src")
        except Exception as e:  # noqa: BLE001 -- unbuildable zoo entry: reported, not fatal
            status, why = "unbuildable", str(e)[:160]
        else:
            (work / mt).mkdir()
            status, why = round_trip(folder, work / mt)
        results[mt] = {"status": status, "why": why}
        print(f"{mt:28s} {status}{': ' + why if why else ''}", flush=True)
        if out_json:
            Path(out_json).write_text(json.dumps(results, indent=1))
    counts = {}
    for k, r in results.items():
        if not k.startswith("_"):
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
