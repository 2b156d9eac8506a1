"""``verify(reference, candidate)``: run both models on the same prompts and judge the difference.

Flow: validate both inputs (headers only) -> make them loadable (GGUF converted to a temp
folder) -> tokenize the prompts once with the reference's tokenizer (and prove the candidate's
tokenizer gives the same ids) -> run each model over every prompt (one forward pass for the
logits / hidden states, one greedy ``generate`` for causal LMs) -> compare per prompt
(:mod:`.metrics`) -> aggregate and judge against the thresholds (:mod:`.thresholds`).

Two schedules, same numbers (a test checks they agree): *parallel* keeps both models loaded and
compares prompt by prompt; *sequential* runs the reference alone, saves its per-prompt outputs
as float32 ``.npy`` files in a temp dir, frees it, then runs the candidate and compares against
the saved files.  Sequential is used when both models would not fit the device's free memory
at once, with ``device_map``, or when asked (``sequential=True``).  A third, *stream*
(:mod:`.stream`), runs both models one decoder layer at a time when one model does not fit
either (or when asked); :func:`.memory.plan_memory` makes the choice from the headers before anything is
loaded, and refuses in one line a run that would not fit even streamed.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CkptError, ConfigError, UnsupportedError
from ..runtime import quiet_transformers, resolve_device
from .loading import TORCH_DTYPES, PreparedModel, check_inputs, free_memory, load_model, prepare
from .memory import (MemoryPlan, ModelSizes, budget, check_memory_arguments, model_sizes, plan_memory,  # noqa: F401
                     positions_bound)
from .metrics import common_width, compare_outputs, first_difference
from .options import Criteria, VerifyOptions
from .prompts import default_prompts
from .report import PromptResult, VerifyReport, aggregate, judge
from .session import check_tmp_dir, environment, scratch
from .tokens import check_tokenizer_source, tokenize_pair
from .towers import compare_towers, tower_arrays, tower_failures, tower_targets

DEVICE_MAPS = ("auto",)


def verify(reference: str | os.PathLike, candidate: str | os.PathLike, options: VerifyOptions | None = None,
           **kwargs) -> VerifyReport:
    """Compare ``candidate`` with ``reference`` by running both with transformers: the twin of
    ``ckpt-surgeon verify`` in exactness mode (docs/verify.md; corpus mode is
    :func:`~ckpt_surgeon.verification.corpus.verify_corpus`).

    What to do is one :class:`~.options.VerifyOptions` record (``options``), or the keyword
    arguments below, each applied to the part of the record that has it (both may be given: the
    keywords then change the record).  An unknown keyword is a TypeError.

    ``prompts``: list of strings (default: :func:`~ckpt_surgeon.verification.prompts.default_prompts`).
    ``token_ids``: instead of prompts, the token ids to feed (a list of id lists; no tokenizer is
    needed, so this also suits models without one).  ``tokenizer``: tokenize the prompts with
    this (a folder, a ``tokenizer.json`` file or a Hub id ``AutoTokenizer`` takes) instead of the
    reference's own tokenizer files: weights-only checkpoints can be verified.  A model that
    ships a tokenizer encoding any prompt differently is an error either way.
    ``max_new_tokens`` (32): greedy tokens generated per prompt by causal LMs; ``seed`` (0).
    ``device``: ``auto`` (CUDA when available) | ``cpu`` | ``cuda``; ``device_map="auto"`` spreads
    each model over all GPUs and CPU RAM with accelerate (implies sequential).  ``dtype``: compute
    dtype of both models.  ``thresholds``: which dtype's default row to judge by (default: the
    coarsest of ``dtype`` and the two storage precisions); ``max_logit_diff`` (relative to the
    reference's logit scale), ``max_kl``, ``min_top1``, ``require_greedy`` override single
    criteria.  ``sequential``: None = automatic, True = force.  ``progress``: tqdm bars on
    stderr (None = only on a terminal).  ``tmp_dir``: an existing directory for the temporary
    files (GGUF inputs converted to HF folders, the reference's saved outputs in sequential
    mode); default: the system temp dir.  Everything there is removed at the end.
    ``revision``: the Hub revision (branch, tag or commit) of ``reference`` when it is a Hub id;
    ``candidate_revision``: the candidate's (two revisions of one repo can be compared).
    ``stream``: run both models layer by layer (:mod:`.stream`; memory: one layer, not a model;
    float32 / float64 only; no greedy generation; the per-layer divergence comes with the report
    as ``report.localize``).  None = automatic: chosen when one model would not fit the free
    memory, and when even that does not fit the run is refused (one line saying what it needs)
    rather than started.  ``memory_budget``: plan as if only this many bytes were free (default:
    the device's free memory).  ``max_memory``: with ``device_map="auto"``, accelerate's
    per-device limits (``{0: "20GiB", "cpu": "60GiB"}``), passed through.
    ``localize``: also find where the models diverge (:func:`.localize.localize`, a second pass
    with hooks on every decoder layer; a streamed run has measured every layer already) and
    return a :class:`~.localize.LocalizedVerify`; ``localize_threshold``: the relative
    |Δ hidden| that counts as diverged (default per dtype; it also re-judges a streamed run's
    per-layer divergence).

    Raises CkptError for bad input.

    Returns:
        :class:`~ckpt_surgeon.verification.report.VerifyReport` (``.passed`` is the verdict); with ``localize``
        a :class:`~ckpt_surgeon.verification.localize.LocalizedVerify`

    Example::

        import ckpt_surgeon
        r = ckpt_surgeon.verify("all-MiniLM-L6-v2", "minilm-folded", device="cpu")
        r.passed, r.failures, r.metrics.max_rel_diff, r.to_dict()["mode"]
    """
    opts = VerifyOptions.build(options, **kwargs)
    report = compare(reference, candidate, opts)
    from .localize import localized
    return localized(report, reference, candidate, opts)


@dataclass
class _Job:
    """One :func:`compare` run under way: the inputs, the options, what was checked from them, and
    the notes and warnings gathered."""

    reference: str | os.PathLike
    candidate: str | os.PathLike
    o: VerifyOptions
    dev: str
    prompts: list
    token_ids: list | None
    work: Path | None = None
    torch: object = None
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    tokenizer: object = None         # the tokenizer section's TokenizerCheck (.tokenizer_check)


def compare(reference: str | os.PathLike, candidate: str | os.PathLike, o: VerifyOptions) -> VerifyReport:
    """The prompts through both models, compared and judged: :func:`verify` without its
    ``localize`` pass."""
    t0 = time.perf_counter()
    feed, pl = o.feed, o.placement
    check_tokenizer_source(feed.tokenizer)          # before torch is even imported
    prompts, token_ids = _check_arguments(pl.dtype, pl.device, o.device_map, feed.max_new_tokens, feed.prompts,
                                          feed.token_ids)
    check_memory_arguments(pl.stream, pl.dtype, o.device_map, pl.memory_budget, o.max_memory)
    o.criteria.check()          # the threshold overrides now, not after minutes of conversion and loading
    check_inputs((reference, o.revision), (candidate, o.candidate_revision))    # both, before any work
    from .llama_prompts import choose, compare_llama
    runtime, why = choose(reference, candidate, o)      # a GGUF pair: llama.cpp, unless transformers is asked for
    if runtime == "llama.cpp":
        check_tmp_dir(pl.tmp_dir)
        from .tokenizer_check import section      # issue 48: each side's own tokenizer and chat template
        return compare_llama(reference, candidate, o, prompts, token_ids, t0, [],
                             tokenizer=section(reference, candidate, o))
    dev = resolve_device(pl.device)          # imports torch
    job = _Job(reference, candidate, o, dev, prompts, token_ids, t0=t0)
    job.notes += [why] if why else []
    with scratch(pl.tmp_dir, "ckpt-surgeon-verify-") as (job.work, job.torch):
        plan = plan_memory(model_sizes(reference, o.revision), model_sizes(candidate, o.candidate_revision),
                           dtype=pl.dtype, device=dev, device_map=o.device_map, sequential=o.sequential,
                           stream=pl.stream, available=budget(dev, job.torch, pl.memory_budget),
                           positions=positions_bound(prompts, token_ids))
        from .tokenizer_check import section      # issue 48: each side's own tokenizer and chat template
        job.tokenizer = section(reference, candidate, o)
        if plan.mode == "stream":
            return _verify_stream(job, plan)
        return _verify_loaded(job, plan)


def _verify_loaded(job: _Job, plan: MemoryPlan) -> VerifyReport:
    """Both models loaded whole, in parallel or one after the other (``plan``)."""
    o, notes, dtype = job.o, job.notes, job.o.placement.dtype
    ref, cand, kind = _prepare_pair(job)
    thr = _pick_thresholds(o.criteria, dtype, ref, cand, notes)
    max_new = o.feed.max_new_tokens
    tok, encodings = tokenize_pair(ref, cand, job.prompts, job.token_ids, o.feed.tokenizer, kind, max_new, notes,
                                   own_judged=_own_judged(job))
    gen_config = _generation_config(ref, tok, max_new) if kind.generates and max_new else None

    run = dict(kind=kind, encodings=encodings, gen_config=gen_config, device=job.dev, device_map=o.device_map,
               progress=o.placement.progress, seed=o.feed.seed, torch=job.torch)
    # a multimodal model's towers are run alone in both models (verification/towers.py)
    run["towers"] = tower_targets(ref.folder) if kind.name in ("multimodal", "seq2seq") else []
    run["notes"] = notes
    run["tower_out"] = {}
    load = dict(dtype=dtype, device=job.dev, device_map=o.device_map, warnings=job.warnings, max_memory=o.max_memory,
                progress=o.placement.progress)
    mode, pairs = _schedule(ref, cand, run, load, job.work, plan, notes)
    results = _compare_all(pairs, job.prompts, encodings, tok, kind, gen_config is not None, notes)
    del pairs     # the suspended generators hold the models
    free_memory(job.torch)
    towers = compare_towers(run["towers"], run["tower_out"].get("reference", {}),
                            run["tower_out"].get("candidate", {}), thr.max_logit_diff)
    return _report(job, ref, cand, kind, results, thr, mode=mode, max_new_tokens=max_new, towers=towers)


def _report(job: _Job, ref, cand, kind, results, thr, *, mode, max_new_tokens, localize=None,
            towers=()) -> VerifyReport:
    """Aggregate the per-prompt results, judge them and build the report."""
    metrics = aggregate(results, kind)
    failures = tuple(judge(metrics, thr, kind, results)) + tuple(tower_failures(towers)) + job.tokenizer.findings
    device_map = job.o.device_map if mode != "stream" else None
    return VerifyReport(
        reference=os.fspath(job.reference), candidate=os.fspath(job.candidate), kind=kind.name, output=kind.output,
        architectures=(ref.architecture, cand.architecture), storage_dtypes=(ref.storage_dtype, cand.storage_dtype),
        device=("device_map=auto" if device_map else job.dev), dtype=job.o.placement.dtype, mode=mode,
        max_new_tokens=max_new_tokens, thresholds=thr, metrics=metrics, prompts=tuple(results), passed=not failures,
        failures=failures, notes=tuple(dict.fromkeys(job.notes + list(job.tokenizer.notes))),
        warnings=tuple(job.warnings),
        elapsed_s=time.perf_counter() - job.t0, environment=environment(job.dev, job.torch), localize=localize,
        towers=tuple(towers), tokenizer=job.tokenizer)


def _own_judged(job: _Job) -> str | None:
    """Why the prompts need not encode the same with the candidate's own tokenizer to be run (the tokenizer
    section judges it, or was switched off), or None: they must."""
    from .tokenizer_check import own_judged
    return own_judged(job.o, job.tokenizer)


def _prepare_pair(job: _Job):
    """Both models made loadable (GGUF converted into ``job.work``): (ref, cand, their common kind)."""
    o, work, notes = job.o, job.work, job.notes
    dtype, progress = o.placement.dtype, o.placement.progress
    ref = prepare(job.reference, work, role="reference", dtype=dtype, progress=progress, revision=o.revision)
    cand = prepare(job.candidate, work, role="candidate", dtype=dtype, progress=progress,
                   revision=o.candidate_revision)
    kind = _comparable_kind(ref, cand)
    for pm in (ref, cand):
        if pm.converted_from_gguf:
            notes.append(f"{pm.given}: GGUF converted to a temporary HF folder ({dtype}) in {work.parent} "
                         "by ckpt_surgeon.conversion (removed at the end)")
        if pm.dequantized is not None:
            notes.append(f"{pm.given}: {pm.dequantized.note()} (run as the unquantized architecture from a "
                         f"temporary dense folder in {work.parent}, removed at the end)")
    return ref, cand, kind


def _pick_thresholds(criteria: Criteria, dtype: str, ref, cand, notes: list[str]):
    """The thresholds to judge by (:func:`.requantized.pick_thresholds`)."""
    from .requantized import pick_thresholds
    return pick_thresholds(criteria, dtype, ref, cand, notes)


def _schedule(ref, cand, run: dict, load: dict, work: Path, plan, notes: list[str]):
    """Start the planned parallel or sequential mode: (mode, the reference/candidate output pairs).  Under
    torchrun in data mode the prompts are dealt over the ranks (:func:`.dist_hook.prompts_hook`): this process runs
    its share as planned and the others' outputs come in between, in prompt order."""
    notes.append(f"{plan.mode}: {plan.why}")
    from .dist_hook import prompts_hook
    schedule = _run_parallel if plan.mode == "parallel" else _run_sequential
    spread = prompts_hook(ref.given, cand.given, run, load["dtype"], notes)
    if spread is None:
        return plan.mode, schedule(ref, cand, run, load, work)
    spread.start()          # the other ranks load and run their share meanwhile
    own = schedule(ref, cand, {**run, "encodings": [run["encodings"][i] for i in spread.mine]}, load, work)
    return plan.mode, spread.merge(own)


def _check_arguments(dtype, device, device_map, max_new_tokens, prompts, token_ids):
    """Everything checkable before a file is opened (torch not imported) -> (prompts, token_ids)."""
    from ..runtime import DEVICES
    if dtype not in TORCH_DTYPES:
        raise CkptError(f"unknown dtype {dtype!r}; choose one of {', '.join(TORCH_DTYPES)}")
    if device not in DEVICES:
        raise CkptError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device_map not in (None, *DEVICE_MAPS):
        raise CkptError(f"unknown device map {device_map!r}; only 'auto' is supported")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise CkptError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if token_ids is not None:
        if prompts is not None:
            raise CkptError("give prompts or token ids, not both")
        if not token_ids or not all(isinstance(ids, (list, tuple)) and ids and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids) for ids in token_ids):
            raise CkptError("token_ids must be a non-empty list of non-empty lists of non-negative integers")
        token_ids = [list(ids) for ids in token_ids]
        prompts = [json.dumps(ids) for ids in token_ids]    # what the report shows as the prompt
    prompts = default_prompts() if prompts is None else [p for p in prompts]
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise CkptError("prompts must be a non-empty list of non-empty strings")
    return prompts, token_ids


