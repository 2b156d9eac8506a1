"""Issue 27's invariant on the zoos: every attention projection bias of a file ends in a report row or is
named in the table's warning ("N attention bias tensor(s) could not be placed"), and ``lint`` then
reports an error.  Bias tensors are counted by introspecting the model's attention modules (module
classes named ``*Attention``, torch's ``nn.MultiheadAttention``), not by the report's own matching.

Which models: by default every model of both zoos (causal / masked-LM and the multimodal
``<model_type>@mm`` one of fixtures/zoo.py); ``ZOO_TOWERS`` = comma-separated zoo keys runs those only
(``default`` = a fixed set covering the issue's cases: renamed layouts, vision / audio towers, a pooling
head, tower head counts unlike the text model's).  The full run prints the figures (share of
attention-bias and key-bias tensors reported per tower kind, key-bias stacks classified), holds them to
the issue's targets (>= 95 % each), and fails when ``tests/zoo_mm_unbuildable.txt`` (the multimodal
architectures that cannot be built tiny here) and reality differ.

Claimed exact folds are judged with transformers' float64 forward pass on the multimodal models and on the
causal / masked ones with more than one stack; a causal / masked model with one stack is judged by
tests/test_zoo.py (same stack, same conditions, same judge), once per suite run rather than twice.  A run of
a ``ZOO_TOWERS`` subset judges every model it runs.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

MM_UNBUILDABLE = Path(__file__).with_name("zoo_mm_unbuildable.txt")
DEFAULT = ("exaone", "sarvam_moe", "gemma3", "phi4_multimodal", "qwen2_vl@mm", "llava@mm", "paligemma@mm",
           "qwen2_audio@mm", "florence2@mm", "deepseek_vl_hybrid@mm", "whisper@mm", "pp_formulanet@mm",
           "minimax_m3_vl@mm")
# output projections of an attention module (their bias is not a q/k/v bias); the test's own list (Aria's
# cross-attention calls its output projection ``linear``, InternVL's ``projection_layer``, BLIP's ``projection``)
_OUT = re.compile(r"^(o|out|o_proj|out_proj|dense|c_proj|wo|proj|output|attn_out|o_linear|linear_out|out_lin|"
                  r"output_proj|to_out|projection_layer|linear|projection|post_proj)$", re.I)
# not q/k/v projections: positions, gates, norms, adapters, routers, sinks, Doge's dynamic-mask ``dt_proj``,
# ConvBERT's span-based dynamic convolution (``conv_kernel_layer`` / ``conv_out_layer``)
_POS = re.compile(r"pos|rel|gate|norm|lora|router|sink|^dt_|conv", re.I)
_KEY = re.compile(r"(^|_)(k|key|wk)(_|$)|k_proj|k_lin|linear_k|to_k")


def attention_biases(folder: Path) -> dict:
    """{file tensor name: role} of every q/k/v projection bias in the file, found from the model's module tree:
    the ``bias`` of each direct linear child of an attention module (class name ending in Attention, or
    torch's MultiheadAttention's ``in_proj_bias``) that is not its output projection.  role: k | qkv | other."""
    import torch

    from ckpt_surgeon.arch.derive.derived import build_meta
    from ckpt_surgeon.arch.derive.renames import loaded_names
    cfg = json.loads((folder / "config.json").read_text())
    _, model = build_meta(cfg)
    found = {}
    for path, mod in model.named_modules():
        klass = type(mod).__name__
        if isinstance(mod, torch.nn.MultiheadAttention) and getattr(mod, "in_proj_bias", None) is not None:
            found[f"{path}.in_proj_bias"] = "qkv"
        elif klass.endswith("Attention") and not re.search(r"linear|mamba|delta|lightning", klass, re.I):
            for name, child in mod.named_children():
                w, b = getattr(child, "weight", None), getattr(child, "bias", None)
                if (isinstance(b, torch.nn.Parameter) and getattr(w, "ndim", 0) == 2 and not _OUT.match(name)
                        and not _POS.search(name)):
                    found[f"{path}.{name}.bias"] = "k" if _KEY.search(name) else "qkv" if "qkv" in name.lower() \
                        or name in ("c_attn", "query_key_value", "W_pack", "Wqkv") else "other"
    from safetensors import safe_open
    names = [k for f in folder.glob("*.safetensors") for k in safe_open(f, "np").keys()]
    to_model = {n: r.model_name for n, r in loaded_names(model, names).items()}
    out = {}
    for n in names:
        m = to_model.get(n, n)
        hit = found.get(m) or next((r for p, r in found.items() if m.endswith("." + p) or p.endswith("." + m)), None)
        if hit:
            out[n] = hit
    return out


def _judge_folds(key: str, src: Path, rep, tmp: Path) -> dict:
    """fold-bias --k / --v where some stack claims an exact fold, judged with transformers' float64 forward
    pass (logits, and the outputs of vision towers on fixed pixels: zoo_util.logits64): an unsound claim
    moves them by more than EXACT_RTOL; a refusal of a claimed exact fold is counted too."""
    from ckpt_surgeon import analyze, fold_bias
    from ckpt_surgeon.errors import CkptError
    from zoo_util import EXACT_RTOL, logits64, rel_change
    ana = analyze(str(src))
    out = {"unsound": [], "refused": [], "folded": []}
    if not key.endswith("@mm") and len(ana.towers) <= 1 and _full():
        # one stack of a causal / masked zoo model: tests/test_zoo.py folds and judges the same stack under the
        # same conditions (its class counts are this tower's), with the same float64 judge; judged once there
        out["by_test_zoo"] = True
        return out
    want_k = any(ls and all(lr.k_class in ("exact", "partial") for lr in ls if lr.has_k_bias)
                 and any(lr.has_k_bias for lr in ls) for _, _, _, ls in ana.towers)
    want_v = any(any(lr.v_bias is not None for lr in ls) and all(lr.v_bias.foldable for lr in ls if lr.v_bias is not None)
                 for _, _, _, ls in ana.towers)
    base = None
    for flag, want in (("k", want_k), ("v", want_v)):
        if not want:
            continue
        dst = tmp / flag
        try:
            fold_bias(str(src), str(dst), **{flag: True})
        except CkptError as e:      # refused, or unsupported: either way a claimed exact fold not made
            out["refused"].append(f"--{flag}: {type(e).__name__}: {e}")
            continue
        base = logits64(src) if base is None else base
        r = rel_change(base, logits64(dst))
        out["unsound" if r >= EXACT_RTOL else "folded"].append(f"--{flag}: relative change {r:.3g}")
    return out


def check(key: str, tmp: Path | None = None) -> dict:
    from ckpt_surgeon import inspect, lint
    from ckpt_surgeon.arch.derive.derived import tower_kind
    from fixtures.build_fixtures import zoo_path
    from fixtures.zoo import Unbuildable
    t0 = time.perf_counter()
    try:
        src = zoo_path(key)
    except Unbuildable as e:
        return {"key": key, "status": "unbuildable", "reason": str(e)}
    try:
        rep = inspect(str(src))
        lrep = lint(str(src))
    except Exception as e:   # noqa: BLE001 - an error on a valid checkpoint is counted, never hidden
        return {"key": key, "status": "error", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
    biases = attention_biases(src)
    placed, kinds = {}, {}
    for t in rep.towers or ():
        for lr in t.layers:
            for b in (lr.q_bias, lr.k_bias, lr.v_bias):
                if b is not None and b.tensor:
                    placed[b.tensor] = t.kind
    warned = set(rep.skipped)
    silent = sorted(n for n in biases if n not in placed and n not in warned)
    for n, role in biases.items():
        kind = placed.get(n) or tower_kind(n)
        d = kinds.setdefault(kind, {"bias": 0, "bias_placed": 0, "k": 0, "k_placed": 0})
        d["bias"] += 1
        d["bias_placed"] += n in placed
        if role in ("k", "qkv"):
            d["k"] += 1
            d["k_placed"] += n in placed
    stacks = {}       # per stack with key biases: its key-bias classes (classified = not unknown)
    for t in rep.towers or ():
        cls = sorted({(lr.extra.get("k_bias_redundancy") or {}).get("class") or "unknown"
                      for lr in t.layers if lr.k_bias is not None})
        if cls:
            stacks[t.name] = {"kind": t.kind, "classes": cls}
    folds = _judge_folds(key, src, rep, tmp) if tmp is not None else {}
    unplaced_warning = any("could not be placed" in w for w in rep.warnings)
    lint_error = any(f.check == "unplaced-bias" and f.severity == "error" for f in lrep.findings)
    return {"key": key, "status": "ok", "biases": len(biases), "placed": sum(n in placed for n in biases),
            "silent": silent, "warned": len(warned), "warning_shown": unplaced_warning, "lint_error": lint_error,
            "zero_with_biases": bool(biases) and rep.layers_with_qkv_bias == 0 and not any(
                t.layers_with_qkv_bias for t in rep.towers) and not unplaced_warning,
            "kinds": kinds, "towers": [(t.name, t.kind, len(t.layers)) for t in rep.towers], "stacks": stacks,
            "folds": folds,
            "seconds": round(time.perf_counter() - t0, 1)}


def _full() -> bool:
    return os.environ.get("ZOO_TOWERS", "all") == "all"


def _keys() -> list[str]:
    want = os.environ.get("ZOO_TOWERS", "all")
    if want == "default":
        return list(DEFAULT)
    if want == "all":   # the multimodal zoo first: tests/test_zoo.py builds the causal / masked one meanwhile
        from fixtures.zoo import mm_mapping, zoo_mapping       # on the other worker (tests/conftest.py)
        return sorted(mm_mapping()) + sorted(zoo_mapping())
    return [k.strip() for k in want.split(",") if k.strip()]


@pytest.fixture(scope="module")
def results(tmp_path_factory, zoo_derive_cache) -> dict:
    old = os.environ.get("CKPT_SURGEON_CACHE_DIR")
    os.environ["CKPT_SURGEON_CACHE_DIR"] = str(zoo_derive_cache)
    try:
        out = {}
        for key in _keys():
            out[key] = r = check(key, tmp_path_factory.mktemp(key.replace("@", "_")))
            print(f"zoo-towers {key}: {r['status']} {r.get('reason', '')[:120]} biases {r.get('biases')} placed "
                  f"{r.get('placed')} silent {len(r.get('silent', ()))} towers {r.get('towers')}", file=sys.stderr,
                  flush=True)
        return out
    finally:
        if old is None:
            os.environ.pop("CKPT_SURGEON_CACHE_DIR", None)
        else:
            os.environ["CKPT_SURGEON_CACHE_DIR"] = old


def test_no_errors_on_valid_checkpoints(results):
    errors = {k: r["reason"] for k, r in results.items() if r["status"] == "error"}
    assert not errors, errors


def test_every_attention_bias_is_placed_or_named(results):
    """The invariant: no silent miss; what is not placed is named in the table's warning and is a lint error."""
    ok = [r for r in results.values() if r["status"] == "ok"]
    assert sum(r["biases"] for r in ok) >= 10       # the introspection really finds biases (the zoo turns them on)
    silent = {r["key"]: r["silent"][:5] for r in ok if r["silent"]}
    assert not silent, silent
    unsaid = [r["key"] for r in ok if r["warned"] and not (r["warning_shown"] and r["lint_error"])]
    assert not unsaid, unsaid
    assert not [r["key"] for r in ok if r["zero_with_biases"]]


