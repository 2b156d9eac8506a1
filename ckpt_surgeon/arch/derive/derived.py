"""Attention layout of architectures outside the registry, derived from transformers itself.

The registry (:mod:`ckpt_surgeon.arch.families`) holds hand-checked facts for a few families.
Every other architecture transformers implements is read from transformers:

1. **Derived** (static, no memory): the model class is built from ``config.json`` on the meta
   device and its module tree is read.  A module whose direct children include q/k/v
   projections (separate, or one fused projection such as GPT-BigCode's ``c_attn``) is an
   attention block; its kind is ``cross`` when its path or class says so (BART
   ``encoder_attn``, BERT ``crossattention``), ``self`` otherwise.  Modules whose class names a
   state-space or linear-attention mixer (Mamba, lightning / linear attention, RWKV, delta
   rules) are never taken for attention, and a layer of a layer list with no attention block
   is reported as ``none`` ("no attention").  Head counts come from the attention module's own
   attributes (what its forward uses) and the projection shapes.
2. **Probed** (:mod:`ckpt_surgeon.arch.derive.probe`): what cannot be read statically (is the key
   bias exactly redundant? which dims pass through unrotated? is the fused layout ``[Q;K;V]``
   or per head? can the value bias be folded into the output bias?) is established on a
   shrunken random float64 instance of the same class, with transformers' own forward pass.

Every fact carries how it was established (``registry`` | ``derived`` | ``probed``).  The result
is cached as JSON per (model_type, transformers version, config hash) under the user cache dir
(``$CKPT_SURGEON_CACHE_DIR`` overrides it), so only the first run of an architecture pays.

torch and transformers are imported only here and in ``probe``, and only for architectures
the registry does not know: registry families keep the no-torch inspect path.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ...errors import CkptError
from ...formats.safe_input import read_json
from ...publish import write_file_atomic
from ...userdirs import user_cache
# re-exported too: tests and fixtures import the module-tree reader from here
from .modtree import (  # noqa: F401
    Block,
    DeriveUnavailable,
    Fact,
    GroupFacts,
    _LAYER,
    TOWER_PATH,
    _int_attr,
    _libs,
    build_meta,
    config_object,
    model_class,
    module_path,
    param_name,
    read_blocks,
    static_position,
)

CACHE_ENV = "CKPT_SURGEON_CACHE_DIR"
CACHE_VERSION = 6     # 3: DerivedArch.renames (transformers' checkpoint key conversions); 4: conformer
#                       linear_q/k/v blocks, SeamlessM4T's attention no longer taken for an SSM mixer; 5: towers
#                       probed alone on more inputs (Q-Formers, NaFlex, conformers), DerivedArch.audio;
#                       6: GroupFacts.norm (norm placement traced)
_CACHE_MAX_BYTES = 16 << 20    # a derived record is a few KB; a larger file is not ours


@dataclass(frozen=True)
class DerivedArch:
    model_type: str
    transformers_version: str
    model_class: str
    blocks: tuple
    groups: tuple
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    hidden_size: int | None
    position: str            # rope | absolute | none (relative/T5/ALiBi-style or unknown)
    rotary_dim: int | None
    facts: tuple = ()
    notes: tuple = ()
    seconds: float = 0.0     # derivation + probe time when it was computed (not when cached)
    cached: bool = False
    renames: bool = False    # transformers has checkpoint key conversions for this class (arch/derive/renames.py)
    positions: tuple = ()    # ((tower root module path, position, how seen), ...): each non-main stack's own
    audio: tuple = ()        # module paths of a speech model's encoder (Whisper's model.encoder): an audio tower

    def group(self, name: str | None) -> GroupFacts | None:
        for g in self.groups:
            if g.group == name:
                return g
        return None

    def all_facts(self) -> list[dict]:
        out = [f.to_dict() for f in self.facts]
        for g in self.groups:
            out += [dict(f.to_dict(), group=g.group) for f in g.facts]
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DerivedArch":
        def facts(xs):
            return tuple(Fact(**x) for x in xs)
        blocks = tuple(Block(**dict(b, roles=tuple(tuple(r) for r in b["roles"]), heads=tuple(b["heads"])))
                       for b in d["blocks"])
        groups = tuple(GroupFacts(**dict(g, reasons=tuple(g["reasons"]), pass_dims=tuple(g["pass_dims"]),
                                         facts=facts(g["facts"]))) for g in d["groups"])
        return cls(**dict(d, blocks=blocks, groups=groups, facts=facts(d["facts"]), notes=tuple(d["notes"]),
                          positions=tuple(tuple(p) for p in d.get("positions", ())), audio=tuple(d.get("audio", ()))))


def cache_dir() -> Path:
    return user_cache("derived", CACHE_ENV)


def _cache_path(cfg: dict, version: str) -> Path:
    body = json.dumps({k: v for k, v in cfg.items() if k not in ("transformers_version", "_name_or_path")},
                      sort_keys=True, default=str)
    h = hashlib.sha256(f"{CACHE_VERSION}\n{body}".encode()).hexdigest()[:16]
    mt = re.sub(r"[^A-Za-z0-9_.-]", "_", str(cfg.get("model_type")))
    return cache_dir() / mt / version / f"{h}.json"


def _cache_load(path: Path) -> DerivedArch | None:
    try:
        # the same size and depth limits as every JSON we read: the cache is a file on disk too
        return DerivedArch.from_dict(read_json(path, max_bytes=_CACHE_MAX_BYTES, what="derived-architecture cache"))
    except (CkptError, OSError, ValueError, TypeError, KeyError):
        return None     # absent, corrupt or from another ckpt-surgeon version: derive again


def _cache_store(path: Path, arch: DerivedArch) -> None:
    """Atomic (publish: temp beside it, fsync, rename): concurrent runs never read half a record."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, json.dumps(arch.to_dict(), default=str).encode())
    except OSError:
        pass            # a read-only cache only costs the next run the derivation again


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------

