"""A reference run saved once (``--save-reference``) and read back (``--reference``), two formats.

**ckpt-surgeon** (the default for writing): a safetensors file, so any safetensors reader opens it.

- ``tokens``: I32 ``[chunks, ctx]``, the corpus tokens as cut into chunks (before BOS replaces
  each chunk's first token; what llama.cpp stores too);
- ``logits``: F32 (or F64 for a float64 run) ``[chunks · rows, V]``, the reference's raw logits at
  the scored positions, chunk after chunk.  Raw logits rather than log-probabilities: the
  statistics take the float64 log-softmax of exactly the numbers a live run would have used, so
  statistics from a saved float32 reference are bit-identical to the live run (tested).  The
  precision floor is the storage dtype of the logits, nothing else.
- ``__metadata__`` (strings): ``format`` = ``ckpt-surgeon-reference``, ``version``, ``ctx``,
  ``score`` (``half`` | ``all``), ``rows`` per chunk, ``bos`` (the id that replaced each chunk's
  first token, or empty), ``corpus_sha256`` (of the corpus file's bytes, or of the ids file),
  ``reference`` (the model as given), ``dtype``, ``runtime``.

**llama.cpp** (``llama-perplexity --kl-divergence-base FILE``), from ``tools/perplexity/perplexity.cpp``
(``perplexity()`` writes it, ``kl_divergence()`` reads it): ``"_logits_"``, int32 ``n_ctx``,
int32 ``n_vocab``, int32 ``n_chunk``, int32 tokens ``[n_chunk · n_ctx]``, then per chunk
``n_ctx − 1 − n_ctx/2`` rows of ``nv = 2·⌈n_vocab/2⌉ + 4`` uint16: the row's float32 ``scale``
and ``min_log_prob`` (4 uint16), then one uint16 per token, ``log p ≈ scale·u + min_log_prob``.
``min_log_prob`` is the log-prob of ``max(min logit, max logit − 16)``; tokens at or below that
store 0, and the reader skips entries with ``log p ≤ −16`` in KL.  ``scale = range/65535`` with
``range ≤ 16``: each stored log-prob is within ``scale/2 ≤ 1.2e-4`` nats of the writer's float32
value, which is the floor of anything computed from such a file (KL of a model with itself reads
~1e-5 … 1e-4 instead of 0).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CkptError, FormatError, SourceNotFoundError

FORMAT = "ckpt-surgeon-reference"
VERSION = "1"
LLAMACPP_MAGIC = b"_logits_"
# llama.cpp's writer clamps the smallest stored logit to max - 16 and its reader skips log-probs
# at or below -16 in KL (perplexity.cpp: ``max_logit - 16``, ``p_log_base > -16.f``).
LLAMACPP_RANGE = 16.0
LLAMACPP_KL_FLOOR = -16.0
FORMATS = ("ckpt-surgeon", "llama.cpp")
_ST_DTYPES = {"F32": np.float32, "F64": np.float64}


def scored_rows(ctx: int, score: str) -> tuple[int, int]:
    """(first scored position, rows per chunk): llama.cpp's ``ctx/2 … ctx−2`` or every position
    that has a next token in the chunk (``0 … ctx−2``)."""
    first = ctx // 2 if score == "half" else 0
    return first, ctx - 1 - first


def llamacpp_nv(n_vocab: int) -> int:
    """uint16 per stored row in llama.cpp's file: 4 for the two float32 header values, the
    vocabulary rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


# --- llama.cpp's uint16 encoding ----------------------------------------------------------------

