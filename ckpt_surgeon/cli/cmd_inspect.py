"""``ckpt-surgeon inspect SOURCE``."""
from __future__ import annotations

import click

from .render import check_report_path, emit, open_kwargs, output_options, source_options


@click.command("inspect")
@click.argument("source")
@source_options
@output_options
@click.option("--allow-truncated", is_flag=True,
              help="Exit 0 for a GGUF truncated in its tensor data (its structure only).  A truncated safetensors "
                   "file is refused either way.")
@click.option("--context", type=click.IntRange(1, 1 << 40), default=1000, show_default=True,
              help="Memory figures: tokens per sequence the KV cache holds (beyond the model's max positions: a "
                   "note).")
@click.option("--batch", type=click.IntRange(1, 1 << 20), default=1, show_default=True,
              help="Memory figures: sequences held at once.")
@click.option("--cache-type", "cache_type", default=None, metavar="TYPE",
              help="Memory figures: the K and V cache type: llama.cpp's f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                   "q5_0, q5_1, or fp8.  Default: f16 and q8_0.")
@click.option("--cache-type-k", default=None, metavar="TYPE", help="Memory figures: the K cache type alone (overrides "
                                                                   "--cache-type).")
@click.option("--cache-type-v", default=None, metavar="TYPE", help="Memory figures: the V cache type alone (overrides "
                                                                   "--cache-type).")
@click.option("--devices", type=click.IntRange(1, 1 << 16), default=1, show_default=True,
              help="Memory figures: weights and KV cache per device of an N-way tensor-parallel split.")
def command(source, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force,
            allow_truncated, **memory):
    """Summarise SOURCE from its headers: architecture, heads, position encoding, norms, fused layout, the
    q/k/v biases of every layer (and attention stack), and the memory weights and KV cache need.

    Reads headers and bias vectors only (no model, no torch); a Hub repo by HTTP range.  Any part of a split
    GGUF opens the whole set; a truncated GGUF shows its structure, then exits 2 naming what is missing.

    \b
    Examples:
      ckpt-surgeon inspect ./Qwen2.5-7B
      ckpt-surgeon inspect Qwen/Qwen2.5-7B --format json -o report.json
      ckpt-surgeon inspect model.gguf --context 32768 --batch 4 --cache-type q8_0 --devices 2

    Docs: docs/inspect.md.
    """
    from ..analysis.inspect import inspect
    from ..errors import TruncatedError

    memory = _memory_options(**memory)
    check_report_path(output, force, (source,))
    report = inspect(source, memory, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress))
    emit(report, fmt, output, title="ckpt-surgeon inspect", force=force)
    if report.missing and not allow_truncated:
        raise TruncatedError.cut_short(report.missing_bytes, [t for t, _ in report.missing], report.source,
                                       "--allow-truncated exits 0 with the structure only")


def _memory_options(context, batch, cache_type, cache_type_k, cache_type_v, devices):
    """The MemoryOptions the memory options ask for (an unknown cache type: one line, exit code 2)."""
    from ..analysis.memory import MemoryOptions
    return MemoryOptions(context, batch, cache_type_k or cache_type, cache_type_v or cache_type, devices)
