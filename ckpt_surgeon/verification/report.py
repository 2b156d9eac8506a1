"""Records ``verify`` returns: per-prompt results, aggregate metrics, the verdict.

``VerifyReport.to_dict()`` is the JSON contract (``--format json``); keys are documented in
docs/verify.md (extend, never rename).  ``rows()`` gives one flat row per prompt for table/csv/markdown,
``summary_items()`` the key/value lines above the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..records import finite_or_none as _num
from .kinds import ModelKind
from .metrics import OutputComparison
from .requantized import NOTE_PREFIX as REQUANTIZED
from .thresholds import Thresholds
from .tokenizer_report import JSON_KEYS as _TOKENIZER_KEYS
from .tokenizer_report import skipped as _tokenizer_skipped


# The JSON contract, key by key ("a.b" = key b inside object a; "prompts[].x" = key x of every
# prompt entry).  Tests compare this table with what to_dict() emits, and docs/verify.md
# (the README text) is written from it, so code and documentation cannot drift apart.
JSON_KEYS: dict[str, str] = {
    "reference": "REFERENCE as given",
    "candidate": "CANDIDATE as given",
    "kind": "causal-lm | masked-lm | encoder | multimodal | seq2seq (from config.json architectures / model_type)",
    "output": "what was compared: logits, or last_hidden_state for encoders",
    "architectures.reference": "config architectures[0] of the reference",
    "architectures.candidate": "config architectures[0] of the candidate",
    "storage_dtypes.reference": "coarsest weight precision stored: float32 | float16 | bfloat16 | quantized",
    "storage_dtypes.candidate": "same for the candidate",
    "device": "cpu | cuda | device_map=auto",
    "dtype": "compute dtype both models ran in",
    "mode": "parallel (both loaded) | sequential (one after the other, reference outputs saved as float32) | "
            "stream (layer by layer; the report then also has a localize object) | llama.cpp (a pair of GGUF files "
            "run in llama.cpp, both loaded)",
    "max_new_tokens": "greedy tokens generated per prompt (null for models that do not generate)",
    "passed": "the verdict",
    "failures": "one sentence per failed criterion (empty when passed)",
    "metrics.positions": "prompt tokens compared, all prompts together",
    "metrics.max_abs_diff": "max |Δlogit| (|Δhidden| for encoders) over all prompts and positions",
    "metrics.scale": "the reference's largest |logit| (|hidden|): what max_rel_diff divides by",
    "metrics.max_rel_diff": "max_abs_diff / scale; judged against thresholds.max_logit_diff",
    "metrics.nonfinite": "output elements that are NaN/inf in one model and not the other",
    "metrics.mean_kl": "mean over positions of KL(ref‖cand), nats, float64 log-softmax (null for encoders)",
    "metrics.max_kl": "largest per-position KL(ref‖cand); judged against thresholds.max_kl",
    "metrics.top1_agreement": "fraction of positions whose arg-max token agrees",
    "metrics.greedy_identical": "every prompt's greedy continuation identical (null without generation)",
    "metrics.greedy_identical_prompts": "how many prompts' continuations are identical",
    "metrics.min_embedding_cosine": "encoders: smallest cosine between the mean-pooled last hidden states",
    "thresholds.dtype": "which default row applied (coarsest of compute and storage dtypes, or --thresholds)",
    "thresholds.max_logit_diff": "bound on metrics.max_rel_diff",
    "thresholds.max_kl": "bound on metrics.max_kl",
    "thresholds.min_top1": "lower bound on metrics.top1_agreement",
    "thresholds.require_greedy": "whether differing greedy continuations fail the run",
    "thresholds.overridden": "names of the criteria set explicitly",
    "prompts[].index": "position in the prompt list",
    "prompts[].prompt": "the prompt text",
    "prompts[].tokens": "its length in reference-tokenizer ids (after truncation to the context)",
    "prompts[].max_abs_diff": "this prompt's max |Δ|",
    "prompts[].scale": "this prompt's largest reference |output|",
    "prompts[].nonfinite": "this prompt's NaN/inf disagreements",
    "prompts[].mean_kl": "this prompt's mean KL (null for encoders)",
    "prompts[].max_kl": "this prompt's largest KL (null for encoders)",
    "prompts[].top1_agreement": "this prompt's arg-max agreement (null for encoders)",
    "prompts[].embedding_cosine": "encoders: cosine of the mean-pooled last hidden states (else null)",
    "prompts[].greedy_identical": "causal LMs only: continuations identical",
    "prompts[].first_greedy_diff": "causal LMs only: index of the first differing generated token, or null",
    "prompts[].reference_continuation": "causal LMs only: greedy token ids of the reference",
    "prompts[].candidate_continuation": "causal LMs only: greedy token ids of the candidate",
    "prompts[].reference_text": "causal LMs only: the reference continuation decoded",
    "prompts[].candidate_text": "causal LMs only: the candidate continuation decoded (reference tokenizer)",
    "notes": "how the run was done (mode and why, conversions, truncations)",
    "warnings": "loading findings (e.g. checkpoint tensors the model does not use)",
    "elapsed_s": "wall time of the whole run",
    "environment": "torch / transformers / python versions, CPU threads, GPU name (a llama.cpp run: "
                   "llama_cpp_python / python versions, threads)",
    **{f"tokenizer.{k}": v for k, v in _TOKENIZER_KEYS.items()},     # the tokenizer section (issue 48)
}


@dataclass(frozen=True)
class PromptResult:
    """One prompt through both models."""

    index: int
    text: str
    tokens: int                              # prompt length in reference-tokenizer ids
    comparison: OutputComparison
    reference_continuation: tuple = ()       # greedy token ids (causal LMs only)
    candidate_continuation: tuple = ()
    reference_text: str | None = None        # the continuations decoded with the reference tokenizer
    candidate_text: str | None = None
    first_greedy_diff: int | None = None     # index into the continuation of the first differing token
    generated: bool = False

    @property
    def greedy_identical(self) -> bool | None:
        return (self.first_greedy_diff is None) if self.generated else None

    def to_dict(self) -> dict:
        c = self.comparison
        d = {"index": self.index, "prompt": self.text, "tokens": self.tokens,
             "max_abs_diff": _num(c.max_abs_diff), "scale": _num(c.scale), "nonfinite": c.nonfinite,
             "mean_kl": _num(c.mean_kl), "max_kl": _num(c.max_kl),
             "top1_agreement": None if c.top1_agree is None else c.top1_agree / max(c.positions, 1),
             "embedding_cosine": _num(c.cosine)}
        if self.generated:
            d.update({"greedy_identical": self.greedy_identical, "first_greedy_diff": self.first_greedy_diff,
                      "reference_continuation": list(self.reference_continuation),
                      "candidate_continuation": list(self.candidate_continuation),
                      "reference_text": self.reference_text, "candidate_text": self.candidate_text})
        return d


@dataclass(frozen=True)
class Metrics:
    """Aggregates over all prompts and positions."""

    positions: int
    max_abs_diff: float
    scale: float
    max_rel_diff: float
    nonfinite: int
    mean_kl: float | None
    max_kl: float | None
    top1_agreement: float | None
    greedy_identical: bool | None
    greedy_identical_prompts: int | None
    min_embedding_cosine: float | None

    def to_dict(self) -> dict:
        return {"positions": self.positions, "max_abs_diff": _num(self.max_abs_diff), "scale": _num(self.scale),
                "max_rel_diff": _num(self.max_rel_diff), "nonfinite": self.nonfinite,
                "mean_kl": _num(self.mean_kl), "max_kl": _num(self.max_kl),
                "top1_agreement": _num(self.top1_agreement), "greedy_identical": self.greedy_identical,
                "greedy_identical_prompts": self.greedy_identical_prompts,
                "min_embedding_cosine": _num(self.min_embedding_cosine)}


def aggregate(results: list[PromptResult] | tuple, kind: ModelKind) -> Metrics:
    """Pool per-prompt comparisons: maxima over everything, KL mean weighted by positions,
    top-1 as a fraction of all positions, relative diff = global max |Δ| / global max |ref|."""
    cs = [r.comparison for r in results]
    positions = sum(c.positions for c in cs)
    max_abs = max((c.max_abs_diff for c in cs), default=0.0)
    scale = max((c.scale for c in cs), default=0.0)
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    mean_kl = max_kl = top1 = cos = None
    if kind.distribution:
        mean_kl = sum(c.mean_kl * c.positions for c in cs) / max(positions, 1)
        max_kl = max((c.max_kl for c in cs), default=0.0)
        top1 = sum(c.top1_agree for c in cs) / max(positions, 1)
    else:
        cos = min((c.cosine for c in cs), default=1.0)
    greedy = n_same = None
    if kind.generates and any(r.generated for r in results):     # not with max_new_tokens=0
        n_same = sum(1 for r in results if r.greedy_identical)
        greedy = n_same == len(results)
    return Metrics(positions, max_abs, scale, rel, sum(c.nonfinite for c in cs), mean_kl, max_kl, top1,
                   greedy, n_same, cos)


def judge(m: Metrics, t: Thresholds, kind: ModelKind, results) -> tuple[str, ...]:
    """The failed criteria, one sentence each; empty means pass.  NaN never passes (every
    comparison is written so that NaN lands on the failing side)."""
    out = []
    if m.nonfinite:
        out.append(f"{m.nonfinite} output element(s) are NaN/inf in one model and not the other")
    if not (m.max_rel_diff <= t.max_logit_diff):
        out.append(f"max |Δ{kind.output}|/scale = {m.max_rel_diff:.3g} > {t.max_logit_diff:g} "
                   f"(max |Δ| {m.max_abs_diff:.3g}, scale {m.scale:.3g})")
    if kind.distribution:
        if not (m.max_kl <= t.max_kl):
            out.append(f"max KL(ref‖cand) = {m.max_kl:.3g} > {t.max_kl:g}")
        if not (m.top1_agreement >= t.min_top1):
            out.append(f"top-1 agreement {m.top1_agreement:.4g} < {t.min_top1:g}")
    if m.greedy_identical is not None and t.require_greedy and not m.greedy_identical:
        diffs = [r for r in results if not r.greedy_identical]
        first = diffs[0]
        out.append(f"greedy continuations differ in {len(diffs)} of {len(results)} prompt(s) "
                   f"(first: prompt {first.index}, generated token {first.first_greedy_diff})")
    return tuple(out)


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify(reference, candidate)`` found.  ``passed`` is the verdict."""

    reference: str
    candidate: str
    kind: str                                # causal-lm | masked-lm | encoder | multimodal | seq2seq
    output: str                              # logits | last_hidden_state
    architectures: tuple                     # (reference, candidate) config architectures[0]
    storage_dtypes: tuple                    # (reference, candidate) coarsest weight precision
    device: str
    dtype: str                               # compute dtype both models ran in
    mode: str                                # "parallel" (both loaded) | "sequential" (one after the other)
    max_new_tokens: int
    thresholds: Thresholds
    metrics: Metrics
    prompts: tuple                           # PromptResult per prompt
    passed: bool
    failures: tuple = ()
    notes: tuple = ()
    warnings: tuple = ()
    elapsed_s: float = 0.0
    environment: dict = field(default_factory=dict)
    localize: object = None                  # LocalizeReport: per-layer divergence (stream mode computes it)
    towers: tuple = ()                       # TowerResult per vision / audio tower of a multimodal model
    tokenizer: object = None                 # TokenizerCheck: each side's own tokenizer and chat template

    def to_dict(self) -> dict:
        d = self._dict()
        if self.localize is not None:
            d["localize"] = self.localize.to_dict()
        if self.towers:
            d["towers"] = [t.to_dict() for t in self.towers]
        return d

    def _dict(self) -> dict:
        return {
            "reference": self.reference, "candidate": self.candidate,
            "kind": self.kind, "output": self.output,
            "architectures": {"reference": self.architectures[0], "candidate": self.architectures[1]},
            "storage_dtypes": {"reference": self.storage_dtypes[0], "candidate": self.storage_dtypes[1]},
            "device": self.device, "dtype": self.dtype, "mode": self.mode,
            "max_new_tokens": self.max_new_tokens if self.kind in ("causal-lm", "multimodal") else None,
            "passed": self.passed, "failures": list(self.failures),
            "metrics": self.metrics.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "prompts": [p.to_dict() for p in self.prompts],
            "notes": list(self.notes), "warnings": list(self.warnings),
            "elapsed_s": round(self.elapsed_s, 3), "environment": dict(self.environment),
            "tokenizer": (self.tokenizer or _tokenizer_skipped("not run")).to_dict(),
        }

    def rows(self) -> list[dict]:
        """One flat row per prompt (what table/csv/markdown and ``to_frame`` show)."""
        rows = []
        for p in self.prompts:
            c = p.comparison
            text = p.text.replace("\n", "\\n")
            row = {"prompt": p.index, "text": text if len(text) <= 32 else text[:31] + "…", "tokens": p.tokens,
                   "max_abs_diff": c.max_abs_diff, "rel_diff": c.max_abs_diff / c.scale if c.scale > 0 else None}
            if c.mean_kl is not None:
                row.update({"mean_kl": c.mean_kl, "max_kl": c.max_kl, "top1": c.top1_agree / max(c.positions, 1)})
            if c.cosine is not None:
                row["embedding_cosine"] = c.cosine
            if p.generated:
                row["greedy"] = "identical" if p.greedy_identical else f"differs at {p.first_greedy_diff}"
            rows.append(row)
        return rows

    def to_frame(self):
        """Per-prompt rows as a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame(self.rows())

    def summary_items(self) -> list[tuple[str, str]]:
        m = self.metrics
        items = [
            ("reference", f"{self.reference} ({self.architectures[0]}, {self.storage_dtypes[0]})"),
            ("candidate", f"{self.candidate} ({self.architectures[1]}, {self.storage_dtypes[1]})"),
            ("run", f"{self.kind} on {self.device}, {self.dtype}, {self.mode}; {len(self.prompts)} prompts, "
                    f"{m.positions} positions"),
            (f"max |Δ{self.output}|", f"{m.max_abs_diff:.4g} (scale {m.scale:.4g}, relative {m.max_rel_diff:.3g})"),
        ]
        if m.mean_kl is not None:
            items.append(("KL(ref‖cand) mean / max", f"{m.mean_kl:.3g} / {m.max_kl:.3g}"))
            items.append(("top-1 agreement", f"{m.top1_agreement:.4%}"))
        if m.min_embedding_cosine is not None:
            items.append(("min embedding cosine", f"{m.min_embedding_cosine:.8f}"))
        if m.greedy_identical is not None:
            items.append((f"greedy ({self.max_new_tokens} new tokens)",
                          f"identical in {m.greedy_identical_prompts} of {len(self.prompts)} prompts"))
        elif self.mode == "stream" and self.kind == "causal-lm":
            items.append(("greedy", "not compared (layer-streamed: one forward pass, no generation)"))
        items.append(("thresholds", self.thresholds.describe(distribution=m.mean_kl is not None,
                                                             generates=m.greedy_identical is not None)))
        for t in self.towers:
            items.append((f"tower {t.name}", f"{t.kind}, {t.note}" if t.passed is None else
                          f"{t.kind}, run alone as {t.module} ({t.inputs}): max |Δ| {t.max_abs_diff:.4g} (scale "
                          f"{t.scale:.4g}, relative {t.max_rel_diff:.3g}) {'ok' if t.passed else 'FAILS'}"))
        if self.tokenizer is not None:
            items += self.tokenizer.summary_items()
        items.append(("verdict", "PASS" if self.passed else "FAIL: " + "; ".join(self.failures) + (
            " (the reference is itself quantized: see the 'requantized' note)"
            if any(n.startswith(REQUANTIZED) for n in self.notes) else "")))
        if self.localize is not None:
            items += self.localize.summary_items()
        return items
