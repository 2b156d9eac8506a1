"""The per-tensor transforms between Hugging Face and GGUF, one record each.

The registry (:mod:`ckpt_surgeon.arch.families`) names a transform by its string (``"perm_q"``);
this module is the only place each is written: how a tensor goes HF -> GGUF (:attr:`Transform.forward`),
how it comes back GGUF -> HF (:attr:`Transform.inverse`), how its shape changes, what it needs from
the config and how the streaming writer (:mod:`.gguf_stream`) may cut it into chunks.  Both
directions (:mod:`.to_gguf`, :mod:`.from_gguf`), the stream writer and ``diff`` look records up by
name with :func:`lookup` (or apply them with :func:`forward` / :func:`inverse`).

Arrays are in numpy order (GGUF's ``ne`` reversed); the row axis is axis 0.  Sources: llama.cpp
``convert_hf_to_gguf.py`` (``LlamaModel.modify_tensors``'s Q/K permutation, ``GPT2Model``'s Conv1D
transpose, ``Gemma3Model``'s ``norm_shift``, ``GPTNeoXModel`` / ``BloomModel`` / ``FalconModel``'s
fused-QKV reorder to ``[Q; K; V]``).

Besides the registry's transforms: ``raw`` (GGUF -> GGUF requantization: the stored bytes are copied
as they are, never decoded) and ``"kind:i"`` (part ``i`` of a :mod:`.splits` row, made from the whole
HF tensor; joined back by :func:`.splits.join`, so it has no per-tensor inverse).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..arch import families as F
from ..errors import ConfigError

if TYPE_CHECKING:     # numpy is imported where used: from_gguf imports this module before its model-check child
    import numpy as np

__all__ = ["Transform", "RECORDS", "CHUNKINGS", "lookup", "forward", "inverse"]

CHUNKINGS = ("rows", "heads", "whole")


@dataclass(frozen=True)
class Transform:
    """One tensor transform.

    ``forward(arr, hp, path, tensor)``: HF values -> GGUF values; ``inverse(arr, hp)``: GGUF values
    -> HF values, so that ``inverse(forward(x)) == x`` (exactly, except ``norm_shift``: one rounding).
    ``needs``: the hyper-parameters (``hp`` keys, :data:`~.names.GGUF_HPARAM_KEYS` names) both read.
    ``chunking``: how :mod:`.gguf_stream` may cut the tensor: ``rows`` (any run of rows is transformed
    alone), ``heads`` (runs of whole heads of ``needs[0]``), ``whole`` (rows move across the tensor).
    ``moves_only``: values are only moved (a BF16 source may go to F16 bit for bit, never as float32).
    ``exact``: the round trip is bit-exact.  ``stored_bytes``: the stream copies the stored bytes.
    """

    name: str
    forward: Callable
    inverse: Callable
    needs: tuple[str, ...] = ()
    chunking: str = "whole"
    moves_only: bool = False
    exact: bool = True
    transposes: bool = False     # a 2-D tensor's GGUF shape is its HF shape reversed
    hf_2d: bool = False          # a 1-D GGUF tensor is HF ``[1, n]`` (llama.cpp's quantizer drops the 1)
    stored_bytes: bool = False
    doc: str = ""

    def gguf_shape(self, hf_shape: tuple) -> tuple:
        """The GGUF tensor's numpy-order shape for an HF tensor of ``hf_shape``."""
        shape = tuple(hf_shape)
        return (shape[1], shape[0]) if self.transposes and len(shape) == 2 else shape

    def hf_shape(self, gguf_shape: tuple) -> tuple:
        """The HF tensor's shape for a GGUF tensor of numpy-order ``gguf_shape``."""
        shape = tuple(gguf_shape)
        if self.transposes and len(shape) == 2:
            return (shape[1], shape[0])
        return (1,) + shape if self.hf_2d and len(shape) == 1 else shape


def _same(arr, hp, path="", tensor=""):
    """Identity (either direction)."""
    return arr


def _heads(name: str) -> str:
    return "n_head" if name == "perm_q" else "n_head_kv"


