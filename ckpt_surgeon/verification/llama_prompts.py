"""Prompt mode in llama.cpp: ``verify A.gguf B.gguf`` runs both GGUF files in llama.cpp itself (llama-cpp-python).

A pair of GGUF files is what llama.cpp deploys, and running it there is both the honest runtime and the fast one
(issue 50 item 7: the tour's 135M GGUF pair took 7-8 minutes through transformers in float32 on a loaded 2-core
machine, its weights converted to temporary folders first).  ``runtime="auto"`` (the default) chooses llama.cpp
for a pair of ``.gguf`` files when llama-cpp-python is installed and the run asks nothing only transformers does
(:func:`choose`); ``"transformers"`` keeps the conversion path, ``"llama.cpp"`` insists.

The same comparison as the transformers path, on llama.cpp's float32 logits: the prompts tokenized once by the
reference's own vocabulary (``llama_tokenize`` with its BOS rule, special tokens parsed, as transformers'
tokenizers parse them), the candidate's vocabulary checked to give the same ids; each prompt evaluated from an
empty cache with the logits of every position (``logits_all``), then ``max_new_tokens`` greedy tokens (arg-max of
the last logits, the token fed back), stopping after a token the reference's vocabulary calls end-of-generation
(``llama_vocab_is_eog``), as transformers' ``generate`` stops after EOS.  K and V are cached in float32, so that
the two runs differ by the models alone (llama.cpp's default f16 cache rounds both).  Threads: the idle cores
(:func:`ckpt_surgeon.formats.quant.dequant.default_threads`).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import numpy as np

from ..errors import CkptError, ConfigError
from .metrics import common_width, compare_outputs, first_difference
from .report import PromptResult, VerifyReport, aggregate, judge

RUNTIMES = ("auto", "transformers", "llama.cpp")
KV_CACHE = "f32"


def _only_transformers(o) -> list[str]:
    """The options of ``o`` that only the transformers path runs."""
    pl = o.placement
    given = {"--tokenizer": o.feed.tokenizer is not None, "--stream": bool(pl.stream), "--sequential": o.sequential,
             "--device-map": o.device_map is not None, "--localize": o.localize, "--memory-budget":
             pl.memory_budget is not None, "--dtype": pl.dtype != "float32", "--device cuda": pl.device == "cuda",
             "--revision": o.revision is not None or o.candidate_revision is not None}
    return [k for k, v in given.items() if v]


def choose(reference, candidate, o) -> tuple[str, str | None]:
    """``(runtime, note)``: where the pair runs, and why when ``auto`` did not choose llama.cpp for GGUF files."""
    runtime = o.runtime
    if runtime not in RUNTIMES:
        raise CkptError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if runtime == "transformers":
        return runtime, None
    ggufs = all(os.fspath(x).endswith(".gguf") and os.path.isfile(os.fspath(x)) for x in (reference, candidate))
    blockers = _only_transformers(o)
    if runtime == "llama.cpp":
        if not ggufs:
            raise CkptError("--runtime llama.cpp in prompt mode runs two .gguf files (an HF side runs in "
                            "transformers: --runtime transformers, or convert it first)")
        if blockers:
            raise CkptError(f"--runtime llama.cpp does not combine with {', '.join(blockers)} (transformers only)")
        return runtime, None
    if not ggufs:
        return "transformers", None
    if blockers:
        return "transformers", f"GGUF pair run in transformers, not llama.cpp: {', '.join(blockers)} asked for it"
    if importlib.util.find_spec("llama_cpp") is None:
        return "transformers", ("GGUF pair run in transformers: llama-cpp-python is not installed (pip install "
                                "'ckpt-surgeon[llama]' runs it in llama.cpp, minutes faster)")
    from .llama_build import build_problem
    problem = build_problem()
    if problem:
        return "transformers", f"GGUF pair run in transformers: {problem}"
    kinds = {_kind(x) for x in (reference, candidate)}
    if kinds != {"causal-lm"}:
        return "transformers", (f"GGUF pair run in transformers: llama.cpp's prompt mode compares causal LMs, this "
                                f"is a {'/'.join(sorted(kinds))}")
    return "llama.cpp", None


def _kind(path) -> str:
    from ..arch.gguf_config import config_from_gguf
    from ..checkpoint import open_checkpoint
    from .kinds import model_kind
    with open_checkpoint(os.fspath(path)) as ck:
        return model_kind(config_from_gguf(ck.metadata, ck.tensors, path=os.fspath(path)), path=os.fspath(path)).name


class _Side:
    """One GGUF in llama.cpp, its facts read from the validated header."""

    def __init__(self, given: str, role: str):
        from ..arch.gguf_config import config_from_gguf
        from ..checkpoint import open_checkpoint
        from .loading import storage_precision
        self.given, self.role = given, role
        with open_checkpoint(given) as ck:
            self.storage = storage_precision(i.dtype for i in ck.tensors.values())
            cfg = config_from_gguf(ck.metadata, ck.tensors, path=given)
        self.architecture = str((cfg.get("architectures") or [cfg.get("model_type") or "?"])[0])
        self.context = cfg.get("max_position_embeddings")
        self.llm = None

    def open(self, n_ctx: int):
        from .corpus import open_llama
        self.llm = open_llama(self.given, ctx=n_ctx, kv_cache=KV_CACHE)
        return self.llm

    def vocab(self):
        from .corpus import open_llama
        return open_llama(self.given, ctx=8, vocab_only=True)

    def close(self):
        if self.llm is not None:
            self.llm.close()
            self.llm = None


def _tokenize(llm, prompts) -> list[list[int]]:
    """Each prompt as ``common_tokenize(ctx, text, add_special=true, parse_special=true)``: BOS when the vocabulary
    adds one, special tokens in the text parsed (transformers' tokenizers parse them too)."""
    return [[int(t) for t in llm.tokenize(p.encode("utf-8"), add_bos=True, special=True)] for p in prompts]


def _prompt_ids(ref: _Side, cand: _Side, prompts, token_ids, max_new: int, notes: list,
                judged: str | None = None) -> list[list[int]]:
    """The ids per prompt: given, or the reference vocabulary's; the candidate's vocabulary must agree (unless
    ``judged`` says why not: the tokenizer section reports it, and both are fed the reference's ids), and every
    prompt fits the reference's context with its greedy tokens."""
    rv, cv = ref.vocab(), cand.vocab()
    try:
        n_vocab = rv.n_vocab()
        if token_ids is not None:
            ids = [list(t) for t in token_ids]
            for i, t in enumerate(ids):
                if max(t) >= n_vocab:
                    raise ConfigError(f"token ids entry {i} holds id {max(t)}, beyond the model's vocabulary "
                                      f"({n_vocab} tokens)", path=ref.given)
            notes.append("prompts given as token ids; no tokenizer was used to encode them")
        else:
            ids = _tokenize(rv, prompts)
            same = True
            for i, (a, b) in enumerate(zip(ids, _tokenize(cv, prompts))):
                j = first_difference(a, b)
                if j is not None and judged:
                    notes.append(f"{cand.given}: its vocabulary encodes prompt {i} otherwise (token {j}): both models "
                                 f"are fed the reference's ids ({judged})")
                    same = False
                    break
                if j is not None:
                    raise ConfigError(
                        f"tokenizer encodes prompt {i} ({prompts[i][:30]!r}) differently from the reference's (token "
                        f"{j}: candidate id {b[j] if j < len(b) else 'end'}, reference id "
                        f"{a[j] if j < len(a) else 'end'}); the outputs would not be comparable", path=cand.given,
                        hint="give the candidate the reference's vocabulary")
            notes.append("prompts tokenized by the reference's own vocabulary in llama.cpp (BOS as it adds it, "
                         "special tokens parsed)" + ("; the candidate's gives the same ids" if same else ""))
    finally:
        rv.close()
        cv.close()
    from .tokens import cut_to_context
    return cut_to_context(ids, ref.context if isinstance(ref.context, int) and ref.context > 0 else None, max_new,
                          notes)


def _greedy(llm, ids, max_new: int, is_eog, tick) -> tuple[np.ndarray, tuple]:
    """The logits of every prompt position (float32 ``[T, vocab]``) and ``max_new`` greedy tokens (the last one an
    end-of-generation token when one is reached first)."""
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    tick()
    cont: list[int] = []
    nxt = int(np.argmax(llm.scores[len(ids) - 1]))
    while len(cont) < max_new:
        cont.append(nxt)
        tick()
        if is_eog(nxt) or len(cont) == max_new:
            break
        llm.eval([nxt])
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return logits, tuple(cont)


def compare_llama(reference, candidate, o, prompts, token_ids, t0: float, notes: list, *,
                  tokenizer=None) -> VerifyReport:
    """Both GGUFs of the pair in llama.cpp, compared prompt by prompt as the transformers path compares them.
    ``tokenizer``: the tokenizer section's record (:mod:`.tokenizer_check`): its findings fail the run, and a
    candidate vocabulary that encodes the prompts otherwise is then judged there (both fed the reference's ids)."""
    from .tokenizer_check import own_judged
    import llama_cpp

    from ..progress import counter
    from .kinds import KINDS
    from .requantized import pick_thresholds

    kind = KINDS["causal-lm"]
    ref, cand = _Side(os.fspath(reference), "reference"), _Side(os.fspath(candidate), "candidate")
    max_new = o.feed.max_new_tokens
    thr = pick_thresholds(o.criteria, "float32", _Stored(ref), _Stored(cand), notes)
    ids = _prompt_ids(ref, cand, prompts, token_ids, max_new, notes, own_judged(o, tokenizer))
    n_ctx = max(len(t) for t in ids) + max_new + 1
    results = []
    try:
        r_llm, c_llm = ref.open(n_ctx), cand.open(n_ctx)
        vocab = llama_cpp.llama_model_get_vocab(r_llm.model)
        is_eog = lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t))  # noqa: E731  (the reference's stop tokens)
        total = 2 * sum(1 + max_new for _ in ids)
        with counter(o.placement.progress, total=total, desc="llama.cpp: prompt tokens, both models",
                     unit="tok") as bar:
            for i, t in enumerate(ids):
                r_out, r_cont = _greedy(r_llm, t, max_new, is_eog, bar.tick)
                c_out, c_cont = _greedy(c_llm, t, max_new, is_eog, bar.tick)
                bar.tick(2 * max_new - len(r_cont) - len(c_cont))      # continuations that stopped early: the rest
                r_out, c_out = common_width(r_out, c_out, None, notes, distribution=True)
                gen = {}
                if max_new:
                    detok = lambda c: r_llm.detokenize(list(c)).decode("utf-8", errors="replace")  # noqa: E731
                    gen = dict(reference_continuation=r_cont, candidate_continuation=c_cont,
                               reference_text=detok(r_cont), candidate_text=detok(c_cont),
                               first_greedy_diff=first_difference(r_cont, c_cont), generated=True)
                results.append(PromptResult(index=i, text=prompts[i], tokens=len(t),
                                            comparison=compare_outputs(r_out, c_out, distribution=True), **gen))
    finally:
        ref.close()
        cand.close()
    from ..formats.quant.dequant import default_threads
    notes.append(f"llama.cpp: both GGUFs run in llama.cpp (llama-cpp-python {llama_cpp.__version__}, "
                 f"{default_threads()} thread(s), the idle cores), K/V cached in {KV_CACHE}; llama.cpp computes with "
                 "the weights' own types (a quantized weight's dot products take activations rounded to 8 bits), the "
                 "logits in float32 (--runtime transformers: both converted and run in transformers instead)")
    metrics = aggregate(results, kind)
    failures = tuple(judge(metrics, thr, kind, results)) + (tokenizer.findings if tokenizer is not None else ())
    notes += list(tokenizer.notes) if tokenizer is not None else []
    env = {"llama_cpp_python": llama_cpp.__version__, "python": sys.version.split()[0],
           "threads": default_threads()}
    extra = {"tokenizer": tokenizer} if tokenizer is not None else {}
    return VerifyReport(
        reference=os.fspath(reference), candidate=os.fspath(candidate), kind=kind.name, output=kind.output,
        architectures=(ref.architecture, cand.architecture), storage_dtypes=(ref.storage, cand.storage),
        device="cpu", dtype="float32", mode="llama.cpp", max_new_tokens=max_new, thresholds=thr, metrics=metrics,
        prompts=tuple(results), passed=not failures, failures=failures, notes=tuple(dict.fromkeys(notes)),
        warnings=(), elapsed_s=time.perf_counter() - t0, environment=env, **extra)


class _Stored:
    """What :func:`.requantized.pick_thresholds` reads of a model: the path given and its storage precision."""

    def __init__(self, side: _Side):
        self.given, self.storage_dtype = side.given, side.storage