def encode_llamacpp(logits: np.ndarray) -> np.ndarray:
    """``[n, V]`` logits -> ``[n, nv]`` uint16 rows as perplexity.cpp's ``log_softmax(..., uint16_t *
    log_prob, ...)`` writes them, in its float32 arithmetic (``sum_exp`` in double, ``nearest_int``
    rounding half to even)."""
    x = np.asarray(logits, dtype=np.float32)
    n, v = x.shape
    mx = x.max(axis=1)
    mn = np.maximum(x.min(axis=1), mx - np.float32(LLAMACPP_RANGE))
    with np.errstate(under="ignore"):
        sum_exp = np.exp(x - mx[:, None]).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_log_prob = (mn - mx) - lse
    scale = (mx - mn) / np.float32(65535.0)
    out = np.zeros((n, llamacpp_nv(v)), dtype=np.uint16)
    head = np.stack([scale, min_log_prob], axis=1).astype(np.float32)
    out[:, :4] = head.view(np.uint16).reshape(n, 4)
    ok = scale > 0
    inv = np.where(ok, np.float32(1.0) / np.where(ok, scale, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    q = np.rint(inv[:, None] * (x - mn[:, None])).astype(np.float32)
    q = np.where((x > mn[:, None]) & ok[:, None], q, 0)
    out[:, 4:4 + v] = q.astype(np.uint16)
    return out


def decode_llamacpp(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """``[n, nv]`` uint16 -> ``[n, n_vocab]`` float32 log-probs, ``scale·u + min_log_prob`` in
    float32 as llama.cpp's reader computes them."""
    rows = np.ascontiguousarray(rows, dtype=np.uint16)
    head = rows[:, :4].copy().view(np.float32)
    scale, mn = head[:, 0:1], head[:, 1:2]
    return (scale * rows[:, 4:4 + n_vocab].astype(np.float32) + mn).astype(np.float32)


# --- the header both formats share --------------------------------------------------------------

@dataclass(frozen=True)
class ReferenceInfo:
    """What a reference file says about the run that made it."""

    path: str
    format: str                  # ckpt-surgeon | llama.cpp
    ctx: int
    n_vocab: int
    n_chunks: int
    score: str                   # half | all
    rows: int                    # scored rows per chunk
    tokens: np.ndarray           # int64 [n_chunks, ctx]
    corpus_sha256: str | None    # None for llama.cpp files (they keep the tokens only)
    bos: int | None
    reference: str | None
    dtype: str                   # what the rows are: float32 | float64 logits, or uint16 log-probs


class ReferenceReader:
    """Open a reference file of either format (told apart by its first bytes); ``chunk(i)`` gives
    ``("logits", array)`` for ours or ``("logprobs", array)`` for llama.cpp's, rows of chunk i."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise SourceNotFoundError("reference file not found", path=self.path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if head == LLAMACPP_MAGIC:
                self.info, self._offset = _read_llamacpp_header(f, self.path, size)
            else:
                self.info, self._offset = _read_st_header(f, head, self.path, size)
        i = self.info
        width = llamacpp_nv(i.n_vocab) if i.format == "llama.cpp" else i.n_vocab
        dtype = np.uint16 if i.format == "llama.cpp" else _ST_DTYPES[{"float32": "F32", "float64": "F64"}[i.dtype]]
        self._rows = np.memmap(self.path, dtype=dtype, mode="r", offset=self._offset,
                               shape=(i.n_chunks * i.rows, width))

    def chunk(self, c: int) -> tuple[str, np.ndarray]:
        r = self.info.rows
        block = np.asarray(self._rows[c * r:(c + 1) * r])
        if self.info.format == "llama.cpp":
            return "logprobs", decode_llamacpp(block, self.info.n_vocab)
        return "logits", block

    def close(self) -> None:
        self._rows = None


def _read_llamacpp_header(f, path: str, size: int):
    raw = f.read(12)
    if len(raw) < 12:
        raise FormatError("llama.cpp logits file is truncated in its header", path=path)
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", raw)
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        raise FormatError(f"llama.cpp logits file has n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}", path=path)
    first, rows = scored_rows(n_ctx, "half")
    tok_bytes = 4 * n_ctx * n_chunk
    offset = 20 + tok_bytes
    need = offset + 2 * n_chunk * rows * llamacpp_nv(n_vocab)
    if size != need:
        raise FormatError(f"llama.cpp logits file is {size:,} bytes; n_ctx {n_ctx}, n_vocab {n_vocab} and "
                          f"n_chunk {n_chunk} make {need:,}", path=path)
    tokens = np.frombuffer(f.read(tok_bytes), dtype="<i4").astype(np.int64).reshape(n_chunk, n_ctx)
    info = ReferenceInfo(path, "llama.cpp", n_ctx, n_vocab, n_chunk, "half", rows, tokens, None, None, None, "uint16")
    return info, offset


def _read_st_header(f, head: bytes, path: str, size: int):
    bad = f"is neither a ckpt-surgeon reference (safetensors, format {FORMAT}) nor llama.cpp's " \
          "--kl-divergence-base file (_logits_)"
    if len(head) < 8:
        raise FormatError(bad, path=path)
    n = struct.unpack("<Q", head)[0]
    if n > min(size - 8, 1 << 24):
        raise FormatError(bad, path=path)
    try:
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__")
        if meta.get("format") != FORMAT:
            raise FormatError(bad, path=path)
        ctx, n_chunks, rows = int(meta["ctx"]), int(meta["chunks"]), int(meta["rows"])
        toks, logits = header["tokens"], header["logits"]
        score = meta["score"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FormatError(bad, path=path) from None
    if meta.get("version") != VERSION:
        raise FormatError(f"reference file version {meta.get('version')!r}; this build reads {VERSION!r}", path=path)
    base = 8 + n
    if toks.get("dtype") != "I32" or toks.get("shape") != [n_chunks, ctx] or \
            logits.get("dtype") not in _ST_DTYPES or len(logits.get("shape", ())) != 2 or \
            logits["shape"][0] != n_chunks * rows or score not in ("half", "all") or \
            rows != scored_rows(ctx, score)[1]:
        raise FormatError("reference file's tensors do not match its metadata (tokens I32 [chunks, ctx], "
                          "logits [chunks·rows, V])", path=path)
    v = int(logits["shape"][1])
    itemsize = np.dtype(_ST_DTYPES[logits["dtype"]]).itemsize
    t0, t1 = toks["data_offsets"]
    l0, l1 = logits["data_offsets"]
    if (t0, t1) != (0, 4 * n_chunks * ctx) or (l0, l1) != (t1, t1 + itemsize * n_chunks * rows * v):
        raise FormatError("reference file's data offsets are not contiguous", path=path)
    if base + l1 != size:
        raise FormatError(f"reference file is {size:,} bytes, its header describes {base + l1:,} "
                          "(truncated or appended to)", path=path)
    f.seek(base + t0)
    tokens = np.frombuffer(f.read(t1 - t0), dtype="<i4").astype(np.int64).reshape(n_chunks, ctx)
    bos = int(meta["bos"]) if meta.get("bos") not in (None, "") else None
    info = ReferenceInfo(path, "ckpt-surgeon", ctx, v, n_chunks, score, rows, tokens,
                         meta.get("corpus_sha256") or None, bos, meta.get("reference"),
                         "float32" if logits["dtype"] == "F32" else "float64")
    return info, base + l0


class ReferenceWriter:
    """Write a reference file chunk by chunk through a :class:`~ckpt_surgeon.publish.Staging` temp
    beside ``dest`` (nothing appears at ``dest`` unless every chunk was written).  The header is
    written with the first chunk, when the vocabulary width is known."""

    def __init__(self, dest: str | os.PathLike, *, fmt: str, tokens: np.ndarray, score: str, bos: int | None,
                 corpus_sha256: str | None, reference: str | None, runtime: str, replace: bool):
        from ..publish import Staging
        if fmt not in FORMATS:
            raise CkptError(f"unknown reference format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if fmt == "llama.cpp" and score != "half":
            raise CkptError("llama.cpp's --kl-divergence-base file holds positions ctx/2 … ctx−2 only; "
                            "--score all cannot be saved in it", path=os.fspath(dest))
        self.dest, self.fmt, self.replace = Path(dest), fmt, replace
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.n_chunks, self.ctx = self.tokens.shape
        self.score, self.rows = score, scored_rows(self.ctx, score)[1]
        self.meta = {"format": FORMAT, "version": VERSION, "ctx": str(self.ctx), "chunks": str(self.n_chunks),
                     "rows": str(self.rows), "score": score, "bos": "" if bos is None else str(bos),
                     "corpus_sha256": corpus_sha256 or "", "reference": reference or "", "runtime": runtime}
        self._staging = Staging(self.dest, folder=False)
        self._f = open(self._staging.path, "wb")
        self._written = 0
        self._width = None

    def write_chunk(self, logits: np.ndarray) -> None:
        x = np.asarray(logits)
        if x.ndim != 2 or x.shape[0] != self.rows:
            raise ValueError(f"expected {self.rows} rows, got {x.shape}")
        if self._width is None:
            self._width = x.shape[1]
            self._dtype = np.float64 if x.dtype == np.float64 and self.fmt == "ckpt-surgeon" else np.float32
            self._f.write(self._header(x.shape[1]))
        elif x.shape[1] != self._width:
            raise ValueError(f"width changed from {self._width} to {x.shape[1]}")
        if self.fmt == "llama.cpp":
            self._f.write(encode_llamacpp(x).astype("<u2").tobytes())
        else:
            self._f.write(np.ascontiguousarray(x, dtype=np.dtype(self._dtype).newbyteorder("<")).tobytes())
        self._written += 1

    def _header(self, v: int) -> bytes:
        toks = self.tokens.astype("<i4").tobytes()
        if self.fmt == "llama.cpp":
            return LLAMACPP_MAGIC + struct.pack("<iii", self.ctx, v, self.n_chunks) + toks
        st = "F64" if self._dtype == np.float64 else "F32"
        self.meta["dtype"] = "float64" if st == "F64" else "float32"
        t1 = len(toks)
        l1 = t1 + np.dtype(self._dtype).itemsize * self.n_chunks * self.rows * v
        header = {"__metadata__": self.meta,
                  "tokens": {"dtype": "I32", "shape": [self.n_chunks, self.ctx], "data_offsets": [0, t1]},
                  "logits": {"dtype": st, "shape": [self.n_chunks * self.rows, v], "data_offsets": [t1, l1]}}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)      # safetensors pads the header to 8 bytes
        return struct.pack("<Q", len(raw)) + raw + toks

    def close(self) -> None:
        """Publish (atomically) once every chunk is in; otherwise discard."""
        self._f.close()
        if self._written != self.n_chunks:
            self._staging.discard()
            raise ValueError(f"{self._written} of {self.n_chunks} chunks written")
        self._staging.publish(replace=self.replace)

    def discard(self) -> None:
        if not self._f.closed:
            self._f.close()
        self._staging.discard()
