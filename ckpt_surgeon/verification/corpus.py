"""Fidelity mode: ``verify --corpus FILE`` scores a candidate against a reference over a corpus.

Flow: read the corpus (text, tokenized with the reference's tokenizer, or ids) -> cut it into
``ctx``-token chunks as ``llama-perplexity`` does (BOS replaces each chunk's first token when the
tokenizer adds one; chunks are independent sequences) -> get the reference's and the
candidate's logits at the scored positions, chunk by chunk -> accumulate the statistics
(:mod:`.fidelity`) -> judge the fidelity gates.

Where logits come from is a small protocol, so that a source can be swapped without touching the
rest: a *single* source is ``source(sequences, rows=slice) -> iterator of (seq_index, logits [n, V])``
and a *pair* source yields ``(seq_index, ref_logits [n, V], cand_logits [n, V])``.  The in-memory
transformers source, the llama.cpp source (``--runtime llama.cpp``) and a saved reference file
(``--reference``) all speak it; the layer-streamed sources of :mod:`.stream` (``stream_logits``,
``stream_pair``) have the same shape.

The scored positions: llama.cpp's ``ctx/2 … ctx−2`` (each predicting the next token; the first
half of the window is context only), or ``score="all"``: ``0 … ctx−2``.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import CkptError, ConfigError, SourceNotFoundError, UnsupportedError
from ..progress import steps
from .fidelity import LLAMACPP_MIN_TOKENS, FidelityAccumulator, FidelityStats
from .metrics import common_width
from .kv_types import (CACHE_TYPES, CacheTypes, cache_types, check_cache_fits, ggml_id, gguf_head_sizes,
                       use_flash_attn)
from .reference_file import (FORMATS as REFERENCE_FORMATS, LLAMACPP_KL_FLOOR, ReferenceReader, ReferenceWriter,
                             scored_rows)
from .options import CorpusOptions, GateLimits
from .thresholds import coarsest

SCORES = ("half", "all")
RUNTIMES = ("transformers", "llama.cpp")
KV_CACHES = CACHE_TYPES             # llama.cpp's cache type names (verification.kv_types)


# --- the corpus -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    """The corpus cut into chunks: ``tokens [chunks, ctx]`` as read (what a reference file
    stores) and the sequences actually fed (BOS replacing each chunk's first token)."""

    path: str
    sha256: str
    tokens: np.ndarray             # int64 [chunks, ctx]
    bos: int | None
    total_tokens: int              # the whole corpus, before cutting into whole chunks
    from_ids: bool

    @property
    def sequences(self) -> list[list[int]]:
        out = []
        for row in self.tokens:
            seq = [int(t) for t in row]
            if self.bos is not None:
                seq[0] = self.bos
            out.append(seq)
        return out


def read_corpus_ids(path: str | os.PathLike) -> list[int]:
    """``--corpus-ids FILE``: a JSON list of token ids (a list of lists is joined in order)."""
    from .prompts import load_token_ids
    return [t for ids in load_token_ids(path) for t in ids]


def cut(path: str, raw: bytes, ids: list[int], *, ctx: int, bos: int | None, from_ids: bool,
        chunks: int | None = None) -> Corpus:
    """Chunks as ``llama-perplexity`` makes them: ``len(ids) // ctx`` whole chunks, at most ``chunks`` of them
    (its ``--chunks N``: ``n_chunk = min(n_chunks, n_chunk_max)``, the first ones); fewer than ``2·ctx`` tokens
    is refused (its rule: one chunk would score ctx/2 tokens of a single window)."""
    if ctx < 4:
        raise CkptError(f"--ctx {ctx} is too small; a chunk needs at least 4 positions")
    if len(ids) < 2 * ctx:
        raise CkptError(f"corpus has {len(ids)} tokens; --ctx {ctx} needs at least {2 * ctx} (2 × ctx, as "
                        "llama-perplexity)", path=path, hint="use a longer corpus or a smaller --ctx")
    n = len(ids) // ctx if chunks is None else min(chunks, len(ids) // ctx)
    tokens = np.asarray(ids[:n * ctx], dtype=np.int64).reshape(n, ctx)
    return Corpus(path, hashlib.sha256(raw).hexdigest(), tokens, bos, len(ids), from_ids)


class Tokenizer:
    """The corpus tokenizer: a transformers tokenizer or llama.cpp's own (a GGUF run in llama.cpp)."""

    def __init__(self, *, hf=None, llama=None, name: str):
        self.hf, self.llama, self.name = hf, llama, name

    @property
    def bos(self) -> int | None:
        """The BOS id when this tokenizer adds one (llama.cpp's ``llama_vocab_get_add_bos``; for
        transformers: encoding with special tokens starts with ``bos_token_id`` where encoding
        without does not), else None."""
        if self.llama is not None:
            with_bos = self.llama.tokenize(b"a", add_bos=True, special=False)
            without = self.llama.tokenize(b"a", add_bos=False, special=False)
            return int(with_bos[0]) if len(with_bos) > len(without) else None
        b = getattr(self.hf, "bos_token_id", None)
        if b is None:
            return None
        with_sp = self.hf("a", add_special_tokens=True)["input_ids"]
        without = self.hf("a", add_special_tokens=False)["input_ids"]
        return int(b) if with_sp and with_sp[0] == b and (not without or without[0] != b) else None

    def encode(self, text: str) -> list[int]:
        """The corpus as llama.cpp's ``common_tokenize(ctx, text, add_special=true)``: BOS first when
        the tokenizer adds one, never EOS (llama-perplexity asserts the vocabulary adds none)."""
        bos = self.bos
        if self.llama is not None:
            ids = [int(t) for t in self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)]
        else:
            ids = list(self.hf(text, add_special_tokens=False)["input_ids"])
        return ([bos] if bos is not None else []) + ids

    def __len__(self) -> int:
        return int(self.llama.n_vocab()) if self.llama is not None else len(self.hf)


