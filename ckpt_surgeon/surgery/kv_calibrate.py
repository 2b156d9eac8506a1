"""``kv-equalize --calibrate``: choose the pair scales on the measured attention error of real prompts.

The static choice (:func:`ckpt_surgeon.surgery.kv_equalize.choose_alpha`) scores candidate scales with a
model of the activations (a mean and a variance per dim).  Calibrating runs the model itself
(transformers, float32, eager) on prompts, captures each layer's post-RoPE Q and K
(:func:`ckpt_surgeon.analysis.kv_measure.capture_qk`) and, per layer, chooses ``alpha`` per rotary pair
(and per pass-through dim) per kv head by coordinate descent on the *measured* cost:

* the keys go through the target cache type and the queries through its vec_dot type with ggml's own
  kernels (:func:`ckpt_surgeon.analysis.kv_measure.roundtrip`), in blocks of 32 along the head dim in the
  order the cache stores them (``KvGeometry.cache_order``: llama.cpp's permuted rows for llama-arch),
  after the Hadamard rotation llama.cpp applies to Q and K for a quantized K cache (:func:`hadamard`;
  ``attn_rot=False`` for plain blocks);
* the cost of a kv head is the mean over its query heads and the sampled query rows of the attention-row
  ``KL(softmax(l) || softmax(l_hat))`` (nats; causal rows, all keys), summed over prompts; with several K
  types the sum over types of KL / KL-at-alpha-1;
* one pair's scale touches only the (one or two) cache blocks its dims sit in (with the rotation: the whole
  rotated chunk), so each candidate re-quantizes those alone and re-uses the others' products;
* start at the static choice; sweep every pair over ``alpha x 2^(i/2)``, ``i = -4..4``, then over
  ``alpha x 2^(i/4)``, ``i = -2..2``; a move is kept only if it lowers the cost, so the calibrated cost is
  never above the static choice's on the calibration rows.  Scales stay in [2^-12, 2^12].
* the prompts are split in two halves (alternating); a move is kept only if it lowers the cost on *both*:
  the attention of a random or real model varies a lot from text to text, and a gain on one prompt alone
  (per-pair noise fitting, or a layer's pattern on one text) does not carry over to other text.

A per-head norm weight shared by every head (``shared``) takes one scale per pair: the heads' costs are
summed.  Time: each layer costs ``pairs x 12`` candidate evaluations over ``prompts x rows x tokens`` logits
per query head; ``rows`` (query rows kept per prompt, evenly spaced) and ``max_tokens`` bound it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..analysis import kv_measure as KM
from ..analysis import kv_rot as KR
from ..errors import CkptError, UnsupportedError

BLOCK = 32
DEFAULT_ROWS = 64
SWEEPS = ((2.0 ** 0.5, 4), (2.0 ** 0.25, 2))
ALPHA_BOUND = 2.0 ** 12


@dataclass(frozen=True, eq=False)
class Calibration:
    """The captured Q and K: ``layers[layer]`` = list over prompts of ``(q [H,R,D], k [KV,T,D], scaling, rows)``
    with ``rows`` the kept query positions (capture layout: transformers' own dims)."""

    prompts: int
    tokens: tuple
    rows: int
    layers: dict = field(repr=False)
    attn_rot: bool = True           # measure as llama.cpp's Hadamard-rotated K cache (see hadamard)

    def describe(self) -> str:
        return (f"calibrated on {self.prompts} prompts, {sum(self.tokens)} tokens "
                f"(up to {self.rows} query rows per prompt; "
                f"{'llama.cpp attn_rot Hadamard on' if self.attn_rot else 'no Hadamard rotation'})")

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "tokens": list(self.tokens), "rows": self.rows, "attn_rot": self.attn_rot}


def collect(source, *, prompts=None, max_tokens: int = KM.DEFAULT_MAX_TOKENS, rows: int = DEFAULT_ROWS,
            device: str = "cpu", attn_rot: bool = True) -> Calibration:
    """Run ``source`` on the prompts and keep each layer's Q (``rows`` evenly spaced query rows) and K."""
    if not isinstance(rows, int) or rows < 1:
        raise CkptError(f"rows (query rows kept per prompt) must be an integer >= 1, got {rows!r}", path=str(source))
    caps, tokens = KM.capture_qk(source, prompts=prompts, max_tokens=max_tokens, device=device)
    layers: dict = {}
    for cap in caps:
        for layer, (q, k, scaling, _v) in cap.items():
            t = q.shape[1]
            keep = np.unique(np.linspace(0, t - 1, min(rows, t)).round().astype(np.int64))
            layers.setdefault(layer, []).append((np.ascontiguousarray(q[:, keep]), k, scaling, keep))
    return Calibration(len(caps), tokens, rows, layers, bool(attn_rot))


