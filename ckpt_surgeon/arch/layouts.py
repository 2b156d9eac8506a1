"""Row-index maps for fused QKV layouts and the llama.cpp rotary permutation.

Every layout is expressed as integer index arrays into the fused *row* axis (the
output-feature axis).  Splitting is then a gather ``fused[idx_q]`` and fusing a
scatter, which makes ``split(fuse(x))`` bit-exact by construction and works the
same on numpy arrays and torch tensors.  For GPT-2's ``Conv1D`` the output-feature
axis is the *last* axis of the weight (``[in, 3*out]``); callers pass ``axis=-1``.

Layouts (sources: transformers modeling_phi3, modeling_gpt2, modeling_gpt_neox, modeling_bloom,
modeling_falcon; llama.cpp's converter for GGUF ``attn_qkv``):

- ``concat``   rows ``[Q; K; V]`` — Phi-3 ``qkv_proj``, every GGUF ``attn_qkv``,
               GPT-2 ``c_attn`` (on its last axis), Falcon with ``multi_query``.
- ``per_head`` ``[h, 3, d]`` — GPT-NeoX ``query_key_value``, BLOOM, old Falcon
               (requires n_kv == n_heads).
- ``grouped``  ``[kv, q_per_kv + 2, d]`` — Falcon ``new_decoder_architecture``
               (modeling_falcon ``_split_heads``).
"""
from __future__ import annotations

import numpy as np

LAYOUTS = ("concat", "per_head", "grouped")


def qkv_row_index(layout: str, n_heads: int, n_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index arrays (q, k, v) into the fused row axis, each in HF head-major order.

    q has ``n_heads*head_dim`` rows, k and v ``n_kv_heads*head_dim``.
    """
    h, kv, d = n_heads, n_kv_heads, head_dim
    if layout == "concat":
        q = np.arange(h * d)
        k = h * d + np.arange(kv * d)
        v = (h + kv) * d + np.arange(kv * d)
        return q, k, v
    if layout == "per_head":
        if kv != h:
            raise ValueError(f"per-head interleaved [h, 3, d] needs n_kv_heads == n_heads (got {kv} / {h})")
        grid = np.arange(h * 3 * d).reshape(h, 3, d)
        return grid[:, 0].reshape(-1), grid[:, 1].reshape(-1), grid[:, 2].reshape(-1)
    if layout == "grouped":
        if h % kv:
            raise ValueError(f"n_heads {h} is not a multiple of n_kv_heads {kv}")
        g = h // kv
        grid = np.arange(kv * (g + 2) * d).reshape(kv, g + 2, d)
        return grid[:, :g].reshape(-1), grid[:, g].reshape(-1), grid[:, g + 1].reshape(-1)
    raise ValueError(f"unknown fused layout {layout!r} (known: {', '.join(LAYOUTS)})")


def concat_index(layout: str, n_heads: int, n_kv_heads: int, rows: int) -> np.ndarray:
    """Row index ``idx`` with ``concat_rows = fused_rows[idx]``: a fused QKV in ``layout`` reordered
    to ``[Q; K; V]``, the order llama.cpp's converter writes ``attn_qkv`` in (``GPTNeoXModel`` /
    ``BloomModel`` / ``FalconModel.modify_tensors``).  Its inverse is ``np.argsort(idx)``."""
    head_dim = rows // (n_heads + 2 * n_kv_heads)
    if head_dim * (n_heads + 2 * n_kv_heads) != rows:
        raise ValueError(f"{rows} fused rows do not split into {n_heads} + 2 x {n_kv_heads} heads")
    return np.concatenate(qkv_row_index(layout, n_heads, n_kv_heads, head_dim))


# A q projection that also carries an output gate (2 x heads x head_dim rows; the attention output
# is multiplied by sigmoid(gate) before o_proj).  ``per_head`` ``[h, 2, d]``: per head the query,
# then its gate: modeling_qwen3_next ``Qwen3NextAttention.forward``
# ``q_proj(x).view(..., -1, head_dim * 2)`` then ``torch.chunk(.., 2, dim=-1)``.  ``halves``
# ``[2, h, d]``: every query row, then every gate row.
GATE_LAYOUTS = ("per_head", "halves")


def query_row_index(gate_layout: str, n_heads: int, head_dim: int) -> np.ndarray:
    """Rows of the query (head-major, ``n_heads*head_dim``) inside a gated q projection."""
    h, d = n_heads, head_dim
    if gate_layout == "per_head":
        return np.arange(h * 2 * d).reshape(h, 2, d)[:, 0].reshape(-1)
    if gate_layout == "halves":
        return np.arange(h * d)
    raise ValueError(f"unknown gated-query layout {gate_layout!r} (known: {', '.join(GATE_LAYOUTS)})")


def fused_rows(n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    return (n_heads + 2 * n_kv_heads) * head_dim


def llama_permute_index(n_head: int, head_dim: int) -> np.ndarray:
    """Row index ``idx`` with ``gguf_rows = hf_rows[idx]`` for llama-arch Q/K.

    llama.cpp's converter (convert_hf_to_gguf.py ``LlamaModel.permute``) does
    ``w.reshape(n_head, 2, hd//2, ...).swapaxes(1, 2)``: within each head, HF's
    rotate_half pairs (i, i + hd/2) become adjacent rows (2i, 2i+1).
    """
    d2 = head_dim // 2
    idx = np.arange(n_head * head_dim).reshape(n_head, 2, d2).swapaxes(1, 2).reshape(-1)
    return idx


def llama_unpermute_index(n_head: int, head_dim: int) -> np.ndarray:
    """Inverse of :func:`llama_permute_index`: ``hf_rows = gguf_rows[idx]``."""
    return np.argsort(llama_permute_index(n_head, head_dim))


def rotary_pairs(head_dim: int, rotary_dim: int, pair_layout: str) -> np.ndarray:
    """``[rotary_dim/2, 2]`` indices within a head of the dimensions RoPE rotates together.

    Pair j rotates with frequency ``theta ** (-2j / rotary_dim)``.
    ``rotate_half`` (HF): pair j = (j, j + rotary_dim/2).  ``interleaved``
    (llama.cpp-permuted GGUF, GPT-J): pair j = (2j, 2j + 1).  Dimensions
    ``>= rotary_dim`` pass through unrotated (partial rotary).
    """
    half = rotary_dim // 2
    j = np.arange(half)
    if pair_layout == "rotate_half":
        return np.stack([j, j + half], axis=1)
    if pair_layout == "interleaved":
        return np.stack([2 * j, 2 * j + 1], axis=1)
    raise ValueError(f"unknown pair layout {pair_layout!r}")
