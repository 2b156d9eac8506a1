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
              help="Prompts to run: a JSON list of strings, or one prompt per line. Default: a built-in set of 8 "
                   "(English, code, digits, Chinese, a chat turn, emoji, a repetition).")
@click.option("--token-ids", "token_ids_file", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Feed these token ids instead of prompts: a JSON list of ids (one prompt) or a list of such "
                   "lists. Needs no tokenizer at all (models that have none, weights-only checkpoints).")
@click.option("--tokenizer", "tokenizer", type=ReadPathOrId(), default=None, metavar="PATH_OR_ID",
              help="Tokenize the prompts with this tokenizer instead of the REFERENCE's files: a folder, a "
                   "tokenizer.json file or a Hub id (anything AutoTokenizer takes). For weights-only checkpoints.")
@click.option("--max-new-tokens", type=click.IntRange(min=0), default=32, show_default=True,
              help="Greedy tokens generated per prompt by causal LMs (do_sample=False, the reference's stop tokens "
                   "for both); 0 skips generation.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where both models run; auto = CUDA when torch.cuda.is_available().")
@click.option("--device-map", type=click.Choice(["auto"]), default=None,
              help="Spread each model over several GPUs and CPU RAM with accelerate (models larger than one GPU); "
                   "the models are then loaded one after the other. Overrides --device. Models larger than the "
                   "machine's RAM: --stream.")
@click.option("--max-memory", "max_memory", multiple=True, metavar="DEVICE=SIZE",
              help="With --device-map auto: accelerate's limit for one device, e.g. --max-memory 0=20GiB "
                   "--max-memory cpu=60GiB (repeatable; passed through).")
@click.option("--dtype", type=click.Choice(_DTYPES), default="float32", show_default=True,
              help="Compute dtype both models are loaded in (--stream and the torchrun pipeline: float32, float64 or "
                   "bfloat16; bfloat16 streams the layers in bf16 and applies the head in float32).")
@click.option("--sequential", is_flag=True,
              help="Load the models one after the other, comparing against the reference's saved float32 outputs "
                   "(automatic when both do not fit in free RAM/VRAM at once).")
@click.option("--stream", is_flag=True,
              help="Run both models one decoder layer at a time (transformers' own layer classes; weights read "
                   "per layer, GGUF dequantized per tensor): memory is one layer plus the activations, not a model. "
                   "Reports the per-layer divergence too (as --localize); no greedy generation. Automatic when one "
                   "model does not fit in free memory; a run that would not fit even so is refused.")
@click.option("--memory-budget", "memory_budget", default=None, metavar="SIZE",
              help="Plan the run as if only SIZE (e.g. 8GiB) were free: parallel, sequential or streamed is chosen "
                   "to fit it. Default: the free RAM (VRAM with --device cuda).")
@click.option("--thresholds", "thresholds_dtype", type=click.Choice(_THRESHOLD_ROWS), default=None,
              help="Judge by this dtype's default thresholds. Default: the coarsest of --dtype and the two "
                   "checkpoints' storage dtypes (a bf16 copy of an fp32 model is judged by the bf16 row).")
@click.option("--max-logit-diff", type=float, default=None,
              help="Fail when max |Δlogit| / logit scale exceeds this (scale = the reference's largest |logit|; "
                   "for encoders the last hidden state). Defaults: float32 1e-4, float16 1.5e-2, bfloat16 0.1.")
@click.option("--max-kl", type=float, default=None,
              help="Fail when the largest per-position KL(ref||cand) (nats, float64) exceeds this. Defaults: "
                   "float32 1e-6, float16 5e-3, bfloat16 0.15.")
@click.option("--min-top1", type=float, default=None,
              help="Fail when the fraction of positions with the same arg-max token is below this. Defaults: "
                   "float32 0.99, float16 0.95, bfloat16 0.9.")
@click.option("--require-greedy/--no-require-greedy", default=None,
              help="Fail when greedy continuations differ. Default: required for float32, reported only for "
                   "float16/bfloat16 (a near-tie flips them legitimately).")
@click.option("--tmp-dir", type=ScratchDir(), default=None,
              help="Directory for temporary files: GGUF inputs converted to HF folders and quantized HF checkpoints "
                   "dequantized into dense ones (float32: ~4 bytes per parameter) and, in sequential mode, the reference's saved outputs. Default: the system temp "
                   "dir ($TMPDIR). Removed at the end.")
@click.option("--revision", default=None, metavar="REV",
              help="Hub revision (branch, tag or commit) of REFERENCE when it is a Hub id. Default: the repo's "
                   "default branch.")
@click.option("--candidate-revision", default=None, metavar="REV",
              help="Hub revision of CANDIDATE when it is a Hub id (compare two revisions of one repo: "
                   "verify ID ID --candidate-revision REV).")
