"""``diff``: what changed between two checkpoints, tensor by tensor.

Any two sources (HF folder, .safetensors, .gguf, Hub repo id, or a mix) are opened through
:func:`~ckpt_surgeon.checkpoint.open_checkpoint`.  When one side is a GGUF and the other is not,
the GGUF names are mapped to HF names through the conversion tables
(:mod:`ckpt_surgeon.conversion.names`) and each tensor goes through the same GGUF -> HF
transform the converter applies (llama-arch Q/K rows un-permuted, GPT-2 Conv1D transposed back,
Gemma norms shifted by -1), so a GGUF is compared with the HF model it came from.

Per tensor pair:

- different shapes: ``shape_changed`` (headers only, no data read);
- same dtype, same shape, no transform: the stored bytes are compared in row chunks
  (:meth:`Checkpoint.read_rows`, bounded memory).  Equal bytes are ``identical`` without any
  decoding; otherwise the chunks are decoded and ``changed`` gets max |Δ|, the relative
  Frobenius norm ‖B − A‖ / ‖A‖ and the cosine of the flattened tensors, all in float64;
- a different dtype (F16 vs F32, Q4_K vs BF16 ...) or a GGUF transform: both sides are decoded
  (quantized GGUF tensors are dequantized only here, i.e. when the other side's bytes cannot be
  compared directly) and compared by value: ``dtype_changed`` with the same figures, or
  ``identical`` / ``changed`` when the dtypes agree.  Between two float types a ``dtype_changed`` tensor whose
  values moved by more than the two types' rounding can move them (:func:`beyond_rounding`) counts as changed in
  the verdict: a fine-tune saved in float16 is not "the same weights re-encoded".

A quantized checkpoint (GPTQ, AWQ, MLX, bitsandbytes ... :mod:`ckpt_surgeon.formats.quant.quantized`) is
compared through its logical names: each quantized Linear's dequantized weight against the other
side's; with one side quantized and the other not, names and shapes agreeing and the errors of
quantization size, the verdict is ``quantized`` ("same model, quantized (method, bits): relative
error ...").

Remote (Hub) sides are read by HTTP range under a byte budget: by default only headers and the
1-D tensors (biases and norms) are compared by content; ``max_bytes`` widens that (smallest
tensors first), ``full`` reads everything.  A pair left out by the budget is ``not_compared``
(its header agrees).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoint import Checkpoint, open_checkpoint
from ..errors import UnsupportedError
from ..records import finite_or_none as _num

STATUSES = ("identical", "changed", "dtype_changed", "shape_changed", "only_in_a", "only_in_b", "not_compared")

# Bytes of stored data read per side per step when streaming a tensor: 8 MiB keeps the float64
# working copies of a chunk (two sides and their difference) well under 100 MB.
CHUNK_BYTES = 8 << 20

# Verdict thresholds.  A fine-tune moves most tensors by a few percent of their norm (LoRA-merged
# and full fine-tunes of 7B models measure ‖Δ‖/‖A‖ ~ 1e-3 .. 1e-1); two independently trained or
# initialised models have ‖Δ‖/‖A‖ ~ sqrt(2) and cosine ~ 0 (independent random matrices).
FINETUNE_MIN_CHANGED_SHARE = 0.5     # most common tensors changed ...
FINETUNE_MAX_REL = 0.2               # ... by a small relative amount (median ‖Δ‖/‖A‖)
UNRELATED_MIN_REL = 0.5              # median ‖Δ‖/‖A‖ above this: not the same weights
UNRELATED_MAX_SHARED = 0.5           # fewer than half the names (with equal shapes) in common
RESCALED_MIN_COSINE = 0.8            # quantized with norms rescaled (AWQ): weights still point the same way

# A GGUF norm stored as 1 + w (Gemma: llama.cpp's converter adds the 1 in float32) gives back w
# only up to the rounding of that addition: half an ulp of a value in [1, 4), at most 2**-22.
NORM_SHIFT_ROUNDING = 2.0 ** -22
# unit roundoff of the float types (IEEE binary64 / binary32 / binary16, bfloat16's 8-bit significand): a value
# rounded to one moves by at most that share of itself, so a tensor re-encoded from A's float type to B's (or both
# from a common source) moves by at most u_A + u_B of its Frobenius norm; binary16's subnormals move a tiny value
# by up to 2^-25 whatever its size, so a tensor whose largest change is below that is within rounding too
UNIT_ROUNDOFF = {"F64": 2.0 ** -53, "F32": 2.0 ** -24, "F16": 2.0 ** -11, "BF16": 2.0 ** -8}
F16_SUBNORMAL_ROUNDING = 2.0 ** -25

_LAYER = re.compile(r"(?:^|\.)(\d+)\.")


@dataclass(frozen=True)
class TensorDiff:
    """One tensor pair.  ``name`` is the common (HF when the sides mix naming) name."""

    name: str
    status: str
    layer: int | None
    name_a: str | None
    name_b: str | None
    shape_a: tuple | None
    shape_b: tuple | None
    dtype_a: str | None
    dtype_b: str | None
    max_abs: float | None = None      # max |B - A|
    rel_fro: float | None = None      # ‖B - A‖_F / ‖A‖_F
    cosine: float | None = None       # <A, B> / (‖A‖ ‖B‖)
    method: str = "header"            # header | bytes | values | same_file | budget
    transform: str = "none"           # GGUF -> HF transform applied to the GGUF side

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape_a"] = list(self.shape_a) if self.shape_a is not None else None
        d["shape_b"] = list(self.shape_b) if self.shape_b is not None else None
        return d


@dataclass(frozen=True)
class LayerDiff:
    """Per-layer summary (``layer`` None: tensors outside the decoder layers)."""

    layer: int | None
    counts: dict
    max_rel_fro: float | None
    min_cosine: float | None

    def to_dict(self) -> dict:
        return {"layer": self.layer, "counts": dict(self.counts), "max_rel_fro": self.max_rel_fro,
                "min_cosine": self.min_cosine}


@dataclass(frozen=True)
class DiffReport:
    """What :func:`diff` returns; ``to_dict()`` is the JSON contract, ``to_frame()`` one row per tensor."""

    source_a: str
    source_b: str
    format_a: str
    format_b: str
    naming: str                       # hf | gguf: the names the rows use
    # identical | tokenizer_differs (identical weights) | changed | finetune | reencoded | quantized | unrelated
    verdict: str
    verdict_line: str
    tensors: tuple
    layers: tuple
    counts: dict
    bytes_read_a: int = 0
    bytes_read_b: int = 0
    requests: int = 0
    notes: tuple = ()
    warnings: tuple = ()
    tokenizer: object = None          # TokenizerDiff: the tokenizers and chat templates compared

    @property
    def identical(self) -> bool:
        return self.verdict == "identical"

    def changed(self) -> list[TensorDiff]:
        return [t for t in self.tensors if t.status != "identical"]

    def to_dict(self) -> dict:
        return {"source_a": self.source_a, "source_b": self.source_b, "format_a": self.format_a,
                "format_b": self.format_b, "naming": self.naming, "verdict": self.verdict,
                "verdict_line": self.verdict_line, "counts": dict(self.counts),
                "tensors": [t.to_dict() for t in self.tensors], "layers": [lr.to_dict() for lr in self.layers],
                "bytes_read_a": self.bytes_read_a, "bytes_read_b": self.bytes_read_b, "requests": self.requests,
                "tokenizer": self.tokenizer.to_dict() if self.tokenizer is not None else None,
                "notes": list(self.notes), "warnings": list(self.warnings)}

    def rows(self, *, changed_only: bool = False) -> list[dict]:
        out = []
        for t in self.tensors:
            if changed_only and t.status == "identical":
                continue
            out.append({"tensor": t.name, "status": t.status, "layer": t.layer,
                        "shape_a": "x".join(map(str, t.shape_a)) if t.shape_a is not None else None,
                        "shape_b": "x".join(map(str, t.shape_b)) if t.shape_b is not None else None,
                        "dtype_a": t.dtype_a, "dtype_b": t.dtype_b, "max_abs": t.max_abs, "rel_fro": t.rel_fro,
                        "cosine": t.cosine})
        return out

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())

    def layer_rows(self) -> list[dict]:
        return [{"layer": "global" if lr.layer is None else lr.layer,
                 **{s: lr.counts.get(s, 0) for s in STATUSES if any(x.counts.get(s) for x in self.layers)},
                 "max_rel_fro": lr.max_rel_fro, "min_cosine": lr.min_cosine} for lr in self.layers]

    def summary_items(self) -> list[tuple[str, str]]:
        counts = ", ".join(f"{v} {k}" for k, v in self.counts.items() if v)
        items = [("A", f"{self.source_a} ({self.format_a})"), ("B", f"{self.source_b} ({self.format_b})"),
                 ("verdict", self.verdict_line), ("tensors", counts or "none")]
        if self.tokenizer is not None:
            items += self.tokenizer.summary_items()
        changed_layers = [lr for lr in self.layers if any(lr.counts.get(s) for s in STATUSES if s != "identical")]
        # Each layer named as "layer N": a bare "0" here read as "no layer differs" (issue 24).
        items.append(("layers that differ",
                      ", ".join("global tensors" if lr.layer is None else f"layer {lr.layer}"
                                for lr in changed_layers) or "none"))
        items.append(("bytes read", f"A {self.bytes_read_a:,}, B {self.bytes_read_b:,}"
                      + (f" in {self.requests} request(s)" if self.requests else "")))
        return items


# --------------------------------------------------------------------------- naming


@dataclass(frozen=True)
class _Side:
    """A checkpoint's tensors under the names the comparison uses."""

    ck: Checkpoint
    names: dict                       # common name -> (stored name, transform)
    shapes: dict                      # common name -> shape after the transform
    hp: dict = field(default_factory=dict)
    derived: tuple = ()               # GGUF tensors that carry a config setting, not weights (rope_freqs)
    gather: object = None             # a GGUF on the derived path: its HF tensors by llama.cpp's class's learned
    #                                   inverse (:func:`...conversion.derived.to_hf.learned_inverse`)
    index: dict = field(default_factory=dict)   # HF name -> the gatherer's tensor number
    dropped: tuple = ()               # HF tensors llama.cpp's class drops whole (in no GGUF tensor)

    @property
    def remote(self) -> bool:
        return self.ck.format.startswith("hub")