def cache_perm(geom, naming: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(perm, positions)``: the captured dim at each cache position, and each scale group's cache
    positions (:func:`ckpt_surgeon.analysis.kv_rot.capture_cache_perm`)."""
    return KR.capture_cache_perm(geom, naming)


def hadamard(d: int, types) -> np.ndarray | None:
    """llama.cpp's ``attn_rot_k`` matrix for head_dim ``d`` and K types ``types`` (float32; the size and the
    conditions are :func:`ckpt_surgeon.analysis.kv_rot.rot_size`'s), or None when it rotates nothing."""
    sizes = {KR.rot_size(d, t, "k") for t in types}
    if len(sizes) != 1 or None in sizes:
        return None
    return KR.hadamard(sizes.pop()).astype(np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class _Prompt:
    """One prompt of one layer: exact attention and, per type and block, the current quantized products."""

    def __init__(self, q, k, scaling, keep, perm, kv, types, rot=None):
        h, r, d = q.shape
        self.q = q[..., perm].reshape(kv, h // kv, r, d).astype(np.float32)
        self.k = np.ascontiguousarray(k[..., perm], dtype=np.float32)
        self.s = float(scaling)
        self.mask = keep[:, None] >= np.arange(k.shape[1])[None, :]           # [R, T] causal
        exact = self.s * np.einsum("hgrd,hsd->hgrs", self.q.astype(np.float64), self.k.astype(np.float64))
        self.neg = np.where(self.mask, 0.0, -np.inf)
        self.lp = _log_softmax(exact + self.neg)
        self.p = np.exp(self.lp)
        self.types = types
        self.rot = rot
        self.unit = BLOCK if rot is None else rot.shape[0]       # dims one scale change can reach
        self.blocks = {t: [None] * (d // self.unit) for t in types}
        self.rows = h // kv * r                                              # rows per kv head

    def product(self, t: str, b: int, scale: np.ndarray) -> np.ndarray:
        """``s q_hat k_hat^T`` of unit b (a block of 32, or llama.cpp's Hadamard chunk) under per-head scales
        ``scale [kv, unit]`` (q x scale, k / scale; then both rotated where llama.cpp rotates)."""
        sl = slice(b * self.unit, (b + 1) * self.unit)
        q = self.q[..., sl] * scale[:, None, None, :].astype(np.float32)
        k = self.k[..., sl] / scale[:, None, :].astype(np.float32)
        if self.rot is not None:
            q, k = q @ self.rot, k @ self.rot
        qt = KM.query_type(t)
        qh = KM.roundtrip(q, qt) if qt else q
        kh = KM.roundtrip(k, t)
        return self.s * np.einsum("hgrd,hsd->hgrs", qh.astype(np.float64), kh.astype(np.float64))

    def kl(self, logits: np.ndarray) -> np.ndarray:
        """Sum over rows of each kv head of KL(exact || quantized)."""
        lq = _log_softmax(logits + self.neg)
        with np.errstate(invalid="ignore"):
            kl = np.where(self.mask, self.p * (self.lp - lq), 0.0).sum(-1)      # [kv, g, R]
        return kl.sum((1, 2))


class LayerProblem:
    """The measured cost of one layer as a function of the per-head, per-dim scales (cache order)."""

    def __init__(self, samples, perm, kv: int, types, d: int, rot=None):
        self.prompts = [_Prompt(q, k, s, keep, perm, kv, types, rot) for q, k, s, keep in samples]
        self.unit = self.prompts[0].unit
        self.types, self.kv, self.d = tuple(types), kv, d
        self.rows = sum(p.rows for p in self.prompts)
        self.scale = np.ones((kv, d))
        self.norm = {t: 1.0 for t in self.types}

    def set_scale(self, scale: np.ndarray) -> np.ndarray:
        """Quantize every block under ``scale [kv, d]``; returns the per-type mean row KL ``[types, kv]``."""
        self.scale = np.array(scale, dtype=np.float64)
        for pr in self.prompts:
            for t in self.types:
                for b in range(self.d // self.unit):
                    pr.blocks[t][b] = pr.product(t, b, self.scale[:, b * self.unit:(b + 1) * self.unit])
        return self.measure({})

    def _halves(self) -> list:
        """Prompt i belongs to half i % 2 (one prompt: both halves are that prompt)."""
        n = len(self.prompts)
        return [[i for i in range(n) if i % 2 == h or n == 1] for h in (0, 1)]

    def measure(self, repl: dict, split: bool = False) -> np.ndarray:
        """Per type, per kv head mean row KL ``[types, kv]`` with blocks ``repl[(prompt, type, b)]`` replaced;
        ``split``: ``[2, types, kv]``, each half of the prompts on its own."""
        sums = np.zeros((len(self.prompts), len(self.types), self.kv))
        for i, pr in enumerate(self.prompts):
            for ti, t in enumerate(self.types):
                tot = sum(repl.get((i, t, b), blk) for b, blk in enumerate(pr.blocks[t]))
                sums[i, ti] = pr.kl(tot)
        if not split:
            return sums.sum(0) / self.rows
        return np.stack([sums[h].sum(0) / sum(self.prompts[i].rows for i in h) for h in self._halves()])

    def cost(self, kl: np.ndarray) -> np.ndarray:
        """Per kv head (``[..., kv]``): sum over types of KL / KL at alpha = 1."""
        return sum(kl[..., i, :] / self.norm[t] for i, t in enumerate(self.types))

    def trial(self, pos: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, dict]:
        """Cost per kv head with the dims ``pos`` (cache positions) set to ``values [kv]``, and the new blocks."""
        scale = self.scale.copy()
        scale[:, pos] = values[:, None]
        repl = {}
        for b in sorted(set(int(x) // self.unit for x in pos)):
            sl = slice(b * self.unit, (b + 1) * self.unit)
            for i, pr in enumerate(self.prompts):
                for t in self.types:
                    repl[(i, t, b)] = pr.product(t, b, scale[:, sl])
        return self.cost(self.measure(repl, split=True)), repl

    def commit(self, pos: np.ndarray, values: np.ndarray, repl: dict) -> None:
        self.scale[:, pos] = values[:, None]
        for (i, t, b), blk in repl.items():
            self.prompts[i].blocks[t][b] = blk


def _descend(pb: LayerProblem, positions, shared: bool) -> None:
    """Coordinate descent over the groups' scales (see the module docstring); ``pb`` ends at the choice."""
    cur_cost = pb.cost(pb.measure({}, split=True))             # [2 halves, kv]
    for step, span in SWEEPS:
        for pos in positions:
            base = pb.scale[:, pos[0]].copy()
            best_cost, best_val, moved = cur_cost.copy(), base.copy(), False
            for i in [i for i in range(-span, span + 1) if i]:
                vals = np.clip(base * step ** i, 1.0 / ALPHA_BOUND, ALPHA_BOUND)
                c, repl = pb.trial(pos, vals)
                # a move must lower the cost on both halves of the prompts (a prompt-specific gain is noise)
                if shared:
                    better = np.full(pb.kv, (c.sum(-1) < best_cost.sum(-1) - 1e-15).all())
                else:
                    better = (c < best_cost - 1e-15).all(0)
                if better.any():
                    best_cost = np.where(better[None], c, best_cost)
                    best_val = np.where(better, vals, best_val)
                    moved = True
            if moved:
                c, repl = pb.trial(pos, best_val)
                pb.commit(pos, best_val, repl)
                cur_cost = c


@dataclass(frozen=True)
class LayerCalibration:
    """The calibrated scales of one layer (file dims) and the measured mean row KL of the first K type."""

    alpha: np.ndarray
    kl_before: float          # alpha = 1
    kl_static: float          # the static choice
    kl_after: float           # calibrated


def check_types(types, src) -> None:
    """One line for a type calibration does not measure block by block (fp8's per-tensor scale)."""
    bad = [t for t in types if t not in KM.BLOCK_TYPES]
    if bad:
        raise UnsupportedError(f"--calibrate measures llama.cpp's block cache types ({', '.join(KM.BLOCK_TYPES)}) "
                               f"block by block; {', '.join(bad)} has a per-tensor scale: drop --calibrate for it",
                               path=src)


def calibrate_layer(samples, geom, naming: str, kv: int, types, alpha_static: np.ndarray,
                    shared: bool, attn_rot: bool = True) -> LayerCalibration:
    """Calibrated ``alpha [kv, d]`` (file dims) for one layer, starting from ``alpha_static``; ``attn_rot``:
    measure as llama.cpp does with its Hadamard rotation of Q and K (:func:`hadamard`), else plain blocks."""
    check_types(types, None)
    d = geom.head_dim
    if d % BLOCK:
        raise UnsupportedError(f"--calibrate: head_dim {d} is not a multiple of {BLOCK}, the block llama.cpp's cache "
                               "types quantize along (llama.cpp refuses such a cache too): use the static choice")
    perm, positions = cache_perm(geom, naming)
    pb = LayerProblem(samples, perm, kv, types, d, hadamard(d, types) if attn_rot else None)
    kl1 = pb.set_scale(np.ones((kv, d)))
    pb.norm = {t: max(float(kl1[i].mean()), 1e-30) for i, t in enumerate(types)}
    start = np.ones((kv, d))
    for fg, pos in zip(geom.groups(), positions):
        start[:, pos] = alpha_static[:, fg[0]][:, None]
    kls = pb.set_scale(start)
    _descend(pb, positions, shared)
    kla = pb.measure({})
    alpha = np.ones((kv, d))
    for fg, pos in zip(geom.groups(), positions):
        alpha[:, fg] = pb.scale[:, pos[0]][:, None]
    return LayerCalibration(alpha, float(kl1[0].mean()), float(kls[0].mean()), float(kla[0].mean()))