def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("transformers")
    except PackageNotFoundError as e:
        raise DeriveUnavailable("transformers is not installed") from e


def derive(cfg: dict, *, probe: bool = True, use_cache: bool = True) -> DerivedArch:
    """Derive (and probe) the attention layout of ``cfg``'s architecture; cached."""
    version = _transformers_version()
    path = _cache_path(cfg, version)
    if use_cache:
        hit = _cache_load(path)
        if hit is not None:          # a cache hit imports neither torch nor transformers
            return DerivedArch(**{**hit.__dict__, "cached": True})
    _libs()
    t0 = time.perf_counter()
    conf, model = build_meta(cfg)
    blocks, notes = read_blocks(model, conf)
    pos, pos_how = static_position(model)
    attn = [b for b in blocks if b.kind != "none"]
    heads = main_heads(attn)
    facts = [Fact("model_class", type(model).__name__, "derived", "meta-device instance of the config's class"),
             Fact("position", pos, "derived", pos_how),
             Fact("attention_blocks", len(attn), "derived", "modules with q/k/v or fused qkv projections"),
             Fact("no_attention_layers", sum(b.kind == "none" for b in blocks), "derived",
                  "layers of a layer list without softmax attention")]
    audio = _speech_encoders(model)
    rotary_dim = None
    if pos == "rope" and heads:
        from ..model_layout import rope_params
        rp = rope_params(cfg)
        rotary_dim = int(cfg.get("rotary_dim") or int(heads[2] * rp["partial"]))
    from .probe import probe_groups
    # only attention with q/k/v biases has facts to probe (the module tree says whether it has)
    params = dict(model.named_parameters())
    biased = any(param_name(b.path, rel, "bias") in params
                 for b in blocks for role, rel in b.roles if role in ("q", "k", "v", "qkv"))
    if probe and biased:
        groups = probe_groups(cfg, conf, type(model), blocks, heads, pos)
    else:
        why = "not probed" if not probe else "no q/k/v bias in this configuration: nothing to probe"
        groups = tuple(GroupFacts(g, k, "none", ("no softmax attention in this layer",)) if k == "none" else
                       GroupFacts(g, k, "unknown", (why,)) for g, k in _groups(blocks))
    arch = DerivedArch(
        model_type=str(cfg.get("model_type")), transformers_version=version, model_class=type(model).__name__,
        blocks=blocks, groups=tuple(groups), num_heads=heads[0] if heads else None,
        num_kv_heads=heads[1] if heads else None, head_dim=heads[2] if heads else None,
        hidden_size=_int_attr(conf, ("hidden_size", "d_model")), position=pos, rotary_dim=rotary_dim,
        facts=tuple(facts), notes=notes, seconds=round(time.perf_counter() - t0, 3), renames=_has_renames(model),
        positions=_tower_positions(model, attn, heads, audio), audio=audio)
    if use_cache and probe:
        _cache_store(path, arch)
    return arch


