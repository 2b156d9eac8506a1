"""``inspect``: what a checkpoint contains, with per-layer q/k/v bias statistics.

Reads headers plus the bias vectors only (a few hundred KB for a 7B model), in
float64.  Returns an :class:`InspectReport` whose ``to_dict()`` is the JSON
contract documented in docs/inspect.md (extend it, never rename keys).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..arch.layouts import qkv_row_index
from ..arch.resolve import LayoutSummary, ModelLayout, PositionEncoding
from ..checkpoint import Checkpoint, heads_cell, open_checkpoint
from ..records import finite_or_none as _finite_or_none
from .memory import memory_figures
from .quant import quant_summary

# Extras whose per-layer row shows only these keys, under short column names.
_ROW_COLUMNS = {"k_bias_redundancy": {"class": "k_class", "exact_fraction": "k_exact", "near_fraction": "k_near",
                                      "bound": "k_bound"}}

_NON_PARAM_DTYPES = {"BOOL", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64"}


@dataclass(frozen=True)
class BiasStats:
    """Norms of one bias vector (float64).  ``per_head_l2`` has one entry per head of that role."""

    l2: float | None
    max_abs: float | None
    per_head_l2: tuple | None
    nonfinite: int = 0
    missing: bool = False
    reason: str | None = None
    tensor: str | None = None
    dtype: str | None = None

    def to_dict(self) -> dict:
        d = {"l2": _finite_or_none(self.l2), "max_abs": _finite_or_none(self.max_abs),
             "per_head_l2": None if self.per_head_l2 is None else [_finite_or_none(x) for x in self.per_head_l2],
             "tensor": self.tensor, "dtype": self.dtype}
        d["nonfinite"] = self.nonfinite      # always present: the JSON contract lists it (0: none)
        if self.missing:
            d["missing"] = True
            d["reason"] = self.reason
        return d


def bias_stats(vec: np.ndarray | None, n_heads: int | None, head_dim: int | None, tensor: str, dtype: str) -> BiasStats:
    v = np.asarray(vec, dtype=np.float64).reshape(-1)
    bad = int(np.count_nonzero(~np.isfinite(v)))
    per_head = None
    if n_heads and head_dim and v.size == n_heads * head_dim:
        per_head = tuple(float(x) for x in np.sqrt((v.reshape(n_heads, head_dim) ** 2).sum(axis=1)))
    return BiasStats(l2=float(np.sqrt((v ** 2).sum())), max_abs=float(np.abs(v).max()) if v.size else 0.0,
                     per_head_l2=per_head, nonfinite=bad, tensor=tensor, dtype=dtype)


@dataclass(frozen=True)
class LayerReport:
    layer: int
    q_bias: BiasStats | None
    k_bias: BiasStats | None
    v_bias: BiasStats | None
    fused_qkv: bool
    o_bias: bool = False
    q_norm: bool = False
    k_norm: bool = False
    extra: dict = field(default_factory=dict)   # later analyses add keys here (e.g. k_bias_redundancy)

    @property
    def has_qkv_bias(self) -> bool:
        return any(b is not None for b in (self.q_bias, self.k_bias, self.v_bias))

    def to_dict(self) -> dict:
        d = {"layer": self.layer,
             "q_bias": self.q_bias.to_dict() if self.q_bias else None,
             "k_bias": self.k_bias.to_dict() if self.k_bias else None,
             "v_bias": self.v_bias.to_dict() if self.v_bias else None,
             "fused_qkv": self.fused_qkv, "o_bias": self.o_bias, "q_norm": self.q_norm, "k_norm": self.k_norm}
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class TowerReport:
    """One attention stack of the checkpoint (the main text stack, a vision / audio tower, a projector)."""

    name: str
    kind: str
    how: str
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    position: PositionEncoding
    norm_placement: str | None
    fused_layout: str | None
    layers: tuple                 # LayerReport, one per attention block of the stack
    layers_with_qkv_bias: int

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "num_layers": len(self.layers), "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "position_encoding": self.position.to_dict(), "norm_placement": self.norm_placement,
                "fused_layout": self.fused_layout, "how": self.how,
                "layers_with_qkv_bias": self.layers_with_qkv_bias, "layers": [lr.to_dict() for lr in self.layers]}

    def summary(self) -> str:
        pos = self.position.describe(self.head_dim)
        return (f"{self.kind}: {len(self.layers)} block(s), heads {self.num_heads} / {self.num_kv_heads} / "
                f"{self.head_dim}, position {pos}, {self.norm_placement or 'unknown'}-norm, with qkv bias "
                f"{self.layers_with_qkv_bias} of {len(self.layers)}")


@dataclass(frozen=True)
class InspectReport(LayoutSummary):
    """``ckpt-surgeon inspect`` (the layout's summary fields inherited from
    :class:`~ckpt_surgeon.arch.resolve.LayoutSummary`)."""

    source: str
    format: str
    fused_layout: str | None
    max_positions: int | None
    parameter_count: int
    dtypes: dict
    layers: tuple
    layers_with_qkv_bias: int
    bias_parameters: int
    bias_share: float
    notes: tuple = ()
    warnings: tuple = ()
    skipped: tuple = ()
    missing: tuple = ()           # (tensor, reason): bias statistics that could not be computed, then every
                                  # other tensor whose data lies past the end of a truncated file
    missing_bytes: int = 0
    file_metadata: dict = field(default_factory=dict)
    tensor_types: dict = field(default_factory=dict)   # GGUF: tensor -> quantization type
    bytes_read: int = 0
    requests: int = 0
    num_tensors: int = 0
    memory: object = None          # MemoryFigures (analysis/memory.py): weight bytes per dtype, KV cache
    facts: tuple = ()             # how each architecture fact was established (registry | derived | probed)
    derivation: dict | None = None  # derived layouts: attention blocks per layer and their groups' classes
    quantization: object = None     # QuantSummary (analysis/quant.py) of a quantized checkpoint, else None
    towers: tuple = ()            # TowerReport per attention stack, the main (top-level ``layers``) one first
    missing_config: str | None = None   # where config.json was looked for, when an HF source has none
    tokenizer: object = None        # TokenizerRecord (analysis/tokenizer): the tokenizer and chat template(s)
    tokenizer_note: str | None = None   # why there is no tokenizer section

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def position_encoding(self) -> PositionEncoding:
        """``position`` under the name of its JSON key."""
        return self.position

    @property
    def key_bias_tensors(self) -> dict:
        """{stack name: key-bias tensors placed in it} over every attention stack, the main one first (a
        fused qkv bias holds one layer's key bias).  ``layers_with_qkv_bias`` counts the main stack only:
        issue 36 item 8, Phi-4-multimodal's 0 text layers with a bias beside 52 key biases in its towers,
        is what this total (and the summary line that shows it) answers."""
        stacks = [(t.name, t.layers) for t in self.towers] or [("model", self.layers)]
        return {name: sum(1 for lr in layers if lr.k_bias is not None) for name, layers in stacks}

    def to_dict(self) -> dict:
        """The JSON contract: extend it, don't rename it."""
        return {
            "source": self.source, "format": self.format, **self.summary_dict(),
            "qk_norm": self.qk_norm, "norm_placement": self.norm_placement,
            "fused_layout": self.fused_layout, "max_positions": self.max_positions,
            "parameter_count": self.parameter_count, "dtypes": dict(self.dtypes), "num_tensors": self.num_tensors,
            "layers_with_qkv_bias": self.layers_with_qkv_bias, "bias_parameters": self.bias_parameters,
            "bias_share": self.bias_share,
            "key_bias_tensors": sum(self.key_bias_tensors.values()),
            "layers": [lr.to_dict() for lr in self.layers],
            "notes": list(self.notes), "warnings": list(self.warnings), "skipped": list(self.skipped),
            "missing": [{"tensor": t, "reason": r} for t, r in self.missing], "missing_bytes": self.missing_bytes,
            "file_metadata": dict(self.file_metadata), "tensor_types": dict(self.tensor_types),
            "bytes_read": self.bytes_read, "requests": self.requests,
            "memory": self.memory.to_dict() if self.memory is not None else None,
            "facts": list(self.facts), "derivation": self.derivation, "missing_config": self.missing_config,
            "quantization": self.quantization.to_dict() if self.quantization is not None else None,
            "towers": [t.to_dict() for t in self.towers],
            # the record without where it was read (the report's own source): the same model reads alike from
            # any copy of it (a split set's parts, a Hub repo and its local copy)
            "tokenizer": {k: v for k, v in self.tokenizer.to_dict().items() if k not in ("source", "files")}
            if self.tokenizer is not None else None,
            "tokenizer_note": self.tokenizer_note,
        }

    def to_frame(self):
        """Per-layer table (one row per layer) as a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame(self.rows())

    def rows(self) -> list[dict]:
        """Per-layer rows (flat dicts): what ``to_frame`` and the csv/markdown renderers show.  With more than
        one attention stack, a ``tower`` column names each row's stack (the main one's rows first)."""
        if len(self.towers) <= 1:
            return self._rows(self.layers)
        out = []
        for t in self.towers:
            out += [{"tower": t.name, **r} for r in self._rows(t.layers)]
        return out

    def table_rows(self) -> list[dict]:
        """The human table's rows: :meth:`rows` with each run of 3+ consecutive layers that agree in
        every other column folded into one row "first–last" (issue 36: a model without biases gave
        30 rows of "-").  CSV, Markdown and JSON keep one row per layer."""
        out: list[dict] = []
        for r in self.rows():
            rest = {k: v for k, v in r.items() if k != "layer"}
            last = out[-1] if out else None
            if last is not None and {k: v for k, v in last.items() if k not in ("layer", "_last")} == rest and \
                    isinstance(r["layer"], int) and last["_last"] == r["layer"] - 1:
                last["_last"] = r["layer"]
            else:
                out.append({**r, "_last": r["layer"]})
        folded = []
        for r in out:
            first, end = r["layer"], r.pop("_last")
            if isinstance(first, int) and end - first >= 2:
                folded.append({**r, "layer": f"{first}–{end}"})
            else:
                folded += [{**r, "layer": i} for i in range(first, end + 1)] if isinstance(first, int) else [r]
        return folded

    def _rows(self, layers) -> list[dict]:
        rows = []
        for lr in layers:
            row = {"layer": lr.layer, "fused_qkv": lr.fused_qkv, "o_bias": lr.o_bias}
            for role in ("q", "k", "v"):
                b = getattr(lr, f"{role}_bias")   # absent: None ("-" in tables); NaN values: NaN ("NaN")
                row[f"{role}_bias_l2"] = b.l2 if b else None
                row[f"{role}_bias_max_abs"] = b.max_abs if b else None
            for k, v in lr.extra.items():
                short = _ROW_COLUMNS.get(k)
                if short is not None:
                    # compact columns (epsilon / context are per model: shown in the summary)
                    for kk, col in short.items():
                        row[col] = v.get(kk) if isinstance(v, dict) else None
                    if k == "k_bias_redundancy" and isinstance(v, dict) and not v.get("exact_fraction") \
                            and not v.get("near_fraction"):
                        # Nothing is removable (every dim rotated, q/k-norm ...): "-" in the table, not
                        # "0 / 0 / 0", which would read as "removing it is free".  to_dict keeps the numbers.
                        row.update(k_exact=None, k_near=None, k_bound=None)
                elif isinstance(v, dict):
                    for kk, vv in v.items():
                        if not isinstance(vv, (list, dict)):
                            row[f"{k}.{kk}"] = vv
                elif not isinstance(v, list):
                    row[k] = v
            rows.append(row)
        return rows

    def summary_items(self) -> list[tuple[str, str]]:
        pe = self.position_encoding
        pos = pe.describe(self.head_dim)
        dt = ", ".join(f"{k} {v / max(self.parameter_count, 1):.1%}" for k, v in sorted(self.dtypes.items(), key=lambda kv: -kv[1]))
        return [
            ("source", f"{self.source} ({self.format})"),
            ("architecture", heads_cell(self.missing_config) or f"{self.architecture}" + (
                f" [registry: {self.family}]" if self.family else
                " [derived from transformers, probed]" if self.derivation else " [not in registry]")),
            ("layers", str(self.num_layers)),
            ("heads / kv heads / head_dim", heads_cell(self.missing_config) or (
                "none: no layer has attention" if _attention_free(self.memory) else
                f"{self.num_heads} / {self.num_kv_heads} / {self.head_dim}")),
            ("position encoding", pos),
            ("norm placement", self.norm_placement or "unknown"),
            ("q/k-norm", "yes" if self.qk_norm else "no"),
            ("fused qkv", self.fused_layout or "no"),
            ("parameters", f"{self.parameter_count:,}"),
            ("dtype mix", dt or "-"),
            *(self.quantization.summary_items() if self.quantization is not None else ()),
            ("layers with qkv bias", f"{self.layers_with_qkv_bias} of {self.num_layers}"),
            *self._key_bias_summary(),
            ("qkv bias parameters", f"{self.bias_parameters:,} ({self.bias_share:.4%} of parameters"
                                    + (", every stack)" if len(self.towers) > 1 else ")")),
            ("bytes read", f"{self.bytes_read:,}" + (f" in {self.requests} request(s)" if self.requests else "")),
        ] + [(f"tower {t.name}", t.summary()) for t in self.towers[1:]] + self._file_summary() + \
            self._tokenizer_summary() + \
            self._redundancy_summary() + (
            self.memory.summary_items() if self.memory is not None else [])

    def _tokenizer_summary(self) -> list[tuple[str, str]]:
        if self.tokenizer is None:
            return [("tokenizer", self.tokenizer_note)] if self.tokenizer_note else []
        t = self.tokenizer.summary()
        fam = t["template_family"]
        templates = "none" if not t["templates"] else ", ".join(t["templates"]) + (
            f" (llama.cpp renders it as its built-in '{fam}')" if fam and fam != "unrecognised" and
            not fam.startswith("unknown") else
            " (no llama.cpp built-in renders it: llama.cpp needs --jinja)" if fam == "unrecognised" else "")
        return [("tokenizer", f"{t['kind']}, {t['size']:,} tokens" + (
                    f", pre-tokenizer {t['pre_tokenizer']}" if t["pre_tokenizer"] else "")),
                ("special tokens", ", ".join(f"{k} {v}" for k, v in t["specials"].items()) or "none"),
                ("end of generation", ", ".join(t["eog"]) or "none"),
                ("adds BOS", "yes" if t["add_bos"] else "no"),
                ("chat templates", templates)]

    def _key_bias_summary(self) -> list[tuple[str, str]]:
        """With towers: the key-bias tensors of every stack, so that a count over the whole model's attention
        modules meets one figure (the line above counts the main stack's layers only)."""
        if len(self.towers) <= 1:
            return []
        per = self.key_bias_tensors
        kinds = {t.name: t.kind for t in self.towers}
        return [("key-bias tensors", f"{sum(per.values())} in all stacks (" + ", ".join(
            f"{kinds[n]} {c}" for n, c in per.items()) + "); the line above counts the "
            f"{self.towers[0].kind} stack's layers only")]

    def _file_summary(self) -> list[tuple[str, str]]:
        """GGUF / Hub file metadata (general.name, file type, tokenizer ...), one line."""
        fm = {k: v for k, v in self.file_metadata.items() if v not in (None, "", [], {})}
        if not fm:
            return []
        return [("file metadata", ", ".join(f"{k}={v}" for k, v in fm.items()))]

    def _redundancy_summary(self) -> list[tuple[str, str]]:
        red = [lr.extra.get("k_bias_redundancy") for lr in self.layers if lr.extra.get("k_bias_redundancy")]
        if not red:
            return []
        over = (f"{red[0]['context']} positions" if red[0]['context'] else
                "the context (unknown: no max positions in the config)")
        return [("k-bias redundancy", f"k_exact / k_near: energy shares removable exactly / with pairs turning "
                                      f"< {red[0]['epsilon']:g} rad over {over}; "
                                      "k_bound: max logit change (analyze computes it where W_q is needed)")]


def _split_fused_bias(vec: np.ndarray, layout: ModelLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    iq, ik, iv = qkv_row_index(layout.fused_layout or "concat", layout.num_heads, layout.num_kv_heads, layout.head_dim)
    v = vec.reshape(-1)
    return v[iq], v[ik], v[iv]


_PAST_END = "data lies past the end of the (truncated) file"


def _read_bias(ck: Checkpoint, name: str, missing: list):
    info = ck.tensors[name]
    if info.missing:
        missing.append((name, _PAST_END))
        return None
    return ck.read(name)


def _layer_biases(ck: Checkpoint, layout: ModelLayout, lt, missing: list, warnings: list) -> tuple[dict, object, int]:
    """One layer's q/k/v bias statistics (a fused qkv bias split by the layout), its key-bias
    vector (None where absent or unreadable) and its number of bias parameters."""
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    stats = {"q": None, "k": None, "v": None}
    heads = {"q": h, "k": kv, "v": kv}
    k_vec = None   # the key bias, for k_bias_redundancy (bias vector only: no weights read)
    nbias = 0

    def miss_stat(name):
        return BiasStats(None, None, None, missing=True, tensor=name, reason=_PAST_END, dtype=ck.tensors[name].dtype)

    if lt.qkv_bias:
        info = ck.tensors[lt.qkv_bias]
        nbias += info.numel
        vec = _read_bias(ck, lt.qkv_bias, missing)
        if vec is None:
            stats = {r: miss_stat(lt.qkv_bias) for r in stats}
        elif h and kv and d:
            for role, part in zip(("q", "k", "v"), _split_fused_bias(vec, layout)):
                stats[role] = bias_stats(part, heads[role], d, lt.qkv_bias, info.dtype)
                if role == "k":
                    k_vec = part
        else:
            warnings.append(f"layer {lt.layer}: fused bias {lt.qkv_bias} found but head counts are unknown; not split")
    for role in ("q", "k", "v"):
        name = getattr(lt, f"{role}_bias")
        if not name:
            continue
        info = ck.tensors[name]
        nbias += info.numel
        vec = _read_bias(ck, name, missing)
        stats[role] = miss_stat(name) if vec is None else bias_stats(vec, heads[role], d, name, info.dtype)
        if role == "k":
            k_vec = vec
    return stats, k_vec, nbias


def _parameter_counts(ck: Checkpoint, layout: ModelLayout) -> tuple[int, dict]:
    """Parameters in all and per dtype (saved buffers such as causal masks not counted)."""
    params, dtypes = 0, {}
    mask_like = set(layout.buffers)
    q = ck.quantization
    for name, info in ck.tensors.items():
        if info.dtype in _NON_PARAM_DTYPES or name in mask_like:
            continue
        params += info.numel
        # a quantized weight counts its logical elements, under its scheme (not the F32 it reads as)
        label = f"{q.method} {q.tensors[name].bits}-bit" if info.quantized and q is not None and name in q.tensors \
            else info.dtype
        dtypes[label] = dtypes.get(label, 0) + info.numel
    return params, dtypes


def inspect_checkpoint(ck: Checkpoint, memory=None) -> InspectReport:
    """``memory``: a :class:`.memory.MemoryOptions` (context, batch, cache types, devices), default 1,000 tokens."""
    layout = ck.layout()
    missing: list = []
    warnings = list(ck.warnings)
    from ..arch.model_layout import unplaced_warning, unreported
    if unplaced_warning(unreported(layout)):      # issue 27: no attention bias left unsaid
        warnings.append(unplaced_warning(unreported(layout)))
    layer_reports = []
    bias_params = 0
    # Remote sources fetch everything read below in one batch (local readers ignore this): the
    # bias vectors only; q/k-norm weights are reported by presence, their values are not read.
    stacks = layout.stacks()
    ck.prefetch([n for _, _, lay, _ in stacks for lt in lay.layers
                 for n in (lt.qkv_bias, lt.q_bias, lt.k_bias, lt.v_bias) if n])
    from .layer_redundancy import sink_layers
    sinks = sink_layers(ck.tensors)
    towers = []
    for i, (name, kind, lay, how) in enumerate(stacks):
        reports, nbias = _stack_reports(ck, lay, missing, warnings, sinks if i == 0 else set(),
                                        "" if i == 0 else f"tower {name} ")
        bias_params += nbias
        if i == 0:
            layer_reports = reports
        towers.append(TowerReport(name, kind, how, lay.num_heads, lay.num_kv_heads, lay.head_dim, lay.position,
                                  lay.norm_placement, lay.fused_layout, tuple(reports),
                                  sum(1 for lr in reports if lr.has_qkv_bias)))
    listed = {t for t, _ in missing}
    missing.extend((n, _PAST_END) for n, i in sorted(ck.tensors.items(), key=lambda kv: (kv[1].file, kv[1].start))
                   if i.missing and n not in listed)
    notes = layout.notes
    if ck.missing_config:
        # say what is missing, not "unknown architecture" (the registry is not the problem)
        warnings.insert(0, ck.missing_config_warning())
        notes = tuple(n for n in notes if "is not in the registry" not in n)
    params, dtypes = _parameter_counts(ck, layout)
    tensor_types = {n: i.dtype for n, i in ck.tensors.items()} if ck.naming == "gguf" else {}
    file_metadata = dict(getattr(ck, "file_summary", None) or {})
    mem = memory_figures(ck.stored_tensors, ck.config, layout, memory, ck.metadata if ck.naming == "gguf" else None)
    summary = layout.summary()
    if _attention_free(mem):
        # no layer caches K / V (all Mamba / recurrent / MLP-only): no kv heads, whatever default the config's
        # reading gave (a head count the file carries is kept; the kv heads default to it otherwise)
        summary["num_kv_heads"] = 0
    return InspectReport(
        **summary, source=ck.source, format=ck.format, fused_layout=layout.fused_layout,
        max_positions=layout.max_positions,
        parameter_count=params, dtypes=dtypes, layers=tuple(layer_reports),
        layers_with_qkv_bias=sum(1 for lr in layer_reports if lr.has_qkv_bias),
        bias_parameters=bias_params, bias_share=(bias_params / params) if params else 0.0,
        notes=notes, warnings=tuple(warnings), skipped=unreported(layout), missing=tuple(missing),
        missing_bytes=ck.missing_bytes, file_metadata=file_metadata, tensor_types=tensor_types,
        bytes_read=ck.bytes_read, requests=ck.requests, num_tensors=len(ck.stored_tensors),
        memory=mem, facts=tuple(layout.facts()), derivation=layout.derivation(),
        quantization=quant_summary(ck, params),
        towers=tuple(towers), missing_config=ck.missing_config, **_tokenizer_fields(ck))


def _tokenizer_fields(ck: Checkpoint) -> dict:
    """The tokenizer section: read from a local folder's files or a GGUF's header (already read); a Hub folder's
    tokenizer files are not fetched by inspect (headers only: ``diff`` and ``tokenizer()`` read them)."""
    if ck.format == "hub-safetensors":
        return {"tokenizer_note": "not read from the Hub by inspect (headers only); ckpt-surgeon diff and the "
                                  "Python API's ckpt_surgeon.tokenizer() read it"}
    from ..errors import CkptError
    from .tokenizer import read_tokenizer
    try:
        rec = read_tokenizer(ck)
    except CkptError as e:
        return {"tokenizer_note": f"unreadable: {e}"}
    if rec is not None and rec.unread:
        return {"tokenizer_note": f"not read: {rec.unread}"}
    return {"tokenizer": rec} if rec is not None else {"tokenizer_note": "none in this source"}


def _attention_free(mem) -> bool:
    """The memory figures counted layers and none of them has attention (only recurrent / no-attention layers)."""
    layers = getattr(mem, "layers", None) or {}
    return bool(layers) and sum(layers.values()) > 0 and not any(
        v for k, v in layers.items() if k not in ("none", "recurrent"))


def _stack_reports(ck: Checkpoint, layout: ModelLayout, missing: list, warnings: list, sinks, where: str):
    """(LayerReport per layer record of one stack, its number of bias parameters)."""
    from .redundancy import inspect_summary
    out, nbias = [], 0
    for lt in layout.layers:
        stats, k_vec, n = _layer_biases(ck, layout, lt, missing, warnings)
        nbias += n
        for role, s in stats.items():
            if s is not None and s.nonfinite:
                warnings.append(f"{where}layer {lt.layer}: {role} bias ({s.tensor}) has {s.nonfinite} NaN/Inf value(s)")
        out.append(LayerReport(layer=lt.layer, q_bias=stats["q"], k_bias=stats["k"], v_bias=stats["v"],
                               fused_qkv=lt.fused, o_bias=lt.o_bias is not None,
                               q_norm=lt.q_norm is not None, k_norm=lt.k_norm is not None,
                               extra={"k_bias_redundancy": inspect_summary(
                                   layout, ck.config, lt, k_vec, sinks=lt.layer in sinks)}))
    return out, nbias


def inspect(source, memory=None, **open_kwargs) -> InspectReport:
    """What a checkpoint holds, from its headers: the twin of ``ckpt-surgeon inspect`` (docs/inspect.md).

    ``source``: an HF folder, a ``.safetensors`` or ``.gguf`` file, a Hub repo id or an open
    :class:`~ckpt_surgeon.checkpoint.Checkpoint`; ``open_kwargs`` as :func:`open_checkpoint` takes them.
    ``memory``: a :class:`~ckpt_surgeon.analysis.memory.MemoryOptions` (context, batch, cache types, devices)
    for the memory figures; default 1,000 tokens at f16 and q8_0.  Reads headers and bias vectors only.

    Returns:
        :class:`~ckpt_surgeon.analysis.inspect.InspectReport`

    Example::

        import ckpt_surgeon
        rep = ckpt_surgeon.inspect("SmolLM2-135M-Instruct.Q4_1.gguf")
        rep.num_layers, rep.head_dim, rep.layers_with_qkv_bias
        rep.to_dict()["memory"]["kv_cache_bytes"]      # {"f16": ..., "q8_0": ...}
    """
    if isinstance(source, Checkpoint):
        return inspect_checkpoint(source, memory)
    with open_checkpoint(source, **open_kwargs) as ck:
        return inspect_checkpoint(ck, memory)


def report_as_dict(obj) -> dict:
    return obj.to_dict() if hasattr(obj, "to_dict") else asdict(obj)
