"""``ckpt-surgeon analyze SOURCE``."""
from __future__ import annotations

import click

from .paths import ReadPath, WriteInto
from .render import check_report_path, emit, epsilon_option, open_kwargs, output_options, source_options


@click.command("analyze")
@click.argument("source")
@click.option("--context", "context", type=int, default=None, metavar="L",
              help="Context window L (positions) that the rotary analysis and its bounds assume (default: the "
                   "config's max positions).")
@epsilon_option()
@click.option("--measure", is_flag=True,
              help="Also run the model with transformers on sample prompts and measure each removal next to its bound "
                   "(exit 1 when one exceeds it).")
@click.option("--prompts", "prompts_file", type=ReadPath(dir_okay=False), default=None,
              help="With --measure: Prompts: a JSON list of strings, or one prompt per line (default: the built-in "
                   "set).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="With --measure: where the model runs (auto: CUDA when available).")
@click.option("--dtype", type=click.Choice(["float32", "float64", "bfloat16", "float16"]), default="float32",
              show_default=True, help="With --measure: the compute dtype.")
@click.option("--max-tokens", type=int, default=None, metavar="N",
              help="With --measure: cut each prompt to N tokens (default 1024; 256 with --kv-cache).")
@click.option("--per-head", is_flag=True, help="Table: one row per layer and kv head (with --distance-profile: per "
                                               "query head).")
@click.option("--by-bias", is_flag=True, help="Table: one row per bias (q/k/v/o, MLP in and out, embeddings, head) "
                                              "with its consumer and removable share.")
@click.option("--distance-profile", "distance_profile", is_flag=True,
              help="What the q/k biases do under RoPE: the bias·bias logit f(Δ) per layer and query head, with its "
                   "summaries (JSON distance_profile).")
@click.option("--deltas", default=None, metavar="LIST|log:N",
              help="With --distance-profile: the distances, a comma list or log:N (0 and N log-spaced up to the "
                   "context; default log:48).")
@click.option("--rope-theta", "rope_theta", type=float, default=None, metavar="X",
              help="With --distance-profile: what-if, the profile under rope base X beside today's.")
@click.option("--rope-scaling", "rope_scaling", default=None, metavar="SPEC",
              help="With --distance-profile: what-if under another scaling (yarn:F, linear:F, dynamic:F, "
                   "llama3:F[,LOW,HIGH], none).")
@click.option("--skip-first", "skip_first", type=int, default=4, show_default=True, metavar="K",
              help="With --distance-profile --measure: leave out the first K tokens of each prompt (attention sinks, "
                   "BOS).")
@click.option("--plot", "plot_dir", type=WriteInto(), default=None, metavar="DIR",
              help="With --distance-profile or --kv-cache: write PNGs into DIR (needs matplotlib: the plot extra).")
@click.option("--kv-cache", "kv_cache", default=None, metavar="TYPES",
              help="Predict what a quantized KV cache does to each layer: TYPES from q8_0, q4_0, q4_1, iq4_nl, q5_0, "
                   "q5_1, fp8_e4m3 (measured too with --measure).")
@click.option("--no-attn-rot", "no_attn_rot", is_flag=True,
              help="With --kv-cache: plain blocks, without llama.cpp's Hadamard rotation of Q, K and V (default: as "
                   "llama.cpp would here).")
@source_options
@output_options
def command(source, context, epsilon, measure, prompts_file, device, dtype, max_tokens, per_head, by_bias,
            distance_profile, deltas, rope_theta, rope_scaling, skip_first, plot_dir, kv_cache, no_attn_rot,
            allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force):
    """Which attention biases of SOURCE are really redundant, per layer and kv head, with a sound bound.

    Static (no forward pass, any source): each key bias is exact (no rotary: softmax ignores it), partial
    (the unrotated dims), rope or not-removable (q/k-norm, sinks, soft-capping), with the share removable
    exactly or nearly (rotary pairs turning < epsilon over the context) and a bound on the logit change;
    value-bias folds; every bias's consumer (--by-bias).  --measure runs the model and measures each removal
    (exit 1 if a measurement exceeds its bound); --distance-profile and --kv-cache are the other views.

    \b
    Examples:
      ckpt-surgeon analyze ./all-MiniLM-L6-v2 --measure
      ckpt-surgeon analyze Qwen/Qwen2.5-7B --context 32768
      ckpt-surgeon analyze ./Qwen2.5-7B --distance-profile --rope-scaling yarn:4
      ckpt-surgeon analyze ./Qwen2.5-7B --kv-cache q8_0,q4_0

    Docs: docs/analyze.md.
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
    are put together here, above both: ``surgery.kv_effect`` (docs/architecture.md, "analyze: the KV-cache model")."""
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