# --- logits sources ------------------------------------------------------------------------------

Single = Callable[..., Iterator[tuple[int, np.ndarray]]]


def transformers_source(pm, *, dtype: str, device: str, warnings: list) -> Single:
    """In-memory: the whole model loaded with transformers (:func:`.loading.load_model`)."""
    def run(sequences, *, rows: slice):
        import torch
        from .loading import load_model
        model = load_model(pm, dtype=dtype, device=device, device_map=None, warnings=warnings)
        try:
            for i, seq in enumerate(sequences):
                x = torch.tensor([seq], dtype=torch.long, device=device)
                out = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, rows]
                yield i, out.float().cpu().numpy()
        finally:
            del model
    return run


def llamacpp_source(llm) -> Single:
    """A GGUF run in llama.cpp (llama-cpp-python, ``logits_all=True``): each chunk evaluated from
    an empty KV cache, as llama-perplexity clears it per chunk."""
    def run(sequences, *, rows: slice):
        for i, seq in enumerate(sequences):
            llm.reset()
            llm.eval(seq)
            yield i, np.array(llm.scores[:len(seq)][rows], dtype=np.float32)
    return run


def open_llama(path: str, *, ctx: int, kv_cache: str | CacheTypes = "f16", flash_attn: bool = False,
               vocab_only: bool = False):
    """A llama-cpp-python ``Llama`` for ``path`` with the K and V cache types ``kv_cache`` (one
    name for both, or :class:`.kv_types.CacheTypes`) and flash attention as asked.
    llama-cpp-python prints llama.cpp's warnings and errors to ``sys.stderr`` even with
    ``verbose=False`` (its log callback passes ERROR level on); library code never prints, so they
    are captured and the last line names a failure."""
    import contextlib
    import io

    import llama_cpp

    from .llama_build import build_problem
    problem = build_problem()
    if problem:  # a crash (SIGILL / SIGSEGV) cannot be caught once the decode starts
        raise UnsupportedError(problem, path=path)
    from ..formats.quant.dequant import default_threads
    cache = kv_cache if isinstance(kv_cache, CacheTypes) else CacheTypes(kv_cache, kv_cache)
    kw = dict(model_path=path, verbose=False)
    if not vocab_only:
        # threads: the idle cores only; ggml's workers spin while they wait for each other, so a thread more than
        # the free cores costs a scheduler slice per op on a busy machine (issue 50 item 7)
        threads = default_threads()
        kw.update(logits_all=True, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=threads, n_threads_batch=threads,
                  type_k=ggml_id(cache.k), type_v=ggml_id(cache.v), flash_attn=bool(flash_attn))
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log):
            return llama_cpp.Llama(vocab_only=vocab_only, **kw)
    except (ValueError, RuntimeError) as e:
        last = (log.getvalue().strip().splitlines() or [str(e)])[-1].strip()
        what = "" if vocab_only else f" with a {cache.label} cache"
        raise ConfigError(f"llama.cpp cannot load this GGUF{what}: {last}", path=path) from None


def pair_in_memory(ref: Single, cand: Single, sequences, *, rows: slice):
    """Both sources advance together, chunk by chunk (both models in memory at once)."""
    for (i, r), (j, c) in zip(ref(sequences, rows=rows), cand(sequences, rows=rows)):
        yield i, r, c


# the report (gates, JSON contract, record) lives in .corpus_report; re-exported here
from .corpus_report import JSON_KEYS, CorpusReport, Gates, gates_for, given_gates  # noqa: E402,F401


# --- the run -------------------------------------------------------------------------------------

