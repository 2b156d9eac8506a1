"""``ckpt-surgeon fold-bias SOURCE -o OUT``."""
from __future__ import annotations

import click

from .paths import WritePath
from .render import FORMATS, check_report_path, emit, epsilon_option, open_kwargs, source_options


def surgery_output_options(fn):
    """Options shared by the surgery commands (-o is the checkpoint written, not the report)."""
    fn = click.option("--report", "report_path", type=WritePath(dir_okay=False), default=None,
                      help="Also write the report (in --format) to FILE, atomically; an existing FILE needs "
                           "--force.")(fn)
    fn = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                      help="Report format (json is the stable contract).")(fn)
    fn = click.option("--dry-run", is_flag=True, help="Plan and report only; write nothing.")(fn)
    fn = click.option("--check", type=click.Choice(["auto", "full", "sampled"]), default="auto", show_default=True,
                      help="Reread after writing: every copied byte (full), three 64 KiB windows per tensor "
                           "(sampled), or full up to 1 GiB (auto).")(fn)
    fn = click.option("--force", is_flag=True, help="Replace an existing output, atomically (an input is never "
                                                    "replaced).")(fn)
    fn = click.option("-o", "--output", "--out", "out", required=True, type=WritePath(),
                      help="Write the model to OUT: a folder (sharded like the source), a .safetensors file, or a "
                           ".gguf for a GGUF source (--out: the older spelling).")(fn)
    return fn


def run_plan(ckpt, plan, out, *, force, check, dry_run, fmt, report_path, title, progress=None):
    from ..surgery.plan import execute

    if dry_run:
        emit(plan, fmt, report_path, title=f"{title} (dry run: nothing written)", force=force)
        if fmt != "table" or report_path:
            click.echo("dry run: nothing written", err=True)     # the table's summary says it already
        return None
    result = execute(ckpt, plan, out, force=force, check=check, progress=progress)
    emit(result, fmt, report_path, title=title, force=force)
    click.echo(f"wrote {result.out}", err=True)
    return result


@click.command("fold-bias")
@click.argument("source")
@click.option("--k", "k", is_flag=True, help="Remove the exactly redundant part of every key bias (all of it without "
                                             "rotary embeddings); full RoPE is refused unless --approximate.")
@click.option("--v", "v", is_flag=True, help="Fold the value bias into the output-projection bias (b_o' = b_o + W_o "
                                             "b_v, exact); refused without an output bias (Qwen2).")
@click.option("--approximate", is_flag=True, help="Under RoPE: also remove rotary pairs whose summed bound on the "
                                                  "attention-logit change stays <= --max-logit-change.")
@click.option("--max-logit-change", type=float, default=None, metavar="X",
              help="With --approximate: the budget per layer and kv head, in attention-logit units (after 1/sqrt(d)).")
@click.option("--context", type=int, default=None, metavar="L",
              help="Context window L (positions) that the rotary analysis and its bounds assume (default: the "
                   "config's max positions).")
@epsilon_option("With --approximate: ")
@click.option("--pairs", type=click.Choice(["near", "any"]), default="near", show_default=True,
              help="With --approximate: only near-redundant pairs, or any pair that fits the budget.")
@click.option("--center", is_flag=True, help="Subtract the mean of every residual-writing bias: exact when every "
                                             "reader of the residual stream is a LayerNorm; refused otherwise.")
@click.option("--center-weights", is_flag=True, help="--center, and the column means of every residual-writing weight "
                                                     "too (TransformerLens' center_writing_weights).")
@click.option("--delete", is_flag=True, help="Drop the folded biases instead of zeroing them, where a config switch "
                                             "covers them all (set to false).")
@click.option("--tower", default=None, metavar="NAME",
              help="Fold only this attention stack ('text' for the main one; see inspect's tower rows); default: "
                   "every stack where the fold is exact.")
@surgery_output_options
@source_options
def command(source, k, v, approximate, max_logit_change, context, epsilon, pairs, center, center_weights, delete, tower,
            out, force, check, dry_run, fmt, report_path, allow_pickle, revision, hub_file, allow_full_download, progress):
    """Remove the attention biases of SOURCE that do not change the model, and write OUT.

    The key bias is exactly redundant without rotary embeddings (softmax ignores q·b_k, a constant over the
    keys) and in the unrotated dims under partial rotary; under full RoPE only rotary pairs within a bound go
    (--approximate).  The value bias folds exactly into the output bias; in LayerNorm models --center removes
    the mean of residual-writing biases.  Folded biases are zeroed (--delete drops them).  OUT is written
    atomically, untouched tensors byte for byte; anything not removable is refused with the analyzer's numbers.

    \b
    Examples:
      ckpt-surgeon fold-bias ./gpt2 -o ./gpt2-folded --k --v
      ckpt-surgeon fold-bias ./Qwen2.5-7B -o ./q --k --approximate --max-logit-change 0.01 --context 32768
      ckpt-surgeon fold-bias model.gguf -o folded.gguf --k
      ckpt-surgeon fold-bias ./all-MiniLM-L6-v2 -o ./centered --center-weights

    Docs: docs/fold-bias.md.
    """
    from ..checkpoint import open_checkpoint
    from ..surgery.fold import plan_fold_bias

    from ..surgery.plan import plan_while_copying

    check_report_path(report_path, force, (source,))
    with open_checkpoint(source, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress)) as ck:
        def make():
            return plan_fold_bias(ck, k=k, v=v, approximate=approximate, max_logit_change=max_logit_change,
                                  context=context, delete=delete, epsilon=epsilon, pairs=pairs, center=center,
                                  center_weights=center_weights, tower=tower)
        if dry_run:
            run_plan(ck, make(), out, force=force, check=check, dry_run=True, fmt=fmt, report_path=report_path,
                     title="ckpt-surgeon fold-bias", progress=progress)
            return
        # --approximate reads every W_q for its bound: the writer copies the shards meanwhile
        result = plan_while_copying(ck, out, make, force=force, check=check, early=approximate and not delete,
                                    progress=progress)
        emit(result, fmt, report_path, title="ckpt-surgeon fold-bias", force=force)
        click.echo(f"wrote {result.out}", err=True)
