"""``ckpt-surgeon kv-equalize SOURCE -o OUT --cache-type-k T [--cache-type-v T]``."""
from __future__ import annotations

import click

from .cmd_fold_bias import surgery_output_options
from .render import check_report_path, emit, open_kwargs, source_options

_TURN = click.option(
    "--turn/--no-turn", "turn", default=True, show_default=True,
    help="Also turn the bias-dominated rotary pairs of q and k by a fixed angle (exact: 2-D rotations commute with "
         "RoPE), chosen so the rotated bias spreads evenly over the cache blocks; not with --calibrate or a per-head "
         "q/k norm.")
_SCALES = click.option(
    "--scales", "scales", type=click.Choice(["pow2", "continuous"]), default=None,
    help="pow2 (default): every scale a power of two, so the rescaled weights are exact in their own dtype (only the "
         "exponent moves) and fast to write; continuous: any positive scale (computed in float64, rounded once; the "
         "default with --calibrate).")
_MIN_GAIN = click.option(
    "--min-gain", "min_gain", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.10, show_default=True,
    metavar="F",
    help="A layer whose predicted K (or V) error falls by less than this fraction keeps its weights (the prediction "
         "cannot resolve smaller gains; measured, they were rounding noise either way); 0: every layer takes the "
         "optimizer's choice.  Not with --calibrate.")


@click.command("kv-equalize")
@click.argument("source")
@click.option("--cache-type-k", "cache_type_k", default="q4_0", show_default=True, metavar="TYPE",
              help="The K cache type to equalize for: q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (llama.cpp) or fp8_e4m3 "
                   "(vLLM); a comma list optimises for several.")
@click.option("--cache-type-v", "cache_type_v", default=None, metavar="TYPE",
              help="Also rescale the value dims (and the W_o columns by the inverse) for this V cache type; "
                   "without it the values are untouched.")
@click.option("--context", type=int, default=None, metavar="L",
              help="Positions the prediction samples the rotated bias over (default: min(max positions, 4096)).")
@click.option("--calibrate", is_flag=True,
              help="Choose the pair scales on the measured attention error of real prompts: the model runs in "
                   "transformers, its post-RoPE Q and K go through the cache type's own ggml kernels, and each "
                   "pair's scale is searched from the static choice (slower: seconds to minutes per layer).")
@click.option("--prompts", "prompts_file", default=None, metavar="FILE",
              help="--calibrate on these prompts (JSON list of strings, or one per line); default: the built-in set.")
@click.option("--max-tokens", type=int, default=256, show_default=True, metavar="N",
              help="--calibrate: cut each prompt to N tokens.")
@click.option("--rows", type=int, default=64, show_default=True, metavar="R",
              help="--calibrate: query rows kept per prompt (evenly spaced; every key is kept).")
@click.option("--attn-rot/--no-attn-rot", "attn_rot", default=None,
              help="Predict (and with --calibrate measure) Q, K and V as llama.cpp does when it Hadamard-rotates "
                   "them before a quantized cache (head_dim a multiple of 64).  Default: as llama.cpp would in this "
                   "environment (its LLAMA_ATTN_ROT_DISABLE=1 turns the rotation off).")
@_TURN
@_SCALES
@_MIN_GAIN
@surgery_output_options
@source_options
def command(source, cache_type_k, cache_type_v, context, calibrate, prompts_file, max_tokens, rows, attn_rot, turn,
            scales, min_gain, out, force, check, dry_run, fmt, report_path, allow_pickle, revision, hub_file,
            allow_full_download, progress):
    """Rescale q/k rotary pairs and value dims of SOURCE so a quantized KV cache hurts less; exact.

    Rotary pair j of every query head in a kv group is multiplied by alpha_j and the same pair of the key by
    1/alpha_j (a scalar on a rotation plane commutes with the rotation, so every attention logit is unchanged),
    and the pairs a key bias dominates are turned by a fixed angle in q and k alike (2-D rotations commute); OUT
    is written atomically, the source untouched; with --cache-type-v each value dim is multiplied by m_i and the
    matching W_o columns by 1/m_i. The scales minimise `analyze --kv-cache`'s prediction (Q's rounding,
    llama.cpp's rotation included), or with --calibrate the measured attention-row KL of prompts; a layer
    predicted less than --min-gain better is left as it is; the table: per layer before and after.

    \b
    Examples:
      ckpt-surgeon kv-equalize ./Qwen2.5-7B -o ./q-eq --cache-type-k q4_0
      ckpt-surgeon kv-equalize model.gguf -o eq.gguf --cache-type-k q8_0 --cache-type-v q8_0
      ckpt-surgeon kv-equalize ./Qwen2.5-7B -o ./q-eq --cache-type-k q4_0 --calibrate --max-tokens 128
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