def verify_corpus(reference: str | os.PathLike | None, candidate: str | os.PathLike,
                  options: CorpusOptions | None = None, **kwargs) -> CorpusReport:
    """Score ``candidate`` against ``reference`` over a corpus; see the module docstring.

    ``corpus``: a UTF-8 text file, tokenized with the reference's tokenizer (or ``tokenizer``);
    ``corpus_ids``: token ids instead (JSON).  ``ctx``: tokens per chunk; ``score``: ``half``
    (llama.cpp's positions ctx/2 … ctx−2) or ``all``.  ``runtime="llama.cpp"``: every ``.gguf``
    side runs in llama.cpp (llama-cpp-python) with ``kv_cache`` (one of llama.cpp's cache types,
    :data:`.kv_types.CACHE_TYPES`, default f16, llama.cpp's own) for K and V; ``cache_type_k`` /
    ``cache_type_v`` set the candidate's K / V cache alone (they imply ``runtime="llama.cpp"`` and a
    ``.gguf`` candidate, which may be the reference file itself).  ``flash_attn``: auto (on when a
    V cache is quantized, as llama.cpp requires), on or off, for every llama.cpp side alike.  A
    quantized cache makes the run a fidelity run, judged by the quantized row's gates unless given.
    ``reference_file``: a saved reference (ours or
    llama.cpp's ``--kl-divergence-base`` file) replaces the reference run (``reference`` may then
    be None, or a model whose tokenizer encodes the corpus).  ``save_reference``: write the
    reference run to this file (``reference_format`` ckpt-surgeon | llama.cpp; ``replace``: an
    existing file may be replaced).  Gates: ``max_mean_kl``, ``max_p99_kl``, ``min_same_top``,
    ``max_ln_ppl_ratio`` (defaults: :func:`gates_for` on the ``thresholds`` row, default the
    coarsest of ``dtype`` and both storage precisions).  ``stream``: the transformers sides run
    layer by layer through :mod:`.stream` (``stream_pair`` / ``stream_logits``) instead of whole
    models in memory; None (default) = automatic: streamed when the models would not fit in free
    memory (or ``memory_budget`` bytes) together, as :func:`.memory.plan_memory` decides for
    ``verify``; False = never (a run that does not fit is then refused in one line).

    The options are one :class:`~.options.CorpusOptions` record (``options``), or these keyword
    arguments, each applied to the part of the record that has it.

    Returns a :class:`CorpusReport`; raises CkptError for bad input (nothing is written then).
    """
    o = CorpusOptions.build(options, **kwargs)
    ll = o.llama
    ref_cache, cand_cache = cache_types(ll.kv_cache, ll.cache_type_k, ll.cache_type_v)
    if ll.cache_type_k is not None or ll.cache_type_v is not None:
        o = replace(o, llama=replace(ll, runtime=needs_llama(ll.runtime, candidate, "--cache-type-k / --cache-type-v")))
    llama = LlamaRun(ref_cache, (cand_cache,), use_flash_attn(ll.flash_attn, (ref_cache, cand_cache)))
    out = run_corpus(reference, candidate, o, llama=llama, sweep=False)
    return _report(out, llama, o.placement.dtype, o.ctx, o.score)


@dataclass(frozen=True)
class LlamaRun:
    """How the llama.cpp sides of a run are set: the reference's cache, the candidate's (one per
    row of a cache sweep) and flash attention (every llama.cpp side alike)."""

    reference: CacheTypes
    candidates: tuple
    flash_attn: bool

    def quantized(self) -> bool:
        return self.reference.quantized or any(c.quantized for c in self.candidates)


@dataclass
class Outcome:
    """What :func:`run_corpus` measured: one :class:`FidelityStats` per candidate cache."""

    reference: str
    candidate: str
    stats: list
    corpus: Corpus
    gates: Gates
    reference_file: dict | None
    runtimes: tuple
    llama_sides: tuple         # roles ("reference", "candidate") that ran in llama.cpp
    device: str
    notes: list
    warnings: list
    environment: dict
    t0: float


def needs_llama(runtime: str, candidate, what: str) -> str:
    """Cache options run the candidate in llama.cpp: it must be a GGUF file."""
    if candidate is None or not os.fspath(candidate).endswith(".gguf"):
        raise CkptError(f"{what} set llama.cpp's cache; the candidate must be a .gguf file run in llama.cpp",
                        path=os.fspath(candidate) if candidate is not None else None,
                        hint="convert it first (ckpt-surgeon convert MODEL -o model.gguf)")
    return "llama.cpp"


def run_corpus(reference, candidate, o: CorpusOptions, *, llama: LlamaRun, sweep: bool) -> Outcome:
    """The run behind :func:`verify_corpus` and the cache sweep (:mod:`.cache_sweep`): checks,
    sides, corpus, then the candidate scored under each of ``llama.candidates`` (``sweep``: the
    reference runs once into a temporary file, each cache is scored against it)."""
    from ..runtime import resolve_device
    from .session import environment, scratch
    from .tokens import check_tokenizer_source

    from ..data import corpus_file
    t0 = time.perf_counter()
    o = replace(o, corpus=corpus_file(o.corpus))          # "builtin": the corpus shipped in ckpt_surgeon/data
    pl, saved = o.placement, o.saved
    check_tokenizer_source(o.tokenizer)
    _check_options(o, reference)
    o.gates.check()        # bad gate values fail before any model loads
    from .loading import check_inputs
    check_inputs((reference, None), (candidate, None))      # both models' headers, before either is prepared
    for given, caches in ((reference, (llama.reference,)), (candidate, llama.candidates)):
        if given is not None and o.llama.runtime == "llama.cpp" and os.fspath(given).endswith(".gguf"):
            _check_caches(os.fspath(given), caches)     # a cache that cannot act on the model: before any run
    dev = resolve_device(pl.device)
    notes: list[str] = []
    warnings: list[str] = []
    with scratch(pl.tmp_dir, "ckpt-surgeon-corpus-") as (work, torch):
        stream = _choose_stream(pl.stream, reference, candidate, o.llama.runtime, pl.dtype, dev, o.ctx,
                                pl.memory_budget, notes,
                                together=saved.reference_file is None and saved.save_reference is None and not sweep)
        sides = _Sides(reference, candidate, work, llama, runtime=o.llama.runtime, dtype=pl.dtype, ctx=o.ctx,
                       progress=pl.progress, notes=notes, stream=_streaming() if stream else None)
        try:
            stats, corp, gates, ref_file_info = _run(sides, o, llama, sweep, stream, dev, work, notes, warnings)
        finally:
            sides.close()
        env = environment(dev, torch)         # the threads the run had
    on_llama = tuple(s.role for s in sides.models() if s.runtime == "llama.cpp")
    if on_llama:
        import llama_cpp
        env["llama_cpp_python"] = llama_cpp.__version__
    return Outcome(os.fspath(reference if reference is not None else saved.reference_file), os.fspath(candidate),
                   stats, corp, gates, ref_file_info, (sides.ref.runtime if sides.ref is not None else "file",
                   sides.cand.runtime), on_llama, dev, notes, warnings, env, t0)


