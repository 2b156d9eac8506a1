"""The logical view of a quantized checkpoint: one dense ``[out, in]`` float32 weight per Linear.

:class:`QuantizedSource` wraps the stored reader.  Its ``tensors`` hold every stored tensor that is
not part of a quantized weight, unchanged (same info, same bytes), and one logical
:class:`~ckpt_surgeon.records.TensorInfo` per quantized Linear (``<module>.weight``, dtype F32,
``quantized=True``) in the place of its packed weight; the companions (scales, zero points, g_idx,
SCB, absmax, MLX ``biases`` ...) are hidden from role matching and reached through
:attr:`quantization`.  ``read`` of a logical weight dequantizes it
(:mod:`~ckpt_surgeon.formats.quant.kernels`); its stored bytes are not the logical weight, so
``read_bytes`` refuses it: byte copies go through :attr:`stored` (the wrapped reader).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import numpy as np

from ...errors import FormatError, UnsupportedError
from ...records import TensorInfo
from .kernels import bnb_quant_state, dequantize, fp8_scale_reading
from .schemes import SCHEMES, QuantTensor, Quantization
from ..source import SourceBase, TensorSource


class QuantizedSource(SourceBase):
    """A stored reader seen through its quantization (see the module doc)."""

    def __init__(self, stored: TensorSource, quant: Quantization, path: str | None = None):
        self.stored = stored
        self.path = path
        self._cache: tuple[str, np.ndarray] | None = None
        stored.prefetch([stored.tensors[m] for t in quant.tensors.values() for r, m in t.members
                         if r == "weight_shape" or r.startswith("weight.quant_state.")])
        qt = {n: self._complete(t) for n, t in quant.tensors.items()}
        self.quantization = replace(quant, tensors=qt)
        weight_member = {t.member(_weight_role(t)): t for t in qt.values()}
        tensors: dict[str, TensorInfo] = {}
        for name, info in stored.tensors.items():
            t = weight_member.get(name)
            if t is not None:
                tensors[t.logical] = TensorInfo(t.logical, "F32", tuple(t.shape), info.file, info.start, info.end,
                                                missing=any(stored.tensors[m].missing for _, m in t.members),
                                                quantized=True)
            elif name not in quant.hidden:
                tensors[name] = info
        self.tensors = tensors

    # -- what a header cannot say: bnb's shape blob, compressed-tensors' weight_shape, fp8's scale reading

    def _get(self, name: str) -> np.ndarray:
        info = self.stored.tensors[name]
        if info.missing:
            raise FormatError("lies past the end of a truncated file", path=info.file, tensor=name)
        return self.stored.read(info)

    def _complete(self, t: QuantTensor) -> QuantTensor:
        if t.scheme == "bnb-4bit":
            role = next(r for r, _ in t.members if r.startswith("weight.quant_state."))
            try:
                st = bnb_quant_state(self._get(t.member(role)))
                shape = tuple(int(x) for x in st["shape"])
                bs = int(st.get("blocksize", t.group_size))
            except (ValueError, KeyError, TypeError) as e:
                raise FormatError(f"quant state is not bitsandbytes' JSON with shape and blocksize ({e}) (bnb-4bit)",
                                  path=self.path, tensor=t.member(role)) from None
            n = int(np.prod(shape))
            if len(shape) != 2 or t.param("packed_elements") not in (n, n + 1):
                raise FormatError(f"packed shape contradicts bits x group size: {t.param('packed_elements')} 4-bit "
                                  f"codes stored for a weight of shape {list(shape)} (bnb-4bit)",
                                  path=self.path, tensor=t.member("weight"))
            return replace(t, shape=shape, group_size=bs)
        if t.scheme == "ct-pack":
            shp = tuple(int(x) for x in self._get(t.member("weight_shape")).reshape(-1))
            pout, pin = t.shape
            pf = 32 // t.bits
            if shp[0] != pout or not pin - pf < shp[1] <= pin:
                raise FormatError(f"packed shape contradicts bits x group size: weight_shape {list(shp)} does not fit "
                                  f"weight_packed holding [{pout}, {pin}] at {t.bits} bits (ct-pack)",
                                  path=self.path, tensor=t.member("weight_packed"))
            g = t.group_size if t.group_size > 0 else shp[1]
            cols = self.stored.tensors[t.member("weight_scale")].shape[1]
            if cols != -(-shp[1] // g):
                raise FormatError(f"packed shape contradicts bits x group size: weight_scale has {cols} group(s) per row, "
                                  f"a weight of {shp[1]} columns in groups of {g} has {-(-shp[1] // g)} (ct-pack)",
                                  path=self.path, tensor=t.member("weight_scale"))
            return replace(t, shape=shp)
        return t

    def fp8_reading(self, t: QuantTensor) -> QuantTensor:
        """An ``fp8`` weight with the meaning of its ``weight_scale_inv`` established from the values
        (read when the weight is, so opening a large remote checkpoint reads no scales)."""
        if t.param("fp8_reading"):  # fixed by its spelling (AutoFP8's weight_scale: amax/448, multiplied)
            return t
        if t.param("ue8m0"):        # powers of two by construction, multiplied (transformers' FineGrainedFP8)
            return replace(t, params=(*t.params, ("fp8_reading", "multiply")))
        s = self._get(t.member("weight_scale_inv"))
        reading = fp8_scale_reading(s)
        if reading is None:
            raise UnsupportedError("weight_scale_inv values are neither all below 1 (DeepSeek's amax/448) nor all "
                                   "above 1 (gptqmodel's 448/amax), or not finite and positive: their meaning "
                                   "cannot be established (fp8)", path=self.path, tensor=t.member("weight_scale_inv"))
        return replace(t, params=(*t.params, ("fp8_reading", reading)))

    # -- the reader protocol ----------------------------------------------------------------

    @property
    def metadata(self) -> Mapping:
        return self.stored.metadata

    @property
    def files(self) -> tuple[str, ...]:
        return self.stored.files

    @property
    def bytes_read(self) -> int:
        return self.stored.bytes_read

    @property
    def requests(self) -> int:
        return self.stored.requests

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.stored.warnings

    @property
    def missing_bytes(self) -> int:
        return self.stored.missing_bytes

    def quant_tensor(self, name: str) -> QuantTensor | None:
        return self.quantization.tensors.get(name)

    def dequantize(self, name: str) -> np.ndarray:
        """The logical weight ``name`` as float32 ``[out, in]`` (the last one is kept: a converter
        reading it row range by row range dequantizes it once)."""
        if self._cache is not None and self._cache[0] == name:
            return self._cache[1]
        t = self.quantization.tensors[name]
        if t.scheme == "fp8":
            t = self.fp8_reading(t)
        w = dequantize(t, lambda role: self._get(t.member(role)))
        if tuple(w.shape) != tuple(t.shape):
            raise FormatError(f"dequantized to shape {list(w.shape)}, expected {list(t.shape)} ({t.scheme})",
                              path=self.path, tensor=name)
        w = np.ascontiguousarray(w, dtype=np.float32)
        self._cache = (name, w)
        return w

    def rows_readable(self, name: str) -> bool:
        """Whether rows of logical weight ``name`` dequantize from the same rows of its stored members
        (:data:`ROW_SCHEMES`: every member either one row per output row or one value per tensor)."""
        t = self.quantization.tensors.get(name)
        return t is not None and t.scheme in ROW_SCHEMES

    def dequantize_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of logical weight ``name`` as float32, reading only those rows of its row
        members (a converter streams a large FP4 weight this way, never holding it whole)."""
        t = self.quantization.tensors[name]
        rows = set(SCHEMES[t.scheme].row_members)

        def get(role: str) -> np.ndarray:
            info = self.stored.tensors[t.member(role)]
            if role not in rows:
                return self._get(t.member(role))
            per_row = info.nbytes // info.shape[0]
            return self.stored.read(replace(info, shape=(stop - start,) + tuple(info.shape[1:]),
                                            start=info.start + start * per_row, end=info.start + stop * per_row))

        w = dequantize(replace(t, shape=(stop - start,) + tuple(t.shape[1:])), get)
        return np.ascontiguousarray(w, dtype=np.float32)

    def read(self, info: TensorInfo) -> np.ndarray:
        if info.quantized and info.name in self.quantization.tensors:
            full = self.tensors[info.name]
            w = self.dequantize(info.name)
            if info.start == full.start and info.end == full.end:
                return w
            raise FormatError("a row range of a quantized weight is read through Checkpoint.read_rows",
                              path=self.path, tensor=info.name)
        return self.stored.read(info)

    def _refuse_bytes(self, info: TensorInfo):
        t = self.quantization.tensors[info.name]
        raise UnsupportedError(f"is quantized ({t.scheme}, {t.bits}-bit): its stored bytes are not the logical weight; "
                               "read its values instead", path=self.path, tensor=info.name)

    def read_bytes(self, info: TensorInfo) -> bytes:
        if info.quantized and info.name in self.quantization.tensors:
            self._refuse_bytes(info)
        return self.stored.read_bytes(info)

    def read_into(self, info: TensorInfo, out) -> None:
        if info.quantized and info.name in self.quantization.tensors:
            self._refuse_bytes(info)
        self.stored.read_into(info, out)

    def prefetch(self, infos: Iterable[TensorInfo]) -> None:
        names = []
        for i in infos:
            t = self.quantization.tensors.get(i.name) if i.quantized else None
            names += [self.stored.tensors[m] for _, m in t.members] if t else [i]
        self.stored.prefetch(names)

    def close(self) -> None:
        self.stored.close()


# Schemes whose rows dequantize from the same rows of their members alone (codes and block scales one row per
# output row, the rest one value per tensor): the FP4 / MX formats.
ROW_SCHEMES = ("ct-nvfp4", "ct-mxfp4", "ct-mxfp8", "modelopt-nvfp4")


def _weight_role(t: QuantTensor) -> str:
    return SCHEMES[t.scheme].weight
