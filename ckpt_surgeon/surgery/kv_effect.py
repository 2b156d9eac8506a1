"""What ``kv-equalize`` does to the KV-cache error, per layer and cache type: before and after.

``analyze --kv-cache TYPES --plot DIR`` draws it (:mod:`ckpt_surgeon.analysis.kv_plots`).  It composes
analysis with surgery, so it lives here, above :mod:`ckpt_surgeon.analysis` (surgery already reads
analysis' KV model; analysis never imports surgery), and the CLI calls it:

* predicted: for each cache type ``T``, kv-equalize's own planner chooses the scales for a ``T`` K cache
  (:func:`.kv_equalize.plan_kv_equalize`, nothing written) and its records give the static prediction
  of each layer before and after;
* measured (when the report carries ``measured``): the model equalized for ``T`` is written to a
  temporary folder (:func:`.kv_equalize.kv_equalize`, the atomic writer, removed afterwards) and
  measured the same way as the original (:func:`ckpt_surgeon.analysis.kv_measure.measure_kv_cache`:
  same prompts, same token budget); "before" is the report's own measurement.

The transform is exact, so the "after" model computes the same function; only what the cache does to it
changes.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..records import finite_or_none


@dataclass(frozen=True)
class KvEffectLayer:
    """One layer and cache type: predicted K logit error, and (measured) logit RMS error and row KL."""

    layer: int
    cache_type: str
    predicted_before: float
    predicted_after: float
    measured_before: float | None = None
    measured_after: float | None = None
    kl_before: float | None = None
    kl_after: float | None = None

    def to_dict(self) -> dict:
        return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class KvEqualizeEffect:
    """Per layer and cache type, the error before and after ``kv-equalize --cache-type-k T``."""

    source: str
    cache_types: tuple
    layers: tuple                  # KvEffectLayer, type-major then layer
    measured: bool
    notes: tuple = field(default_factory=tuple)

    def of(self, cache_type: str) -> list[KvEffectLayer]:
        return [r for r in self.layers if r.cache_type == cache_type]

    def to_dict(self) -> dict:
        return {"source": self.source, "cache_types": list(self.cache_types), "measured": self.measured,
                "layers": [r.to_dict() for r in self.layers], "notes": list(self.notes)}


def _equalized_path(source, tmp: str, open_kw: dict) -> Path:
    """Where the temporary equalized copy goes: a .gguf for a GGUF source, else a folder."""
    from ..checkpoint import open_checkpoint
    with open_checkpoint(source, **open_kw) as ck:
        gguf = ck.naming == "gguf"
    return Path(tmp) / ("equalized.gguf" if gguf else "equalized")


def _one_type(source, t: str, measured, *, context, prompts, device, max_tokens, open_kw) -> list[KvEffectLayer]:
    from .kv_equalize import kv_equalize
    if measured is None:
        with tempfile.TemporaryDirectory(prefix="kv-effect-") as tmp:
            rep = kv_equalize(source, _equalized_path(source, tmp, open_kw), cache_type_k=t, context=context,
                              dry_run=True, **open_kw)
        return [KvEffectLayer(r.layer, t, r.k_before, r.k_after) for r in rep.layers]
    from ..analysis.kv_measure import DEFAULT_MAX_TOKENS, measure_kv_cache
    with tempfile.TemporaryDirectory(prefix="kv-effect-") as tmp:
        out = _equalized_path(source, tmp, open_kw)
        rep = kv_equalize(source, out, cache_type_k=t, context=context, **open_kw)
        after = measure_kv_cache(out, (t,), prompts=prompts, device=device,
                                 max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
    rows = []
    for r in rep.layers:
        b, a = measured.get(r.layer, t), after.get(r.layer, t)
        rows.append(KvEffectLayer(r.layer, t, r.k_before, r.k_after, b.k_logit_rms, a.k_logit_rms,
                                  b.k_row_kl, a.k_row_kl))
    return rows


def equalize_effect(source, report, *, context: int | None = None, prompts=None, device: str = "auto",
                    max_tokens: int | None = None, **open_kw) -> KvEqualizeEffect:
    """Before/after ``kv-equalize`` for each cache type of ``report`` (an ``analyze --kv-cache`` report;
    measured too when ``report.measured`` is set, with the same ``prompts`` / ``max_tokens`` / ``device``)."""
    rows = []
    measured = getattr(report, "measured", None)
    for t in report.cache_types:
        rows += _one_type(source, t, measured, context=context, prompts=prompts, device=device,
                          max_tokens=max_tokens, open_kw=open_kw)
    notes = ["after: the model with kv-equalize's scales for a K cache of that type (values untouched); "
             "predicted = kv-equalize's static prediction (K attention-logit RMS error)"]
    if measured is not None:
        notes.append("measured after: the equalized copy (written to a temporary folder, then removed) run on the "
                     "same prompts; an exact transform, so only the cache's error differs")
    return KvEqualizeEffect(str(source), tuple(report.cache_types), tuple(rows), measured is not None, tuple(notes))