def _has_renames(model) -> bool:
    from .renames import has_rules
    try:
        return has_rules(model)
    except Exception:   # noqa: BLE001 - a transformers without conversion mappings: files load under their names
        return False


# the language model of a composite model (an omni model's thinker, not its talker or code2wav stack)
_LANGUAGE = re.compile(r"language_model|text_model|thinker|(^|\.)llm(\.|$)|text_decoder", re.I)
_KINDS = (("projector", re.compile(r"projector|qformer|q_former|resampler|connector|merger|adapter|perceiver|"
                                   r"abstractor|pooling_head|\.head\.", re.I)),
          ("audio", re.compile(r"audio|speech|whisper|wav|sound|code2wav|acoustic", re.I)),
          ("vision", re.compile(r"vision|visual|image|img|patch|vit|siglip|clip|pixel|video", re.I)))


def main_heads(attn) -> tuple:
    """(H, kv, head_dim) of the layout: the first attention block of the language model (a path naming it,
    else the first outside a vision / audio tower: what the text-only probe runs), else the first with
    head counts."""
    with_heads = [b for b in attn if b.heads]
    lang = [b for b in with_heads if _LANGUAGE.search(b.path) and not TOWER_PATH.search(b.path)]
    text = [b for b in with_heads if not TOWER_PATH.search(b.path)]
    if not (lang or text) and any(not TOWER_PATH.search(b.path) for b in attn):
        return ()      # a text stack whose heads cannot be read (latent attention) is not a tower's
    return (lang or text or with_heads or [Block("", "", "none")])[0].heads


def tower_kind(path: str) -> str:
    """vision | audio | projector | text | other, from a stack's module path."""
    if _LANGUAGE.search(path):
        return "text"
    for kind, rx in _KINDS:
        if rx.search(path):
            return kind
    return "other"


def stack_of(path: str) -> str:
    """The layer list a block belongs to (``model.visual.blocks`` for ``model.visual.blocks.3.attn``), or the
    block's own path when it is in none (a pooling head)."""
    m = _LAYER.match(path)
    return m.group(1) if m else path


def tower_root(stack: str) -> str:
    """The module that holds a stack and its position encoding: the path up to the first component naming a
    tower (``model.visual``), else the stack's parent."""
    parts = stack.split(".")
    for i, p in enumerate(parts):
        if TOWER_PATH.search(p) or any(rx.search(p) for _, rx in _KINDS):
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1])


_AUDIO_INPUTS = ("input_features", "input_values")


def _speech_encoders(model) -> tuple:
    """Module paths of a speech model's audio encoder: ``get_encoder()`` of a model whose main input is audio
    features or samples (Whisper, Moonshine, Canary), and in a model whose forward takes them, the module
    built from its ``audio_config`` / ``speech_config`` / ``encoder_config`` (Granite-Speech's
    ``model.encoder``).  Their layers are an audio tower, not text."""
    import inspect as _inspect
    main = getattr(model, "main_input_name", None)
    out = []
    get = getattr(model, "get_encoder", None)
    if main in _AUDIO_INPUTS and callable(get):
        try:
            enc = get()
        except Exception:   # noqa: BLE001 - a model without a separate encoder: nothing to split off
            enc = None
        out += [p for p, m in model.named_modules() if enc is not None and m is enc and p and enc is not model][:1]
    try:
        params = _inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if any(n in params for n in _AUDIO_INPUTS):
        for attr in ("audio_config", "speech_config", "encoder_config"):
            sub = getattr(model.config, attr, None)
            if sub is None or isinstance(sub, dict):
                continue
            out += [p for p, m in model.named_modules() if p and getattr(m, "config", None) is sub][:1]
    return tuple(dict.fromkeys(out))


