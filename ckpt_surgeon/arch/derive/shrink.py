"""A smaller config of the same architecture, for a float64 probe instance (plain dict -> dict).

The copy keeps the checkpoint's own transformers class and head_dim (so within-head dimensions map one to
one) with fewer layers, heads, experts and features: :func:`shrink_config` (the keys a config spells a
quantity with are matched by the patterns below, every key that restates a size follows it),
:func:`shrink_candidates` (milder shrinks for architectures that tie sizes together), and
:func:`layers_needed` (how many layers keep every block group).  Nothing here imports torch.
"""
from __future__ import annotations

import re

from .feeds import MAX_TOWER_TOKENS

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