def _run(sides, o: CorpusOptions, llama: LlamaRun, sweep: bool, stream: bool, dev: str, work: Path, notes: list,
         warnings: list):
    """Tokenize, check, run both sides chunk by chunk, accumulate -> ([stats per candidate cache],
    corpus, gates, reference file info)."""
    saved, dtype, progress = o.saved, o.placement.dtype, o.placement.progress
    first, nrows = scored_rows(o.ctx, o.score)
    rows = slice(first, first + nrows)
    reader = ReferenceReader(saved.reference_file) if saved.reference_file is not None else None
    tok = _tokenizer(sides, o.tokenizer, reader, o.corpus_ids is not None)
    corp = _read_corpus(o.corpus, o.corpus_ids, tok, o.ctx, notes, o.chunks)
    _check_vocabularies(sides, tok, corp, notes)
    if reader is not None:
        _check_reference_file(reader.info, corp, o.ctx, o.score, tok)
    for s in sides.models():
        s.check_context(o.ctx)
    gates = _gates(sides, llama, o.gates, dtype, notes)
    live = reader is None and saved.save_reference is None and not sweep       # both sides run together
    _check_memory(sides, dtype, dev, together=live and not stream)
    seqs = corp.sequences
    ref_file_info = None
    bar = _bar(progress, len(seqs) * (len(llama.candidates) if sweep else 1))
    if live:
        pairs = _dist_pairs(sides, seqs, rows, dtype, dev, notes)    # None unless run by torchrun (dist_hook)
        if pairs is None and stream and sides.ref.runtime == sides.cand.runtime == "transformers":
            pairs = sides.ref.stream.stream_pair(sides.ref.given, sides.cand.given, seqs, rows=_row_lists(rows, seqs),
                                                 dtype=dtype, device=dev, progress=progress, tmp_dir=work)
        elif pairs is None:
            pairs = pair_in_memory(sides.ref.source(dev, warnings), sides.cand.source(dev, warnings), seqs,
                                   rows=rows)
        return [_score_pair(pairs, corp, rows, tok, notes, bar)], corp, gates, ref_file_info
    if reader is None:
        keep = saved.save_reference is not None
        dest = saved.save_reference if keep else work / "reference.safetensors"
        reader = _save_reference(sides.ref, dest, saved.reference_format if keep else "ckpt-surgeon", saved.replace,
                                 corp, o.score, seqs, rows, dev, warnings, progress)
        if keep:
            ref_file_info = {"path": os.fspath(saved.save_reference), "format": saved.reference_format, "saved": True}
        else:
            notes.append("the reference ran once, its float32 logits kept in a temporary file; each cache type "
                         "was scored against them")
    else:
        ref_file_info = {"path": reader.path, "format": reader.info.format, "saved": False}
        if reader.info.format == "llama.cpp":
            notes.append("reference read from llama.cpp's uint16 log-probs: each within 1.2e-4 nats of "
                         "llama.cpp's float32 value, entries below max − 16 not stored (KL floor ~1e-4)")
    stats = []
    for cache in (llama.candidates if sweep else llama.candidates[:1]):
        sides.cand.cache = cache
        stats.append(_score_against(reader, sides.cand, corp, rows, tok, dev, warnings, notes, bar))
    reader.close()
    bar.close()
    return stats, corp, gates, ref_file_info


def _dist_pairs(sides, seqs, rows, dtype, dev, notes):
    """Both models' logits fed by every rank of a distributed run (:mod:`.dist_hook`), else None."""
    from .dist_hook import pair_hook
    if sides.ref.runtime == sides.cand.runtime == "transformers":
        return pair_hook(sides.ref.given, sides.cand.given, seqs, rows=rows, dtype=dtype, device=dev, notes=notes)
    return None


def _score_pair(pairs, corp: Corpus, rows: slice, tok, notes: list, bar) -> FidelityStats:
    """Both sides live, chunk by chunk (``pairs``: ``(chunk, ref logits, cand logits)``)."""
    acc = FidelityAccumulator()
    first, nrows = rows.start, rows.stop - rows.start
    for i, r, c in pairs:
        r, c = common_width(r, c, tok, notes, what="vocabulary")
        acc.add(r, c, corp.tokens[i, first + 1:first + 1 + nrows], chunk=i, positions=np.arange(first, first + nrows))
        bar.update(1)
    bar.close()
    return acc.result()


