"""``kv-equalize``'s no-harm guard: a layer keeps its own weights unless the prediction promises a real gain.

Why: the static prediction (:mod:`ckpt_surgeon.analysis.kv_cache`) ranks layers well and finds the large gains
(a bias that sets the step of its blocks), but it cannot resolve gains of a few per cent: the equalized model
rounds into a different block pattern, and that alone moves the measured KLD by a few per cent either way.
On widened tiny models of every registry family (``benchmarks/bench_kv_harm.py``, llama.cpp itself) layers
predicted 0.5-1.5 % better measured up to 5 % *worse* (llama_bias, q4_0 K and V: 1.050x).  So the pair scales
and turns of a layer are kept only where they lower the layer's predicted K error by at least
:data:`MIN_GAIN` (RMS over the target K types of after / before); otherwise the layer stays as it is (alpha 1,
no turn).  The value map is judged the same way on the predicted V error.  The planted layers of the
Qwen2.5-7B fixture are predicted 2-5x better and pass; its clean layers (1-5 % predicted) are left alone.
"""
from __future__ import annotations

import numpy as np

from ..analysis import kv_cache as KC

MIN_GAIN = 0.10      # predicted error must fall by >= 10 %: below that the measured change is rounding noise


class LayerErrors:
    """One layer's predicted errors (:func:`ckpt_surgeon.analysis.kv_cache.layer_error`), each computed once: the
    guard and the plan's record ask for the same figures (before; K after the pair scales and turns; V after the
    value map), and an unchanged side's "after" is its "before" (scales of 1 and turns by 0 leave every modelled
    moment bit for bit as it was)."""

    def __init__(self, st: KC.KvLayerStats, geom: KC.KvGeometry):
        self.st, self.geom, self._memo = st, geom, {}

    def _get(self, key, stats: KC.KvLayerStats, t: str, kind: str) -> float:
        if key not in self._memo:
            self._memo[key] = KC.layer_error(stats, self.geom, t, kind)
        return self._memo[key]

    @property
    def rot(self) -> tuple:
        """``(rotate(k), rotate(q))`` of the unchanged layer (:func:`ckpt_surgeon.analysis.kv_cache.k_errors`)."""
        if "rot" not in self._memo:
            g, st = self.geom, self.st
            self._memo["rot"] = (KC.rotate(st.k_mean, st.k_var, g), KC.rotate(st.q_mean, st.q_var, g))
        return self._memo["rot"]

    def k_heads(self, t: str) -> np.ndarray:
        """Per kv head, the unchanged layer's K error for type ``t`` (what ``k_errors(st, geom, ct)`` gives)."""
        key = ("k heads", t)
        if key not in self._memo:
            self._memo[key] = KC.k_errors(self.st, self.geom, KC.CACHE_TYPES[t], self.rot)["error"]
        return self._memo[key]

    def before(self, t: str, kind: str) -> float:
        if kind == "k":         # layer_error's own expression, on the heads' figures computed once
            key = ("before", t, kind)
            if key not in self._memo:
                self._memo[key] = float(np.sqrt(np.mean(self.k_heads(t) ** 2)))
            return self._memo[key]
        return self._get(("before", t, kind), self.st, t, kind)

    def k_after(self, t: str, alpha: np.ndarray, phi) -> float:
        """K error with q pairs x ``alpha``, k / ``alpha``, pairs turned by ``phi`` (the value map leaves K alone)."""
        if np.all(alpha == 1.0) and (phi is None or not np.any(phi)):
            return self.before(t, "k")
        key = ("k", alpha.tobytes(), None if phi is None else phi.tobytes(), t)
        return self._get(key, _turned(self.st.scaled(alpha=alpha), phi, self.geom), t, "k")

    def v_after(self, t: str, m: np.ndarray | None) -> float:
        """V error with value dims x ``m`` (the q/k transform leaves V alone)."""
        if m is None or np.all(m == 1.0):
            return self.before(t, "v")
        return self._get(("v", m.tobytes(), t), self.st.scaled(m=m), t, "v")


def _turned(st: KC.KvLayerStats, phi, geom: KC.KvGeometry) -> KC.KvLayerStats:
    return st.turned(phi, geom.pairs) if phi is not None else st


def _ratio(before: list[float], after: list[float]) -> float:
    """RMS over the types of after / before (1 where there was no error to lower)."""
    r = [a / b if b > 0 else 1.0 for b, a in zip(before, after)]
    return float(np.sqrt(np.mean(np.square(r)))) if r else 1.0


def predicted_ratio(before: KC.KvLayerStats, after: KC.KvLayerStats, geom: KC.KvGeometry, types, kind: str) -> float:
    """RMS over ``types`` of the layer's predicted error after / before (``kind`` ``k`` or ``v``; 1 where
    there was no error to lower)."""
    return _ratio([KC.layer_error(before, geom, t, kind) for t in types],
                  [KC.layer_error(after, geom, t, kind) for t in types])


def keep_gain(st: KC.KvLayerStats, geom: KC.KvGeometry, types_k, types_v, alpha: np.ndarray, phi, m,
              min_gain: float = MIN_GAIN, errors: LayerErrors | None = None):
    """``(alpha, phi, m)`` as chosen, or the identity for the K side (alpha 1, phi None) and / or the V side
    (m 1) where the predicted gain is under ``min_gain`` (0: no guard); ``errors``: the layer's
    :class:`LayerErrors` (the figures then serve the plan's record too)."""
    if min_gain <= 0:
        return alpha, phi, m
    e = errors if errors is not None else LayerErrors(st, geom)
    if _ratio([e.before(t, "k") for t in types_k], [e.k_after(t, alpha, phi) for t in types_k]) > 1.0 - min_gain:
        alpha, phi = np.ones_like(alpha), None
    if m is not None and _ratio([e.before(t, "v") for t in types_v],
                                [e.v_after(t, m) for t in types_v]) > 1.0 - min_gain:
        m = np.ones_like(m)
    return alpha, phi, m


def is_identity(alpha: np.ndarray, phi, m) -> bool:
    """True when the layer's transform changes nothing (no step needs writing)."""
    return bool(np.all(alpha == 1.0) and (phi is None or not np.any(phi)) and (m is None or np.all(m == 1.0)))
