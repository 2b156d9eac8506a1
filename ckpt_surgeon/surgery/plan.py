"""Surgery plans: frozen records of which tensor changes how, and their execution.

A :class:`Plan` lists :class:`TensorStep` records (only the tensors that change; every other
tensor is copied byte for byte by the writer), the new ``config.json`` if the architecture
declaration changes, and human notes.  Planners (:mod:`.fold`, :mod:`.qkv`) build plans from a
:class:`~ckpt_surgeon.arch.resolve.ModelLayout` and the registry; nothing here branches on a model
name.  :func:`execute` streams the plan through the writer one tensor at a time: each step is
evaluated lazily, when the writer reaches its slot, so memory holds one layer's tensors at most.

Step ops (``TensorStep.op``):

``zero_rows``     value op: ``ops.zero_rows(inputs[0], rows)``
``fold_v_bias``   value op: ``ops.fold_v_bias(b_o=inputs[0], w_o=inputs[1], b_v=inputs[2][v_rows])``
                  (then ``ops.center`` when ``center`` is set: ``fold-bias --v --center``)
``center``        value op: ``ops.center(inputs[0], axis)`` (mean over the hidden-size axis removed)
``scale_axis``    value op: ``ops.scale_axis(inputs[0], scale, axis, offset[, turn])`` (kv-equalize)
``split_qkv``     layout op on raw bytes: part ``q|k|v`` of ``inputs[0]``
``fuse_qkv``      layout op on raw bytes: ``inputs = (q, k, v)``
``split_halves``  layout op on raw bytes: part ``0|1`` of ``inputs[0]`` along ``axis``
``delete``        ``inputs[0]`` is not written
``rename``        ``inputs[0]`` copied as raw bytes under ``out``

Value ops compute in float64 from the source values and are cast back once by the writer; layout
ops move bit patterns (or whole quantized GGUF rows) and never convert a number.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from . import ops

VALUE_OPS = ("zero_rows", "fold_v_bias", "center", "scale_axis")
LAYOUT_OPS = ("split_qkv", "fuse_qkv", "split_halves")
STRUCT_OPS = ("delete", "rename")


@dataclass(frozen=True)
class TensorStep:
    """One output tensor (or one deletion): how it is computed from which source tensors."""

    op: str
    out: str | None                 # output tensor name (None for delete)
    inputs: tuple                   # source tensor names
    params: tuple = ()              # sorted (key, value) pairs; values are numbers, strings or tuples
    like: str | None = None         # source tensor whose slot (shard, position) it takes
    dtype: str | None = None        # output dtype (safetensors or GGUF type name); None: like's
    shape: tuple | None = None      # output shape (numpy order); None: like's
    layer: int | None = None
    why: str = ""

    def param(self, key: str, default=None):
        for k, v in self.params:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict:
        params = {}
        for k, v in self.params:
            params[k] = (f"{len(v)} indices" if isinstance(v, tuple) and len(v) > 8 else (list(v) if isinstance(v, tuple) else v))
        return {"op": self.op, "out": self.out, "inputs": list(self.inputs), "params": params,
                "dtype": self.dtype, "shape": list(self.shape) if self.shape is not None else None,
                "layer": self.layer, "why": self.why}


def step_params(**kw) -> tuple:
    """Frozen, sorted params for a :class:`TensorStep` (lists/arrays become tuples of Python ints)."""
    out = []
    for k, v in sorted(kw.items()):
        if isinstance(v, np.ndarray):
            v = tuple(int(x) for x in v.tolist())
        elif isinstance(v, list):
            v = tuple(v)
        out.append((k, v))
    return tuple(out)


@dataclass(frozen=True)
class Plan:
    """What a surgery will do.  ``rows()`` are per-layer records of the planner (for reports)."""

    operation: str                  # fold-bias | qkv-fuse | qkv-split
    source: str
    params: dict
    steps: tuple                    # TensorStep, in no particular order (the writer orders output)
    config: dict | None = None      # new config.json; None: copied unchanged
    config_changes: tuple = ()      # (key, old, new)
    layers: tuple = ()              # planner-specific frozen per-layer records with to_dict()
    notes: tuple = ()
    record: dict = field(default_factory=dict)   # extra JSON-able facts for __metadata__ (e.g. qkv_layout)
    outcome: str | None = None      # a summary line when the plan does less than asked ("nothing removed: ...")

    @property
    def changed(self) -> tuple:
        return tuple(s.out for s in self.steps if s.op not in ("delete",))

    @property
    def deleted(self) -> tuple:
        return tuple(s.inputs[0] for s in self.steps if s.op == "delete")

    def metadata_params(self) -> dict:
        d = dict(self.params)
        d.update(self.record)
        d["tensors_changed"] = len(self.changed)
        d["tensors_deleted"] = len(self.deleted)
        if self.config_changes:
            d["config_changes"] = {k: new for k, _, new in self.config_changes}
        return json.loads(json.dumps(d, default=_jsonable))

    def to_dict(self) -> dict:
        return {"operation": self.operation, "source": self.source, "params": json.loads(json.dumps(self.params, default=_jsonable)),
                "steps": [s.to_dict() for s in self.steps],
                "config_changes": [{"key": k, "old": o, "new": n} for k, o, n in self.config_changes],
                "layers": [r.to_dict() for r in self.layers], "notes": list(self.notes), "record": self.record,
                "outcome": self.outcome}

    def summary_items(self) -> list[tuple[str, str]]:
        """A plan shown on its own is a dry run: it says so, and what a run would change."""
        items = [("operation", self.operation), ("source", self.source),
                 ("dry run", "nothing written"),
                 ("tensors a run would change", str(len(self.changed))),
                 ("tensors a run would delete", str(len(self.deleted)))]
        if self.outcome:
            items.append(("result", self.outcome))
        items += [(f"config {k}", f"{o!r} -> {n!r}") for k, o, n in self.config_changes]
        return items

    def rows(self) -> list[dict]:
        if self.layers:
            return [r.row() if hasattr(r, "row") else r.to_dict() for r in self.layers]
        return [{"tensor": s.out or s.inputs[0], "op": s.op, "layer": s.layer,
                 "inputs": ", ".join(s.inputs), "why": s.why} for s in self.steps]


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return str(v)


@dataclass(frozen=True)
class SurgeryResult:
    """A plan and what writing it produced; renders as a report (``emit`` in cli/render.py)."""

    plan: Plan
    write: object                   # formats.write.writer.WriteResult
    out: str
    warnings: tuple = ()

    @property
    def notes(self) -> tuple:
        return self.plan.notes

    def to_dict(self) -> dict:
        d = {"out": self.out, "operation": self.plan.operation, "params": self.plan.to_dict()["params"],
             "layers": [r.to_dict() for r in self.plan.layers],
             "tensors_changed": sorted(self.plan.changed), "tensors_deleted": sorted(self.plan.deleted),
             "config_changes": self.plan.to_dict()["config_changes"], "notes": list(self.plan.notes),
             "outcome": self.plan.outcome, "write": self.write.to_dict()}
        return d

    def rows(self) -> list[dict]:
        return self.plan.rows()

    def summary_items(self) -> list[tuple[str, str]]:
        w = self.write
        modes = sorted({s.mode for s in w.shards})
        items = [("operation", self.plan.operation), ("source", self.plan.source), ("output", self.out),
                 *([("result", self.plan.outcome)] if self.plan.outcome else []),
                 ("tensors changed", str(len(self.plan.changed))), ("tensors deleted", str(len(self.plan.deleted))),
                 ("tensors copied byte-identical", str(w.tensors_copied)),
                 ("shards", f"{len(w.shards)} ({', '.join(modes)})"),
                 ("written", f"{w.bytes_written:,} bytes in {w.seconds:.2f} s"),
                 ("source hash", f"{w.source_hash} ({w.hash_scope})" if w.source_hash else "-"),
                 ("reread check", w.check_scope)]
        for k, o, n in self.plan.config_changes:
            items.append((f"config {k}", f"{o!r} -> {n!r}"))
        return items


# ----------------------------------------------------------------------------- evaluation

class _Evaluator:
    """Computes step values from a Checkpoint, caching the last few inputs (one layer's worth)."""

    def __init__(self, ckpt, cache_items: int = 6):
        self.ck = ckpt
        self._cache: OrderedDict = OrderedDict()
        self._n = cache_items

    def _memo(self, key, fn):
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        val = fn()
        self._cache[key] = val
        while len(self._cache) > self._n:
            self._cache.popitem(last=False)
        return val

    def value(self, name: str) -> np.ndarray:
        return self._memo(("v", name), lambda: np.asarray(self.ck.read(name), dtype=np.float64))

    def raw(self, name: str) -> np.ndarray:
        """Bit patterns: rows of raw bytes (axis 0 gathers work on any type, quantized GGUF rows too)."""
        return self._memo(("r", name), lambda: self.ck.read_raw(name))

    def units(self, name: str, axis: int) -> np.ndarray:
        """The tensor's bit patterns, shaped for a gather along ``axis``.

        Along axis 0 of a matrix the unit is a whole row of bytes, so quantized GGUF rows move
        intact; vectors and last-axis gathers (Conv1D ``[in, out]``) move single elements.
        """
        # a quantized weight's stored members (codes, scales) move by their stored names
        info = self.ck.stored_tensors[name] if name in self.ck.stored_tensors else self.ck.tensors[name]
        buf = self.raw(name)
        if len(info.shape) >= 2 and axis == 0:
            return np.frombuffer(buf, dtype=np.uint8).reshape(info.shape[0], -1)
        return _element_units(buf, info)

    def run(self, step: TensorStep):
        op = step.op
        if op == "zero_rows":
            return ops.zero_rows(self.value(step.inputs[0]), np.asarray(step.param("rows"), dtype=np.int64))
        if op == "fold_v_bias":
            b_o, w_o, src = step.inputs
            b_v = self.value(src)[np.asarray(step.param("v_rows"), dtype=np.int64)]
            out = ops.fold_v_bias(self.value(b_o), self.value(w_o), b_v, step.param("n_heads"), step.param("n_kv_heads"),
                                  step.param("head_dim"), w_o_in_out=bool(step.param("w_o_in_out", False)))
            return ops.center(out) if step.param("center", False) else out
        if op == "center":
            return ops.center(self.value(step.inputs[0]), int(step.param("axis", 0)))
        if op == "scale_axis":
            turn = step.param("turn_a")
            fast = self._scale_pow2(step) if not step.param("offset", 0.0) else None
            if fast is not None:
                return fast
            return ops.scale_axis(self.value(step.inputs[0]), np.asarray(step.param("scale"), dtype=np.float64),
                                  int(step.param("axis", 0)), float(step.param("offset", 0.0)),
                                  None if turn is None else (turn, step.param("turn_b"), step.param("turn_angle")))
        if op == "split_qkv":
            axis = int(step.param("axis", 0))
            name = step.inputs[0]
            parts = self._memo(("split", name, step.param("layout"), axis), lambda: ops.split_qkv(
                self.units(name, axis), step.param("layout"), step.param("n_heads"), step.param("n_kv_heads"),
                step.param("head_dim"), axis=axis))
            return np.ascontiguousarray(parts["qkv".index(step.param("part"))]).tobytes()
        if op == "fuse_qkv":
            axis = int(step.param("axis", 0))
            q, k, v = (self.units(n, axis) for n in step.inputs)
            return np.ascontiguousarray(ops.fuse_qkv(q, k, v, step.param("layout"), step.param("n_heads"),
                                                     step.param("n_kv_heads"), step.param("head_dim"), axis=axis)).tobytes()
        if op == "split_halves":
            axis = int(step.param("axis", 0))
            name = step.inputs[0]
            parts = self._memo(("halves", name, axis), lambda: ops.split_halves(self.units(name, axis), axis=axis))
            return np.ascontiguousarray(parts[int(step.param("part"))]).tobytes()
        raise ValueError(f"unknown step op {op!r}")


    def _scale_pow2(self, step: TensorStep) -> bytes | None:
        """A ``scale_axis`` whose scales are all powers of two, on the stored bits (exact, no float64 pass:
        :func:`ops.scale_pow2_bits`); None where that does not apply (other scales or dtypes, or an element
        leaving the normal range: the float64 product is then rounded once, as for any scale)."""
        scale = np.asarray(step.param("scale"), dtype=np.float64)
        if not scale.size or not np.all(scale > 0):
            return None
        exps = np.round(np.log2(scale))
        if not np.array_equal(np.exp2(exps), scale):
            return None
        name = step.inputs[0]
        info = self.ck.tensors[name]
        if info.quantized or info.dtype not in ops.POW2_DTYPES:
            return None
        turned = step.param("turn_a") is not None
        if turned and int(step.param("axis", 0)) % len(info.shape) != 0:
            return None                  # a turn along another axis (Conv1D): the float64 path
        raw = self.ck.read_raw(name)
        out = ops.scale_pow2_bits(raw, info.dtype, tuple(info.shape), exps.astype(np.int64),
                                  int(step.param("axis", 0)))
        if out is None or not turned:
            return out
        return _turned_rows(out, raw, info, scale, step)


def _turned_rows(bits: bytes, raw, info, scale: np.ndarray, step: TensorStep) -> bytes:
    """A turned ``scale_axis`` (axis 0) on top of its power-of-two product ``bits``: the rows a turn moves are
    computed as the float64 path computes them (``ops.scale_axis`` on just those rows, the same expressions
    element by element, rounded once by the writer's own cast); every other row is the exact product, with a
    zero made +0 as ``(x + 0) * s`` makes it there.  The same bytes as the float64 path over the whole tensor,
    without decoding, scaling and rounding the rows no turn touches."""
    from ..formats.write.cast import cast_to_dtype

    unit = np.dtype("<u2" if info.dtype in ("BF16", "F16") else "<u4")
    n = int(info.shape[0])
    u = np.frombuffer(bits, dtype=unit).reshape(n, -1).copy()
    u[u == unit.type(1 << (8 * unit.itemsize - 1))] = 0           # -0 -> +0
    ia, ib = (np.asarray(step.param(k), dtype=np.int64) for k in ("turn_a", "turn_b"))
    rows = np.unique(np.concatenate([ia, ib]))
    src = np.frombuffer(raw, dtype=unit).reshape(n, -1)[rows]
    if info.dtype == "BF16":
        vals = (src.astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        vals = src.view(np.float16 if info.dtype == "F16" else np.float32)
    vals = vals.astype(np.float64).reshape((len(rows),) + tuple(info.shape[1:]))
    sub = ops.scale_axis(vals, scale[rows], 0, 0.0, (np.searchsorted(rows, ia), np.searchsorted(rows, ib),
                                                     step.param("turn_angle")))
    u[rows] = np.frombuffer(cast_to_dtype(sub, info.dtype), dtype=unit).reshape(len(rows), -1)
    return u.tobytes()


def _element_units(buf: bytes, info) -> np.ndarray:
    """Raw bytes as one unsigned integer per element (non-quantized dtypes only)."""
    numel = info.numel
    if numel == 0 or len(buf) % numel:
        raise ValueError(f"{info.name}: {info.dtype} elements are not whole bytes; cannot move single elements")
    return ops.raw_rows(buf, tuple(info.shape), len(buf) // numel)


def execute(ckpt, plan: Plan, out, *, force: bool = False, check: str = "auto", source_hash: str = "auto",
            writer=None, progress: bool | None = False) -> SurgeryResult:
    """Write ``plan`` applied to ``ckpt`` into ``out`` (atomic; see formats/write/writer.py).

    ``writer``: an already open writer for ``out`` (see :func:`plan_while_copying`).
    ``progress``: a bar over the bytes written (None: only when stderr is a terminal).
    """
    from ..formats.write.writer import open_writer

    ev = _Evaluator(ckpt)
    w = writer if writer is not None else open_writer(out, ckpt, force=force, check=check, source_hash=source_hash,
                                                         progress=progress)
    with w:
        for step in plan.steps:
            if step.op == "delete":
                w.drop(step.inputs[0])
            elif step.op == "rename":
                w.copy(step.inputs[0], as_name=step.out)
            else:
                w.put(step.out, (lambda s=step: ev.run(s)), dtype=step.dtype, shape=step.shape,
                      like=step.like if step.like is not None else step.out)
        if plan.config is not None:
            w.set_config(plan.config)
        w.record(plan.operation, plan.metadata_params())
    return SurgeryResult(plan=plan, write=w.result, out=str(w.result.out))


def plan_while_copying(ckpt, out, make_plan, *, force: bool = False, check: str = "auto",
                       source_hash: str = "auto", early: bool = True, progress: bool | None = False) -> SurgeryResult:
    """``execute(make_plan())``, with the writer's kernel copy of the source shards running in the
    background while ``make_plan`` works (fold-bias --approximate reads every W_q for its bound:
    seconds on a 7B model, hidden behind the copy).  If planning fails (a refusal), the copy is
    cancelled and nothing is left at ``out``."""
    from ..formats.write.writer import open_writer

    w = open_writer(out, ckpt, force=force, check=check, source_hash=source_hash, progress=progress)
    try:
        if early:
            w.begin_copy()
        plan = make_plan()
    except BaseException:
        w.abort()
        raise
    return execute(ckpt, plan, out, writer=w)
