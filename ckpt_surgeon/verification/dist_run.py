"""A distributed ``verify``: rank 0 runs the ordinary flow, the other ranks serve its model runs.

Rank 0 runs :func:`.core.verify` / :func:`.corpus.verify_corpus` exactly as a single process
does: tokenizing, the checks, the comparison, the statistics, the report, ``--save-reference``.
Only where that flow asks for the models' outputs (the pair of logits per chunk, or one model's
logits for a saved reference) does it call :func:`pair_hook` / :func:`single_hook`, which return
an iterator that is fed by every rank:

- *data* mode: every rank loads both models whole and runs chunks ``rank, rank + world, ...``;
  the other ranks send their chunks' scored logits to rank 0, which yields them in chunk order.
  The statistics are then accumulated on rank 0 over every token in the single-process order, so
  the report is the single-process report (percentiles over all tokens, sums in the same order).
  Prompt mode deals its prompts the same way (:class:`PromptSpread`, :func:`prompts_worker`): each rank runs its
  prompts through both models, forward pass and greedy generation, and rank 0 compares them in prompt order.
- *pipeline* mode: :mod:`.dist_pipeline`.

Each such request is one *job*, broadcast by rank 0; the other ranks loop on jobs until rank 0
broadcasts the end (:func:`worker_loop`).
"""
from __future__ import annotations

import itertools
import time

from .dist_env import broadcast, drain, recv_arrays, send_arrays

from .dist_hook import active, driving  # noqa: F401  (re-exported: the rank-0 hook's state)


def _rows(rows, sequences):
    import numpy as np
    if rows is None:
        return None
    if isinstance(rows, slice):
        return [np.arange(len(s))[rows] for s in sequences]
    return [np.asarray(r, dtype=np.int64) for r in rows]


class DistOutputs:
    """What :func:`pair_hook` returns on rank 0: iterate for ``(chunk, ref_out, cand_out)`` in chunk
    order; then ``.warnings`` and (pipeline) ``.localize()``, as :class:`.stream.StreamedPair`."""

    def __init__(self, driver, job: dict):
        self.driver, self.job = driver, job
        self.warnings: list = []
        self.layers = None

    def __iter__(self):
        yield from self.driver.execute(self.job)
        result = self.job.get("result") or {}
        self.warnings.extend(result.get("warnings", []))
        self.layers = result.get("layers")

    def localize(self):
        if self.layers is None:
            raise RuntimeError("iterate the outputs first (pipeline mode only)")
        return self.layers.report()


class PromptSpread:
    """What :func:`.dist_hook.prompts_hook` returns on rank 0: the prompts it runs itself, and the merge of its
    outputs with the other ranks' in prompt order."""

    def __init__(self, driver, job: dict):
        self.driver, self.job = driver, job
        n, world = len(job["sequences"]), driver.sess.world
        self.mine = list(range(0, n, world))

    def start(self) -> None:
        """Send the job: the other ranks start their share."""
        self.driver._announce(self.job)

    def merge(self, own):
        """``((ref_out, ref_cont), (cand_out, cand_cont))`` per prompt, in order: ``own`` (this rank's share, as the
        one-process schedule yields them) and the others' received (after :meth:`start`)."""
        sess = self.driver.sess
        for i in range(len(self.job["sequences"])):
            owner = i % sess.world
            yield next(own) if owner == 0 else _received(recv_arrays(sess, owner, 4))


def _received(arrays):
    r_out, c_out, r_cont, c_cont = arrays
    return (r_out, _ids(r_cont)), (c_out, _ids(c_cont))


def _sent_ids(cont):
    """Greedy ids as an int64 array led by their count (never empty: an empty message is not sent)."""
    import numpy as np
    return np.asarray([len(cont), *cont], dtype=np.int64)


def _ids(arr) -> tuple:
    return tuple(int(t) for t in arr[1:1 + int(arr[0])])


