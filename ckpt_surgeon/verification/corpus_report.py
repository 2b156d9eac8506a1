"""The fidelity report of ``verify --corpus``: its gates, its JSON contract and the report record
(split from :mod:`.corpus`, which runs the models; names re-exported there)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CkptError
from .fidelity import FidelityStats
from .thresholds import thresholds_for


# --- the report ----------------------------------------------------------------------------------

# A quantized KV cache is judged only by the gates given, in a --cache-type-k/-v run as in a --cache-sweep
# (issue 50 item 6: the one judged by the exactness rows, the other not, on the same data)
GIVEN_ONLY = "given"
MEASUREMENT_ONLY = "none given: measurement only (--max-mean-kl, --max-p99-kl, --min-same-top, --max-ln-ppl-ratio judge)"

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

    @property
    def measurement_only(self) -> bool:
        """No gate at all (a quantized KV cache with none given): the run measures, it does not judge."""
        return self.dtype == GIVEN_ONLY and not self.overridden

    def describe(self) -> str:
        if self.measurement_only:
            return MEASUREMENT_ONLY
        parts = [f"mean KL <= {self.max_mean_kl:g}" if self.max_mean_kl is not None else "mean KL not gated",
                 f"p99 KL <= {self.max_p99_kl:g}" if self.max_p99_kl is not None else "p99 KL not gated",
                 f"same top >= {self.min_same_top:g}" if self.min_same_top is not None else "same top not gated",
                 f"ln(PPL(cand)/PPL(ref)) <= {self.max_ln_ppl_ratio:g}" if self.max_ln_ppl_ratio is not None
                 else "ln PPL ratio not gated (--max-ln-ppl-ratio)"]
        s = ("as given: " if self.dtype == GIVEN_ONLY else f"{self.dtype} defaults: ") + ", ".join(parts)
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


def given_gates(limits: dict) -> Gates:
    """Only the gates given (None: not judged): how a quantized KV cache is judged without --thresholds."""
    return Gates(GIVEN_ONLY, **limits, overridden=tuple(k for k, v in limits.items() if v is not None))


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
    "kv_cache": "--kv-cache: llama.cpp's cache type for K and V (the reference's; the candidate's too unless "
                "cache.candidate says otherwise) when a side ran in llama.cpp, else null",
    "cache": "llama.cpp's caches when a side ran in llama.cpp, else null: reference / candidate {type_k, type_v} "
             "(null for a side not run in llama.cpp), flash_attn (bool), quantized (a quantized K or V cache: a "
             "fidelity run, not an exactness run)",
    "device": "cpu | cuda",
    "dtype": "compute dtype of the transformers side(s)",
    "passed": "the verdict",
    "failures": "one sentence per failed gate",
    "gates.dtype": "the exactness row the defaults came from, or \"given\": only the gates given are judged (a "
                   "quantized KV cache without --thresholds; none given: measurement only)",
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
    corpus: object             # a .corpus.Corpus (not imported: corpus imports this module)
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
    cache: dict | None = None      # JSON "cache" (null when no side ran in llama.cpp)

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
                "kv_cache": self.kv_cache, "cache": self.cache, "device": self.device, "dtype": self.dtype,
                "passed": self.passed, "failures": list(self.failures), "gates": self.gates.to_dict(),
                "corpus": c, "notes": list(self.notes), "warnings": list(self.warnings),
                "elapsed_s": round(self.elapsed_s, 3), "environment": dict(self.environment)}

    def rows(self) -> list[dict]:
        """One row per statistic, llama.cpp's three blocks in its order and wording."""
        return [{"block": title, "statistic": label, "value": value}
                for title, items in self.stats.blocks() for label, value in items]

    def _cache_text(self) -> str:
        c = self.cache
        if not c:
            return ""
        sides = [f"{r} K {c[r]['type_k']} / V {c[r]['type_v']}" for r in ("reference", "candidate") if c[r]]
        return (", llama.cpp cache " + ", ".join(sides) + (", flash attention" if c["flash_attn"] else "") +
                (" (quantized cache: a fidelity run, not an exactness run)" if c["quantized"] else ""))

    def summary_items(self) -> list[tuple[str, str]]:
        st = self.stats
        items = [("reference", f"{self.reference} ({self.runtimes[0]})"),
                 ("candidate", f"{self.candidate} ({self.runtimes[1]})"),
                 ("corpus", f"{self.corpus.path}: {self.corpus.total_tokens} tokens, {self.corpus.tokens.shape[0]} "
                            f"chunks of {self.ctx}, {st.n} scored ({'positions ctx/2 … ctx−2, llama.cpp' if self.score == 'half' else 'every position'})"),
                 ("run", f"{self.device}, {self.dtype}" + self._cache_text())]
        if self.reference_file:
            rf = self.reference_file
            items.append(("reference file", f"{rf['path']} ({rf['format']}, {'written' if rf['saved'] else 'read'})"))
        items += [("mean KL(ref‖cand)", f"{st.kl_mean:.6g} ± {st.kl_se:.2g}  (99%: {st.kl['p99']:.4g}, max "
                                        f"{st.kl['max']:.4g} at chunk {st.kl_max_at[0]} position {st.kl_max_at[1]})"),
                  ("same top", f"{100 * st.same_top:.3f} ± {100 * st.same_top_se:.3f} %"),
                  ("PPL cand / ref", f"{st.ppl_cand:.6g} / {st.ppl_ref:.6g}, ln ratio {st.ln_ratio:.4g} ± {st.ln_ratio_se:.2g}"),
                  ("gates", self.gates.describe()),
                  ("verdict", "measured (no gate given)" if self.gates.measurement_only else
                   "PASS" if self.passed else "FAIL: " + "; ".join(self.failures))]
        return items