def _under(path: str, roots: tuple) -> bool:
    return any(path.startswith(r + ".") for r in roots)


def _root_of(stack: str, audio: tuple) -> str:
    """The module holding ``stack``'s position encoding: its audio encoder when it is under one, else
    :func:`tower_root`."""
    return next((r for r in audio if stack.startswith(r + ".")), None) or tower_root(stack)


def _tower_path(path: str, audio: tuple) -> bool:
    """Whether ``path`` names a vision / audio tower or a projector, read below the module that holds a speech
    model's encoder (SpeechT5's ``speecht5.`` prefix says "speech" of every stack, its text decoder's too)."""
    for r in audio:
        parent = r.rsplit(".", 1)[0] if "." in r else ""
        if parent and path.startswith(parent + "."):
            path = path[len(parent) + 1:]
            break
    return bool(TOWER_PATH.search(path) or _KINDS[0][1].search(path))


def _tower_positions(model, attn, heads, audio: tuple = ()) -> tuple:
    """(root, position, how) for the roots of the stacks that are not the main one (their own module trees)."""
    out, seen = [], set()
    for b in attn:
        root = _root_of(stack_of(b.path), audio)
        if b.heads == heads and not _tower_path(b.path, audio) and not _under(b.path, audio) or root in seen:
            continue
        seen.add(root)
        try:
            pos, how = static_position(model.get_submodule(root)) if root else static_position(model)
        except AttributeError:
            continue
        out.append((root, pos, how))
    return tuple(out)


def _groups(blocks) -> list[tuple[str, str]]:
    seen = {}
    for b in blocks:
        seen.setdefault(b.group, b.kind)
    return list(seen.items())


__all__ = ["Block", "DerivedArch", "DeriveUnavailable", "Fact", "GroupFacts", "derive", "read_blocks",
           "build_meta", "config_object", "model_class", "cache_dir", "module_path"]


# ----------------------------------------------------------------------------------------------
# DerivedArch -> the layout records the rest of the code consumes
# ----------------------------------------------------------------------------------------------

def _align(expected: list[str], tensors) -> dict:
    """Map transformers parameter names to the checkpoint's (same names, or a model saved from
    the base class: ``bert.encoder...`` vs ``encoder...``).  One prefix rewrite for all names."""
    names = set(tensors)
    probe = next((e for e in expected if e in names), None)
    if probe is not None:
        return {e: e for e in expected if e in names}
    for e in expected:
        parts = e.split(".")
        for i in range(len(parts)):
            tail = ".".join(parts[i:])
            hits = [t for t in names if t == tail or t.endswith("." + tail)]
            if len(hits) == 1:
                add = hits[0][: len(hits[0]) - len(tail)]
                out = {}
                for x in expected:
                    xp = x.split(".")
                    cand = add + ".".join(xp[i:])
                    if ".".join(xp[:i]) == ".".join(parts[:i]) and cand in names:
                        out[x] = cand
                return out
    return {}


def _renamed_names(cfg: dict, expected: list[str], tensors) -> tuple[dict, dict, str | None]:
    """(``{model name: file name}``, ``{model name: (file name, piece)}``, note) through transformers'
    checkpoint key conversions (:mod:`.renames`): a renamed tensor maps to the parameter it loads into; a
    tensor split along dim 0 into several parameters (a fused ``query_key_value`` loaded as q/k/v) maps each
    piece, in order.  Other converters (expert merges ...) are left to the plain names."""
    from .renames import loaded_names
    _, model = build_meta(cfg)
    loaded = loaded_names(model, list(tensors))
    view: dict = {n: (n, None) for n in tensors if n not in loaded}
    for r in loaded.values():
        if len(r.targets) > 1:
            if r.split_rows:
                for i, t in enumerate(r.targets):
                    view[t] = (r.file_name, i)
        else:
            view[r.model_name] = (r.file_name, None)
    aligned = _align(expected, view)
    names = {e: view[k][0] for e, k in aligned.items() if view[k][1] is None}
    pieces = {e: view[k] for e, k in aligned.items() if view[k][1] is not None}
    used = sum(1 for e in aligned if view[aligned[e]][0] != aligned[e])
    note = (f"{used} attention tensor name(s) of the file are in the layout transformers converts at load "
            f"({type(model).__name__}'s checkpoint key conversions): matched as transformers loads them; reports "
            "and writers keep the file's names") if used else None
    return names, pieces, note


