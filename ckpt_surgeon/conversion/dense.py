"""A quantized Hugging Face checkpoint -> the dense folder of the same model (what runs it).

transformers runs a quantized checkpoint only through its method's package (gptqmodel,
auto_round, compressed_tensors, bitsandbytes), not FP8 on a CPU and not MLX at all.  Measured mode
and ``verify`` run every scheme the reader knows instead by writing the checkpoint's **logical**
layout (:class:`~ckpt_surgeon.formats.quant.quantized.QuantizedSource`: each quantized Linear as the
dense float32 weight its producer dequantizes it to, element-exact against the producer's own
code) into a folder transformers loads as the unquantized model: ``config.json`` without
``quantization_config`` / MLX's ``quantization`` (so ``from_pretrained`` builds the model's own
``nn.Linear`` classes), every other tensor copied byte for byte (norms, biases, an unquantized
head keep their stored dtype), side files (tokenizer, generation config) copied.

What this runs is the dequantized weights: activation quantization a scheme applies at runtime
(compressed-tensors W8A8 / FP8 ``input_activations``, FP8 ``activation_scheme: dynamic``,
bitsandbytes' LLM.int8) is not; :class:`DequantizedRun` says so, for the reports.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DequantizedRun:
    """How a quantized checkpoint was run: its weights dequantized by ckpt-surgeon, activations in
    the compute dtype.  ``activations``: the activation quantization the checkpoint asks its
    runtime for (None: weight-only scheme), which a dequantized run leaves out."""

    method: str
    format: str
    bits: tuple
    activations: str | None = None

    @property
    def label(self) -> str:
        bits = "/".join(str(b) for b in self.bits)
        return f"{self.method}, {bits}-bit"

    def note(self) -> str:
        s = f"weights dequantized by ckpt-surgeon ({self.label}); activations not quantized"
        if self.activations:
            s += (f": the checkpoint quantizes activations at runtime ({self.activations}), which this "
                  "measurement excludes")
        return s

    def to_dict(self) -> dict:
        return {"weights": "dequantized by ckpt-surgeon", "method": self.method, "format": self.format,
                "bits": list(self.bits), "activations": "not quantized",
                "runtime_activation_quantization": self.activations,
                "activation_quantization_excluded": self.activations is not None, "note": self.note()}


def dequantized_run(ck) -> DequantizedRun | None:
    """The :class:`DequantizedRun` of an open checkpoint (None when it is not quantized)."""
    from ..formats.quant.schemes import activation_quantization
    q = ck.quantization
    if q is None:
        return None
    return DequantizedRun(q.method, q.format, tuple(q.bits), activation_quantization(ck.config))


def dense_config(config: dict) -> dict:
    """``config`` without its quantization keys (transformers then builds the plain model)."""
    return {k: v for k, v in config.items() if k not in ("quantization_config", "quantization")}


def quantized_to_dense(source, out: str | os.PathLike) -> Path:
    """Write the dense folder of quantized checkpoint ``source`` at ``out`` (see the module doc):
    quantized weights as float32 (exact: the reader's values), every other tensor's bytes as
    stored.  Returns ``out``."""
    from ..checkpoint import open_checkpoint
    from ..errors import CkptError
    from ..formats.write.writer import CheckpointWriter

    with open_checkpoint(source) as ck:
        if ck.quantization is None:
            raise CkptError("is not a quantized checkpoint: nothing to dequantize", path=str(source))
        # headers-only source hash: this folder is a throw-away copy for a run, not a publication
        with CheckpointWriter(out, source=ck, copy_untouched=False, source_hash="headers") as w:
            for name, info in ck.tensors.items():
                if info.quantized:
                    w.put(name, (lambda n=name: ck.read(n)), dtype="F32", shape=tuple(info.shape))
                else:
                    w.copy(name)
            w.set_config(dense_config(ck.config))
            w.leave_out("hf_quant_config.json")     # (quantized_to_dense_report says why)
            w.record("dequantize", {"method": ck.quantization.method})
    return Path(out)


# ``convert QUANTIZED_FOLDER -o OUT_FOLDER --dtype D``: the output dtype of every floating tensor.
DENSE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_FLOATS = ("F32", "F16", "BF16", "F64")


def _dense_config(config: dict, dtype: str) -> dict:
    """:func:`dense_config`, its dtype key (transformers 5's ``dtype``, older ``torch_dtype``) saying ``dtype``."""
    cfg = dense_config(config)
    keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["dtype"]
    for k in keys:
        cfg[k] = dtype
    return cfg


def quantized_to_dense_report(source, out, dtype: str = "float32", *, force: bool = False,
                              progress: bool | None = False, max_shard_bytes: int | None = None):
    """``convert QUANTIZED_FOLDER -o OUT_FOLDER``: the dense HF folder of a quantized checkpoint,
    every floating tensor in ``dtype`` (float32 | float16 | bfloat16; the quantized weights as the
    reader dequantizes them, exact against each producer's own code, then rounded once to
    ``dtype``), written through the atomic streaming writer (``force``: replace OUT), config.json
    without its quantization keys, tokenizer and other side files copied.  Returns a
    :class:`~.report.ConvertReport` (direction ``quantized->dense``).  ``max_shard_bytes``: cut the
    safetensors every that many bytes (``--split-max-size``; default: sharded like the source)."""
    import time

    from ..checkpoint import open_checkpoint
    from ..errors import UnsupportedError
    from ..formats.write.writer import CheckpointWriter
    from .report import ConvertReport

    t0 = time.perf_counter()
    target = DENSE_DTYPES[dtype]
    with open_checkpoint(source) as ck:
        q = ck.quantization
        if q is None:
            raise UnsupportedError("is not a quantized checkpoint: an HF folder converts to a GGUF file (give a path "
                                   "ending in .gguf)", path=str(source))
        run = dequantized_run(ck)
        with CheckpointWriter(out, source=ck, force=force, copy_untouched=False, progress=progress,
                              max_shard_bytes=max_shard_bytes) as w:
            records = [_dense_tensor(w, ck, name, info, target, run.label) for name, info in ck.tensors.items()]
            # ModelOpt's hf_quant_config.json declares the quantization too (llama.cpp's converter and this
            # reader take it when config.json has none): not beside the dense weights
            w.leave_out("hf_quant_config.json")
            config = _dense_config(ck.config, dtype)
            w.set_config(config)
            w.record("dequantize", {"method": q.method, "format": q.format, "dtype": dtype})
        result = w.result
    warnings = ()
    if run.activations:
        warnings = (f"the checkpoint quantizes activations at runtime ({run.activations}); the dense model "
                    "holds the dequantized weights and runs its activations unquantized",)
    out_p = Path(out)
    tok = [f for f in ("tokenizer.json", "tokenizer.model") if (out_p / f).is_file()]
    return ConvertReport("quantized->dense", str(source), str(out), f"{run.label} -> dense",
                         str(config.get("model_type") or ""), dtype, len(records), result.bytes_written,
                         time.perf_counter() - t0, bool(config.get("tie_word_embeddings")),
                         f"copied ({', '.join(tok)})" if tok else None, tuple(records), warnings, config)


_SLAB = 1 << 22        # values per slab of a weight dequantized row range by row range (16 MB as float32)


def _row_slabs(ck, name: str):
    rows, cols = ck.tensors[name].shape
    step = max(1, _SLAB // max(cols, 1))
    for a in range(0, rows, step):
        yield ck.read_rows(name, a, min(a + step, rows))


def _dense_tensor(w, ck, name: str, info, target: str, label: str):
    """Declare one output tensor: a quantized weight dequantized to ``target``, another floating
    tensor cast to it (raw bytes when it is stored so), anything else copied -> its TensorRecord."""
    from .report import TensorRecord
    stored = ck.stored_tensors.get(name)
    src_dtype = label if info.quantized else info.dtype
    if info.quantized and ck.reader.rows_readable(name):
        # FP4 / MX: a slab of rows at a time, never the whole float32 tensor (7B-shaped MLP weights are 68 M values)
        w.put(name, (lambda n=name: _row_slabs(ck, n)), dtype=target, shape=tuple(info.shape))
        return TensorRecord(name, name, "dequantize", src_dtype, target, tuple(info.shape))
    if info.quantized or (info.dtype in _FLOATS and info.dtype != target):
        w.put(name, (lambda n=name: ck.read(n)), dtype=target, shape=tuple(info.shape))
        return TensorRecord(name, name, "dequantize" if info.quantized else "cast", src_dtype, target, tuple(info.shape))
    w.copy(name)
    return TensorRecord(name, name, "none", stored.dtype if stored is not None else src_dtype, info.dtype,
                        tuple(info.shape))
