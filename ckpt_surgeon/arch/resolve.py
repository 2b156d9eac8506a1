"""Resolve a checkpoint's config + tensor names into a :class:`ModelLayout`.

The layout says, per layer, which tensor plays which attention role, and holds
the hyper-parameters analysis needs (heads, kv heads, head_dim, rotary_dim,
theta, pair layout, norm placement, q/k-norm).  It is computed from the registry
in :mod:`ckpt_surgeon.arch.families`; there is no per-model branching here.
"""
from __future__ import annotations

import re

from ..errors import ConfigError
from . import families as F
from .checked import MAX_LAYERS, MAX_WIDTH, config_float, config_int, describe
from . import gguf_names as G
from .gguf_clip import clip_arch, clip_encoders, is_attention_bias
from .derive.modtree import TOWER_PATH
# the layout records live below this module (arch/derive builds them too); re-exported here
from .model_layout import (  # noqa: F401
    LayerTensors,
    LayoutSummary,
    ModelLayout,
    PositionEncoding,
    _get,
    _is_mask_buffer,
    _looks_attention_bias,
    rope_params,
)


def _role_regex(layer: str, module, *, prefixed: bool = True, suffix: str = r"\.(weight|bias)") -> re.Pattern:
    """``module`` is a module path or a tuple of alternative paths (whichever the file holds).
    HF names may sit under a prefix (``model.``, ``transformer.``); GGUF names never do."""
    lay = re.escape(layer).replace(re.escape("{L}"), r"(\d+)")
    mods = (module,) if isinstance(module, str) else tuple(module)
    alt = "(?:" + "|".join(re.escape(m) for m in mods) + ")"
    return re.compile("^" + (r"(?:.*\.)?" if prefixed else "") + lay + alt + suffix + "$")


def family_fused_layout(fam: F.Family, cfg: dict) -> str | None:
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
    rp = rope_params(cfg, path)
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
    model_type = _checked_names(cfg, config_source)
    if naming == "gguf" and gguf_arch is not None and gguf_arch == clip_arch():
        return _clip_resolved(cfg, tensors, config_source, partial, shapes)
    fam, arch_name = _family(cfg, naming, gguf_arch, model_type)
    if (fam is None or fam.latent_attention) and naming == "hf" and model_type:
        # the one seam to arch/derive/derived.py: transformers' own module tree + float64 probes.  A
        # model_type transformers implements is authoritative: the class-name prefix fallback
        # below would take Qwen3NextForCausalLM for qwen3 and Qwen2MoeForCausalLM for qwen2.
        # A registry family with latent attention (MLA) leaves its attention layout to it too.
        from .derive.derived import derived_layout
        derived = derived_layout(cfg, tensors, config_source=config_source, arch_name=arch_name, family=fam)
        if derived is not None:
            for _, _, lay, _ in derived.stacks():     # every tower against its own head counts
                check_shapes(lay, tensors)
            return derived
    if fam is None and naming == "hf":
        # no model_type, or one transformers does not implement (remote code): the class name
        fam = F.by_architectures(cfg.get("architectures"))

    layout = _registry_layout(cfg, tensors, fam, naming, arch_name, config_source, partial)
    if layout.skipped and naming == "hf" and fam is not None and model_type:
        # attention biases outside the family's text stack (a multimodal file's vision / audio tower):
        # their towers are derived from transformers (imports torch, only for such files)
        from .derive.derived import registry_towers
        layout = registry_towers(cfg, tensors, layout)
    if shapes:
        for _, _, lay, _ in layout.stacks():
            check_shapes(lay, tensors)
    _check_consistent(layout, config_source)   # after the shapes: a shape error names the tensor
    return layout


def _clip_resolved(cfg: dict, tensors, config_source, partial: bool, shapes: bool):
    """An mmproj file: vision / audio encoders only, named by gguf-py (arch/gguf_clip.py)."""
    layout = _clip_layout(cfg, tensors, config_source, partial)
    for _, _, lay, _ in layout.stacks():
        if shapes:
            check_shapes(lay, tensors)
        _check_consistent(lay, config_source)
    return layout


