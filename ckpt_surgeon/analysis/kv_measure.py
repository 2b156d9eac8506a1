"""The measured side of ``analyze --kv-cache --measure`` (issue 32): the real K, V and Q of a
forward pass, quantized as a KV cache quantizes them, and what that does to attention.

How the tensors are captured: transformers 5 models call their attention function through
``ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)`` with the query, key and
value *after* RoPE (and after any q/k norm), keys and values per kv head (before ``repeat_kv``),
and the module's ``scaling``.  While measuring, that lookup is wrapped so each call records its
``(module.layer_idx, query, key, value, scaling)`` and then runs the real function: the model runs
unchanged, as it is defined (eager attention, float32).

How they are quantized, per cache type (:data:`CACHE_TYPES`):

* llama.cpp's block types (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1): each key and value row of one
  kv head is quantized in blocks of 32 along the head dimension, with ggml's own kernels
  (:func:`ckpt_surgeon.formats.quant.ggml_quant.quantize_rows` / ``dequantize``, the libggml-base of
  llama-cpp-python), as ``ggml_set_rows`` writes the cache.  The query is quantized to the type's
  ``vec_dot_type`` before the dot product, as ggml's CPU ``mul_mat`` and flash-attention kernels
  do: q8_0 for q4_0 / q5_0 / q8_0 / iq4_nl, q8_1 for q4_1 / q5_1.  q8_1 holds the same values as
  q8_0 (``d = amax/127``, ``round(x/d)``, d in float16) plus a float16 block sum that the q4_1 /
  q5_1 dot product uses for the offset term; the q8_0 kernel gives those values, the sum's own
  float16 rounding (relative 2^-11 of one term) is left out.
* ``f16`` / ``bf16``: K, V and Q rounded to that float type (f16's ``vec_dot_type`` is f16).
* ``fp8_e4m3`` (vLLM's fp8 KV cache): K and V divided by a per-tensor scale (amax / 448 over the
  layer's keys, resp. values, in each prompt), rounded to float8 e4m3 (``ml_dtypes``), scaled
  back; Q is left in float (vLLM's default attention backends dequantize the cache).

What is reported, per layer and cache type (float64, over every prompt, every head, causal rows):

* ``k_logit_rms``: RMS over (head, query m, key n ≤ m) of ``s·q̂_m·k̂_n − s·q_m·k_n`` (s the
  module's scaling): the attention-logit error the K cache and Q's own quantization make;
* ``k_row_kl``: mean over attention rows of ``KL(softmax(l_m) ‖ softmax(l̂_m))`` (nats), and its max;
* ``v_out_rel_rms``: ‖P(V̂ − V)‖ / ‖PV‖ with the exact attention P: what the V cache alone costs.

The worst layers of a type are the ones with the largest mean row KL (:meth:`KvMeasureReport.worst_layers`).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from pathlib import Path

import numpy as np

from ..errors import CkptError, UnsupportedError
from ..records import finite_or_none as _f

BLOCK_TYPES = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
CACHE_TYPES = BLOCK_TYPES + ("f16", "bf16", "fp8_e4m3")
# ggml's type_traits_cpu[type].vec_dot_type (ggml/src/ggml-cpu/ggml-cpu.c): what Q is converted to
VEC_DOT = {"q8_0": "q8_0", "q4_0": "q8_0", "q5_0": "q8_0", "iq4_nl": "q8_0", "q4_1": "q8_1", "q5_1": "q8_1"}
BLOCK = 32
FP8_MAX = 448.0          # largest finite float8 e4m3fn
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class KvLayerMeasure:
    """One layer under one cache type."""

    layer: int
    cache_type: str
    k_logit_rms: float         # RMS attention-logit error (logit units)
    k_row_kl: float            # mean over causal rows of KL(exact ‖ quantized attention row), nats
    k_row_kl_max: float
    v_out_rel_rms: float       # ‖P(V̂ − V)‖ / ‖PV‖
    logit_rms: float           # RMS of the exact logits themselves (the scale of the error)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "cache_type": self.cache_type, "k_logit_rms": _f(self.k_logit_rms),
                "k_row_kl": _f(self.k_row_kl), "k_row_kl_max": _f(self.k_row_kl_max),
                "v_out_rel_rms": _f(self.v_out_rel_rms), "logit_rms": _f(self.logit_rms)}


@dataclass(frozen=True)
class KvMeasureReport:
    """What :func:`measure_kv_cache` found."""

    source: str
    device: str
    cache_types: tuple
    prompts: int
    tokens: tuple              # tokens per prompt
    head_dim: int
    layers: tuple              # KvLayerMeasure, layer-major then type
    notes: tuple = field(default_factory=tuple)
    attn_rot: bool = False     # Q, K (and V) rotated as llama.cpp does before the cache (.kv_rot)

    def worst_layers(self, cache_type: str, n: int = 3) -> tuple:
        """The ``n`` layers with the largest mean attention-row KL under ``cache_type``."""
        rows = sorted((r for r in self.layers if r.cache_type == cache_type), key=lambda r: -r.k_row_kl)
        return tuple(r.layer for r in rows[:n])

    def get(self, layer: int, cache_type: str) -> KvLayerMeasure:
        return next(r for r in self.layers if r.layer == layer and r.cache_type == cache_type)

    def to_dict(self) -> dict:
        return {"source": self.source, "device": self.device, "cache_types": list(self.cache_types),
                "prompts": self.prompts, "tokens": list(self.tokens), "head_dim": self.head_dim,
                "layers": [r.to_dict() for r in self.layers],
                "worst_layers": {t: list(self.worst_layers(t)) for t in self.cache_types},
                "attn_rot": self.attn_rot, "notes": list(self.notes)}

    def rows(self) -> list[dict]:
        worst = {t: set(self.worst_layers(t)) for t in self.cache_types}
        return [dict(r.to_dict(), worst="yes" if r.layer in worst[r.cache_type] else "") for r in self.layers]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())

    def summary_items(self) -> list[tuple[str, str]]:
        items = [("source", self.source), ("prompts", f"{self.prompts} ({sum(self.tokens)} tokens)")]
        items += [(f"worst layers {t}", ", ".join(map(str, self.worst_layers(t)))) for t in self.cache_types]
        return items


def check_cache_types(cache_types) -> tuple:
    """The types asked, each one of :data:`CACHE_TYPES`, else one line listing them."""
    items = cache_types.split(",") if isinstance(cache_types, str) else list(cache_types)
    out = []
    for t in items:
        s = str(t).strip().lower()
        if s not in CACHE_TYPES:
            raise CkptError(f"unknown KV cache type {t!r}; known: {', '.join(CACHE_TYPES)}")
        if s not in out:
            out.append(s)
    if not out:
        raise CkptError(f"no KV cache type given; known: {', '.join(CACHE_TYPES)}")
    return tuple(out)


# --- quantization as the cache does it -----------------------------------------------------------

def roundtrip(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` (float32, rows along the last axis, a multiple of 32 for block types) through a
    ``name`` cache and back to float32; ``q8_1`` gives q8_0's values (see the module docstring)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if name in ("q8_1",) + BLOCK_TYPES:
        from ..formats.quant import ggml_quant
        kind = "q8_0" if name == "q8_1" else name
        q = ggml_quant.quantize_rows(x.reshape(-1, x.shape[-1]), kind.upper())
        return ggml_quant.dequantize(q, kind.upper(), x.size).reshape(x.shape)
    if name == "f16":
        return x.astype(np.float16).astype(np.float32)
    if name == "bf16":
        import ml_dtypes
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    if name == "fp8_e4m3":
        import ml_dtypes
        amax = float(np.abs(x).max()) if x.size else 0.0
        scale = amax / FP8_MAX if amax > 0 else 1.0
        return ((x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale).astype(np.float32)
    raise CkptError(f"unknown KV cache type {name!r}; known: {', '.join(CACHE_TYPES)}")


def query_type(name: str) -> str | None:
    """What Q is rounded to before the dot product with a ``name`` cache (None: left in float)."""
    if name in VEC_DOT:
        return VEC_DOT[name]
    return name if name in ("f16", "bf16") else None


# --- capture -------------------------------------------------------------------------------------

@contextlib.contextmanager
def capture_attention(record: list):
    """Record ``(layer_idx, query [B,H,T,D], key [B,KV,T,D], value [B,KV,T,D], scaling)`` of each
    attention call (transformers 5's attention interface; see the module docstring)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    registry = ALL_ATTENTION_FUNCTIONS
    orig = registry.get_interface

    def get_interface(impl, default):
        fn = orig(impl, default)

        def recorded(module, query, key, value, attention_mask, *args, **kwargs):
            scaling = kwargs.get("scaling")
            record.append((getattr(module, "layer_idx", len(record)), query.detach(), key.detach(),
                           value.detach(), float(module.scaling if scaling is None else scaling)))
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        return recorded

    registry.get_interface = get_interface
    try:
        yield record
    finally:
        del registry.get_interface       # the instance attribute goes; the class method is back


def _capture(model, ids) -> list:
    import torch
    record: list = []
    with capture_attention(record), torch.no_grad():
        model(input_ids=ids, use_cache=False)
    if not record:
        raise UnsupportedError("measured KV mode: the model calls no transformers attention function "
                               "(ALL_ATTENTION_FUNCTIONS); its Q, K and V cannot be captured")
    return record


def capture_qk(source, *, prompts=None, max_tokens: int = DEFAULT_MAX_TOKENS, device: str = "cpu") -> tuple:
    """``(captures, tokens)``: per prompt, ``{layer: (q [H,T,D], k [KV,T,D], scaling, v [KV,T,D])}`` as float32
    numpy, the post-RoPE query and key (and the value) of one transformers forward pass (float32, eager; see the module docstring), and
    the tokens of each prompt.  Prompts: ``prompts`` or the analysis set, each cut to ``max_tokens``."""
    from ..runtime import resolve_device
    from .measure import _encode_prompts, load_model
    from .prompts import default_prompts

    if not isinstance(max_tokens, int) or max_tokens < 2:
        raise CkptError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
    dev = resolve_device(device)
    model, tok, _ = load_model(str(source), device=dev, dtype="float32")
    encoded = _encode_prompts(tok, list(default_prompts() if prompts is None else prompts), max_tokens, dev)
    out = []
    for ids in encoded:
        out.append({layer: (q[0].float().cpu().numpy(), k[0].float().cpu().numpy(), scaling, v[0].float().cpu().numpy())
                    for layer, q, k, v, scaling in _capture(model, ids)})
    return out, tuple(int(e.shape[1]) for e in encoded)


# --- the measurement -----------------------------------------------------------------------------

def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class _Sums:
    """Running float64 sums of one (layer, type) over prompts."""

    def __init__(self):
        self.se = self.n = self.kl = self.rows = self.ref2 = self.v_err2 = self.v_ref2 = 0.0
        self.kl_max = 0.0

    def result(self, layer: int, name: str) -> KvLayerMeasure:
        return KvLayerMeasure(layer, name, math.sqrt(self.se / self.n), self.kl / self.rows, self.kl_max,
                              math.sqrt(self.v_err2 / self.v_ref2) if self.v_ref2 > 0 else 0.0,
                              math.sqrt(self.ref2 / self.n))


def _heads(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """kv head of each query head (GQA: query head h reads kv head h // (H / KV))."""
    return np.arange(q.shape[0]) // (q.shape[0] // k.shape[0])


def cache_view(q, k, v, name: str, attn_rot: bool, perm=None):
    """Q, K, V as llama.cpp's cache sees them for a ``name`` cache: head dims in cache order (``perm[p]``: the
    captured dim at cache position p; None: as captured), Q and K times its Hadamard chunks and V times its
    64 x 64 Hadamard where it applies them (:mod:`.kv_rot`).  The logits and P V are unchanged (H orthogonal;
    llama.cpp rotates the attention output back)."""
    from . import kv_rot as R
    d = q.shape[-1]
    if perm is not None:
        q, k = q[..., perm], k[..., perm]
    nk, nv = R.rot_size(d, name, "k", attn_rot), R.rot_size(d, name, "v", attn_rot)
    return R.rotate_rows(q, nk), R.rotate_rows(k, nk), R.rotate_rows(v, nv)


def _layer_sums(s: _Sums, q, k, v, scaling: float, name: str, attn_rot: bool = False, perm=None) -> None:
    """Add one prompt's layer (``q [H,T,D]``, ``k``/``v [KV,T,D]`` float32) under cache ``name`` (``attn_rot``,
    ``perm``: :func:`cache_view`)."""
    t = q.shape[1]
    causal = np.tril(np.ones((t, t), dtype=bool))
    kv = _heads(q, k)
    q, k, v = cache_view(q, k, v, name, attn_rot, perm)
    qt = query_type(name)
    q_hat = roundtrip(q, qt) if qt else q
    k_hat, v_hat = roundtrip(k, name), roundtrip(v, name)
    q64, qh64 = q.astype(np.float64), q_hat.astype(np.float64)
    exact = scaling * np.einsum("htd,hsd->hts", q64, k.astype(np.float64)[kv])
    quant = scaling * np.einsum("htd,hsd->hts", qh64, k_hat.astype(np.float64)[kv])
    d = (quant - exact)[:, causal]
    s.se += float((d * d).sum())
    s.ref2 += float((exact[:, causal] ** 2).sum())
    s.n += d.size
    neg = np.where(causal, 0.0, -np.inf)
    lp, lq = _log_softmax(exact + neg), _log_softmax(quant + neg)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):         # masked entries: 0·(−inf − −inf), discarded by the where
        kl = np.where(causal, p * (lp - lq), 0.0).sum(axis=-1)    # [H, T]
    s.kl += float(kl.sum())
    s.rows += kl.size
    s.kl_max = max(s.kl_max, float(kl.max()))
    out = np.einsum("hts,hsd->htd", p, v.astype(np.float64)[kv])
    err = np.einsum("hts,hsd->htd", p, (v_hat.astype(np.float64) - v.astype(np.float64))[kv])
    s.v_err2 += float((err * err).sum())
    s.v_ref2 += float((out * out).sum())


def measure_kv_cache(source, cache_types=("q8_0", "q4_0"), *, prompts=None, max_tokens: int = DEFAULT_MAX_TOKENS,
                     device: str = "cpu", attn_rot: bool | None = None, perm=None,
                     progress: bool | None = None) -> KvMeasureReport:
    """Run ``source`` with transformers (float32, eager attention) on ``prompts`` (default the
    analysis prompt set, :func:`.prompts.default_prompts`, each cut to ``max_tokens``), capture
    every layer's post-RoPE Q, K and V, and measure each of ``cache_types`` (:data:`CACHE_TYPES`)
    on them; see the module docstring.  ``attn_rot``: rotate as llama.cpp does before its cache (None: as it
    would in this environment; :mod:`.kv_rot`); ``perm``: the cache order of the captured head dims
    (:func:`.kv_rot.capture_cache_perm`; None: as captured).  ``progress``: the loading phase and a bar over
    the prompts on stderr (:mod:`ckpt_surgeon.progress`).  Raises CkptError (one line) for bad input."""
    from ..progress import phase, steps
    from ..runtime import resolve_device
    from .kv_rot import resolve
    from .measure import _encode_prompts, load_model
    from .prompts import default_prompts

    names = check_cache_types(cache_types)
    rot = resolve(attn_rot)
    if not isinstance(max_tokens, int) or max_tokens < 2:
        raise CkptError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
    dev = resolve_device(device)
    with phase(progress, f"loading {Path(str(source)).name} with transformers (float32, {dev})"):
        model, tok, _ = load_model(source, device=dev, dtype="float32")
    encoded = _encode_prompts(tok, list(default_prompts() if prompts is None else prompts), max_tokens, dev)
    sums: dict = {}
    head_dim = None
    for ids in steps(progress, encoded, desc="Q, K, V through the cache types", unit="prompt"):
        for layer, q, k, v, scaling in _capture(model, ids):
            q, k, v = (x[0].float().cpu().numpy() for x in (q, k, v))
            head_dim = _check_head_dim(q.shape[-1], names, source)
            for name in names:
                _layer_sums(sums.setdefault((layer, name), _Sums()), q, k, v, scaling, name, rot, perm)
    layers = tuple(sums[key].result(*key) for key in sorted(sums))
    notes = ("K: keys and the query quantized as llama.cpp's CPU kernels do (Q to the type's vec_dot type); "
             "V: the attention output with the exact attention weights; fp8_e4m3: per-tensor scale, Q in float",
             "attention without sliding window, sinks or soft-capping (the plain causal softmax)",
             "llama.cpp's attn_rot Hadamard of Q, K (and V) before a quantized cache: "
             + ("applied where llama.cpp applies it" if rot else "off (as LLAMA_ATTN_ROT_DISABLE=1)"))
    return KvMeasureReport(str(source), dev, names, len(encoded), tuple(int(e.shape[1]) for e in encoded),
                           int(head_dim), layers, notes, rot)


def _check_head_dim(d: int, names, source) -> int:
    if d % BLOCK and any(n in BLOCK_TYPES for n in names):
        raise UnsupportedError(f"head_dim {d} is not a multiple of {BLOCK}, the block llama.cpp's cache types "
                               "quantize along (llama.cpp refuses such a cache too); f16, bf16 and fp8_e4m3 can "
                               "still be measured", path=str(source))
    return d
