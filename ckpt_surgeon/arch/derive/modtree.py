"""The module tree of a transformers model, read on the meta device (no memory, no weights).

Shared by :mod:`.derived` (which turns it into a layout and caches it) and :mod:`.probe` (which
establishes on a shrunken float64 instance what cannot be read statically): the config object
and the model class for a ``config.json``, the meta-device build, and :func:`read_blocks`, which
finds the attention blocks (q/k/v/o projections, separate or fused, head counts) and the layers
without attention.  Its records (:class:`Fact`, :class:`Block`, :class:`GroupFacts`) are what a
derived architecture is made of.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Direct-child names of an attention module, per role (transformers 5 modeling files).
# linear_q / linear_k / linear_v / linear_out: conformer self-attention (SeamlessM4T, Wav2Vec2-Conformer);
# Wq / Wk / Wv: CTRL; q_head / k_head / v_head / post_proj: Funnel; Wo: ModernBERT
_Q = ("q_proj", "query", "q", "wq", "q_lin", "to_q", "query_proj", "q_linear", "linear_q", "Wq", "q_head")
_K = ("k_proj", "key", "k", "wk", "k_lin", "to_k", "key_proj", "k_linear", "linear_k", "Wk", "k_head")
_V = ("v_proj", "value", "v", "wv", "v_lin", "to_v", "value_proj", "v_linear", "linear_v", "Wv", "v_head")
_FUSED = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "W_pack", "wqkv", "qkv", "att_proj", "qkv_linear",
          "in_proj_qkv")
_O = ("o_proj", "out_proj", "dense", "c_proj", "wo", "out_lin", "o", "out", "proj", "to_out", "output_proj",
      "attn_out", "o_linear", "projection", "linear_out", "Wo", "post_proj")     # BLIP's vision attention: projection
_QK_NORM = re.compile(r"^(q|k|query|key)_?(norm|layernorm|ln)$", re.I)
# Mixers that are not softmax attention over q.k (their k bias is never softmax-shift redundant).  "SSM" is
# matched in capitals only: "SeamlessM4TAttention" is softmax attention ("sea-m-le-ssM4T")
_NOT_SOFTMAX = re.compile(r"mamba|linear|lightning|delta|rwkv|(?-i:SSM)|retention|gla|hyena|xlstm|conv", re.I)
_ATTN_CLASS = re.compile(r"Attention$")
_CROSS = re.compile(r"cross|encoder_attn|encdec|enc_dec", re.I)
_LAYER = re.compile(r"^(.*?)\.(\d+)(?:\.(.*))?$")
# towers of a multimodal model (the language model's heads are the layout's, see main_heads)
TOWER_PATH = re.compile(r"vision|visual|image|img|video|audio|speech|vq|patch", re.I)


@dataclass(frozen=True)
class Fact:
    """One fact the analysis uses, with how it was established."""

    name: str
    value: object
    how: str                 # registry | derived | probed
    detail: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "how": self.how, "detail": self.detail}


@dataclass(frozen=True)
class Block:
    """One attention site (or a layer without attention) of the transformers module tree."""

    path: str                # module path, e.g. "model.decoder.layers.0.encoder_attn"
    group: str               # the path with the layer index as {L}: blocks of a group share facts
    kind: str                # self | cross | none
    roles: tuple = ()        # ((role, child module path relative to ``path``), ...): q k v qkv o
    heads: tuple = ()        # (num_heads, num_kv_heads, head_dim)
    conv1d: bool = False     # GPT-2 style Conv1D weights ([in, out])
    klass: str = ""          # module class name
    qk_norm: bool = False
    sinks: bool = False
    q_gate: bool = False     # q projection has 2 x heads x head_dim rows: query + output gate (Qwen3-Next)

    def role(self, name: str) -> str | None:
        return dict(self.roles).get(name)


@dataclass(frozen=True)
class GroupFacts:
    """What the probe established for one group of blocks (e.g. every decoder cross-attention)."""

    group: str
    kind: str
    k_class: str             # exact | partial | rope | not-removable | unknown | none
    reasons: tuple = ()
    pass_dims: tuple = ()    # within-head key dims that are exactly redundant (partial)
    fused_layout: str | None = None
    v_foldable: bool | None = None
    facts: tuple = ()        # Fact records
    q_gate: str | None = None   # gated q projection: which rows are the query (layouts.GATE_LAYOUTS) or "unknown"
    norm: str | None = None     # pre | post: a norm of the layer feeds the attention, or follows it (traced)


class DeriveUnavailable(Exception):
    """transformers/torch missing, or the model type unknown to them (the caller falls back)."""


# ----------------------------------------------------------------------------------------------
# transformers plumbing
# ----------------------------------------------------------------------------------------------

def _libs():
    try:
        import torch
        import transformers
    except ImportError as e:   # pragma: no cover - both are dependencies; kept for slim installs
        raise DeriveUnavailable(f"transformers/torch are not importable ({e})") from e
    return torch, transformers


def config_object(cfg: dict):
    """The transformers config for ``cfg`` (its ``model_type`` must be one transformers knows)."""
    _, transformers = _libs()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    mt = cfg.get("model_type")
    if mt not in CONFIG_MAPPING:
        raise DeriveUnavailable(f"model_type {mt!r} is not implemented by transformers {transformers.__version__}")
    from ...quiet import quiet_transformers
    with quiet_transformers():
        klass = CONFIG_MAPPING[mt]
        # config.json written by transformers tags non-JSON floats ({"__float__": "Infinity"});
        # from_pretrained decodes them, from_dict does not
        body = klass._decode_special_floats({k: v for k, v in cfg.items() if k != "transformers_version"})
        conf = klass.from_dict(body)
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:   # the probe wants transformers' plain softmax path and float64-capable MoE matmuls
            setattr(conf, attr, "eager")
        except Exception:   # noqa: BLE001 - some configs validate the setter; eager is only a preference
            pass
    try:   # no key/value cache in our one-shot forwards: hybrid caches (Bamba, Kimi-Linear) refuse a
        # mask over linear-attention layers ("`get_seq_length` can only be called on Attention layers")
        conf.use_cache = False
    except Exception:   # noqa: BLE001 - as above
        pass
    if hasattr(conf, "attention_softmax_in_fp32"):
        conf.attention_softmax_in_fp32 = False     # GPT-BigCode: keep a float64 probe in float64
    return conf


_MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
             "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")


def model_class(cfg: dict, conf):
    """The class whose parameter names the checkpoint most likely uses: ``architectures[0]``
    when transformers has it, else the causal-LM / masked-LM / seq2seq / base class."""
    _, transformers = _libs()
    from transformers.models.auto import modeling_auto
    for name in list(cfg.get("architectures") or ()):
        klass = getattr(transformers, name, None)
        if klass is not None:
            return klass
    for mapping in _MAPPINGS:
        name = getattr(modeling_auto, mapping).get(conf.model_type)
        if isinstance(name, (tuple, list)):
            name = name[0]
        klass = getattr(transformers, name, None) if name else None
        if klass is not None:
            return klass
    raise DeriveUnavailable(f"transformers has no model class for model_type {conf.model_type!r}")


def build_meta(cfg: dict):
    """(config, model on the meta device): parameter names and module classes, no memory."""
    torch, _ = _libs()
    conf = config_object(cfg)
    klass = model_class(cfg, conf)
    from ...quiet import quiet_transformers
    with quiet_transformers(), torch.device("meta"):
        model = klass(conf)
    return conf, model


# ----------------------------------------------------------------------------------------------
# Module-tree reading
# ----------------------------------------------------------------------------------------------

def _is_linear(mod) -> bool:
    w = getattr(mod, "weight", None)
    return w is not None and getattr(w, "ndim", 0) == 2 and not type(mod).__name__.lower().startswith("embed")


def _out_rows(mod) -> int:
    w = mod.weight
    return int(w.shape[1] if type(mod).__name__ == "Conv1D" else w.shape[0])


def _in_cols(mod) -> int:
    w = mod.weight
    return int(w.shape[0] if type(mod).__name__ == "Conv1D" else w.shape[1])


def _int_attr(obj, names) -> int | None:
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _heads(mod, conf, q_rows: int | None, k_rows: int | None, fused_rows: int | None) -> tuple:
    """(H, kv, head_dim) from the attention module's own attributes and projection shapes.

    A separate q projection may have ``2 x H x head_dim`` rows when the module itself declares
    ``head_dim``: the query and an output gate (modeling_qwen3_next ``Qwen3NextAttention``:
    ``q_proj`` out = heads x head_dim x 2, split per head by ``torch.chunk``).  Which rows are
    the query is left to the probe (:func:`ckpt_surgeon.arch.derive.probe._gate_layout`)."""
    h = _int_attr(mod, ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_attn_heads", "heads"))
    # transformers 5 attention modules read head counts from their own (sub-)config: a composite
    # model's language model has them in text_config, not in the top-level config
    h = h or _int_attr(getattr(mod, "config", None), ("num_attention_heads",)) or _int_attr(conf, ("num_attention_heads",))
    hd = _int_attr(mod, ("head_dim", "attention_head_size", "head_size", "d_head", "dim_head"))
    if not h:
        return ()
    if fused_rows is None:
        declared = bool(hd)
        if not hd and q_rows and q_rows % h == 0:
            hd = q_rows // h
        if not hd or q_rows not in (h * hd, 2 * h * hd if declared else None) or not k_rows or k_rows % hd:
            return ()
        return (h, k_rows // hd, hd)
    if not hd:
        own = getattr(mod, "config", None) or conf
        hd = _int_attr(own, ("head_dim",)) or (_int_attr(own, ("hidden_size",)) or 0) // h or None
    if not hd:
        # a module without a config (SAM's vision attention): the output projection reads heads x head_dim
        # features, or the softmax scale it applies is head_dim ** -0.5
        out = next((c for n, c in mod.named_children() if n in _O and _is_linear(c)), None)
        scale = getattr(mod, "scale", None)
        if out is not None and _in_cols(out) % h == 0:
            hd = _in_cols(out) // h
        elif isinstance(scale, float) and 0 < scale < 1 and abs(round(scale ** -2) - scale ** -2) < 1e-6:
            hd = round(scale ** -2)
    if not hd or fused_rows % hd:
        return ()
    rest = fused_rows // hd - h
    if rest <= 0 or rest % 2:
        return ()
    return (h, rest // 2, hd)


def _find_o(block_path: str, mod, parent, inner: int, taken: set):
    """The output projection: a direct child with an output-projection name, else (BERT's
    ``attention.output.dense``) a linear beside the block under its parent reading ``inner``
    features."""
    for name, child in mod.named_children():
        if name in _O and name not in taken and _is_linear(child) and _in_cols(child) == inner:
            return name
    if parent is None:
        return None
    ppath, pmod = parent
    for name, child in pmod.named_modules():
        full = f"{ppath}.{name}" if name else ppath
        if full == block_path or full.startswith(block_path + "."):
            continue
        if name.rsplit(".", 1)[-1] in _O and _is_linear(child) and _in_cols(child) == inner:
            return _relative(block_path, full)
    return None


def _relative(block_path: str, full: str) -> str:
    """``full`` relative to the block's parent, written ``^.`` + path (one level up)."""
    parent = block_path.rsplit(".", 1)[0]
    return "^." + full[len(parent) + 1:]


