"""``verify`` on a multimodal model: each vision / audio tower judged on its own outputs.

A token-id prompt runs the text path of a vision-language model, never its vision tower, so a fold in the
tower (``fold-bias --k --tower model.vision_tower.encoder.layers``) would pass unseen.  Each tower the
reference's layout reports (:meth:`ckpt_surgeon.arch.model_layout.ModelLayout.stacks`) is therefore also
run alone, in both models, on the same seeded pixels / audio features built from its config
(:func:`ckpt_surgeon.arch.derive.feeds.tower_input`: the module above the tower's layers whose forward takes
them), and every floating output it returns is compared.  A tower that cannot be run alone (no such
module, or no input shape its modeling file takes) is said so in the report, never passed silently.

Judged like the logits: ``max|Δ| / max|reference|`` against the run's ``max_logit_diff`` threshold.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOWER_KEYS: dict[str, str] = {
    "towers[].name": "the tower (its layer list's module path, as inspect names it)",
    "towers[].kind": "vision | audio | projector | other",
    "towers[].module": "the module run alone on seeded inputs built from its config (null: none could be run)",
    "towers[].inputs": "the input names and shapes fed to it",
    "towers[].max_abs_diff": "max |Δ| over every floating output of that module",
    "towers[].scale": "the reference's largest |output|",
    "towers[].max_rel_diff": "max_abs_diff / scale; judged against thresholds.max_logit_diff",
    "towers[].passed": "true / false; null when the tower could not be run alone",
    "towers[].note": "why it was not run, when it was not",
}


@dataclass(frozen=True)
class TowerResult:
    name: str
    kind: str
    module: str | None
    inputs: str = ""
    max_abs_diff: float | None = None
    scale: float | None = None
    passed: bool | None = None
    note: str = ""

    @property
    def max_rel_diff(self) -> float | None:
        if self.max_abs_diff is None or not self.scale:
            return None
        return self.max_abs_diff / self.scale

    def to_dict(self) -> dict:
        from ..records import finite_or_none as num
        return {"name": self.name, "kind": self.kind, "module": self.module, "inputs": self.inputs,
                "max_abs_diff": num(self.max_abs_diff), "scale": num(self.scale), "max_rel_diff": num(self.max_rel_diff),
                "passed": self.passed, "note": self.note}


def tower_targets(source, revision: str | None = None) -> list[tuple[str, str]]:
    """(name, kind) of every tower besides the main text stack of ``source`` (empty for one stack)."""
    from ..checkpoint import open_checkpoint
    kw = {"revision": revision} if revision else {}
    with open_checkpoint(source, **kw) as ck:
        return [(name, kind) for name, kind, _, _ in ck.layout().stacks()[1:]]


def tower_arrays(model, targets, torch) -> dict:
    """{tower name: (module path, inputs description, float64 numpy outputs) or (None, reason, None)}."""
    from ..arch.derive.feeds import tower_input, tower_outputs
    from ..arch.derive.float64 import float64_softmax
    out, modules = {}, {id(m): p for p, m in model.named_modules()}
    for name, _ in targets:
        try:
            hit = tower_input(model, name.split("#")[0] + ".{L}")
        except Exception as e:   # noqa: BLE001 - a tower that cannot run alone is reported, not fatal
            hit, why = None, f"{type(e).__name__}: {str(e)[:120]}"
        else:
            why = "no module above this tower takes pixels / audio features of a shape built from its config"
        if hit is None:
            out[name] = (None, why, None)
            continue
        mod, inputs = hit
        dev = next(mod.parameters()).device
        dtype = next(mod.parameters()).dtype
        moved = {k: (v.to(dev, dtype) if v.is_floating_point() else v.to(dev)) if isinstance(v, torch.Tensor) else v
                 for k, v in inputs.items()}
        with float64_softmax():
            res = tower_outputs(mod(**moved)).double().cpu().numpy()
        desc = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items() if isinstance(v, torch.Tensor))
        out[name] = (modules.get(id(mod), "?"), desc, res)
    return out


def compare_towers(targets, ref: dict, cand: dict, max_rel: float) -> tuple:
    results = []
    for name, kind in targets:
        r_mod, r_desc, r = ref.get(name, (None, "not run", None))
        _, _, c = cand.get(name, (None, "not run", None))
        if r is None or c is None:
            results.append(TowerResult(name, kind, None, note=f"not run alone: {r_desc}"))
            continue
        if r.shape != c.shape:
            results.append(TowerResult(name, kind, r_mod, r_desc, passed=False,
                                       note=f"output shapes differ: {list(r.shape)} vs {list(c.shape)}"))
            continue
        diff = float(np.max(np.abs(r - c))) if r.size else 0.0
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        rel = diff / scale if scale else diff
        results.append(TowerResult(name, kind, r_mod, r_desc, diff, scale, bool(rel <= max_rel)))
    return tuple(results)


def tower_failures(results) -> list[str]:
    return [f"tower {t.name}: max relative difference {t.max_rel_diff:.3g} over its outputs" + (f" ({t.note})" if t.note else "")
            if t.max_rel_diff is not None else f"tower {t.name}: {t.note}"
            for t in results if t.passed is False]
