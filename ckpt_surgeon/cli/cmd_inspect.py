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
def command(source, allow_pickle, revision, hub_file, allow_full_download, progress, fmt, output, force,
            allow_truncated):
    """Summarise SOURCE and its per-layer attention q/k/v biases.

    Reads headers and the bias vectors only (no model is instantiated).  Shows
    architecture, heads / kv heads / head_dim, position encoding, norm
    placement, q/k-norm, parameter count, dtype mix, and per layer which of the
    q/k/v biases exist (separately or inside a fused qkv) with their L2 norm and
    max |x|.  --format json gives the stable contract documented in the README.

    Memory figures (summary and JSON "memory"): weight bytes per stored dtype, and
    KV-cache bytes per 1,000 tokens at f16 and q8_0 (layers x kv heads x head_dim x 2;
    sliding-window layers hold at most their window, MLA layers their latent).

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

    check_report_path(output, force, (source,))
    report = inspect(source, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress))
    emit(report, fmt, output, title="ckpt-surgeon inspect", force=force)
    if report.missing and not allow_truncated:
        names = [t for t, _ in report.missing]
        raise TruncatedError(
            f"file is truncated: {report.missing_bytes:,} bytes missing; {len(names)} tensor(s) lie past the end of "
            f"the file ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''})",
            path=report.source, missing_bytes=report.missing_bytes, tensors=tuple(names),
            hint="--allow-truncated exits 0 with the structure only")