def _checked_names(cfg: dict, where: str | None) -> str | None:
    """The config's ``model_type``, after checking it and ``architectures`` have the right types."""
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"model_type is {describe(model_type)}; it must be a string", path=where)
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"architectures is {describe(archs)}; it must be a list of class names (strings)",
                          path=where)
    return model_type


def _family(cfg: dict, naming: str, gguf_arch: str | None, model_type: str | None) -> tuple:
    """(registry family or None, architecture name) by GGUF architecture or HF model_type."""
    if naming == "gguf":
        return F.by_gguf_arch(gguf_arch), gguf_arch or "unknown"
    return F.by_model_type(model_type), model_type or (cfg.get("architectures") or ["unknown"])[0]


def _registry_layout(cfg: dict, tensors: dict, fam, naming: str, arch_name: str, where: str | None,
                     partial: bool) -> ModelLayout:
    """The layout from the registry family ``fam`` (or name matching alone when None), unchecked shapes."""
    cfg, (n_heads, n_kv, hidden, head_dim) = _head_sizes(cfg, fam, where, naming)
    permuted = bool(fam and fam.gguf_qk_permuted and naming == "gguf")
    position = _position(fam, cfg, head_dim, naming, permuted, where)
    layer_pat, found, placed = _match_roles(fam, naming, tensors)
    notes, buffers, skipped = _resolve_notes(fam, naming, arch_name, tensors, placed)
    n_layers = _layer_count(cfg, found, tensors, layer_pat, partial, where)
    layers = _layer_records(n_layers, found)
    qk_norm = bool(fam and fam.qk_norm) or any(lt.q_norm or lt.k_norm for lt in layers)
    fused_layout = None
    if any(lt.fused for lt in layers):
        fused_layout = "concat" if naming == "gguf" else (family_fused_layout(fam, cfg) if fam else None)
    softcap = config_float(cfg, (fam.softcap_key,), path=where, positive=True) if fam and fam.softcap_key else None
    return ModelLayout(
        architecture=arch_name, family=fam.name if fam else None, naming=naming,
        num_layers=n_layers, num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim, hidden_size=hidden,
        position=position, norm_placement=fam.norm_placement if fam else None, qk_norm=qk_norm,
        fused_layout=fused_layout, conv1d=bool(fam and fam.conv1d and naming == "hf"), qk_permuted=permuted,
        max_positions=config_int(cfg, F.CONFIG_KEYS["max_positions"], path=where, minimum=1, maximum=1 << 40),
        softcap=softcap,
        layers=tuple(layers), notes=tuple(notes), skipped=skipped, config_source=where,
        input_norm=fam.input_norm if fam else None,
        norm_weight_offset=(fam.norm_weight_offset if (fam and naming == "hf") else 0.0), buffers=buffers)


def _head_sizes(cfg: dict, fam, where: str | None, naming: str = "hf") -> tuple[dict, tuple]:
    """The attention sizes, checked: (the config they were read from, (heads, kv heads, hidden, head_dim))."""
    if isinstance(cfg.get("text_config"), dict) and _get(cfg, F.CONFIG_KEYS["num_heads"]) is None:
        # a multimodal checkpoint of a registry family (Gemma3ForConditionalGeneration): the language
        # model's sizes live in text_config
        cfg = {**cfg["text_config"], "model_type": cfg.get("model_type"), "architectures": cfg.get("architectures")}
    # keys the family's config class does not have (BLOOM has no num_key_value_heads): a stray one in
    # config.json is ignored by transformers, and so here (issue 24)
    dropped = F.absent_config_keys(fam) if naming == "hf" else ()      # (GGUF: generic keys from its metadata)
    read = {k: v for k, v in cfg.items() if k not in dropped} if dropped else cfg
    n_heads = config_int(read, F.CONFIG_KEYS["num_heads"], path=where, minimum=1, maximum=MAX_WIDTH)
    n_kv = config_int(read, F.CONFIG_KEYS["num_kv_heads"], path=where, minimum=1, maximum=MAX_WIDTH)
    if n_kv is None and n_heads is not None:
        n_kv = n_heads      # family rules below override (Falcon multi_query: one kv head)
    n_kv = F.kv_heads(fam.kv_heads_rules if fam else (), cfg, n_kv)
    hidden = config_int(read, F.CONFIG_KEYS["hidden_size"], path=where, minimum=1, maximum=MAX_WIDTH)
    head_dim = config_int(read, F.CONFIG_KEYS["head_dim"], path=where, minimum=1, maximum=MAX_WIDTH)
    if head_dim is None and hidden and n_heads:
        head_dim = hidden // n_heads
    return cfg, (n_heads, n_kv, hidden, head_dim)


