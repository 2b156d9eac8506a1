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
              help="Hub sources: bytes of tensor data that may be fetched (smallest tensors first; 0 = headers "
                   "only). Default: headers plus the biases and norms (1-D tensors).")
@click.option("--full", is_flag=True, help="Hub sources: read every tensor (local sources are always read in full).")
@source_options
@output_options
def command(a, b, max_bytes, full, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output,
            force):
    """Compare checkpoints A and B tensor by tensor.

    A and B are any sources (HF folder, .safetensors, .gguf, Hub repo id), mixed freely.
    A GGUF compared with a non-GGUF source has its names mapped to HF names and its
    tensors un-permuted / transposed back as the GGUF -> HF converter does, so a GGUF is
    compared with the model it was converted from.

    Each tensor is identical, changed, dtype_changed, shape_changed, only_in_a, only_in_b
    or not_compared (left out by the Hub byte budget).  Bytes are compared in streamed
    chunks first: identical bytes are never decoded.  Differing tensors get max |Δ|, the
    relative Frobenius norm ‖B − A‖/‖A‖ and the cosine (float64).  A per-layer summary
    and a one-line verdict follow: identical, same weights re-encoded (another dtype or
    quantization), same architecture with N tensors changed, looks like a fine-tune
    (most tensors changed by a small relative amount) or unrelated.

    Hub sources are read by HTTP range: by default headers plus the 1-D tensors (biases,
    norms); --max-bytes N allows N bytes of tensor data, --full reads everything.

    --format table shows only what differs; json / csv / markdown list every tensor.

    Exit codes: 0 identical, 1 the checkpoints differ, 2 bad input.
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
