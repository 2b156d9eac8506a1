"""The layout records (:class:`ModelLayout` and its parts) and the config helpers both ways of
building one share: :mod:`.resolve` (registry families) and :mod:`.derive.derived` (architectures read
from transformers).  Kept below both, so that neither imports the other to get them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

from . import families as F
from .checked import config_float


@dataclass(frozen=True)
class PositionEncoding:
    type: str                      # rope | absolute | alibi | none | unknown (not declared anywhere)
    rotary_dim: int | None = None
    theta: float | None = None
    pair_layout: str | None = None  # rotate_half | interleaved (rope only)
    axes: int = 1                  # rope: position coordinates the rotation reads (2: an image's rows and
    #                                columns, whose geometry the bounds of arch/rope.py do not cover)

    def to_dict(self) -> dict:
        return {"type": self.type, "rotary_dim": self.rotary_dim, "theta": self.theta,
                "axes": self.axes if self.type == "rope" else None}

    def describe(self, head_dim: int | None) -> str:
        """One line for the tables: ``rope (rotary_dim 64/64, theta 10000, pairs rotate_half)``."""
        if self.type != "rope":
            return self.type
        what = "2-D rope" if self.axes == 2 else "rope" if self.axes == 1 else f"{self.axes}-axis rope"
        parts = [f"rotary_dim {self.rotary_dim}/{head_dim}"] if self.rotary_dim is not None else []
        if self.theta is not None:
            parts.append(f"theta {self.theta:g}")
        if self.pair_layout is not None:
            parts.append(f"pairs {self.pair_layout}")
        return f"{what} ({', '.join(parts)})" if parts else what


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
    # derived layouts (arch/derive/derived.py): one record per attention block, so several per model layer
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
    towers: tuple = ()              # the other attention stacks of the file (Tower), the main one is this layout
    tower_name: str = "text"        # this stack's name (a Tower's layout: its module path)
    tower_kind: str = "text"        # text | vision | audio | projector | other
    tower_how: str = ""             # how this stack was established (registry | derived | probed ...)

    def stacks(self) -> list:
        """(name, kind, layout, how) of every attention stack: this (main) one first, then the towers."""
        return [(self.tower_name, self.tower_kind, self, self.tower_how or
                 ("registry" if self.family and self.derived is None else "derived" if self.derived else "names"))] + \
            [(t.name, t.kind, t.layout, t.how) for t in self.towers]

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
                            "k_class": groups[lt.group].k_class if lt.group in groups else None, "tower": name}
                           for name, _, lay, _ in self.stacks() for lt in lay.layers]}


@dataclass(frozen=True)
class Tower:
    """One more attention stack of a checkpoint (a vision / audio encoder, a projector): its own layout
    (layer records, head counts, position), reported beside the main text stack."""

    name: str                       # module path of its layer list (e.g. model.visual.blocks)
    kind: str                       # vision | audio | projector | text | other
    layout: "ModelLayout"
    how: str                        # how it was found and classified (derived from transformers' module tree ...)


def _get(cfg: dict, keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def rope_params(cfg: dict, path: str | None = None) -> dict:
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


# q_a_proj / q_b_proj / kv_a_proj(_with_mqa) / kv_b_proj: MLA's low-rank query and latent key-value projections
_ATTN_WORDS = re.compile(r"(q_proj|k_proj|v_proj|query|key|value|qkv|c_attn|query_key_value|attn_q|attn_k|attn_v|wq|wk|wv|"
                         r"linear_[qkv]|to_[qkv]|q_[ab]_proj|kv_[ab]_proj)")
# a norm's bias under an attention-like name (Sarvam's query_layernorm, BLOOM's input_layernorm) is no projection bias
_NORM_MODULE = re.compile(r"(norm|^ln_?\d*$|layer_norm|layernorm)", re.I)
# a Q-Former's feed-forward for its query tokens (BLIP-2 / InstructBLIP ``intermediate_query.dense``,
# ``output_query.dense``) is no attention projection
_FFN_QUERY = re.compile(r"(^|\.)(intermediate|output)_query\.")


def _looks_attention_bias(name: str) -> bool:
    """An attention projection bias by its name: ``<q/k/v/qkv-like module>.bias``, or the ``in_proj_bias``
    of a torch ``nn.MultiheadAttention`` (SigLIP's pooling head), whose name does not end in ``.bias``."""
    if name.endswith(".in_proj_bias"):
        return True
    if not name.endswith(".bias"):
        return False
    module = name[:-len(".bias")].rsplit(".", 1)[-1]
    return bool(_ATTN_WORDS.search(name)) and not _NORM_MODULE.search(module) and not _FFN_QUERY.search(name)


def unreported(layout) -> tuple:
    """Attention bias tensors no report row can show: the layout's ``skipped``, and the fused qkv biases of
    a stack whose head counts are unknown (the q / k / v parts cannot be told apart)."""
    out = list(layout.skipped)
    for _, _, lay, _ in layout.stacks():
        if not (lay.num_heads and lay.num_kv_heads and lay.head_dim):
            out += [lt.qkv_bias for lt in lay.layers if lt.qkv_bias]
    return tuple(dict.fromkeys(out))


def unplaced_warning(skipped) -> str | None:
    """The table warning for attention bias tensors no report row holds (issue 27's invariant: every
    attention projection bias is either in a row or named here; lint makes it an error)."""
    if not skipped:
        return None
    return (f"{len(skipped)} attention bias tensor(s) could not be placed (in no row of this report): "
            f"{', '.join(skipped[:5])}" + (" ..." if len(skipped) > 5 else ""))


def _is_mask_buffer(name: str) -> bool:
    # GPT-2's attn.bias / attn.masked_bias are causal-mask buffers, not learned biases.
    return name.endswith(("attn.bias", "attn.masked_bias")) and ".c_attn." not in name