def _match_roles(fam, naming: str, tensors: dict) -> tuple:
    """Match tensor names to roles: (layer pattern or None, {layer: {role: name}}, names placed)."""
    if naming == "gguf":
        # gguf-py's names (TENSOR_NAMES, and TensorNameMap for the family's own modules)
        layer_pat, role_map = G.GGUF_LAYER, G.family_gguf_roles(fam)
    elif fam:
        layer_pat, role_map = fam.layer, dict(fam.roles)
    else:
        layer_pat, role_map = None, {}
    if not layer_pat:
        found, placed = _generic_match(tensors)
        return layer_pat, found, placed
    found, placed = _match(layer_pat, role_map, tensors, prefixed=naming != "gguf")
    return layer_pat, found, placed


def _match(layer_pat: str, role_map: dict, tensors: dict, *, prefixed: bool) -> tuple[dict, set]:
    """({layer: {role_kind: name}}, names placed) for one stack's layer pattern and role -> module map."""
    found: dict[int, dict] = {}
    placed = set()
    # one regex per (role, alternative); an earlier alternative wins when a layer has both
    regs = [(role, rank, _role_regex(layer_pat, mod, prefixed=prefixed))
            for role, mods in role_map.items()
            for rank, mod in enumerate((mods,) if isinstance(mods, str) else mods)]
    ranks: dict = {}
    lead = layer_pat.split("{L}")[0]
    for name in tensors:
        if prefixed and TOWER_PATH.search(name[:max(name.find(lead), 0)]):
            continue    # a vision / audio tower's layers.N (Gemma 3's SigLIP) is not the text stack's layer N
        for role, rank, rx in regs:
            m = rx.match(name)
            if m:
                key = (int(m.group(1)), f"{role}_{m.group(2)}")
                if rank < ranks.get(key, len(regs)):
                    found.setdefault(key[0], {})[key[1]] = name
                    ranks[key] = rank
                placed.add(name)
                break
    return found, placed


def _clip_layout(cfg: dict, tensors: dict, where: str | None, partial: bool) -> ModelLayout:
    """An mmproj file's layout: its first encoder (vision, else audio) as the main stack, the other as a
    tower; every attention bias gguf-py names that no encoder holds (a resampler's, a Q-Former's) is skipped,
    which the reports say in their warning."""
    from dataclasses import replace

    from .model_layout import Tower
    stacks, placed = [], set()
    for enc in clip_encoders():
        sub = cfg.get(f"{enc.kind}_config") or {}
        found, got = _match(enc.layer, enc.roles, tensors, prefixed=False)
        if not sub and not found:
            continue
        placed |= got
        stacks.append(_clip_stack(enc, sub, found, tensors, where, partial))
    skipped = tuple(sorted(n for n in tensors if n not in placed
                           and (is_attention_bias(n) or _looks_attention_bias(n))))
    notes = [f"mmproj file ({clip_arch()} architecture: a VLM's encoder(s) and projector, no text stack): "
             + "; ".join(f"{lay.tower_kind} encoder {lay.tower_how}" for lay in stacks)] if stacks else \
        [f"mmproj file ({clip_arch()} architecture) without a vision or audio encoder gguf-py names"]
    if not stacks:
        return ModelLayout(architecture=clip_arch(), family=None, naming="gguf", num_layers=0, num_heads=None,
                           num_kv_heads=None, head_dim=None, hidden_size=None, position=PositionEncoding("unknown"),
                           norm_placement=None, qk_norm=False, fused_layout=None, conv1d=False, qk_permuted=False,
                           max_positions=None, softcap=None, notes=tuple(notes), skipped=skipped,
                           config_source=where, input_norm=None)
    towers = tuple(Tower(t.tower_name, t.tower_kind, t, t.tower_how) for t in stacks[1:])
    return replace(stacks[0], towers=towers, skipped=skipped, notes=tuple(notes))