def _comparable_kind(ref: PreparedModel, cand: PreparedModel):
    if ref.kind != cand.kind:
        raise ConfigError(f"reference is a {ref.kind.name} ({ref.architecture}) but candidate is a "
                          f"{cand.kind.name} ({cand.architecture}); nothing comparable", path=cand.given)
    return ref.kind


def _run_parallel(ref: PreparedModel, cand: PreparedModel, run: dict, load: dict, work: Path):
    """Both models loaded; their outputs advance together, prompt by prompt (one progress bar
    for the pair) -> pairs ``((ref_out, ref_cont), (cand_out, cand_cont))``."""
    ref_model = load_model(ref, **load)
    cand_model = load_model(cand, **load)
    _tower_run(ref_model, "reference", run)
    _tower_run(cand_model, "candidate", run)
    tally = _tally(run, 2, "both models")       # one count for the pair, ticked by both
    return _closing(zip(_outputs(ref_model, "reference", tally=tally, **run),
                        _outputs(cand_model, "candidate", tally=tally, **run)), tally)


def _run_sequential(ref: PreparedModel, cand: PreparedModel, run: dict, load: dict, work: Path):
    """The reference alone first, its outputs saved as float32 ``.npy`` in ``work`` and the model
    freed; then the candidate, paired with the saved outputs (memory-mapped)."""
    saved = work / "reference-outputs"
    saved.mkdir()
    ref_model = load_model(ref, **load)
    ref_conts = []
    tally = _tally(run, 1, "reference")
    for i, (arr, cont) in enumerate(_outputs(ref_model, "reference", tally=tally, **run)):
        np.save(saved / f"{i}.npy", arr)
        ref_conts.append(cont)
    tally.close()
    _tower_run(ref_model, "reference", run)
    del ref_model
    free_memory(run["torch"])
    cand_model = load_model(cand, **load)
    _tower_run(cand_model, "candidate", run)
    tally = _tally(run, 1, "candidate")
    return _closing((((np.load(saved / f"{i}.npy", mmap_mode="r"), ref_conts[i]), out)
                     for i, out in enumerate(_outputs(cand_model, "candidate", tally=tally, **run))), tally)


