"""``ckpt-surgeon diff A B``."""
from __future__ import annotations

import click

from .render import byte_progress, check_report_path, emit, open_kwargs, output_options, source_options


class _TableView:
    """The human table: the summary, the per-layer counts, then only the tensors that differ."""

    def __init__(self, report):
        self.report = report
        self.notes = report.notes
        self.warnings = report.warnings

    def rows(self):
        return self.report.rows(changed_only=True)

    def summary_items(self):
        items = list(self.report.summary_items())
        for lr in self.report.layers:
            diffs = {k: v for k, v in lr.counts.items() if k != "identical"}
            if diffs:
                where = "global" if lr.layer is None else f"layer {lr.layer}"
                figs = f"; max ‖Δ‖/‖A‖ {lr.max_rel_fro:.3g}" if lr.max_rel_fro is not None else ""
                items.append((where, ", ".join(f"{v} {k}" for k, v in diffs.items()) + figs))
        return items


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--max-bytes", type=click.IntRange(min=0), default=None,
              help="Hub sources: tensor bytes that may be fetched (smallest first; 0 = headers only).  Default: "
                   "headers and the 1-D tensors.")
@click.option("--full", is_flag=True, help="Hub sources: read every tensor (local sources are always read in full).")
@source_options
@output_options
def command(a, b, max_bytes, full, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output,
            force):
    """Compare checkpoints A and B tensor by tensor, and say what the difference looks like.

    A and B are any sources, mixed freely (a GGUF against its HF folder is compared under HF names, its
    tensors un-permuted as the converter does; for an architecture the registry does not map, gathered back
    by the inverse of llama.cpp's converter class, learned on the folder's config).  Stored bytes are compared first, so identical tensors are
    never decoded; differing ones get max |Δ|, ‖B − A‖/‖A‖ and the cosine.  The verdict: identical, same
    weights re-encoded, N tensors changed, a fine-tune, or unrelated.  Exit 0 identical, 1 different.

    \b
    Examples:
      ckpt-surgeon diff ./base ./base-folded
      ckpt-surgeon diff ./Qwen2.5-0.5B qwen.q8_0.gguf
      ckpt-surgeon diff owner/base owner/finetune --max-bytes 0

    Docs: docs/diff.md.
    """
    from ..analysis.diff import diff_checkpoints
    from ..checkpoint import open_checkpoint

    check_report_path(output, force, (a, b))
    kw = open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress)
    with open_checkpoint(a, **kw) as ca, open_checkpoint(b, **kw) as cb:
        total = sum(i.nbytes for i in ca.tensors.values()) + sum(i.nbytes for i in cb.tensors.values())
        bar, tick = byte_progress(progress, total, "diff")
        try:
            report = diff_checkpoints(ca, cb, max_bytes=max_bytes, full=full, progress=tick)
        finally:
            if bar is not None:
                bar.close()
    emit(_TableView(report) if fmt == "table" else report, fmt, output, title="ckpt-surgeon diff", force=force)
    if not report.identical:
        click.get_current_context().exit(1)
