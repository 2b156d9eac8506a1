"""Where do two models start to differ?  ``verify --localize``.

Both models run the same token ids (the reference's tokenizer, as in :func:`.core.verify`) with
forward hooks on every decoder layer's output and on its attention and MLP sub-modules.  Per
hooked point and over all prompts and positions: max |Δ hidden| and the relative Frobenius norm
‖cand − ref‖ / ‖ref‖ (float64 sums).  The first point, in execution order (attention, MLP, layer
output; layer 0 first), whose relative difference exceeds the threshold is named.

Where the hooks go comes from the registry: the decoder layers are the modules whose path ends
in the family's layer pattern (``layers.{L}``, ``h.{L}``, ``layer.{L}``), the attention module
is the parent of the family's output-projection role (``self_attn.o_proj`` -> ``self_attn``);
the MLP is the layer's child named ``mlp`` / ``feed_forward`` / ``ffn`` when there is one.

Sequential mode (one model in memory at a time) saves, per prompt and hooked point, only that
point's output ``[tokens, hidden]`` in float32 (a 32-layer 4096-wide model on a 20-token prompt:
3 points x 32 x 20 x 4096 x 4 B ≈ 31 MB), never the attention weights or other intermediates.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arch import families as F
from ..errors import CkptError, ConfigError
from ..progress import steps

PARTS = ("attention", "mlp", "output")       # execution order inside one layer
_MLP_NAMES = ("mlp", "feed_forward", "ffn")
# Default relative thresholds per compute dtype: float32 rounding over a few layers stays
# ~1e-6 relative; half precisions accumulate ~1e-3 (float16) and ~1e-2 (bfloat16) per layer.
DEFAULT_THRESHOLDS = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class PointDiff:
    layer: int
    part: str                 # attention | mlp | output
    module: str               # the hooked module's path
    max_abs: float
    rel: float                # ‖cand − ref‖_F / ‖ref‖_F over all prompts and positions
    over: bool

    def to_dict(self) -> dict:
        return {"layer": self.layer, "part": self.part, "module": self.module, "max_abs": self.max_abs,
                "rel": self.rel, "over": self.over}


@dataclass(frozen=True)
class LocalizeReport:
    threshold: float
    points: tuple
    first_layer: int | None           # first layer with a point over the threshold
    first_point: str | None           # "layer 3 attention"
    mode: str

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "first_layer": self.first_layer, "first_point": self.first_point,
                "mode": self.mode, "points": [p.to_dict() for p in self.points]}

    def rows(self) -> list[dict]:
        return [{"layer": p.layer, "part": p.part, "max_abs": p.max_abs, "rel": p.rel, "over": p.over}
                for p in self.points]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())

    def summary_items(self) -> list[tuple[str, str]]:
        where = (f"{self.first_point} (relative |Δ hidden| over {self.threshold:g})" if self.first_point
                 else f"no layer over {self.threshold:g}")
        items = [("first diverging layer", where)]
        for layer in sorted({p.layer for p in self.points}):
            ps = [p for p in self.points if p.layer == layer]
            items.append((f"layer {layer}", ", ".join(f"{p.part} max {p.max_abs:.3g} rel {p.rel:.3g}" for p in ps)))
        return items


# --------------------------------------------------------------------------- hooks


def hook_points(model, config: dict) -> list[tuple[int, str, str, object]]:
    """``[(layer, part, module path, module)]`` in execution order."""
    fam = F.by_model_type(config.get("model_type")) or F.by_architectures(config.get("architectures"))
    if fam is not None:
        pat = re.escape(fam.layer.rstrip(".")).replace(re.escape("{L}"), r"(\d+)")
        layer_rx = re.compile(r"(?:^|\.)" + pat + "$")
    else:
        layer_rx = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)$")
    modules = dict(model.named_modules())
    layers = {}
    for name, mod in modules.items():
        m = layer_rx.search(name)
        if m and int(m.group(1)) not in layers:
            layers[int(m.group(1))] = name
    if not layers:
        raise ConfigError(f"no decoder layers found in {type(model).__name__} (looked for module paths ending in "
                          f"{layer_rx.pattern}); --localize cannot hook them")
    attn_rel = None
    if fam is not None and "o" in fam.roles:
        o = fam.roles["o"]
        attn_rel = (o if isinstance(o, str) else o[0]).rsplit(".", 1)[0]
    points = []
    for i in sorted(layers):
        base = layers[i]
        if attn_rel and f"{base}.{attn_rel}" in modules:
            points.append((i, "attention", f"{base}.{attn_rel}", modules[f"{base}.{attn_rel}"]))
        mlp = next((f"{base}.{n}" for n in _MLP_NAMES if f"{base}.{n}" in modules), None)
        if mlp:
            points.append((i, "mlp", mlp, modules[mlp]))
        points.append((i, "output", base, modules[base]))
    return points


class _Recorder:
    """Forward hooks that keep the first tensor each hooked module returns (batch item 0)."""

    def __init__(self, points):
        self.points = points
        self.got: dict = {}
        self.handles = [mod.register_forward_hook(self._hook(k)) for k, (_, _, _, mod) in enumerate(points)]

    def _hook(self, k):
        def fn(_module, _inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            self.got[k] = t[0].detach().float().cpu().numpy()
        return fn

    def run(self, model, ids, device, torch) -> list[np.ndarray]:
        self.got = {}
        x = torch.tensor([ids], dtype=torch.long, device=device)
        model(input_ids=x, attention_mask=torch.ones_like(x))
        missing = [self.points[k][2] for k in range(len(self.points)) if k not in self.got]
        if missing:
            raise ConfigError(f"hooked modules did not run: {missing[:3]}")
        return [self.got[k] for k in range(len(self.points))]

    def close(self):
        for h in self.handles:
            h.remove()


class DiffAccumulator:
    def __init__(self):
        self.max_abs, self.dd, self.rr = 0.0, 0.0, 0.0

    def add(self, r: np.ndarray, c: np.ndarray) -> None:
        r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
        if r64.shape != c64.shape:
            raise ConfigError(f"hidden shapes differ between the models: {r64.shape} vs {c64.shape}")
        d = c64 - r64
        self.max_abs = max(self.max_abs, float(np.abs(d).max()) if d.size else 0.0)
        self.dd += float((d * d).sum())
        self.rr += float((r64 * r64).sum())

    def rel(self) -> float:
        return math.sqrt(self.dd) / math.sqrt(self.rr) if self.rr > 0 else (0.0 if self.dd == 0 else math.inf)


# --------------------------------------------------------------------------- API


def localize(reference, candidate, *, prompts: list[str] | None = None, device: str = "auto",
             dtype: str = "float32", sequential: bool = False, threshold: float | None = None,
             tmp_dir: str | os.PathLike | None = None, token_ids: list[list[int]] | None = None,
             tokenizer: str | os.PathLike | None = None, progress: bool | None = False,
             revision: str | None = None, candidate_revision: str | None = None,
             own_judged: str | None = None) -> LocalizeReport:
    """Run both models with hooks on every decoder layer and name the first layer whose hidden
    state differs by more than ``threshold`` (relative Frobenius; default per ``dtype``).
    ``device``: ``auto`` | ``cpu`` | ``cuda`` (:func:`ckpt_surgeon.runtime.resolve_device`).
    ``token_ids`` / ``tokenizer`` / ``progress`` / ``revision`` / ``candidate_revision``: as for
    :func:`~ckpt_surgeon.verification.core.verify`; ``own_judged``: why the candidate's own tokenizer
    need not encode the prompts alike (:func:`.tokens.tokenize_pair`)."""
    import torch

    from .loading import free_memory
    from .tokens import tokenize_pair
    from ..runtime import quiet_transformers, resolve_device
    from .loading import prepare
    from .prompts import default_prompts

    device = resolve_device(device)
    thr = DEFAULT_THRESHOLDS.get(dtype) if threshold is None else float(threshold)
    if thr is None or not thr > 0:
        raise CkptError(f"localize threshold must be positive (got {threshold!r})")
    prompts = default_prompts() if prompts is None else list(prompts)
    warnings: list = []
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-localize-", dir=tmp_dir) as work_s, \
            torch.no_grad(), quiet_transformers():
        work = Path(work_s)
        ref = prepare(reference, work, role="reference", dtype=dtype, progress=progress, revision=revision)
        cand = prepare(candidate, work, role="candidate", dtype=dtype, progress=progress,
                       revision=candidate_revision)
        _, encodings = tokenize_pair(ref, cand, prompts, token_ids, tokenizer, ref.kind, 0, [],
                                     own_judged=own_judged)
        run = dict(encodings=encodings, load=dict(dtype=dtype, device=device, device_map=None, warnings=warnings,
                                                  progress=progress), device=device, torch=torch)
        compare = _compare_sequential if sequential else _compare_parallel
        names, accs = compare(ref, cand, run, work)
        free_memory(torch)
    points = tuple(PointDiff(la, part, path, acc.max_abs, acc.rel(), acc.rel() > thr)
                   for (la, part, path), acc in zip(names, accs))
    return judged(points, thr, "sequential" if sequential else "parallel")


def judged(points: tuple, threshold: float, mode: str) -> LocalizeReport:
    """The report of measured ``points`` (``over`` already set against ``threshold``): the first
    point over it, in execution order, named."""
    first = next((p for p in points if p.over), None)
    return LocalizeReport(threshold, points, first.layer if first else None,
                          f"layer {first.layer} {first.part}" if first else None, mode)


def rethreshold(loc: LocalizeReport, threshold: float) -> LocalizeReport:
    """The same per-layer measurements judged against another ``threshold`` (``--localize-threshold``
    on a streamed run, whose divergence was measured with the default)."""
    if not threshold > 0:
        raise CkptError(f"localize threshold must be positive (got {threshold!r})")
    from dataclasses import replace
    return judged(tuple(replace(p, over=p.rel > threshold) for p in loc.points), float(threshold), loc.mode)


def _point_outputs(pm, *, encodings, load: dict, device: str, torch):
    """Load ``pm`` with hooks on every point and yield ``(points, outputs)`` per prompt."""
    from .loading import load_model
    model = load_model(pm, **load)
    rec = _Recorder(hook_points(model, pm.config))
    try:
        for ids in steps(load.get("progress"), encodings, desc=f"localize: {pm.role}", unit="prompt"):
            yield rec.points, rec.run(model, ids, device, torch)
    finally:
        rec.close()


def _names(pts) -> list[tuple]:
    return [(la, part, path) for la, part, path, _ in pts]


def _compare_parallel(ref, cand, run: dict, work: Path):
    """Both models loaded, compared prompt by prompt -> (point names, one DiffAccumulator per point)."""
    names = accs = None
    for (pr, r_outs), (pc, c_outs) in zip(_point_outputs(ref, **run), _point_outputs(cand, **run)):
        names = _names(pr)
        _same_points(names, pc, cand.given)
        accs = accs or [DiffAccumulator() for _ in r_outs]
        for k, (r, c) in enumerate(zip(r_outs, c_outs)):
            accs[k].add(r, c)
    return names, accs


def _compare_sequential(ref, cand, run: dict, work: Path):
    """The reference's per-point outputs saved to ``work`` (tokens x hidden per point), its model
    freed, then the candidate compared against them -> (point names, one DiffAccumulator per point)."""
    from .loading import free_memory
    saved = work / "reference-points"
    saved.mkdir()
    names = accs = None
    for i, (pts, outs) in enumerate(_point_outputs(ref, **run)):
        names = _names(pts)
        for k, arr in enumerate(outs):
            np.save(saved / f"{i}-{k}.npy", arr)
    free_memory(run["torch"])
    for i, (pts, outs) in enumerate(_point_outputs(cand, **run)):
        accs = accs or [DiffAccumulator() for _ in outs]
        _same_points(names, pts, cand.given)
        for k, arr in enumerate(outs):
            accs[k].add(np.load(saved / f"{i}-{k}.npy"), arr)
    return names, accs


def _same_points(names, pts, where: str) -> None:
    got = [(la, part) for la, part, _, _ in pts]
    if [(la, part) for la, part, _ in names] != got:
        raise ConfigError(f"the models have different layer structures ({len(names)} vs {len(got)} hooked points); "
                          "nothing to localize", path=where)


@dataclass(frozen=True)
class LocalizedVerify:
    """A :class:`~.report.VerifyReport` with its :class:`LocalizeReport`, rendered as one report
    (``--localize``): the JSON gains a ``localize`` object, the summary its per-layer lines."""

    verify: object
    localize: LocalizeReport

    @property
    def passed(self) -> bool:
        return self.verify.passed

    @property
    def failures(self):
        return self.verify.failures

    @property
    def notes(self):
        return self.verify.notes

    @property
    def warnings(self):
        return self.verify.warnings

    def to_dict(self) -> dict:
        return {**self.verify.to_dict(), "localize": self.localize.to_dict()}

    def rows(self) -> list[dict]:
        return self.verify.rows()

    def summary_items(self) -> list[tuple[str, str]]:
        return list(self.verify.summary_items()) + self.localize.summary_items()


def localized(report, reference, candidate, o):
    """``report`` (a :class:`~.report.VerifyReport`) as ``verify(..., localize=...)`` returns it
    (``o``: its :class:`~.options.VerifyOptions`): a streamed run's per-layer divergence re-judged
    by ``o.localize_threshold`` when one is given; with ``o.localize``, the divergence found by a
    second pass (:func:`localize`, on the device, dtype and schedule the run used) unless the run
    measured it already, returned as one :class:`LocalizedVerify`."""
    if report.localize is not None and o.localize_threshold is not None:
        import dataclasses
        report = dataclasses.replace(report, localize=rethreshold(report.localize, o.localize_threshold))
    if not o.localize or report.localize is not None:      # a streamed run has measured every layer already
        return report
    from .tokenizer_check import own_judged
    where = localize(reference, candidate, prompts=o.feed.prompts, device="cuda" if report.device == "cuda" else "cpu",
                     dtype=o.placement.dtype, sequential=report.mode == "sequential", threshold=o.localize_threshold,
                     tmp_dir=o.placement.tmp_dir, token_ids=o.feed.token_ids, tokenizer=o.feed.tokenizer,
                     progress=o.placement.progress, revision=o.revision, candidate_revision=o.candidate_revision,
                     own_judged=own_judged(o, report.tokenizer))
    return LocalizedVerify(report, where)
