"""``analyze``'s report record and its table views.

:class:`AnalysisReport` holds every layer's :class:`~.layer_redundancy.LayerRedundancy` and what was
attached to it (bias consumers, measured mode, the distance profile); ``to_dict`` is the JSON.  Its
table has four views, each a function below, one chosen by :meth:`AnalysisReport.rows`: per layer
(:func:`layer_rows`, a tower column when there are several attention stacks), per kv head
(:func:`head_rows`, ``per_head``), per bias (the consumers' rows, ``by_bias``) and the distance
profile's rows when it was computed.  A new column goes into :func:`layer_rows` (and, if it is
new data, into the record and its ``to_dict``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..arch.resolve import LayoutSummary
from ..arch.rope import RopeGeometry
from ..checkpoint import heads_cell
from ..records import finite_or_none as _f
from .layer_redundancy import LayerRedundancy


def _nothing_removable(lr: LayerRedundancy) -> bool:
    """A key bias with no exact and no near-redundant part (every dim rotated, no near pair; q/k-norm)."""
    return lr.has_k_bias and not lr.exact_fraction and not lr.near_fraction


@dataclass(frozen=True, eq=False)
class AnalysisReport(LayoutSummary):
    """``ckpt-surgeon analyze``: per-layer (and per kv head) key/value/query-bias verdicts (the
    layout's summary fields inherited from :class:`~ckpt_surgeon.arch.resolve.LayoutSummary`)."""

    source: str
    format: str
    input_norm: str | None
    context: int | None
    context_source: str
    epsilon: float
    attn_scale: float | None
    rope: RopeGeometry | None
    layers: tuple
    notes: tuple = ()
    warnings: tuple = ()
    bytes_read: int = 0
    measured: object | None = None      # measure.MeasuredReport when --measure ran
    per_head: bool = False              # rows(): one row per kv head instead of per layer
    consumers: object | None = None     # consumers.ConsumerReport: every bias, its consumer, removable share
    by_bias: bool = False               # rows(): one row per bias (consumers) instead of per layer
    facts: tuple = ()                   # how each architecture fact was established (registry | derived | probed)
    derivation: dict | None = None      # derived layouts: attention blocks per layer, their groups' classes
    distance_profile: object | None = None   # distance_profile.DistanceProfile with --distance-profile: its rows
    towers: tuple = ()                  # (name, kind, how, layers) per attention stack, the main one first
    tower_shapes: tuple = ()            # per stack of ``towers``: {num_heads, num_kv_heads, head_dim, position_encoding,
    #                                     norm_placement} (the stack's own)
    missing_config: str | None = None   # where config.json was looked for, when an HF source has none

    # -- views ---------------------------------------------------------------------------------
    def layer(self, i: int) -> LayerRedundancy:
        return self.layers[i]

    def class_counts(self) -> dict:
        out: dict = {}
        for lr in self.layers:
            if lr.has_k_bias:
                out[lr.k_class] = out.get(lr.k_class, 0) + 1
        return out

    @property
    def flags(self) -> list[dict]:
        out = [{"layer": lr.layer, "flag": f.split(":", 1)[0], "message": f} for lr in self.layers for f in lr.flags]
        if self.consumers is not None:
            out += [{"layer": None, "flag": f.split(":", 1)[0], "message": f} for f in self.consumers.flags]
        return out

    def to_dict(self) -> dict:
        d = {"source": self.source, "format": self.format, **self.summary_dict(), "norm_placement": self.norm_placement,
             "input_norm": self.input_norm, "qk_norm": self.qk_norm, "context": self.context,
             "context_source": self.context_source, "epsilon": self.epsilon, "attn_scale": _f(self.attn_scale),
             "rope": self.rope.to_dict() if self.rope else None, "class_counts": self.class_counts(),
             "layers": [lr.to_dict() for lr in self.layers], "flags": self.flags,
             "notes": list(self.notes), "warnings": list(self.warnings), "bytes_read": self.bytes_read,
             "measured": self.measured.to_dict() if self.measured is not None else None,
             "bias_consumers": self.consumers.to_dict() if self.consumers is not None else None,
             "facts": list(self.facts), "derivation": self.derivation, "missing_config": self.missing_config,
             "towers": [{"name": n, "kind": k, "how": how, "num_layers": len(ls),
                         **(self.tower_shapes[i] if i < len(self.tower_shapes) else {}),
                         "class_counts": _counts(ls), "layers": [lr.to_dict() for lr in ls]}
                        for i, (n, k, how, ls) in enumerate(self.towers)]}
        if self.distance_profile is not None:
            d["distance_profile"] = self.distance_profile.to_dict()
        return d

    def rows(self) -> list[dict]:
        """Flat rows for table/csv/markdown/``to_frame``: per layer, or per kv head with ``per_head``,
        or per bias (consumer and removable share) with ``by_bias``; the distance profile's rows when
        it was computed."""
        if self.by_bias and self.consumers is not None:
            return self.consumers.rows()
        if self.distance_profile is not None:
            return replace(self.distance_profile, per_head=self.per_head).rows()
        mrows = {r["layer"]: r for r in self.measured.rows()} if self.measured is not None else {}
        if self.per_head:
            return head_rows(self.layers, mrows)
        return layer_rows(self.layers, mrows, self.towers)

    def csv_rows(self) -> list[dict]:
        """CSV rows: :meth:`rows`, or the distance profile in long form (one row per layer, head,
        term and distance) when it was computed."""
        return self.distance_profile.long_rows() if self.distance_profile is not None else self.rows()

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())

    def summary_items(self) -> list[tuple[str, str]]:
        pe = self.position
        pos = pe.describe(self.head_dim)
        if pe.type == "rope":
            if self.rope and self.rope.rope_type != "default":
                pos += f", scaling {self.rope.rope_type} (attention factor {self.rope.attention_factor:g})"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.class_counts().items())) or "no layer has a key bias"
        bounds = [lr.bound for lr in self.layers if lr.bound is not None and lr.has_k_bias
                  and not _nothing_removable(lr)]
        vb = [lr.v_bias for lr in self.layers if lr.v_bias is not None]
        items = [
            ("source", f"{self.source} ({self.format})"),
            ("architecture", heads_cell(self.missing_config) or self.architecture + (
                f" [registry: {self.family}]" if self.family else
                " [derived from transformers, probed]" if self.derivation else " [not in registry]")),
            ("heads / kv heads / head_dim", heads_cell(self.missing_config) or
             f"{self.num_heads} / {self.num_kv_heads} / {self.head_dim}"),
            ("position encoding", pos),
            ("norm placement / input norm", f"{self.norm_placement or 'unknown'} / {self.input_norm or ('none' if self.norm_placement == 'post' else 'unknown')}"),
            ("attention scale", f"{self.attn_scale:.6g}" if self.attn_scale is not None and math.isfinite(self.attn_scale) else "-"),
            ("context L", f"{self.context} ({self.context_source})" if self.context else f"unknown ({self.context_source})"),
            ("epsilon (rad)", f"{self.epsilon:g}: near-redundant pairs turn less than this over L"),
            ("key-bias classes", counts),
            ("max bound (exact + near removed)", f"{max(bounds):.4g} logit" if bounds else
             "- (no layer has a removable part)" if any(lr.has_k_bias for lr in self.layers) else "-"),
            ("value bias", ("foldable into the output bias in every layer" if vb and all(v.foldable for v in vb) else
                            vb[0].reason if vb else "none")),
        ]
        for i, (n, k, _, ls) in enumerate(self.towers[1:], 1):
            sh = self.tower_shapes[i] if i < len(self.tower_shapes) else {}
            shape = (f"heads {sh['num_heads']} / {sh['num_kv_heads']} / {sh['head_dim']}, position "
                     f"{sh['position_encoding']['type']}, {sh['norm_placement'] or 'unknown'}-norm, " if sh else "")
            items.append((f"tower {n}", f"{k}: {len(ls)} block(s), {shape}key-bias classes "
                                        + (", ".join(f"{c} {v}" for c, v in sorted(_counts(ls).items()))
                                           or "no block has a key bias")))
        if self.consumers is not None:
            items += self.consumers.summary_items()
        if self.measured is not None:
            items += self.measured.summary_items()
        if self.distance_profile is not None:
            items += self.distance_profile.summary_items()
        items.append(("bytes read", f"{self.bytes_read:,}"))
        return items


