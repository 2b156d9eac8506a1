"""``ckpt-surgeon inspect SOURCE``."""
from __future__ import annotations

import click

from .render import check_report_path, emit, open_kwargs, output_options, source_options


@click.command("inspect")
@click.argument("source")
@source_options
@output_options
@click.option("--allow-truncated", is_flag=True,
              help="Exit 0 for a GGUF truncated in its tensor data (only the structure is wanted); by default it is "
                   "exit code 2.  A truncated safetensors file is refused either way (one line, exit code 2).")
@click.option("--context", type=click.IntRange(1, 1 << 40), default=1000, show_default=True,
              help="Memory figures: tokens per sequence the KV cache holds.  Beyond the model's max positions "
                   "is a note, not an error.")
@click.option("--batch", type=click.IntRange(1, 1 << 20), default=1, show_default=True,
              help="Memory figures: sequences held at once (KV cache and recurrent state scale with it).")
@click.option("--cache-type", "cache_type", default=None, metavar="TYPE",
              help="Memory figures: KV-cache type of K and V: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
                   "q5_1 (llama.cpp's) or fp8 (e4m3: 1 byte + a per-tensor scale).  Default: f16 and q8_0 "
                   "side by side.")
@click.option("--cache-type-k", default=None, metavar="TYPE", help="K only (overrides --cache-type for K).")
@click.option("--cache-type-v", default=None, metavar="TYPE", help="V only (overrides --cache-type for V).")
@click.option("--devices", type=click.IntRange(1, 1 << 16), default=1, show_default=True,
              help="Memory figures: weights + KV per device of an N-way tensor-parallel split.")
def command(source, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force,
            allow_truncated, **memory):
    """Summarise SOURCE and its per-layer attention q/k/v biases.

    Reads headers and the bias vectors only (no model is instantiated).  Shows
    architecture, heads / kv heads / head_dim, position encoding, norm
    placement, q/k-norm, parameter count, dtype mix, and per layer which of the
    q/k/v biases exist (separately or inside a fused qkv) with their L2 norm and
    max |x|.  --format json gives the stable contract documented in the README.

    Memory (summary, JSON "memory"): weight bytes per dtype; KV cache for --context tokens
    x --batch sequences at f16 and q8_0 or --cache-type(-k/-v) (sliding layers: at most the
    window; MLA: the latent; linear-attention / Mamba / short-conv: a fixed f32 state per
    sequence); --devices N: weights + KV per device of an N-way tensor-parallel split.

    Split GGUFs (llama.cpp gguf-split: name-00001-of-00003.gguf ...): any part
    opens the whole set (the other parts are found beside it by name, or in the
    same Hub repo); a missing or inconsistent part is an error (exit code 2).

    Truncated GGUF files: the structure is still shown (the JSON lists every
    tensor past the end under "missing"), then exit code 2 names the missing
    bytes and tensors; --allow-truncated exits 0 instead.  A safetensors file
    whose data is shorter than its header promises is refused, as the
    safetensors library refuses it (one line naming the missing bytes and the
    first tensor cut, exit code 2, with or without --allow-truncated).
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
