"""The hook through which rank 0 of a distributed ``verify`` gets its models' outputs.

:mod:`.core` and :mod:`.corpus` ask :func:`pair_hook` / :func:`single_hook` first where they need
both models' (or one model's) outputs; outside a distributed run the answer is None and they run
their own sources.  Inside one, rank 0's :class:`.dist_run.Driver` is active here and the answer is
an iterator every rank feeds (:mod:`.dist_run`).  This module imports nothing of ours, so that the
flow modules can consult it without depending on the distributed machinery.
"""
from __future__ import annotations

import contextlib

_ACTIVE = None        # the Driver of this process when it is rank 0 of a distributed run


def active():
    return _ACTIVE


@contextlib.contextmanager
def driving(driver):
    global _ACTIVE
    _ACTIVE = driver
    try:
        yield driver
    finally:
        _ACTIVE = None


def pair_hook(reference, candidate, sequences, *, rows, dtype: str, device: str, layers: bool = False,
              notes: list | None = None):
    """The distributed source of both models' outputs, or None when this is no distributed run (or
    the plan leaves this request to rank 0 alone).  ``rows``: a slice for every chunk, a list of
    position arrays, or None (all positions).  ``layers``: the caller reports the per-layer
    divergence (the streamed prompt path); the iterator then has ``.localize()``.  ``notes``: the
    report's notes, told how the run was split."""
    d = _ACTIVE
    if d is None:
        return None
    if layers and d.plan.mode != "pipeline":      # prompts streamed on rank 0 alone
        alone_note(notes if notes is not None else [])
        return None
    if notes is not None:
        notes.append(d.note())
    return d.run([reference, candidate], ["reference", "candidate"], sequences, rows, dtype, device)


def single_hook(given, role: str, sequences, *, rows, dtype: str, device: str):
    """One model's outputs (a reference being saved, a candidate scored against a saved one):
    yields ``(chunk, logits)``, or None when this is no distributed run."""
    d = _ACTIVE
    if d is None:
        return None
    return ((i, out) for i, out in d.run([given], [role], sequences, rows, dtype, device))


# prompt mode's kinds whose outputs are one array per prompt and model (and greedy ids): dealt over the ranks
SPREAD_KINDS = ("causal-lm", "masked-lm", "encoder")


def prompts_hook(reference, candidate, run: dict, dtype: str, notes: list):
    """Prompt mode with both models loaded whole, under torchrun in data mode: the prompts dealt over the ranks as
    corpus chunks are (rank r runs prompts r, r + world, ...), returned as an object with ``.mine`` (the prompts
    this process runs), ``.start()`` (the others begin) and ``.merge(own)`` (every prompt's output pair, in prompt
    order, ``own`` this process's);
    None when this is no distributed run, or the run keeps the prompts on rank 0 (a model with towers or an
    encoder-decoder: said in ``notes``)."""
    d = _ACTIVE
    if d is None:
        return None
    if d.plan.mode != "data" or run["kind"].name not in SPREAD_KINDS or run["towers"]:
        alone_note(notes)
        return None
    notes.append(d.prompts_note())
    return d.prompts(reference, candidate, run, dtype)


def alone_note(notes: list) -> None:
    """Prompt mode with both models loaded whole (data mode, or a run rank 0 plans on its own): the
    prompts run on rank 0 alone, and the report says so (its numbers are the one-process run's)."""
    d = _ACTIVE
    if d is not None:
        notes.append(d.alone_note())
