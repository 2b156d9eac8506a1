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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import CkptError, ConfigError, SourceNotFoundError
from .fidelity import LLAMACPP_MIN_TOKENS, FidelityAccumulator, FidelityStats
from .reference_file import (FORMATS as REFERENCE_FORMATS, LLAMACPP_KL_FLOOR, ReferenceReader, ReferenceWriter,
                             scored_rows)
from .thresholds import coarsest, thresholds_for

SCORES = ("half", "all")
RUNTIMES = ("transformers", "llama.cpp")
KV_CACHES = ("f16", "f32")
_GGML_TYPE = {"f32": 0, "f16": 1}      # ggml_type values llama.cpp's type_k / type_v take


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


def cut(path: str, raw: bytes, ids: list[int], *, ctx: int, bos: int | None, from_ids: bool) -> Corpus:
    """Chunks as ``llama-perplexity`` makes them: ``len(ids) // ctx`` whole chunks; fewer than
    ``2·ctx`` tokens is refused (its rule: one chunk would score ctx/2 tokens of a single window)."""
    if ctx < 4:
        raise CkptError(f"--ctx {ctx} is too small; a chunk needs at least 4 positions")
    if len(ids) < 2 * ctx:
        raise CkptError(f"corpus has {len(ids)} tokens; --ctx {ctx} needs at least {2 * ctx} (2 × ctx, as "
                        "llama-perplexity)", path=path, hint="use a longer corpus or a smaller --ctx")
    n = len(ids) // ctx
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


def open_llama(path: str, *, ctx: int, kv_cache: str, vocab_only: bool = False):
    """A llama-cpp-python ``Llama`` for ``path``.  llama-cpp-python prints llama.cpp's warnings and
    errors to ``sys.stderr`` even with ``verbose=False`` (its log callback passes ERROR level on);
    library code never prints, so they are captured and the last line names a failure."""
    import contextlib
    import io

    import llama_cpp
    kw = dict(model_path=path, verbose=False)
    if not vocab_only:
        kw.update(logits_all=True, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=os.cpu_count() or 1,
                  type_k=_GGML_TYPE[kv_cache], type_v=_GGML_TYPE[kv_cache])
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log):
            return llama_cpp.Llama(vocab_only=vocab_only, **kw)
    except (ValueError, RuntimeError) as e:
        last = (log.getvalue().strip().splitlines() or [str(e)])[-1].strip()
        raise ConfigError(f"llama.cpp cannot load this GGUF: {last}", path=path) from None


def pair_in_memory(ref: Single, cand: Single, sequences, *, rows: slice):
    """Both sources advance together, chunk by chunk (both models in memory at once)."""
    for (i, r), (j, c) in zip(ref(sequences, rows=rows), cand(sequences, rows=rows)):
        yield i, r, c


# --- the report ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gates:
    """Fidelity criteria; None = not judged (said in the report)."""

    dtype: str
    max_mean_kl: float | None
    max_p99_kl: float | None
    min_same_top: float | None
    max_ln_ppl_ratio: float | None
    overridden: tuple = ()

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "max_mean_kl": self.max_mean_kl, "max_p99_kl": self.max_p99_kl,
                "min_same_top": self.min_same_top, "max_ln_ppl_ratio": self.max_ln_ppl_ratio,
                "overridden": list(self.overridden)}

    def describe(self) -> str:
        parts = [f"mean KL <= {self.max_mean_kl:g}" if self.max_mean_kl is not None else "mean KL not gated",
                 f"p99 KL <= {self.max_p99_kl:g}" if self.max_p99_kl is not None else "p99 KL not gated",
                 f"same top >= {self.min_same_top:g}" if self.min_same_top is not None else "same top not gated",
                 f"ln(PPL(cand)/PPL(ref)) <= {self.max_ln_ppl_ratio:g}" if self.max_ln_ppl_ratio is not None
                 else "ln PPL ratio not gated (--max-ln-ppl-ratio)"]
        s = f"{self.dtype} defaults: " + ", ".join(parts)
        return s + (f" (overridden: {', '.join(self.overridden)})" if self.overridden else "")

    def judge(self, st: FidelityStats) -> tuple[str, ...]:
        """Failed criteria, one sentence each (NaN never passes)."""
        out = []
        if self.max_mean_kl is not None and not (st.kl_mean <= self.max_mean_kl):
            out.append(f"mean KL(ref‖cand) = {st.kl_mean:.3g} ± {st.kl_se:.2g} > {self.max_mean_kl:g}")
        if self.max_p99_kl is not None and not (st.kl["p99"] <= self.max_p99_kl):
            out.append(f"99th percentile KL = {st.kl['p99']:.3g} > {self.max_p99_kl:g}")
        if self.min_same_top is not None and not (st.same_top >= self.min_same_top):
            out.append(f"same top {st.same_top:.4g} ± {st.same_top_se:.2g} < {self.min_same_top:g}")
        if self.max_ln_ppl_ratio is not None and not (st.ln_ratio <= self.max_ln_ppl_ratio):
            out.append(f"ln(PPL(cand)/PPL(ref)) = {st.ln_ratio:.3g} ± {st.ln_ratio_se:.2g} > "
                       f"{self.max_ln_ppl_ratio:g} (the candidate is worse)")
        return tuple(out)