def _side(ck: Checkpoint, to_hf: bool, other: Checkpoint | None = None) -> _Side:
    """Name table of one side; ``to_hf``: a GGUF side is mapped to HF names (``other``, the HF side)."""
    if not to_hf or ck.naming != "gguf":
        return _Side(ck, {n: (n, "none") for n in ck.tensors}, {n: tuple(i.shape) for n, i in ck.tensors.items()})
    from ..conversion import names as N
    from ..conversion.from_gguf import hparams_from_gguf
    from ..conversion.transforms import lookup
    arch = ck.gguf_arch or ck.metadata.get("general.architecture")
    spec = N.by_gguf_arch(arch)
    if spec is None and other is not None and isinstance(other.config, dict) and other.config.get("model_type") \
            and _llamacpp_class(other.config):
        return _derived_side(ck, other)
    if spec is None:
        raise UnsupportedError(f"GGUF architecture {arch!r} has no HF name mapping, so it cannot be compared with "
                               f"an HF source (mapped: {', '.join(a.gguf_arch for a in N.ARCHS)}); compare it "
                               "with another GGUF instead", path=ck.source, hint=_WAY_ROUND)
    hp = hparams_from_gguf(ck.metadata, arch, ck.source)
    # HF spellings as the converted model's config has them (Falcon: input_layernorm or ln_mlp)
    table = N.gguf_to_hf_names(spec, N.hf_config_case(spec, hp, ck.tensors))
    names, shapes, derived = {}, {}, []
    for gname, info in ck.tensors.items():
        if gname in _config_tensors(spec):
            derived.append(gname)
            continue
        hit = table.match(gname)
        hname, transform = (hit[0], hit[1].transform) if hit else (gname, "none")
        shape = tuple(info.shape)
        if lookup(transform).transposes and len(shape) == 2:
            shape = shape[::-1]
        names[hname] = (gname, transform)
        shapes[hname] = shape
    return _Side(ck, names, shapes, hp, tuple(derived))


