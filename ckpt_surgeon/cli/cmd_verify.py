"""``ckpt-surgeon verify REFERENCE CANDIDATE``."""
from __future__ import annotations

import click

from ..errors import CkptError
from .paths import ReadPath, ReadPathOrId, ScratchDir, WritePath
from .render import check_report_path, emit, output_options, progress_option
from .verify_dist import dist_mode_option, distributed

_DTYPES = ("float32", "float64", "bfloat16", "float16")
_THRESHOLD_ROWS = ("float32", "bfloat16", "float16")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _size(value: str, what: str) -> int:
    """``"12GiB"`` / ``"500MB"`` / ``"1000000"`` -> bytes (a usage error otherwise)."""
    import re
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", value or "")
    if not m or m.group(2).lower() not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise CkptError(f"{what} {value!r} is not a size such as 12GiB, 500MB or 1000000")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _max_memory(specs) -> dict | None:
    """``("0=20GiB", "cpu=60GiB")`` -> accelerate's ``max_memory`` dict (GPU indices as ints)."""
    if not specs:
        return None
    out = {}
    for spec in specs:
        key, sep, size = spec.partition("=")
        if not sep or not key.strip():
            raise CkptError(f"--max-memory {spec!r} is not DEVICE=SIZE (e.g. 0=20GiB or cpu=60GiB)")
        key = key.strip()
        out[int(key) if key.isdigit() else key] = _size(size, "--max-memory")
    return out


@click.command("verify")
@click.argument("reference")
@click.argument("candidate", required=False)
@click.option("--prompts", "prompts_file", type=ReadPath(dir_okay=False), default=None,
              help="Prompts: a JSON list of strings, or one prompt per line (default: the built-in set).")
@click.option("--token-ids", "token_ids_file", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Feed these token ids instead of prompts (a JSON list of ids, or of id lists): no tokenizer "
                   "needed.")
@click.option("--tokenizer", "tokenizer", type=ReadPathOrId(), default=None, metavar="PATH_OR_ID",
              help="Tokenize the prompts with this (a folder, tokenizer.json or Hub id) instead of REFERENCE's own "
                   "tokenizer.")
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=32, show_default=True,
              help="Greedy tokens generated per prompt by causal LMs; 0 skips generation.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where both models run (auto: CUDA when available).")
@click.option("--device-map", type=click.Choice(["auto"]), default=None,
              help="Spread each model over every GPU and CPU RAM with accelerate (one model at a time); overrides "
                   "--device.")
@click.option("--max-memory", "max_memory", multiple=True, metavar="DEVICE=SIZE",
              help="With --device-map auto: accelerate's limit for one device, e.g. 0=20GiB or cpu=60GiB "
                   "(repeatable).")
@click.option("--dtype", type=click.Choice(_DTYPES), default="float32", show_default=True,
              help="The compute dtype of both models (--stream and torchrun pipelines: float32, float64 or bfloat16).")
@click.option("--sequential", is_flag=True,
              help="Load the models one after the other, against the reference's saved outputs (automatic when both "
                   "do not fit).")
@click.option("--stream", is_flag=True,
              help="Run both models one decoder layer at a time (memory: one layer; per-layer divergence; no greedy); "
                   "automatic when needed.")
@click.option("--memory-budget", "memory_budget", default=None, metavar="SIZE",
              help="Plan the run as if only SIZE (e.g. 8GiB) were free (default: the free RAM, or VRAM with --device "
                   "cuda).")
@click.option("--thresholds", "thresholds_dtype", type=click.Choice(_THRESHOLD_ROWS), default=None,
              help="Judge by this dtype's default row (default: the coarsest of --dtype and both storage dtypes).")
@click.option("--max-logit-diff", type=float, default=None,
              help="Fail when max |Δlogit| / the reference's largest |logit| exceeds X (rows: float32 1e-4, float16 "
                   "1.5e-2, bfloat16 0.1).")
@click.option("--max-kl", type=float, default=None,
              help="Fail when the largest per-position KL(ref‖cand) exceeds X nats (rows: 1e-6, 5e-3, 0.15).")