def _tally(run: dict, models: int, desc: str):
    """The progress count of ``models`` model(s) over the prompts: one step per prompt's forward pass and one per
    greedy token (issue 50 item 7: a per-prompt bar sat at 0/8 for a minute)."""
    from ..progress import Tally
    per = 1 + (run["gen_config"].max_new_tokens if run["gen_config"] is not None else 0)
    return Tally(run["progress"], total=models * per * len(run["encodings"]), desc=f"{desc}: prompt tokens",
                 unit="tok")


def _closing(pairs, tally):
    """``pairs`` as they come, the tally closed once they are all out."""
    try:
        yield from pairs
    finally:
        tally.close()


def _tower_run(model, side: str, run: dict) -> None:
    """The outputs of each tower of ``run["towers"]`` run alone in ``model`` (kept in ``run["tower_out"]``)."""
    if run["towers"]:
        run["tower_out"][side] = tower_arrays(model, run["towers"], run["torch"])


# --- steps ------------------------------------------------------------------------------------

def _generation_config(ref: PreparedModel, tok, max_new_tokens: int):
    """Greedy decoding settings for *both* models, taken from the reference (stop tokens
    included), so a converter that dropped ``generation_config.json`` cannot make the
    candidate stop elsewhere.  Sampling settings of the checkpoint are ignored on purpose."""
    from transformers import GenerationConfig

    base = None
    if (Path(ref.folder) / "generation_config.json").is_file():
        try:
            with quiet_transformers():
                base = GenerationConfig.from_pretrained(ref.folder, local_files_only=True)
        except (OSError, ValueError):
            base = None
    eos = getattr(base, "eos_token_id", None) if base else None
    tok_eos = tok.eos_token_id if tok is not None else None
    eos = eos if eos is not None else ref.config.get("eos_token_id", tok_eos)
    pad = getattr(base, "pad_token_id", None) if base else None
    tok_pad = tok.pad_token_id if tok is not None else None
    pad = pad if pad is not None else (tok_pad if tok_pad is not None else eos)
    if isinstance(pad, list):
        pad = pad[0]
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos,
                            pad_token_id=pad, temperature=None, top_p=None, top_k=None)


