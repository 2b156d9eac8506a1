"""Resolve a checkpoint's config + tensor names into a :class:`ModelLayout`.

The layout says, per layer, which tensor plays which attention role, and holds
the hyper-parameters analysis needs (heads, kv heads, head_dim, rotary_dim,
theta, pair layout, norm placement, q/k-norm).  It is computed from the registry
in :mod:`ckpt_surgeon.arch.families`; there is no per-model branching here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

from ..errors import ConfigError
from . import families as F
from .checked import MAX_LAYERS, MAX_WIDTH, config_float, config_int
from . import gguf_names as G


@dataclass(frozen=True)
class PositionEncoding:
    type: str                      # rope | absolute | alibi | none | unknown (not declared anywhere)
    rotary_dim: int | None = None
    theta: float | None = None
    pair_layout: str | None = None  # rotate_half | interleaved (rope only)

    def to_dict(self) -> dict:
        return {"type": self.type, "rotary_dim": self.rotary_dim, "theta": self.theta}


@dataclass(frozen=True)
class LayerTensors:
    """Tensor names per role for one layer (None where absent)."""

    layer: int
    q_weight: str | None = None
    q_bias: str | None = None
    k_weight: str | None = None
    k_bias: str | None = None
    v_weight: str | None = None
    v_bias: str | None = None
    qkv_weight: str | None = None
    qkv_bias: str | None = None
    o_weight: str | None = None
    o_bias: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    attn_norm: str | None = None        # weight of the norm that feeds the projections (pre-norm)
    attn_norm_bias: str | None = None   # its bias (LayerNorm beta), if any
    # derived layouts (arch/derive.py): one record per attention block, so several per model layer
    block: str | None = None            # transformers module path of this attention block
    group: str | None = None            # the path with the layer index as {L} (blocks sharing facts)
    kind: str | None = None             # self | cross | none (a layer without softmax attention)

    @property
    def fused(self) -> bool:
        return self.qkv_weight is not None or self.qkv_bias is not None


@dataclass(frozen=True, kw_only=True)
class LayoutSummary:
    """What every view of a model states about its attention layout: the layout itself
    (:class:`ModelLayout`) and the ``inspect`` and ``analyze`` reports built from it, which
    inherit these fields (one record, not three copies of ten fields)."""

    architecture: str
    family: str | None
    num_layers: int
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    hidden_size: int | None
    position: PositionEncoding
    norm_placement: str | None
    qk_norm: bool

    def summary(self) -> dict:
        """These fields by name (a report is built as ``Report(**layout.summary(), ...)``)."""
        return {f.name: getattr(self, f.name) for f in fields(LayoutSummary)}

    def summary_dict(self) -> dict:
        """The JSON both reports open with, after source and format (key order is the contract)."""
        return {"architecture": self.architecture, "family": self.family, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "hidden_size": self.hidden_size, "position_encoding": self.position.to_dict(),
                "pair_layout": self.position.pair_layout}


@dataclass(frozen=True)
class ModelLayout(LayoutSummary):
    naming: str                     # hf | gguf
    fused_layout: str | None        # concat | per_head | grouped (None: separate q/k/v)
    conv1d: bool
    qk_permuted: bool               # GGUF llama-arch rows are interleaved pairs
    max_positions: int | None
    softcap: float | None
    layers: tuple = ()
    notes: tuple = ()               # human notes (registry bias_note, skipped items)
    skipped: tuple = ()             # tensors with attention-like names we could not place
    config_source: str | None = None
    input_norm: str | None = None   # rms | layer | None: kind of the attn_norm tensors (registry)
    norm_weight_offset: float = 0.0  # effective gamma = stored weight + offset (Gemma HF files)
    buffers: tuple = ()             # tensors that are saved buffers, not parameters (registry ``buffers``)
    derived: object | None = None   # arch.derive.DerivedArch when the registry has no family
    q_gate: str | None = None       # q projection = query + output gate (2 x heads x head_dim rows): which rows
    #                                 are the query (layouts.GATE_LAYOUTS), "unknown" if not established

    def facts(self) -> list[dict]:
        """Every fact the analysis uses and how it was established (registry | derived | probed)."""
        if self.derived is not None:
            return self.derived.all_facts()
        if self.family is None:
            return []
        return [{"name": "position", "value": self.position.type, "how": "registry", "detail": self.family},
                {"name": "qk_norm", "value": self.qk_norm, "how": "registry", "detail": self.family},
                {"name": "fused_layout", "value": self.fused_layout, "how": "registry", "detail": self.family},
                {"name": "softcap", "value": self.softcap, "how": "registry", "detail": self.family}]

    def derivation(self) -> dict | None:
        """Per block (JSON): module path, kind and the key-bias class of its group (derived layouts)."""
        d = self.derived
        if d is None:
            return None
        groups = {g.group: g for g in d.groups}
        return {"model_class": d.model_class, "transformers_version": d.transformers_version, "cached": d.cached,
                "seconds": d.seconds,
                "groups": [{"group": g.group, "kind": g.kind, "k_class": g.k_class, "fused_layout": g.fused_layout,
                            "v_foldable": g.v_foldable, "q_gate": g.q_gate, "reasons": list(g.reasons)}
                           for g in d.groups],
                "blocks": [{"layer": lt.layer, "block": lt.block, "kind": lt.kind,
                            "k_class": groups[lt.group].k_class if lt.group in groups else None}
                           for lt in self.layers]}


def _get(cfg: dict, keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _rope_params(cfg: dict, path: str | None = None) -> dict:
    """Rope settings from either spelling.

    transformers >= 5 writes ``rope_parameters`` ({rope_theta, partial_rotary_factor,
    rope_type}); Gemma 3 nests one dict per layer type.  Hub-era configs keep
    top-level ``rope_theta`` / ``rotary_pct`` / ``partial_rotary_factor`` / ``rope_scaling``.
    """
    rp = cfg.get("rope_parameters") or {}
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        rp = rp.get("full_attention") or next(iter(rp.values()))
    out = {}
    rp = rp if isinstance(rp, dict) else {}
    theta = config_float(rp, ("rope_theta",), path=path, positive=True)
    out["theta"] = theta if theta is not None else config_float(cfg, F.CONFIG_KEYS["rope_theta"], path=path,
                                                                positive=True) or 10000.0
    prf = config_float(rp, ("partial_rotary_factor",), path=path)
    if prf is None:
        prf = config_float(cfg, F.CONFIG_KEYS["partial_rotary"], path=path)
    out["partial"] = 1.0 if prf is None else prf     # clamped to [0, 1] where it is used
    return out


def _role_regex(layer: str, module, *, prefixed: bool = True, suffix: str = r"\.(weight|bias)") -> re.Pattern:
    """``module`` is a module path or a tuple of alternative paths (whichever the file holds).
    HF names may sit under a prefix (``model.``, ``transformer.``); GGUF names never do."""
    lay = re.escape(layer).replace(re.escape("{L}"), r"(\d+)")
    mods = (module,) if isinstance(module, str) else tuple(module)
    alt = "(?:" + "|".join(re.escape(m) for m in mods) + ")"
    return re.compile("^" + (r"(?:.*\.)?" if prefixed else "") + lay + alt + suffix + "$")


def _fused_layout(fam: F.Family, cfg: dict) -> str | None:
    for key, val, layout in fam.fused_layout_rules:
        if cfg.get(key) == val:
            return layout
    return fam.fused_layout


def _position(fam: F.Family | None, cfg: dict, head_dim: int | None, naming: str, permuted: bool,
              path: str | None = None) -> PositionEncoding:
    # Not declared: say so.  Guessing "none" would claim an exact key-bias removal that a
    # rotary model does not allow.
    ptype = fam.position if fam else "unknown"
    for key, val, pos in (fam.position_rules if fam else ()):
        if cfg.get(key) == val:
            ptype = pos
    if ptype != "rope":
        return PositionEncoding(ptype)
    rp = _rope_params(cfg, path)
    rotary_dim = int(head_dim * min(max(rp["partial"], 0.0), 1.0)) if head_dim else None
    if cfg.get("rotary_dim"):
        rotary_dim = config_int(cfg, ("rotary_dim",), path=path, minimum=0, maximum=MAX_WIDTH)
    interleaved = permuted or (fam is not None and fam.rope_pairs == "interleaved")
    return PositionEncoding("rope", rotary_dim, rp["theta"], "interleaved" if interleaved else "rotate_half")


def resolve(config: dict | None, tensors: dict, *, naming: str = "hf", config_source: str | None = None,
            gguf_arch: str | None = None, partial: bool = False, shapes: bool = True) -> ModelLayout:
    """Build the layout.  ``tensors`` maps name -> TensorInfo (shapes in numpy order).

    Every config value used is type- and range-checked here, and config and tensors must agree
    both ways: no tensor for a layer past the layer count, and (unless ``partial``: one shard of
    a sharded model) every layer the config counts has tensors; ``shapes``: projection shapes agree
    with heads, kv heads, head_dim and hidden_size (:func:`check_shapes`)."""
    cfg = dict(config or {})
    model_type = cfg.get("model_type")
    if naming == "gguf":
        fam = F.by_gguf_arch(gguf_arch)
        arch_name = gguf_arch or "unknown"
    else:
        fam = F.by_model_type(model_type)
        arch_name = model_type or (cfg.get("architectures") or ["unknown"])[0]

    if fam is None and naming == "hf" and model_type:
        # the one seam to arch/derive.py: transformers' own module tree + float64 probes.  A
        # model_type transformers implements is authoritative: the class-name prefix fallback
        # below would take Qwen3NextForCausalLM for qwen3 and Qwen2MoeForCausalLM for qwen2
        from .derive import derived_layout
        derived = derived_layout(cfg, tensors, config_source=config_source, arch_name=arch_name)
        if derived is not None:
            check_shapes(derived, tensors)
            return derived
    if fam is None and naming == "hf":
        # no model_type, or one transformers does not implement (remote code): the class name
        fam = F.by_architectures(cfg.get("architectures"))

    where = config_source
    if isinstance(cfg.get("text_config"), dict) and _get(cfg, F.CONFIG_KEYS["num_heads"]) is None:
        # a multimodal checkpoint of a registry family (Gemma3ForConditionalGeneration): the language
        # model's sizes live in text_config
        cfg = {**cfg["text_config"], "model_type": model_type, "architectures": cfg.get("architectures")}
    n_heads = config_int(cfg, F.CONFIG_KEYS["num_heads"], path=where, minimum=1, maximum=MAX_WIDTH)
    n_kv = config_int(cfg, F.CONFIG_KEYS["num_kv_heads"], path=where, minimum=1, maximum=MAX_WIDTH)
    if n_kv is None and n_heads is not None:
        n_kv = n_heads      # family rules below override (Falcon multi_query: one kv head)
    for conds, value in (fam.kv_heads_rules if fam else ()):
        if all(bool(cfg.get(k)) == v for k, v in conds.items()):
            n_kv = value
    hidden = config_int(cfg, F.CONFIG_KEYS["hidden_size"], path=where, minimum=1, maximum=MAX_WIDTH)
    head_dim = config_int(cfg, F.CONFIG_KEYS["head_dim"], path=where, minimum=1, maximum=MAX_WIDTH)
    if head_dim is None and hidden and n_heads:
        head_dim = hidden // n_heads
    permuted = bool(fam and fam.gguf_qk_permuted and naming == "gguf")
    position = _position(fam, cfg, head_dim, naming, permuted, where)

    # Match tensor names to roles.
    if naming == "gguf":
        # gguf-py's names (TENSOR_NAMES, and TensorNameMap for the family's own modules)
        layer_pat, role_map = G.GGUF_LAYER, G.family_gguf_roles(fam)
    elif fam:
        layer_pat, role_map = fam.layer, dict(fam.roles)
    else:
        layer_pat, role_map = None, {}
    found: dict[int, dict] = {}
    placed = set()
    if layer_pat:
        # one regex per (role, alternative); an earlier alternative wins when a layer has both
        regs = [(role, rank, _role_regex(layer_pat, mod, prefixed=naming != "gguf"))
                for role, mods in role_map.items()
                for rank, mod in enumerate((mods,) if isinstance(mods, str) else mods)]
        ranks: dict = {}
        for name in tensors:
            for role, rank, rx in regs:
                m = rx.match(name)
                if m:
                    key = (int(m.group(1)), f"{role}_{m.group(2)}")
                    if rank < ranks.get(key, len(regs)):
                        found.setdefault(key[0], {})[key[1]] = name
                        ranks[key] = rank
                    placed.add(name)
                    break
    else:
        found, placed = _generic_match(tensors)

    notes = []
    if fam and fam.bias_note:
        notes.append(fam.bias_note)
    if fam is None:
        how = "gguf-py's tensor names" if naming == "gguf" else "name only"
        notes.append(f"architecture {arch_name!r} is not in the registry: tensors were recognised by {how}; "
                     "position encoding, per-head statistics and redundancy classes are unknown")
    buffers = _buffers(fam, tensors) if naming == "hf" else ()
    skipped = tuple(sorted(n for n in tensors if n not in placed and _looks_attention_bias(n)
                           and n not in buffers and not _is_mask_buffer(n)))
    if skipped:
        notes.append(f"{len(skipped)} attention-like bias tensor(s) could not be placed: {', '.join(skipped[:5])}"
                     + (" ..." if len(skipped) > 5 else ""))

    n_layers = config_int(cfg, F.CONFIG_KEYS["num_layers"], path=where, minimum=0, maximum=MAX_LAYERS)
    if n_layers is None:
        n_layers = (max(found) + 1) if found else 0
    if found and max(found) >= n_layers:
        raise ConfigError(f"num_hidden_layers={n_layers} but tensors exist for layer {max(found)}",
                          path=config_source, tensor=next(iter(found[max(found)].values())))
    if found and not partial:
        _check_layers_present(n_layers, _layer_indices(tensors, layer_pat) if layer_pat else set(found), where)

    layers = []
    for i in range(n_layers):
        d = found.get(i, {})
        layers.append(LayerTensors(
            layer=i,
            q_weight=d.get("q_weight"), q_bias=d.get("q_bias"),
            k_weight=d.get("k_weight"), k_bias=d.get("k_bias"),
            v_weight=d.get("v_weight"), v_bias=d.get("v_bias"),
            qkv_weight=d.get("qkv_weight"), qkv_bias=d.get("qkv_bias"),
            o_weight=d.get("o_weight"), o_bias=d.get("o_bias"),
            q_norm=d.get("q_norm_weight"), k_norm=d.get("k_norm_weight"),
            attn_norm=d.get("attn_norm_weight"), attn_norm_bias=d.get("attn_norm_bias"),
        ))
    qk_norm = bool(fam and fam.qk_norm) or any(lt.q_norm or lt.k_norm for lt in layers)
    fused_layout = None
    if any(lt.fused for lt in layers):
        fused_layout = "concat" if naming == "gguf" else (_fused_layout(fam, cfg) if fam else None)
    softcap = config_float(cfg, (fam.softcap_key,), path=where, positive=True) if fam and fam.softcap_key else None

    layout = ModelLayout(
        architecture=arch_name, family=fam.name if fam else None, naming=naming,
        num_layers=n_layers, num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim, hidden_size=hidden,
        position=position, norm_placement=fam.norm_placement if fam else None, qk_norm=qk_norm,
        fused_layout=fused_layout, conv1d=bool(fam and fam.conv1d and naming == "hf"), qk_permuted=permuted,
        max_positions=config_int(cfg, F.CONFIG_KEYS["max_positions"], path=where, minimum=1, maximum=1 << 40),
        softcap=softcap,
        layers=tuple(layers), notes=tuple(notes), skipped=skipped, config_source=config_source,
        input_norm=fam.input_norm if fam else None,
        norm_weight_offset=(fam.norm_weight_offset if (fam and naming == "hf") else 0.0), buffers=buffers)
    if shapes:
        check_shapes(layout, tensors)
    _check_consistent(layout, where)   # after the shapes: a shape error names the tensor
    return layout


def _check_consistent(layout: ModelLayout, where: str | None) -> None:
    """Config values that agree with the tensors but not with each other."""
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    if h is not None and kv is not None and h % kv:
        raise ConfigError(f"{h} attention heads cannot be shared by {kv} key/value heads (not a divisor)", path=where)
    # A partial rotary factor outside [0, 1] is clamped where it is used (_position): a GGUF whose
    # rope.dimension_count disagrees with key_length gives 2.0, and lint diagnoses the head_dim.
    rd = layout.position.rotary_dim
    if layout.position.type == "rope" and rd is not None and d and rd > d:
        raise ConfigError(f"rotary_dim is {rd}, more than head_dim {d}", path=where)


def _layer_indices(tensors: dict, layer_pat: str) -> set:
    """Indices of the layers any tensor lives in (by the layer prefix pattern)."""
    lay = re.escape(layer_pat).replace(re.escape("{L}"), r"(\d+)")
    rx = re.compile(r"^(?:.*\.)?" + lay)
    return {int(m.group(1)) for m in map(rx.match, tensors) if m}


def _check_layers_present(n_layers: int, present: set, where: str | None) -> None:
    """Every layer the config counts must hold tensors (``present``: the indices that do)."""
    top = max(present, default=-1)
    gap = next((i for i in range(min(n_layers, top + 1)) if i not in present), None)
    if gap is None and top + 1 >= n_layers:
        return
    first = gap if gap is not None else top + 1
    raise ConfigError(f"the config counts {n_layers:,} layers, but layer {first} has no tensors (tensors exist for "
                      f"{len(present)} layer(s), the last being layer {top}): a truncated download, a missing shard "
                      "or a wrong layer count", path=where)


_ATTN_WORDS = re.compile(r"(q_proj|k_proj|v_proj|query|key|value|qkv|c_attn|query_key_value|attn_q|attn_k|attn_v|wq|wk|wv)")


def _looks_attention_bias(name: str) -> bool:
    return name.endswith(".bias") and bool(_ATTN_WORDS.search(name))


def _buffers(fam: F.Family | None, tensors: dict) -> tuple:
    """Tensors the family declares as saved buffers (GPT-2's causal masks), by layer pattern."""
    if fam is None or not fam.buffers:
        return ()
    rx = _role_regex(fam.layer, fam.buffers, suffix="")
    return tuple(sorted(n for n in tensors if rx.match(n)))


def _is_mask_buffer(name: str) -> bool:
    # GPT-2's attn.bias / attn.masked_bias are causal-mask buffers, not learned biases.
    return name.endswith(("attn.bias", "attn.masked_bias")) and ".c_attn." not in name


def _generic_match(tensors: dict):
    """Name-only recognition for architectures outside the registry."""
    found, placed = {}, set()
    rx = re.compile(r"(?:^|\.)(\d+)\.(?:.*\.)?([A-Za-z_]+)\.(weight|bias)$")
    lookup = {alias: role for role, aliases in F.GENERIC_ROLES.items() for alias in aliases}
    for name in tensors:
        if _is_mask_buffer(name):
            continue
        m = rx.search(name)
        if not m:
            continue
        role = lookup.get(m.group(2))
        if role:
            found.setdefault(int(m.group(1)), {})[f"{role}_{m.group(3)}"] = name
            placed.add(name)
    return found, placed


def expected_rows(layout: ModelLayout) -> dict:
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    if not (h and kv and d):
        return {}
    return {"q": (2 if layout.q_gate else 1) * h * d, "k": kv * d, "v": kv * d, "qkv": (h + 2 * kv) * d}


def check_shapes(layout: ModelLayout, tensors: dict) -> None:
    """config.json must agree with the tensors it describes (one clear error otherwise)."""
    rows = expected_rows(layout)
    if not rows:
        return
    where = layout.config_source
    for lt in layout.layers:
        for role in ("q", "k", "v", "qkv"):
            for kind in ("weight", "bias"):
                name = getattr(lt, f"{role}_{kind}")
                if name is None:
                    continue
                shape = tensors[name].shape
                axis = -1 if (layout.conv1d and kind == "weight") else 0
                got = shape[axis] if shape else None
                if got != rows[role]:
                    what = {"q": f"{layout.num_heads} heads" + (" x 2 (query + gate)" if layout.q_gate else ""),
                            "k": f"{layout.num_kv_heads} kv heads",
                            "v": f"{layout.num_kv_heads} kv heads",
                            "qkv": f"{layout.num_heads} heads + 2 x {layout.num_kv_heads} kv heads"}[role]
                    raise ConfigError(
                        f"config says {what} x head_dim {layout.head_dim} = {rows[role]} {role} rows, "
                        f"but the tensor has shape {list(shape)}", path=where, tensor=name,
                        expected=rows[role], got=got)
        if layout.family is not None and layout.hidden_size:
            _check_widths(layout, lt, tensors, rows)


def _check_widths(layout: ModelLayout, lt: LayerTensors, tensors: dict, rows: dict) -> None:
    """The other direction: the projections read hidden_size columns and the output projection
    maps heads x head_dim back to hidden_size (a doubled hidden_size is caught here)."""
    hidden, conv = layout.hidden_size, layout.conv1d
    checks = [(getattr(lt, f"{r}_weight"), 0 if conv else 1, hidden, "hidden_size") for r in ("q", "k", "v", "qkv")]
    checks += [(lt.o_weight, 1 if conv else 0, hidden, "hidden_size"),
               (lt.o_weight, 0 if conv else 1, layout.num_heads * layout.head_dim, "heads x head_dim")]
    for name, axis, want, what in checks:
        shape = tensors[name].shape if name is not None else ()
        if len(shape) == 2 and shape[axis] != want:
            raise ConfigError(f"config says {what} = {want}, but the tensor has shape {list(shape)} "
                              f"({'columns' if axis == 1 else 'rows'}: {shape[axis]})", path=layout.config_source,
                              tensor=name, expected=want, got=shape[axis])