class Driver:
    """Rank 0's side: turns each request into a job every rank runs."""

    def __init__(self, sess, plan, work: str):
        self.sess, self.plan, self.work = sess, plan, work
        self.jobs = 0
        self.sent = 0

    def note(self) -> str:
        p = self.plan
        how = (f"data-parallel: chunks dealt round-robin over the {p.world} ranks (rank r ran chunks r, r + {p.world}, "
               "...) with both models loaded"
               if p.mode == "data" else "pipeline over decoder layers, blocks " + ", ".join(
                   f"{a}-{b - 1}" for a, b in p.blocks))
        return f"distributed over {p.world} ranks ({self.sess.backend}): {how} ({p.why})"

    def alone_note(self) -> str:
        return (f"distributed over {self.plan.world} ranks ({self.sess.backend}), {self.plan.mode} mode: prompt mode "
                "ran on rank 0 alone, the other ranks loaded nothing (a model with vision / audio towers or an "
                "encoder-decoder is not split; other models' prompts are, and --dist-mode pipeline sends prompts "
                "through the layer pipeline)")

    def prompts_note(self) -> str:
        w = self.plan.world
        return (f"distributed over {w} ranks ({self.sess.backend}), data mode: prompts dealt round-robin over the {w} "
                f"ranks (rank r ran prompts r, r + {w}, ...) with both models loaded, greedy generation included; the "
                f"outputs compared on rank 0 in prompt order, as one process compares them ({self.plan.why})")

    def prompts(self, reference, candidate, run: dict, dtype: str) -> PromptSpread:
        """Prompt mode's job (mode ``prompts``): every rank runs its share of the prompts with both models."""
        job = dict(mode="prompts", paths=[str(reference), str(candidate)], roles=["reference", "candidate"],
                   sequences=[list(map(int, s)) for s in run["encodings"]], kind=run["kind"].name,
                   gen_config=run["gen_config"], seed=run["seed"], dtype=dtype,
                   device=run["device"], index=self.jobs)
        self.jobs += 1
        return PromptSpread(self, job)

    def run(self, paths, roles, sequences, rows, dtype, device) -> DistOutputs:
        seqs = [list(map(int, s)) for s in sequences]
        job = dict(mode=self.plan.mode, paths=[str(p) for p in paths], roles=list(roles), sequences=seqs,
                   rows=_rows(rows, seqs), dtype=dtype, device=device, blocks=list(self.plan.blocks),
                   index=self.jobs)
        self.jobs += 1
        return DistOutputs(self, job)

    def _announce(self, message: dict) -> None:
        """Tell the others a message is coming (they wait on the store, with no timeout: rank 0 may
        tokenize or convert for minutes first), then broadcast it."""
        self.sess.store.set(f"msg/{self.sent}", "1")
        self.sent += 1
        broadcast(message)

    def execute(self, job: dict):
        self._announce({k: v for k, v in job.items() if k != "result"})
        if job["mode"] == "pipeline":
            from .dist_pipeline import pipeline_driver
            yield from pipeline_driver(self.sess, job)
        else:
            yield from data_driver(self.sess, job, self.work)

    def finish(self, code: int) -> None:
        self._announce({"mode": "end", "code": code})


def worker_loop(sess, work: str) -> int:
    """Ranks after 0: run rank 0's jobs until it ends the run; returns rank 0's exit code."""
    import torch

    from ..runtime import quiet_transformers
    from .session import ieee_float32
    with torch.no_grad(), quiet_transformers(), ieee_float32(torch):
        for n in itertools.count():
            while not sess.store.check([f"msg/{n}"]):     # a fault elsewhere interrupts this wait
                time.sleep(0.05)
            job = broadcast(None)
            if job["mode"] == "end":
                sess.settle()            # rank 0 has said how the run ends: nothing may change this rank's code
                return int(job["code"])
            if job["mode"] == "pipeline":
                from .dist_pipeline import pipeline_worker
                pipeline_worker(sess, job)
            elif job["mode"] == "prompts":
                prompts_worker(sess, job, work)
            else:
                data_worker(sess, job, work)


