"""Evaluate llama.cpp's lazy tensors one output at a time, holding each intermediate only while an output
still to be written needs it.

llama.cpp's converter class builds every output tensor as a chain of gguf-py lazy tensors (``LazyBase``: a
function, its arguments, the node's own result once evaluated): the stored tensor read, ``.to(float32)``,
its permutations, splits, stacks, ``.numpy()``.  ``LazyBase.to_eager`` evaluates a chain and keeps every
node's result on the node, and each node's arguments replaced by their results.  llama.cpp's own writer
drops an output once written, so its chain goes with it; but while an output is being written, its stored
tensor (bf16, say), the float32 copy the class made of it and the encoded output all live at once.

Here the same functions run on the same arguments, in the same order, so the values are the same; what
changes is only which results are kept: a node's result is kept on the node only when more than one
pending output reaches it (a fused QKV split three ways, one stored tensor written twice), and dropped
when the last of them is written.  A chain's intermediates are otherwise freed as soon as the next step
has consumed them (the stored bf16 bytes once their float32 copy exists).

An output whose chain is only element-wise casts of one stored tensor (the read, ``.to(float32)``,
``.numpy()``, ``.astype``: what llama.cpp's ``prepare_tensors`` does to a weight it writes as it is; the
embedding and the MLP matrices of most models) is not evaluated whole: :meth:`Evaluator.row_chain`
recognises it, and :class:`RowChain` runs the same functions on slabs of the stored tensor's outermost
axis.  A cast maps each element on its own, so slab by slab gives every element the value the whole
evaluation gives it; memory is then a slab, not the stored tensor beside its float32 copy.
"""
from __future__ import annotations

from collections import Counter

__all__ = ["Evaluator", "RowChain", "identity_leaf"]

_CASTS = {"float", "half", "bfloat16", "contiguous"}      # element-wise methods taking no argument


def _method(func) -> str | None:
    """The tensor method a gguf-py lazy node calls (``LazyMeta.__getattr__``'s wrapper closes over its name)."""
    if "__getattr__.<locals>.<lambda>" in getattr(func, "__qualname__", "") and \
            func.__code__.co_freevars == ("name",):
        return func.__closure__[0].cell_contents
    return None


def _elementwise(node, lazy_base) -> bool:
    """True when ``node`` is one element-wise cast of its one lazy argument (nothing else lazy, no kwargs)."""
    args, qual = node._args, getattr(node._func, "__qualname__", "")
    astype = qual.endswith("LazyNumpyTensor.astype.<locals>.<lambda>")
    # astype's copy= says whether a same-type cast returns a copy: the values are the same either way
    if (node._kwargs and not (astype and set(node._kwargs) <= {"copy"})) or not args or \
            not isinstance(args[0], lazy_base) or any(isinstance(a, (lazy_base, list, tuple)) for a in args[1:]):
        return False
    if qual.endswith("LazyTorchTensor.numpy.<locals>.<lambda>"):
        return len(args) == 1
    if astype:
        return len(args) == 2
    method = _method(node._func)
    if method == "to":
        import torch
        return len(args) == 2 and isinstance(args[1], torch.dtype)
    return method in _CASTS and len(args) == 1


def _keeps_float32(node) -> bool:
    """True when the element-wise cast ``node`` gives float32 (or float64) input back unchanged."""
    qual = getattr(node._func, "__qualname__", "")
    if qual.endswith("LazyTorchTensor.numpy.<locals>.<lambda>"):
        return True
    if qual.endswith("LazyNumpyTensor.astype.<locals>.<lambda>"):
        import numpy as np
        return np.dtype(node._args[1]) in (np.float32, np.float64)
    method = _method(node._func)
    if method == "to":
        import torch
        return node._args[1] in (torch.float32, torch.float64)
    return method in ("float", "contiguous")


