"""Float64 probes: facts about an attention block that only a forward pass can establish.

A shrunken random instance of the checkpoint's own transformers class (same config, fewer
layers / heads / features, same head_dim so within-head dimensions map one to one) is run in
float64 on random token ids, biases drawn with std 0.5.  ``r = max|logits' - logits| /
max|logits|`` compares a modified instance with the original:

* **exact key bias**: zeroing every key-bias row of a group (every block of it at once) leaves
  ``r < INVARIANT_TOL``.  A *control* first checks the probe can see the group at all: a unit-scale
  perturbation of its ``W_k`` must move the logits by more than ``SENSITIVE_TOL`` (else invariance would be
  vacuous and nothing is claimed).
* **pass-through dims** (partial rotary): when the whole bias is not redundant, each
  dimension of kv head 0 is removed alone; the invariant ones, repeated in every kv head, are
  then removed together in every block and must leave ``r < INVARIANT_TOL``.
* **fused layout**: with the fused weight and bias of one block zeroed, q = k = const and
  v = 0, so the attention output is 0 whatever the softmax does; setting bias row i to 1 moves
  the logits exactly when i is a value row.  The layout (``concat`` / ``per_head`` /
  ``grouped``, :mod:`ckpt_surgeon.arch.layouts`) whose value rows are those rows is taken; any
  exact key claim made with it is then checked by the removal probe above.
* **gated query** (a q projection of ``2 x heads x head_dim`` rows, query + output gate): with
  the rows a candidate layout calls the query zeroed (weights and bias), q = 0 after any q-norm
  and rotary, every logit is 0 and the attention is uniform, so perturbing ``W_k`` must leave the
  logits invariant; zeroing gate rows instead leaves the keys visible.  The candidate
  (:data:`~ckpt_surgeon.arch.layouts.GATE_LAYOUTS`) that passes, and only that one, is taken;
  none or several: ``unknown`` (the analysis then reads no query vectors).
* **value-bias fold**: ``b_o += W_o b_v`` (GQA-expanded, computed through the output module
  itself so its weight orientation does not matter) and ``b_v = 0`` in every block of the group
  must leave ``r < INVARIANT_TOL``.

Why these tolerances: float64 rounding through a few tiny layers, a softmax and a shifted
logit row leaves relative differences of ~1e-15..1e-13; a real dependence on a bias of std 0.5
moves the logits by ~1e-2.  ``INVARIANT_TOL = 1e-11`` sits far from both.
"""
from __future__ import annotations

import contextlib
import re
import types

import numpy as np

from .modtree import TOWER_PATH, MHA_IN_PROJ, Block, Fact, GroupFacts, module_path, read_blocks
from ..layouts import GATE_LAYOUTS, LAYOUTS, query_row_index, qkv_row_index
# inputs of a forward pass and the float64 guards (re-exported: tests and fixtures import them from here)
from .feeds import MAX_TOWER_TOKENS, SEQ_LEN, model_inputs, tower_input, tower_outputs  # noqa: F401
from .float64 import float64_softmax

INVARIANT_TOL = 1e-11
SENSITIVE_TOL = 1e-7
PROBE_MAX_PARAMS = 20_000_000    # float64: 160 MB; a probe instance is a few 100k parameters
_BIAS_STD = 0.5
_LAYER_PATH = re.compile(r"^(.*?\.\d+)\.(.+)$")      # (layer module, block path within it)
_MIN_INIT = 1e-4      # initializer_range below this is raised to 0.02 in a shrunken config (see shrink_config)

_LAYER_KEYS = re.compile(r"^(num_hidden_layers|n_layer|num_layers|n_layers|encoder_layers|decoder_layers|"
                         r"num_decoder_layers|num_encoder_layers|depth|num_blocks)$")
_HEAD_KEYS = re.compile(r"^(num_attention_heads|n_head|n_heads|num_heads|encoder_attention_heads|"
                        r"decoder_attention_heads|attention_heads)$")
_KV_KEYS = re.compile(r"^(num_key_value_heads|num_kv_heads|n_head_kv|multi_query_group_num)$")
_HIDDEN_KEYS = re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|dim|emb_dim|lru_width)$")
_FF_KEYS = re.compile(r"(intermediate_size|ffn_dim|^n_inner$|^d_ff$|ffn_hidden_size|intermediate_dim|^d_inner$|"
                      r"^hidden_dim$)")
# MLA (DeepSeek-V2/V3) latent and per-part head sizes
_MLA_KEYS = {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
             "index_head_dim": 16, "index_n_heads": 2}
_SSM_HEAD_DIM = re.compile(r"^(mamba_d_head|mamba_head_dim|ssm_head_dim|mamba_headdim)$")
_SSM_HEADS = re.compile(r"^(mamba_n_heads|mamba_num_heads|ssm_num_heads|n_mamba_heads)$")
_SSM_STATE = re.compile(r"^(mamba_d_state|ssm_state_size|state_size|d_state)$")
# linear-attention mixers (Qwen3-Next gated delta rule, Kimi-Linear, OLMo-hybrid): per-head sizes and head
# counts of the linear part; value heads stay a multiple of key heads
_LINEAR_DIM = re.compile(r"^(linear_key_head_dim|linear_value_head_dim|linear_head_dim)$")
_LINEAR_HEADS = ("linear_num_key_heads", "linear_num_value_heads")
# sub-configs of a composite model that hold the language model (shrunk like the top level, with
# their own head counts); every other ``*_config`` (vision, audio, VQ ...) keeps at most 2 layers
_TEXT_SUB = re.compile(r"^(text_config|llm_config|language_config|decoder_config|text_encoder_config)$")
_EXPERT_KEYS = re.compile(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts)$")
# head counts a modeling file needs a multiple of: modeling_codegen.py CodeGenAttention splits the fused
# qkv into ``mp_num = 4`` (hard-coded) groups of n_head // 4 heads
_MIN_HEADS = {"codegen": 4}
_TOPK_KEYS = re.compile(r"^(num_experts_per_tok|moe_topk|num_selected_experts|moe_k|top_k|num_experts_per_token)$")


def shrink_candidates(cfg: dict, *, layers: int, heads: tuple, head_dim: int | None = None,
                      vocab: int | None = None) -> list[dict]:
    """Smaller configs, most aggressive first: some architectures tie sizes together (Bamba /
    Mamba heads x head size = expand x hidden), so the caller takes the first that builds."""
    first = shrink_config(cfg, layers=layers, heads=heads, head_dim=head_dim, vocab=vocab)
    out = [first, shrink_config(cfg, layers=layers, heads=heads, head_dim=head_dim, vocab=vocab, ff=None)]
    kinds = _every_kind(cfg, first)
    if kinds is not None:
        out.append(kinds)
    return out + [shrink_config(cfg, layers=layers, heads=None, vocab=vocab, ff=None)]


