"""``ckpt-surgeon convert SOURCE -o OUT``."""
from __future__ import annotations

import sys

import click

from .paths import ReadPath, WritePath
from .render import progress_option

from ..conversion.quant_mix import QUANT_FTYPES

def _list_architectures(ctx, _param, value):
    """``--list-architectures``: every HF architecture name, native / derived / unsupported, then exit."""
    if not value or ctx.resilient_parsing:
        return
    from ..conversion.derived import architecture_table
    rows = architecture_table()
    w = max(len(r.architecture) for r in rows)
    out = [f"{'architecture':{w}s}  {'engine':11s}  {'model_type':22s}  note"]
    out += [f"{r.architecture:{w}s}  {r.engine:11s}  {r.model_type or '-':22s}  {r.note}" for r in rows]
    counts = {e: sum(r.engine == e for r in rows) for e in ("native", "derived", "unsupported")}
    out.append(", ".join(f"{v} {k}" for k, v in counts.items()))
    click.echo("\n".join(out))
    ctx.exit(0)


DTYPE_CHOICES = ("f32", "f16", "bf16", "float32", "float16", "bfloat16") + QUANT_FTYPES


@click.command("convert")
@click.argument("source", type=ReadPath())
@click.option("--output", "-o", "--out", "out", required=True, type=WritePath(),
              help="Write the output to OUT: a folder (GGUF -> HF; a quantized HF source's dense folder) or a .gguf "
                   "file (--out: the older spelling).")
@click.option("--dtype", default=None, metavar="TYPE",
              help="Output dtype: float32 (default), bfloat16 or float16 for an HF folder; f16 (default), bf16, f32, "
                   "q8_0, or a llama.cpp file type (" + " ".join(t for t in QUANT_FTYPES if t != "q8_0") + ") for a "
                   "GGUF: llama-quantize's bytes.")
@click.option("--imatrix", type=ReadPath(exists=True, dir_okay=False), default=None,
              help="Importance matrix for a quantized --dtype: llama-imatrix's GGUF or legacy .dat (one made for "
                   "another model is refused).")
@click.option("--allow-requantize", is_flag=True,
              help="GGUF -> GGUF: let an already-quantized tensor take another type (as llama-quantize "
                   "--allow-requantize).")
@click.option("--force", is_flag=True, help="Replace an existing output, atomically (an input is never replaced).")
@click.option("--name", default=None, help="HF -> GGUF: general.name (default: the folder's name); llama.cpp keys a "
                                           "few tokenizer quirks on it.")
@click.option("--split-max-size", default=None, metavar="SIZE",
              help="Write a GGUF as llama.cpp's split set, parts of at most SIZE bytes of tensors (N, NK, NM, NG); an "
                   "HF output: its shard size.")
@click.option("--split-max-tensors", default=None, type=int, metavar="N",
              help="Write a GGUF as llama.cpp's split set of at most N tensors per part (combines with "
                   "--split-max-size).")
@click.option("--no-tensor-first-split", is_flag=True,
              help="The split set's first part holds the metadata only, the tensors from part 2 on.")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True,
              help="Report format (json is the stable contract).")
@click.option("--engine", type=click.Choice(("auto", "native", "llama.cpp")), default="auto", show_default=True,
              help="HF -> GGUF: native (the registry), llama.cpp (its converter's own class), or auto (native where "
                   "the registry has the type).")
@click.option("--list-architectures", is_flag=True, is_eager=True, expose_value=False, callback=_list_architectures,
              help="Print every HF architecture name as native, derived or unsupported (and why), then exit.")
@click.option("--mmproj", is_flag=True,
              help="HF -> GGUF of a vision / audio model: write its projector file (CLIP arch) with llama.cpp's own "
                   "projector class.")
@click.option("--config", "config", type=ReadPath(exists=True), default=None, metavar="CONFIG",
              help="GGUF -> HF of an architecture outside the registry: the original config.json (or its folder), "
                   "checked against the file.")
@click.option("--trust-remote-code", is_flag=True,
              help="Let llama.cpp's converter class run Python shipped with the model (a tokenizer module); refused "
                   "without it.")
@progress_option
def command(source, out, dtype, imatrix, allow_requantize, force, name, split_max_size, split_max_tensors,
            no_tensor_first_split, fmt, progress, engine, mmproj, config, trust_remote_code):
    """Convert SOURCE between GGUF and Hugging Face safetensors, as llama.cpp's own tools write it.

    The direction follows SOURCE: a GGUF (by its magic bytes; any part of a split set) becomes an HF folder
    transformers loads offline; an HF folder becomes the GGUF file OUT (at a llama.cpp file type such as
    q4_k_m: llama-quantize's bytes, in one pass); a GGUF with a .gguf OUT is quantized; a quantized HF folder
    (GPTQ, AWQ, auto-round, compressed-tensors, ModelOpt, FP8, bitsandbytes, MLX, MXFP4) with a folder OUT
    becomes its dense folder; to GGUF, NVFP4 / MXFP4 weights are kept in their blocks, bit for bit.  Every output is checked against the model transformers builds and written atomically;
    SOURCE is local (hf download owner/name --local-dir DIR first).

    \b
    Native, both ways: llama, mistral, qwen2, qwen3, phi3, gpt2, gemma2, gemma3, starcoder2, olmo2,
    granite, phi, gpt_neox, cohere, stablelm, bloom, falcon, qwen2_moe, qwen3_moe, olmoe, mixtral, phimoe,
    deepseek_v2, internlm2 (its remote code never run); scaled RoPE: llama3, yarn, linear, longrope.
    Any other architecture llama.cpp's converter registers: derived from its own class (and back with
    --config ORIGINAL/config.json); convert --list-architectures says which path each name takes.

    \b
    Examples:
      ckpt-surgeon convert SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2-hf
      ckpt-surgeon convert ./qwen2-folder -o qwen2.q4_k_m.gguf --dtype q4_k_m
      ckpt-surgeon convert ./qwen2-gptq-int4 -o qwen2-dense --dtype bfloat16
      ckpt-surgeon convert olmo.f32.gguf -o olmo-hf --config ./olmo-folder/config.json

    Docs: docs/convert.md.
    """
    from ..conversion import convert
    from .render import table_width, to_json, to_table

    report = convert(source, out, dtype=dtype, force=force, name=name, progress=progress, isolate=True,
                     imatrix=imatrix, allow_requantize=allow_requantize, split_max_size=split_max_size,
                     split_max_tensors=split_max_tensors, engine=engine, mmproj=mmproj, config=config,
                     no_tensor_first_split=no_tensor_first_split, trust_remote_code=trust_remote_code)
    if fmt == "json":
        sys.stdout.write(to_json(report))
        sys.stdout.flush()
    else:
        # on stdout, as every command's report: `convert ... > log` keeps it (issue 24)
        notes = [f"warning: {w}" for w in report.warnings]
        sys.stdout.write(to_table([], report.summary_items(), notes, title="ckpt-surgeon convert",
                                  width=table_width()))
        sys.stdout.flush()