# torch's nn.MultiheadAttention keeps its fused [q; k; v] projection as parameters of the attention module
# itself (in_proj_weight / in_proj_bias, chunked in three by F.multi_head_attention_forward), not as a child
MHA_IN_PROJ = "in_proj_"


def param_name(block_path: str, rel: str, kind: str) -> str:
    """The parameter name of a role's ``weight`` / ``bias`` (``rel`` as in :attr:`Block.roles`)."""
    if rel == MHA_IN_PROJ:
        return f"{block_path}.in_proj_{kind}"
    return f"{module_path(block_path, rel)}.{kind}"


def module_path(block_path: str, rel: str) -> str:
    if rel.startswith("^."):
        return block_path.rsplit(".", 1)[0] + "." + rel[2:]
    return f"{block_path}.{rel}"


def read_blocks(model, conf) -> tuple[tuple, tuple]:
    """(blocks, notes) of a (meta or real) model."""
    modules = dict(model.named_modules())
    blocks, notes, skipped = [], [], []
    for path, mod in modules.items():
        block = _qkv_block(path, mod, modules, conf, skipped)
        if block is not None:
            blocks.append(block)
    others = _latent_attention(modules, [b.path for b in blocks])
    for path, klass in others:
        blocks.append(Block(path, _group_of(path), "self", (), (), False, klass))
    if others:
        notes.append(f"{len(others)} attention module(s) have no q/k/v projections (e.g. MLA's latent keys: "
                     f"{others[0][1]}); they have no key bias to analyse")
    blocks += _attentionless_layers(modules, blocks, conf)
    if skipped:
        notes.append(f"{len(skipped)} mixer(s) are not softmax attention and are reported as 'no attention': "
                     + ", ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else ""))
    blocks.sort(key=_block_order)
    return tuple(blocks), tuple(notes)


def _group_of(path: str) -> str:
    """A block's group: its path with the layer index replaced by {L}."""
    m = _LAYER.match(path)
    return f"{m.group(1)}.{{L}}" + (f".{m.group(3)}" if m.group(3) else "") if m else path


def _qkv_block(path: str, mod, modules: dict, conf, skipped: list) -> Block | None:
    """The attention block ``mod`` is when it holds q/k/v (or fused qkv) projections; a mixer that is
    not softmax attention goes to ``skipped``."""
    kids = {n: c for n, c in mod.named_children() if _is_linear(c)}
    if not kids:
        return None
    q = next((n for n in _Q if n in kids), None)
    k = next((n for n in _K if n in kids), None)
    v = next((n for n in _V if n in kids), None)
    fused = next((n for n in _FUSED if n in kids), None)
    if not ((q and k and v) or (fused and not (q or k or v))):
        return _mha_block(path, mod, conf)
    klass = type(mod).__name__
    if _NOT_SOFTMAX.search(klass):
        skipped.append(f"{path} ({klass})")
        return None
    if q:
        roles = {"q": q, "k": k, "v": v}
        hs = _heads(mod, conf, _out_rows(kids[q]), _out_rows(kids[k]), None)
    else:
        roles = {"qkv": fused}
        hs = _heads(mod, conf, None, None, _out_rows(kids[fused]))
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    parent = (parent_path, modules[parent_path]) if parent_path in modules and parent_path else None
    if hs:
        o = _find_o(path, mod, parent, hs[0] * hs[2], set(roles.values()))
        if o:
            roles["o"] = o
    conv = any(type(kids[r]).__name__ == "Conv1D" for r in roles.values() if r in kids)
    qk_norm = any(_QK_NORM.match(n) for n, _ in mod.named_children())
    sinks = any(n.split(".")[-1] == "sinks" for n, _ in mod.named_parameters(recurse=False))
    kind = "cross" if (_CROSS.search(path) or _CROSS.search(klass)) else "self"
    q_gate = bool(q and hs and _out_rows(kids[q]) == 2 * hs[0] * hs[2])
    return Block(path, _group_of(path), kind, tuple(sorted(roles.items())), hs, conv, klass, qk_norm, sinks, q_gate)


def _mha_block(path: str, mod, conf) -> Block | None:
    """A torch ``nn.MultiheadAttention`` (SigLIP's pooling head): fused in_proj parameters, out_proj child."""
    w = getattr(mod, "in_proj_weight", None)
    if w is None or getattr(w, "ndim", 0) != 2:
        return None
    hs = _heads(mod, conf, None, None, int(w.shape[0]))
    roles = {"qkv": MHA_IN_PROJ}
    out = getattr(mod, "out_proj", None)
    if out is not None and _is_linear(out):
        roles["o"] = "out_proj"
    return Block(path, _group_of(path), "self", tuple(sorted(roles.items())), hs, False, type(mod).__name__)


def _latent_attention(modules: dict, found: list[str]) -> list[tuple[str, str]]:
    """(path, class) of attention modules whose projections are not q/k/v (MLA: DeepSeek-V2/V3 keys
    come from a low-rank latent, kv_a_proj_with_mqa / kv_b_proj, with a decoupled rope part):
    attention all the same, with no key bias to analyse."""
    others = []
    for path, mod in modules.items():
        klass = type(mod).__name__
        if not path or not _ATTN_CLASS.search(klass) or _NOT_SOFTMAX.search(klass):
            continue
        related = found + [p for p, _ in others]
        if any(path == f or path.startswith(f + ".") or f.startswith(path + ".") for f in related):
            continue
        if not any(_is_linear(c) for c in mod.modules()):
            continue
        others.append((path, klass))
    return others


def _attentionless_layers(modules: dict, blocks: list, conf) -> list[Block]:
    """A "none" block for every layer of a layer list that holds no attention block (Mamba, linear
    attention)."""
    stacks = {}
    for b in blocks:
        m = _LAYER.match(b.path)
        if m:
            stacks.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not stacks:     # no attention anywhere (pure state-space models): the layer list is all "none"
        n_layers = _int_attr(conf, ("num_hidden_layers",))
        for path, mod in modules.items():
            if type(mod).__name__ == "ModuleList" and n_layers and len(mod) == n_layers:
                stacks[path] = set()
                break
    out = []
    for stack, have in stacks.items():
        n = len(modules.get(stack, ()) or ())
        for i in range(n):
            if i not in have:
                out.append(Block(f"{stack}.{i}", f"{stack}.{{L}}", "none",
                                 klass=type(modules[stack][i]).__name__))
    return out


def _block_order(b: Block):
    m = _LAYER.match(b.path)
    if not m:
        return (b.path, -1, "")
    return (m.group(1), int(m.group(2)), m.group(3) or "")


def static_position(model) -> tuple[str, str]:
    """(position kind, how it was seen) from the module tree."""
    for name, mod in model.named_modules():
        if "rotary" in type(mod).__name__.lower() or name.endswith("rotary_emb"):
            return "rope", f"rotary module {name or '<root>'} ({type(mod).__name__})"
    for name, _ in model.named_parameters():
        if re.search(r"(embed_positions|position_embedding|wpe|pos_emb)", name):   # CLIP: position_embedding.weight
            return "absolute", f"learned/sinusoidal position table {name}"
    for name, _ in model.named_buffers():
        if re.search(r"(embed_positions|position_embedding|wpe|pos_emb)", name):
            return "absolute", f"position table buffer {name}"
    return "none", "no rotary module and no position table (relative, ALiBi-style or none)"


# ----------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------