def _clip_stack(enc, sub: dict, found: dict, tensors: dict, where: str | None, partial: bool) -> ModelLayout:
    """One encoder of an mmproj file: its heads from the ``clip.<encoder>.*`` keys (one line naming the key
    when one the tensors need is missing), its position encoding from the registry's projector row."""
    keys = enc.keys
    n_heads = config_int(sub, ("num_attention_heads",), path=where, minimum=1, maximum=MAX_WIDTH)
    hidden = config_int(sub, ("hidden_size",), path=where, minimum=1, maximum=MAX_WIDTH)
    head_dim = config_int(sub, ("head_dim",), path=where, minimum=1, maximum=MAX_WIDTH)
    if found and n_heads is None:
        raise ConfigError(f"GGUF metadata key '{keys['num_attention_heads']}' is missing: the {enc.kind} "
                          "encoder's q/k/v rows cannot be split into heads (llama.cpp requires it too)", path=where)
    if found and head_dim is None and hidden is None:
        raise ConfigError(f"GGUF metadata key '{keys['hidden_size']}' is missing: the {enc.kind} encoder's head "
                          "width (embedding length / heads) is unknown (llama.cpp requires it too)", path=where)
    n_kv = config_int(sub, ("num_key_value_heads",), path=where, minimum=1, maximum=MAX_WIDTH) or n_heads
    if head_dim is None and hidden and n_heads:
        head_dim = hidden // n_heads        # clip.cpp: d_head = n_embd / n_head
    n_layers = _layer_count(sub, found, tensors, enc.layer, partial, where)
    layers = _layer_records(n_layers, found)
    ptype = sub.get("projector_type")
    proj = F.clip_projector(ptype)
    if proj is None:
        position = PositionEncoding("unknown")
        how = (f"{enc.layer.replace('{L}', 'N')}* (gguf-py), projector type {ptype!r}: not in the registry "
               "(families.CLIP_PROJECTORS), so how its llama.cpp graph encodes positions is unknown")
    else:
        position = PositionEncoding("rope", head_dim, None, None, axes=proj.rope_axes or 1) \
            if proj.position == "rope" else PositionEncoding(proj.position)
        what = f"{proj.rope_axes}-D rotary on q and k" if proj.position == "rope" else \
            "a position table added to the input, no rotation"
        how = (f"{enc.layer.replace('{L}', 'N')}* (gguf-py), projector type {ptype!r}: llama.cpp's {proj.graph} "
               f"({what}) [registry]")
    return ModelLayout(
        architecture=clip_arch(), family=None, naming="gguf", num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=n_kv, head_dim=head_dim, hidden_size=hidden, position=position,
        # gguf-py's INPUT_NORM (ln1) feeds the projections: clip.cpp's build_vit normalises before attention
        norm_placement="pre" if any(lt.attn_norm for lt in layers) else None,
        qk_norm=any(lt.q_norm or lt.k_norm for lt in layers),
        fused_layout="concat" if any(lt.fused for lt in layers) else None,    # clip.cpp views Q, K, V in turn
        conv1d=False, qk_permuted=False, max_positions=None, softcap=None, layers=tuple(layers),
        config_source=where, input_norm=None, tower_name=enc.kind, tower_kind=enc.kind, tower_how=how)