def _score_against(reader, side, corp, rows: slice, tok, dev, warnings, notes, bar) -> FidelityStats:
    """The candidate side run over the corpus against a saved reference."""
    acc = FidelityAccumulator()
    first, nrows = rows.start, rows.stop - rows.start
    for i, c in side.source(dev, warnings)(corp.sequences, rows=rows):
        kind, r = reader.chunk(i)
        targets = corp.tokens[i, first + 1:first + 1 + nrows]
        pos = np.arange(first, first + nrows)
        r, c = common_width(r, c, tok, notes, what="vocabulary")
        if kind == "logprobs":
            acc.add_logprobs(r, c, targets, chunk=i, positions=pos, kl_floor=LLAMACPP_KL_FLOOR)
        else:
            acc.add(r, c, targets, chunk=i, positions=pos)
        bar.update(1)
    return acc.result()


def _gates(sides, llama: LlamaRun, given: GateLimits, dtype, notes) -> Gates:
    """Default gates from the coarsest precision in play (a quantized weight: the quantized row).  A
    quantized KV cache is a fidelity run, not an exactness run: only the gates given are judged (none
    given: measurement only), as a cache sweep judges its rows; --thresholds ROW asks for a row's defaults."""
    cache_q = llama.quantized() and any(s.runtime == "llama.cpp" for s in sides.models())
    thresholds = given.thresholds
    if cache_q:
        gates = gates_for(thresholds, **given.limits()) if thresholds else given_gates(given.limits())
        notes.append("quantized KV cache: a fidelity run, not an exactness run (the cache rounds K / V to a few "
                     "bits; no exact model can match it): " + (f"judged by the {thresholds} row's gates" if thresholds
                     else "only the gates given are judged, as --cache-sweep judges its rows" +
                     ("" if given_gates(given.limits()).overridden else " (none given: measurement only)")))
        return gates
    row = thresholds or coarsest(dtype, *sides.storage_dtypes())
    gates = gates_for(row, **given.limits())
    if row == "quantized":
        notes.append("quantized weights: default gates from the bfloat16 row; pass explicit gates "
                     "(--max-mean-kl, --max-p99-kl, --min-same-top, --max-ln-ppl-ratio) for a quantized candidate")
    return gates


def _report(out: Outcome, llama: LlamaRun, dtype: str, ctx: int, score: str) -> CorpusReport:
    stats = out.stats[0]
    notes = out.notes
    if stats.n < LLAMACPP_MIN_TOKENS:
        notes.append(f"only {stats.n} tokens scored: llama-perplexity prints no distribution statistics below "
                     f"{LLAMACPP_MIN_TOKENS}; these percentiles rest on few values")
    caches = {"reference": llama.reference, "candidate": llama.candidates[0]}
    for role, given in (("reference", out.reference), ("candidate", out.candidate)):
        if role in out.llama_sides:
            c = caches[role]
            notes.append(f"{given}: run in llama.cpp with a {c.label} KV cache" +
                         (" (llama.cpp's default; it rounds K and V to float16, which limits exactness: "
                          "--kv-cache f32 removes that floor)" if c == CacheTypes("f16", "f16") else "") +
                         (", flash attention on" if llama.flash_attn else ""))
    cache = None
    if out.llama_sides:
        cache = {r: (caches[r].to_dict() if r in out.llama_sides else None) for r in ("reference", "candidate")}
        cache.update(flash_attn=llama.flash_attn,
                     quantized=any(caches[r].quantized for r in out.llama_sides))
    failures = out.gates.judge(stats)
    return CorpusReport(
        reference=out.reference, candidate=out.candidate, runtimes=out.runtimes,
        kv_cache=llama.reference.k if out.llama_sides else None,
        device=out.device, dtype=dtype, corpus=out.corpus, ctx=ctx, score=score, stats=stats, gates=out.gates,
        passed=not failures, failures=failures, reference_file=out.reference_file, cache=cache,
        notes=tuple(dict.fromkeys(notes)), warnings=tuple(out.warnings),
        elapsed_s=time.perf_counter() - out.t0, environment=out.environment)