def _renamed_names_cached(cfg: dict, expected: list[str], tensors) -> tuple[dict, dict, str | None]:
    """:func:`_renamed_names`, cached beside the derivation (per config, transformers version and the
    file's tensor names): matching through the rules needs the meta-device model, so without the cache
    every run of a file in a renamed layout (the Hub's LLaVA, EXAONE ...) imported torch + transformers."""
    key = hashlib.sha256(json.dumps([sorted(tensors), expected]).encode()).hexdigest()[:16]
    path = _cache_path(cfg, _transformers_version())
    path = path.with_name(f"{path.stem}.names-{key}.json")
    try:
        d = read_json(path, max_bytes=_CACHE_MAX_BYTES, what="derived-architecture cache")
        return dict(d["names"]), {k: (f, int(i)) for k, (f, i) in d["pieces"].items()}, d["note"]
    except (CkptError, OSError, ValueError, TypeError, KeyError):
        pass                # absent, corrupt or another version's: match through the rules again
    names, pieces, note = _renamed_names(cfg, expected, tensors)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, json.dumps({"names": names, "pieces": pieces, "note": note}).encode())
    except OSError:
        pass                # a read-only cache only costs the next run the matching again
    return names, pieces, note


def _fused_pieces(b: Block, pieces: dict) -> dict:
    """qkv_weight / qkv_bias of a block whose q, k and v parameters are pieces 0, 1, 2 of one file tensor."""
    out = {}
    roles = dict(b.roles)
    for kind in ("weight", "bias"):
        got = [pieces.get(param_name(b.path, roles[r], kind)) for r in ("q", "k", "v") if r in roles]
        if len(got) == 3 and all(got) and len({f for f, _ in got}) == 1 and [i for _, i in got] == [0, 1, 2]:
            out[f"qkv_{kind}"] = got[0][0]
    return out


def classify_group(arch: DerivedArch, group: str | None) -> tuple[str, tuple]:
    g = arch.group(group)
    if g is None:
        return "unknown", ("no attention block of the derived layout",)
    if g.k_class == "none":
        return "unknown", ("no attention in this layer",)
    return g.k_class, g.reasons


def v_fold_verdict(arch: DerivedArch, group: str | None) -> tuple[bool, str]:
    """(foldable, reason) for the value bias of a derived block: only what the probe proved
    (a gate, a norm or a second softmax between the attention and the output projection
    breaks b_o' = b_o + W_o b_v, and the module tree alone cannot tell)."""
    g = arch.group(group)
    if g is not None and g.v_foldable is True:
        return True, "exact (probed): fold as b_o' = b_o + W_o b_v left the float64 probe's logits invariant"
    return False, ("not established: the float64 probe's logits changed when b_v was folded into b_o (a gate, norm "
                   "or other operation sits between attention and the output projection)" if g is not None and
                   g.v_foldable is False else "not established by the probe")