def plan_run(sess, *, inputs, models, dtype: str, ctx: int, memory_budget, device: str, mode: str,
             one_at_a_time: bool = False):
    """Every rank: check that all see the same ``inputs`` (one line naming the first difference),
    then the plan for ``models`` from the smallest free memory of any rank."""
    import torch

    from ..errors import CkptError
    from .memory import budget
    from .dist_env import all_gather
    from .dist_plan import compare_fingerprints, fingerprint, plan_distributed
    problem = compare_fingerprints(all_gather(fingerprint(inputs)))
    if problem:
        sess.settle()
        raise CkptError(problem)
    avail = all_gather(budget(device, torch, memory_budget))
    plan, own = None, None
    try:
        plan = plan_distributed(models, dtype=dtype, world=sess.world,
                                available=None if any(a is None for a in avail) else min(avail), positions=ctx,
                                hidden_rows=ctx, forced=mode, one_at_a_time=one_at_a_time)
    except CkptError as e:
        own = e
    # The same inputs give every rank the same plan or the same refusal; the gather makes that so by
    # construction (rank 0's answer stands), and a rank that refuses is settled before it unwinds: its exit
    # code (2) follows from the refusal, never from how soon rank 0 leaves.
    problems = all_gather(None if own is None else str(own))
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        sess.settle()
        raise own if own is not None and str(own) == first else CkptError(first)
    return plan


# --------------------------------------------------------------------------- data-parallel


def _own_outputs(sess, job: dict, work: str):
    """This rank's chunks ``rank, rank + world, ...``: yields ``(chunk, [outputs per model])`` with
    every model loaded whole (the in-memory transformers path of :mod:`.corpus`)."""
    from pathlib import Path

    from .corpus import transformers_source
    from .loading import prepare
    n = len(job["sequences"])
    mine = list(range(sess.rank, n, sess.world))
    if not mine:
        return
    rows = job["rows"]
    dev = job["device"]
    sub = Path(work) / f"job{job['index']}-rank{sess.rank}"
    sub.mkdir(parents=True, exist_ok=True)
    warnings: list = []
    pms = [prepare(p, sub, role=r, dtype=job["dtype"]) for p, r in zip(job["paths"], job["roles"])]
    models = [transformers_source(pm, dtype=job["dtype"], device=dev, warnings=warnings) for pm in pms]
    # every chunk's scored rows: one source call per chunk keeps the rows per chunk exact
    runs = [src([job["sequences"][i] for i in mine], rows=slice(None)) for src in models]
    for j, outs in enumerate(zip(*runs)):
        i = mine[j]
        arrays = [o[1] if rows is None else o[1][rows[i]] for o in outs]
        yield i, arrays


def data_driver(sess, job: dict, work: str):
    own = _own_outputs(sess, job, work)
    k = len(job["paths"])
    for i in range(len(job["sequences"])):
        owner = i % sess.world
        if owner == 0:
            _, arrays = next(own)
        else:
            arrays = recv_arrays(sess, owner, k)
        yield (i, *arrays)


def data_worker(sess, job: dict, work: str) -> None:
    pending: list = []
    for n, (_, arrays) in enumerate(_own_outputs(sess, job, work), start=1):
        send_arrays(sess, 0, arrays, pending)
        sess.mark("chunks", f"{job['index']}:{n}")
    drain(pending)


# --------------------------------------------------------------------------- prompt mode, data-parallel


def prompts_worker(sess, job: dict, work: str) -> None:
    """A rank after 0: its prompts ``rank, rank + world, ...`` through both models loaded whole, run by the code
    the one-process schedule runs (:func:`.core._outputs`: the forward pass, then greedy generation with the
    reference's settings), each prompt's two outputs and two continuations sent to rank 0."""
    from pathlib import Path

    import torch

    from .core import _outputs
    from .kinds import KINDS
    from .loading import load_model, prepare
    mine = list(range(sess.rank, len(job["sequences"]), sess.world))
    if not mine:
        return
    sub = Path(work) / f"job{job['index']}-rank{sess.rank}"
    sub.mkdir(parents=True, exist_ok=True)
    models = [load_model(prepare(p, sub, role=r, dtype=job["dtype"]), dtype=job["dtype"], device=job["device"],
                         device_map=None, warnings=[]) for p, r in zip(job["paths"], job["roles"])]
    run = dict(kind=KINDS[job["kind"]], encodings=[job["sequences"][i] for i in mine], gen_config=job["gen_config"],
               device=job["device"], device_map=None, progress=False, seed=job["seed"], torch=torch)
    pending: list = []
    for n, ((r_out, r_cont), (c_out, c_cont)) in enumerate(zip(*(_outputs(m, r, **run) for m, r in
                                                                  zip(models, job["roles"]))), start=1):
        send_arrays(sess, 0, [r_out, c_out, _sent_ids(r_cont), _sent_ids(c_cont)], pending)
        sess.mark("chunks", f"{job['index']}:{n}")
    drain(pending)