def _every_kind(cfg: dict, small: dict) -> dict | None:
    """``small`` with ``layer_types`` ending in the kinds its cut lost (NeoMME's config requires a
    full_attention layer; the first layers are all sliding), or None when nothing was lost."""
    old, new = cfg.get("layer_types"), small.get("layer_types")
    if not (isinstance(old, list) and isinstance(new, list)) or old == new or not new:
        return None
    lost = [t for t in dict.fromkeys(old) if t not in new]
    if not lost or len(lost) >= len(new):
        return None
    return dict(small, layer_types=new[: len(new) - len(lost)] + lost)


def shrink_config(cfg: dict, *, layers: int, heads: tuple | None, head_dim: int | None = None,
                  vocab: int | None = None, ff: int | None = 32) -> dict:
    """A smaller config of the same architecture (plain dict -> dict; nothing else changes).

    ``heads`` = (H, kv) of the original; the copy keeps up to 2 kv heads and 2 query heads per
    kv head (None: heads and hidden size unchanged).  ``head_dim`` None keeps the original
    per-head size; ``ff`` None keeps the feed-forward sizes.  Lists as long as the layer
    count (``layer_types`` ...) are cut to ``layers``; token ids beyond ``vocab`` are clamped.
    """
    out = dict(cfg)
    if isinstance(cfg.get("initializer_range"), float) and 0 < cfg["initializer_range"] < _MIN_INIT:
        # BLIP / BLIP-2 / SAM / Pix2Struct vision configs init weights with std 1e-10 (a trained checkpoint never has
        # them): a random instance's tower would pass its input through unchanged and every probe control would fail
        out["initializer_range"] = 0.02
    size, patch = cfg.get("image_size"), cfg.get("patch_size")
    if type(size) is int and type(patch) is int and patch > 0 and (size // patch) ** 2 > MAX_TOWER_TOKENS:
        # a vision tower of more patches than a float64 probe runs alone (SAM's 1024 / 16 = 64 x 64): 16 x 16
        # patches, its position table sized from the config likewise (what an attention block computes does
        # not depend on how many patches it sees)
        out["image_size"] = 16 * patch
    old_layers = next((v for k, v in cfg.items() if _LAYER_KEYS.match(k) and isinstance(v, int)), None)
    sub_layers = layers
    # configuration_dory.py to_dict(): every decoder layer saved as two layer_types entries (attention, "mlp")
    # and every layer count doubled (the config halves them back): ``layers`` counts decoder layers
    per = 2 if isinstance(cfg.get("layer_types"), list) and "mlp" in cfg["layer_types"] else 1
    sections = _sections(cfg, old_layers)
    layers = max(layers, len(sections)) * per      # one layer per section at least
    h2, kv2 = _shrunk_heads(cfg, heads)
    hidden = next((v for k, v in cfg.items() if _HIDDEN_KEYS.match(k) and isinstance(v, int)), None)
    old_hd = _head_size(cfg, hidden, heads[0] if heads else 0)
    hd = head_dim if head_dim is not None else old_hd
    _shrink_top_level(cfg, out, old_layers, layers=layers, heads=heads, h2=h2, kv2=kv2, hd=hd, ff=ff)
    if heads:
        _follow_head_size(cfg, out, old_hd, hd)
    if heads and hidden:
        _follow_hidden(cfg, out, hidden, h2)
    if heads:
        _prefixed_heads(cfg, out, hd, head_dim)
        _linear_heads(cfg, out)
    _shrink_sub_configs(cfg, out, sub_layers, heads, head_dim, vocab, ff)
    if isinstance(cfg.get("per_layer_config"), dict):
        out["per_layer_config"] = _per_layer(cfg["per_layer_config"], sub_layers, heads, head_dim, vocab, ff,
                                             (old_hd, hd))
    _split_sections(cfg, out, sections, per)
    _shrink_vocab(cfg, out, vocab)
    return out


def _shrunk_heads(cfg: dict, heads: tuple | None) -> tuple[int, int]:
    """(query heads, kv heads) of the copy: up to 2 kv heads and 2 query heads per kv head, or the
    multiple a modeling file needs (:data:`_MIN_HEADS`)."""
    h, kv = heads or (0, 0)
    kv2 = max(1, min(kv, 2))
    h2 = kv2 * max(1, min(h // max(kv, 1), 2))
    min_h = _MIN_HEADS.get(cfg.get("model_type"), 0)
    if heads and h2 < min_h <= h and h % min_h == 0:
        h2 = min_h
        kv2 = h2 if kv == h else kv2
    return h2, kv2


def _head_size(cfg: dict, hidden: int | None, h: int) -> int | None:
    """The original per-head size: a config key that says it, else hidden / heads."""
    old_hd = next((cfg[k] for k in ("head_dim", "d_head", "attention_head_size") if type(cfg.get(k)) is int), None)
    if old_hd is None and hidden and h:
        old_hd = hidden // h
    return old_hd


def _shrink_top_level(cfg: dict, out: dict, old_layers: int | None, *, layers: int, heads, h2: int, kv2: int,
                      hd: int | None, ff: int | None) -> None:
    """Every top-level int shrunk (:func:`_shrunk_int`), and every per-layer list cut to ``layers``."""
    for k, v in cfg.items():
        if not isinstance(v, int) or isinstance(v, bool):
            if isinstance(v, list) and old_layers and len(v) == old_layers and k != "architectures":
                out[k] = v[:layers]
                if ff and _FF_KEYS.search(k) and all(type(x) is int for x in v):   # per-layer widths (Gemma-3n)
                    out[k] = [ff] * len(out[k])
            continue
        new = _shrunk_int(cfg, k, v, layers=layers, heads=heads, h2=h2, kv2=kv2, hd=hd, ff=ff)
        if new is not None:
            out[k] = new


def _follow_head_size(cfg: dict, out: dict, old_hd: int | None, hd: int | None) -> None:
    """The keys that restate the per-head size (head_dim, d_head, a partial rotary_dim, MLA's parts,
    multimodal rotary sections) follow the new one."""
    if "head_dim" in cfg and hd:
        out["head_dim"] = hd
    for k in ("d_head", "attention_head_size"):     # XLNet (d_head = d_model // n_head, checked), Reformer
        if type(cfg.get(k)) is int and hd:
            out[k] = hd
    if hd and old_hd and isinstance(cfg.get("rotary_dim"), int) and cfg["rotary_dim"] < old_hd:
        # partial rotary given in dims (GPT-J, CodeGen: the first rotary_dim dims of each head rotate): the
        # same fraction of the new head, even, at least 2
        out["rotary_dim"] = max(2, cfg["rotary_dim"] * hd // old_hd // 2 * 2)
    if isinstance(out.get("qk_rope_head_dim"), int) and "head_dim" in cfg:
        out["head_dim"] = out["qk_rope_head_dim"]       # MLA configs: head_dim is the rotary part
    if type(cfg.get("qk_head_dim")) is int and all(type(out.get(k)) is int for k in (
            "qk_nope_head_dim", "qk_rope_head_dim")):      # MLA: the derived query/key head size, saved by to_dict()
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    if hd and old_hd and hd != old_hd:
        _mrope_sections(cfg, out, hd)


def _linear_heads(cfg: dict, out: dict) -> None:
    """Linear-attention mixers: up to 2 key heads, value heads a multiple of them, per-head sizes <= 16."""
    if all(isinstance(cfg.get(k), int) for k in _LINEAR_HEADS):
        nk = cfg[_LINEAR_HEADS[0]]
        out[_LINEAR_HEADS[0]] = min(nk, 2)
        out[_LINEAR_HEADS[1]] = min(nk, 2) * max(1, min(cfg[_LINEAR_HEADS[1]] // max(nk, 1), 2))
    for k, v in cfg.items():
        if _LINEAR_DIM.match(k) and isinstance(v, int):
            out[k] = min(v, 16)


def _shrink_sub_configs(cfg: dict, out: dict, layers: int, heads, head_dim, vocab, ff) -> None:
    """Sub-configs (``*_config``) shrunk like the top level (the language model's with ``layers``,
    the others with at most 2); then BLT's ``hidden_size_<x>`` keys follow ``<x>_config``'s hidden size."""
    for k, v in cfg.items():
        if isinstance(v, dict) and k.endswith("_config") and _has_layers_or_heads(v):
            text = bool(_TEXT_SUB.match(k))
            out[k] = shrink_config(v, layers=layers if text else min(layers, 2),
                                   heads=config_heads(v) if heads else None, head_dim=head_dim, vocab=vocab, ff=ff)
        elif isinstance(v, dict) and k.endswith("_config") and ff:
            # a feed-forward sub-config without layers or heads (DBRX ffn_config: ffn_hidden_size per expert)
            out[k] = {kk: ff if _FF_KEYS.search(kk) and type(vv) is int else vv for kk, vv in v.items()}
    for k, v in out.items():      # BLT: encoder/decoder hidden_size_global = global_config's hidden_size
        if isinstance(v, dict) and k.endswith("_config") and k in cfg and v is not cfg[k]:
            for kk in list(v):
                other = out.get(kk[len("hidden_size_"):] + "_config") if kk.startswith("hidden_size_") else None
                if isinstance(other, dict) and type(other.get("hidden_size")) is int and type(v[kk]) is int:
                    v[kk] = other["hidden_size"]


def _mrope_sections(cfg: dict, out: dict, hd: int) -> None:
    """Multimodal rotary (Qwen2-VL ``mrope_section``: the rotary frequencies, head_dim / 2 of them, split into
    temporal / height / width sections; modeling_qwen2_vl splits by them): the same proportions of the new
    head, each section at least 1, summing to hd / 2."""
    for k in ("rope_parameters", "rope_scaling"):
        rp = cfg.get(k)
        sec = rp.get("mrope_section") if isinstance(rp, dict) else None
        if not (isinstance(sec, list) and sec and all(type(x) is int and x > 0 for x in sec)):
            continue
        want, total = hd // 2, sum(sec)
        if want < len(sec):
            continue
        new = [max(1, x * want // total) for x in sec]
        new[-1] += want - sum(new)
        if new[-1] >= 1:
            out[k] = dict(rp, mrope_section=new)


def _per_layer(plc: dict, layers: int, heads, head_dim, vocab, ff, hds: tuple) -> dict:
    """A ``per_layer_config`` (Gemma-4, dots3: layer index -> that layer's overrides, the config checks
    the indices exist): the layers kept, their overrides shrunk like the config (own head counts; a head
    size override keeps its ratio to the main one, so those layers still differ: Gemma-4's full layers)."""
    old_hd, hd = hds
    out = {}
    for key, sub in plc.items():
        try:
            if int(key) >= layers:
                continue
        except (TypeError, ValueError):
            pass
        if isinstance(sub, dict):
            own = config_heads(sub) if any(_HEAD_KEYS.match(k) for k in sub) else heads
            small = shrink_config(sub, layers=layers, heads=own if heads else None, head_dim=head_dim, vocab=vocab,
                                  ff=ff)
            if heads and type(sub.get("head_dim")) is int and old_hd and hd:
                small["head_dim"] = max(2, sub["head_dim"] * hd // old_hd)
            sub = small
        out[key] = sub
    return out


def _sections(cfg: dict, old_layers) -> list:
    """Keys of consecutive sections' layer counts that add up to the layer count (Dory: n_input_layers +
    n_recurrent_layers + n_output_layers = num_hidden_layers, checked by its config), else []."""
    parts = [k for k, v in cfg.items() if type(v) is int and k.endswith("_layers") and not _LAYER_KEYS.match(k)]
    if len(parts) < 2 or not old_layers or sum(cfg[k] for k in parts) != old_layers:
        return []
    return parts


def _split_sections(cfg: dict, out: dict, parts: list, per: int) -> None:
    """The sections re-split over the new layer count: one layer (``per`` entries) each, the rest to the
    largest section."""
    new_total = next((out[k] for k, v in cfg.items() if _LAYER_KEYS.match(k) and isinstance(v, int)), None)
    if not parts or new_total == sum(cfg[k] for k in parts):
        return
    for k in parts:
        out[k] = per
    out[max(parts, key=lambda k: cfg[k])] += (new_total // per - len(parts)) * per


def _shrunk_int(cfg: dict, k: str, v: int, *, layers: int, heads, h2: int, kv2: int, hd, ff) -> int | None:
    """The smaller value of the integer config key ``k`` (None: it stays)."""
    if _LAYER_KEYS.match(k):
        return min(v, layers)
    if k == "insert_layer_id" and layers > 0:
        # MiniCPM-V's merger runs after this vision layer (the top-level key overrides the vision config's): kept
        # inside the vision stack, which a shrink cuts to 2 layers
        return min(v, min(layers, 2) - 1)
    if heads and _HEAD_KEYS.match(k):
        return h2
    if heads and _KV_KEYS.match(k):
        return kv2
    if heads and _HIDDEN_KEYS.match(k) and hd:
        return h2 * hd
    if ff and _FF_KEYS.search(k):
        return ff
    if heads and _SSM_HEAD_DIM.match(k):
        return 16
    if heads and _SSM_HEADS.match(k) and hd:
        expand = next((cfg[x] for x in ("mamba_expand", "expand", "ssm_expand") if isinstance(cfg.get(x), int)), 2)
        return max(1, expand * h2 * hd // 16)      # Mamba-2: heads x head size = expand x hidden
    if _SSM_STATE.match(k):
        return min(v, 16)
    if heads and k in _MLA_KEYS:
        return min(v, _MLA_KEYS[k])
    if _EXPERT_KEYS.match(k):
        return min(v, 4)
    if _TOPK_KEYS.match(k):
        return min(v, 2)
    if k in ("n_group", "num_expert_group"):     # group-limited routing: 2 groups of 2 of the 4 experts
        return min(v, 2)
    if k == "topk_group":
        return min(v, 1)
    return None


def _follow_hidden(cfg: dict, out: dict, hidden: int, h2: int) -> None:
    """Widths defined as multiples of the hidden size follow its new value in ``out``."""
    new_hidden = next((v for k, v in out.items() if _HIDDEN_KEYS.match(k) and isinstance(v, int)), None)
    if new_hidden != hidden and isinstance(new_hidden, int):
        # a factorised embedding width (ALBERT, ELECTRA, MobileBERT, SqueezeBERT): the same fraction of the
        # new hidden size (MobileBERT's LM head is hidden - embedding_size wide; SqueezeBERT needs them equal)
        if isinstance(cfg.get("embedding_size"), int) and 0 < cfg["embedding_size"] <= hidden:
            out["embedding_size"] = max(min(8, new_hidden), cfg["embedding_size"] * new_hidden // hidden)
        if cfg.get("embedding_dim") == hidden:     # xLSTM: embedding_dim is the model width too
            out["embedding_dim"] = new_hidden
        for k, v in cfg.items():   # Phi-4-multimodal's audio encoder: its depthwise conv's output channels are the
            if k.endswith("_out_channel") and v == hidden:      # width the attention reads (1024 = hidden_size)
                out[k] = new_hidden
        axial = cfg.get("axial_pos_embds_dim")      # Reformer: the axial position embedding parts add up to hidden
        if isinstance(axial, list) and all(type(x) is int for x in axial) and sum(axial) == hidden:
            parts = [max(1, x * new_hidden // hidden) for x in axial]
            out["axial_pos_embds_dim"] = parts[:-1] + [new_hidden - sum(parts[:-1])]
        for k, v in cfg.items():     # side embeddings (RoCBert shape / pronunciation, LUKE entities, Qwen4 per-layer)
            if (k.endswith("_embed_dim") or k.endswith("_emb_size")) and type(v) is int and v > new_hidden:
                out[k] = max(min(8, new_hidden), v * new_hidden // hidden)
        # MobileBERT: the attention runs on the bottleneck (configuration_mobilebert: true_hidden_size =
        # intra_bottleneck_size when use_bottleneck), so it holds the heads
        if cfg.get("use_bottleneck") and isinstance(cfg.get("intra_bottleneck_size"), int):
            out["intra_bottleneck_size"] = new_hidden      # h2 heads x the new head size, as hidden
        if isinstance(cfg.get("true_hidden_size"), int):   # MobileBERT's derived width, saved in to_dict()
            out["true_hidden_size"] = new_hidden
        expand = next((cfg[x] for x in ("mamba_expand", "expand", "ssm_expand") if isinstance(cfg.get(x), int)), 2)
        if (all(type(cfg.get(k)) is int for k in ("num_heads", "head_dim", "expand")) and type(out.get("head_dim")) is int
                and cfg["num_heads"] * cfg["head_dim"] == cfg["expand"] * hidden):
            # Mamba-2: SSM heads x head size = expand x hidden (checked by Mamba2Config); groups divide the heads
            out["num_heads"] = max(1, expand * new_hidden // out["head_dim"])
            if type(cfg.get("n_groups")) is int and out["num_heads"] % cfg["n_groups"]:
                out["n_groups"] = 1
        if isinstance(cfg.get("mamba_d_ssm"), int):      # Falcon-H1: the SSM width is expand x hidden
            out["mamba_d_ssm"] = expand * new_hidden
        if isinstance(cfg.get("attention_hidden_size"), int):   # Zamba / RWKV: a multiple of hidden
            out["attention_hidden_size"] = max(1, cfg["attention_hidden_size"] * new_hidden // hidden)
            if isinstance(cfg.get("attention_head_dim"), int):
                out["attention_head_dim"] = out["attention_hidden_size"] // h2


def _prefixed_heads(cfg: dict, out: dict, hd, head_dim) -> None:
    """Head counts of a second attention kind under a prefix (Inkling-2 ``swa_num_attention_heads``,
    ``swa_num_key_value_heads``, ``swa_head_dim``: the sliding-window layers' own heads) shrunk like the
    main ones: up to 2 kv heads x 2 query heads per kv head, the same head size."""
    for hk in [k for k in cfg if k.endswith("_num_attention_heads") and k != "num_attention_heads"]:
        pre = hk[: -len("num_attention_heads")]
        h, kv = cfg[hk], cfg.get(pre + "num_key_value_heads")
        if type(h) is not int or (kv is not None and type(kv) is not int):
            continue
        kv = kv or h
        kv2 = max(1, min(kv, 2))
        out[hk] = kv2 * max(1, min(h // max(kv, 1), 2))
        if pre + "num_key_value_heads" in cfg:
            out[pre + "num_key_value_heads"] = kv2
        if type(cfg.get(pre + "head_dim")) is int and head_dim is not None and hd:
            out[pre + "head_dim"] = hd


def _shrink_vocab(cfg: dict, out: dict, vocab: int | None) -> None:
    """The vocabulary cut to ``vocab``; token ids clamped to index the (possibly smaller) embedding."""
    if vocab is not None and isinstance(cfg.get("vocab_size"), int) and cfg["vocab_size"] > vocab:
        out["vocab_size"] = vocab
    for k, v in cfg.items():      # other vocabularies (Inkling-2's unpadded LM head, LUKE entities, Gemma per-layer)
        if (vocab is not None and ("vocab_size" in k or k.endswith("_vocab")) and k != "vocab_size" and type(v) is int
                and v > vocab):       # (BLT: encoder_hash_byte_group_vocab)
            out[k] = vocab
    n_vocab = out.get("vocab_size")
    if isinstance(n_vocab, int) and n_vocab > 0:
        for k, v in cfg.items():      # token ids must index the (possibly smaller) embedding
            if k.endswith("token_id") and isinstance(v, int) and v >= n_vocab:
                out[k] = n_vocab - 1


def _has_layers_or_heads(d: dict) -> bool:
    return any(_LAYER_KEYS.match(k) or _HEAD_KEYS.match(k) for k in d)


def config_heads(cfg: dict) -> tuple:
    """(H, kv) of a config dict (defaults: 4 heads, kv = H)."""
    def first(rx):
        return next((v for k, v in cfg.items() if rx.match(k) and isinstance(v, int) and not isinstance(v, bool)), None)
    h = first(_HEAD_KEYS) or 4
    return h, first(_KV_KEYS) or h


def layers_needed(blocks, per_group: int = 1) -> int:
    """Enough layers that the first ``per_group`` blocks of every group still exist."""
    from .modtree import _LAYER
    idx: dict = {}
    for b in blocks:
        m = _LAYER.match(b.path)
        if m and b.kind != "none":
            idx.setdefault(b.group, set()).add(int(m.group(2)))
    need = 2
    for found in idx.values():
        need = max(need, sorted(found)[:per_group][-1] + 1)
    return need


def meta_params(klass, conf) -> int:
    """Parameter count of ``klass(conf)`` without allocating it (meta device)."""
    import torch

    from ...quiet import quiet_transformers
    with quiet_transformers(), torch.device("meta"):
        return sum(p.numel() for p in klass(conf).parameters())


def random_instance(cfg: dict, klass, *, seed: int = 0, max_params: int = PROBE_MAX_PARAMS):
    """(config, float64 eval-mode model) of ``klass`` with seeded init and every 1-D ``*.bias``
    drawn with std 0.5 (transformers' init zeroes biases, which would make any bias claim vacuous)."""
    import torch

    from ...quiet import quiet_transformers
    from .modtree import config_object
    conf = config_object(cfg)
    n = meta_params(klass, conf)
    if n > max_params:
        raise ValueError(f"the shrunken instance would still have {n:,} parameters (> {max_params:,})")
    torch.manual_seed(seed)
    with quiet_transformers():
        model = klass(conf)
    model = model.to(torch.float64).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * _BIAS_STD)
        # convolutions get variance-preserving weights (std 1 / sqrt(fan-in), as trained front ends roughly have):
        # at transformers' std 0.02 each conv shrinks its input ~20x, a conformer's subsampling stack then passes
        # the biases alone and every audio frame reaches attention as the same vector (nothing to probe)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.conv._ConvNd):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g, dtype=torch.float64) / fan_in ** 0.5)
    return conf, model


def first_output(out):
    """Logits when the model has a head, else its first output tensor."""
    t = getattr(out, "logits", None)
    return out[0] if t is None else t


class _Instance:
    """A float64 random instance with a baseline forward pass and cheap trial edits."""

    def __init__(self, cfg: dict, klass, seed: int = 0):
        import torch
        self.torch = torch
        self.conf, self.model = random_instance(cfg, klass, seed=seed, max_params=PROBE_MAX_PARAMS)
        self.root = self.model       # module paths are relative to it; ``model`` is what ``run`` calls
        self.outputs = first_output
        self.inputs = model_inputs(self.conf, seed, self.model)
        self.base = self.run()
        self.scale = float(self.base.abs().max()) or 1.0

    def run(self):
        with self.torch.no_grad(), float64_softmax():
            out = self.model(**self.inputs)
        return self.outputs(out).detach().clone()

    def rel(self) -> float:
        return float((self.run() - self.base).abs().max()) / self.scale

    def module(self, b: Block, role: str):
        rel = b.role(role)
        if rel == MHA_IN_PROJ:      # nn.MultiheadAttention: its fused projection's parameters, as a module has them
            mha = self.root.get_submodule(b.path)
            return types.SimpleNamespace(weight=mha.in_proj_weight, bias=mha.in_proj_bias)
        return self.root.get_submodule(module_path(b.path, rel))

    def tower(self, group: str) -> "_Instance | None":
        """The same instance, run through the vision tower holding ``group`` on random pixels
        (a token-id forward never runs it), or None (see :func:`tower_input`)."""
        found = tower_input(self.root, group)
        return None if found is None else self.view(found[0], found[1], tower_outputs)

    def view(self, model, inputs: dict, outputs) -> "_Instance":
        """The same instance (module paths relative to the same root), run as ``model(**inputs)`` with
        ``outputs`` taken from its result, its baseline computed."""
        view = object.__new__(_Instance)
        view.torch, view.root = self.torch, self.root
        view.model, view.inputs, view.outputs = model, inputs, outputs
        view.conf = getattr(model, "config", None)
        view.base = view.run()
        view.scale = float(view.base.abs().max()) or 1.0
        return view

    @contextlib.contextmanager
    def patched(self, changes):
        """Inside: ``[(tensor, new value)]`` applied; restored on exit."""
        saved = [(t, t.detach().clone()) for t, _ in changes]
        try:
            with self.torch.no_grad():
                for t, v in changes:
                    t.copy_(v)
            yield
        finally:
            with self.torch.no_grad():
                for t, v in saved:
                    t.copy_(v)

    def edit(self, changes) -> float:
        """Apply ``[(tensor, new value)]``, measure ``rel``, restore."""
        with self.patched(changes):
            return self.rel()


def _zero_rows(t, rows):
    v = t.detach().clone()
    v[list(rows)] = 0
    return v


def _fused_layout(inst: _Instance, b: Block) -> tuple[str | None, str]:
    """Layout of one fused block from its value rows (see the module docstring)."""
    torch = inst.torch
    mod = inst.module(b, "qkv")
    if mod.bias is None:
        return None, "the fused projection has no bias: its value rows cannot be probed"
    h, kv, d = b.heads
    zero_w, zero_b = torch.zeros_like(mod.weight), torch.zeros_like(mod.bias)
    with torch.no_grad():
        saved = mod.weight.detach().clone(), mod.bias.detach().clone()
        mod.weight.copy_(zero_w)
        mod.bias.copy_(zero_b)
        try:
            ref = inst.run()
            v_rows = []
            for i in range(mod.bias.shape[0]):
                mod.bias.zero_()
                mod.bias[i] = 1.0
                if float((inst.run() - ref).abs().max()) / inst.scale > SENSITIVE_TOL:
                    v_rows.append(i)
        finally:
            mod.weight.copy_(saved[0])
            mod.bias.copy_(saved[1])
    found = []
    for layout in LAYOUTS:
        try:
            idx = qkv_row_index(layout, h, kv, d)
        except ValueError:
            continue
        if sorted(idx[2].tolist()) == v_rows:
            found.append((layout, idx))
    if not found:
        return None, f"value rows {v_rows[:6]}... match no known fused layout"
    first = found[0]
    if any(not (np.array_equal(first[1][0], o[1][0]) and np.array_equal(first[1][1], o[1][1])) for o in found[1:]):
        return None, "value rows fit several layouts that order q and k differently"
    return first[0], f"value rows probed ({len(v_rows)} rows) fit the {first[0]!r} layout"


def _shaken(inst: _Instance, w, rows, conv: bool, gen):
    """``W_k`` with N(0, 1/fan_in) added to ``rows``: with transformers' small init the attention is
    nearly uniform and scaling W_k barely shows; a unit-scale perturbation of the keys does."""
    v = w.detach().clone()
    noise = inst.torch.randn(v.shape, generator=gen, dtype=v.dtype) / (v.shape[0] if conv else v.shape[1]) ** 0.5
    if conv:
        v[:, list(rows)] += noise[:, list(rows)]
    else:
        v[list(rows)] += noise[list(rows)]
    return v


def _gate_layout(inst: _Instance, b: Block) -> tuple[str | None, str]:
    """Which rows of a gated q projection are the query (see the module docstring)."""
    h, kv, d = b.heads
    q, k = inst.module(b, "q"), inst.module(b, "k")
    shake = [(k.weight, _shaken(inst, k.weight, range(kv * d), False, inst.torch.Generator().manual_seed(11)))]
    control = inst.edit(shake)
    if control <= SENSITIVE_TOL:
        return None, f"probe control: perturbing W_k moved the logits by only {control:.2g}; the query rows are unknown"
    passed, seen = [], []
    for layout in GATE_LAYOUTS:
        rows = query_row_index(layout, h, d)
        zero = [(t, _zero_rows(t, rows)) for t in (q.weight, q.bias) if t is not None]
        with inst.patched(zero):
            ref = inst.run()
            with inst.patched(shake):
                r = float((inst.run() - ref).abs().max()) / inst.scale
        seen.append(f"{layout}: {r:.2g}")
        if r < INVARIANT_TOL:
            passed.append(layout)
    if len(passed) != 1 and not (len(passed) == 2 and h == 1):     # one head: both layouts are the same rows
        return None, f"no single layout zeroes the whole query (W_k perturbation with those rows zeroed: {', '.join(seen)})"
    return passed[0], (f"with the {passed[0]!r} query rows zeroed the logits ignore W_k ({', '.join(seen)}; control "
                       f"{control:.2g}): those rows are the query, the others the output gate")


def _k_rows(b: Block, layout: str | None):
    h, kv, d = b.heads
    if b.role("k"):
        return np.arange(kv * d)
    if layout is None:
        return None
    return qkv_row_index(layout, h, kv, d)[1]


def _k_param(inst: _Instance, b: Block, which: str):
    mod = inst.module(b, "k" if b.role("k") else "qkv")
    return getattr(mod, which)


def _probe_k(inst, blocks, layout, pos, head_dim_kept) -> tuple[str, tuple, tuple, tuple]:
    """(class, reasons, pass dims, facts) of a group's key bias."""
    b0 = blocks[0]
    rows = [_k_rows(b, layout) for b in blocks]
    if rows[0] is None:
        return "unknown", ("fused layout not established: the key rows are unknown",), (), ()
    biases = [_k_param(inst, b, "bias") for b in blocks]
    if any(x is None for x in biases):
        return "unknown", ("no key bias in this configuration",), (), ()
    weights = [_k_param(inst, b, "weight") for b in blocks]
    conv = b0.conv1d

    gen = inst.torch.Generator().manual_seed(7)
    control = inst.edit([(w, _shaken(inst, w, r, conv, gen)) for w, r in zip(weights, rows)])
    if control <= SENSITIVE_TOL:
        return "invisible", (f"probe control: perturbing W_k moved the logits by only {control:.2g}; the probe cannot "
                             "see this attention, so nothing is claimed",), (), ()
    full = inst.edit([(t, _zero_rows(t, r)) for t, r in zip(biases, rows)])
    facts = [Fact("k_bias_removal", f"max relative logit change {full:.3g}", "probed",
                  f"every key-bias row of the group zeroed at once (control: perturbing W_k moves {control:.3g})")]
    if full < INVARIANT_TOL:
        return "exact", (f"probe: removing the whole key bias leaves the logits invariant (relative change {full:.2g}, "
                         "float64): q.b_k is constant over the keys",), (), tuple(facts)
    h, kv, d = b0.heads
    head0 = [d0 for d0 in range(d) if inst.edit([(biases[0], _zero_rows(biases[0], [rows[0][d0]]))]) < INVARIANT_TOL]
    reasons = []
    if b0.qk_norm:
        reasons.append("a norm follows the key projection (q/k-norm): the key bias passes through a nonlinearity")
    if b0.sinks:
        reasons.append("attention sinks: a constant logit shift changes the weight of the sink")
    if head0 and head_dim_kept:
        tail = list(range(head0[0], d)) == head0
        sel = [[r[g * d + x] for g in range(kv) for x in head0] for r in rows]
        joint = inst.edit([(t, _zero_rows(t, s)) for t, s in zip(biases, sel)])
        facts.append(Fact("k_pass_dims", f"{head0[0]}..{d - 1}" if tail else head0, "probed",
                          f"dims removed together in every kv head and block: relative change {joint:.3g}"))
        if joint < INVARIANT_TOL and tail:
            return "partial", (f"probe: within-head key dims {head0[0]}..{d - 1} pass through unrotated (removing them "
                               f"leaves the logits invariant, relative change {joint:.2g}); the other dims depend on "
                               "the distance",), tuple(head0), tuple(facts)
    if reasons:
        return "not-removable", tuple(reasons), (), tuple(facts)
    if pos == "rope":
        return "rope", ("probe: no key-bias dimension is removable without changing the logits, and the model "
                        "rotates q/k (rotary module): the bias term depends on the distance n - m",), (), tuple(facts)
    return "not-removable", (f"probe: removing the key bias changes the logits (relative {full:.2g}) although no "
                             "rotary module was found (norm, soft-capping or another nonlinearity after the "
                             "projection)",), (), tuple(facts)


def _probe_v(inst, blocks, layout) -> tuple[bool | None, Fact | None]:
    torch = inst.torch
    changes = []
    for b in blocks:
        h, kv, d = b.heads
        if not b.role("o"):
            return None, None
        o = inst.module(b, "o")
        if getattr(o, "bias", None) is None:
            return False, Fact("v_fold", False, "derived", "the output projection has no bias")
        if b.role("v"):
            vb, vrows = inst.module(b, "v").bias, np.arange(kv * d)
        else:
            if layout is None:
                return None, None
            vb, vrows = inst.module(b, "qkv").bias, qkv_row_index(layout, h, kv, d)[2]
        if vb is None:
            return None, None
        bv = vb.detach()[list(vrows)].reshape(kv, d)
        full = bv.repeat_interleave(h // kv, dim=0).reshape(1, h * d)      # query head h reads kv head h // group
        with torch.no_grad():
            y1, y0 = o(full), o(torch.zeros_like(full))
        if not (isinstance(y1, torch.Tensor) and isinstance(y0, torch.Tensor)):
            return None, Fact("v_fold", None, "derived", f"the output projection ({type(o).__name__}) is not a plain linear map")
        delta = (y1 - y0)[0]
        changes += [(o.bias, o.bias.detach() + delta), (vb, _zero_rows(vb, vrows))]
    # control: b_v alone zeroed must show, else invariance would be vacuous (a block the forward never runs)
    control = inst.edit(changes[1::2])
    if control <= SENSITIVE_TOL:
        return None, Fact("v_fold", None, "probed", f"probe control: zeroing b_v moved the logits by only {control:.2g}; "
                                                    "nothing is claimed")
    r = inst.edit(changes)
    ok = r < INVARIANT_TOL
    return ok, Fact("v_fold", ok, "probed", f"b_o += W_o b_v, b_v = 0 in every block: relative logit change {r:.3g}")


def _probe_group(inst, pblocks, g: str, k: str, pos: str, heads: tuple) -> GroupFacts:
    members = [b for b in pblocks if b.group == g and b.heads]
    if not members:
        return GroupFacts(g, k, "unknown", ("the shrunken probe instance has no block of this group",))
    facts, layout, gate = [], None, None
    if members[0].role("qkv"):
        layout, how = _fused_layout(inst, members[0])
        if layout is None and how.startswith("value rows []"):
            # no value row moves the output: this forward never runs the block (a vision tower's, on token
            # ids); said as invisible, so that the caller probes it where it runs (probe_groups)
            return GroupFacts(g, k, "invisible", ("probe: no value row of the fused projection moves the output: "
                                                  "this forward pass does not run the block",))
        facts.append(Fact("fused_layout", layout, "probed", how))
    if members[0].q_gate:
        gate, how = _gate_layout(inst, members[0])
        facts.append(Fact("q_gate_layout", gate, "probed", how))
        gate = gate or "unknown"
    kept = members[0].heads[2] == heads[2]
    cls, reasons, pass_dims, kf = _probe_k(inst, members, layout, pos, kept)
    vf, vfact = _probe_v(inst, members, layout)
    facts += list(kf) + ([vfact] if vfact else [])
    try:
        norm, how = norm_placement(inst, members[0])
    except Exception:   # noqa: BLE001 - a trace that cannot run claims no placement; the key-bias facts stand
        norm, how = None, ""
    if norm:
        facts.append(Fact("norm_placement", norm, "probed", how))
    return GroupFacts(g, k, cls, tuple(reasons), tuple(int(x) for x in pass_dims), layout, vf, tuple(facts), gate,
                      norm)


def norm_placement(inst, b: Block) -> tuple[str | None, str]:
    """("pre" | "post" | None, how) for block ``b``, traced in one forward pass of ``inst``: ``pre`` when the
    attention's input is the output of a norm of its own layer (x + attn(norm(x))), ``post`` when it is the
    layer's input and a norm of the layer runs after it (norm(x + attn(x))); None otherwise (a block outside a
    layer list, or a data flow neither describes)."""
    m = _LAYER_PATH.match(b.path)
    if not m:
        return None, ""
    layer_path, rel = m.group(1), m.group(2)
    layer, attn = inst.root.get_submodule(layer_path), inst.root.get_submodule(b.path)
    norms = [(n, mod) for n, mod in layer.named_modules() if "norm" in type(mod).__name__.lower()
             and not (n == rel or n.startswith(rel + "."))]
    if not norms:
        return None, ""
    seen: dict = {"norm_out": [], "order": []}

    def first_tensor(args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
        return x if isinstance(x, inst.torch.Tensor) else None

    def same(a, c):
        return a is not None and c is not None and (a is c or (a.data_ptr() == c.data_ptr() and a.shape == c.shape))

    # (hooks return None: a value returned would replace the module's inputs or output)
    def on_layer(mod, a, kw):
        seen.setdefault("layer_in", first_tensor(a, kw))

    def on_attn(mod, a, kw):
        seen.setdefault("attn_in", first_tensor(a, kw))
        seen["order"].append("attn")

    def on_norm(name):
        def hook(mod, a, out):
            seen["norm_out"].append(out if isinstance(out, inst.torch.Tensor) else None)
            seen["order"].append(name)
        return hook

    hooks = [layer.register_forward_pre_hook(on_layer, with_kwargs=True),
             attn.register_forward_pre_hook(on_attn, with_kwargs=True)]
    hooks += [mod.register_forward_hook(on_norm(name)) for name, mod in norms]
    try:
        inst.run()
    finally:
        for h in hooks:
            h.remove()
    x = seen.get("attn_in")
    if x is None or "attn" not in seen["order"]:
        return None, ""
    if any(same(x, o) for o in seen["norm_out"]):
        return "pre", "probe: the attention's input is the output of a norm of its layer (forward hooks)"
    after = seen["order"][seen["order"].index("attn") + 1:]
    if same(x, seen.get("layer_in")) and after:
        return "post", (f"probe: the attention reads the layer's input; {after[0]} runs after it (forward hooks)")
    return None, ""


def _seq2seq_class(model_type: str, klass):
    """The encoder-decoder class of the same model type (BART's cross-attention never runs in
    ``BartForCausalLM``: it is probed where it does), or None."""
    import transformers
    from transformers.models.auto import modeling_auto as ma
    name = ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    alt = getattr(transformers, name, None) if isinstance(name, str) else None
    return alt if alt is not None and alt is not klass else None


def probe_groups(cfg: dict, conf, klass, blocks, heads: tuple, pos: str) -> tuple:
    """GroupFacts for every group of ``blocks`` (the real model's), probed on a small instance."""
    groups: dict = {}
    for b in blocks:
        groups.setdefault(b.group, b.kind)
    out = []
    roleless = {b.group for b in blocks if b.kind != "none" and not b.roles}
    attn = {g: k for g, k in groups.items() if k != "none" and g not in roleless}
    for g, k in groups.items():
        if k == "none":
            out.append(GroupFacts(g, k, "none", ("no softmax attention in this layer",)))
        elif g in roleless:
            out.append(GroupFacts(g, k, "none", ("attention without q/k/v projections (MLA-style latent keys): no key "
                                                 "bias to analyse",)))
    if not attn:
        return tuple(out)
    # a latent-attention text stack has no readable heads: a tower beside it is probed with its own
    heads = heads or next((b.heads for b in blocks if b.heads and b.group in attn), ())
    if not heads:
        return tuple(out) + tuple(GroupFacts(g, k, "unknown", ("head counts could not be read",)) for g, k in attn.items())
    inst, pblocks, used, err = _small_instance(cfg, klass, blocks, heads)
    if inst is None:    # nothing is claimed, and the report says why
        return tuple(out) + tuple(GroupFacts(g, k, "unknown", (_failure(err),)) for g, k in attn.items())
    alt = None
    for g, k in attn.items():
        try:
            gf = _probe_group(inst, pblocks, g, k, pos, heads)
        except Exception as e:   # noqa: BLE001 - a probe that cannot run claims nothing (and says why)
            gf = GroupFacts(g, k, "unknown", (_failure(e).replace("built or run", "run on this block"),))
        if gf.k_class == "invisible" and k == "cross" and _seq2seq_class(conf.model_type, klass) is not None:
            try:
                if alt is None:
                    # a config saved by the decoder-only class says is_encoder_decoder=False
                    alt = _Instance(dict(used, is_encoder_decoder=True, is_decoder=False),
                                    _seq2seq_class(conf.model_type, klass))
                    alt_blocks, _ = read_blocks(alt.model, alt.conf)
                gf2 = _probe_group(alt, alt_blocks, g, k, pos, heads)
                if gf2.k_class != "invisible":
                    note = Fact("probe_class", type(alt.model).__name__, "derived",
                                f"{type(inst.model).__name__} never runs this block; probed where it runs")
                    gf = GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})
            except Exception as e:   # noqa: BLE001 - as above: the reason is reported, nothing claimed
                gf = GroupFacts(g, k, "unknown", (_failure(e),))
        if gf.k_class == "invisible" and k == "cross":
            gf = _probe_with_encoder_states(inst, pblocks, g, k, pos, heads, gf)
        if gf.k_class == "invisible":     # a tower, Q-Former or sub-encoder the whole forward never runs
            gf = _probe_through_tower(inst, pblocks, g, k, pos, heads, gf)
        if gf.k_class == "invisible":
            tower = (("the probe feeds token ids only: this block is part of a vision / audio tower that such a forward "
                      "pass never runs",) if TOWER_PATH.search(g) else ())
            gf = GroupFacts(**{**gf.__dict__, "k_class": "unknown", "reasons": tower + tuple(gf.reasons)})
        out.append(_with_tower_norm(inst, pblocks, gf))
    return tuple(out)


def _with_tower_norm(inst, pblocks, gf):
    """``gf`` with its norm placement traced through the tower run alone when the whole forward never ran the
    block and nothing else made the probe run it (a Whisper-style encoder without key biases)."""
    member = next((b for b in pblocks if b.group == gf.group and b.heads), None)
    if gf.norm is not None or member is None:
        return gf
    try:
        view = inst.tower(gf.group)
        norm, how = norm_placement(view, member) if view is not None else (None, "")
    except Exception:   # noqa: BLE001 - no placement claimed
        return gf
    if norm is None:
        return gf
    return GroupFacts(**{**gf.__dict__, "norm": norm, "facts": gf.facts + (Fact("norm_placement", norm, "probed", how),)})


def _small_instance(cfg: dict, klass, blocks, heads: tuple) -> tuple:
    """The smallest shrunk model that builds and reads: (instance, its blocks, its config, None), else
    (None, None, None, the last failure)."""
    err = None
    # a model sharing one block's weights with a later one (Zamba) needs two blocks of the group
    cands = shrink_candidates(cfg, layers=layers_needed(blocks), heads=heads[:2], vocab=4096)
    cands += [c for c in shrink_candidates(cfg, layers=layers_needed(blocks, 2), heads=heads[:2], vocab=4096)[:1]
              if c not in cands]
    for small in cands:
        try:
            inst = _Instance(small, klass)
            pblocks, _ = read_blocks(inst.model, inst.conf)
            return inst, pblocks, small, None
        except Exception as e:   # noqa: BLE001 - any build/forward failure: try a milder shrink
            err = e
    return None, None, None, err


def _probe_through_tower(inst, pblocks, g: str, k: str, pos: str, heads: tuple, gf):
    """A vision-tower block a token-id forward never runs, probed through the tower on random pixels
    (``gf`` unchanged when that sees nothing either)."""
    try:
        view = inst.tower(g)
        gf2 = _probe_group(view, pblocks, g, k, pos, heads) if view is not None else gf
        if gf2.k_class != "invisible" and view is not None:
            note = Fact("probe_input", f"{type(view.model).__name__}({', '.join(view.inputs)})", "derived",
                        "a token-id forward never runs this tower block; probed through the tower alone on seeded "
                        "inputs built from its config")
            gf = GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})
    except Exception as e:   # noqa: BLE001 - a probe that cannot run claims nothing (and says why)
        gf = GroupFacts(g, k, "unknown", (_failure(e).replace("built or run", "run on this block"),))
    return gf


def _probe_with_encoder_states(inst, pblocks, g: str, k: str, pos: str, heads: tuple, gf):
    """A decoder's cross-attention that a token-id forward never runs (TrOCRForCausalLM, no encoder of its
    own), probed with seeded ``encoder_hidden_states`` of the width its config names (``gf`` unchanged when the
    forward takes none or that sees nothing either)."""
    from .feeds import _configs, _get, _params
    width = _get(_configs(inst.model), ("cross_attention_hidden_size", "encoder_hidden_size", "hidden_size", "d_model"))
    if "encoder_hidden_states" not in _params(inst.model) or not isinstance(width, int):
        return gf
    try:
        g64 = inst.torch.Generator().manual_seed(5)
        states = inst.torch.randn((1, 10, width), generator=g64, dtype=inst.torch.float64)
        view = inst.view(inst.model, dict(inst.inputs, encoder_hidden_states=states), inst.outputs)
        gf2 = _probe_group(view, pblocks, g, k, pos, heads)
    except Exception:   # noqa: BLE001 - the forward refuses encoder states: nothing more is claimed
        return gf
    if gf2.k_class == "invisible":
        return gf
    note = Fact("probe_input", "encoder_hidden_states", "derived", "a token-id forward never runs this cross-attention; "
                "probed with seeded encoder states of the width the config names")
    return GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})


def _failure(e: Exception) -> str:
    first = str(e).splitlines()[0][:160] if str(e) else ""
    return f"probe instance could not be built or run ({type(e).__name__}: {first})"
