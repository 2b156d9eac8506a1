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
2. **Probed** (:mod:`ckpt_surgeon.arch.probe`): what cannot be read statically (is the key
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

from ..errors import CkptError
from ..formats.safe_input import read_json
from ..publish import write_file_atomic
from ..userdirs import user_cache
# re-exported too: tests and fixtures import the module-tree reader from here
from .modtree import (  # noqa: F401
    Block,
    DeriveUnavailable,
    Fact,
    GroupFacts,
    _LAYER,
    _TOWER,
    _int_attr,
    _libs,
    build_meta,
    config_object,
    model_class,
    module_path,
    read_blocks,
    static_position,
)

CACHE_ENV = "CKPT_SURGEON_CACHE_DIR"
CACHE_VERSION = 2
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
        return cls(**dict(d, blocks=blocks, groups=groups, facts=facts(d["facts"]), notes=tuple(d["notes"])))


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
    rotary_dim = None
    if pos == "rope" and heads:
        from .model_layout import _rope_params
        rp = _rope_params(cfg)
        rotary_dim = int(cfg.get("rotary_dim") or int(heads[2] * rp["partial"]))
    from .probe import probe_groups
    # only attention with q/k/v biases has facts to probe (the module tree says whether it has)
    biased = any(getattr(model.get_submodule(module_path(b.path, rel)), "bias", None) is not None
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
        facts=tuple(facts), notes=notes, seconds=round(time.perf_counter() - t0, 3))
    if use_cache and probe:
        _cache_store(path, arch)
    return arch


def main_heads(attn) -> tuple:
    """(H, kv, head_dim) of the layout: the first attention block outside a vision / audio tower
    (the language model, which the text-only probe runs), else the first with head counts."""
    with_heads = [b for b in attn if b.heads]
    text = [b for b in with_heads if not _TOWER.search(b.path)]
    return (text or with_heads or [Block("", "", "none")])[0].heads


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
    from .model_layout import LayerTensors, ModelLayout, PositionEncoding, _rope_params
    try:
        arch = derive(cfg)
    except DeriveUnavailable:
        return None
    heads = (arch.num_heads, arch.num_kv_heads, arch.head_dim)
    expected = []
    for b in arch.blocks:
        for _, rel in b.roles:
            base = module_path(b.path, rel)
            expected += [f"{base}.weight", f"{base}.bias"]
    names = _align(expected, tensors)
    layers, notes, other = [], list(arch.notes), []
    gated = next((b.q_gate for b in arch.blocks if b.kind != "none" and b.heads == heads), False)
    for i, b in enumerate(arch.blocks):
        d = {"layer": i, "block": b.path, "group": b.group, "kind": b.kind}
        if b.kind != "none" and b.heads and (b.heads != heads or b.q_gate != gated):
            other.append(b.path)
        elif b.kind != "none":
            for role, rel in b.roles:
                base = module_path(b.path, rel)
                d[f"{role}_weight"] = names.get(f"{base}.weight")
                d[f"{role}_bias"] = names.get(f"{base}.bias")
        layers.append(LayerTensors(**d))
    if other:
        notes.append(f"{len(other)} attention block(s) have other head counts than {heads} (or another q-gate "
                     "layout) and are not analysed: " + ", ".join(other[:3]))
    q_gate = None
    if gated:   # one query-row layout for the model: the one the probe established, else "unknown"
        seen = {g.q_gate for g in arch.groups if g.kind != "none" and any(b.group == g.group and b.q_gate
                                                                          for b in arch.blocks)}
        q_gate = seen.pop() if len(seen) == 1 and None not in seen else "unknown"
    partial = [g for g in arch.groups if g.k_class == "partial" and g.pass_dims]
    rotary_dim = partial[0].pass_dims[0] if partial else arch.rotary_dim
    if arch.position == "rope":
        position = PositionEncoding("rope", rotary_dim, _rope_params(cfg)["theta"], None)
    else:
        position = PositionEncoding(arch.position)
    fused = next((g.fused_layout for g in arch.groups if g.fused_layout), None)
    placed = {n for lt in layers for n in lt.__dict__.values() if isinstance(n, str) and n in tensors}
    how = (f"architecture {arch_name!r} is not in the registry" if family is None else
           f"registry family {family.name!r} has latent attention")
    notes.insert(0, f"{how}: its attention layout was derived from "
                    f"transformers {arch.transformers_version} ({arch.model_class}) and its key/value-bias facts "
                    f"probed in float64" + (" (cached)" if arch.cached else f" ({arch.seconds:.1f} s)"))
    if family is not None and family.bias_note:
        notes.insert(1, family.bias_note)
    from .model_layout import _get, _looks_attention_bias, _is_mask_buffer
    from . import families as F
    skipped = tuple(sorted(n for n in tensors if n not in placed and _looks_attention_bias(n) and not _is_mask_buffer(n)))
    return ModelLayout(
        architecture=arch_name, family=family.name if family is not None else None, naming="hf", num_layers=len(layers), num_heads=heads[0],
        num_kv_heads=heads[1], head_dim=heads[2], hidden_size=arch.hidden_size, position=position,
        norm_placement=None, qk_norm=any(b.qk_norm for b in arch.blocks), fused_layout=fused,
        conv1d=any(b.conv1d for b in arch.blocks), qk_permuted=False,
        max_positions=_get(cfg, F.CONFIG_KEYS["max_positions"]), softcap=None, layers=tuple(layers),
        notes=tuple(notes), skipped=skipped, config_source=config_source, input_norm=None, derived=arch,
        q_gate=q_gate)

