"""A checkpoint's tensor names as transformers loads them (its checkpoint key conversions).

transformers 5 carries, per model type and class, the renaming rules it applies to a file's keys at
load (``conversion_mapping.get_model_conversion_mapping``: ``WeightRenaming`` and ``WeightConverter``
records; EXAONE's ``transformer.h.N.attn.attention.k_proj`` is loaded as Llama's
``model.layers.N.self_attn.k_proj``, Sarvam-MoE's fused ``attention.query_key_value`` is split into
``self_attn.q_proj`` / ``k_proj`` / ``v_proj``).  The rules are read from transformers, never retyped,
and applied with transformers' own ``rename_source_key``, so a file in the original layout resolves as
``from_pretrained`` would load it.

Reports and writers keep the file's own names: the map goes from the file's name to the loaded one,
and a caller only uses it to find which module a file tensor feeds.  One function, :func:`loaded_names`,
also usable for a missing / unexpected key check (lint).  torch and transformers are imported by the
caller's meta-device model, not here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Renamed:
    """How transformers loads one file tensor."""

    file_name: str
    model_name: str             # the model parameter it loads into (a split's first target)
    targets: tuple = ()         # a converter's model parameters, in order (the split's pieces); () for a rename
    op: str | None = None       # the converter's operations ("Split(dim=0)" ...); None for a plain rename

    @property
    def split_rows(self) -> bool:
        """The file tensor is the model parameters concatenated along dim 0 (Split / Chunk on dim 0)."""
        return self.op in ("Split(dim=0)", "Chunk(dim=0)")


def conversions(model) -> list:
    """transformers' weight transforms for ``model`` (a meta-device instance), legacy ones included."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    return list(get_model_conversion_mapping(model, add_legacy=True))


def has_rules(model) -> bool:
    """Whether ``model`` has model-specific key conversions (beyond transformers' legacy gamma/beta ones)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    return bool(get_model_conversion_mapping(model, add_legacy=False))


def _op_names(conv) -> str:
    ops = getattr(conv, "operations", ()) or ()
    return ", ".join(f"{type(o).__name__}(dim={getattr(o, 'dim', '?')})" for o in ops)


def key_renamer(model):
    """``name -> (key in the model's state dict, converter pattern or None)``: where transformers'
    ``from_pretrained`` puts a checkpoint tensor of that name, as ``core_model_loading`` does it
    (every renaming in turn, then at most one converter, the base-model prefix added or stripped as
    the model needs; a key the model already has is not renamed).  Shared by :func:`loaded_names`
    and lint's missing / unexpected key check (``conversion.model_check``)."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    transforms = conversions(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None

    def rename(name: str) -> tuple[str, str | None]:
        new, pattern = rename_source_key(name, renamings, converters, prefix, state)
        if new not in state and name in state:    # as transformers: keep the name, prefix only
            new, pattern = rename_source_key(name, [], [], base_model_prefix=prefix, meta_state_dict=state)
        return new, pattern

    rename.converters = converters
    return rename


def loaded_names(model, names) -> dict[str, Renamed]:
    """``{file name: Renamed}`` for every name of ``names`` that transformers loads under another name
    (or splits); names it loads as they are are left out (:func:`key_renamer`)."""
    rename = key_renamer(model)
    out = {}
    for name in names:
        new, pattern = rename(name)
        if new == name and pattern is None:
            continue
        conv = next((c for c in rename.converters if pattern is not None and pattern in c.source_patterns), None)
        if conv is None:
            out[name] = Renamed(name, new)
            continue
        first = conv.target_patterns[0]
        targets = tuple(new.replace(first, t, 1) for t in conv.target_patterns) if len(conv.target_patterns) > 1 \
            else (new,)
        out[name] = Renamed(name, new, targets, _op_names(conv))
    return out
