"""``analyze``: static redundancy analysis of a source, and measured mode on top of it.

The two halves are separate modules with one-way imports: static analysis
(:mod:`.redundancy`, numpy only, no forward pass) knows nothing of measuring; measured mode
(:mod:`.measure`, transformers forward passes) builds on the static report.  This module
composes them into the one entry point behind ``ckpt-surgeon analyze`` and
``ckpt_surgeon.analyze``.
"""
from __future__ import annotations

from dataclasses import replace

from ..checkpoint import Checkpoint
from . import measure as M
from . import redundancy as R


def analyze(source, context: int | None = None, epsilon: float = R.DEFAULT_EPSILON, measure: bool = False,
            prompts=None, *, device: str = "auto", dtype: str = "float32", max_tokens: int | None = None,
            **open_kwargs) -> R.AnalysisReport:
    """Python API twin of ``ckpt-surgeon analyze``.

    ``source``: folder, .safetensors, .gguf, Hub repo id or an open Checkpoint.  Static analysis
    always; ``measure=True`` also runs the model with transformers on ``prompts`` (default:
    :func:`ckpt_surgeon.analysis.prompts.default_prompts`) and attaches a
    :class:`~ckpt_surgeon.analysis.measure.MeasuredReport` as ``report.measured``.
    """
    where = source.source if isinstance(source, Checkpoint) else source
    if measure:
        M.check_local(where)     # before the static pass: a Hub source cannot be measured
    report = R.analyze(source, context=context, epsilon=epsilon, **open_kwargs)
    if measure:
        m = M.measure(where, context=context, epsilon=epsilon, prompts=prompts, device=device, dtype=dtype,
                      max_tokens=max_tokens)
        report = replace(report, measured=m)
    return report