def test_no_unsound_claims_and_no_refused_exact_folds(results):
    ok = [r for r in results.values() if r["status"] == "ok"]
    assert sum(len(r["folds"].get("folded", ())) for r in ok) >= 3     # the judge really folds something
    unsound = {r["key"]: r["folds"]["unsound"] for r in ok if r["folds"].get("unsound")}
    refused = {r["key"]: r["folds"]["refused"] for r in ok if r["folds"].get("refused")}
    assert not unsound, unsound
    assert not refused, refused


def test_figures(results):
    """Printed figures; on the full run, issue 27's targets: >= 95 % of the key-bias tensors reported in a
    tower row, >= 95 % of the key-bias stacks classified."""
    ok = [r for r in results.values() if r["status"] == "ok"]
    tot: dict = {}
    for r in ok:
        for kind, d in r["kinds"].items():
            t = tot.setdefault(kind, {"bias": 0, "bias_placed": 0, "k": 0, "k_placed": 0})
            for x in t:
                t[x] += d[x]
    allk = sum(t["k"] for t in tot.values())
    placed_k = sum(t["k_placed"] for t in tot.values())
    print(f"\nzoo-towers: {len(results)} models, {len(ok)} inspected, "
          f"{sum(r['status'] == 'unbuildable' for r in results.values())} unbuildable; key-bias tensors reported "
          f"{placed_k}/{allk} ({placed_k / max(allk, 1):.1%}); per kind: "
          + "; ".join(f"{k} {t['k_placed']}/{t['k']} key, {t['bias_placed']}/{t['bias']} all" for k, t in sorted(tot.items())))
    kb = [s for r in ok for s in r["stacks"].values()]
    classified = sum("unknown" not in s["classes"] for s in kb)
    unknown = sorted(f"{r['key']}:{n}" for r in ok for n, s in r["stacks"].items() if "unknown" in s["classes"])
    print(f"zoo-towers: key-bias stacks classified {classified}/{len(kb)} ({classified / max(len(kb), 1):.1%}); "
          f"unknown: {unknown}")
    assert 0 < placed_k <= allk and 0 < classified <= len(kb)
    if _full():
        assert placed_k >= 0.95 * allk, (placed_k, allk)
        assert classified >= 0.95 * len(kb), (classified, len(kb), unknown)


def test_mm_unbuildable_list_is_current(results):
    """Every multimodal key run that could not be built is listed with its reason, and nothing else (on a
    subset: the listed keys of the subset)."""
    listed = {}
    for line in MM_UNBUILDABLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, why = line.partition(": ")
            listed[k.strip()] = why
    got = {k for k, r in results.items() if r["status"] == "unbuildable" and k.endswith("@mm")}
    want = {k for k in listed if k in results}
    assert got == want, (sorted(got - want), sorted(want - got))