_WAY_ROUND = ("`ckpt-surgeon convert HF_FOLDER -o HF.gguf` writes the folder's GGUF (through llama.cpp's own "
              "converter class where the registry has none), then diff the two files: weights and tokenizers")


def _llamacpp_class(cfg: dict) -> bool:
    """Whether llama.cpp's converter registers a text class for the HF config's ``architectures[0]`` (its sources
    are then needed: without them the refusal stands, naming the way round)."""
    from ..conversion.derived.source import architecture_maps, converter_root
    from ..errors import CkptError
    archs = cfg.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        return False
    try:
        return archs[0] in architecture_maps(converter_root())[0]
    except CkptError:
        return False


def _derived_side(ck: Checkpoint, hf: Checkpoint) -> _Side:
    """A GGUF of an architecture the registry does not map, against an HF checkpoint with a config: its HF tensors are
    gathered back by the inverse of llama.cpp's converter class, learned by probing the class on that config (which
    must give the file's metadata and tensor plan: else one line, not the config the file was made from)."""
    from ..conversion.derived.to_hf import learned_inverse
    from ..errors import CkptError
    arch = ck.gguf_arch or ck.metadata.get("general.architecture")
    try:
        gather, result = learned_inverse(ck, hf.config, Path(ck.source), allow_dropped=True)
    except CkptError as e:
        raise UnsupportedError(f"GGUF architecture {arch!r} has no HF name mapping, and llama.cpp's converter class "
                               f"run on {hf.source}'s config does not give this file ({e.detail}"
                               + (f", tensor {e.tensor}" if e.tensor else "") + "), so they cannot be compared "
                               "tensor by tensor; compare it with another GGUF instead", path=ck.source,
                               hint=_WAY_ROUND) from e
    first = gather.source_of()
    names, shapes, index = {}, {}, {}
    dropped = set(result.get("dropped") or ())
    for k, (name, shape) in enumerate(gather.hf, 1):
        if name in dropped:         # in no GGUF tensor: the HF side's own (only_in_b), named in a note
            continue
        names[name] = (first.get(name, ""), "derived")
        shapes[name] = tuple(shape)
        index[name] = k
    return _Side(ck, names, shapes, {}, tuple(result["generated"]), gather, index, tuple(sorted(dropped)))


def _config_tensors(spec) -> tuple:
    """GGUF tensors that hold a config setting of ``spec`` (the rope scaling llama.cpp's converter
    writes as a tensor: config.json says it on the HF side)."""
    from ..conversion.from_gguf import LONGROPE_TENSORS, ROPE_FREQS
    return ((ROPE_FREQS,) if "llama3" in spec.rope_scalings else ()) + \
        (LONGROPE_TENSORS if "longrope" in spec.rope_scalings else ())


def _layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- comparison