@click.option("--localize", is_flag=True,
              help="Also find where the models diverge: hooks on every decoder layer's output and its attention / "
                   "MLP sub-outputs, per layer max and relative |Δ hidden|, the first layer over --localize-threshold "
                   "(a second pass over the prompts; with --sequential only per-layer outputs are saved).")
@click.option("--localize-threshold", type=float, default=None,
              help="Relative |Δ hidden| (‖cand − ref‖/‖ref‖) that counts as diverged. Defaults: "
                   "float32 1e-4, float16 1e-2, bfloat16 5e-2.")
@click.option("--corpus", "corpus", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: score CANDIDATE against REFERENCE over this UTF-8 text, tokenized with the "
                   "reference's tokenizer, as llama-perplexity --kl-divergence does: KL, PPL ratio, Δp, same top. "
                   "'builtin': the corpus shipped with ckpt-surgeon (128 KB of its own docs, offline; ./builtin for "
                   "a file of that name); wikitext-2's wiki.test.raw for figures comparable with llama.cpp's.")
@click.option("--corpus-ids", "corpus_ids", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode over token ids instead of text (a JSON list of ids).")
@click.option("--ctx", type=click.IntRange(min=4), default=512, show_default=True,
              help="Fidelity mode: tokens per chunk; the corpus is cut into len // ctx chunks (at least 2 × ctx tokens "
                   "needed), each run from an empty context, BOS replacing its first token when the tokenizer adds one.")
@click.option("--chunks", type=click.IntRange(min=1), default=None, metavar="N",
              help="Fidelity mode: score at most the first N chunks (llama-perplexity's --chunks). Default: all.")
@click.option("--score", type=click.Choice(["half", "all"]), default="half", show_default=True,
              help="Fidelity mode: positions scored per chunk: half = llama.cpp's ctx/2 … ctx−2 (each predicting the "
                   "next token), all = 0 … ctx−2.")
@click.option("--save-reference", "save_reference", type=WritePath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: also save the reference run to FILE (atomically; replaced only with --force) so that "
                   "later runs skip it with --reference FILE.")
@click.option("--reference-format", type=click.Choice(["ckpt-surgeon", "llama.cpp"]), default="ckpt-surgeon",
              show_default=True,
              help="Format --save-reference writes: ckpt-surgeon (safetensors with the raw float32 logits: statistics "
                   "identical to a live run) or llama.cpp (its --kl-divergence-base uint16 file, ~1e-4 nats floor).")
@click.option("--reference", "reference_file", type=ReadPath(dir_okay=False), default=None, metavar="FILE",
              help="Fidelity mode: a saved reference (ours, or llama-perplexity's --kl-divergence-base file) replaces "
                   "the reference run. Then REFERENCE may be left out (verify --reference FILE CANDIDATE ...).")
@click.option("--runtime", type=click.Choice(["auto", "transformers", "llama.cpp"]), default="auto", show_default=True,
              help="Where the models run. Prompt mode: auto runs a pair of .gguf files in llama.cpp (llama-cpp-python, "
                   "the runtime people deploy with; K/V cached in f32) when it is installed and no transformers-only "
                   "option is given, anything else in transformers (a .gguf converted for it). Fidelity mode: auto = "
                   "transformers; llama.cpp runs every .gguf side in llama.cpp.")
@click.option("--kv-cache", default="f16", show_default=True, metavar="TYPE",
              help="llama.cpp's cache type for K and V of every side run in llama.cpp (--runtime llama.cpp): f32, f16, "
                   "bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1. f16 is llama.cpp's default and rounds K and V: f32 "
                   "for exactness checks.")
@click.option("--cache-type-k", "cache_type_k", default=None, metavar="TYPE",
              help="The candidate's K cache type in llama.cpp (llama.cpp's names, as --kv-cache); the reference keeps "
                   "--kv-cache. Implies --runtime llama.cpp; CANDIDATE may be left out (the REFERENCE .gguf again). "
                   "A quantized cache is a fidelity run, not an exactness run: judged only by the gates given (none: "
                   "a measurement, exit 0; --thresholds ROW: that row's defaults), as --cache-sweep judges its rows.")
@click.option("--cache-type-v", "cache_type_v", default=None, metavar="TYPE",
              help="The candidate's V cache type in llama.cpp (a quantized V needs flash attention: see --flash-attn).")
@click.option("--cache-sweep", "cache_sweep", default=None, metavar="K[/V],...",
              help="Run the candidate .gguf in llama.cpp under each of these caches (K/V, or one type for both: "
                   "q8_0,q4_0/f16,q4_0) against one reference run (the same model with --kv-cache, or REFERENCE, or "
                   "--reference FILE) and report one table row per cache: mean KLD, Δp, RMS Δp, same top (± SE), "
                   "PPL ratio. Gates are judged only when given (or --thresholds ROW), as for --cache-type-k.")
@click.option("--flash-attn", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="llama.cpp's flash attention for every side run in llama.cpp; auto = on when a V cache is "
                   "quantized (llama.cpp refuses a quantized V without it), else off.")
@click.option("--max-mean-kl", type=float, default=None,
              help="Fidelity gate: fail when the mean KL(ref‖cand) over the corpus exceeds this. Default: the "
                   "thresholds row's --max-kl (a quantized KV cache: not judged unless given).")
@click.option("--max-p99-kl", type=float, default=None,
              help="Fidelity gate: fail when the 99th percentile of per-token KL exceeds this. Default: the row's --max-kl.")
@click.option("--min-same-top", type=float, default=None,
              help="Fidelity gate: fail when the fraction of tokens with the same arg-max is below this. Default: the "
                   "row's --min-top1.")
@click.option("--max-ln-ppl-ratio", type=float, default=None,
              help="Fidelity gate, one-sided: fail when ln(PPL(cand)/PPL(ref)) exceeds this (a better candidate never "
                   "fails). Default: not judged.")
@dist_mode_option
@progress_option
@output_options
def command(reference, candidate, fmt, output, force, **given):
    """Run REFERENCE and CANDIDATE on the same prompts and say whether they agree.

    A pair of .gguf files runs in llama.cpp (llama-cpp-python) by default (--runtime auto; a note says when
    it stays in transformers, and why). Otherwise both are loaded with transformers (causal LMs with
    AutoModelForCausalLM, masked LMs with
    AutoModelForMaskedLM, bare encoders such as BERT / sentence-transformers with AutoModel,
    compared on the last hidden state; a vision/audio-language model with its own class, on the
    text path and on each vision / audio tower run alone on seeded inputs; an encoder-decoder such as
    Whisper or BART with its own class, on the decoder's logits for the prompt's ids, its encoder reading
    the same ids or seeded audio features, a speech encoder also run alone). Each is a local Hugging Face folder (config.json +
    safetensors), a single .safetensors file with config.json beside it, a .gguf file
    (converted to a temporary folder by ckpt-surgeon's own converter), a quantized HF
    checkpoint (GPTQ, AWQ, compressed-tensors, FP8, bitsandbytes, MLX ...: run as the
    unquantized model from its weights dequantized by ckpt-surgeon, activations not
    quantized; a note says so), or a Hub repo id
    (owner/name; --revision / --candidate-revision pick a branch, tag or commit): the files
    the model needs are downloaded with huggingface_hub into the normal Hugging Face cache
    (HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE honoured; reused by later runs), then loaded
    from there.

    Prompts are tokenized with the REFERENCE's tokenizer, or with --tokenizer PATH_OR_ID (for
    weights-only checkpoints); a model that ships a tokenizer encoding any prompt to different
    ids is an error. --token-ids FILE feeds ids directly and needs no tokenizer at all. Models load with
    local_files_only=True and eager attention (SDPA may pick different fused kernels per shape,
    eager makes identical weights give identical CPU logits), under torch.no_grad with fixed
    seeds.

    Reported: max |Δlogit| (absolute and relative to the reference's logit scale), mean and
    max KL(ref||cand) from float64 log-softmax, top-1 agreement over all positions, and per
    prompt whether the greedy continuations are identical (first differing token).

    Memory: both models at once when they fit, else one after the other, else layer by layer
    (--stream); a run that would exceed the free memory even streamed is refused in one line
    saying what it needs, never started.

    Fidelity mode (--corpus FILE or --corpus-ids FILE): the corpus is cut into --ctx chunks and
    scored as llama-perplexity --kl-divergence scores it; reported in llama.cpp's three blocks
    (PPL of both, ln PPL ratio ± paired SE and correlation; KL mean ± SE, max and percentiles;
    Δp percentiles, RMS Δp, same top ± SE), all in float64 over the full vocabulary.
    --format markdown gives the blocks as a table for model cards. Gates: --max-mean-kl,
    --max-p99-kl, --min-same-top, --max-ln-ppl-ratio. --save-reference / --reference compute
    the reference once (also in llama.cpp's --kl-divergence-base format, both ways);
    --runtime llama.cpp judges a GGUF in llama.cpp itself; --cache-type-k / --cache-type-v give the
    candidate a quantized KV cache there (a fidelity run, not an exactness run) and --cache-sweep
    q8_0/f16,q4_0/f16 scores one GGUF under several caches in one table. See docs/verify.md.

    Exit codes: 0 agree within the thresholds, 1 mismatch (the report is printed first, then
    one line naming the failed criteria), 2 bad input.
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
                         localize_threshold=g["localize_threshold"], runtime=g["runtime"])
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
