"""GGUF -> HF on the derived path, for a class that takes a tensor only in a release's *packed* form and moves its
bits into a ggml block type (DeepSeek-V4's routed experts: the release's MXFP4 codes and exponents, which llama.cpp's
``repack_mxfp4_blocks`` moves into ``block_mxfp4`` bytes): the bit map learned by probing, as :mod:`.probe_child`
learns float maps, one *nibble* (4 bits) at a time.

The form (:data:`FORMS`) says only how the release stores a float ``[..., cols]`` weight: the names, dtypes and
shapes of its parts (codes two to a byte beside the weight's name, one exponent byte per block of the ggml type's
block size under a sibling name); which part goes where is learned from the class, never retyped.

The learning.  Every nibble of every packed HF tensor is an *element*; every ggml block of the class's output is
``P = 2 x type size`` nibbles (an MXFP4 block: 34, the exponent byte then 16 code bytes).  Probe passes give each
packed element a 4-bit digit of its HF tensor's id (``nid``) or of its place inside its tensor's block (``npos``:
an element's index modulo the tensor's elements per block, 32 codes or 2 exponent nibbles); a block-wise repack
puts one HF tensor, one place, at each output column, so each column is kept as runs of ids over blocks and one
place (memory: a few numbers a column and an expert, not the tensor).  The HF block each output block came from is
counted in order (the k-th block of a tensor seen in a column is its block k); that, and everything else, is
*proved* on a random pass (:meth:`NibbleLearner.on_rand`): seeded random bytes in, every output nibble must be the
nibble the map names, and every HF nibble must be reached.  A class that computes instead of moving bits fails the
proof and is refused in one line.

The map of one output tensor is an array of rows ``(column, first output block, HF id, first HF block, place)``:
the parent (:mod:`.to_hf`) gathers the file's bytes back through it (:func:`scatter`) and maps them forward again
(:func:`predict`), bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NIBBLE = 4


@dataclass(frozen=True)
class Form:
    """How a release stores a float weight ``NAME.weight [..., cols]`` packed for ggml type ``ggml_type``: the codes
    (``bits`` each, packed along the row) under the weight's own name as ``codes_dtype``, and one exponent byte per
    block of the ggml type's block size under ``NAME.<scale_suffix>`` as ``scale_dtype``."""
    ggml_type: str
    bits: int
    codes_dtype: str
    scale_suffix: str
    scale_dtype: str


# llama.cpp's ``ModelBase.repack_mxfp4_blocks`` reads this source (its docstring: compressed-tensors
# "mxfp4-pack-quantized", also used by DeepSeek-V4: packed uint8 [rows, cols/2], element 2i in the low nibble;
# scale uint8 [rows, cols/32], one E8M0 exponent per 32-element group); the dtypes are those of DeepSeek-V4's release
# (int8 codes, float8_e8m0fnu exponents), which transformers' FP8 integration reads
FORMS = (Form("MXFP4", 4, "I8", "scale", "F8_E8M0"),)


