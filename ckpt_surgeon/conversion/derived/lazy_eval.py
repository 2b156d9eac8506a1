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
"""
from __future__ import annotations

from collections import Counter

__all__ = ["Evaluator"]


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
