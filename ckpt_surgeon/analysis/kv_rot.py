"""llama.cpp's attention rotation (``attn_rot``) before a quantized KV cache, as its sources apply it.

Read from ``src/llama-kv-cache.cpp`` and ``src/llama-graph.cpp`` of the llama.cpp vendored in
llama-cpp-python 0.3.36 (the project's runtime):

* **K** (``attn_rot_k``): on when the K cache type is a quantized ggml type (``ggml_is_quantized``: the
  block types; f16/bf16/f32 are not), every layer has the same K head size, and that head size is a
  multiple of 64.  Q and K (after RoPE, in the GGUF's own row order, i.e. the cache order) are multiplied,
  chunk by chunk along the head dim, by a normalized Sylvester-Hadamard matrix of size ``n`` = the largest
  power of two (>= 64) dividing the head size (``build_input_k_rot``).  Every logit is unchanged (H is
  orthogonal); the cache blocks (32 values) then hold rotated values, so a few dominant dims spread over
  the whole chunk.
* **V** (``attn_rot_v``): on when the V cache type is quantized and the V head size is a multiple of 64;
  always a 64 x 64 Hadamard (``build_input_v_rot``: "smaller rotation matrices for V seem beneficial").  V
  is rotated before the cache and the attention output rotated back (H symmetric, ``H H = I``) before W_o.
* ``LLAMA_ATTN_ROT_DISABLE`` (read with ``atoi``: a non-zero integer) turns both off.

``ggml_gen_hadamard`` builds ``H[0,0] = 1/sqrt(n)`` and doubles it as ``[[H, H], [H, -H]]``.

Besides the rotation, one condition decides whether a quantized cache can act on a model at all
(:func:`head_block_problem`): ``llama_init_from_model`` (``src/llama-context.cpp``) refuses a K (V)
cache type whose block size does not divide ``n_embd_head_k`` (``n_embd_head_v``) of every layer when
flash attention is on; with it off nothing checks it, and the cache type does not act on the logits as
asked (measured on a head_dim 16 model: q8_0 and q4_0 K caches give bit-identical logits).
"""
from __future__ import annotations

import functools
import os

import numpy as np

ROT_MIN = 64                  # both rotations need head_dim % 64 == 0
V_ROT = 64                    # V's rotation is always 64 x 64
QUANTIZED = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")   # llama.cpp cache types ggml calls quantized
ENV = "LLAMA_ATTN_ROT_DISABLE"


def env_enabled(environ=None) -> bool:
    """What llama.cpp would do in this environment: off when ``LLAMA_ATTN_ROT_DISABLE`` is a non-zero
    integer (C ``atoi``: leading digits, else 0)."""
    raw = (os.environ if environ is None else environ).get(ENV)
    if raw is None:
        return True
    s = raw.strip()
    sign = -1 if s.startswith("-") else 1
    digits = ""
    for ch in s.lstrip("+-"):
        if not ch.isdigit():
            break
        digits += ch
    return not (digits and sign * int(digits) != 0)


def resolve(attn_rot: bool | None) -> bool:
    """``None``: as llama.cpp would in this environment (:func:`env_enabled`), else the value given."""
    return env_enabled() if attn_rot is None else bool(attn_rot)


def rot_size(head_dim: int, cache_type: str, side: str = "k", enabled: bool = True) -> int | None:
    """The Hadamard size llama.cpp applies to ``side`` (``"k"``: Q and K; ``"v"``: V and the output) for a
    ``cache_type`` cache of that side, or None when it applies none."""
    if not enabled or cache_type not in QUANTIZED or head_dim <= 0 or head_dim % ROT_MIN:
        return None
    if side == "v":
        return V_ROT
    n = ROT_MIN
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def block_size(cache_type: str) -> int | None:
    """Values per block of a quantized llama.cpp cache type (gguf-py's ``GGML_QUANT_SIZES``), None for a float
    type or a type llama.cpp does not cache in."""
    if cache_type not in QUANTIZED:
        return None
    import gguf
    return int(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[cache_type.upper()]][0])