def gates_for(row: str, *, max_mean_kl=None, max_p99_kl=None, min_same_top=None, max_ln_ppl_ratio=None) -> Gates:
    """Defaults from the exactness row (:mod:`.thresholds`): mean and 99th-percentile KL held to the
    row's per-position ``max_kl``, same-top to its ``min_top1``; the ln PPL ratio is judged only
    when asked (one-sided: a candidate better than the reference never fails it)."""
    for name, v in (("max_mean_kl", max_mean_kl), ("max_p99_kl", max_p99_kl), ("max_ln_ppl_ratio", max_ln_ppl_ratio)):
        if v is not None and not (v >= 0 or name == "max_ln_ppl_ratio"):
            raise CkptError(f"{name.replace('_', '-')} must be >= 0, got {v!r}")
    if min_same_top is not None and not (0 <= min_same_top <= 1):
        raise CkptError(f"min-same-top must be within [0, 1], got {min_same_top!r}")
    t = thresholds_for(row)
    given = {"max_mean_kl": max_mean_kl, "max_p99_kl": max_p99_kl, "min_same_top": min_same_top,
             "max_ln_ppl_ratio": max_ln_ppl_ratio}
    return Gates(row, t.max_kl if max_mean_kl is None else max_mean_kl,
                 t.max_kl if max_p99_kl is None else max_p99_kl,
                 t.min_top1 if min_same_top is None else min_same_top, max_ln_ppl_ratio,
                 tuple(k for k, v in given.items() if v is not None))


# The JSON contract of fidelity mode (keys only ever added; "a.b" = key b inside a).
JSON_KEYS: dict[str, str] = {
    "reference": "REFERENCE as given (or the reference file when --reference replaced the run)",
    "candidate": "CANDIDATE as given",
    "mode": "corpus",
    "runtimes.reference": "transformers | llama.cpp | file (a saved reference)",
    "runtimes.candidate": "transformers | llama.cpp",
    "kv_cache": "llama.cpp's KV cache type (f16 | f32) when a side ran in llama.cpp, else null",
    "device": "cpu | cuda",
    "dtype": "compute dtype of the transformers side(s)",
    "passed": "the verdict",
    "failures": "one sentence per failed gate",
    "gates.dtype": "the exactness row the defaults came from",
    "gates.max_mean_kl": "bound on corpus.kl.mean",
    "gates.max_p99_kl": "bound on corpus.kl.p99",
    "gates.min_same_top": "lower bound on corpus.same_top.p",
    "gates.max_ln_ppl_ratio": "bound on corpus.ppl.ln_ratio.mean, one-sided (null: not judged)",
    "gates.overridden": "the gates set explicitly",
    "corpus.tokens": "corpus length in tokens (before cutting into whole chunks)",
    "corpus.chunks": "chunks of ctx tokens scored",
    "corpus.ctx": "tokens per chunk",
    "corpus.scored": "tokens scored, all chunks together",
    "corpus.convention": "llama.cpp (positions ctx/2 … ctx−2) | all (positions 0 … ctx−2)",
    "corpus.source": "the corpus file",
    "corpus.sha256": "sha256 of the corpus file's bytes",
    "corpus.bos": "the BOS id that replaced each chunk's first token, or null",
    "corpus.reference_file": "{path, format, saved} of the reference file read or written, or null",
    "corpus.ppl.ref": "PPL of the reference, exp(mean NLL)",
    "corpus.ppl.cand": "PPL of the candidate",
    "corpus.ppl.ratio": "PPL(cand)/PPL(ref)",
    "corpus.ppl.cor": "correlation of the per-token NLLs (null when an SE is 0)",
    "corpus.ppl.ln_ratio.mean": "mean ln(PPL(cand)/PPL(ref))",
    "corpus.ppl.ln_ratio.se": "its paired SE, sqrt(SE_c² + SE_r² − 2 cov)",
    "corpus.ppl.ref_se": "SE of PPL(ref), PPL·SE(NLL)",
    "corpus.ppl.cand_se": "SE of PPL(cand)",
    "corpus.ppl.ratio_se": "SE of the ratio",
    "corpus.ppl.diff": "PPL(cand) − PPL(ref)",
    "corpus.ppl.diff_se": "its SE",
    "corpus.kl": "KL(ref‖cand) per token, nats: mean, se, max, p99_9 … p0_1, median, min, max_at {chunk, position}",
    "corpus.dp": "Δp = p_cand − p_ref of the next token: mean, se, rms, rms_se, max, p99_9 … p0_1 (p75, p25 too), min",
    "corpus.same_top": "{p, se}: fraction of tokens whose arg-max agrees, binomial SE",
    "notes": "how the run was done",
    "warnings": "loading findings",
    "elapsed_s": "wall time",
    "environment": "torch / transformers / llama-cpp-python versions, threads",
}


