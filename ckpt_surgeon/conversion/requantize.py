"""GGUF -> GGUF quantization (``convert model-f16.gguf -o model.q4_k_m.gguf --dtype q4_k_m``).

What ``llama_model_quantize`` does with its default parameters (llama.cpp ``src/llama-quant.cpp``
``llama_model_quantize_impl``), streamed through the converter's writer (:mod:`.gguf_stream`):

* every key-value pair carried over as stored, ``general.quantization_version`` and
  ``general.file_type`` set (the split keys dropped);
* each tensor's type from llama.cpp's mixture (:mod:`ckpt_surgeon.conversion.quant_mix`); a tensor
  whose type does not change is copied byte for byte, any other is decoded to float32 as
  llama.cpp decodes it (F16 / BF16 widened exactly, a quantized type by ggml's own ``to_float``)
  and quantized by ggml's kernels, with the importance matrix if one is given;
* an already-quantized tensor that would change type is refused unless ``allow_requantize``
  ("requantizing from type ... is disabled"), before anything is written.

Tensors keep the source file's order (llama.cpp writes them in its loader's name order; the
tensors themselves are the same).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError, TruncatedError, UnsupportedError
from ..formats.quant import ggml_types as GT
from ..formats.write import gguf as gw
from . import output_path
from .gguf_stream import verify_written, write_tensor_data
from .quant_plan import QUANT_ONLY, check_quant_request, file_type_name, ggml_shape, mixture
from .report import ConvertReport, TensorRecord

__all__ = ["gguf_requantize_report"]

_FLOATS = ("F32", "F16", "BF16")
_DROP_KEYS = ("general.file_type", "general.quantization_version", "split.no", "split.count", "split.tensors.count")


@dataclass(frozen=True)
class _Planned:
    src: str                     # "raw:<name>" copies the stored bytes, else decoded to float32
    dst: str
    transform: str               # "raw" or "none"
    shape: tuple
    ggml_type: str
    nbytes: int
    src_dtype: str
    stacked: tuple = ()
    data: bytes | None = None
    imatrix: object = None


class _Source:
    """What :func:`~.gguf_stream.write_tensor_data` reads: rows of a GGUF tensor, as stored
    (``raw:`` names) or as float32 the way llama.cpp's quantizer decodes them."""

    format = "gguf-requantize"

    def __init__(self, tensors: dict):
        """``tensors``: name -> TensorInfo, each naming its file (the parts of a split set)."""
        self._fds: dict[str, int] = {}
        self.tensors = {}
        try:
            for name, info in tensors.items():
                if info.file not in self._fds:
                    self._fds[info.file] = os.open(info.file, os.O_RDONLY)
                self.tensors[name] = info
                self.tensors["raw:" + name] = info
        except BaseException:
            self.close()
            raise

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def _bytes(self, info, a: int, b: int) -> np.ndarray:
        rows = info.shape[0] if info.shape else 1
        per_row = (info.end - info.start) // max(rows, 1)
        buf = np.empty((b - a) * per_row, np.uint8)
        got = os.preadv(self._fds[info.file], [memoryview(buf)], info.start + a * per_row)
        if got != buf.nbytes:
            raise FormatError("file ends inside the tensor's data", path=info.file, tensor=info.name)
        return buf

    def read_rows(self, name: str, a: int, b: int):
        info = self.tensors[name]
        raw = self._bytes(info, a, b)
        shape = (b - a,) + tuple(info.shape[1:])
        if name.startswith("raw:"):
            return raw
        if info.dtype == "F32":
            return raw.view(np.float32).reshape(shape)
        if info.dtype == "F16":
            return raw.view(np.float16).astype(np.float32).reshape(shape)       # exact
        if info.dtype == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)   # exact
        from ..formats.quant import ggml_quant
        n = int(np.prod(shape))
        return ggml_quant.dequantize(raw, info.dtype, n).reshape(shape)

    def read(self, name: str):
        info = self.tensors[name]
        return self.read_rows(name, 0, info.shape[0] if info.shape else 1)