def packed_parts(form: Form, name: str, shape: tuple, block: int) -> dict | None:
    """``name -> (stored shape, dtype, elements per block)`` of the parts ``form`` stores float weight ``name``
    (``shape``) as, with ggml blocks of ``block`` values; None where it cannot (not a ``.weight``, a row not a whole
    number of blocks)."""
    if not name.endswith(".weight") or len(shape) < 2 or shape[-1] % block:
        return None
    per_byte = 8 // form.bits
    scale = name.removesuffix(".weight") + "." + form.scale_suffix
    return {name: ((*shape[:-1], shape[-1] // per_byte), form.codes_dtype, block),
            scale: ((*shape[:-1], shape[-1] // block), form.scale_dtype, 8 // NIBBLE)}


def nibbles(raw: np.ndarray) -> np.ndarray:
    """Bytes -> their nibbles, low one first (uint8, twice as many)."""
    b = np.ascontiguousarray(raw).view(np.uint8).ravel()
    out = np.empty(b.size * 2, np.uint8)
    out[0::2], out[1::2] = b & 0x0F, b >> 4
    return out


def pack(nib: np.ndarray) -> np.ndarray:
    """Nibbles (low one first) -> bytes (uint8)."""
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def probe_bytes(kind: str, k: int, numel: int, per_block: int, digit: int = 0) -> np.ndarray:
    """HF tensor ``k``'s packed bytes (``numel`` of them) for a nibble pass: every nibble digit ``digit`` of ``k``
    (``nid``), of its place in its block (``npos``), or seeded random bytes (``nrand``)."""
    if kind == "nrand":
        return np.random.default_rng(k).integers(0, 256, numel, dtype=np.uint8)
    if kind == "nid":
        return np.full(numel, ((k >> (NIBBLE * digit)) & 15) * 17, np.uint8)
    place = (np.arange(2 * numel, dtype=np.int64) % per_block >> (NIBBLE * digit)) & 15
    return pack(place.astype(np.uint8))


def digits_for(largest: int) -> int:
    """Nibble passes that carry integers up to ``largest``."""
    return max(1, -(-max(1, largest).bit_length() // NIBBLE))


def columns(rows: np.ndarray, n_blocks: int):
    """The rows of a map as (column, output blocks slice, HF id, first HF block, place)."""
    for i, (q, a, k, c, p) in enumerate(rows.tolist()):
        b = rows[i + 1, 1] if i + 1 < len(rows) and rows[i + 1, 0] == q else n_blocks
        yield q, slice(a, int(b)), k, c, p


def predict(rows: np.ndarray, n_blocks: int, width: int, hf_nibbles, per_block: dict) -> np.ndarray:
    """The output tensor's nibbles ``[n_blocks, width]`` the map makes from the HF tensors' nibbles
    (``hf_nibbles(k)``)."""
    out = np.zeros((n_blocks, width), np.uint8)
    for q, s, k, c, p in columns(rows, n_blocks):
        out[s, q] = hf_nibbles(k).reshape(-1, per_block[k])[c:c + s.stop - s.start, p]
    return out


def scatter(rows: np.ndarray, out: np.ndarray, hf: dict, per_block: dict) -> None:
    """The HF tensors' nibbles (``hf``: id -> flat nibble array, filled here) from the output's nibbles
    ``[n_blocks, width]``."""
    for q, s, k, c, p in columns(rows, out.shape[0]):
        hf[k].reshape(-1, per_block[k])[c:c + s.stop - s.start, p] = out[s, q]


class NibbleLearner:
    """The nibble passes' outputs (raw ggml blocks the class writes), kept a column at a time as runs."""

    def __init__(self, packed: dict, numel: dict, names: list):
        self.packed, self.numel, self.names = packed, numel, names     # id -> elements per block; id -> bytes
        self.ids: dict = {}          # output -> [per pass: [per column: runs]]
        self.place: dict = {}        # output -> place of each column
        self.shape: dict = {}        # output -> (n_blocks, width)
        self.maps: dict = {}
        self.refusal: str | None = None
        self.digit = 0
        self._last = (0, None)

    def _refuse(self, why: str) -> None:
        self.refusal = self.refusal or why

    def _blocks(self, t, raw, type_size: int) -> np.ndarray:
        nib = nibbles(raw)
        self.shape[t] = (nib.size // (2 * type_size), 2 * type_size)
        return nib.reshape(self.shape[t])

    def on_id(self, t, raw, type_size):
        from .runlength import runs
        cols = self._blocks(t, raw, type_size)
        self.ids.setdefault(t, []).append([runs(cols[:, q], 0) for q in range(cols.shape[1])])

    def on_place(self, t, raw, type_size):
        cols = self._blocks(t, raw, type_size)
        same = np.all(cols == cols[:1], axis=0)
        if not same.all():
            self._refuse(f"GGUF tensor {t}: llama.cpp's converter does not move the packed tensors' bits block by "
                         "block (a place inside a block lands in several places of an output column), so the probe "
                         "cannot invert it")
            return
        self.place[t] = self.place.get(t, 0) + (cols[0].astype(np.int64) << (NIBBLE * self.digit))

    def merge(self) -> None:
        from .runlength import at
        for t, passes in self.ids.items():
            if t not in self.place:         # refused on the place passes
                continue
            n_blocks, width = self.shape[t]
            rows = []
            for q in range(width):
                starts = np.unique(np.concatenate([p[q][0] for p in passes]))
                ids = sum(at(p[q], 0, starts) << (NIBBLE * d) for d, p in enumerate(passes))
                keep = np.concatenate(([True], ids[1:] != ids[:-1]))
                starts, ids = starts[keep], ids[keep]
                seen: dict = {}
                for a, b, k in zip(starts.tolist(), np.append(starts[1:], n_blocks).tolist(), ids.tolist()):
                    rows.append((q, a, k, seen.get(k, 0), int(self.place[t][q])))
                    seen[k] = seen.get(k, 0) + b - a
            self.maps[t] = rows = np.array(rows, np.int64).reshape(-1, 5)
            bad = next((r for r in rows.tolist() if r[2] not in self.packed or r[4] >= self.packed[r[2]]), None)
            if bad is not None:
                self._refuse(f"GGUF tensor {t}: written as raw ggml blocks whose bits come from no packed HF tensor "
                             "the probe gave (llama.cpp's converter computes them), so it cannot be inverted")
        self.ids = {}

    def hf_nibbles(self, k: int) -> np.ndarray:
        if self._last[0] != k:
            self._last = (k, nibbles(probe_bytes("nrand", k, self.numel[k], self.packed[k])))
        return self._last[1]

    def on_rand(self, t, raw, type_size):
        """Proof: seeded random bytes in, every output nibble is the one the map names."""
        if t not in self.maps or self.refusal:
            return
        got = self._blocks(t, raw, type_size)
        if not np.array_equal(predict(self.maps[t], *got.shape, self.hf_nibbles, self.packed), got):
            self._refuse(f"GGUF tensor {t}: llama.cpp's converter does not only move the packed tensors' bits "
                         "(block by block, in order), so the probe cannot invert it")

    def check_coverage(self) -> None:
        """Every nibble of every packed HF tensor reaches some output nibble."""
        reach: dict = {}
        for t, rows in self.maps.items():
            for q, s, k, c, p in columns(rows, self.shape[t][0]):
                reach.setdefault((k, p), []).append((c, c + s.stop - s.start))
        for k, per_block in self.packed.items():
            blocks = 2 * self.numel[k] // per_block
            for p in range(per_block):
                end = 0
                for a, b in sorted(reach.get((k, p), ())):
                    end = max(end, b) if a <= end else end
                if end < blocks:
                    self._refuse(f"HF tensor {self.names[k - 1]}: some of its packed bits reach no GGUF tensor "
                                 "(llama.cpp's converter drops them), so the GGUF cannot give it back")
                    return
