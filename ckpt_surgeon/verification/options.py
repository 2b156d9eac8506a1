"""What a verify run is asked to do, as typed frozen records composed of smaller ones.

:class:`VerifyOptions` (exactness: prompts through both models) and :class:`CorpusOptions`
(fidelity: a corpus scored as llama-perplexity scores it) share :class:`Placement` (device,
dtype, memory); each has its own criteria (:class:`Criteria`, :class:`GateLimits`).  The CLI
builds one record per run from its options; the Python API builds the same record from the
keyword arguments it has always taken (``verify(ref, cand, max_kl=1e-5, device="cpu")``), or
takes it whole (``verify(ref, cand, VerifyOptions(criteria=Criteria(max_kl=1e-5)))``).  Keyword
names are unique across the parts of one record, so each flat name lands in exactly one part.
"""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace

PathLike = str | os.PathLike


@dataclass(frozen=True)
class Placement:
    """Where and how both models run, in either mode.  ``stream``: None = chosen by the memory plan
    (:mod:`.memory`), True / False = forced; ``memory_budget``: plan as if only this many bytes
    were free; ``tmp_dir``: an existing folder for the temporary files; ``progress``: bars on
    stderr (None = only on a terminal)."""

    device: str = "auto"
    dtype: str = "float32"
    stream: bool | None = None
    memory_budget: int | None = None
    tmp_dir: PathLike | None = None
    progress: bool | None = False


@dataclass(frozen=True)
class Criteria:
    """Exactness criteria as given: the dtype row to judge by (None = the coarsest precision in
    play) and single overrides of it (:func:`.thresholds.thresholds_for`)."""

    thresholds: str | None = None
    max_logit_diff: float | None = None
    max_kl: float | None = None
    min_top1: float | None = None
    require_greedy: bool | None = None

    def overrides(self) -> dict:
        return {"max_logit_diff": self.max_logit_diff, "max_kl": self.max_kl, "min_top1": self.min_top1,
                "require_greedy": self.require_greedy}

    def check(self) -> None:
        """Bad values fail now, not after minutes of conversion and loading."""
        from .thresholds import thresholds_for
        thresholds_for(self.thresholds or "float32", **self.overrides())


@dataclass(frozen=True)
class GateLimits:
    """Fidelity gates as given (None = the row's default, :func:`.corpus_report.gates_for`) and
    the row (None = the coarsest precision in play)."""

    thresholds: str | None = None
    max_mean_kl: float | None = None
    max_p99_kl: float | None = None
    min_same_top: float | None = None
    max_ln_ppl_ratio: float | None = None

    def limits(self) -> dict:
        return {"max_mean_kl": self.max_mean_kl, "max_p99_kl": self.max_p99_kl, "min_same_top": self.min_same_top,
                "max_ln_ppl_ratio": self.max_ln_ppl_ratio}

    def check(self) -> None:
        """Bad gate values fail before any model loads."""
        from .corpus_report import gates_for
        gates_for("float32", **self.limits())


@dataclass(frozen=True)
class Feed:
    """What the models are fed in exactness mode: ``prompts`` (default: the built-in set) or
    ``token_ids`` (a list of id lists; no tokenizer needed), the ``tokenizer`` that encodes the
    prompts (default: the reference's), greedy tokens generated per prompt, the seed."""

    prompts: list | tuple | None = None
    token_ids: list | tuple | None = None
    tokenizer: PathLike | None = None
    max_new_tokens: int = 32
    seed: int = 0


@dataclass(frozen=True)
class VerifyOptions:
    """Everything :func:`.core.verify` is asked: the feed, the placement, the criteria, and what
    only exactness mode has (the schedule, Hub revisions, ``--localize``)."""

    feed: Feed = field(default_factory=Feed)
    placement: Placement = field(default_factory=Placement)
    criteria: Criteria = field(default_factory=Criteria)
    sequential: bool | None = None           # None = by the memory plan, True = forced
    device_map: str | None = None            # "auto": accelerate spreads each model (sequential)
    max_memory: dict | None = None           # with device_map: accelerate's per-device limits
    revision: str | None = None              # the reference's Hub revision
    candidate_revision: str | None = None
    localize: bool = False                   # also find where the models diverge
    localize_threshold: float | None = None  # relative |Δ hidden| that counts as diverged
    tokenizer_check: bool = True             # the tokenizer / chat-template section (.tokenizer_check)
    runtime: str = "auto"                    # auto: a GGUF pair in llama.cpp (.llama_prompts.choose) | transformers

    @classmethod
    def build(cls, options: VerifyOptions | None = None, **kwargs) -> VerifyOptions:
        """``options`` (default: the defaults) with the flat keyword arguments applied."""
        return build(cls, options, "verify", kwargs)


@dataclass(frozen=True)
class LlamaOptions:
    """How sides run in llama.cpp (fidelity mode): ``runtime="llama.cpp"`` runs every ``.gguf`` side
    there with ``kv_cache`` for K and V; ``cache_type_k`` / ``cache_type_v`` set the candidate's
    alone; ``flash_attn`` auto | on | off."""

    runtime: str = "transformers"
    kv_cache: str = "f16"
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: str = "auto"


@dataclass(frozen=True)
class SavedReference:
    """A reference run kept in a file: read one (``reference_file``) or write one
    (``save_reference`` in ``reference_format``; ``replace`` an existing file)."""

    reference_file: PathLike | None = None
    save_reference: PathLike | None = None
    reference_format: str = "ckpt-surgeon"
    replace: bool = False


@dataclass(frozen=True)
class CorpusOptions:
    """Everything :func:`.corpus.verify_corpus` is asked: the corpus and how it is cut and scored,
    the placement, the gates, llama.cpp's settings and a saved reference."""

    corpus: PathLike | None = None
    corpus_ids: PathLike | None = None
    ctx: int = 512
    score: str = "half"
    chunks: int | None = None               # at most this many chunks, the first (llama-perplexity's --chunks)
    tokenizer: PathLike | None = None
    placement: Placement = field(default_factory=Placement)
    gates: GateLimits = field(default_factory=GateLimits)
    llama: LlamaOptions = field(default_factory=LlamaOptions)
    saved: SavedReference = field(default_factory=SavedReference)

    @classmethod
    def build(cls, options: CorpusOptions | None = None, **kwargs) -> CorpusOptions:
        """``options`` (default: the defaults) with the flat keyword arguments applied."""
        return build(cls, options, "verify_corpus", kwargs)


def flat_names(cls) -> list[str]:
    """The keyword names a composed record takes: its own fields and its parts' fields."""
    out = []
    for f in fields(cls):
        part = f.default_factory() if f.default_factory is not MISSING else None
        out += [g.name for g in fields(part)] if is_dataclass(part) else [f.name]
    return out


def build(cls, base, who: str, kwargs: dict):
    """``base`` (or ``cls()``) with flat keyword arguments applied, each to the part that has
    that field; a part may also be given whole by its own name.  An unknown name is a TypeError,
    as Python says it for a function's unknown keyword."""
    base = cls() if base is None else base
    rest = dict(kwargs)
    values = {}
    for f in fields(cls):
        current = getattr(base, f.name)
        if f.name in rest:
            values[f.name] = rest.pop(f.name)
        elif is_dataclass(current):
            mine = {g.name for g in fields(current)}
            given = {k: rest.pop(k) for k in list(rest) if k in mine}
            values[f.name] = replace(current, **given) if given else current
    if rest:
        raise TypeError(f"{who}() got an unexpected keyword argument {next(iter(rest))!r}")
    return replace(base, **values)
