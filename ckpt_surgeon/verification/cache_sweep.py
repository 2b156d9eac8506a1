"""``verify --corpus FILE --cache-sweep q8_0,q4_0/f16``: one candidate GGUF run in llama.cpp under
several KV cache types, each scored against one reference run, in one table.

The table is laid out as llama.cpp users post their KV-cache measurements: one row per cache
(K type / V type), columns mean KLD ± SE, mean Δp ± SE, RMS Δp ± SE, same top % ± SE and the PPL
ratio ± SE, every number from :class:`.fidelity.FidelityAccumulator` (llama-perplexity's own
formulas; see :mod:`.fidelity`).  The reference is REFERENCE (by default the candidate itself)
with ``--kv-cache`` (f16, llama.cpp's default), or a saved reference (``--reference FILE``); it
runs once, its logits kept in a temporary file, and each row runs the candidate against it.

A quantized cache is a fidelity run, not an exactness run: no model can match float logits
through a 4- or 8-bit cache, so the rows are measurements.  Gates are judged only when given
(``--max-mean-kl`` ...), or from a row's defaults when ``--thresholds ROW`` asks; then a row over one
fails the run (exit 1).  A single ``--cache-type-k`` / ``--cache-type-v`` run takes the same stand
(:func:`.corpus._gates`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

from ..records import finite_or_none as _num
from .corpus import Corpus, LlamaRun, needs_llama, run_corpus
from .corpus_report import MEASUREMENT_ONLY, Gates, gates_for, given_gates
from .fidelity import FidelityStats
from .kv_types import CacheTypes, cache_types, parse_sweep, use_flash_attn
from .options import CorpusOptions, SavedReference

FIDELITY_NOTE = ("a quantized KV cache is a fidelity run, not an exactness run: the rows measure what the cache "
                 "costs, against the reference's float cache")

# The JSON contract of a cache sweep (keys only ever added; "a.b" = key b inside a, "rows[].x" = key x of each row).
JSON_KEYS: dict[str, str] = {
    "reference": "REFERENCE as given (the candidate itself when left out), or the saved reference file",
    "candidate": "CANDIDATE as given (a .gguf run in llama.cpp)",
    "mode": "cache-sweep",
    "runtimes.reference": "transformers | llama.cpp | file (a saved reference)",
    "runtimes.candidate": "llama.cpp",
    "reference_cache": "{type_k, type_v} of the reference when it ran in llama.cpp (--kv-cache), else null",
    "flash_attn": "whether llama.cpp ran with flash attention (every side alike; needed for a quantized V)",
    "fidelity_only": "true: a quantized cache is a fidelity run, not an exactness run",
    "device": "cpu | cuda",
    "dtype": "compute dtype of a transformers reference",
    "passed": "every row within the gates given (true when none were given)",
    "failures": "one sentence per failed gate, prefixed with the row's K / V types",
    "gates": "{max_mean_kl, max_p99_kl, min_same_top, max_ln_ppl_ratio}: the gates given (null: not judged)",
    "corpus.tokens": "corpus length in tokens (before cutting into whole chunks)",
    "corpus.chunks": "chunks of ctx tokens scored",
    "corpus.ctx": "tokens per chunk",
    "corpus.scored": "tokens scored per row",
    "corpus.convention": "llama.cpp (positions ctx/2 … ctx−2) | all (positions 0 … ctx−2)",
    "corpus.source": "the corpus file",
    "corpus.sha256": "sha256 of the corpus file's bytes",
    "corpus.bos": "the BOS id that replaced each chunk's first token, or null",
    "corpus.reference_file": "{path, format, saved} of a reference file read or written, or null",
    "rows[].type_k": "the row's K cache type",
    "rows[].type_v": "the row's V cache type",
    "rows[].passed": "the row within the gates given",
    "rows[].failures": "the row's failed gates",
    "rows[].ppl": "as corpus.ppl of a single --corpus run: ref, cand, ratio, ratio_se, ln_ratio {mean, se}, …",
    "rows[].kl": "as corpus.kl: KL(ref‖cand) mean, se, max, percentiles, min, max_at",
    "rows[].dp": "as corpus.dp: Δp mean, se, rms, rms_se, percentiles",
    "rows[].same_top": "{p, se}",
    "notes": "how the run was done",
    "warnings": "loading findings",
    "elapsed_s": "wall time",
    "environment": "torch / transformers / llama-cpp-python versions, threads",
}


@dataclass(frozen=True)
class SweepRow:
    """One cache of the sweep: its statistics against the reference and its verdict."""

    cache: CacheTypes
    stats: FidelityStats
    failures: tuple = ()

    def to_dict(self) -> dict:
        return {"type_k": self.cache.k, "type_v": self.cache.v, "passed": not self.failures,
                "failures": list(self.failures), **self.stats.to_dict()}

    def table_row(self, gated: bool) -> dict:
        s = self.stats
        row = {"K": self.cache.k, "V": self.cache.v,
               "mean KLD": f"{s.kl_mean:.6f} ± {s.kl_se:.6f}",
               "Δp": f"{100 * s.dp_mean:.3f} ± {100 * s.dp_se:.3f} %",
               "RMS Δp": f"{100 * s.rms_dp:.3f} ± {100 * s.rms_dp_se:.3f} %",
               "same top": f"{100 * s.same_top:.2f} ± {100 * s.same_top_se:.2f} %",
               "PPL ratio": f"{s.ratio:.4f} ± {s.ratio_se:.4f}",
               "99% KLD": f"{s.kl['p99']:.4g}"}
        if gated:
            row["verdict"] = "pass" if not self.failures else "FAIL"
        return row


@dataclass(frozen=True)
class CacheSweepReport:
    """What :func:`verify_cache_sweep` found: one :class:`SweepRow` per cache."""

    reference: str
    candidate: str
    runtimes: tuple
    reference_cache: CacheTypes | None
    flash_attn: bool
    device: str
    dtype: str
    corpus: Corpus
    ctx: int
    score: str
    rows_: tuple
    gates: Gates | None
    reference_file: dict | None = None
    notes: tuple = ()
    warnings: tuple = ()
    elapsed_s: float = 0.0
    environment: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(not r.failures for r in self.rows_)

    @property
    def failures(self) -> tuple:
        return tuple(f"{r.cache.label}: {f}" for r in self.rows_ for f in r.failures)

    def to_dict(self) -> dict:
        n = self.rows_[0].stats.n
        c = {"tokens": self.corpus.total_tokens, "chunks": int(self.corpus.tokens.shape[0]), "ctx": self.ctx,
             "scored": n, "convention": "llama.cpp" if self.score == "half" else "all", "source": self.corpus.path,
             "sha256": self.corpus.sha256, "bos": self.corpus.bos, "reference_file": self.reference_file}
        g = self.gates
        return {"reference": self.reference, "candidate": self.candidate, "mode": "cache-sweep",
                "runtimes": {"reference": self.runtimes[0], "candidate": self.runtimes[1]},
                "reference_cache": self.reference_cache.to_dict() if self.reference_cache else None,
                "flash_attn": self.flash_attn, "fidelity_only": True, "device": self.device, "dtype": self.dtype,
                "passed": self.passed, "failures": list(self.failures),
                "gates": None if g is None else {k: _num(getattr(g, k)) for k in
                                                 ("max_mean_kl", "max_p99_kl", "min_same_top", "max_ln_ppl_ratio")},
                "corpus": c, "rows": [r.to_dict() for r in self.rows_], "notes": list(self.notes),
                "warnings": list(self.warnings), "elapsed_s": round(self.elapsed_s, 3),
                "environment": dict(self.environment)}

    def rows(self) -> list[dict]:
        """The table: one row per cache (K, V, mean KLD ±, Δp ±, RMS Δp ±, same top ±, PPL ratio ±)."""
        return [r.table_row(self.gates is not None) for r in self.rows_]

    def summary_items(self) -> list[tuple[str, str]]:
        ref = (f"{self.reference} ({self.runtimes[0]}" +
               (f", K {self.reference_cache.k} / V {self.reference_cache.v}" if self.reference_cache else "") + ")")
        n = self.rows_[0].stats.n
        items = [("reference", ref), ("candidate", f"{self.candidate} (llama.cpp, one row per cache below)"),
                 ("corpus", f"{self.corpus.path}: {self.corpus.total_tokens} tokens, {self.corpus.tokens.shape[0]} "
                            f"chunks of {self.ctx}, {n} scored per row"),
                 ("flash attention", "on" if self.flash_attn else "off"),
                 ("kind", FIDELITY_NOTE)]
        if self.gates is None:
            items.append(("gates", MEASUREMENT_ONLY))
        else:
            items.append(("gates", self.gates.describe()))
            items.append(("verdict", "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)))
        return items


# What a sweep takes of :class:`.options.CorpusOptions` (the rest is fixed: every row runs in llama.cpp).
SWEEP_KEYWORDS = ("corpus", "corpus_ids", "ctx", "score", "chunks", "tokenizer", "device", "dtype", "kv_cache", "flash_attn",
                  "reference_file", "max_mean_kl", "max_p99_kl", "min_same_top", "max_ln_ppl_ratio", "thresholds",
                  "progress", "tmp_dir")


def sweep_options(o: CorpusOptions) -> CorpusOptions:
    """``o`` as a sweep runs it: llama.cpp for every GGUF side, no per-side cache types, nothing
    saved, not streamed, no memory budget; gates as given (a thresholds row only when named)."""
    return replace(o, placement=replace(o.placement, stream=False, memory_budget=None),
                   llama=replace(o.llama, runtime="llama.cpp", cache_type_k=None, cache_type_v=None),
                   saved=SavedReference(reference_file=o.saved.reference_file))


def verify_cache_sweep(reference, candidate=None, *, cache_sweep, options: CorpusOptions | None = None,
                       **kwargs) -> CacheSweepReport:
    """Run ``candidate`` (a GGUF; default: ``reference``, which must then be one) in llama.cpp under
    each cache of ``cache_sweep`` (``"q8_0,q4_0/f16"`` or a sequence of items: ``K/V`` or one type
    for both; see :func:`.kv_types.parse_sweep`) against ``reference`` run once (a GGUF in
    llama.cpp with ``kv_cache`` for K and V, default f16; an HF model in transformers) or against
    ``reference_file``.  ``flash_attn``: auto (on for every run when a row quantizes V), on, off.
    Gates are judged only when given (``thresholds``: a row's defaults for those not given).  The
    options: a :class:`~.options.CorpusOptions` record (``options``; what a sweep does not take is
    ignored, :func:`sweep_options`) or the keyword arguments of :data:`SWEEP_KEYWORDS`.  Raises CkptError (one line) for bad input."""
    unknown = next((k for k in kwargs if k not in SWEEP_KEYWORDS), None)
    if unknown is not None:
        raise TypeError(f"verify_cache_sweep() got an unexpected keyword argument {unknown!r}")
    o = sweep_options(CorpusOptions.build(options, **kwargs))
    candidate = candidate if candidate is not None else reference
    rows = parse_sweep(cache_sweep, kv_cache=o.llama.kv_cache)
    ref_cache, _ = cache_types(o.llama.kv_cache)
    needs_llama("llama.cpp", candidate, "--cache-sweep")
    llama = LlamaRun(ref_cache, rows, use_flash_attn(o.llama.flash_attn, (ref_cache,) + rows))
    out = run_corpus(reference, candidate, o, llama=llama, sweep=True)
    gates = gates_for(o.gates.thresholds, **o.gates.limits()) if o.gates.thresholds else given_gates(o.gates.limits())
    gates = None if gates.measurement_only else gates
    swept = tuple(SweepRow(c, st, gates.judge(st) if gates else ()) for c, st in zip(rows, out.stats))
    notes = [FIDELITY_NOTE] + [n for n in out.notes if not n.startswith("quantized KV cache:")]
    if llama.flash_attn:
        notes.append("flash attention on for every llama.cpp run (llama.cpp needs it for a quantized V cache; "
                     "its CPU kernel rounds Q and K to float16 as an f16 cache does)")
    return CacheSweepReport(
        reference=out.reference, candidate=os.fspath(candidate), runtimes=out.runtimes,
        reference_cache=ref_cache if "reference" in out.llama_sides else None, flash_attn=llama.flash_attn,
        device=out.device, dtype=o.placement.dtype, corpus=out.corpus, ctx=o.ctx, score=o.score, rows_=swept,
        gates=gates,
        reference_file=out.reference_file, notes=tuple(dict.fromkeys(notes)), warnings=tuple(out.warnings),
        elapsed_s=time.perf_counter() - out.t0, environment=out.environment)
