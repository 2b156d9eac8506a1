"""``ckpt-surgeon analyze SOURCE``."""
from __future__ import annotations

import click

from .paths import ReadPath, WriteInto
from .render import check_report_path, emit, epsilon_option, open_kwargs, output_options, source_options


_PROFILE_HELP = """\
\b
--distance-profile (rotary models with q/k biases; docs/analyze.md):
  f(Δ)          s·a²·Σ_j Re(z_j(b_q)·conj z_j(b_k)·e^{iΔθ_j}) + pass-through,
                the runtime's exact θ_j (rope scaling incl.) and attention
                factor a; biases and config only, no torch
  per head      f(0), g(Δ)=f(Δ)-f(0) at 1k/8k/32k/context, drop (decay >0,
                enhance <0), half-drop distances, argmax, monotone ratio,
                alignment, plateau share (θ_j·L < 1), spread <= bound
  model         first zero of Σ_j cos(Δθ_j); pairs with period > training
  --measure     mean term (bias·bias, bias·content, content·bias,
                content·content), covariance term, measured mean logit
"""


@click.command("analyze", epilog=_PROFILE_HELP)
@click.argument("source")
@click.option("--context", "context", type=int, default=None, metavar="L",
              help="Context window L in positions for the rope analysis (default: the config's max positions).")
@epsilon_option()
@click.option("--measure", is_flag=True,
              help="Also run the model with transformers on sample prompts and measure the real effect of "
                   "removing each part (needs torch + transformers; HF folders and GGUF files; quantized HF "
                   "checkpoints run as the unquantized model from their weights dequantized by ckpt-surgeon, "
                   "activations not quantized, and the report says so).")
