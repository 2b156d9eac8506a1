"""``ckpt-surgeon kv-equalize SOURCE -o OUT --cache-type-k T [--cache-type-v T]``."""
from __future__ import annotations

import click

from .cmd_fold_bias import surgery_output_options
from .render import check_report_path, emit, open_kwargs, source_options

_TURN = click.option(
    "--turn/--no-turn", "turn", default=True, show_default=True,
    help="Also turn the rotary pairs a key bias dominates by a fixed angle in q and k (exact); not with --calibrate.")
_SCALES = click.option(
    "--scales", "scales", type=click.Choice(["pow2", "continuous"]), default=None,
    help="pow2 (default): powers of two, exact in the weights' own dtype; continuous: any scale, rounded once (the "
         "default with --calibrate).")
_MIN_GAIN = click.option(
    "--min-gain", "min_gain", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.10, show_default=True,
    metavar="F",
    help="A layer whose predicted K (or V) error falls by less than F keeps its weights; 0: every layer takes the "
         "optimizer's choice.")


@click.command("kv-equalize")
@click.argument("source")
@click.option("--cache-type-k", "cache_type_k", default="q4_0", show_default=True, metavar="TYPE",
              help="The K cache type to equalize for: q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 or fp8_e4m3 (a comma list "
                   "for several).")
@click.option("--cache-type-v", "cache_type_v", default=None, metavar="TYPE",
              help="Also rescale the value dims (W_o's columns inversely) for this V cache type; default: values "
                   "untouched.")
@click.option("--context", type=int, default=None, metavar="L",
              help="Positions the prediction samples the rotated bias over (default: min(max positions, 4096)).")
@click.option("--calibrate", is_flag=True,
              help="Choose the scales on the measured attention error of prompts (transformers and ggml's kernels; "
                   "minutes, not seconds).")
@click.option("--prompts", "prompts_file", default=None, metavar="FILE",
              help="With --calibrate: Prompts: a JSON list of strings, or one prompt per line (default: the built-in "
                   "set).")
@click.option("--max-tokens", type=int, default=256, show_default=True, metavar="N",
              help="With --calibrate: cut each prompt to N tokens.")
@click.option("--rows", type=int, default=64, show_default=True, metavar="R",
              help="With --calibrate: query rows kept per prompt (evenly spaced; every key kept).")
@click.option("--attn-rot/--no-attn-rot", "attn_rot", default=None,
              help="Model llama.cpp's Hadamard rotation of Q, K and V before a quantized cache (default: as llama.cpp "
                   "would here).")
@_TURN
@_SCALES
@_MIN_GAIN
@surgery_output_options
@source_options
def command(source, cache_type_k, cache_type_v, context, calibrate, prompts_file, max_tokens, rows, attn_rot, turn,
            scales, min_gain, out, force, check, dry_run, fmt, report_path, allow_pickle, revision, hub_file,
            allow_full_download, progress):
    """Rescale and turn the q/k rotary pairs (and value dims) of SOURCE so that a quantized KV cache hurts less,
    every attention logit unchanged, and write OUT.

    Rotary pair j of every query head is multiplied by alpha_j and the same pair of its key by 1/alpha_j (a
    scalar commutes with a rotation); the pairs a key bias dominates are turned by the same angle in q and k.
    The scales minimise analyze --kv-cache's prediction for the cache types given (or, --calibrate, the measured
    error of prompts); a layer predicted less than --min-gain better keeps its weights.

    \b
    Examples:
      ckpt-surgeon kv-equalize ./Qwen2.5-7B -o ./q-eq --cache-type-k q4_0
      ckpt-surgeon kv-equalize model.gguf -o eq.gguf --cache-type-k q8_0 --cache-type-v q8_0
      ckpt-surgeon kv-equalize ./Qwen2.5-7B -o ./q-eq --cache-type-k q4_0 --calibrate --max-tokens 128

    Docs: docs/kv-equalize.md, docs/kv-cache.md.
    """
    from ..analysis.prompts import load_prompts
    from ..surgery.kv_equalize import kv_equalize
    check_report_path(report_path, force, (source,))
    report = kv_equalize(source, out, cache_type_k=cache_type_k, cache_type_v=cache_type_v, context=context,
                         force=force, check=check, dry_run=dry_run, calibrate=calibrate, attn_rot=attn_rot, turn=turn,
                         scales=scales, min_gain=min_gain, prompts=load_prompts(prompts_file) if prompts_file else None,
                         max_tokens=max_tokens, rows=rows,
                         **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress))
    emit(report, fmt, report_path, title="ckpt-surgeon kv-equalize" + (" (dry run: nothing written)" if dry_run else ""),
         force=force)
    if not dry_run:
        click.echo(f"wrote {report.out}", err=True)
