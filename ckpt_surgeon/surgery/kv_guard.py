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


def predicted_ratio(before: KC.KvLayerStats, after: KC.KvLayerStats, geom: KC.KvGeometry, types, kind: str) -> float:
    """RMS over ``types`` of the layer's predicted error after / before (``kind`` ``k`` or ``v``; 1 where
    there was no error to lower)."""
    r = []
    for t in types:
        b = KC.layer_error(before, geom, t, kind)
        r.append(KC.layer_error(after, geom, t, kind) / b if b > 0 else 1.0)
    return float(np.sqrt(np.mean(np.square(r)))) if r else 1.0


def keep_gain(st: KC.KvLayerStats, geom: KC.KvGeometry, types_k, types_v, alpha: np.ndarray, phi, m,
              min_gain: float = MIN_GAIN):
    """``(alpha, phi, m)`` as chosen, or the identity for the K side (alpha 1, phi None) and / or the V side
    (m 1) where the predicted gain is under ``min_gain`` (0: no guard)."""
    if min_gain <= 0:
        return alpha, phi, m
    new = st.scaled(alpha=alpha)
    new = new.turned(phi, geom.pairs) if phi is not None else new
    if predicted_ratio(st, new, geom, types_k, "k") > 1.0 - min_gain:
        alpha, phi = np.ones_like(alpha), None
    if m is not None and predicted_ratio(st, st.scaled(m=m), geom, types_v, "v") > 1.0 - min_gain:
        m = np.ones_like(m)
    return alpha, phi, m


def is_identity(alpha: np.ndarray, phi, m) -> bool:
    """True when the layer's transform changes nothing (no step needs writing)."""
    return bool(np.all(alpha == 1.0) and (phi is None or not np.any(phi)) and (m is None or np.all(m == 1.0)))
