"""The exact rotary frequencies and attention factor a runtime uses (numpy only, no torch).

:mod:`.rope` gives the bound what it needs: the *largest* frequency each pair can turn at under
any scaling (conservative).  The distance profile
(:mod:`ckpt_surgeon.analysis.distance_profile`) needs the frequencies themselves: ``f(Δ)`` is a
sum of ``cos(Δ θ_j)`` terms, so ``θ_j`` must be the one the model runs.  This module mirrors
transformers' ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (``_compute_default_rope_parameters``
of the modeling files, ``_compute_linear_scaling_rope_parameters``, ``_compute_dynamic_ntk_parameters``,
``_compute_yarn_parameters``, ``_compute_longrope_parameters``, ``_compute_llama3_parameters``)
in float64 numpy, so the static profile runs without importing torch; a test compares every
type with those functions (transformers computes in float32: agreement to float32 rounding).

Two types depend on the sequence length: ``dynamic`` (NTK: the base grows once the sequence is
longer than ``max_position_embeddings``) and ``longrope`` (``short_factor`` up to
``original_max_position_embeddings``, ``long_factor`` beyond).  They are evaluated at a stated
``length`` (the profile's context), which the record carries.

Every field is read checked (:mod:`.checked`, through :mod:`.rope`'s readers): a string factor is
one ``ConfigError`` naming config.json and the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import CkptError, ConfigError
from .checked import MAX_POSITIONS, POSITIVE, config_int
from .resolve import ModelLayout
from .rope import _FACTOR, _MSCALE, _ORIGINAL_POSITIONS, _factors, _field, _rope_dicts

SUPPORTED = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# llama.cpp's per-pair frequency divisors (its converter writes llama3 scaling as this F32 tensor;
# ggml_rope_ext divides each pair's frequency by it): the name conversion/from_gguf.py reads too
GGUF_FREQ_FACTORS = "rope_freqs.weight"
LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True, eq=False)
class RopeFrequencies:
    """``θ_j`` (``[P]``, radians per position) and the cos/sin multiplier ``a`` of one rope setting."""

    inv_freq: np.ndarray
    attention_factor: float
    rope_type: str
    theta: float
    rotary_dim: int
    length: int | None               # the sequence length the frequencies were evaluated at (dynamic / longrope)
    training_length: int | None      # original_max_position_embeddings (scaled types) or max positions
    note: str | None = None

    def to_dict(self) -> dict:
        return {"rope_type": self.rope_type, "theta": self.theta, "rotary_dim": self.rotary_dim,
                "attention_factor": self.attention_factor, "evaluated_at_length": self.length,
                "training_length": self.training_length, "inv_freq": [float(x) for x in self.inv_freq],
                "note": self.note}


def _base_inv_freq(theta: float, dim: int) -> np.ndarray:
    """``1 / theta ** (arange(0, dim, 2) / dim)`` (``_compute_default_rope_parameters``)."""
    return 1.0 / (float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """``_compute_yarn_parameters.get_mscale``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(theta: float, dim: int, d: dict, name: str, max_pos: int | None, omax: int,
          path: str | None) -> tuple[np.ndarray, float]:
    """``_compute_yarn_parameters``: interpolated frequencies below the ramp, extrapolated above it."""
    factor = _field(d, name, "factor", _FACTOR, path)
    if factor is None:
        if not max_pos:
            raise ConfigError(f"{name} (yarn) has no factor and the config no max_position_embeddings", path=path)
        factor = max_pos / omax
    af = _field(d, name, "attention_factor", _FACTOR, path)
    if af is None:
        ms, ms_all = (_field(d, name, k, _MSCALE, path) for k in ("mscale", "mscale_all_dim"))
        af = _yarn_mscale(factor, ms) / _yarn_mscale(factor, ms_all) if (ms and ms_all) else _yarn_mscale(factor)
    beta_fast = _field(d, name, "beta_fast", _FACTOR, path) or 32.0
    beta_slow = _field(d, name, "beta_slow", _FACTOR, path) or 1.0
    truncate = d.get("truncate", True) is not False

    def correction_dim(rot: float) -> float:
        return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(theta))
    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001               # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrap = 1.0 - ramp
    pos = float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1.0 / (factor * pos)) * (1.0 - extrap) + (1.0 / pos) * extrap
    return inv, float(af)


