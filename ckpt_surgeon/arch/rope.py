"""Rope geometry of a model: which dims rotate together and how fast (numpy only).

What the key-bias bound (:mod:`ckpt_surgeon.analysis.redundancy`) and measured mode
(:mod:`ckpt_surgeon.analysis.measure`) need from a layout's rope settings: the rotary pairs
(:func:`~ckpt_surgeon.arch.layouts.rotary_pairs`), the largest frequency each pair can turn at
under the config's rope scaling, and the attention factor yarn / longrope put on cos and sin.
Both config spellings are read (transformers 5 ``rope_parameters``, possibly one dict per layer
type; Hub-era ``rope_scaling``).  It is a fact about the architecture and its config, so it
lives with the layout, not with either analysis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .layouts import rotary_pairs
from .resolve import ModelLayout


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


def _rope_dicts(cfg: dict) -> list[dict]:
    """Rope parameter dicts, both spellings (transformers 5 ``rope_parameters``, possibly one per
    layer type; Hub-era ``rope_scaling``)."""
    rp = cfg.get("rope_parameters")
    out = []
    if isinstance(rp, dict) and rp:
        if all(isinstance(v, dict) for v in rp.values()):
            out.extend(rp.values())
        else:
            out.append(rp)
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict) and rs:
        out.append(rs)
    return out


def _scaling(d: dict, cfg: dict, n_pairs: int) -> tuple[np.ndarray, float, str, bool, str | None]:
    """(frequency multiplier ``[P]``, attention factor, type, supported, note) for one rope dict."""
    rtype = str(d.get("rope_type") or d.get("type") or "default")
    ones = np.ones(n_pairs)
    factor = d.get("factor")
    # Frequencies only go down when factors are >= 1; guard against factor < 1 anyway.
    up = 1.0 / min(1.0, float(factor)) if factor else 1.0
    if rtype == "default":
        return ones, 1.0, rtype, True, None
    if rtype in ("linear", "dynamic", "llama3"):
        return ones * up, 1.0, rtype, True, f"rope {rtype} scaling lowers frequencies; the bound uses unscaled ones"
    if rtype == "yarn":
        af = d.get("attention_factor")
        if af is None:
            f = factor
            if f is None and d.get("original_max_position_embeddings") and cfg.get("max_position_embeddings"):
                f = cfg["max_position_embeddings"] / d["original_max_position_embeddings"]
            f = float(f or 1.0)

            def mscale(s, m=1.0):   # modeling_rope_utils._compute_yarn_parameters.get_mscale
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            if d.get("mscale") and d.get("mscale_all_dim"):
                af = mscale(f, d["mscale"]) / mscale(f, d["mscale_all_dim"])
            else:
                af = mscale(f)
        return ones * up, float(af), rtype, True, "rope yarn: unscaled frequencies, logits scaled by attention_factor^2"
    if rtype == "longrope":
        ext = [np.asarray(d[k], dtype=np.float64) for k in ("short_factor", "long_factor") if d.get(k) is not None]
        mult = ones.copy()
        for e in ext:
            if e.shape == (n_pairs,):
                mult = np.maximum(mult, 1.0 / np.minimum(e, 1.0))
        af = d.get("attention_factor")
        if af is None:
            omax = d.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
            f = factor if factor is not None else (
                cfg.get("max_position_embeddings", 0) / omax if omax else 1.0)
            af = 1.0 if (not f or f <= 1.0 or not omax) else math.sqrt(1 + math.log(f) / math.log(omax))
        return mult, float(af), rtype, True, "rope longrope: largest frequency of short/long factors, logits scaled by attention_factor^2"
    return ones, 1.0, rtype, False, f"rope scaling type {rtype!r} is not modelled: fractions use unscaled frequencies, no bound"


def rope_geometry(layout: ModelLayout, config: dict | None) -> RopeGeometry | None:
    """Pairs and frequencies for a rope model (None for other position encodings)."""
    pe = layout.position
    if pe.type != "rope" or not layout.head_dim or not pe.rotary_dim:
        return None
    r = int(pe.rotary_dim)
    pairs = rotary_pairs(layout.head_dim, r, pe.pair_layout or "rotate_half")
    cfg = dict(config or {})
    dicts = _rope_dicts(cfg)
    # Several rope dicts (Gemma 3's per-layer-type thetas, rope_scaling beside rope_parameters):
    # take the worst case of each quantity, which keeps the bound sound for every layer.
    thetas = [float(d["rope_theta"]) for d in dicts if d.get("rope_theta")] or [float(pe.theta or 10000.0)]
    inv = rope_inv_freq(min(thetas), r)
    mult, af, rtype, supported, notes = np.ones(len(inv)), 1.0, "default", True, []
    for d in dicts:
        m, a, t, ok, note = _scaling(d, cfg, len(inv))
        mult, af = np.maximum(mult, m), max(af, a)
        if t != "default":
            rtype = t
        supported = supported and ok
        if note:
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