class _Acc:
    """Running float64 sums for max |Δ|, ‖Δ‖, ‖A‖, ‖B‖ and <A, B> over chunks."""

    def __init__(self):
        self.max_abs = 0.0
        self.dd = self.aa = self.bb = self.ab = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a = np.asarray(a, np.float64).reshape(-1)
        b = np.asarray(b, np.float64).reshape(-1)
        d = b - a
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))
        self.dd += float(d @ d)
        self.aa += float(a @ a)
        self.bb += float(b @ b)
        self.ab += float(a @ b)

    def figures(self) -> tuple[float | None, float | None, float | None]:
        rel = math.sqrt(self.dd) / math.sqrt(self.aa) if self.aa > 0 else (0.0 if self.dd == 0 else None)
        den = math.sqrt(self.aa) * math.sqrt(self.bb)
        cos = self.ab / den if den > 0 else None
        return _num(self.max_abs), _num(rel), _num(cos)

    @property
    def equal(self) -> bool:
        return self.dd == 0.0 and math.isfinite(self.aa)


def _row_plan(ck_a: Checkpoint, na: str, ck_b: Checkpoint, nb: str) -> tuple[list, int]:
    """Row ranges of about CHUNK_BYTES each (by the wider side) and the bytes one range holds."""
    ia, ib = ck_a.tensors[na], ck_b.tensors[nb]
    rows = ia.shape[0] if ia.shape else 1
    per_row = max(1, max(ia.nbytes, ib.nbytes) // max(rows, 1))
    step = max(1, CHUNK_BYTES // per_row)
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)], min(step, rows) * per_row


class BufferPool:
    """Pairs of reusable chunk buffers by size (a fresh 8 MiB buffer per tensor costs its page
    faults every time: measured 1.4 s of 2.7 s on a 2 x 1 GiB pair).  A few sizes at most."""

    def __init__(self, keep: int = 4):
        from concurrent.futures import ThreadPoolExecutor
        self.keep = keep
        self._pairs: dict[int, tuple[bytearray, bytearray]] = {}
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="diff-read")   # reads side B beside side A

    def close(self) -> None:
        self.reader.shutdown()

    def get(self, size: int) -> tuple[bytearray, bytearray]:
        pair = self._pairs.pop(size, None) or (bytearray(size), bytearray(size))
        self._pairs[size] = pair                      # most recent last
        while len(self._pairs) > self.keep:
            self._pairs.pop(next(iter(self._pairs)))
        return pair


def bytes_equal(ck_a: Checkpoint, na: str, ck_b: Checkpoint, nb: str, progress=None,
                pool: BufferPool | None = None) -> bool:
    """Stream both tensors' stored bytes in row chunks through two reused buffers; stop at the
    first chunk that differs.  Full chunks compare as whole bytearrays (one memcmp)."""
    if pool is None:
        pool = BufferPool()
        try:
            return bytes_equal(ck_a, na, ck_b, nb, progress, pool)
        finally:
            pool.close()
    steps, cap = _row_plan(ck_a, na, ck_b, nb)
    buf_a, buf_b = pool.get(cap)
    for r0, r1 in steps:
        # B's chunk is read in a second thread while this one reads A's (preadv releases the GIL):
        # two sequential streams in flight, as the disk's readahead wants, instead of alternating
        # single reads (measured 0.65x of plain sequential reads on a 28 GiB pair before this).
        fut = pool.reader.submit(ck_b.read_rows_into, nb, r0, r1, buf_b)
        va = ck_a.read_rows_into(na, r0, r1, buf_a)
        vb = fut.result()
        if progress:
            progress(va.nbytes + vb.nbytes)
        if va.nbytes != vb.nbytes:
            return False
        same = (buf_a == buf_b) if va.nbytes == cap else (va.tobytes() == vb.tobytes())
        if not same:
            return False
    return True


def _values_streamed(ck_a, na, ck_b, nb, progress) -> _Acc:
    acc = _Acc()
    for r0, r1 in _row_plan(ck_a, na, ck_b, nb)[0]:
        a, b = ck_a.read_rows(na, r0, r1), ck_b.read_rows(nb, r0, r1)
        if progress:
            progress(a.nbytes + b.nbytes)
        acc.add(a, b)
    return acc


def _values_whole(sa: _Side, na: str, ta: str, sb: _Side, nb: str, tb: str, progress) -> _Acc:
    """Decode both whole tensors, apply the GGUF -> HF transform, compare (the permutation and the
    transpose need the whole tensor)."""
    from ..conversion.transforms import inverse
    a = inverse(sa.ck.read(na), ta, sa.hp)
    b = inverse(sb.ck.read(nb), tb, sb.hp)
    if progress:
        progress(sa.ck.tensors[na].nbytes + sb.ck.tensors[nb].nbytes)
    acc = _Acc()
    acc.add(a, b)
    return acc


def _values_gathered(name: str, sa: _Side, sb: _Side, progress) -> _Acc:
    """One side a GGUF on the derived path: its HF tensor gathered back (with its group: a fused QKV's parts, a
    layer's stacked experts), decoded; the other side's read whole; compared as values."""
    def value(side: _Side) -> np.ndarray:
        if side.gather is not None:
            return side.gather.tensor(side.index[name])
        return side.ck.read(side.names[name][0])
    a, b = value(sa), value(sb)
    if progress:
        progress(a.nbytes + b.nbytes)
    acc = _Acc()
    acc.add(a, b)
    return acc


