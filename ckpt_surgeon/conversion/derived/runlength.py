"""Run-length maps: a 1-D integer array as runs of constant or counting values, and the values back at any
positions.  The probe's maps (:mod:`.probe_child`, :mod:`.packed`) are kept this way, not element by element."""
from __future__ import annotations

import numpy as np


def runs(values: np.ndarray, slope: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (1-D integers, or floats holding integers below 2**24: exact) as runs: (start positions, the
    value at each) where inside a run each value is the one before plus ``slope`` (0: constant runs; 1:
    counting runs)."""
    if not values.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1] + slope) + 1)).astype(np.int64)
    return starts, values[starts].astype(np.int64)


def at(run: tuple, slope: int, pos: np.ndarray) -> np.ndarray:
    """The values of :func:`runs`' ``run`` (``slope`` as it was made) at positions ``pos``."""
    starts, vals = run
    r = np.searchsorted(starts, pos, side="right") - 1
    return vals[r] + slope * (pos - starts[r])