@dataclass(frozen=True)
class CorpusReport:
    """What ``verify_corpus`` found.  ``passed`` is the verdict."""

    reference: str
    candidate: str
    runtimes: tuple            # (reference, candidate)
    kv_cache: str | None
    device: str
    dtype: str
    corpus: Corpus
    ctx: int
    score: str
    stats: FidelityStats
    gates: Gates
    passed: bool
    failures: tuple = ()
    reference_file: dict | None = None
    notes: tuple = ()
    warnings: tuple = ()
    elapsed_s: float = 0.0
    environment: dict = field(default_factory=dict)

    @property
    def convention(self) -> str:
        return "llama.cpp" if self.score == "half" else "all"

    def to_dict(self) -> dict:
        c = {"tokens": self.corpus.total_tokens, "chunks": int(self.corpus.tokens.shape[0]), "ctx": self.ctx,
             "scored": self.stats.n, "convention": self.convention}
        c.update(self.stats.to_dict())
        c.update({"source": self.corpus.path, "sha256": self.corpus.sha256, "bos": self.corpus.bos,
                  "reference_file": self.reference_file})
        return {"reference": self.reference, "candidate": self.candidate, "mode": "corpus",
                "runtimes": {"reference": self.runtimes[0], "candidate": self.runtimes[1]},
                "kv_cache": self.kv_cache, "device": self.device, "dtype": self.dtype,
                "passed": self.passed, "failures": list(self.failures), "gates": self.gates.to_dict(),
                "corpus": c, "notes": list(self.notes), "warnings": list(self.warnings),
                "elapsed_s": round(self.elapsed_s, 3), "environment": dict(self.environment)}

    def rows(self) -> list[dict]:
        """One row per statistic, llama.cpp's three blocks in its order and wording."""
        return [{"block": title, "statistic": label, "value": value}
                for title, items in self.stats.blocks() for label, value in items]

    def summary_items(self) -> list[tuple[str, str]]:
        st = self.stats
        items = [("reference", f"{self.reference} ({self.runtimes[0]})"),
                 ("candidate", f"{self.candidate} ({self.runtimes[1]})"),
                 ("corpus", f"{self.corpus.path}: {self.corpus.total_tokens} tokens, {self.corpus.tokens.shape[0]} "
                            f"chunks of {self.ctx}, {st.n} scored ({'positions ctx/2 … ctx−2, llama.cpp' if self.score == 'half' else 'every position'})"),
                 ("run", f"{self.device}, {self.dtype}" + (f", llama.cpp KV cache {self.kv_cache}" if self.kv_cache else ""))]
        if self.reference_file:
            rf = self.reference_file
            items.append(("reference file", f"{rf['path']} ({rf['format']}, {'written' if rf['saved'] else 'read'})"))
        items += [("mean KL(ref‖cand)", f"{st.kl_mean:.6g} ± {st.kl_se:.2g}  (99%: {st.kl['p99']:.4g}, max "
                                        f"{st.kl['max']:.4g} at chunk {st.kl_max_at[0]} position {st.kl_max_at[1]})"),
                  ("same top", f"{100 * st.same_top:.3f} ± {100 * st.same_top_se:.3f} %"),
                  ("PPL cand / ref", f"{st.ppl_cand:.6g} / {st.ppl_ref:.6g}, ln ratio {st.ln_ratio:.4g} ± {st.ln_ratio_se:.2g}"),
                  ("gates", self.gates.describe()),
                  ("verdict", "PASS" if self.passed else "FAIL: " + "; ".join(self.failures))]
        return items