def _identity(arr, kind, hp, path="", tensor=""):
    return arr


def _kv_bytes(h) -> tuple[bytes, int]:
    """The key-value section as stored, minus :data:`_DROP_KEYS` (cut at the fields' offsets)."""
    info_size = sum(8 + len(n.encode()) + 4 + 8 * len(i.shape) + 4 + 8 for n, i in h.tensors.items())
    kv_end = h.header_end - info_size
    with open(h.path, "rb") as f:
        f.seek(24)
        kv = f.read(kv_end - 24)
    starts = sorted(x.offset for x in h.fields.values())
    cuts = []
    for key in _DROP_KEYS:
        fld = h.fields.get(key)
        if fld is not None:
            nxt = next((o for o in starts if o > fld.offset), kv_end)
            cuts.append((fld.offset - 24, nxt - 24))
    for a, b in sorted(cuts, reverse=True):
        kv = kv[:a] + kv[b:]
    return kv, h.kv_count - len(cuts)


def _hparams(h) -> dict:
    arch = h.architecture or ""
    md = h.metadata

    def first(key, default=None):
        v = md.get(f"{arch}.{key}", default)
        if isinstance(v, (list, tuple)):        # per-layer arrays: llama.cpp's n_head() is layer 0's
            v = v[0] if len(v) else default
        return v

    n_layer, n_head = first("block_count"), first("attention.head_count")
    if n_layer is None or n_head is None:
        raise FormatError(f"no {arch}.block_count / {arch}.attention.head_count: not a model llama.cpp loads",
                          path=h.path)
    return {"n_layer": int(n_layer), "n_head": int(n_head), "n_head_kv": int(first("attention.head_count_kv", n_head)),
            "n_expert": int(first("expert_count", 0) or 0)}


def _plan(tensors: dict, entries: list, types: dict, weights: dict, dtype: str, allow_requantize: bool,
          src: str) -> tuple[list, list[str]]:
    """Each tensor of header ``h`` as written: its stored bytes copied (``raw``: the type stays) or
    quantized to the mixture's type; refused where that would requantize without ``allow_requantize``.
    Returns (the plan, warnings)."""
    plan, warnings, fell, again = [], [], [], {}
    for name, shape, sdt in entries:
        t = types[name]
        new = t.ggml_type
        if new != sdt and sdt not in _FLOATS:
            again[f"{sdt} -> {new}"] = again.get(f"{sdt} -> {new}", 0) + 1
            if not allow_requantize:
                raise UnsupportedError(f"is already {sdt}; making it {new} would requantize it (quality lost; "
                                       "pass --allow-requantize to do it anyway)", path=src, tensor=name)
            if dtype not in QUANT_ONLY:
                from ..formats.quant import ggml_quant
                ggml_quant.lib()      # the decoder of a quantized source is ggml's
        if t.fell_back:
            fell.append(name)
        raw = new == sdt
        plan.append(_Planned(("raw:" if raw else "") + name, name, "raw" if raw else "none", ggml_shape(shape), new,
                             tensors[name].nbytes if raw else GT.nbytes(new, shape), sdt,
                             imatrix=None if raw else weights.get(name)))
    if fell:
        warnings.append(f"{len(fell)} tensor(s) fall back to another type (rows not whole blocks), as llama.cpp: "
                        + ", ".join(fell[:4]) + (" ..." if len(fell) > 4 else ""))
    if again:
        warnings.append(requantized_warning(again))
    return plan, warnings


def _open_source(src: Path):
    """(part 1's header, every tensor across the parts): a single GGUF, or any part of a split set."""
    from ..formats.gguf import open_gguf
    g = open_gguf(src)
    try:
        if g.missing_bytes:        # the line every other command gives (issue 50 item 9)
            raise TruncatedError.cut_short(g.missing_bytes, [n for n, t in g.tensors.items() if t.missing], src)
        return g.header, dict(g.tensors), list(g.paths)
    finally:
        g.close()


