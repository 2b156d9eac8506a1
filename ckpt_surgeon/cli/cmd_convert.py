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
              help="Where to write: a folder for GGUF -> HF, a file ending in .gguf for HF -> GGUF (and for GGUF -> "
                   "GGUF quantization, with a quantized --dtype); a folder for a quantized HF source (GPTQ, AWQ, "
                   "FP8, bitsandbytes, MLX ...): its dense HF folder.  --out is accepted too, as for fold-bias and qkv.")
@click.option("--dtype", default=None, metavar="TYPE",
              help="Output dtype.  GGUF -> HF, and quantized HF -> dense HF folder: float32 (default) | float16 | "
                   "bfloat16 for every floating tensor.  "
                   "HF -> GGUF: f16 (default) | bf16 | f32 | q8_0 for 2-D weights; norms and biases stay F32; "
                   "or a llama.cpp file type (" + " ".join(t for t in QUANT_FTYPES if t != "q8_0") + "): each "
                   "tensor's type chosen by llama.cpp's mixture rules and quantized by its own kernels (needs "
                   "llama-cpp-python: pip install 'ckpt-surgeon[llama]'), bytes identical to llama-quantize's, in "
                   "one streaming pass.  GGUF -> GGUF (a .gguf OUT): quantize that file the same way.  "
                   "The short and long spellings are interchangeable (bf16 = bfloat16).")
@click.option("--imatrix", type=ReadPath(exists=True, dir_okay=False), default=None,
              help="Importance matrix for a quantized --dtype: llama-imatrix's output (GGUF, or its legacy .dat), "
                   "applied as llama-quantize applies it.  Entries for tensors the model lacks, or of the wrong "
                   "size, are refused (made for another model).")
@click.option("--allow-requantize", is_flag=True,
              help="GGUF -> GGUF: let an already-quantized tensor be quantized to another type (as "
                   "llama-quantize --allow-requantize; quality is lost).  Without it such a tensor is refused.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists (atomically: the old one is removed only "
                                            "after the new one is complete).")
@click.option("--name", default=None, help="HF -> GGUF: general.name written into the file (default: the folder's "
                                           "name).  llama.cpp keys a few tokenizer quirks on it.")
@click.option("--split-max-size", default=None, metavar="SIZE",
              help="Write a GGUF output as llama.cpp's split set (OUT-00001-of-0000N.gguf ...), each part holding at "
                   "most SIZE bytes of tensor data (a larger tensor gets a part of its own): N bytes or N followed by "
                   "K, M or G (powers of 1000), as convert_hf_to_gguf.py --split-max-size, with the same part "
                   "boundaries, names and split.* keys; llama.cpp loads it from the first part.  An HF folder output: "
                   "the safetensors shard size.")
@click.option("--split-max-tensors", default=None, type=int, metavar="N",
              help="Write a GGUF output as llama.cpp's split set with at most N tensors per part (as "
                   "convert_hf_to_gguf.py --split-max-tensors; combines with --split-max-size).")
@click.option("--no-tensor-first-split", is_flag=True,
              help="A GGUF output as llama.cpp's split set whose first part holds only the metadata, the tensors "
                   "from part 2 on (as convert_hf_to_gguf.py --no-tensor-first-split; alone: two parts).")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True,
              help="table: a short summary on stdout.  json: the conversion report (every tensor's source and "
                   "target name, transform and dtypes; hyper-parameters written; warnings) on stdout.")
@click.option("--engine", type=click.Choice(("auto", "native", "llama.cpp")), default="auto", show_default=True,
              help="HF -> GGUF: auto = the native registry for its model types (both directions, faster), "
                   "llama.cpp's own converter class for any other architecture it registers (derived: its plan, "
                   "our reader, quantizer and writer; the first use downloads llama-cpp-python's sdist once).  "
                   "native / llama.cpp force one.  The report's 'conversion' line says which ran.")
@click.option("--list-architectures", is_flag=True, is_eager=True, expose_value=False, callback=_list_architectures,
              help="Print every HF architecture name with how convert handles it (native, derived from llama.cpp's "
                   "converter, or unsupported and why), then exit.")
@click.option("--mmproj", is_flag=True,
              help="HF -> GGUF of a vision / audio model: write its projector file (CLIP-arch GGUF that llama.cpp's "
                   "mtmd loads beside the text model) instead of the text model, through llama.cpp's own projector "
                   "class, as convert_hf_to_gguf.py --mmproj writes it (f32 | f16 | bf16 | q8_0).")
@click.option("--config", "config", type=ReadPath(exists=True), default=None, metavar="CONFIG",
              help="GGUF -> HF of an architecture outside the native registry (one llama.cpp's converter derives): "
                   "the model's original config.json, or the HF folder holding it (only its config is read).  "
                   "The GGUF's metadata is a lossy subset of it, so it is required there, and checked: llama.cpp's "
                   "class run on it must give the file's metadata, tensor names and shapes, else one line names "
                   "the first difference.  Given for a native architecture, it selects this path too.")
@click.option("--trust-remote-code", is_flag=True,
              help="HF -> GGUF through llama.cpp's converter class: let the class run Python shipped with the "
                   "model (a tokenizer module its tokenizer_config.json auto_map names, as Kimi-K2's or "
                   "Hunyuan's), as convert_hf_to_gguf.py does.  Without it such a folder is refused in one line "
                   "naming the module, before any of its code is copied or run.")
