"""Rope geometry of a model: which dims rotate together and how fast (numpy only).

What the key-bias bound (:mod:`ckpt_surgeon.analysis.bounds`) and measured mode
(:mod:`ckpt_surgeon.analysis.measure`) need from a layout's rope settings: the rotary pairs
(:func:`~ckpt_surgeon.arch.layouts.rotary_pairs`), the largest frequency each pair can turn at
under the config's rope scaling, and the attention factor yarn / longrope put on cos and sin.
Both config spellings are read (transformers 5 ``rope_parameters``, possibly one dict per layer
type; Hub-era ``rope_scaling``).  Every value is type- and range-checked where it is read
(:mod:`.checked`): a string factor or a list of strings for ``short_factor`` is one
``ConfigError`` naming config.json and the key (``rope_scaling.factor``), not a ``ValueError``.  It is a fact about the architecture and its config, so it
lives with the layout, not with either analysis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .checked import F32_MAX, MAX_POSITIONS, POSITIVE, Bounds, config_int, describe
from .layouts import rotary_pairs
from .resolve import ModelLayout

# Bounds of the rope-scaling fields read here (transformers modeling_rope_utils reads the same
# fields; a zero mscale means "not set" there, as here).  Factors are at most float32's largest
# (llama.cpp stores rope.scaling.factor as a float32; the bound squares the attention factor,
# which stays finite).  original_max_position_embeddings is at least 2: longrope divides by its
# logarithm.
_FACTOR = Bounds("float", 0, F32_MAX, above=True)
_MSCALE = Bounds("float", 0, F32_MAX)
_ORIGINAL_POSITIONS = Bounds("int", 2, MAX_POSITIONS)


def rope_inv_freq(theta: float, rotary_dim: int) -> np.ndarray:
    """``w_j = theta ** (-2j / rotary_dim)`` for ``j < rotary_dim / 2`` (float64, shape ``[r/2]``).

    Mirrors transformers' ``_compute_default_rope_parameters`` (``1 / base ** (arange(0, r, 2) / r)``).
    """
    return 1.0 / (float(theta) ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))



@dataclass(frozen=True, eq=False)
class RopeGeometry:
    """What the bound needs from the rope settings (one per model)."""

    rotary_dim: int
    pair_layout: str
    pairs: np.ndarray                # [P, 2] dims within a head
    inv_freq: np.ndarray             # [P] the largest frequency each pair can turn at
    attention_factor: float          # cos/sin multiplier (yarn / longrope); logits scale by its square
    rope_type: str
    supported: bool                  # False: unknown scaling type -> fractions shown, no bound
    note: str | None = None

    def to_dict(self) -> dict:
        return {"rotary_dim": self.rotary_dim, "pair_layout": self.pair_layout, "rope_type": self.rope_type,
                "attention_factor": self.attention_factor, "supported": self.supported, "note": self.note}


def full_attention_rope(rp) -> dict:
    """The rope parameters of the full-attention layers from a config's ``rope_parameters`` (flat,
    or one dict per layer type in transformers 5), as llama.cpp's converter reads them; {} when
    there are none."""
    full = rp.get("full_attention", rp) if isinstance(rp, dict) else None
    return full if isinstance(full, dict) else {}


def _rope_dicts(cfg: dict) -> list[tuple[str, dict]]:
    """(name as messages show it, rope parameter dict), both spellings (transformers 5
    ``rope_parameters``, possibly one per layer type; Hub-era ``rope_scaling``)."""
    rp = cfg.get("rope_parameters")
    out = []
    if isinstance(rp, dict) and rp:
        if all(isinstance(v, dict) for v in rp.values()):
            out.extend((f"rope_parameters.{k}", v) for k, v in rp.items())
        else:
            out.append(("rope_parameters", rp))
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict) and rs:
        out.append(("rope_scaling", rs))
    return out


def _field(d: dict, name: str, key: str, bounds: Bounds, path: str | None):
    """``d[key]`` checked (None when absent); the message names it ``<name>.<key>``."""
    v = d.get(key)
    return None if v is None else bounds.check(f"{name}.{key}", v, path=path, integral_floats=True)


def _factors(d: dict, name: str, key: str, path: str | None) -> np.ndarray | None:
    """``short_factor`` / ``long_factor``: a list of finite positive numbers (None when absent)."""
    v = d.get(key)
    if v is None:
        return None
    if not (isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                        and math.isfinite(x) and x > 0 for x in v)):
        raise ConfigError(f"{name}.{key} is {describe(v)}; it must be a list of finite positive numbers", path=path)
    return np.asarray(v, dtype=np.float64)


def _scaling(name: str, d: dict, cfg: dict, n_pairs: int,
             path: str | None) -> tuple[np.ndarray, float, str, bool, str | None]:
    """(frequency multiplier ``[P]``, attention factor, type, supported, note) for one rope dict."""
    rtype = str(d.get("rope_type") or d.get("type") or "default")
    ones = np.ones(n_pairs)
    factor = _field(d, name, "factor", _FACTOR, path)
    # Frequencies only go down when factors are >= 1; guard against factor < 1 anyway.
    up = 1.0 / min(1.0, factor) if factor else 1.0
    if rtype == "default":
        return ones, 1.0, rtype, True, None
    if rtype in ("linear", "dynamic", "llama3"):
        return ones * up, 1.0, rtype, True, f"rope {rtype} scaling lowers frequencies; the bound uses unscaled ones"
    if rtype not in ("yarn", "longrope"):
        return ones, 1.0, rtype, False, f"rope scaling type {rtype!r} is not modelled: fractions use unscaled frequencies, no bound"
    af = _field(d, name, "attention_factor", _FACTOR, path)
    omax = _field(d, name, "original_max_position_embeddings", _ORIGINAL_POSITIONS, path)
    max_pos = config_int(cfg, ("max_position_embeddings",), path=path, minimum=1, maximum=MAX_POSITIONS)
    if rtype == "yarn":
        if af is None:
            f = factor
            if f is None and omax and max_pos:
                f = max_pos / omax
            f = float(f or 1.0)

            def mscale(s, m=1.0):   # modeling_rope_utils._compute_yarn_parameters.get_mscale
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            ms, ms_all = (_field(d, name, k, _MSCALE, path) for k in ("mscale", "mscale_all_dim"))
            if ms and ms_all:
                af = mscale(f, ms) / mscale(f, ms_all)
            else:
                af = mscale(f)
        return ones * up, float(af), rtype, True, "rope yarn: unscaled frequencies, logits scaled by attention_factor^2"
    # longrope
    ext = [e for e in (_factors(d, name, k, path) for k in ("short_factor", "long_factor")) if e is not None]
    mult = ones.copy()
    for e in ext:
        if e.shape == (n_pairs,):
            mult = np.maximum(mult, 1.0 / np.minimum(e, 1.0))
    if af is None:
        if omax is None:
            omax = config_int(cfg, ("original_max_position_embeddings",), path=path, minimum=2,
                              maximum=MAX_POSITIONS)
        f = factor if factor is not None else ((max_pos or 0) / omax if omax else 1.0)
        af = 1.0 if (not f or f <= 1.0 or not omax) else math.sqrt(1 + math.log(f) / math.log(omax))
    return mult, float(af), rtype, True, "rope longrope: largest frequency of short/long factors, logits scaled by attention_factor^2"


def rope_geometry(layout: ModelLayout, config: dict | None) -> RopeGeometry | None:
    """Pairs and frequencies for a rope model (None for other position encodings)."""
    pe = layout.position
    if pe.type != "rope" or not layout.head_dim or not pe.rotary_dim:
        return None
    if pe.axes != 1:
        # 2-D rope (an image tower's rows and columns): the phase between two positions depends on both
        # coordinates' distances, which the 1-D frequency / context bounds here do not describe
        return None
    r = int(pe.rotary_dim)
    pairs = rotary_pairs(layout.head_dim, r, pe.pair_layout or "rotate_half")
    cfg = dict(config or {})
    dicts = _rope_dicts(cfg)
    # Several rope dicts (Gemma 3's per-layer-type thetas, rope_scaling beside rope_parameters):
    # take the worst case of each quantity, which keeps the bound sound for every layer.
    where = layout.config_source
    thetas = [t for t in (_field(d, name, "rope_theta", POSITIVE, where) for name, d in dicts)
              if t] or [float(pe.theta or 10000.0)]
    inv = rope_inv_freq(min(thetas), r)
    mult, af, rtype, supported, notes = np.ones(len(inv)), 1.0, "default", True, []
    for name, d in dicts:
        m, a, t, ok, note = _scaling(name, d, cfg, len(inv), where)
        mult, af = np.maximum(mult, m), max(af, a)
        if t != "default":
            rtype = t
        supported = supported and ok
        if note and note not in notes:     # the same dict under both spellings says it once
            notes.append(note)
    if getattr(layout, "derived", None) is not None:
        inv, mult = inv[: len(pairs)], mult[: len(pairs)]     # an odd probed rotary_dim has (r - 1) / 2 pairs
        # derived (unregistered) architecture: which dims rotate together is not established, so
        # no near-redundant pairs and no bound are claimed (the exact pass-through dims are probed)
        return RopeGeometry(r, "unknown", pairs, inv * mult, af, rtype, False,
                            "rotary pair layout of a derived architecture is not established: no near-redundant "
                            "pairs or bounds are claimed")
    return RopeGeometry(r, pe.pair_layout or "rotate_half", pairs, inv * mult, af, rtype, supported,
                        "; ".join(notes) or None)