@click.option("--prompts", "prompts_file", type=ReadPath(dir_okay=False), default=None,
              help="With --measure: prompts to use instead of the built-in set (JSON list of strings, "
                   "or one prompt per line).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="With --measure: where to run the model.")
@click.option("--dtype", type=click.Choice(["float32", "float64", "bfloat16", "float16"]), default="float32",
              show_default=True, help="With --measure: dtype to run the model in.")
@click.option("--max-tokens", type=int, default=None, metavar="N",
              help="With --measure: truncate each prompt to N tokens (default 1024, and the model's max positions; "
                   "256 with --kv-cache).")
@click.option("--per-head", is_flag=True, help="Table/CSV/Markdown: one row per layer and kv head (with "
              "--distance-profile: per layer and query head).")
@click.option("--by-bias", is_flag=True, help="Table/CSV/Markdown: one row per bias (q/k/v/o, MLP in/out, "
              "additive embeddings, head) with its consumer and exactly removable share.")
@click.option("--distance-profile", "distance_profile", is_flag=True,
              help="What the q/k biases do under RoPE: the bias·bias logit f(Δ) at each distance, per layer and "
                   "query head, with its summaries (rows: per layer, or per head with --per-head; CSV in long form; "
                   "JSON under distance_profile).  With --measure: the measured mean / covariance terms instead of "
                   "the key-bias removal measurement.")
@click.option("--deltas", default=None, metavar="LIST|log:N",
              help="With --distance-profile: the distances (comma list, or log:N for 0 plus N log-spaced ones up to "
                   "the context; default log:48).")
@click.option("--rope-theta", "rope_theta", type=float, default=None, metavar="X",
              help="With --distance-profile: what-if, the profile under rope base X beside today's.")
@click.option("--rope-scaling", "rope_scaling", default=None, metavar="SPEC",
              help="With --distance-profile: what-if under another scaling (yarn:F, linear:F, dynamic:F, "
                   "llama3:F[,LOW,HIGH], none), over the context times F.")
@click.option("--skip-first", "skip_first", type=int, default=4, show_default=True, metavar="K",
              help="With --distance-profile --measure: leave out the first K tokens of each prompt (attention "
                   "sinks / BOS).")
@click.option("--plot", "plot_dir", type=WriteInto(), default=None, metavar="DIR",
              help="With --distance-profile or --kv-cache: write PNGs into DIR (needs matplotlib: the plot extra). "
                   "--kv-cache: kv_<type>.png per cache type, the per-layer predicted (and with --measure measured) "
                   "K error before and after kv-equalize's scales for that type.")
@click.option("--kv-cache", "kv_cache", default=None, metavar="TYPES",
              help="Predict what a quantized KV cache does, per layer (per kv head with --per-head), from the "
                   "weights and biases alone: TYPES is a comma list of q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 "
                   "(llama.cpp's --cache-type-k/-v) and fp8_e4m3 (vLLM).  Columns: predicted attention-logit RMS "
                   "error (K, incl. Q's own quantization to the dot type), the bias's share of the K block "
                   "steps, the value error reaching the output (V), an 'at risk' flag and the worst layers; JSON under "
                   "kv_cache.  Fast (reads q/k/v/o of each layer once; no torch).  With --measure [--prompts F] "
                   "[--max-tokens N] [--device]: also the real Q, K, V of a float32 forward pass through ggml's "
                   "kernels, per layer the measured logit RMS error and attention-row KL and the worst layers "
                   "measured (JSON kv_cache.measured); see docs/analyze.md and docs/kv-cache.md.")
@click.option("--no-attn-rot", "no_attn_rot", is_flag=True,
              help="With --kv-cache: model (and measure) the cache without llama.cpp's Hadamard rotation of Q, K "
                   "and V (as LLAMA_ATTN_ROT_DISABLE=1 runs it).  Default: as llama.cpp would in this environment.")
@source_options
@output_options
def command(source, context, epsilon, measure, prompts_file, device, dtype, max_tokens, per_head, by_bias,
            distance_profile, deltas, rope_theta, rope_scaling, skip_first, plot_dir, kv_cache, no_attn_rot,
            allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force):
    """Which attention biases of SOURCE are really redundant, per layer and kv head.

    \b
    Static analysis (no forward pass, any source incl. GGUF and Hub repos):
      key bias class   exact (no rotary), partial (pass-through dims exact),
                       rope (every dim rotated), not-removable (q/k-norm,
                       attention sinks, logit soft-capping)
      energy split     share of ||b_k||^2 removable exactly, share in rotary
                       pairs turning < epsilon over the context (near), rest
      bound            sound max change of any attention logit beyond a per-row
                       shift when exact + near parts are removed (bound_all:
                       the whole key bias), from the weights; none where |q|
                       cannot be bounded statically (post-norm)
      value bias       foldable into the output bias (exact) or not
      query bias       norms (never removable)
      every bias       its consumer (softmax, LayerNorm / RMSNorm through the
                       residual stream, an activation, the head) and the share
                       of its energy that consumer provably ignores (LayerNorm:
                       n·mean(b)^2/|b|^2, only when every reader of the stream
                       is a LayerNorm, per the registry); --by-bias lists them

    --measure runs the model (transformers, eager attention) on built-in
    prompts (short multilingual text, code, one long document) and reports
    the measured logit change and attention total variation per layer next to
    the bound, and KL / top-1 agreement at the output.  Exit code 1 if a
    measurement ever exceeds its bound.  A quantized checkpoint (GPTQ, AWQ,
    compressed-tensors, FP8, bitsandbytes, MLX ...) runs as the unquantized
    model from its weights dequantized by ckpt-surgeon; activations are not
    quantized (the table's "quantized model" row and JSON measured.quantization
    say so, and name the runtime activation quantization a W8A8 / FP8 /
    LLM.int8 checkpoint would apply, which the measurement excludes).

    """
    from dataclasses import replace

    from ..analysis.api import analyze
    from ..errors import VerificationFailed

    check_report_path(output, force, (source, prompts_file))
    if kv_cache is not None:
        _kv_cache(source, kv_cache, context=context, per_head=per_head, measure=measure, prompts_file=prompts_file,
                  device=device, dtype=dtype, max_tokens=max_tokens, plot_dir=plot_dir, fmt=fmt, output=output,
                  force=force, bad=distance_profile or by_bias, attn_rot=False if no_attn_rot else None,
                  open_kw=open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress))
        return
    profile = _profile_options(distance_profile, deltas, rope_theta, rope_scaling, skip_first, plot_dir)
    prompts = None
    if prompts_file:
        if not measure:
            raise click.UsageError("--prompts only makes sense with --measure")
        from ..analysis.prompts import load_prompts
        prompts = load_prompts(prompts_file)
    report = analyze(source, context=context, epsilon=epsilon, measure=measure, prompts=prompts, device=device,
                     dtype=dtype, max_tokens=max_tokens, **profile,
                     **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress))
    if per_head and by_bias:
        raise click.UsageError("--per-head and --by-bias choose different rows: pass one")
    if per_head:
        report = replace(report, per_head=True)
    if by_bias:
        report = replace(report, by_bias=True)
    _plots(report, plot_dir)
    emit(report, fmt, output, title="ckpt-surgeon analyze", force=force)
    if report.measured is not None and not report.measured.all_within_bound:
        bad = [f"layer {lm.layer} {v.variant}: {v.logit:.4g} > {v.bound:.4g}" for lm in report.measured.layers
               for v in lm.variants if v.within_bound is False]
        raise VerificationFailed("a measured logit change exceeds its static bound (" + "; ".join(bad[:4]) + ")",
                                 path=report.source)