def identity_leaf(value, lazy_base, leaf_func):
    """The argument of the leaf (``leaf_func``'s node) when ``value`` is that leaf's tensor through element-wise
    casts that give float32 values back unchanged (``.to(float32)``, ``.numpy()``, ``.astype(float32)``), of the
    same shape: every element of the output is the leaf's element at the same flat index.  Else None."""
    node = value
    while isinstance(node, lazy_base):
        if node._func is leaf_func:
            ok = len(node._args) == 1 and tuple(node._meta.shape) == tuple(value._meta.shape)
            return node._args[0] if ok else None
        if not _elementwise(node, lazy_base) or not _keeps_float32(node):
            return None
        node = node._args[0]
    return None


class RowChain:
    """Output = casts of stored tensor ``leaf`` (``steps``: the nodes from the read outwards)."""

    def __init__(self, leaf: str, shape: tuple, steps: list):
        self.leaf, self.shape, self._steps = leaf, shape, steps

    def slabs(self, read_rows, piece_bytes: int):
        """(first row, the chain's value on rows ``first:first + k`` of the stored tensor), about
        ``piece_bytes`` of float32 a slab; ``read_rows(leaf, start, stop)`` reads the stored rows."""
        per_row = 1
        for d in self.shape[1:]:
            per_row *= int(d)
        step = max(1, piece_bytes // max(1, per_row * 4))
        for first in range(0, self.shape[0], step):
            x = read_rows(self.leaf, first, min(first + step, self.shape[0]))
            for node in self._steps:
                x = node._func(x, *node._args[1:])
            yield first, x


class Evaluator:
    """``roots``: output name -> its lazy value (or an eager array); ``lazy_base``: gguf-py's ``LazyBase``."""

    def __init__(self, lazy_base, roots: dict):
        self._lazy = lazy_base
        self._nodes: dict[str, list] = {}
        self._users: Counter = Counter()
        for name, root in roots.items():
            nodes = self._walk(root)
            self._nodes[name] = nodes
            for n in nodes:
                self._users[id(n)] += 1

    def _walk(self, root) -> list:
        """Every lazy node ``root`` depends on (itself included), once each."""
        seen, out, stack = set(), [], [root]
        while stack:
            o = stack.pop()
            if isinstance(o, (list, tuple)):
                stack.extend(o)
            elif isinstance(o, self._lazy) and id(o) not in seen:
                seen.add(id(o))
                out.append(o)
                if o._data is None:
                    stack.extend(o._args)
        return out

    def _arg(self, o):
        if isinstance(o, (list, tuple)):
            items = [self._arg(x) for x in o]
            return tuple(items) if isinstance(o, tuple) else items
        return self._eval(o) if isinstance(o, self._lazy) else o

    def _eval(self, node):
        if node._data is not None:
            return node._data
        result = node._func(*self._arg(node._args), **(node._kwargs or {}))
        if self._users[id(node)] > 1:           # another pending output reaches it: keep it for that one
            node._data = result
        return result

    def row_chain(self, value, leaf_func) -> RowChain | None:
        """``value`` as a :class:`RowChain` when it is element-wise casts, not shared with another pending
        output and not evaluated yet, of a stored tensor of 2+ dimensions read by ``leaf_func(name)``."""
        steps, node = [], value
        while isinstance(node, self._lazy) and node._data is None and self._users[id(node)] == 1:
            if node._func is leaf_func:
                shape = tuple(node._meta.shape)
                if len(node._args) != 1 or len(shape) < 2 or tuple(value._meta.shape) != shape or not shape[0]:
                    return None
                return RowChain(node._args[0], shape, steps[::-1])
            if not _elementwise(node, self._lazy):
                return None
            steps.append(node)
            node = node._args[0]
        return None

    def eager(self, name: str, value):
        """The value of output ``name`` (evaluated now), then its chain released (:meth:`release`)."""
        try:
            return self._eval(value) if isinstance(value, self._lazy) else value
        finally:
            self.release(name)

    def release(self, name: str) -> None:
        """Output ``name`` is written: each node only it still needed drops its result and arguments."""
        for n in self._nodes.pop(name, ()):
            self._users[id(n)] -= 1
            if self._users[id(n)] <= 0:
                del self._users[id(n)]
                n._data, n._args = None, ()