def _check_options(o: CorpusOptions, reference) -> None:
    """Everything checkable before a model or the corpus is opened (one line each)."""
    from .loading import TORCH_DTYPES
    saved = o.saved
    if (o.corpus is None) == (o.corpus_ids is None):
        raise CkptError("give --corpus FILE or --corpus-ids FILE (one of them)")
    if not isinstance(o.ctx, int) or o.ctx < 4:
        raise CkptError(f"--ctx must be an integer >= 4, got {o.ctx!r}")
    if o.chunks is not None and (not isinstance(o.chunks, int) or isinstance(o.chunks, bool) or o.chunks < 1):
        raise CkptError(f"--chunks must be an integer >= 1, got {o.chunks!r}")
    if o.score not in SCORES:
        raise CkptError(f"unknown --score {o.score!r}; choose half (llama.cpp's) or all")
    if o.llama.runtime not in RUNTIMES:
        raise CkptError(f"unknown runtime {o.llama.runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if o.placement.dtype not in TORCH_DTYPES:
        raise CkptError(f"unknown dtype {o.placement.dtype!r}; choose one of {', '.join(TORCH_DTYPES)}")
    if saved.reference_format not in REFERENCE_FORMATS:
        raise CkptError(f"unknown reference format {saved.reference_format!r}; choose one of "
                        f"{', '.join(REFERENCE_FORMATS)}")
    if reference is None and saved.reference_file is None:
        raise CkptError("give a REFERENCE model or a saved reference (--reference FILE)")
    if saved.reference_file is not None and saved.save_reference is not None:
        raise CkptError("--reference FILE skips the reference run; there is nothing to --save-reference")
    if saved.save_reference is not None:
        from ..conversion.output_path import check_output    # the same output rules as every --output
        dest = os.fspath(saved.save_reference)
        check_output(Path(dest), [os.fspath(x) for x in (reference, o.corpus, o.corpus_ids)
                                  if x and os.path.exists(os.fspath(x))], saved.replace)
        if os.path.isdir(dest):
            raise CkptError("--save-reference is a folder", path=dest)


def _check_caches(given: str, caches) -> None:
    from ..checkpoint import open_checkpoint
    with open_checkpoint(given) as ck:
        check_cache_fits(caches, gguf_head_sizes(ck.metadata, given), given)


class _Side:
    """One model of the pair: how it runs and where its logits come from."""

    def __init__(self, given: str, role: str, work: Path, *, runtime: str, dtype: str, ctx: int, cache: CacheTypes,
                 flash_attn: bool, progress, notes: list, stream=None):
        self.given, self.role, self.stream, self.work, self.progress = given, role, stream, work, progress
        self.pm = None
        self.llm = None
        self.runtime = "llama.cpp" if runtime == "llama.cpp" and given.endswith(".gguf") else "transformers"
        self.ctx, self.cache, self.flash_attn, self.dtype = ctx, cache, flash_attn, dtype
        if self.runtime == "llama.cpp":
            if not os.path.isfile(given):
                raise SourceNotFoundError("no such GGUF file", path=given)
            from ..checkpoint import open_checkpoint
            ck = open_checkpoint(given)       # the validated header parser first: one line for a bad file
            try:
                from .loading import storage_precision
                self.storage = storage_precision(i.dtype for i in ck.tensors.values())
            finally:
                ck.close()
            self.vocab = open_llama(given, ctx=ctx, vocab_only=True)
        elif stream is not None:       # headers only: a GGUF is streamed, never converted to a temp folder
            self.pm = stream.prepared(stream.open_source(given, role=role, progress=progress), work, role)
            self.storage = self.pm.storage_dtype
            if self.pm.kind.name != "causal-lm":
                raise ConfigError(f"corpus mode scores next-token predictions; this is a {self.pm.kind.name} "
                                  f"({self.pm.architecture})", path=given)
        else:
            from .loading import prepare
            self.pm = prepare(given, work, role=role, dtype=dtype, progress=progress)
            self.storage = self.pm.storage_dtype
            if self.pm.kind.name != "causal-lm":
                raise ConfigError(f"corpus mode scores next-token predictions; this is a {self.pm.kind.name} "
                                  f"({self.pm.architecture})", path=given)
            if self.pm.converted_from_gguf:
                notes.append(f"{given}: GGUF converted to a temporary HF folder ({dtype}) for transformers "
                             "(--runtime llama.cpp runs it in llama.cpp instead)")
        if self.pm is not None and self.pm.dequantized is not None:
            notes.append(f"{given}: {self.pm.dequantized.note()}")

    def check_context(self, ctx: int) -> None:
        if self.pm is None:
            return
        from .tokens import max_positions
        limit = max_positions(self.pm.config, None)
        if limit is not None and ctx > limit:
            raise CkptError(f"--ctx {ctx} exceeds the model's {limit} positions", path=self.given)

    def hf_tokenizer(self):
        from ..runtime import load_tokenizer
        if self.pm is not None and self.pm.has_tokenizer:
            return load_tokenizer(self.pm.folder, path=self.given)
        return None

    def source(self, dev: str, warnings: list) -> Single:
        from .dist_hook import active, single_hook      # a distributed run (verification/dist_run.py)
        if self.runtime == "transformers" and active() is not None:
            return lambda sequences, *, rows: single_hook(self.given, self.role, sequences, rows=rows,
                                                          dtype=self.dtype, device=dev)
        if self.runtime == "llama.cpp":
            if self.llm is not None:       # a cache sweep reopens the model with the next cache
                self.llm.close()
            self.llm = open_llama(self.given, ctx=self.ctx, kv_cache=self.cache, flash_attn=self.flash_attn)
            return llamacpp_source(self.llm)
        if self.stream is not None:
            def run(sequences, *, rows):
                return self.stream.stream_logits(self.given, sequences, rows=_row_lists(rows, sequences),
                                                 dtype=self.dtype, device=dev,
                                                 progress=self.progress, tmp_dir=self.work)
            return run
        return transformers_source(self.pm, dtype=self.dtype, device=dev, warnings=warnings)

    def close(self) -> None:
        for x in (self.llm, getattr(self, "vocab", None)):
            if x is not None:
                x.close()
        self.llm = self.vocab = None


class _Sides:
    def __init__(self, reference, candidate, work: Path, llama: LlamaRun, **kw):
        fa = llama.flash_attn
        self.ref = _Side(os.fspath(reference), "reference", work, cache=llama.reference, flash_attn=fa,
                         **kw) if reference is not None else None
        self.cand = _Side(os.fspath(candidate), "candidate", work, cache=llama.candidates[0], flash_attn=fa, **kw)

    def models(self):
        return [s for s in (self.ref, self.cand) if s is not None]

    def storage_dtypes(self):
        return [s.storage for s in self.models()]

    def close(self):
        for s in self.models():
            s.close()


def _check_memory(sides: _Sides, dtype: str, dev: str, *, together: bool) -> None:
    """Refuse in one line, before loading, a run whose transformers models would not fit in free
    memory (both at once in the in-memory pairing, else the larger one), with what it needs."""
    import torch

    from .memory import PARALLEL_EXTRA_BYTES, PARALLEL_HEADROOM, available_bytes, human_size
    need = [s.pm.estimated_bytes(dtype) for s in sides.models() if s.pm is not None and s.stream is None]
    if not need:
        return
    total = sum(need) if together else max(need)
    avail = available_bytes(dev, torch)
    if avail is not None and total * PARALLEL_HEADROOM + PARALLEL_EXTRA_BYTES > avail:
        what = "both models need" if together and len(need) == 2 else "the model needs"
        raise CkptError(f"{what} ~{human_size(total)} in {dtype}, {human_size(avail)} free on {dev}",
                        hint="--save-reference FILE runs one model at a time; a model larger than memory needs "
                             "layer streaming (--stream)" if together else
                             "a model larger than memory needs layer streaming (--stream)")


def _row_lists(rows: slice, sequences) -> list[np.ndarray]:
    """The scored positions as the streamed sources take them: one index array per sequence."""
    return [np.arange(len(seq))[rows] for seq in sequences]


def _choose_stream(stream, reference, candidate, runtime, dtype, dev, ctx, memory_budget, notes, *,
                   together: bool) -> bool:
    """Whether the transformers sides run layer-streamed: as asked, or (``stream=None``) when the
    memory plan of ``verify`` (:func:`.memory.plan_memory`, from the headers alone) says the models
    would not be held in memory as this run needs them (both at once, or one at a time when a
    saved reference stands in for one side)."""
    if stream is not None:
        return bool(stream)
    given = [os.fspath(x) for x in (reference, candidate) if x is not None]
    hf = [g for g in given if not (runtime == "llama.cpp" and g.endswith(".gguf"))]
    if not hf:
        return False
    import torch

    from .memory import budget, model_sizes, plan_memory
    sizes = [model_sizes(g, None) for g in hf]
    a, b = (sizes + sizes)[:2]
    plan = plan_memory(a, b, dtype=dtype, device=dev, device_map=None, sequential=not (together and len(hf) == 2),
                       stream=None, available=budget(dev, torch, memory_budget), positions=ctx)
    if plan.mode == "stream" or (together and len(hf) == 2 and plan.mode != "parallel"):
        if dtype not in _streaming().STREAM_DTYPES:
            return False      # the memory check that follows refuses the run in one line
        notes.append(f"layer-streamed (one decoder layer of each model at a time): {plan.why}")
        return True
    return False


def _streaming():
    """The layer-streamed logits sources (:mod:`.stream`), or one line saying this build lacks them."""
    try:
        from . import stream
    except ImportError:
        from ..errors import UnsupportedError
        raise UnsupportedError("layer-streamed verification (stream=True) is not in this build") from None
    return stream


def _tokenizer(sides: _Sides, tokenizer, reader, ids_given: bool) -> Tokenizer | None:
    """The reference's tokenizer (llama.cpp's own for a GGUF run in llama.cpp), or ``tokenizer``;
    with a saved reference and no reference model, the candidate's."""
    from ..runtime import load_tokenizer
    if tokenizer is not None:
        return Tokenizer(hf=load_tokenizer(tokenizer, path=os.fspath(tokenizer), local_files_only=False),
                         name=os.fspath(tokenizer))
    for s in ([sides.ref] if sides.ref is not None else []) + ([sides.cand] if reader is not None else []):
        if s.runtime == "llama.cpp":
            return Tokenizer(llama=s.vocab, name=f"{s.given} (llama.cpp)")
        hf = s.hf_tokenizer()
        if hf is not None:
            return Tokenizer(hf=hf, name=s.given)
    if ids_given:
        return None
    who = sides.ref.given if sides.ref is not None else sides.cand.given
    raise ConfigError("has no tokenizer files; corpus mode tokenizes the corpus with the reference's tokenizer",
                      path=who, hint="pass --tokenizer PATH_OR_ID or --corpus-ids FILE")


def _read_corpus(corpus, corpus_ids, tok: Tokenizer | None, ctx: int, notes: list, chunks: int | None = None
                 ) -> Corpus:
    corp = _read_whole(corpus, corpus_ids, tok, ctx, notes, chunks)
    if chunks is not None and corp.tokens.shape[0] < corp.total_tokens // ctx:
        notes.append(f"--chunks {chunks}: the first {corp.tokens.shape[0]} of {corp.total_tokens // ctx} chunks "
                     "scored (llama-perplexity's --chunks)")
    return corp


def _read_whole(corpus, corpus_ids, tok: Tokenizer | None, ctx: int, notes: list, chunks: int | None) -> Corpus:
    from ..analysis.prompts import read_text_file
    from ..formats.safe_input import read_regular
    if corpus_ids is not None:
        path = os.fspath(corpus_ids)
        ids = read_corpus_ids(path)
        raw = read_regular(Path(path), max_bytes=1 << 30, error=CkptError, what="corpus ids file")
        bos = tok.bos if tok is not None else None
        notes.append("corpus given as token ids" + (f"; BOS {bos} replaces each chunk's first token" if bos is not None
                                                      else "; no BOS replacement (no tokenizer that adds one)"))
        if tok is not None and ids and max(ids) >= len(tok):
            raise ConfigError(f"holds id {max(ids)}, beyond the tokenizer's {len(tok)} tokens", path=path)
        return cut(path, raw, ids, ctx=ctx, bos=bos, from_ids=True, chunks=chunks)
    path = os.fspath(corpus)
    text = read_text_file(Path(path), "corpus")
    ids = tok.encode(text)
    notes.append(f"corpus tokenized with {tok.name}")
    return cut(path, text.encode("utf-8"), ids, ctx=ctx, bos=tok.bos, from_ids=False, chunks=chunks)


def _check_vocabularies(sides: _Sides, tok: Tokenizer | None, corp: Corpus, notes: list) -> None:
    """Every model that brings its own tokenizer must encode the corpus to the same ids, and a
    GGUF run in llama.cpp must have the vocabulary of the tokenizer used."""
    if corp.from_ids:
        return
    text = Path(corp.path).read_text(encoding="utf-8")
    want = [int(t) for t in corp.tokens.reshape(-1)]
    for s in sides.models():
        if s.runtime == "llama.cpp":
            if tok is not None and tok.llama is s.vocab:
                continue
            n = int(s.vocab.n_vocab())
            if tok is not None and n < len(tok):
                # more is fine (padding rows up to the model's vocab_size); fewer cannot be the same vocabulary
                raise ConfigError(f"GGUF vocabulary has {n} tokens, the tokenizer used ({tok.name}) has {len(tok)}; "
                                  "the logits would not be comparable", path=s.given)
            other = Tokenizer(llama=s.vocab, name=s.given)
            what = "GGUF vocabulary"
        else:
            hf = s.hf_tokenizer()
            if hf is None or (tok is not None and tok.hf is not None and tok.name == s.given):
                if hf is None:
                    notes.append(f"{s.given} has no tokenizer files; the corpus is tokenized with {tok.name}")
                continue
            other = Tokenizer(hf=hf, name=s.given)
            what = "tokenizer"
        got = other.encode(text)[:len(want)]
        j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is None and len(got) < len(want):
            j = len(got)
        if j is not None:
            g = got[j] if j < len(got) else "end"
            raise ConfigError(f"{what} encodes the corpus differently from {tok.name} (token {j}: {s.role} id {g}, "
                              f"expected {want[j]}); the logits would not be comparable", path=s.given)


def _check_reference_file(info, corp: Corpus, ctx: int, score: str, tok) -> None:
    """A saved reference must come from the same ctx, convention, corpus and tokenizer."""
    p = info.path
    if info.ctx != ctx:
        raise ConfigError(f"saved reference was made with --ctx {info.ctx}; this run uses {ctx}", path=p)
    if info.score != score:
        raise ConfigError(f"saved reference scores {'positions ctx/2 … ctx−2' if info.score == 'half' else 'every position'}"
                          f"; this run asks for --score {score}", path=p)
    if info.corpus_sha256 is not None and info.corpus_sha256 != corp.sha256:
        raise ConfigError(f"saved reference was made from another corpus (sha256 {info.corpus_sha256[:12]}…, this "
                          f"corpus {corp.sha256[:12]}…)", path=p)
    if info.tokens.shape != corp.tokens.shape or not np.array_equal(info.tokens, corp.tokens):
        n = min(info.tokens.size, corp.tokens.size)
        a, b = info.tokens.reshape(-1)[:n], corp.tokens.reshape(-1)[:n]
        diff = np.flatnonzero(a != b)
        j = int(diff[0]) if diff.size else n
        where = f"token {j}: saved id {a[j] if j < n else 'end'}, here {b[j] if j < n else 'end'}" if j < n else \
            f"{info.tokens.shape[0]} chunks saved, {corp.tokens.shape[0]} here"
        what = "another tokenizer" if info.corpus_sha256 is not None else "another tokenizer or corpus"
        raise ConfigError(f"saved reference was made with {what}: its tokens differ ({where})", path=p)
    if tok is not None and info.n_vocab < len(tok):
        # wider is fine (padded embedding rows the tokenizer never produces); narrower is not
        raise ConfigError(f"saved reference has a vocabulary of {info.n_vocab}; the tokenizer used has {len(tok)}",
                          path=p)


def _save_reference(side: _Side, dest, fmt: str, replace: bool, corp: Corpus, score: str, seqs, rows, dev,
                    warnings, progress) -> ReferenceReader:
    """Run the reference alone into ``dest`` (published only when complete) and open it."""
    w = ReferenceWriter(dest, fmt=fmt, tokens=corp.tokens, score=score, bos=corp.bos, corpus_sha256=corp.sha256,
                        reference=side.given, runtime=side.runtime, replace=replace)
    try:
        for _, logits in steps(progress, side.source(dev, warnings)(seqs, rows=rows), total=len(seqs),
                               desc="reference chunks", unit="chunk"):
            w.write_chunk(logits)
        w.close()
    except BaseException:
        w.discard()
        raise
    return ReferenceReader(dest)


def _bar(progress, total: int):
    from ..progress import bar
    return bar(progress, total=total, desc="chunks", unit="chunk")