@click.option("--min-top1", type=float, default=None,
              help="Fail when the share of positions with the same arg-max is below X (rows: 0.99, 0.95, 0.9).")
@click.option("--require-greedy/--no-require-greedy", default=None,
              help="Fail when greedy continuations differ (default: only for the float32 row).")
@click.option("--tmp-dir", type=ScratchDir(), default=None,
              help="Folder for temporary files (GGUF inputs converted, saved reference outputs); default: $TMPDIR; "
                   "emptied at the end.")
@click.option("--revision", default=None, metavar="REV",
              help="Hub revision (branch, tag or commit) of REFERENCE when it is a Hub id.")
@click.option("--candidate-revision", default=None, metavar="REV",
              help="Hub revision of CANDIDATE when it is a Hub id (compare two revisions of one repo).")
@click.option("--localize", is_flag=True,
              help="Also find where the models diverge: per layer, attention and MLP, the first point over "
                   "--localize-threshold.")
@click.option("--localize-threshold", type=float, default=None,
              help="Relative |Δ hidden| that counts as diverged (defaults: float32 1e-4, float16 1e-2, bfloat16 "
                   "5e-2).")
@click.option("--tokenizer-check/--no-tokenizer-check", "tokenizer_check", default=True, show_default=True,
              help="When both sides carry a tokenizer, also compare them (llama.cpp's for a GGUF) and their chat "
                   "templates; a difference fails the run. --no-tokenizer-check skips it.")