# --- the run -------------------------------------------------------------------------------------

def verify_corpus(reference: str | os.PathLike | None, candidate: str | os.PathLike, *,
                  corpus: str | os.PathLike | None = None, corpus_ids: str | os.PathLike | None = None,
                  ctx: int = 512, score: str = "half", tokenizer: str | os.PathLike | None = None,
                  device: str = "auto", dtype: str = "float32", runtime: str = "transformers", kv_cache: str = "f16",
                  reference_file: str | os.PathLike | None = None, save_reference: str | os.PathLike | None = None,
                  reference_format: str = "ckpt-surgeon", replace: bool = False, thresholds: str | None = None,
                  max_mean_kl: float | None = None, max_p99_kl: float | None = None, min_same_top: float | None = None,
                  max_ln_ppl_ratio: float | None = None, progress: bool | None = False,
                  tmp_dir: str | os.PathLike | None = None, stream: bool | None = None,
                  memory_budget: int | None = None) -> CorpusReport:
    """Score ``candidate`` against ``reference`` over a corpus; see the module docstring.

    ``corpus``: a UTF-8 text file, tokenized with the reference's tokenizer (or ``tokenizer``);
    ``corpus_ids``: token ids instead (JSON).  ``ctx``: tokens per chunk; ``score``: ``half``
    (llama.cpp's positions ctx/2 … ctx−2) or ``all``.  ``runtime="llama.cpp"``: every ``.gguf``
    side runs in llama.cpp (llama-cpp-python) with a ``kv_cache`` of f16 (llama.cpp's default) or
    f32; other sides run in transformers.  ``reference_file``: a saved reference (ours or
    llama.cpp's ``--kl-divergence-base`` file) replaces the reference run (``reference`` may then
    be None, or a model whose tokenizer encodes the corpus).  ``save_reference``: write the
    reference run to this file (``reference_format`` ckpt-surgeon | llama.cpp; ``replace``: an
    existing file may be replaced).  Gates: ``max_mean_kl``, ``max_p99_kl``, ``min_same_top``,
    ``max_ln_ppl_ratio`` (defaults: :func:`gates_for` on the ``thresholds`` row, default the
    coarsest of ``dtype`` and both storage precisions).  ``stream``: the transformers sides run
    layer by layer through :mod:`.stream` (``stream_pair`` / ``stream_logits``) instead of whole
    models in memory; None (default) = automatic: streamed when the models would not fit in free
    memory (or ``memory_budget`` bytes) together, as :func:`.core.plan_memory` decides for
    ``verify``; False = never (a run that does not fit is then refused in one line).

    Returns a :class:`CorpusReport`; raises CkptError for bad input (nothing is written then).
    """
    import torch

    from ..runtime import quiet_transformers, resolve_device
    from .core import _ieee_float32
    from .loading import TORCH_DTYPES

    t0 = time.perf_counter()
    _check_options(corpus, corpus_ids, ctx, score, runtime, kv_cache, reference, reference_file, save_reference,
                   reference_format, dtype, TORCH_DTYPES, replace)
    gates_for("float32", max_mean_kl=max_mean_kl, max_p99_kl=max_p99_kl, min_same_top=min_same_top,
              max_ln_ppl_ratio=max_ln_ppl_ratio)        # bad gate values fail before any model loads
    dev = resolve_device(device)
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise SourceNotFoundError("--tmp-dir is not an existing directory", path=str(tmp_dir))
    notes: list[str] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-corpus-", dir=tmp_dir) as work_s, \
            torch.no_grad(), quiet_transformers(), _ieee_float32(torch):
        work = Path(work_s)
        stream = _choose_stream(stream, reference, candidate, runtime, dtype, dev, ctx, memory_budget, notes,
                                together=reference_file is None and save_reference is None)
        sides = _Sides(reference, candidate, work, runtime=runtime, dtype=dtype, ctx=ctx, kv_cache=kv_cache,
                       progress=progress, notes=notes, stream=_streaming() if stream else None)
        try:
            stats, corp, gates, ref_file_info = _run(sides, reference_file, tokenizer, corpus, corpus_ids, ctx, score,
                                                     dtype, dev, thresholds, dict(max_mean_kl=max_mean_kl,
                                                     max_p99_kl=max_p99_kl, min_same_top=min_same_top,
                                                     max_ln_ppl_ratio=max_ln_ppl_ratio), stream, save_reference,
                                                     reference_format, replace, progress, work, notes, warnings)
        finally:
            sides.close()
    return _report(reference, candidate, reference_file, sides, kv_cache, dev, dtype, corp, ctx, score, stats, gates,
                   ref_file_info, notes, warnings, t0, runtime, torch)