def derived_layout(cfg: dict, tensors, *, config_source: str | None = None, arch_name: str = "unknown",
                   family=None):
    """A :class:`~ckpt_surgeon.arch.resolve.ModelLayout` for an architecture outside the registry,
    or None when transformers does not implement it (the caller then falls back to names).
    ``family``: the registry record of a family that leaves its attention layout to this
    derivation (``latent_attention``): the layout is tagged with it and carries its note."""
    from .. import families as F
    from ..model_layout import ModelLayout, _get, _is_mask_buffer, _looks_attention_bias
    try:
        arch = derive(cfg)
    except DeriveUnavailable:
        return None
    heads = (arch.num_heads, arch.num_kv_heads, arch.head_dim)
    names, pieces, notes = _file_names(arch, cfg, tensors)
    gated = next((b.q_gate for b in arch.blocks if b.kind != "none" and b.heads == heads), False)
    main, stacks = split_stacks(arch, heads, gated)
    layers = [_record(i, b, names, pieces) for i, b in enumerate(main)]
    towers = _build_towers(arch, stacks, names, pieces, arch_name, config_source)
    if towers:
        notes.append(f"{len(towers)} more attention stack(s) (towers) with their own head counts are reported "
                     "per tower: " + ", ".join(f"{t.name} ({t.kind}, {t.layout.num_layers} blocks)" for t in towers[:4])
                     + (" ..." if len(towers) > 4 else ""))
    _lead_notes(notes, arch, arch_name, family)
    placed = {n for lay in [layers] + [t.layout.layers for t in towers] for lt in lay
              for n in lt.__dict__.values() if isinstance(n, str) and n in tensors}
    skipped = tuple(sorted(n for n in tensors if n not in placed and _looks_attention_bias(n) and not _is_mask_buffer(n)))
    return ModelLayout(
        architecture=arch_name, family=family.name if family is not None else None, naming="hf", num_layers=len(layers), num_heads=heads[0],
        num_kv_heads=heads[1], head_dim=heads[2], hidden_size=arch.hidden_size, position=_main_position(arch, main, cfg),
        norm_placement=_norm_of(arch, main), qk_norm=any(b.qk_norm for b in arch.blocks), fused_layout=_fused_of(arch, layers),
        conv1d=any(b.conv1d for b in arch.blocks), qk_permuted=False,
        max_positions=_get(cfg, F.CONFIG_KEYS["max_positions"]), softcap=None, layers=tuple(layers),
        notes=tuple(notes), skipped=skipped, config_source=config_source, input_norm=None, derived=arch,
        q_gate=_q_gate(arch, main) if gated else None, towers=tuple(towers), tower_name=_main_name(layers),
        tower_kind="text", tower_how="derived from transformers' module tree, key-bias facts probed in float64")


def _file_names(arch: DerivedArch, cfg: dict, tensors) -> tuple[dict, dict, list]:
    """(parameter name -> file tensor name, fused pieces, notes) for the derived blocks' projections."""
    expected = []
    for b in arch.blocks:
        for _, rel in b.roles:
            expected += [param_name(b.path, rel, "weight"), param_name(b.path, rel, "bias")]
    names = _align(expected, tensors)
    notes = list(arch.notes)
    pieces: dict = {}
    if arch.renames and any(e.endswith(".weight") and e not in names for e in expected):
        # a file in the layout transformers renames at load (EXAONE, Sarvam-MoE): match through its rules
        names, pieces, note = _renamed_names_cached(cfg, expected, tensors)
        if note:
            notes.append(note)
    return names, pieces, notes


def _q_gate(arch: DerivedArch, main: list) -> str | None:
    """One query-row layout for a gated model: the one the probe established, else "unknown"."""
    seen = {g.q_gate for g in arch.groups if g.kind != "none" and any(b.group == g.group and b.q_gate
                                                                      for b in main)}
    return seen.pop() if len(seen) == 1 and None not in seen else "unknown"


def _main_position(arch: DerivedArch, main: list, cfg: dict):
    """The main stack's position encoding; rotary width from a probed partial-rotary group when one is."""
    from ..model_layout import PositionEncoding, rope_params
    if arch.position != "rope":
        return PositionEncoding(arch.position)
    mine = {b.group for b in main}
    partial = [g for g in arch.groups if g.group in mine and g.k_class == "partial" and g.pass_dims]
    rotary_dim = partial[0].pass_dims[0] if partial else arch.rotary_dim
    return PositionEncoding("rope", rotary_dim, rope_params(cfg)["theta"], None)


def _lead_notes(notes: list, arch: DerivedArch, arch_name: str, family) -> None:
    """Put first in ``notes`` how the layout was established (and the family's bias note)."""
    how = (f"architecture {arch_name!r} is not in the registry" if family is None else
           f"registry family {family.name!r} has latent attention")
    notes.insert(0, f"{how}: its attention layout was derived from "
                    f"transformers {arch.transformers_version} ({arch.model_class}) and its key/value-bias facts "
                    f"probed in float64" + (" (cached)" if arch.cached else f" ({arch.seconds:.1f} s)"))
    if family is not None and family.bias_note:
        notes.insert(1, family.bias_note)


