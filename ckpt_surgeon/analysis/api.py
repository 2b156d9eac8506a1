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
from .layer_redundancy import DEFAULT_EPSILON


def analyze(source, context: int | None = None, epsilon: float = DEFAULT_EPSILON, measure: bool = False,
            prompts=None, *, device: str = "auto", dtype: str = "float32", max_tokens: int | None = None,
            distance_profile: bool = False, deltas=None, rope_theta: float | None = None,
            rope_scaling: str | dict | None = None, skip_first: int = 4, kv_cache=None, per_head: bool = False,
            attn_rot: bool | None = None, **open_kwargs):
    """Which attention biases are really redundant: the twin of ``ckpt-surgeon analyze`` (docs/analyze.md).

    ``source``: folder, .safetensors, .gguf, Hub repo id or an open Checkpoint; ``context`` / ``epsilon``: the
    window and angle of near-redundant rotary pairs.  ``measure=True`` also runs the model with transformers on
    ``prompts`` (default: the built-in set) and attaches ``report.measured``.  ``distance_profile=True``: what
    the q/k biases do with distance (``report.distance_profile``; ``deltas``, and ``rope_theta`` /
    ``rope_scaling`` such as ``"yarn:4"`` for a what-if; measured with ``measure``, ``skip_first`` tokens left
    out).  ``kv_cache`` (``"q4_0,q8_0"``): the quantized-KV-cache prediction instead, a KvCacheReport (per kv
    head with ``per_head``; measured through ggml's kernels with ``measure``, ``max_tokens`` each; ``attn_rot``:
    model llama.cpp's Hadamard rotation, None: as llama.cpp would here).  The static part imports no torch.

    Returns:
        :class:`~ckpt_surgeon.analysis.redundancy_report.AnalysisReport` (with ``kv_cache``: a KvCacheReport)

    Example::

        import ckpt_surgeon
        rep = ckpt_surgeon.analyze("all-MiniLM-L6-v2")
        rep.layers[0].k_class, rep.layers[0].bound, rep.to_frame()
        kv = ckpt_surgeon.analyze("Qwen2.5-7B", kv_cache="q4_0,q8_0")     # kv.at_risk("q4_0")
    """
    if kv_cache is not None:
        return _kv_cache(source, kv_cache, context=context, per_head=per_head, measure=measure,
                         distance_profile=distance_profile, prompts=prompts, device=device, dtype=dtype,
                         max_tokens=max_tokens, open_kwargs=open_kwargs, attn_rot=attn_rot)
    where = source.source if isinstance(source, Checkpoint) else source
    if measure:
        M.check_local(where)     # before the static pass: a Hub source cannot be measured
    profile = dict(context=context, deltas=deltas, rope_theta=rope_theta, rope_scaling=rope_scaling) \
        if distance_profile else None
    if isinstance(source, Checkpoint):
        report, prof = _static(source, context, epsilon, profile)
    else:
        from ..checkpoint import open_checkpoint
        with open_checkpoint(source, **open_kwargs) as ck:      # opened once for both static passes
            report, prof = _static(ck, context, epsilon, profile)
    if prof is not None:
        from .distance_measure import measure_profile
        if measure:
            prof = measure_profile(where, prof, prompts=prompts, device=device, dtype=dtype, max_tokens=max_tokens,
                                   skip_first=skip_first, progress=open_kwargs.get("progress"))
        return replace(report, distance_profile=prof, notes=tuple(report.notes) + tuple(
            n for n in prof.notes if n not in report.notes))
    if measure:
        m = M.measure(where, context=context, epsilon=epsilon, prompts=prompts, device=device, dtype=dtype,
                      max_tokens=max_tokens, progress=open_kwargs.get("progress"))
        report = replace(report, measured=m)
    return report


def _static(ck: Checkpoint, context, epsilon, profile: dict | None):
    """The static report of open checkpoint ``ck`` and, when ``profile`` gives its settings
    (context, deltas, rope_theta, rope_scaling), its static distance profile (else None)."""
    ck.refuse_truncated()        # as every command but inspect (which shows the structure)
    report = R.analyze_checkpoint(ck, context=context, epsilon=epsilon)
    if profile is None:
        return report, None
    from ..arch.rope_frequencies import parse_rope_scaling
    from .distance_profile import distance_profile
    scaling = profile["rope_scaling"]
    scaling = parse_rope_scaling(scaling) if isinstance(scaling, str) else scaling
    return report, distance_profile(ck, context=profile["context"], deltas=profile["deltas"],
                                    theta=profile["rope_theta"], scaling=scaling)


def _kv_cache(source, kv_cache, *, context, per_head, measure, distance_profile, prompts, device, dtype,
              max_tokens, open_kwargs, attn_rot=None):
    """``analyze(kv_cache=...)``: the static prediction, and with ``measure`` the measured table beside it."""
    from ..errors import CkptError
    from .kv_cache import analyze_kv_cache, parse_cache_types
    where = source.source if isinstance(source, Checkpoint) else source
    parse_cache_types(kv_cache, path=str(where))
    if distance_profile:
        raise CkptError("kv_cache and distance_profile are separate reports: run them one at a time")
    if measure:
        M.check_local(where)
        if dtype != "float32":
            raise CkptError(f"kv_cache with measure runs the model in float32 (the cache's input), not {dtype}",
                            path=str(where))
    report = analyze_kv_cache(source, kv_cache, context=context, per_head=per_head, attn_rot=attn_rot, **open_kwargs)
    if not measure:
        return report
    from .kv_measure import DEFAULT_MAX_TOKENS, measure_kv_cache
    m = measure_kv_cache(where, report.cache_types, prompts=prompts, device=device,
                         max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                         attn_rot=report.attn_rot, perm=report.capture_perm or None,
                         progress=open_kwargs.get("progress"))
    return replace(report, measured=m, notes=tuple(report.notes) + tuple(m.notes))