def _run(sides, reference_file, tokenizer, corpus, corpus_ids, ctx, score, dtype, dev, thresholds, gate_args, stream,
         save_reference, reference_format, replace, progress, work, notes, warnings):
    """Tokenize, check, run both sides chunk by chunk, accumulate -> (stats, corpus, gates, reference file info)."""
    first, nrows = scored_rows(ctx, score)
    rows = slice(first, first + nrows)
    reader = ReferenceReader(reference_file) if reference_file is not None else None
    tok = _tokenizer(sides, tokenizer, reader, corpus_ids is not None)
    corp = _read_corpus(corpus, corpus_ids, tok, ctx, notes)
    _check_vocabularies(sides, tok, corp, notes)
    if reader is not None:
        _check_reference_file(reader.info, corp, ctx, score, tok)
    for s in sides.models():
        s.check_context(ctx)
    row = thresholds or coarsest(dtype, *sides.storage_dtypes())
    gates = gates_for(row, **gate_args)
    if row == "quantized":
        notes.append("quantized weights: default gates from the bfloat16 row; pass explicit gates "
                     "(--max-mean-kl, --max-p99-kl, --min-same-top, --max-ln-ppl-ratio) for a quantized candidate")
    _check_memory(sides, dtype, dev, together=reader is None and save_reference is None and not stream)
    acc = FidelityAccumulator()
    seqs = corp.sequences
    ref_file_info = None
    bar = _bar(progress, len(seqs))
    if reader is None and save_reference is None:
        if stream and sides.ref.runtime == sides.cand.runtime == "transformers":
            pairs = sides.ref.stream.stream_pair(sides.ref.given, sides.cand.given, seqs, rows=_row_lists(rows, seqs),
                                                 dtype=dtype, device=dev, progress=progress, tmp_dir=work)
        else:
            pairs = pair_in_memory(sides.ref.source(dev, warnings), sides.cand.source(dev, warnings), seqs,
                                   rows=rows)
        for i, r, c in pairs:
            r, c = _common_width(r, c, tok, notes)
            acc.add(r, c, corp.tokens[i, first + 1:first + 1 + nrows], chunk=i,
                    positions=np.arange(first, first + nrows))
            bar.update(1)
    else:
        if reader is None:
            reader = _save_reference(sides.ref, save_reference, reference_format, replace, corp, score, seqs,
                                     rows, dev, warnings, progress)
            ref_file_info = {"path": os.fspath(save_reference), "format": reference_format, "saved": True}
        else:
            ref_file_info = {"path": reader.path, "format": reader.info.format, "saved": False}
            if reader.info.format == "llama.cpp":
                notes.append("reference read from llama.cpp's uint16 log-probs: each within 1.2e-4 nats of "
                             "llama.cpp's float32 value, entries below max − 16 not stored (KL floor ~1e-4)")
        for i, c in sides.cand.source(dev, warnings)(seqs, rows=rows):
            kind, r = reader.chunk(i)
            targets = corp.tokens[i, first + 1:first + 1 + nrows]
            pos = np.arange(first, first + nrows)
            r, c = _common_width(r, c, tok, notes)
            if kind == "logprobs":
                acc.add_logprobs(r, c, targets, chunk=i, positions=pos, kl_floor=LLAMACPP_KL_FLOOR)
            else:
                acc.add(r, c, targets, chunk=i, positions=pos)
            bar.update(1)
        reader.close()
    bar.close()
    return acc.result(), corp, gates, ref_file_info


