"""llama.cpp's per-tensor quantization mixture: which ggml type each GGUF tensor gets for a file type.

This is ``llama_tensor_get_type`` of llama.cpp's ``src/llama-quant.cpp`` (the version vendored by
llama-cpp-python 0.3.36; line numbers below refer to that file), which ``llama-quantize`` and
``llama_model_quantize`` run.  What can be data is data (the file types, the category names, the
names never quantized, the fallback types); the branching of ``llama_tensor_get_type_impl`` (lines
446-715), which depends on counters over the tensors in llama.cpp's own order, is kept as one
function with the same branches in the same order, so it can be read side by side with the C++.

``tests/test_quantize.py`` checks the result against ``llama_model_quantize`` on real files
(types and bytes, every file type, dense / MoE / fused-QKV / odd-width families, with and without
an importance matrix).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from functools import lru_cache


@lru_cache(maxsize=None)
def _arch_names() -> tuple[str, dict]:
    """llama.cpp's architecture names the mixture reads, from gguf-py's table (imported on first use:
    ``import ckpt_surgeon`` stays free of gguf): LLM_ARCH_FALCON, and the layer count that makes a
    model 70B per architecture (``_LAYERS_70B``)."""
    from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES
    layers_70b = {MODEL_ARCH_NAMES[a]: v for a, v in (
        (MODEL_ARCH.LLAMA, (80, True)), (MODEL_ARCH.QWEN2, (80, False)), (MODEL_ARCH.OLMO, (80, False)),
        (MODEL_ARCH.DECI, (80, False)), (MODEL_ARCH.JAIS2, (68, False)))}
    return MODEL_ARCH_NAMES[MODEL_ARCH.FALCON], layers_70b

__all__ = ["FTYPES", "QUANT_FTYPES", "needs_imatrix_ftypes", "tensor_types", "MixModel", "FALLBACK"]

# --- file types: name -> (gguf-py LlamaFileType member, default ggml type) ----------------------
# llama_ftype_get_default_type (lines 871-916).  Only those llama-quantize offers and llama.cpp runs
# on every backend (TQ*, MXFP4_MOE, NVFP4, Q1_0 / Q2_0 left out).
FTYPES = {
    "q4_0": ("MOSTLY_Q4_0", "Q4_0"), "q4_1": ("MOSTLY_Q4_1", "Q4_1"),
    "q5_0": ("MOSTLY_Q5_0", "Q5_0"), "q5_1": ("MOSTLY_Q5_1", "Q5_1"),
    "q8_0": ("MOSTLY_Q8_0", "Q8_0"),
    "q2_k": ("MOSTLY_Q2_K", "Q2_K"), "q2_k_s": ("MOSTLY_Q2_K_S", "Q2_K"),
    "q3_k_s": ("MOSTLY_Q3_K_S", "Q3_K"), "q3_k_m": ("MOSTLY_Q3_K_M", "Q3_K"), "q3_k_l": ("MOSTLY_Q3_K_L", "Q3_K"),
    "q4_k_s": ("MOSTLY_Q4_K_S", "Q4_K"), "q4_k_m": ("MOSTLY_Q4_K_M", "Q4_K"),
    "q5_k_s": ("MOSTLY_Q5_K_S", "Q5_K"), "q5_k_m": ("MOSTLY_Q5_K_M", "Q5_K"),
    "q6_k": ("MOSTLY_Q6_K", "Q6_K"),
    "iq4_nl": ("MOSTLY_IQ4_NL", "IQ4_NL"), "iq4_xs": ("MOSTLY_IQ4_XS", "IQ4_XS"),
    "iq3_s": ("MOSTLY_IQ3_S", "IQ3_S"), "iq3_m": ("MOSTLY_IQ3_M", "IQ3_S"),
    "iq3_xs": ("MOSTLY_IQ3_XS", "IQ3_S"), "iq3_xxs": ("MOSTLY_IQ3_XXS", "IQ3_XXS"),
    "iq2_s": ("MOSTLY_IQ2_S", "IQ2_XS"), "iq2_m": ("MOSTLY_IQ2_M", "IQ2_S"),
    "iq2_xs": ("MOSTLY_IQ2_XS", "IQ2_XS"), "iq2_xxs": ("MOSTLY_IQ2_XXS", "IQ2_XXS"),
    "iq1_s": ("MOSTLY_IQ1_S", "IQ1_S"), "iq1_m": ("MOSTLY_IQ1_M", "IQ1_M"),
}
QUANT_FTYPES = tuple(FTYPES)

# --- tensor categories (tensor_get_category, lines 119-155): first substring found wins -------
_CATEGORIES = (("attn_qkv.weight", "ATTENTION_QKV"), ("attn_kv_b.weight", "ATTENTION_KV_B"),
               ("attn_v.weight", "ATTENTION_V"), ("attn_k.weight", "ATTENTION_K"),
               ("attn_q.weight", "ATTENTION_Q"), ("attn_output.weight", "ATTENTION_OUTPUT"),
               ("ffn_up", "FFN_UP"), ("ffn_gate", "FFN_GATE"), ("ffn_down", "FFN_DOWN"))
_TOKEN_EMBD = ("token_embd.weight", "per_layer_token_embd.weight")      # lines 104-107
_ATTN_V_LIKE = ("ATTENTION_V", "ATTENTION_QKV", "ATTENTION_KV_B")        # category_is_attn_v, 157-161

# --- never quantized (tensor_allows_quantization, lines 287-384): substrings, exact names -------
_KEEP_SUBSTRINGS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
                    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
                    "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
                    "mm.a.code_embd")
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")   # LLM_TN(arch)(POS_EMBD / TOKEN_TYPES, "weight")

# --- tensor_type_fallback (lines 390-443): a row that is not whole blocks of the chosen type ----
FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
            "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
            "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

# --- tensor_requires_imatrix (lines 856-875) -------------------------------------------------
_IMATRIX_TYPES = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S")

# --- llm_type 70B (the one model size the mixture reads, line 593): layer count per architecture,
# from each architecture's load_hparams (src/models/llama.cpp:28 only with grouped KV heads,
# qwen2.cpp:14, olmo.cpp:10, deci.cpp:8; jais2.cpp:8 at 68 layers)
# _LAYERS_70B: see _arch_names()

_IQ2_FAMILY = ("iq2_xxs", "iq2_xs", "iq1_s", "iq2_s", "iq2_m", "iq1_m")


def needs_imatrix_ftypes() -> tuple:
    """File types whose default type llama.cpp refuses to make without an importance matrix."""
    return tuple(f for f, (_, t) in FTYPES.items() if t in _IMATRIX_TYPES or f == "q2_k_s")


@dataclass(frozen=True)
class MixModel:
    """What the mixture reads of the model: its GGUF architecture and llama_hparams."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:                 # llama_hparams::n_gqa (llama-hparams.cpp:99-108)
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        n, gqa_only = _arch_names()[1].get(self.arch, (None, False))
        return self.n_layer == n and (not gqa_only or self.n_head != self.n_head_kv)