@progress_option
def command(source, out, dtype, imatrix, allow_requantize, force, name, split_max_size, split_max_tensors,
            no_tensor_first_split, fmt, progress, engine, mmproj, config, trust_remote_code):
    """Convert SOURCE between GGUF and Hugging Face safetensors.

    The direction follows SOURCE: a .gguf file (recognised by its magic bytes; any part of a
    split GGUF converts the whole set) becomes an HF folder OUT with config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
    generation_config.json that transformers loads offline; an HF folder (config.json,
    safetensors, tokenizer.json) becomes the GGUF file OUT that llama.cpp loads.

    Supported architectures, both ways: llama (and mistral, written as llama.cpp's llama), qwen2,
    qwen3, phi3, gpt2, gemma2, gemma3, starcoder2, olmo2, granite, phi, gpt_neox, cohere,
    stablelm, bloom, falcon, qwen2_moe, qwen3_moe, olmoe, mixtral, phimoe, deepseek_v2, internlm2
    (its remote code is never run; GGUF -> HF writes it as llama).  RoPE: plain; llama3 scaling for llama and mistral, yarn
    and linear for llama, mistral, qwen2 and qwen3, linear for gemma3 (its full-attention layers,
    as Gemma 3 4B-27B), DeepSeek's yarn (mscale = mscale_all_dim, as
    DeepSeek-V2-Lite) for deepseek_v2, longrope for phi3 and phimoe (Phi-3-128k,
    Phi-3.5, Phi-4-mini: the report says where llama.cpp runs it differently); other scaled RoPEs
    are refused by name.  Quantized GGUF tensors are dequantized, and so are quantized HF
    checkpoints (GPTQ, AWQ, auto-round, compressed-tensors, ModelOpt, FP8, bitsandbytes, MLX, MXFP4: each
    weight as its producer dequantizes it; docs/quantization.md), except FP4 weights (compressed-tensors
    and ModelOpt NVFP4, compressed-tensors MXFP4), kept NVFP4 / MXFP4 with their blocks moved bit for bit
    as llama.cpp's converter keeps NVFP4, and a mixed-precision checkpoint's symmetric int4 groups, kept
    Q4_0 (the same values); llama-arch Q/K rows are
    (un)permuted between HF's rotate-half and llama.cpp's interleaved rotary pairs; GPT-2
    Conv1D weights are transposed.  The tensor set is checked against the model transformers
    builds from the config: a missing or unexpected tensor is an error, and nothing is written.

    A quantized HF folder (GPTQ, AWQ, auto-round, compressed-tensors, ModelOpt, FP8, bitsandbytes, MLX, MXFP4)
    with a folder OUT becomes the dense HF folder of the same model: each quantized weight as
    its producer dequantizes it, rounded once to --dtype (float32 by default), config.json
    without its quantization keys, tokenizer and other side files copied; transformers loads
    it as the plain model, without the quantizer's package.

    --split-max-size / --split-max-tensors write a GGUF output as llama.cpp's split set
    (OUT-00001-of-0000N.gguf ...), from any source, at any --dtype, on the native and the derived
    path alike; every part is written and checked before any is renamed into place, and a killed
    run resumes at its first unfinished part.  inspect, verify and convert read such a set from
    any of its parts.

    Any other architecture llama.cpp's convert_hf_to_gguf.py registers (about 245 more HF names:
    convert --list-architectures) is derived from llama.cpp's own converter class, HF -> GGUF:
    the file is byte-identical to llama.cpp's converter's by construction (its class plans the
    names, transforms, types and metadata; our reader, quantizer and writer do the work), and
    k-quant types apply llama.cpp's mixture to that plan in the same pass.  A quantized release
    is read as stored and handled as llama.cpp's class handles it, in one pass: DeepSeek-V3's
    FP8 blocks dequantized, gpt-oss's MXFP4 experts kept MXFP4 (a k-quant of those is refused,
    as llama-quantize refuses it).  Back, GGUF -> HF with --config ORIGINAL/config.json: the
    inverse of that class, learned by running it on probe tensors (each element's source name and
    index), proved by a round trip, and refused in one line where the class does more than move
    values (a sum, exp, a +1 shift, a dropped tensor).  A tensor the class takes only in the
    release's own form comes back in it, whatever --dtype says for the floats (DeepSeek-V4's FP4
    experts: int8 codes and e8m0 exponents, their bits moved back out of the MXFP4 blocks).

    Outputs are written beside OUT and renamed into place; inputs are never modified.
    SOURCE is local: a Hub repo is downloaded first (hf download owner/name --local-dir DIR).

    \b
    Examples:
      ckpt-surgeon convert SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2-hf
      ckpt-surgeon convert ./qwen2-folder -o qwen2.q8_0.gguf --dtype q8_0
      ckpt-surgeon convert olmo.f32.gguf -o olmo-hf --config ./olmo-folder/config.json
      ckpt-surgeon convert ./qwen2-folder -o qwen2.q4_k_m.gguf --dtype q4_k_m
      ckpt-surgeon convert qwen2.f16.gguf -o qwen2.iq4_xs.gguf --dtype iq4_xs --imatrix imatrix.gguf
      ckpt-surgeon convert ./qwen2-gptq-int4 -o qwen2-dense --dtype bfloat16
      ckpt-surgeon convert ./big-folder -o big.q4_k_m.gguf --dtype q4_k_m --split-max-size 4G
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