def _counts(layers) -> dict:
    out: dict = {}
    for lr in layers:
        if lr.has_k_bias:
            out[lr.k_class] = out.get(lr.k_class, 0) + 1
    return out


# -- the table views ---------------------------------------------------------------------------------

def head_rows(layers, mrows: dict) -> list[dict]:
    """One row per kv head (``--per-head``); a layer without per-head figures keeps its layer row."""
    rows = []
    for lr in layers:
        if not lr.heads:
            rows.append(_layer_row(lr, mrows.get(lr.layer, {})))
            continue
        for h in lr.heads:
            rows.append({"layer": lr.layer, "kv_head": h.kv_head, "class": lr.k_class,
                         "k_l2": h.k_bias_l2, "exact": h.exact_fraction, "near": h.near_fraction,
                         "rest": h.rest_fraction, "bound": h.bound, "bound_all": h.bound_all})
            if _nothing_removable(lr):
                rows[-1].update(exact=None, near=None, bound=None)
    return rows


def layer_rows(layers, mrows: dict, towers=()) -> list[dict]:
    """One row per layer, the measured columns (``mrows``: layer -> measured row) beside it; with
    several attention stacks a ``tower`` column, the main stack's rows first (measured: main only)."""
    if len(towers) > 1:
        return [{"tower": n, **r} for i, (n, _, _, ls) in enumerate(towers)
                for r in layer_rows(ls, mrows if i == 0 else {})]
    return [_layer_row(lr, mrows.get(lr.layer, {})) for lr in layers]


def _layer_row(lr: LayerRedundancy, measured: dict) -> dict:
    n_pairs = 0 if lr.pairs is None else lr.pairs.shape[0]
    # Short column names (the table must fit a terminal); JSON keeps the long ones.
    row = {"layer": lr.layer, "class": lr.k_class if lr.has_k_bias else "no k bias",
           "k_l2": lr.k_bias_l2, "exact": lr.exact_fraction, "near": lr.near_fraction,
           "rest": lr.rest_fraction, "near_pairs": f"{len(lr.near_pairs)}/{n_pairs}" if n_pairs else None,
           "bound": lr.bound, "bound_all": lr.bound_all,
           "q_l2": lr.q_bias.l2 if lr.q_bias else None,
           "v_fold": (None if lr.v_bias is None else lr.v_bias.foldable),
           "flags": ", ".join(sorted({f.split(":", 1)[0] for f in lr.flags})) or None}
    if _nothing_removable(lr):
        # as inspect: "-", not "0 / 0 / 0", which reads as "removing it is free" (to_dict keeps them)
        row.update(exact=None, near=None, bound=None)
    for k, v in measured.items():
        if k != "layer":
            row[k] = v
    return row