def head_block_problem(cache_type: str, head_sizes, side: str = "K") -> str | None:
    """Why this model cannot show a ``cache_type`` ``side`` cache's effect in llama.cpp, or None when it can:
    the type's block must divide every layer's ``side`` head size (``head_sizes``), the condition
    ``llama_init_from_model`` enforces with flash attention (see the module docstring)."""
    block = block_size(cache_type)
    bad = sorted({int(d) for d in head_sizes if block and int(d) % block})
    if not bad:
        return None
    return (f"a {cache_type} {side} cache quantizes blocks of {block} values along each head, and this model's "
            f"{side} head size is {bad[0]}: llama.cpp refuses that cache with flash attention (llama-context.cpp: "
            f"the block size must divide n_embd_head_{side.lower()}) and without it the cache type does not act on "
            "the logits as asked, so this model cannot show a KV-cache effect (a head size that is a multiple of "
            f"{block} can)")


def hadamard(n: int) -> np.ndarray:
    """The normalized Sylvester-Hadamard matrix of size ``n`` (a power of two), float64, symmetric (a copy)."""
    return _hadamard(int(n), "float64").copy()


@functools.lru_cache(maxsize=16)
def _hadamard(n: int, dtype: str) -> np.ndarray:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    out = (h / np.sqrt(n)).astype(dtype)
    out.setflags(write=False)
    return out


def rotate_rows(x: np.ndarray, n: int | None) -> np.ndarray:
    """``x [..., d]`` (cache order) with each consecutive chunk of ``n`` dims multiplied by H_n (None: as is)."""
    if n is None:
        return x
    h = _hadamard(int(n), "float32" if x.dtype == np.float32 else "float64")
    return (x.reshape(x.shape[:-1] + (-1, n)) @ h).reshape(x.shape)


def chunk_mean(x: np.ndarray, n: int | None) -> np.ndarray:
    """``x [..., d]`` with each chunk of ``n`` replaced by its mean: the variance of every rotated element of
    independent elements with variances ``x`` (all of H_n's entries are +-1/sqrt(n))."""
    if n is None:
        return x
    m = x.reshape(x.shape[:-1] + (-1, n)).mean(-1, keepdims=True)
    return np.broadcast_to(m, x.shape[:-1] + (x.shape[-1] // n, n)).reshape(x.shape)


def capture_cache_perm(geom, naming: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(perm, positions)``: ``perm[p]`` = the captured (transformers-layout) dim held at cache position p,
    and per scale group (``geom.groups()`` order) its cache positions.  Captured tensors are in transformers'
    layout: the file's own for an HF source, rotate_half for a GGUF (the loader un-permutes llama.cpp's
    interleaved rows)."""
    from ..arch.layouts import rotary_pairs

    d = geom.head_dim
    inv = np.empty(d, dtype=np.int64)
    inv[geom.cache_order] = np.arange(d)
    cap_pairs = geom.pairs if naming != "gguf" or not len(geom.pairs) else \
        rotary_pairs(d, 2 * len(geom.pairs), "rotate_half")
    seen = set(int(x) for x in cap_pairs.reshape(-1))
    cap_groups = [np.asarray(p) for p in cap_pairs] + [np.array([i]) for i in range(d) if i not in seen]
    perm = np.empty(d, dtype=np.int64)
    positions = []
    for fg, cg in zip(geom.groups(), cap_groups):
        pos = inv[np.asarray(fg)]
        perm[pos] = cg
        positions.append(pos)
    return perm, positions


def describe(head_dim: int, cache_type: str, enabled: bool) -> str:
    """One phrase: what llama.cpp rotates for a ``cache_type`` K and V cache of this head size."""
    k, v = rot_size(head_dim, cache_type, "k", enabled), rot_size(head_dim, cache_type, "v", enabled)
    if k is None and v is None:
        why = "off (LLAMA_ATTN_ROT_DISABLE)" if not enabled else \
            ("none (not a quantized ggml type)" if cache_type not in QUANTIZED else f"none (head_dim {head_dim} % 64)")
        return why
    return f"Q,K Hadamard {k}; V Hadamard {v}"