def _report(reference, candidate, reference_file, sides, kv_cache, dev, dtype, corp, ctx, score, stats, gates,
            ref_file_info, notes, warnings, t0, runtime, torch) -> CorpusReport:
    from .core import _environment
    if stats.n < LLAMACPP_MIN_TOKENS:
        notes.append(f"only {stats.n} tokens scored: llama-perplexity prints no distribution statistics below "
                     f"{LLAMACPP_MIN_TOKENS}; these percentiles rest on few values")
    for s in (sides.ref, sides.cand):
        if s is not None and s.runtime == "llama.cpp":
            notes.append(f"{s.given}: run in llama.cpp with a {kv_cache} KV cache" +
                         (" (llama.cpp's default; it rounds K and V to float16, which limits exactness: "
                          "--kv-cache f32 removes that floor)" if kv_cache == "f16" else ""))
    failures = gates.judge(stats)
    env = _environment(dev, torch)
    if runtime == "llama.cpp":
        import llama_cpp
        env["llama_cpp_python"] = llama_cpp.__version__
    return CorpusReport(
        reference=os.fspath(reference if reference is not None else reference_file), candidate=os.fspath(candidate),
        runtimes=(sides.ref.runtime if sides.ref is not None else "file", sides.cand.runtime),
        kv_cache=kv_cache if any(s is not None and s.runtime == "llama.cpp" for s in (sides.ref, sides.cand)) else None,
        device=dev, dtype=dtype, corpus=corp, ctx=ctx, score=score, stats=stats, gates=gates, passed=not failures,
        failures=failures, reference_file=ref_file_info, notes=tuple(dict.fromkeys(notes)), warnings=tuple(warnings),
        elapsed_s=time.perf_counter() - t0, environment=env)


def _check_options(corpus, corpus_ids, ctx, score, runtime, kv_cache, reference, reference_file, save_reference,
                   reference_format, dtype, dtypes, replace) -> None:
    if (corpus is None) == (corpus_ids is None):
        raise CkptError("give --corpus FILE or --corpus-ids FILE (one of them)")
    if not isinstance(ctx, int) or ctx < 4:
        raise CkptError(f"--ctx must be an integer >= 4, got {ctx!r}")
    if score not in SCORES:
        raise CkptError(f"unknown --score {score!r}; choose half (llama.cpp's) or all")
    if runtime not in RUNTIMES:
        raise CkptError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if kv_cache not in KV_CACHES:
        raise CkptError(f"unknown --kv-cache {kv_cache!r}; choose f16 or f32")
    if dtype not in dtypes:
        raise CkptError(f"unknown dtype {dtype!r}; choose one of {', '.join(dtypes)}")
    if reference_format not in REFERENCE_FORMATS:
        raise CkptError(f"unknown reference format {reference_format!r}; choose one of {', '.join(REFERENCE_FORMATS)}")
    if reference is None and reference_file is None:
        raise CkptError("give a REFERENCE model or a saved reference (--reference FILE)")
    if reference_file is not None and save_reference is not None:
        raise CkptError("--reference FILE skips the reference run; there is nothing to --save-reference")
    if save_reference is not None:
        from ..conversion.output_path import check_output    # the same output rules as every --output
        check_output(Path(os.fspath(save_reference)),
                     [os.fspath(x) for x in (reference, corpus, corpus_ids) if x and os.path.exists(os.fspath(x))],
                     replace)
        if os.path.isdir(os.fspath(save_reference)):
            raise CkptError("--save-reference is a folder", path=os.fspath(save_reference))