def _category(name: str) -> str:
    if name == "output.weight":
        return "OUTPUT"
    if name in _TOKEN_EMBD:
        return "TOKEN_EMBD"
    return next((cat for sub, cat in _CATEGORIES if sub in name), "OTHER")


def _n_dims(shape: tuple) -> int:
    """ggml_n_dims: trailing size-1 dimensions (in ggml's order) do not count; at least 1."""
    ne = list(reversed(shape))
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def allows_quantization(name: str, shape: tuple) -> bool:
    """tensor_allows_quantization (lines 287-384), for llama.cpp's default parameters."""
    if _n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    return not any(s in name for s in _KEEP_SUBSTRINGS) and name not in _KEEP_NAMES


def _weights_order(name: str):
    """llama_model_loader's weights_map order (llama-model-loader.h:54-65): layer (-1 for none),
    then the name as bytes; the counters below advance in this order."""
    m = re.match(r"blk\.(-?\d+)\.", name)
    return (int(m.group(1)) if m else -1, name.encode())


class _State:
    def __init__(self, names: list, model: MixModel, has_imatrix: bool):
        cats = [_category(n) for n in names]
        # init_quantize_state_counters (lines 927-941)
        self.n_attention_wv = sum(c in _ATTN_V_LIKE for c in cats)
        self.tied = "OUTPUT" not in cats
        self.n_ffn_down = self.n_ffn_gate = self.n_ffn_up = model.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.has_imatrix = has_imatrix