def _permute(key: str) -> tuple[Callable, Callable]:
    """perm_q / perm_k: ``[n_head * head_dim, ...]`` rows reordered within each head by
    :func:`~ckpt_surgeon.arch.layouts.llama_permute_index` (``hp[key]`` heads); weights and biases alike."""
    def fwd(arr, hp, path="", tensor=""):
        from ..arch.layouts import llama_permute_index
        n_head = hp[key]
        rows = arr.shape[0]
        if rows % n_head or (rows // n_head) % 2:
            raise ConfigError(f"{rows} rows do not split into {n_head} heads of even size", path=path, tensor=tensor)
        return arr[llama_permute_index(n_head, rows // n_head)]

    def inv(arr, hp):
        from ..arch.layouts import llama_unpermute_index
        n_head = hp[key]
        return arr[llama_unpermute_index(n_head, arr.shape[0] // n_head)]
    return fwd, inv


def _transpose(arr, hp, path="", tensor=""):
    """conv1d: a 2-D ``[in, out]`` weight <-> ``[out, in]`` (its own inverse); other ranks as they are."""
    import numpy as np
    return np.ascontiguousarray(arr.T) if arr.ndim == 2 else arr


def _shift_up(arr, hp, path="", tensor=""):
    """norm_shift HF -> GGUF: ``w`` -> ``1 + w`` as float32 (the sum formed in float64)."""
    import numpy as np
    return (arr.astype(np.float64) + 1.0).astype(np.float32)


def _shift_down(arr, hp):
    """norm_shift GGUF -> HF: ``1 + w`` -> ``w`` in float64 (one subtraction)."""
    import numpy as np
    return arr.astype(np.float64) - 1.0


def _row_back(arr, hp):
    """row GGUF -> HF: a 1-D ``[n]`` (re-written by llama.cpp's quantizer) -> ``[1, n]``; else as it is."""
    return arr[None, :] if arr.ndim == 1 else arr


def _reorder(layout: str) -> tuple[Callable, Callable]:
    """qkv_<layout>: fused QKV rows in ``layout`` <-> ``[Q; K; V]`` by
    :func:`~ckpt_surgeon.arch.layouts.concat_index` (``n_head``, ``n_head_kv``); inverse by its argsort."""
    def fwd(arr, hp, path="", tensor=""):
        from ..arch.layouts import concat_index
        return arr[concat_index(layout, hp["n_head"], hp["n_head_kv"], arr.shape[0])]

    def inv(arr, hp):
        import numpy as np

        from ..arch.layouts import concat_index
        return arr[np.argsort(concat_index(layout, hp["n_head"], hp["n_head_kv"], arr.shape[0]))]
    return fwd, inv


def _records() -> dict[str, Transform]:
    perm_q, perm_k = (Transform(n, *_permute(_heads(n)), needs=(_heads(n),), chunking="heads", moves_only=True,
                                doc="rows permuted within heads (llama.cpp LlamaModel.permute)")
                      for n in ("perm_q", "perm_k"))
    qkv = tuple(Transform(f"qkv_{lay}", *_reorder(lay), needs=("n_head", "n_head_kv"),
                          doc=f"fused QKV rows {lay} <-> [Q; K; V]") for lay in ("per_head", "grouped"))
    recs = (Transform("none", _same, _same, chunking="rows", moves_only=True, doc="as it is"),
            perm_q, perm_k,
            Transform("conv1d", _transpose, _transpose, moves_only=True, transposes=True,
                      doc="GPT-2 Conv1D [in, out] <-> [out, in]"),
            Transform("norm_shift", _shift_up, _shift_down, chunking="rows", exact=False,
                      doc="Gemma's w <-> llama.cpp's 1 + w"),
            Transform("row", _same, _row_back, hf_2d=True, doc="HF [1, n] kept 2-D; a 1-D GGUF [n] read back [1, n]"),
            *qkv,
            Transform("raw", _same, _same, chunking="rows", stored_bytes=True,
                      doc="GGUF -> GGUF: stored bytes copied as they are"))
    return {r.name: r for r in recs}


RECORDS: dict[str, Transform] = _records()
_missing = set(F.TRANSFORMS) - set(RECORDS)
if _missing:
    raise ValueError(f"registry transforms without a record in conversion/transforms.py: {sorted(_missing)}")


def _split_part(name: str) -> Transform:
    def fwd(arr, hp, path="", tensor=""):
        from .splits import split_part
        return split_part(name, arr, hp, path=path, tensor=tensor)

    def inv(arr, hp):
        raise ValueError(f"{name} is one part of a split row: its parts are joined by splits.join")
    return Transform(name, fwd, inv, doc="one part of a split row (.splits)")


def lookup(name: str) -> Transform:
    """The record of transform ``name`` (a registry transform, ``raw``, or a split part ``"kind:i"``).
    ``KeyError`` for any other name."""
    rec = RECORDS.get(name)
    if rec is not None:
        return rec
    if ":" in name:
        return _split_part(name)
    raise KeyError(f"unknown tensor transform {name!r} (known: {', '.join(RECORDS)}, or a split part kind:i)")


def forward(arr: np.ndarray, name: str, hp: dict, *, path: str = "", tensor: str = "") -> np.ndarray:
    """HF tensor -> GGUF tensor (numpy order) by transform ``name``; exact except ``norm_shift``
    (one float32 rounding).  ``path`` / ``tensor`` name the source in a refusal."""
    return lookup(name).forward(arr, hp, path, tensor)


def inverse(arr: np.ndarray, name: str, hp: dict) -> np.ndarray:
    """GGUF tensor -> HF tensor (numpy order) by transform ``name``; exact except ``norm_shift``
    (one float64 subtraction)."""
    return lookup(name).inverse(arr, hp)