def _profile_options(distance_profile, deltas, rope_theta, rope_scaling, skip_first, plot_dir) -> dict:
    """``analyze``'s distance-profile arguments; its options need --distance-profile (checked before any work)."""
    if not distance_profile and (deltas or rope_theta is not None or rope_scaling or plot_dir):
        raise click.UsageError("--deltas, --rope-theta and --rope-scaling need --distance-profile; --plot needs "
                               "--distance-profile or --kv-cache")
    return dict(distance_profile=distance_profile, deltas=deltas, rope_theta=rope_theta, rope_scaling=rope_scaling,
                skip_first=skip_first)


def _plots(report, plot_dir) -> None:
    """``--plot DIR``: the distance profile's PNGs (matplotlib, the plot extra)."""
    if plot_dir and report.distance_profile is not None:
        from ..analysis.distance_plots import plot_profile
        written = plot_profile(report.distance_profile, plot_dir)
        click.echo(f"wrote {len(written)} plot(s) into {plot_dir}", err=True)


def _kv_cache(source, kv_cache, *, context, per_head, measure, prompts_file, device, dtype, max_tokens, plot_dir,
              fmt, output, force, bad, open_kw, attn_rot=None) -> None:
    """``--kv-cache TYPES [--measure] [--plot DIR]``: the table, and the before/after-equalizing PNGs.

    The plots compose analysis with surgery (the "after" is kv-equalize's own choice of scales), so they
    are put together here, above both: ``surgery.kv_effect`` (docs/analyze.md#kv-cache-plots)."""
    from ..analysis.api import analyze
    if bad:
        raise click.UsageError("--kv-cache is a report of its own: drop --distance-profile and --by-bias")
    if (prompts_file or max_tokens is not None) and not measure:
        raise click.UsageError("--prompts and --max-tokens only make sense with --measure")
    prompts = None
    if prompts_file:
        from ..analysis.prompts import load_prompts
        prompts = load_prompts(prompts_file)
    if plot_dir:
        from ..analysis.kv_plots import check_matplotlib
        check_matplotlib()
    report = analyze(source, context=context, kv_cache=kv_cache, per_head=per_head, measure=measure,
                     prompts=prompts, device=device, dtype=dtype, max_tokens=max_tokens, attn_rot=attn_rot, **open_kw)
    if plot_dir:
        from ..analysis.kv_plots import plot_kv_cache
        from ..surgery.kv_effect import equalize_effect
        effect = equalize_effect(source, report, context=context, prompts=prompts, device=device,
                                 max_tokens=max_tokens, **open_kw)
        written = plot_kv_cache(effect, plot_dir)
        click.echo(f"wrote {len(written)} plot(s) into {plot_dir}", err=True)
    emit(report, fmt, output, title="ckpt-surgeon analyze --kv-cache", force=force)