@click.option("--corpus", "corpus", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: score CANDIDATE over this UTF-8 text as llama-perplexity --kl-divergence does (KL, "
                   "PPL ratio, Δp, same top); 'builtin': the corpus shipped with ckpt-surgeon (offline).")
@click.option("--corpus-ids", "corpus_ids", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode over token ids instead of text (a JSON list of ids).")
@click.option("--ctx", type=click.IntRange(min=4), default=512, show_default=True,
              help="Fidelity mode: tokens per chunk (the corpus needs at least 2 × ctx tokens).")
@click.option("--chunks", type=click.IntRange(min=1), default=None, metavar="N",
              help="Fidelity mode: score at most the first N chunks (llama-perplexity's --chunks).")
@click.option("--score", type=click.Choice(["half", "all"]), default="half", show_default=True,
              help="Fidelity mode: positions scored per chunk: half = llama.cpp's ctx/2 … ctx−2, all = 0 … ctx−2.")
@click.option("--save-reference", "save_reference", type=WritePath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: also save the reference run to FILE, for later runs' --reference FILE.")
@click.option("--reference-format", type=click.Choice(["ckpt-surgeon", "llama.cpp"]), default="ckpt-surgeon",
              show_default=True,
              help="What --save-reference writes: ckpt-surgeon (raw float32 logits) or llama.cpp (its "
                   "--kl-divergence-base file).")
@click.option("--reference", "reference_file", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: a saved reference (ours, or llama-perplexity's --kl-divergence-base file) replaces "
                   "the reference run.")
@click.option("--runtime", type=click.Choice(["auto", "transformers", "llama.cpp"]), default="auto", show_default=True,
              help="Where the models run: auto runs a pair of .gguf files in llama.cpp in prompt mode, else "
                   "transformers; llama.cpp runs every .gguf side there in fidelity mode.")
@click.option("--kv-cache", default="f16", show_default=True, metavar="TYPE",
              help="llama.cpp's K and V cache type for every side run there (f16 by default; f32 for exactness "
                   "checks).")
@click.option("--cache-type-k", "cache_type_k", default=None, metavar="TYPE",
              help="The candidate's K cache type in llama.cpp (implies --runtime llama.cpp; CANDIDATE may be left "
                   "out): a fidelity run, judged only by the gates given.")
@click.option("--cache-type-v", "cache_type_v", default=None, metavar="TYPE",
              help="The candidate's V cache type in llama.cpp (a quantized V needs flash attention: --flash-attn).")
@click.option("--cache-sweep", "cache_sweep", default=None, metavar="K[/V],...",
              help="Run the candidate .gguf under each of these caches (K/V, or one type: q8_0,q4_0/f16) against one "
                   "reference run: a row each, judged only by the gates given.")
@click.option("--flash-attn", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="llama.cpp's flash attention (auto: on when a V cache is quantized, which needs it).")
@click.option("--max-mean-kl", type=float, default=None,
              help="Fidelity gate: fail when the mean KL(ref‖cand) exceeds X (default: the row's --max-kl; a quantized "
                   "KV cache: not judged unless given).")
@click.option("--max-p99-kl", type=float, default=None,
              help="Fidelity gate: fail when the 99th percentile of per-token KL exceeds X (default: the row's "
                   "--max-kl).")
@click.option("--min-same-top", type=float, default=None,
              help="Fidelity gate: fail when the share of tokens with the same arg-max is below X (default: the row's "
                   "--min-top1).")
@click.option("--max-ln-ppl-ratio", type=float, default=None,
              help="Fidelity gate, one-sided: fail when ln(PPL(cand)/PPL(ref)) exceeds X (default: not judged).")
@dist_mode_option
@progress_option
@output_options
def command(reference, candidate, fmt, output, force, **given):
    """Run REFERENCE and CANDIDATE on the same inputs and say whether they agree.

    Exactness mode: both run on the same prompts (any source: folders, GGUF, quantized checkpoints, Hub
    ids), in llama.cpp for a pair of .gguf files (--runtime auto), else in transformers, compared on max
    |Δlogit|, KL, top-1 and greedy continuations, judged by the coarsest dtype's row; when both carry a
    tokenizer, their tokenizers and chat templates too; --localize names the first layer that diverges;
    models larger than memory run layer by layer.  Fidelity mode (--corpus): llama-perplexity's
    KL-divergence statistics, in transformers or llama.cpp (--runtime llama.cpp), with quantized KV caches
    (--cache-type-k, --cache-sweep); under torchrun, over GPUs and machines.  Exit 0 agree, 1 mismatch
    (the report first), 2 bad input.

    \b
    Examples:
      ckpt-surgeon verify ./gpt2 ./gpt2-folded
      ckpt-surgeon verify ./model ./model.q8_0.gguf --corpus wiki.test.raw --runtime llama.cpp
      ckpt-surgeon verify model.gguf --corpus wiki.test.raw --cache-sweep q8_0/f16,q4_0/f16
      torchrun --nproc-per-node 8 -m ckpt_surgeon verify ref/ cand/ --corpus wiki.txt -o report.json

    Docs: docs/verify.md.
    """
    params = {"reference": reference, "candidate": candidate, "fmt": fmt, "output": output, "force": force, **given}
    if distributed(command.callback, params, _size):      # launched by torchrun (cli/verify_dist.py)
        return
    run = _fidelity if given["corpus"] or given["corpus_ids"] else _exactness
    report, title, candidate = run(reference, candidate, given, output, force)
    emit(report, fmt, output, title=title, force=force)
    if not report.passed:
        from ..errors import VerificationFailed
        raise VerificationFailed("mismatch: " + "; ".join(report.failures), path=candidate)


def _placement(g: dict, *, budget: bool = True):
    """The options both modes share, as :class:`~ckpt_surgeon.verification.options.Placement`."""
    from ..verification.options import Placement
    return Placement(device=g["device"], dtype=g["dtype"], stream=g["stream"] or None,
                     memory_budget=_size(g["memory_budget"], "--memory-budget") if budget and g["memory_budget"]
                     else None, tmp_dir=g["tmp_dir"], progress=g["progress"])


def _exactness(reference, candidate, g: dict, output, force):
    """REFERENCE and CANDIDATE on the same prompts, the options as one VerifyOptions record ->
    (report, title, candidate)."""
    from ..verification.core import verify
    from ..verification.options import Criteria, Feed, VerifyOptions
    from ..verification.prompts import load_prompts, load_token_ids

    if candidate is None:
        raise click.UsageError("Missing argument 'CANDIDATE'.")
    if (g["save_reference"] or g["reference_file"] or g["cache_sweep"] or g["cache_type_k"] or g["cache_type_v"]
            or g["chunks"]):
        raise click.UsageError("--save-reference, --reference, --chunks and the cache options need --corpus FILE or "
                               "--corpus-ids FILE")
    check_report_path(output, force, (reference, candidate))
    if g["prompts_file"] and g["token_ids_file"]:
        raise click.UsageError("give --prompts or --token-ids, not both")
    feed = Feed(prompts=load_prompts(g["prompts_file"]) if g["prompts_file"] else None,
                token_ids=load_token_ids(g["token_ids_file"]) if g["token_ids_file"] else None,
                tokenizer=g["tokenizer"], max_new_tokens=g["max_new_tokens"])
    criteria = Criteria(g["thresholds_dtype"], g["max_logit_diff"], g["max_kl"], g["min_top1"], g["require_greedy"])
    placement = _placement(g)
    opts = VerifyOptions(feed, placement, criteria, sequential=g["sequential"] or None, device_map=g["device_map"],
                         max_memory=_max_memory(g["max_memory"]), revision=g["revision"],
                         candidate_revision=g["candidate_revision"], localize=g["localize"],
                         localize_threshold=g["localize_threshold"], tokenizer_check=g["tokenizer_check"],
                         runtime=g["runtime"])
    return verify(reference, candidate, opts), "ckpt-surgeon verify", candidate


def _fidelity(reference, candidate, g: dict, output, force):
    """Fidelity mode (--corpus / --corpus-ids), one row or a cache sweep, the options as one
    CorpusOptions record -> (report, title, candidate)."""
    if g["prompts_file"] or g["token_ids_file"] or g["localize"] or g["device_map"] or g["sequential"]:
        raise click.UsageError("--corpus / --corpus-ids do not combine with --prompts, --token-ids, --localize, "
                               "--device-map or --sequential")
    if candidate is None:
        if g["reference_file"] is not None:
            reference, candidate = None, reference
        elif g["cache_sweep"] or g["cache_type_k"] or g["cache_type_v"]:
            candidate = reference          # the same GGUF under another cache
        else:
            raise click.UsageError("give REFERENCE and CANDIDATE (or --reference FILE and CANDIDATE)")
    check_report_path(output, force, (reference, candidate, g["corpus"], g["corpus_ids"], g["reference_file"]))
    if g["cache_sweep"]:
        from ..verification.cache_sweep import verify_cache_sweep
        if g["cache_type_k"] or g["cache_type_v"] or g["save_reference"] or g["stream"]:
            raise click.UsageError("--cache-sweep does not combine with --cache-type-k/-v, --save-reference or "
                                   "--stream")
        report = verify_cache_sweep(reference, candidate, cache_sweep=g["cache_sweep"],
                                    options=_corpus_options(g, force, budget=False))
        return report, "ckpt-surgeon verify --cache-sweep", candidate
    from ..verification.corpus import verify_corpus
    report = verify_corpus(reference, candidate, _corpus_options(g, force))
    return report, "ckpt-surgeon verify --corpus", candidate


def _corpus_options(g: dict, force: bool, *, budget: bool = True):
    """The fidelity options as one :class:`~ckpt_surgeon.verification.options.CorpusOptions`."""
    from ..verification.options import CorpusOptions, GateLimits, LlamaOptions, SavedReference
    return CorpusOptions(
        corpus=g["corpus"], corpus_ids=g["corpus_ids"], ctx=g["ctx"], score=g["score"], chunks=g["chunks"],
        tokenizer=g["tokenizer"],
        placement=_placement(g, budget=budget),
        gates=GateLimits(g["thresholds_dtype"], g["max_mean_kl"], g["max_p99_kl"], g["min_same_top"],
                         g["max_ln_ppl_ratio"]),
        llama=LlamaOptions("transformers" if g["runtime"] == "auto" else g["runtime"], g["kv_cache"], g["cache_type_k"],
                           g["cache_type_v"], g["flash_attn"]),
        saved=SavedReference(g["reference_file"], g["save_reference"], g["reference_format"], replace=force))