def split_stacks(arch: DerivedArch, heads: tuple, gated: bool) -> tuple[list, dict]:
    """(blocks of the main stack in order, {(stack path, heads, q_gate): [blocks]} of the others)."""
    stacks: dict = {}
    # a vision / audio path makes a tower only beside a text stack (a model of towers alone keeps its first)
    # (a text stack whose heads cannot be read, MLA's latent attention, is a text stack all the same)
    by_path = any(b.kind != "none" and not _in_tower(b, heads, gated, audio=arch.audio) for b in arch.blocks)
    for b in arch.blocks:
        if b.kind != "none" and _in_tower(b, heads, gated, by_path, arch.audio):
            stacks.setdefault((stack_of(b.path), b.heads, b.q_gate), []).append(b)
    tower_stacks = {k[0] for k in stacks}
    main = [b for b in arch.blocks if not ((b.kind != "none" and _in_tower(b, heads, gated, by_path, arch.audio))
                                           or (b.kind == "none" and stack_of(b.path) in tower_stacks))]
    for key, members in stacks.items():     # a tower's layers without attention stay in that tower
        nones = [b for b in arch.blocks if b.kind == "none" and stack_of(b.path) == key[0]]
        stacks[key] = sorted(members + nones, key=_block_order_key)
    return main, stacks


def _build_towers(arch: DerivedArch, stacks: dict, names: dict, pieces: dict, arch_name: str, config_source) -> list:
    towers, count = [], {}
    for (stack, hs, _), members in stacks.items():
        count[stack] = count.get(stack, 0) + 1     # one stack with two head shapes: two towers, #2 for the second
        towers.append(_tower(arch, stack, hs, members, names, pieces, arch_name, config_source,
                             suffix=f"#{count[stack]}" if count[stack] > 1 else ""))
    return towers


def registry_towers(cfg: dict, tensors, layout):
    """A registry family's layout with the towers of a multimodal file added (Gemma 3's SigLIP tower): the
    towers are derived from transformers' module tree like any derived architecture's; the registry keeps
    the text stack.  ``layout`` unchanged when transformers cannot build the model."""
    from dataclasses import replace
    from ..model_layout import _is_mask_buffer, _looks_attention_bias
    try:
        arch = derive(cfg)
    except DeriveUnavailable:
        return layout
    heads = (arch.num_heads, arch.num_kv_heads, arch.head_dim)
    gated = next((b.q_gate for b in arch.blocks if b.kind != "none" and b.heads == heads), False)
    _, stacks = split_stacks(arch, heads, gated)
    if not stacks:
        return layout
    expected = [param_name(b.path, rel, k) for bs in stacks.values() for b in bs for _, rel in b.roles
                for k in ("weight", "bias")]
    towers = _build_towers(arch, stacks, _align(expected, tensors), {}, layout.architecture, layout.config_source)
    placed = {n for lay in [layout.layers] + [t.layout.layers for t in towers] for lt in lay
              for n in lt.__dict__.values() if isinstance(n, str) and n in tensors}
    skipped = tuple(n for n in layout.skipped if n not in placed and _looks_attention_bias(n) and not _is_mask_buffer(n))
    note = (f"{len(towers)} more attention stack(s) (towers) derived from transformers {arch.transformers_version} "
            f"({arch.model_class}): " + ", ".join(f"{t.name} ({t.kind}, {t.layout.num_layers} blocks)" for t in towers[:4]))
    return replace(layout, towers=tuple(towers), skipped=skipped, notes=layout.notes + (note,))


def _in_tower(b: Block, heads: tuple, gated: bool, by_path: bool = True, audio: tuple = ()) -> bool:
    """Whether an attention block belongs to another stack than the main (text) one: other head counts or
    another q-gate layout, or a vision / audio tower's path (whatever its head counts: a tiny or a real tower
    may have the language model's head sizes, and a tower block whose heads could not be read is not checked
    against the language model's)."""
    if b.heads and (b.heads != heads or b.q_gate != gated):
        return True
    return by_path and (_tower_path(b.path, audio)         # a vision / audio path, a projector's attention too
                        or _under(b.path, audio))          # a speech model's encoder


def _block_order_key(b: Block):
    m = _LAYER.match(b.path)
    return (m.group(1), int(m.group(2)), m.group(3) or "") if m else (b.path, -1, "")