def _verify_stream(job: _Job, plan: MemoryPlan) -> VerifyReport:
    """Both models layer by layer (:mod:`.stream`): the same per-prompt comparison and verdict, the
    per-layer divergence attached, no greedy generation."""
    from .stream import open_source

    o, progress = job.o, job.o.placement.progress
    ref_src = open_source(job.reference, role="reference", revision=o.revision, progress=progress)
    try:
        cand_src = open_source(job.candidate, role="candidate", revision=o.candidate_revision, progress=progress)
    except BaseException:
        ref_src.close()
        raise
    try:
        ref, cand, kind, thr, results, where = _stream_compare(job, plan, ref_src, cand_src)
    finally:
        ref_src.close()
        cand_src.close()
    free_memory(job.torch)
    return _report(job, ref, cand, kind, results, thr, mode="stream", max_new_tokens=0, localize=where)


def _stream_compare(job: _Job, plan: MemoryPlan, ref_src, cand_src):
    """The streamed pair compared prompt by prompt -> (ref, cand, kind, thresholds, results, per-layer
    divergence)."""
    from .stream import prepared, stream_pair

    dtype, notes, prompts = job.o.placement.dtype, job.notes, job.prompts
    ref = prepared(ref_src, job.work, "reference")
    cand = prepared(cand_src, job.work, "candidate")
    kind = _comparable_kind(ref, cand)
    if kind.name in ("multimodal", "seq2seq"):
        raise CkptError(f"a {'vision/audio-language' if kind.name == 'multimodal' else 'encoder-decoder'} model "
                        "is not run layer by layer: verify loads it whole (drop --stream, or give a memory "
                        "budget both models fit one at a time: --sequential)")
    for pm, src in ((ref, ref_src), (cand, cand_src)):
        if src.gguf:
            notes.append(f"{pm.given}: GGUF streamed tensor by tensor (dequantized in {dtype}, no temporary folder)")
        if src.dequantized is not None:
            notes.append(f"{pm.given}: {src.dequantized.note()} (streamed tensor by tensor as the unquantized "
                         "architecture)")
    thr = _pick_thresholds(job.o.criteria, dtype, ref, cand, notes)
    tok, encodings = tokenize_pair(ref, cand, prompts, job.token_ids, job.o.feed.tokenizer, kind, 0, notes,
                                   own_judged=_own_judged(job))
    notes.append(f"stream: {plan.why}")
    if kind.generates:
        notes.append("greedy continuations not compared: a layer-streamed run computes one forward pass; "
                     "generating needs the whole model for every new token")
    from .dist_hook import pair_hook      # a distributed run: every rank feeds these (verification/dist_run.py)
    pair = pair_hook(ref_src.given, cand_src.given, encodings, rows=None, dtype=dtype, device=job.dev, layers=True,
                     notes=notes) \
        or stream_pair(ref_src, cand_src, encodings, dtype=dtype, device=job.dev, progress=job.o.placement.progress,
                       tmp_dir=job.work)
    results = []
    for s, r_arr, c_arr in pair:
        r_arr, c_arr = common_width(r_arr, c_arr, tok, notes, distribution=kind.distribution)
        cmp = compare_outputs(r_arr, c_arr, distribution=kind.distribution)
        results.append(PromptResult(index=s, text=prompts[s], tokens=len(encodings[s]), comparison=cmp))
    job.warnings.extend(pair.warnings)
    return ref, cand, kind, thr, results, pair.localize()


