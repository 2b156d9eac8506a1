"""``ckpt-surgeon qkv fuse|split SOURCE -o OUT``."""
from __future__ import annotations

import click

from .cmd_fold_bias import run_plan, surgery_output_options
from .render import check_report_path, open_kwargs, source_options

_LAYOUT_HELP = ("Fused layout: concat ([Q; K; V] rows), per_head ([h, 3, d]), grouped ([kv, q_per_kv + 2, d]) or "
                "conv1d (GPT-2).  Default: the architecture's own.")


@click.group("qkv")
def command():
    """Fuse separate q/k/v projections into one tensor, or split a fused one, bit for bit.

    Both directions move stored bit patterns (whole rows), so split then fuse gives the input back; weights and
    biases, GQA, GGUF files and quantized checkpoints whose scheme keeps one scale per output.

    \b
    Examples:
      ckpt-surgeon qkv split ./Phi-3-mini -o ./phi3-as-llama
      ckpt-surgeon qkv fuse model.gguf -o fused.gguf

    Docs: docs/qkv.md.
    """


@command.command("split")
@click.argument("source")
@click.option("--layout", type=click.Choice(["concat", "per_head", "grouped", "conv1d"]), default=None, help=_LAYOUT_HELP)
@click.option("--to", "to", default=None, metavar="ARCH",
              help="Architecture to write: the registry's rewrite (Phi-3 -> llama, or mistral with a sliding window); "
                   "'same' keeps the source's.")
@surgery_output_options
@source_options
def split(source, layout, to, out, force, check, dry_run, fmt, report_path, allow_pickle, revision, hub_file,
          allow_full_download, progress):
    """Split each layer's fused qkv projection of SOURCE into q/k/v and write OUT.

    A Phi-3 is written as a LlamaForCausalLM (MistralForCausalLM with a sliding window) that transformers
    loads with the same logits; other fused families split beside the fused module's place.

    \b
    Examples:
      ckpt-surgeon qkv split ./Phi-3-mini -o ./phi3-as-llama
      ckpt-surgeon qkv split fused.gguf -o split.gguf

    Docs: docs/qkv.md.
    """
    from ..checkpoint import open_checkpoint
    from ..surgery.qkv import plan_qkv_split

    check_report_path(report_path, force, (source,))
    with open_checkpoint(source, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress)) as ck:
        plan = plan_qkv_split(ck, layout=layout, to=to)
        run_plan(ck, plan, out, force=force, check=check, dry_run=dry_run, fmt=fmt, report_path=report_path,
                 progress=progress, title="ckpt-surgeon qkv split")


@command.command("fuse")
@click.argument("source")
@click.option("--layout", type=click.Choice(["concat", "per_head", "grouped", "conv1d"]), default=None, help=_LAYOUT_HELP)
@surgery_output_options
@source_options
def fuse(source, layout, out, force, check, dry_run, fmt, report_path, allow_pickle, revision, hub_file,
         allow_full_download, progress):
    """Fuse each layer's separate q/k/v projections of SOURCE into one tensor and write OUT.

    For Qwen2/Llama-style models the fused tensor is self_attn.qkv_proj (rows [Q; K; V]); the
    config is kept and the layout recorded in the safetensors metadata, so `qkv split` restores
    the original bit for bit.  transformers does not load the fused folder (its q/k/v_proj would
    be initialised at random; `lint` says so): it is for tools that take one fused tensor, as
    GGUF's attn_qkv, which llama.cpp loads for these architectures (fuse a GGUF for that).

    \b
    Example:
      ckpt-surgeon qkv fuse ./Qwen2.5-0.5B -o ./qwen-fused
    """
    from ..checkpoint import open_checkpoint
    from ..surgery.qkv import plan_qkv_fuse

    check_report_path(report_path, force, (source,))
    with open_checkpoint(source, **open_kwargs(allow_pickle, revision, hub_file, allow_full_download, progress)) as ck:
        plan = plan_qkv_fuse(ck, layout=layout)
        run_plan(ck, plan, out, force=force, check=check, dry_run=dry_run, fmt=fmt, report_path=report_path,
                 progress=progress, title="ckpt-surgeon qkv fuse")