def _record(i: int, b: Block, names: dict, pieces: dict):
    """The LayerTensors of one block (file names of its projections)."""
    from ..model_layout import LayerTensors
    d = {"layer": i, "block": b.path, "group": b.group, "kind": b.kind}
    if b.kind != "none":
        for role, rel in b.roles:
            d[f"{role}_weight"] = names.get(param_name(b.path, rel, "weight"))
            d[f"{role}_bias"] = names.get(param_name(b.path, rel, "bias"))
        d.update(_fused_pieces(b, pieces))
    return LayerTensors(**d)


def _fused_of(arch: DerivedArch, layers) -> str | None:
    """The fused qkv row layout of these layer records' groups (probed), "concat" for pieces joined from a
    Split(dim=0) conversion, None without a fused tensor."""
    groups = {lt.group for lt in layers if lt.qkv_weight or lt.qkv_bias}
    if not groups:
        return None
    probed = {g.fused_layout for g in arch.groups if g.group in groups and g.fused_layout}
    if len(probed) == 1:
        return probed.pop()
    return "concat" if not probed and any(lt.qkv_weight and not lt.q_weight for lt in layers) else None


def _norm_of(arch: DerivedArch, blocks) -> str | None:
    """pre | post of a stack: as traced for its first self-attention group (else its first traced group)."""
    seen = []
    for b in blocks:
        if b.kind != "none" and b.group not in seen:
            seen.append(b.group)
    groups = [g for g in (arch.group(x) for x in seen) if g is not None and g.norm]
    groups.sort(key=lambda g: g.kind != "self")
    return groups[0].norm if groups else None


def _main_name(layers) -> str:
    stacks = []
    for lt in layers:
        if lt.block and lt.kind != "none" and stack_of(lt.block) not in stacks:
            stacks.append(stack_of(lt.block))
    return " + ".join(stacks[:2]) + (" ..." if len(stacks) > 2 else "") if stacks else "text"


def _tower(arch: DerivedArch, stack: str, hs: tuple, members: list, names: dict, pieces: dict, arch_name: str,
           config_source, suffix: str = ""):
    """One tower's layout: its blocks' records with their own head counts and position encoding."""
    from ..model_layout import ModelLayout, PositionEncoding, Tower
    layers = [_record(i, b, names, pieces) for i, b in enumerate(members)]
    root = _root_of(stack, arch.audio)
    pos, pos_how = next(((p, h) for r, p, h in arch.positions if r == root), ("unknown", "not read"))
    h, kv, d = hs if hs else (None, None, None)
    groups = {b.group for b in members}
    gate = None
    if any(b.q_gate for b in members):
        seen = {g.q_gate for g in arch.groups if g.group in groups}
        gate = seen.pop() if len(seen) == 1 and None not in seen else "unknown"
    partial = [g for g in arch.groups if g.group in groups and g.k_class == "partial" and g.pass_dims]
    position = PositionEncoding("rope", partial[0].pass_dims[0] if partial else None, None, None) if pos == "rope" \
        else PositionEncoding(pos)
    kind = tower_kind(stack)
    kind = "audio" if kind in ("text", "other") and _under(stack, arch.audio) else kind   # an adapter stays one
    how = (f"derived from transformers' module tree ({root or '<root>'}: {pos_how}); key-bias facts probed in "
           "float64" + ("" if hs else "; head counts could not be read: biases not split per head"))
    layout = ModelLayout(
        architecture=arch_name, family=None, naming="hf", num_layers=len(layers), num_heads=h, num_kv_heads=kv,
        head_dim=d, hidden_size=None, position=position, norm_placement=_norm_of(arch, members),
        qk_norm=any(b.qk_norm for b in members), fused_layout=_fused_of(arch, layers),
        conv1d=any(b.conv1d for b in members), qk_permuted=False, max_positions=None, softcap=None,
        layers=tuple(layers), notes=(), skipped=(), config_source=config_source, input_norm=None, derived=arch,
        q_gate=gate, tower_name=stack + suffix, tower_kind=kind, tower_how=how)
    return Tower(stack + suffix, kind, layout, how)