def _llama3(inv: np.ndarray, d: dict, name: str, path: str | None, omax: int) -> np.ndarray:
    """``_compute_llama3_parameters``: long wavelengths divided by ``factor``, a smooth blend between."""
    factor = _field(d, name, "factor", _FACTOR, path)
    low = _field(d, name, "low_freq_factor", _FACTOR, path)
    high = _field(d, name, "high_freq_factor", _FACTOR, path)
    if factor is None or low is None or high is None:
        raise ConfigError(f"{name} (llama3) needs factor, low_freq_factor and high_freq_factor", path=path)
    low_wl, high_wl = omax / low, omax / high
    wl = 2 * math.pi / inv
    out = np.where(wl > low_wl, inv / factor, inv)
    smooth = (omax / wl - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return np.where(medium, smoothed, out)


def _merged(cfg: dict) -> tuple[str, dict, str | None]:
    """(name for messages, the rope dict of full-attention layers, note): both spellings merged
    as ``standardize_rope_params`` does (``rope_scaling`` beside ``rope_parameters``); one dict per
    layer type: the full-attention one."""
    dicts = _rope_dicts(cfg)
    note = None
    per_type = [(n, d) for n, d in dicts if n.startswith("rope_parameters.")]
    if per_type:
        chosen = next(((n, d) for n, d in per_type if n.endswith(".full_attention")), per_type[0])
        if len(per_type) > 1:
            note = f"rope parameters differ per layer type: the profile uses {chosen[0]}"
        dicts = [chosen] + [(n, d) for n, d in dicts if n == "rope_scaling"]
    merged: dict = {}
    name = "rope_parameters"
    for n, d in dicts:
        merged.update(d)
        if d.get("rope_type", d.get("type", "default")) not in (None, "default"):
            name = n
    return name, merged, note


@dataclass(frozen=True)
class _Setting:
    """One rope setting as read: the dict (and its name for messages), base, rotary dim, lengths."""

    name: str
    d: dict
    where: str | None
    base: float
    dim: int
    max_pos: int | None
    omax: int | None
    length: int | None

    def factor(self, what: str, required: bool = True) -> float | None:
        f = _field(self.d, self.name, "factor", _FACTOR, self.where)
        if f is None and required:
            raise ConfigError(f"{self.name} ({what}) has no factor", path=self.where)
        return f


# Each type: (setting) -> (inv_freq, attention factor, length evaluated at or None, training length)

def _default(st: _Setting):
    return _base_inv_freq(st.base, st.dim), 1.0, None, st.max_pos


def _linear(st: _Setting):
    f = st.factor("linear")
    return _base_inv_freq(st.base, st.dim) / f, 1.0, None, (int(round(st.max_pos / f)) if st.max_pos else None)


def _dynamic(st: _Setting):
    """``_compute_dynamic_ntk_parameters``: the base grows once the sequence passes max positions."""
    f = st.factor("dynamic")
    if not st.max_pos:
        raise ConfigError(f"{st.name} (dynamic) needs max_position_embeddings", path=st.where)
    at = int(st.length or st.max_pos)
    seq = max(at, st.max_pos)
    base = st.base * ((f * seq / st.max_pos) - (f - 1)) ** (st.dim / (st.dim - 2))
    return _base_inv_freq(base, st.dim), 1.0, at, st.max_pos


def _yarn_type(st: _Setting):
    inv, af = _yarn(st.base, st.dim, st.d, st.name, st.max_pos, st.omax, st.where)
    return inv, af, None, st.omax


def _llama3_type(st: _Setting):
    return _llama3(_base_inv_freq(st.base, st.dim), st.d, st.name, st.where, st.omax), 1.0, None, st.omax


def _longrope(st: _Setting):
    """``_compute_longrope_parameters``: short factors up to the original length, long ones beyond."""
    at = int(st.length or st.max_pos or st.omax)
    key = "long_factor" if at > st.omax else "short_factor"
    ext = _factors(st.d, st.name, key, st.where)
    if ext is None or ext.shape != (st.dim // 2,):
        raise ConfigError(f"{st.name}.{key} must list {st.dim // 2} factors (one per rotary pair)", path=st.where)
    inv = 1.0 / (ext * float(st.base) ** (np.arange(0, st.dim, 2, dtype=np.float64) / st.dim))
    f = st.factor("longrope", required=False)
    f = (st.max_pos or st.omax) / st.omax if f is None else f
    a = _field(st.d, st.name, "attention_factor", _FACTOR, st.where)
    af = a if a is not None else (1.0 if f <= 1.0 else math.sqrt(1 + math.log(f) / math.log(st.omax)))
    return inv, af, at, st.omax


_TYPES = {"default": _default, "linear": _linear, "dynamic": _dynamic, "yarn": _yarn_type, "llama3": _llama3_type,
          "longrope": _longrope}
_NEED_ORIGINAL = ("yarn", "llama3", "longrope")


def _setting(layout: ModelLayout, cfg: dict, length, theta, scaling) -> tuple[_Setting, str, str | None]:
    """(the setting, its rope type, a note) from the config, or the what-if ``theta`` / ``scaling``."""
    where = layout.config_source
    name, d, note = _merged(cfg)
    if scaling is not None:
        keep = {k: v for k, v in d.items() if k in ("rope_theta", "partial_rotary_factor")}
        name, d = "--rope-scaling", {**keep, **scaling}
    base = theta if theta is not None else (_field(d, name, "rope_theta", POSITIVE, where)
                                            or float(layout.position.theta or 10000.0))
    max_pos = config_int(cfg, ("max_position_embeddings",), path=where, minimum=1, maximum=MAX_POSITIONS) \
        or layout.max_positions
    # standardize_rope_params: a top-level original_max_position_embeddings wins (Phi-3), else the
    # rope dict's, else max_position_embeddings
    omax = config_int(cfg, ("original_max_position_embeddings",), path=where, minimum=2, maximum=MAX_POSITIONS)
    if omax is None or scaling is not None:
        omax = _field(d, name, "original_max_position_embeddings", _ORIGINAL_POSITIONS, where) or omax
    st = _Setting(name, d, where, float(base), int(layout.position.rotary_dim), max_pos, omax or max_pos, length)
    return st, str(d.get("rope_type") or d.get("type") or "default"), note


def _join(*notes) -> str | None:
    return "; ".join(n for n in notes if n) or None


def rope_frequencies(layout: ModelLayout, config: dict | None, *, length: int | None = None,
                     theta: float | None = None, scaling: dict | None = None,
                     freq_factors: np.ndarray | None = None) -> RopeFrequencies | None:
    """The runtime's ``θ_j`` and attention factor for a rope model (None for other position encodings).

    ``length``: where ``dynamic`` / ``longrope`` are evaluated (default: the max positions).
    ``theta`` / ``scaling`` (what-if): another base, another scaling dict (``{"rope_type": "yarn",
    "factor": 4, ...}``, replacing the config's).  Unmodelled types raise nothing: the record's
    ``rope_type`` is not in :data:`SUPPORTED` and its note says so; callers give no profile then.
    ``freq_factors``: a GGUF's :data:`GGUF_FREQ_FACTORS` values (``[P]``), which llama.cpp divides
    the frequencies by (a GGUF's config shows no llama3 parameters: they live in that tensor).
    """
    pe = layout.position
    if pe.type != "rope" or not layout.head_dim or not pe.rotary_dim:
        return None
    st, rtype, note = _setting(layout, dict(config or {}), length, theta, scaling)
    if rtype in _NEED_ORIGINAL and not st.omax:
        raise ConfigError(f"{st.name} ({rtype}) needs original_max_position_embeddings or max_position_embeddings",
                          path=st.where)
    if rtype in _TYPES:
        inv, af, at, train = _TYPES[rtype](st)
    else:
        (inv, af, at, train), note = _default(st), _join(note, f"rope type {rtype!r} is not modelled: no distance profile")
    if freq_factors is not None and scaling is None:
        ff = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
        if ff.shape != inv.shape or not np.all(np.isfinite(ff) & (ff > 0)):
            raise ConfigError(f"{GGUF_FREQ_FACTORS} must hold {len(inv)} finite positive factors (one per rotary pair)",
                              path=st.where, tensor=GGUF_FREQ_FACTORS)
        inv, rtype = inv / ff, ("llama3" if rtype == "default" else rtype)
        note = _join(note, f"frequencies divided by the file's {GGUF_FREQ_FACTORS} (llama.cpp's llama3 scaling); "
                           "training length unknown: max positions")
    if at is not None:
        note = _join(note, f"rope {rtype}: frequencies depend on the length, evaluated at {at}")
    return RopeFrequencies(inv[: st.dim // 2], float(af), rtype, st.base, st.dim, at, train, note)


def parse_rope_scaling(spec: str) -> dict:
    """``yarn:F``, ``linear:F``, ``dynamic:F``, ``llama3:F[,LOW,HIGH]`` (``LOW``/``HIGH``: low / high
    frequency factors, default 1 and 4 as Llama 3.1 has them), ``none`` -> a rope scaling dict."""
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind in ("none", "default") and not rest:
        return {"rope_type": "default"}
    try:
        vals = [float(x) for x in rest.split(",")] if rest else []
    except ValueError:
        vals = None
    if kind not in ("yarn", "linear", "dynamic", "llama3") or not vals or any(not (math.isfinite(v) and v > 0)
                                                                             for v in vals):
        raise CkptError(f"--rope-scaling {spec!r}: expected yarn:F, linear:F, dynamic:F, llama3:F[,LOW,HIGH] "
                          "or none, with positive factors")
    if (kind != "llama3" and len(vals) != 1) or len(vals) not in (1, 3):
        raise CkptError(f"--rope-scaling {spec!r}: {kind} takes one factor" +
                          (" or factor,low,high" if kind == "llama3" else ""))
    out = {"rope_type": kind, "factor": vals[0]}
    if kind == "llama3":
        out.update(low_freq_factor=vals[1] if len(vals) == 3 else 1.0, high_freq_factor=vals[2] if len(vals) == 3 else 4.0)
    return out
