"""One HF tensor written as several GGUF tensors, and joined back (registry ``Split`` rows).

``mla_kv_b`` (llama.cpp ``DeepseekV2Model.modify_tensors``, "MLA with the absorption
optimization"): DeepSeek-V2's ``kv_b_proj`` weight ``[h * (nope + v), r]`` (r = kv_lora_rank)
holds, per head, ``nope`` key rows then ``v`` value rows.  llama.cpp wants them apart:
``attn_k_b`` = the key rows transposed per head ``[h, r, nope]`` (its graph multiplies the query
into the latent space) and ``attn_v_b`` = the value rows ``[h, v, r]``.  Both directions move
values only, so GGUF -> HF -> GGUF is bit-exact.

``qkv_grouped_llama`` (llama.cpp ``InternLM2Model.modify_tensors``): InternLM2's fused ``wqkv``
``[kv, q_per_kv + 2, d]`` rows (per kv group: its q heads, then its k head, then its v head: the
``grouped`` layout of :mod:`ckpt_surgeon.arch.layouts`) becomes ``attn_q`` / ``attn_k`` /
``attn_v``, q and k rows permuted as ``LlamaModel.permute`` does (InternLM2 rotates halves like
llama).  Rows move, values do not.

Each function is pure numpy; shapes are on the lines.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError


def _mla_kv_b_split(w: np.ndarray, hp: dict, *, path: str = "", tensor: str = "") -> tuple[np.ndarray, ...]:
    """``[h * (nope + v), r]`` -> (``[h, r, nope]``, ``[h, v, r]``); hp: n_head, qk_nope, v_head."""
    h, nope, v = hp["n_head"], hp["qk_nope_head_dim"], hp["v_head_dim"]
    if w.ndim != 2 or w.shape[0] != h * (nope + v):
        raise ConfigError(f"kv_b_proj has shape {list(w.shape)}; expected [{h} heads x ({nope} + {v}), kv_lora_rank]",
                          path=path, tensor=tensor)
    kv = w.reshape(h, nope + v, w.shape[1])
    return np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1)), np.ascontiguousarray(kv[:, nope:, :])


def _mla_kv_b_shapes(shape: tuple, hp: dict) -> tuple[tuple, ...]:
    h, nope, v = hp["n_head"], hp["qk_nope_head_dim"], hp["v_head_dim"]
    return (h, shape[1], nope), (h, v, shape[1])


def _mla_kv_b_join(k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    """(``[h, r, nope]``, ``[h, v, r]``) -> ``[h * (nope + v), r]`` (the inverse of the split)."""
    if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise ValueError(f"attn_k_b {list(k_b.shape)} and attn_v_b {list(v_b.shape)} do not join")
    kv = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
    return np.ascontiguousarray(kv.reshape(-1, kv.shape[2]))


def _mla_kv_b_joined_shape(shapes: list[tuple]) -> tuple:
    (h, r, nope), (_, v, _) = shapes
    return (h * (nope + v), r)


def _grouped_heads(rows: int, hp: dict, path: str, tensor: str) -> tuple[int, int, int]:
    h, kv = hp["n_head"], hp["n_head_kv"]
    d = rows // (h + 2 * kv) if h + 2 * kv else 0
    if not d or d * (h + 2 * kv) != rows or h % kv or d % 2:
        raise ConfigError(f"{rows} fused q/k/v rows do not split into {h} query + 2 x {kv} key/value heads of even "
                          "size", path=path, tensor=tensor)
    return h, kv, d


def _qkv_grouped_llama_split(w: np.ndarray, hp: dict, *, path: str = "", tensor: str = "") -> tuple[np.ndarray, ...]:
    """``[(h + 2 kv) d, n]`` grouped -> (q ``[h d, n]``, k ``[kv d, n]``, v ``[kv d, n]``), q / k permuted."""
    from ..arch.layouts import llama_permute_index, qkv_row_index
    h, kv, d = _grouped_heads(w.shape[0], hp, path, tensor)
    iq, ik, iv = qkv_row_index("grouped", h, kv, d)
    return w[iq[llama_permute_index(h, d)]], w[ik[llama_permute_index(kv, d)]], w[iv]


def _qkv_grouped_llama_shapes(shape: tuple, hp: dict) -> tuple[tuple, ...]:
    h, kv, d = _grouped_heads(shape[0], hp, "", "")
    return (h * d, *shape[1:]), (kv * d, *shape[1:]), (kv * d, *shape[1:])


def _qkv_grouped_llama_join(*parts: np.ndarray) -> np.ndarray:
    raise NotImplementedError("attn_q / attn_k / attn_v are not joined back into wqkv: InternLM2 GGUF files "
                              "convert to LlamaForCausalLM, which keeps them apart")


# kind -> (split(arr, hp) -> parts, shapes(HF shape, hp) -> part shapes, join(*parts) -> arr,
#          joined_shape([part shapes]) -> HF shape)
SPLITS = {"mla_kv_b": (_mla_kv_b_split, _mla_kv_b_shapes, _mla_kv_b_join, _mla_kv_b_joined_shape),
          "qkv_grouped_llama": (_qkv_grouped_llama_split, _qkv_grouped_llama_shapes, _qkv_grouped_llama_join,
                                lambda shapes: (sum(s[0] for s in shapes), *shapes[0][1:]))}
# split kinds whose parts are llama-permuted (a family's gguf_qk_permuted fact, tests/test_registry.py)
PERMUTING = frozenset({"qkv_grouped_llama"})


def split_part(transform: str, arr: np.ndarray, hp: dict, *, path: str = "", tensor: str = "") -> np.ndarray:
    """Part ``i`` of a ``"kind:i"`` transform of the HF tensor ``arr``."""
    kind, i = transform.split(":")
    return SPLITS[kind][0](arr, hp, path=path, tensor=tensor)[int(i)]


def part_shape(transform: str, shape: tuple, hp: dict) -> tuple:
    kind, i = transform.split(":")
    return tuple(SPLITS[kind][1](tuple(shape), hp)[int(i)])


def join(kind: str, parts: list[np.ndarray]) -> np.ndarray:
    return SPLITS[kind][2](*parts)


def joined_shape(kind: str, shapes: list[tuple]) -> tuple:
    return tuple(SPLITS[kind][3]([tuple(s) for s in shapes]))