def _resolve_notes(fam, naming: str, arch_name: str, tensors: dict, placed: set) -> tuple:
    """(notes, buffers, attention-like biases left unplaced) for the layout."""
    notes = []
    if fam and fam.bias_note:
        notes.append(fam.bias_note)
    if fam is None:
        how = "gguf-py's tensor names" if naming == "gguf" else "name only"
        notes.append(f"architecture {arch_name!r} is not in the registry: tensors were recognised by {how}; "
                     "position encoding, per-head statistics and redundancy classes are unknown")
    buffers = _buffers(fam, tensors) if naming == "hf" else ()
    skipped = tuple(sorted(n for n in tensors if n not in placed
                           and (_looks_attention_bias(n) or (naming == "gguf" and is_attention_bias(n)))
                           and n not in buffers and not _is_mask_buffer(n)))
    return notes, buffers, skipped   # skipped: said as a warning by the reports (model_layout.unplaced_warning)


def _layer_count(cfg: dict, found: dict, tensors: dict, layer_pat, partial: bool, where: str | None) -> int:
    """The layer count, checked both ways against the layers the tensors hold."""
    n_layers = config_int(cfg, F.CONFIG_KEYS["num_layers"], path=where, minimum=0, maximum=MAX_LAYERS)
    if n_layers is None:
        n_layers = (max(found) + 1) if found else 0
    if found and max(found) >= n_layers:
        raise ConfigError(f"num_hidden_layers={n_layers} but tensors exist for layer {max(found)}",
                          path=where, tensor=next(iter(found[max(found)].values())))
    if found and not partial:
        _check_layers_present(n_layers, _layer_indices(tensors, layer_pat) if layer_pat else set(found), where)
    return n_layers


def _layer_records(n_layers: int, found: dict) -> list[LayerTensors]:
    """One LayerTensors per layer from the matched {role: name} maps."""
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
    return layers


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


def _buffers(fam: F.Family | None, tensors: dict) -> tuple:
    """Tensors the family declares as saved buffers (GPT-2's causal masks), by layer pattern."""
    if fam is None or not fam.buffers:
        return ()
    rx = _role_regex(fam.layer, fam.buffers, suffix="")
    return tuple(sorted(n for n in tensors if rx.match(n)))


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
    """config.json must agree with the tensors it describes (one clear error otherwise).  Latent
    attention (MLA) has no heads x head_dim query or output: its q and o widths are not checked."""
    rows = expected_rows(layout)
    if not rows:
        return
    where = layout.config_source
    fam = F.by_name(layout.family)
    latent = bool(fam and fam.latent_attention)
    for lt in layout.layers:
        for role in ("k", "v", "qkv") if latent else ("q", "k", "v", "qkv"):
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
            _check_widths(layout, lt, tensors, latent)


def _check_widths(layout: ModelLayout, lt: LayerTensors, tensors: dict, latent: bool) -> None:
    """The other direction: the projections read hidden_size columns and the output projection
    maps heads x head_dim back to hidden_size (a doubled hidden_size is caught here; latent
    attention's output reads heads x v_head_dim, which is not checked)."""
    hidden, conv = layout.hidden_size, layout.conv1d
    checks = [(getattr(lt, f"{r}_weight"), 0 if conv else 1, hidden, "hidden_size") for r in ("q", "k", "v", "qkv")]
    checks += [(lt.o_weight, 1 if conv else 0, hidden, "hidden_size")]
    if not latent:
        checks += [(lt.o_weight, 0 if conv else 1, layout.num_heads * layout.head_dim, "heads x head_dim")]
    for name, axis, want, what in checks:
        shape = tensors[name].shape if name is not None else ()
        if len(shape) == 2 and shape[axis] != want:
            raise ConfigError(f"config says {what} = {want}, but the tensor has shape {list(shape)} "
                              f"({'columns' if axis == 1 else 'rows'}: {shape[axis]})", path=layout.config_source,
                              tensor=name, expected=want, got=shape[axis])