class _Side:
    """One model of the pair: how it runs and where its logits come from."""

    def __init__(self, given: str, role: str, work: Path, *, runtime: str, dtype: str, ctx: int, kv_cache: str,
                 progress, notes: list, stream=None):
        self.given, self.role, self.stream, self.work, self.progress = given, role, stream, work, progress
        self.pm = None
        self.llm = None
        self.runtime = "llama.cpp" if runtime == "llama.cpp" and given.endswith(".gguf") else "transformers"
        self.ctx, self.kv_cache, self.dtype = ctx, kv_cache, dtype
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
            self.vocab = open_llama(given, ctx=ctx, kv_cache=kv_cache, vocab_only=True)
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
        from .tokens import _max_positions
        limit = _max_positions(self.pm.config, None)
        if limit is not None and ctx > limit:
            raise CkptError(f"--ctx {ctx} exceeds the model's {limit} positions", path=self.given)

    def hf_tokenizer(self):
        from ..runtime import load_tokenizer
        if self.pm is not None and self.pm.has_tokenizer:
            return load_tokenizer(self.pm.folder, path=self.given)
        return None

    def source(self, dev: str, warnings: list) -> Single:
        if self.runtime == "llama.cpp":
            self.llm = open_llama(self.given, ctx=self.ctx, kv_cache=self.kv_cache)
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
    def __init__(self, reference, candidate, work: Path, **kw):
        self.ref = _Side(os.fspath(reference), "reference", work, **kw) if reference is not None else None
        self.cand = _Side(os.fspath(candidate), "candidate", work, **kw)

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

    from .core import _PARALLEL_EXTRA_BYTES, _PARALLEL_HEADROOM, _available_bytes, _size
    need = [s.pm.estimated_bytes(dtype) for s in sides.models() if s.pm is not None and s.stream is None]
    if not need:
        return
    total = sum(need) if together else max(need)
    avail = _available_bytes(dev, torch)
    if avail is not None and total * _PARALLEL_HEADROOM + _PARALLEL_EXTRA_BYTES > avail:
        what = "both models need" if together and len(need) == 2 else "the model needs"
        raise CkptError(f"{what} ~{_size(total)} in {dtype}, {_size(avail)} free on {dev}",
                        hint="--save-reference FILE runs one model at a time; a model larger than memory needs "
                             "layer streaming (--stream)" if together else
                             "a model larger than memory needs layer streaming (--stream)")


def _row_lists(rows: slice, sequences) -> list[np.ndarray]:
    """The scored positions as the streamed sources take them: one index array per sequence."""
    return [np.arange(len(seq))[rows] for seq in sequences]


def _choose_stream(stream, reference, candidate, runtime, dtype, dev, ctx, memory_budget, notes, *,
                   together: bool) -> bool:
    """Whether the transformers sides run layer-streamed: as asked, or (``stream=None``) when the
    memory plan of ``verify`` (:func:`.core.plan_memory`, from the headers alone) says the models
    would not be held in memory as this run needs them (both at once, or one at a time when a
    saved reference stands in for one side)."""
    if stream is not None:
        return bool(stream)
    given = [os.fspath(x) for x in (reference, candidate) if x is not None]
    hf = [g for g in given if not (runtime == "llama.cpp" and g.endswith(".gguf"))]
    if not hf:
        return False
    import torch

    from .core import _budget, _sizes, plan_memory
    sizes = [_sizes(g, None) for g in hf]
    a, b = (sizes + sizes)[:2]
    plan = plan_memory(a, b, dtype=dtype, device=dev, device_map=None, sequential=not (together and len(hf) == 2),
                       stream=None, available=_budget(dev, torch, memory_budget), positions=ctx)
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


def _read_corpus(corpus, corpus_ids, tok: Tokenizer | None, ctx: int, notes: list) -> Corpus:
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
        return cut(path, raw, ids, ctx=ctx, bos=bos, from_ids=True)
    path = os.fspath(corpus)
    text = read_text_file(Path(path), "corpus")
    ids = tok.encode(text)
    notes.append(f"corpus tokenized with {tok.name}")
    return cut(path, text.encode("utf-8"), ids, ctx=ctx, bos=tok.bos, from_ids=False)


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
        for _, logits in side.source(dev, warnings)(seqs, rows=rows):
            w.write_chunk(logits)
        w.close()
    except BaseException:
        w.discard()
        raise
    return ReferenceReader(dest)


def _common_width(r: np.ndarray, c: np.ndarray, tok, notes: list):
    """Logits of different widths are compared on the first ``min`` columns when every tokenizer id
    is inside them (padded embedding rows can never be produced), else refused."""
    if r.shape[-1] == c.shape[-1]:
        return r, c
    n = min(r.shape[-1], c.shape[-1])
    if tok is None or n < len(tok):
        has = f"tokenizer has {len(tok)} tokens" if tok is not None else "no tokenizer to bound the real tokens"
        raise ConfigError(f"vocabulary widths differ: reference {r.shape[-1]}, candidate {c.shape[-1]} ({has}); "
                          "the models are not comparable")
    notes.append(f"vocabulary widths differ ({r.shape[-1]} vs {c.shape[-1]}); compared the first {n} logits "
                 f"(the tokenizer has {len(tok)} tokens)")
    return r[..., :n], c[..., :n]


def _bar(progress, total: int):
    from ..progress import bar
    return bar(progress, total=total, desc="chunks", unit="chunk")