def requantized_warning(again: dict) -> str:
    """Issue 36 item 19: what requantizing an already-quantized file means for its quality.  ``again``:
    ``{"Q4_1 -> Q5_0": count}``.  The loss is real (llama-quantize --allow-requantize writes the same bytes:
    tests/test_quantize.py) and ``verify SOURCE OUT`` judges it by thresholds made for a float reference."""
    n = sum(again.values())
    pairs = ", ".join(f"{k} x{v}" for k, v in sorted(again.items(), key=lambda kv: -kv[1]))
    return (f"requantized source: {n} tensor(s) were already quantized and are rounded again ({pairs}); both "
            "roundings stay in the output, so it is further from the original float model than the same type made "
            "from it (llama-quantize --allow-requantize writes these same bytes).  Expect 'verify SOURCE OUT' to "
            "fail its default thresholds for a 4-5-bit target (docs/benchmarks.md has measured figures); quantize "
            "from the float model where you have it, or compare with explicit --max-kl / --min-top1")


def gguf_requantize_report(src, out_path, dtype: str, force: bool = False, *, imatrix=None,
                           allow_requantize: bool = False, progress: bool | None = False,
                           verify: bool = True, split=None) -> ConvertReport:
    """Quantize GGUF ``src`` (a file, or any part of a split set: the whole set) into GGUF
    ``out_path`` of file type ``dtype`` (any of :data:`~.quant_plan.QUANT_ONLY`, or q8_0 / f16 /
    bf16 / f32 with llama.cpp's rules); ``split``: a :class:`~.split_output.SplitRequest`, the output
    then llama.cpp's split set.  Raises :class:`~ckpt_surgeon.errors.CkptError` subclasses; nothing is
    written then."""
    from .quant_mix import FTYPES
    from .split_output import check_split_destination, write_gguf_outputs
    t0 = time.perf_counter()
    src, out = Path(src), Path(out_path)
    if dtype not in FTYPES:
        raise UnsupportedError(f"--dtype {dtype} is not a quantized type: GGUF -> GGUF writes one of "
                               f"{', '.join(FTYPES)}", path=str(src))
    check_quant_request(dtype, imatrix)
    h, tensors, inputs = _open_source(src)
    output_path.check_output(out, inputs, force)
    if split is not None:
        check_split_destination(out, inputs, force)
    entries = [(n, tuple(i.shape), i.dtype) for n, i in tensors.items()]
    types, weights = mixture(entries, dtype, h.architecture or "", _hparams(h), imatrix, str(src))
    plan, warnings = _plan(tensors, entries, types, weights, dtype, allow_requantize, str(src))
    import gguf
    kv, count = _kv_bytes(h)
    kv += gw.encode_kv(gw.KV("general.quantization_version", gw.VT.UINT32, gguf.GGML_QUANT_VERSION))
    kv += gw.encode_kv(gw.KV("general.file_type", gw.VT.UINT32, int(gguf.LlamaFileType[file_type_name(dtype)])))
    source = _Source(tensors)

    def data(fd, part, offsets, wbar):
        return write_tensor_data(fd, source, part, offsets, {}, _identity, labels=(str(src), str(out)),
                                 progress=wbar, readback=verify)

    def check(tmp, final, part, chunks, first):
        verify_written(tmp, final, part, chunks)

    try:
        files = write_gguf_outputs(out, kv, count + 2, plan, data, verify=check if verify else None, req=split,
                                   progress=progress, alignment=h.alignment, version=h.version, warnings=warnings,
                                   inputs=[*inputs, *([os.fspath(imatrix)] if imatrix else [])])
    finally:
        source.close()
    records = tuple(TensorRecord(p.dst, p.dst, "copy" if p.transform == "raw" else "quantize", p.src_dtype,
                                 p.ggml_type, p.shape) for p in plan)
    return ConvertReport("gguf->gguf", str(src), str(files[0]), h.architecture, None, dtype, len(plan),
                         sum(f.stat().st_size for f in files), time.perf_counter() - t0,
                         "output.weight" not in tensors, None, records, tuple(warnings), {},
                         tuple(str(f) for f in files))