def _use_more_bits(i: int, n: int) -> bool:      # line 452
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _impl(qs: _State, m: MixModel, new: str, name: str, ne0: int, ftype: str, cat: str, block) -> str:
    """llama_tensor_get_type_impl (lines 446-715), branch for branch (the GLM5-next and MXFP4_MOE
    branches concern architectures / file types not written here)."""
    arch = m.arch
    _FALCON = _arch_names()[0]

    def layer_info(i_layer: int, n_layer: int) -> tuple[int, int]:    # lines 455-470
        if max(1, m.n_expert) > 1:
            hit = re.match(r"blk\.(\d+)\.", name)
            if hit is None:
                raise ValueError(f"Failed to determine layer for tensor {name}")
            i_layer = int(hit.group(1))
        return i_layer, n_layer

    if cat == "OUTPUT" or (qs.tied and cat == "TOKEN_EMBD"):                     # lines 489-512
        if arch == _FALCON or ne0 % block(new):
            new = "Q8_0"
        elif ftype in ("iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq2_s", "iq2_m", "iq1_m"):
            new = "Q5_K"
        elif new != "Q8_0":
            new = "Q6_K"
    elif cat == "TOKEN_EMBD":                                                      # lines 525-542
        if ftype in ("iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"):
            new = "Q2_K"
        elif ftype in ("iq2_s", "iq2_m", "iq3_xxs"):
            new = "IQ3_S"
    elif ftype in _IQ2_FAMILY:                                                     # lines 543-567
        if cat in _ATTN_V_LIKE:
            if m.n_gqa >= 4 or m.n_expert >= 4:
                new = "Q4_K"
            else:
                new = "IQ3_S" if ftype in ("iq2_s", "iq2_m") else "Q2_K"
            qs.i_attention_wv += 1
        elif m.n_expert == 8 and cat == "ATTENTION_K":
            new = "Q4_K"
        elif cat == "FFN_DOWN":
            if qs.i_ffn_down < qs.n_ffn_down // 8:
                new = "IQ3_S" if ftype in ("iq2_s", "iq2_m") else "Q2_K"
            qs.i_ffn_down += 1
        elif cat == "ATTENTION_OUTPUT":
            if m.n_expert == 8:
                new = "Q5_K"
            elif ftype in ("iq1_s", "iq1_m"):
                new = "IQ2_XXS"
            elif ftype in ("iq2_s", "iq2_m"):
                new = "IQ3_S"
    elif cat in _ATTN_V_LIKE:                                                      # lines 568-604
        gqa = m.n_gqa
        if ftype == "q2_k":
            new = "Q4_K" if gqa >= 4 else "Q3_K"
        elif ftype == "q2_k_s" and gqa >= 4:
            new = "Q4_K"
        elif ftype == "iq3_xxs":
            new = "Q4_K" if gqa >= 4 else ("IQ3_S" if not qs.has_imatrix else "IQ3_XXS")
        elif ftype in ("iq3_xs", "iq3_s") and gqa >= 4:
            new = "Q4_K"
        elif ftype == "iq3_m":
            new = "Q4_K"
        elif ftype == "q3_k_m":
            new = "Q5_K" if qs.i_attention_wv < 2 else "Q4_K"
        elif ftype == "q3_k_l":
            new = "Q5_K"
        elif ftype in ("iq4_nl", "iq4_xs") and gqa >= 4:
            new = "Q5_K"
        elif ftype in ("q4_k_m", "q5_k_m") and _use_more_bits(qs.i_attention_wv, qs.n_attention_wv):
            new = "Q6_K"
        elif ftype == "q4_k_s" and qs.i_attention_wv < 4:
            new = "Q5_K"
        if m.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if m.n_expert == 8:
            new = "Q8_0"
        qs.i_attention_wv += 1
    elif cat == "ATTENTION_K":                                                     # lines 605-617
        if m.n_expert == 8:
            new = "Q8_0"
        elif ftype == "iq3_xs":
            new = "IQ3_XXS"
        elif ftype == "iq3_xxs":
            new = "IQ2_S"
    elif cat == "ATTENTION_Q":                                                     # lines 618-624
        if ftype == "iq3_xs":
            new = "IQ3_XXS"
        elif ftype == "iq3_xxs":
            new = "IQ2_S"
    elif cat == "FFN_DOWN":                                                        # lines 625-670
        i_layer, n_layer = layer_info(qs.i_ffn_down, qs.n_ffn_down)
        if ftype == "q2_k":
            new = "Q3_K"
        elif ftype == "q2_k_s":
            if i_layer < n_layer // 8:
                new = "Q4_K"
        elif ftype == "iq3_xxs" and not qs.has_imatrix:
            new = "Q4_K" if i_layer < n_layer // 8 else "Q3_K"
        elif ftype == "q3_k_m":
            new = ("Q5_K" if i_layer < n_layer // 16
                   else "Q4_K" if arch != _FALCON or _use_more_bits(i_layer, n_layer) else "Q3_K")
        elif ftype == "iq3_m" and (i_layer < n_layer // 8 or (m.n_expert == 8 and _use_more_bits(i_layer, n_layer))):
            new = "Q4_K"
        elif ftype == "q3_k_l":
            new = "Q4_K" if arch == _FALCON else "Q5_K"
        elif ftype == "q4_k_m":
            if arch == _FALCON:
                new = ("Q6_K" if i_layer < n_layer // 16
                       else "Q5_K" if _use_more_bits(i_layer, n_layer) else "Q4_K")
            elif _use_more_bits(i_layer, n_layer):
                new = "Q6_K"
        elif i_layer < n_layer // 8 and ftype in ("iq4_nl", "iq4_xs") and not qs.has_imatrix:
            new = "Q5_K"
        elif ftype == "q5_k_m" and _use_more_bits(i_layer, n_layer):
            new = "Q6_K"
        elif ftype == "q4_k_s" and arch != _FALCON and i_layer < n_layer // 8:
            new = "Q5_K"
        elif ftype in ("q4_0", "q5_0") and qs.has_imatrix and i_layer < n_layer // 8:
            new = "Q4_1" if ftype == "q4_0" else "Q5_1"
        qs.i_ffn_down += 1
    elif cat == "ATTENTION_OUTPUT":                                                # lines 671-690
        if arch != _FALCON:
            if m.n_expert == 8:
                if ftype in ("q2_k", "iq3_xs", "iq3_xxs", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m",
                             "iq3_s", "iq3_m", "iq4_xs"):
                    new = "Q5_K"
            else:
                new = {"q2_k": "Q3_K", "iq3_xxs": "IQ3_S", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K",
                       "iq3_m": "Q4_K"}.get(ftype, new)
        elif ftype == "q3_k_l":
            new = "Q4_K"
    elif cat == "ATTENTION_QKV":                                                   # lines 691-697
        # (unreachable: attn_qkv is attn_v-like, taken above; kept as llama.cpp has it)
        if ftype in ("q3_k_m", "q3_k_l", "iq3_m"):
            new = "Q4_K"
        elif ftype == "q4_k_m":
            new = "Q5_K"
        elif ftype == "q5_k_m":
            new = "Q6_K"
    elif cat == "FFN_GATE":                                                        # lines 698-705
        i_layer, n_layer = layer_info(qs.i_ffn_gate, qs.n_ffn_gate)
        if ftype == "iq3_xs" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new = "IQ3_XXS"
        qs.i_ffn_gate += 1
    elif cat == "FFN_UP":                                                          # lines 706-713
        i_layer, n_layer = layer_info(qs.i_ffn_up, qs.n_ffn_up)
        if ftype == "iq3_xs" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new = "IQ3_XXS"
        qs.i_ffn_up += 1
    return new


def _fallback(ne0: int, new: str, block) -> tuple[str, bool]:
    """tensor_type_fallback (lines 390-443): (type, whether it fell back)."""
    if ne0 % block(new) == 0:
        return new, False
    ret = FALLBACK.get(new)
    if ret is None:
        if block(new) > 32:
            raise ValueError(f"no tensor type fallback is defined for type {new}")
        ret = new
    if ne0 % block(ret):
        ret = "F16"
    return ret, True


@dataclass(frozen=True)
class TensorType:
    name: str
    ggml_type: str
    quantize: bool               # allowed to be quantized (else it keeps its source type)
    fell_back: bool              # the row was not whole blocks of the mixture's type
    needs_imatrix: bool          # tensor_requires_imatrix


def tensor_types(tensors: list, ftype: str, model: MixModel, *, has_imatrix: bool = False, block=None) -> dict:
    """``tensors``: ``(GGUF name, numpy-order shape, source ggml type)`` for every tensor of the
    file.  Returns name -> :class:`TensorType`, as ``llama_model_quantize`` decides them
    (default parameters: no overrides, not pure, output quantized) for file type ``ftype``.
    ``block``: ggml block size by type name (default: :func:`~ckpt_surgeon.formats.quant.ggml_types.block_size`)."""
    if block is None:
        from ..formats.quant.ggml_types import block_size as block
    default = FTYPES[ftype][1]
    ordered = sorted(tensors, key=lambda t: _weights_order(t[0]))
    qs = _State([t[0] for t in ordered], model, has_imatrix)
    out = {}
    for name, shape, src_type in ordered:
        if not allows_quantization(name, shape):
            out[name] = TensorType(name, src_type, False, False, False)
            continue
        ne0 = shape[-1]
        new = _impl(qs, model, default, name, ne0, ftype, _category(name), block)
        new, fell = _fallback(ne0, new, block)
        needs = (name not in _TOKEN_EMBD and name != "output.weight"
                 and (new in _IMATRIX_TYPES or (new == "Q2_K" and ftype == "q2_k_s")))
        out[name] = TensorType(name, new, True, fell, needs)
    return out