def _same_range(ia, ib) -> bool:
    try:
        return (ia.start, ia.end) == (ib.start, ib.end) and os.path.samefile(ia.file, ib.file)
    except OSError:
        return False


def _quant_kind(ck: Checkpoint, name: str, info) -> tuple | None:
    """(scheme, bits, group size) of an HF quantized weight (its stored type), else None."""
    t = ck.quantization.tensors.get(name) if ck.quantization is not None and info.quantized else None
    return None if t is None else (t.scheme, t.bits, t.group_size)


def _dtype_label(ck: Checkpoint, name: str, info) -> str:
    """The stored type as a user reads it: a quantized HF weight by its scheme (issue 36: two
    quantized folders showed "F32 -> F32" as dtype_changed, their dequantized view)."""
    qk = _quant_kind(ck, name, info)
    if qk is None:
        return info.dtype
    scheme, bits, group = qk
    return f"{scheme} {bits}-bit" + (f" g{group}" if group else "")


def _compare(name: str, sa: _Side, sb: _Side, read: bool, progress, pool: BufferPool) -> TensorDiff:
    na, ta = sa.names[name]
    nb, tb = sb.names[name]
    ia, ib = sa.ck.tensors[na], sb.ck.tensors[nb]
    base = dict(name=name, layer=_layer_of(name), name_a=na, name_b=nb, shape_a=sa.shapes[name],
                shape_b=sb.shapes[name], dtype_a=_dtype_label(sa.ck, na, ia), dtype_b=_dtype_label(sb.ck, nb, ib),
                transform=ta if ta != "none" else tb)
    if sa.shapes[name] != sb.shapes[name]:
        return TensorDiff(status="shape_changed", **base)
    same_dtype = ia.dtype == ib.dtype and _quant_kind(sa.ck, na, ia) == _quant_kind(sb.ck, nb, ib)
    if not read:
        return TensorDiff(status="not_compared" if same_dtype else "dtype_changed", method="budget", **base)
    if "derived" in (ta, tb):
        acc = _values_gathered(name, sa, sb, progress)
    elif (_quant_kind(sa.ck, na, ia) or _quant_kind(sb.ck, nb, ib)) and ta == tb == "none":
        acc = _values_streamed(sa.ck, na, sb.ck, nb, progress)     # a quantized weight: its dequantized values
    elif same_dtype and ta == tb == "none":
        if _same_range(ia, ib):
            return TensorDiff(status="identical", method="same_file", **base)
        if bytes_equal(sa.ck, na, sb.ck, nb, progress, pool):
            return TensorDiff(status="identical", method="bytes", **base)
        acc = _values_streamed(sa.ck, na, sb.ck, nb, progress)
    elif ta == tb == "none":
        acc = _values_streamed(sa.ck, na, sb.ck, nb, progress)
    else:
        acc = _values_whole(sa, na, ta, sb, nb, tb, progress)
    from ..conversion.transforms import lookup
    exact = {"derived": True}     # the learned inverse moves elements, it computes nothing
    inexact = not all(exact.get(t) or (t not in exact and lookup(t).exact) for t in (ta, tb))   # norm_shift: one rounding
    equal = acc.equal or (inexact and acc.max_abs <= NORM_SHIFT_ROUNDING)
    status = "dtype_changed" if not same_dtype else ("identical" if equal else "changed")
    mx, rel, cos = acc.figures()
    return TensorDiff(status=status, max_abs=mx, rel_fro=rel, cosine=cos, method="values", **base)


# --------------------------------------------------------------------------- budget


def _content_set(common: list[str], sa: _Side, sb: _Side, max_bytes: int | None, full: bool) -> set[str]:
    """Names compared by content.  Local pairs: all.  With a remote side: biases and norms (1-D)
    by default; with ``max_bytes`` the smallest tensors first while the remote bytes fit."""
    if full or not (sa.remote or sb.remote):
        return set(common)

    def remote_bytes(n):
        return sum(s.ck.tensors[s.names[n][0]].nbytes for s in (sa, sb) if s.remote)

    if max_bytes is None:
        return {n for n in common if len(sa.shapes[n]) <= 1}
    chosen, used = set(), 0
    for n in sorted(common, key=lambda n: (len(sa.shapes[n]) > 1, remote_bytes(n), n)):
        cost = remote_bytes(n)
        if used + cost > max_bytes:
            continue
        chosen.add(n)
        used += cost
    return chosen


# --------------------------------------------------------------------------- verdict


