"""Running a checkpoint with transformers: the one place that knows how.

``analyze --measure`` (:mod:`ckpt_surgeon.analysis.measure`) and ``verify`` / ``localize``
(:mod:`ckpt_surgeon.verification`) both load a source with transformers on a device.  What they
share lives here:

* :func:`resolve_device`: ``auto`` | ``cpu`` | ``cuda`` -> the device torch will use;
* :func:`torch_dtype`: a dtype name -> the torch dtype;
* :func:`gguf_to_folder` / :func:`gguf_as_folder`: a GGUF file -> an HF folder transformers loads,
  through our converter (:func:`ckpt_surgeon.conversion.gguf_to_hf`), not transformers'
  ``gguf_file`` loader, which silently drops the attention biases of llama-arch files (it sets
  ``attention_bias=False``) and so would run a different model;
* :func:`quantized_to_folder` / :func:`quantized_as_folder`: a quantized HF checkpoint (GPTQ, AWQ,
  compressed-tensors, FP8, bitsandbytes, MLX ...) -> the dense folder of the same model, its
  weights dequantized by our reader (:func:`ckpt_surgeon.conversion.dense.quantized_to_dense`),
  which transformers builds as the unquantized model: every scheme runs on a CPU, with the
  producer's own dequantized values, without the method's package;
* :func:`is_quantized_folder`: whether a folder's config.json declares a quantization;
* :data:`TOKENIZER_FILES` / :func:`has_tokenizer`: whether a folder carries a tokenizer;
* :func:`load_pretrained`: ``from_pretrained`` with eager attention, quiet, as one typed error;
* :func:`load_tokenizer`: the tokenizer of a folder, Hub id or ``tokenizer.json``, as one typed error;
* :func:`quiet_transformers` (from :mod:`ckpt_surgeon.quiet`, where the lower layers import it):
  transformers' logs and bars off while the library loads or saves.

torch and transformers are imported inside the functions: importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import CkptError, ConfigError, UnsupportedError
from .quiet import quiet_transformers

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64", "bfloat16", "float16")

# Any of these beside the config means a tokenizer transformers can load (fast tokenizer file,
# its config, SentencePiece models, BPE / WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model")

# What ``from_pretrained`` raises for a folder it cannot build a model from (bad config values,
# missing files, an architecture this transformers lacks, a remote-code model ...).
LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, ImportError, TypeError, AttributeError)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one is
    an error (one line), never a silent fall back to the CPU."""
    if device not in DEVICES:
        raise CkptError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CkptError("--device cuda was asked for but torch.cuda.is_available() is False "
                        f"(torch {torch.__version__}); use --device cpu or auto")
    return device


def torch_dtype(name: str):
    """The torch dtype called ``name`` (one of :data:`DTYPES`)."""
    import torch
    table = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
             "float16": torch.float16}
    if name not in table:
        raise CkptError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return table[name]


def has_tokenizer(folder: str | os.PathLike) -> bool:
    return any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def gguf_to_folder(path: str | os.PathLike, out: Path, dtype: str) -> Path:
    """GGUF -> HF folder ``out`` (dequantized to ``dtype``, llama Q/K rows un-permuted)."""
    from .conversion import gguf_to_hf
    gguf_to_hf(path, out, dtype=dtype)
    return out


@contextlib.contextmanager
def gguf_as_folder(path: str | os.PathLike, *, dtype: str, prefix: str = "ckpt-surgeon-run-") -> Iterator[Path]:
    """:func:`gguf_to_folder` into a temp dir that lives only inside the ``with`` block."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield gguf_to_folder(path, Path(tmp) / "hf", dtype)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_quantized_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder/config.json`` declares a quantization (``quantization_config`` with a
    ``quant_method``, or MLX's ``quantization``)."""
    from .formats.quant.schemes import config_method
    from .formats.safe_input import read_json
    cfg = Path(folder) / "config.json"
    return cfg.is_file() and config_method(read_json(cfg, error=ConfigError)) is not None


def quantized_to_folder(path: str | os.PathLike, out: Path) -> Path:
    """Quantized HF checkpoint -> dense HF folder ``out`` (quantized weights float32, as dequantized
    by our reader; everything else as stored; config without its quantization keys)."""
    from .conversion.dense import quantized_to_dense
    return quantized_to_dense(path, out)


@contextlib.contextmanager
def quantized_as_folder(path: str | os.PathLike, *, prefix: str = "ckpt-surgeon-run-") -> Iterator[Path]:
    """:func:`quantized_to_folder` into a temp dir that lives only inside the ``with`` block."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield quantized_to_folder(path, Path(tmp) / "hf")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_pretrained(cls, folder: str | os.PathLike, *, dtype: str, path: str, **kw):
    """``cls.from_pretrained(folder)`` with eager attention in ``dtype``, transformers quiet.

    ``attn_implementation="eager"``: the plain ``softmax(QKᵀ/√d + mask)·V`` in ordinary matmuls.
    SDPA may dispatch to different fused kernels (flash / memory-efficient / math, blockwise
    reductions) depending on shapes, dtype and device, so two models with identical weights could
    differ by kernel choice alone; eager makes identical weights give bit-identical CPU logits,
    every architecture supports it, and measured mode needs its ``softmax`` call to capture the
    attention logits.  A failure is one :class:`UnsupportedError` naming ``path``.  Returns what
    ``from_pretrained`` returns (with ``output_loading_info=True``: ``(model, info)``).
    """
    tdtype = torch_dtype(dtype)
    try:
        with quiet_transformers():
            return cls.from_pretrained(folder, attn_implementation="eager", dtype=tdtype, **kw)
    except LOAD_ERRORS as e:
        raise UnsupportedError(f"transformers could not load it: {first_line(e)}", path=path) from None


def load_tokenizer(source: str | os.PathLike, *, path: str, local_files_only: bool = True,
                   error: type[CkptError] = ConfigError, why: str = "tokenizer could not be loaded"):
    """``AutoTokenizer`` for a folder or Hub id (``local_files_only=False``: the Hub is asked,
    honouring HF_TOKEN / HF_HUB_OFFLINE), or a fast tokenizer for one ``tokenizer.json`` file;
    what transformers raises becomes ``error("<why>: <its first line>")``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    try:
        with quiet_transformers():
            if Path(source).is_file():
                return PreTrainedTokenizerFast(tokenizer_file=os.fspath(source))
            return AutoTokenizer.from_pretrained(os.fspath(source), local_files_only=local_files_only)
    except LOAD_ERRORS as e:
        raise error(f"{why}: {first_line(e)}", path=path) from None

