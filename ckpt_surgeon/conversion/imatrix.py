"""Importance matrices (``llama-imatrix`` output) read as llama.cpp's quantizer reads them.

Two forms (llama.cpp ``common/imatrix-loader.cpp``, ``common_imatrix_load``; normalised by
``tools/quantize/quantize.cpp`` ``load_imatrix``):

* **GGUF** (what llama-imatrix writes today): for each weight ``W``, F32 tensors ``W.in_sum2``
  (sums of squared activations, ``ne0 x n_expert``) and ``W.counts`` (one per expert, rounded
  with ``lround``); the keys ``imatrix.datasets``, ``imatrix.chunk_count`` and
  ``imatrix.chunk_size`` must all be present ("missing imatrix metadata" otherwise).  The
  weights are ``in_sum2 / count`` per expert, in float32, or 1 where the count is 0.
* **legacy** ``.dat``: ``int32 n_entries``, then per entry ``int32 len, name[len], int32 ncall,
  int32 nval, float32 values[nval]``, then optionally ``int32 chunk count, int32 len,
  dataset[len]``.  The weights are ``values / ncall`` in float32 (the values as stored when
  ``ncall`` is 0).  A file that does not parse as GGUF is read this way, as llama.cpp does.

Applied as ``llama_model_quantize_impl`` does (llama-quant.cpp): an entry is looked up by the GGUF
tensor's name; a tensor with no entry is quantized without one; an entry whose size is not
``ne0 x n_expert`` is an error, except for ``token_embd.weight`` (ignored there); a non-finite
value is an error.  Stricter than llama.cpp in one place, which the issue asks for: an entry that
names no tensor of the model means the file was made for another model, and is refused.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..errors import ConfigError, FormatError

__all__ = ["read_imatrix", "imatrix_for_plan"]

_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")


def read_imatrix(path) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 importance weights (``ne0 x n_expert`` values, expert-major),
    normalised exactly as llama-quantize normalises them.  Raises :class:`FormatError`."""
    path = Path(path)
    try:
        head = path.read_bytes()[:4] if path.is_file() else b""
    except OSError as e:
        raise FormatError(f"cannot read the importance matrix ({e.strerror})", path=str(path)) from None
    if not path.is_file():
        raise FormatError("no such importance matrix file", path=str(path))
    return _read_gguf(path) if head == b"GGUF" else _read_legacy(path)


def _read_gguf(path: Path) -> dict:
    from ..formats.gguf import GGUFFile
    g = GGUFFile(path)
    try:
        missing = [k for k in _KEYS if k not in g.metadata]
        if missing:
            raise FormatError(f"missing imatrix metadata ({', '.join(missing)}): not an imatrix GGUF", path=str(path))
        sums, counts = {}, {}
        for name, info in g.tensors.items():
            if name.endswith(".in_sum2"):
                sums[name[: -len(".in_sum2")]] = (name, info)
            elif name.endswith(".counts"):
                counts[name[: -len(".counts")]] = (name, info)
        if not sums and not counts:
            raise FormatError("no data in the importance matrix", path=str(path))
        out = {}
        for base in sorted(set(sums) | set(counts)):
            if base not in sums or base not in counts:
                raise FormatError(f"mismatched sums and counts for {base}", path=str(path), tensor=base)
            (_, sinfo), (_, cinfo) = sums[base], counts[base]
            if sinfo.dtype != "F32" or cinfo.dtype != "F32":
                raise FormatError(f"sums and counts for {base} must be F32", path=str(path), tensor=base)
            s = np.asarray(g.read(sinfo), np.float32).reshape(-1)
            c = np.asarray(g.read(cinfo), np.float32).reshape(-1)
            if c.size == 0 or s.size % c.size:
                raise FormatError(f"{s.size} sums do not split into {c.size} experts", path=str(path), tensor=base)
            # std::lround then (float): half away from zero, as an integer
            n = np.where(c >= 0, np.floor(c.astype(np.float64) + 0.5), np.ceil(c.astype(np.float64) - 0.5))
            n = n.astype(np.int64).astype(np.float32)
            e = s.reshape(c.size, -1).copy()
            for j in range(c.size):
                e[j] = e[j] / n[j] if n[j] > 0 else np.float32(1)
            out[base] = e.reshape(-1)
        return out
    finally:
        g.close()


def _read_legacy(path: Path) -> dict:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise FormatError("importance matrix ends early (neither GGUF nor llama-imatrix's legacy .dat)",
                              path=str(path))
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise FormatError("no data in the importance matrix (neither GGUF nor llama-imatrix's legacy .dat)",
                          path=str(path))
    out = {}
    for _ in range(n_entries):
        (length,) = take("<i")
        if not 0 < length <= 4096:
            raise FormatError(f"bad name length {length} (neither GGUF nor llama-imatrix's legacy .dat)",
                              path=str(path))
        name = take(f"<{length}s")[0].split(b"\0", 1)[0].decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval < 1:
            raise FormatError(f"entry {name!r} has {nval} values", path=str(path))
        vals = np.frombuffer(data, np.float32, nval, pos).copy()
        if vals.size != nval:
            raise FormatError("importance matrix ends early", path=str(path), tensor=name)
        pos += 4 * nval
        out[name] = vals / np.float32(ncall) if ncall > 0 else vals
    return out


def imatrix_for_plan(imatrix: dict, tensors: list, path: str) -> dict[str, np.ndarray]:
    """The entry for each planned tensor that is quantized, checked against the model:
    ``tensors``: ``(GGUF name, numpy-order shape, quantized?)``.  Refuses entries that name no
    tensor, wrong sizes and non-finite values (:class:`ConfigError`, nothing written)."""
    shapes = {n: (s, q) for n, s, q in tensors}
    stray = sorted(n for n in imatrix if n not in shapes)
    if stray:
        raise ConfigError(f"the importance matrix has {len(stray)} entr{'y' if len(stray) == 1 else 'ies'} for "
                          f"tensors this model does not have (e.g. {stray[0]}): it was made for another model",
                          path=path, tensor=stray[0])
    out = {}
    for name, values in imatrix.items():
        shape, quantized = shapes[name]
        want = shape[-1] * (shape[0] if len(shape) == 3 else 1)       # ne0 x ne2
        if values.size != want:
            if name in ("token_embd.weight", "per_layer_token_embd.weight"):
                continue          # llama.cpp ignores it there (llama-quant.cpp: "tok_embd should be ignored")
            raise ConfigError(f"importance matrix size {values.size} is not this model's {want} (ne0 x experts): "
                              "it was made for another model", path=path, tensor=name)
        if not np.all(np.isfinite(values)):
            raise ConfigError("the importance matrix holds a non-finite value", path=path, tensor=name)
        if quantized:
            out[name] = values
    return out
