"""``ckpt-surgeon lint SOURCE``."""
from __future__ import annotations

import click

from .render import byte_progress, check_report_path, emit, open_kwargs, output_options, source_options


@click.command("lint")
@click.argument("source")
@click.option("--scan", is_flag=True,
              help="Also stream every tensor once for NaN/Inf and all-zero tensors (reads the whole file).")
@source_options
@output_options
def command(source, scan, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force):
    """Check SOURCE for the silent failures: files that load without an error and compute garbage.

    Tensors that do not load into the class config.json names, config against shapes, head_dim, q/k/v biases
    dropped or against the config's switch, a wrong rotary layout of Q/K rows, a RoPE GGUF without
    rope.freq_base, tied embeddings, vocabulary and special-token ids, mixed dtypes, quantization scales, key
    biases that hurt a quantized KV cache; --scan adds NaN/Inf and all-zero tensors.  Each finding names the
    file, the tensor and the fix.  Exit 0 no error finding, 1 an error finding, 2 unreadable input.

    \b
    Examples:
      ckpt-surgeon lint model.Q4_K_M.gguf
      ckpt-surgeon lint ./merged --scan
      ckpt-surgeon lint owner/name --format json -o lint.json

    Docs: docs/lint.md.
    """
    from ..analysis.lint import lint_checkpoint
    from ..checkpoint import open_checkpoint

    check_report_path(output, force, (source,))
    with open_checkpoint(source, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress)) as ck:
        bar, tick = byte_progress(progress, sum(i.nbytes for i in ck.tensors.values()) if scan else 0, "lint --scan")
        try:
            report = lint_checkpoint(ck, scan=scan, progress=tick)
        finally:
            if bar is not None:
                bar.close()
    emit(report, fmt, output, title="ckpt-surgeon lint", force=force)
    if not report.passed:
        click.get_current_context().exit(1)
