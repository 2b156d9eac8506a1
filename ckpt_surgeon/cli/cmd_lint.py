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
    """Check SOURCE for the silent failures that load fine and produce garbage.

    Checks (docs/lint.md has the full list): every tensor loads into the class config.json
    names and every weight of it is in the file (transformers' own key rules: a missing weight
    is initialised at random, an extra tensor dropped); config.json present; a GGUF's tensor
    data laid out as ggml's loader requires; config / GGUF metadata against tensor shapes;
    head_dim (config head_dim, GGUF attention.key_length) against the q/k rows; q/k/v biases
    dropped in some layers or contradicting the config's attention-bias switch; a RoPE GGUF
    without rope.freq_base (llama.cpp silently uses 10000); Q rows paired as the wrong rotary
    layout (llama-arch GGUF: interleaved; HF: rotate_half); tie_word_embeddings against lm_head;
    vocab size against the embedding rows; special-token ids outside the vocabulary; mixed
    weight dtypes; a key bias far from zero in a model without RoPE.  --scan adds NaN/Inf and
    all-zero tensors.

    Each finding has a severity (error / warning / info), the file, the tensor and the fix.
    Hub repos are read by range; checks that need whole weight matrices are listed as
    skipped there.

    Exit codes: 0 no error finding (warnings allowed), 1 at least one error finding, 2 the
    source cannot be read.
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