def _seq2seq_inputs(model, x, seed: int, notes: list, memo: dict, torch) -> dict:
    """An encoder-decoder's inputs for decoder ids ``x``: the encoder's feed is chosen once per model
    (:func:`~ckpt_surgeon.arch.derive.feeds.encoder_feed`, kept in ``memo``) and said once in the notes."""
    if "feed" not in memo:
        from ..arch.derive.feeds import encoder_feed
        try:
            memo["feed"], desc = encoder_feed(model, x, seed)
        except ValueError as e:
            raise UnsupportedError(f"{type(model).__name__}: the encoder's input could not be built ({e}); verify "
                                   "compares this encoder-decoder only on inputs built from its config") from None
        note = f"encoder-decoder: the prompts' token ids are the decoder's input; the encoder reads {desc}"
        if note not in notes:
            notes.append(note)
    enc = memo["feed"] if memo["feed"] is not None else {"input_ids": x, "attention_mask": torch.ones_like(x)}
    return {**enc, "decoder_input_ids": x}


def _outputs(model, side: str, *, kind, encodings, gen_config, device, device_map, progress, seed, torch, towers=(),
             tower_out=None, notes=None, tally=None):
    """Yield ``(output [T, D] float32 numpy, greedy continuation ids)`` per prompt; ``tally`` (a
    :class:`~ckpt_surgeon.progress.Tally`) is ticked once per forward pass and once per greedy token."""
    notes = [] if notes is None else notes
    memo: dict = {}      # an encoder-decoder's encoder feed, chosen once for this model

    # No context managers in here: in parallel mode two of these generators are interleaved, and
    # a grad-mode or logging context entered in one would be restored out of order by the other.
    # verify() holds torch.no_grad() and the quiet logging around the whole run instead.
    in_dev = model.device if device_map else device
    for ids in encodings:
        torch.manual_seed(seed)   # nothing here samples; fixed so that any stray randomness repeats
        x = torch.tensor([ids], dtype=torch.long, device=in_dev)
        mask = torch.ones_like(x)
        inputs = _seq2seq_inputs(model, x, seed, notes, memo, torch) if kind.name == "seq2seq" else dict(input_ids=x, attention_mask=mask)
        out = getattr(model(**inputs), kind.output)[0]
        arr = out.float().cpu().numpy()
        if tally is not None:
            tally.tick()
        cont = ()
        if gen_config is not None:
            g = model.generate(input_ids=x, attention_mask=mask, generation_config=gen_config,
                               streamer=_TokenTicks(tally) if tally is not None else None)
            cont = tuple(int(t) for t in g[0, len(ids):].tolist())
            if tally is not None:
                tally.tick(gen_config.max_new_tokens - len(cont))     # stopped early: the rest at once
        yield arr, cont


class _TokenTicks:
    """A transformers generation streamer that ticks a tally per new token (its first ``put`` is the prompt)."""

    def __init__(self, tally):
        self.tally, self.prompt_seen = tally, False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.tally.tick(int(value.numel()))
        self.prompt_seen = True

    def end(self) -> None:
        pass


def _compare_all(pairs, prompts, encodings, tok, kind, generated: bool, notes) -> list[PromptResult]:
    results = []
    for i, ((r_arr, r_cont), (c_arr, c_cont)) in enumerate(pairs):
        r_arr, c_arr = common_width(r_arr, c_arr, tok, notes, distribution=kind.distribution)
        cmp = compare_outputs(r_arr, c_arr, distribution=kind.distribution)
        gen = {}
        if generated:
            gen = dict(reference_continuation=r_cont, candidate_continuation=c_cont,
                       reference_text=None if tok is None else tok.decode(list(r_cont)),
                       candidate_text=None if tok is None else tok.decode(list(c_cont)),
                       first_greedy_diff=first_difference(r_cont, c_cont), generated=True)
        results.append(PromptResult(index=i, text=prompts[i], tokens=len(encodings[i]), comparison=cmp, **gen))
    return results