def _quantized_verdict(tensors: list[TensorDiff], quantized: set, label: str) -> tuple[str, str] | None:
    """One side quantized, the other not: the same model when the names and shapes agree, the
    quantized weights differ by quantization error and every other tensor keeps its value up to
    a cast.  None: not that (the ordinary verdict applies)."""
    counts = {s: sum(1 for t in tensors if t.status == s) for s in STATUSES}
    if counts["only_in_a"] or counts["only_in_b"] or counts["shape_changed"]:
        return None
    q = [t for t in tensors if t.name in quantized and t.rel_fro is not None]
    # AWQ (and SmoothQuant-style) quantizers divide a norm's weight by per-channel scales and
    # multiply the Linears it feeds by them (the same function): a changed norm is named, not
    # taken for a fine-tune
    norms = [t for t in tensors if t.name not in quantized and t.rel_fro and "norm" in t.name
             and len(t.shape_a or ()) == 1]
    rest = [t for t in tensors if t.name not in quantized and t.rel_fro is not None and t not in norms]
    if not q:
        return None
    rels = sorted(t.rel_fro for t in q)
    med, worst = rels[len(rels) // 2], rels[-1]
    other = max((t.rel_fro for t in rest), default=0.0)
    if other > FINETUNE_MAX_REL:
        return None
    if norms:
        # rescaled columns (positive per-channel factors) keep a weight's direction: cosine stays
        # high (0.90 on the AWQ fixtures) where unrelated weights give ~0; the norm error is no
        # measure of quantization here
        if min((t.cosine if t.cosine is not None else 0.0) for t in q) < RESCALED_MIN_COSINE:
            return None
    elif worst > UNRELATED_MIN_REL:
        return None
    line = (f"same model, quantized ({label}): relative error ‖Δ‖/‖A‖ median {med:.3g}, max {worst:.3g} over {len(q)} "
            f"quantized weights; other tensors max {other:.3g}")
    if norms:
        line += (f"; {len(norms)} norm weight(s) rescaled (max {max(t.rel_fro for t in norms):.3g}: activation "
                 "scales moved between a norm and the Linears it feeds, as AWQ does; the errors above include them)")
    return "quantized", line


def beyond_rounding(t: TensorDiff) -> bool:
    """A tensor stored as another float type whose values moved by more than rounding between the two types can
    move them (:data:`UNIT_ROUNDOFF`): not a re-encoding of the same weights.  Quantized types: False (their error
    depends on the data; the verdict says what it compared)."""
    ua, ub = UNIT_ROUNDOFF.get(t.dtype_a), UNIT_ROUNDOFF.get(t.dtype_b)
    if t.status != "dtype_changed" or ua is None or ub is None or t.rel_fro is None or t.max_abs is None:
        return False
    # 1 % above the bound: the figures are float64 sums of float32 differences (a few ulps of noise)
    return t.rel_fro > 1.01 * (ua + ub) and t.max_abs > F16_SUBNORMAL_ROUNDING + NORM_SHIFT_ROUNDING


def _verdict(tensors: list[TensorDiff], n_union: int) -> tuple[str, str]:
    counts = {s: sum(1 for t in tensors if t.status == s) for s in STATUSES}
    moved = sum(1 for t in tensors if beyond_rounding(t))       # re-encoded, and changed beyond the types' rounding
    compared = [t for t in tensors if t.status in ("identical", "changed", "dtype_changed")]
    shared = counts["identical"] + counts["changed"] + counts["dtype_changed"] + counts["not_compared"]
    rels = sorted(t.rel_fro for t in compared if t.status != "identical" and t.rel_fro is not None)
    median_rel = rels[len(rels) // 2] if rels else 0.0
    differing = counts["changed"] + counts["dtype_changed"]
    unseen = f"; {counts['not_compared']} tensor(s) not compared (byte budget)" if counts["not_compared"] else ""
    if n_union and shared / n_union < UNRELATED_MAX_SHARED:
        return "unrelated", (f"unrelated: only {shared} of {n_union} tensor names are shared with equal shapes")
    if compared and differing / len(compared) >= FINETUNE_MIN_CHANGED_SHARE and median_rel > UNRELATED_MIN_REL:
        return "unrelated", (f"unrelated: {differing} of {len(compared)} compared tensors differ, median "
                             f"‖Δ‖/‖A‖ {median_rel:.3g}")
    structural = counts["only_in_a"] + counts["only_in_b"] + counts["shape_changed"]
    if not differing and not structural:
        if counts["not_compared"]:
            return "identical", (f"identical as far as read: headers agree and {len(compared)} compared tensors "
                                 f"are identical{unseen}")
        return "identical", f"identical: {counts['identical']} tensors, same bytes or values"
    value_changed, reenc = counts["changed"] + moved, counts["dtype_changed"] - moved
    # a quantized type's error depends on the data: a change smaller than it does not show, and the line says so
    blurred = sum(1 for t in tensors if t.status == "dtype_changed" and t.rel_fro and not beyond_rounding(t)
                  and not (t.dtype_a in UNIT_ROUNDOFF and t.dtype_b in UNIT_ROUNDOFF))
    unseen += (f"; {blurred} quantized tensor(s) compared within their quantization error only (a change smaller "
               "than that would not show)") if blurred else ""
    if not value_changed and not structural:
        return "reencoded", (f"same weights re-encoded: {counts['dtype_changed']} tensor(s) in another dtype, median "
                             f"‖Δ‖/‖A‖ {median_rel:.3g}{unseen}")
    also = f"; {reenc} other tensor(s) re-encoded" if reenc and value_changed else ""
    if not value_changed:
        # tensors present on one side only, the shared ones re-encoded: not "a fine-tune" (nothing was trained)
        return "changed", (f"same architecture with {counts['only_in_a']} tensor(s) only in A, {counts['only_in_b']} "
                           f"only in B, {counts['shape_changed']} with another shape; the {reenc} shared tensor(s) "
                           f"re-encoded, median ‖Δ‖/‖A‖ {median_rel:.3g}{unseen}")
    vrels = sorted(t.rel_fro for t in compared if (t.status == "changed" or beyond_rounding(t)) and t.rel_fro is not None)
    vmedian = vrels[len(vrels) // 2] if vrels else 0.0
    if compared and value_changed / len(compared) >= FINETUNE_MIN_CHANGED_SHARE and vmedian <= FINETUNE_MAX_REL:
        return "finetune", (f"looks like a fine-tune: {value_changed} of {len(compared)} compared tensors changed by "
                            f"a small amount (median ‖Δ‖/‖A‖ {vmedian:.3g}){also}{unseen}")
    parts = [f"{value_changed} tensor(s) changed" + (f" ({moved} of them in another float type, by more than its "
                                                     "rounding)" if moved else "") + also]
    if structural:
        parts.append(f"{counts['only_in_a']} only in A, {counts['only_in_b']} only in B, "
                     f"{counts['shape_changed']} with another shape")
    return "changed", f"same architecture with {'; '.join(parts)}{unseen}"


def _layers(tensors: list[TensorDiff]) -> tuple[LayerDiff, ...]:
    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.layer, []).append(t)
    out = []
    for layer in sorted(groups, key=lambda x: (x is not None, x if x is not None else -1)):
        ts = groups[layer]
        counts = {s: sum(1 for t in ts if t.status == s) for s in STATUSES}
        rels = [t.rel_fro for t in ts if t.rel_fro is not None]
        coss = [t.cosine for t in ts if t.cosine is not None]
        out.append(LayerDiff(layer, {k: v for k, v in counts.items() if v}, max(rels) if rels else None,
                             min(coss) if coss else None))
    return tuple(out)


# --------------------------------------------------------------------------- API


def _compare_all(sa, sb, content, progress, pool) -> list:
    """One row per tensor name on either side (sorted by layer), compared or marked one-sided."""
    rows = []
    for name in sorted(set(sa.names) | set(sb.names), key=_sort_key):
        if name in sa.names and name in sb.names:
            rows.append(_compare(name, sa, sb, name in content, progress, pool))
        else:
            side, status = (sa, "only_in_a") if name in sa.names else (sb, "only_in_b")
            stored = side.names[name][0]
            info = side.ck.tensors[stored]
            in_a = status == "only_in_a"
            rows.append(TensorDiff(name=name, status=status, layer=_layer_of(name),
                                   name_a=stored if in_a else None, name_b=None if in_a else stored,
                                   shape_a=side.shapes[name] if in_a else None,
                                   shape_b=None if in_a else side.shapes[name],
                                   dtype_a=info.dtype if in_a else None, dtype_b=None if in_a else info.dtype))
    return rows


def diff_checkpoints(a: Checkpoint, b: Checkpoint, *, max_bytes: int | None = None, full: bool = False,
                     progress=None) -> DiffReport:
    """Compare two open checkpoints (see the module docstring).  ``progress(nbytes)`` is called
    with the bytes read after each step."""
    for ck in (a, b):
        ck.refuse_truncated()      # as every command but inspect: a verdict needs every tensor
        # config values checked and in agreement with the tensors, as in every command: "identical"
        # about a checkpoint whose config contradicts its tensors would be a wrong verdict
        ck.layout()
    mixed = (a.naming == "gguf") != (b.naming == "gguf")
    sa, sb = _side(a, mixed, b), _side(b, mixed, a)
    common = [n for n in sa.names if n in sb.names]
    content = _content_set(common, sa, sb, max_bytes, full)
    remote_sides = [s for s in (sa, sb) if s.remote]
    if remote_sides:
        for s in remote_sides:   # one coalesced, parallel batch of ranges per remote side
            s.ck.prefetch([s.names[n][0] for n in content if sa.shapes[n] == sb.shapes[n]])
    rows = []
    pool = BufferPool()
    try:
        rows = _compare_all(sa, sb, content, progress, pool)
    finally:
        pool.close()
    verdict, line = _verdict(rows, len(rows))
    if (a.quantization is None) != (b.quantization is None) and a.naming == b.naming == "hf":
        qck = a.quantization or b.quantization
        bits = "/".join(str(x) for x in qck.bits)
        qv = _quantized_verdict(rows, set(qck.tensors), f"{qck.method}, {bits}-bit")
        if qv is not None:
            verdict, line = qv
    counts = {s: sum(1 for t in rows if t.status == s) for s in STATUSES}
    notes = []
    tok = _tokenizers(a, b)
    if not tok.same:
        # the weights' verdict never stands alone for two files whose tokenizers differ
        verdict, line = ("tokenizer_differs", "identical weights") if verdict == "identical" else (verdict, line)
        line = f"{line}; {tok.line}"
    elif not tok.compared:
        line = f"{line}; {tok.line}"
    notes += list(tok.notes)
    notes += _naming_notes(a, b, sa, sb, mixed)
    return DiffReport(source_a=a.source, source_b=b.source, format_a=a.format, format_b=b.format,
                      naming="hf" if mixed or a.naming != "gguf" else "gguf", verdict=verdict, verdict_line=line,
                      tensors=tuple(rows), layers=_layers(rows), counts=counts, bytes_read_a=a.bytes_read,
                      bytes_read_b=b.bytes_read, requests=a.requests + b.requests, notes=tuple(notes),
                      warnings=tuple(a.warnings) + tuple(b.warnings), tokenizer=tok)


def _naming_notes(a: Checkpoint, b: Checkpoint, sa: _Side, sb: _Side, mixed: bool) -> list[str]:
    """How a GGUF side's tensors were put under HF names (the registry's map and transforms, or llama.cpp's class's
    learned inverse), and what of it was not compared."""
    notes: list[str] = []
    gs = next((s for s in (sa, sb) if s.gather is not None), None)
    if gs is not None:
        hf = b if gs is sa else a
        notes.append(f"{gs.ck.source}: an architecture the registry does not map; its tensors gathered back to HF "
                     "tensors by the inverse of llama.cpp's converter class, learned by probing the class on "
                     f"{hf.source}'s config (which gives the file's metadata and tensor plan), then compared as values")
        if gs.dropped:
            notes.append(f"{', '.join(gs.dropped)}: llama.cpp's converter class drops them (no GGUF tensor holds "
                         f"them), so they are {hf.source}'s only")
        if gs.derived:
            notes.append(f"{', '.join(gs.derived)} of {gs.ck.source}: computed from the config by llama.cpp's class "
                         "(it holds the values the config gives), not a weight: not compared")
    elif mixed:
        g = a if a.naming == "gguf" else b
        notes.append(f"GGUF names of {g.source} mapped to HF names; GGUF -> HF transforms (Q/K un-permute, "
                     "Conv1D transpose, norm shift) applied before comparing values")
        derived = (sa if g is a else sb).derived
        if derived:
            notes.append(f"{', '.join(derived)} of {g.source}: the rope scaling llama.cpp stores as a tensor (the "
                         "HF side's config.json says it), not a weight: not compared")
    return notes


def _tokenizers(a: Checkpoint, b: Checkpoint):
    """The two tokenizers compared (:mod:`.tokenizer.compare`); two HF sides whose tokenizer files are the same
    bytes hold the same tokenizer, and are not parsed (a fine-tune against its base, a surgery's output)."""
    from .tokenizer import TokenizerDiff, compare_tokenizers, read_tokenizer
    fa, fb = a.side_files, b.side_files
    if fa is not None and fb is not None and a.naming == b.naming == "hf":
        names = fa.names()
        if names and names == fb.names() and all(fa.read(n) == fb.read(n) for n in names):
            return TokenizerDiff((), "tokenizer identical (the same files)")
    return compare_tokenizers(read_tokenizer(a), read_tokenizer(b))


def _sort_key(name: str):
    layer = _layer_of(name)
    return (layer is not None, layer if layer is not None else -1, name)


def diff(a, b, *, max_bytes: int | None = None, full: bool = False, progress=None, **open_kwargs) -> DiffReport:
    """Which tensors differ between ``a`` and ``b``, by how much, with a verdict: the twin of
    ``ckpt-surgeon diff A B`` (docs/diff.md).

    ``a`` / ``b``: paths, Hub repo ids or open :class:`Checkpoint` objects, of any formats.  ``max_bytes``:
    for Hub sources, the tensor bytes that may be fetched (smallest tensors first; 0 = headers only);
    ``full``: fetch everything.  ``progress``: called with the bytes read after each step.

    Returns:
        :class:`~ckpt_surgeon.analysis.diff.DiffReport`

    Example::

        import ckpt_surgeon
        r = ckpt_surgeon.diff("all-MiniLM-L6-v2", "minilm-folded")
        r.verdict, r.counts, [t.name for t in r.changed()]
    """
    if isinstance(a, Checkpoint) and isinstance(b, Checkpoint):
        return diff_checkpoints(a, b, max_bytes=max_bytes, full=full, progress=progress)
    with _opened(a, open_kwargs) as ca, _opened(b, open_kwargs) as cb:
        return diff_checkpoints(ca, cb, max_bytes=max_bytes, full=full, progress=progress)


class _opened:
    """Open a source (or pass an open Checkpoint through without closing it)."""

    def __init__(self, src, kw):
        self.src, self.kw, self.ck, self.own = src, kw, None, not isinstance(src, Checkpoint)

    def __enter__(self) -> Checkpoint:
        self.ck = open_checkpoint(self.src, **self.kw) if self.own else self.src
        return self.ck

    def __exit__(self, *exc):
        if self.own and self.ck is not None:
            self.ck.close()
