"""``fold-bias``: plan the removal of redundant key biases and the folding of value biases.

Key bias (``--k``), per layer (see ARCHITECTURE.md "Facts"):

- no rotary (absolute, learned, ALiBi, none): the term ``q_m·b_k`` is constant over the keys, so
  softmax ignores it: all of ``b_k`` is zeroed, exactly;
- partial rotary: the pass-through dimensions (``>= rotary_dim`` of each head) are exact and are
  zeroed; the rotated ones stay;
- full rotary after the biased projection (Qwen2 ...): nothing is exactly removable, so the plan is
  refused unless ``approximate=True``: then the frequency pairs the analyzer
  (:mod:`ckpt_surgeon.analysis.bounds`) bounds as near-redundant are zeroed, as many as keep
  the summed per-pair bound ``<= max_logit_change`` (attention-logit units, per layer and kv head);
- a norm after the projection (q/k-norm), or logit soft-capping: refused, not removable.

Value bias (``--v``): ``b_o' = b_o + W_o·b_v`` (GQA-expanded) and ``b_v`` zeroed, exact because
attention rows sum to 1; only where the layer has an output-projection bias (refused otherwise).

Centering (``--center``, ``--center-weights``): LayerNorm subtracts the mean over features, so
when *every* reader of the residual stream is a centering norm (registry fact
``Family.residual_readers_centering``; :func:`ckpt_surgeon.analysis.consumers.stream_readers`), the
mean component of every residual-writing bias (attention output, MLP output) is invisible and is
subtracted, exactly; ``center_weights`` also subtracts the column means of every residual-writing
weight (attention output, MLP output, additive embedding tables, and the token embedding unless
the head reads it too); the embedding norm's bias of pre-norm models (BLOOM) is a writer too: TransformerLens' ``center_writing_weights``.  Refused, naming the reader,
for RMSNorm models, models whose stream some projection or head reads unnormalised, and
architectures the registry does not cover.

Folded biases are zeroed, not deleted.  ``delete=True`` drops them instead where the architecture
has a config switch for its biases (``Family.attention_bias_key``) *and* every bias that switch
creates is zero after the fold; the switch is then set to false in ``config.json``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..arch import families as F
from ..arch.layouts import qkv_row_index
from ..errors import CkptError, RefusedError, UnsupportedError
from .plan import Plan, TensorStep, _Evaluator, step_params


@dataclass(frozen=True)
class FoldLayer:
    """What fold-bias does to one layer."""

    layer: int
    k_bias: str | None = None
    k_class: str = "none"             # exact | partial | rope | not-removable | none
    k_removed: int = 0                # components zeroed
    k_total: int = 0
    k_removed_energy: float = 0.0     # share of ||b_k||^2 removed
    k_norm: float = 0.0               # ||b_k||
    k_bound: float | None = None      # approximate: summed bound of the removed pairs (max over kv heads)
    v_bias: str | None = None
    v_folded: bool = False
    v_norm: float = 0.0
    o_bias: str | None = None
    centered: int = 0                 # residual-writing tensors centered in this layer (--center)
    center_energy: float | None = None  # share of this layer's residual-writing bias energy removed
    tower: str | None = None          # the attention stack of this layer when the file has several (issue 27)

    def to_dict(self) -> dict:
        return {**({"tower": self.tower} if self.tower is not None else {}), "layer": self.layer, "k_class": self.k_class, "k_removed": self.k_removed, "k_total": self.k_total,
                "k_removed_energy": self.k_removed_energy, "k_norm": self.k_norm, "k_bound": self.k_bound,
                "v_folded": self.v_folded, "v_norm": self.v_norm, "centered": self.centered,
                "center_energy": self.center_energy,
                "k_bias": self.k_bias, "v_bias": self.v_bias, "o_bias": self.o_bias}

    def row(self) -> dict:
        """Table row (tensor names only in JSON).  The columns of an operation that did not touch this
        layer are left out (shown "-"; issue 36: `--v` alone printed "k_class none, k_total 0" beside
        a key bias of L2 4.4, as if the key bias were absent)."""
        d = self.to_dict()
        skip = {"k_bias", "v_bias", "o_bias"}
        if self.k_bias is None:
            skip |= {"k_class", "k_removed", "k_total", "k_removed_energy", "k_norm", "k_bound"}
        if self.v_bias is None and not self.v_folded:
            skip |= {"v_folded", "v_norm"}
        if not self.centered and self.center_energy is None:
            skip |= {"centered", "center_energy"}
        return {k: v for k, v in d.items() if k not in skip}


def bias_rows(layout, lt, role: str) -> tuple[str, np.ndarray] | None:
    """(tensor, row indices) of the ``role`` ("q"|"k"|"v") bias in this layer: a separate bias, or
    its rows inside the fused qkv bias (layout from the registry, arch/layouts.qkv_row_index)."""
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    sep = getattr(lt, f"{role}_bias")
    if sep:
        n = (h if role == "q" else kv) * d
        return sep, np.arange(n)
    if lt.qkv_bias:
        if layout.fused_layout is None:
            raise UnsupportedError("the fused qkv layout of this architecture is unknown; cannot locate the "
                                   f"{role} part of the bias", tensor=lt.qkv_bias)
        idx = qkv_row_index(layout.fused_layout, h, kv, d)
        return lt.qkv_bias, idx["qkv".index(role)]
    return None


def _fmt_layers(layers) -> str:
    layers = list(layers)
    if len(layers) > 8:
        return ", ".join(map(str, layers[:4])) + f", ... ({len(layers)} layers)"
    return ", ".join(map(str, layers))


def plan_fold_bias(ckpt, *, k: bool = False, v: bool = False, approximate: bool = False,
                   max_logit_change: float | None = None, context: int | None = None,
                   delete: bool = False, epsilon: float | None = None, pairs: str = "near",
                   center: bool = False, center_weights: bool = False, tower: str | None = None) -> Plan:
    """Build the fold-bias plan for ``ckpt`` (reads bias vectors; no output is written).

    ``center_weights`` implies ``center`` (the biases are centered too).  A file with several attention
    stacks (towers): ``--k`` / ``--v`` fold every stack where the fold is exact and leave the others with
    a note (refused only when no stack can be folded); ``tower`` selects one stack by name (the main one:
    its name or ``text``), refused as a single-stack file would be."""
    src = ckpt.source
    ckpt.refuse_truncated()        # every tensor is copied: a file cut short is refused before planning
    center = center or center_weights
    epsilon = _check_options(src, k, v, center, approximate, max_logit_change, context, pairs, epsilon)

    layout = ckpt.layout()
    if center:
        _check_centering(layout, ckpt.config, src)
    fam = F.by_name(layout.family)
    _check_known(layout, fam, src)
    records: dict[int, dict] = {lt.layer: {"layer": lt.layer} for lt in layout.layers}
    notes: list[str] = []
    ev = _Evaluator(ckpt)
    params = {"k": k, "v": v, "approximate": approximate, "max_logit_change": max_logit_change,
              "context": context, "delete": delete}
    if center:
        params.update(center=True, center_weights=bool(center_weights))
    centered: list[TensorStep] = []
    if center:     # first: a refusal here must come before any other work
        centered = _plan_center(ckpt, layout, center_weights, records, notes)

    rows_to_zero: dict[str, set] = {}
    tensor_layer: dict[str, int] = {}
    outcome, steps, tower_recs = _plan_stacks(
        ckpt, layout, _stacks(layout, tower, src), fam, ev, rows_to_zero, tensor_layer, records, notes,
        k=k, v=v, k_options=(approximate, max_logit_change, context, params, epsilon, pairs))
    steps = _with_centering(steps, centered)
    for name, rows in sorted(rows_to_zero.items()):
        if rows:
            steps.append(TensorStep("zero_rows", name, (name,), step_params(rows=np.array(sorted(rows))), like=name,
                                    layer=tensor_layer.get(name), why="folded bias components zeroed"))

    config, changes = None, ()
    if delete:
        steps, config, changes = _plan_delete(ckpt, layout, fam, ev, steps)
        notes.append(f"--delete: every bias controlled by config '{fam.attention_bias_key}' is zero, so they are "
                     f"dropped and '{fam.attention_bias_key}' is set to false")
    elif (k or v) and steps:
        notes.append("folded biases are zeroed, not deleted (stock loaders expect the tensors); --delete drops them "
                     "where the architecture has a switch for it")
    layer_recs = tuple(FoldLayer(**r) for _, r in sorted(records.items()) if len(r) > 1) + \
        tuple(FoldLayer(**r) for r in tower_recs)
    return Plan(operation="fold-bias", source=src, params=params, steps=tuple(steps), config=config,
                config_changes=changes, layers=layer_recs, notes=tuple(notes), outcome=outcome)


def _check_known(layout, fam, src) -> None:
    """Refused when nothing says where the rotary embedding and norms sit (no family, not derived, no stack
    with a known position encoding)."""
    if fam is None and layout.derived is None and all(lay.position.type == "unknown" for _, _, lay, _ in
                                                      layout.stacks()):
        # (an mmproj file's encoders are outside the registry's families, but their projector type's graph
        # is in it, families.CLIP_PROJECTORS: their position encoding is known, and the analysis classes them)
        if layout.tower_how:
            raise UnsupportedError(f"{layout.architecture} {layout.tower_kind} encoder {layout.tower_how}; nothing "
                                   "was folded", path=src)
        raise UnsupportedError(f"architecture {layout.architecture!r} is not in the registry, so where its "
                               "rotary embedding and norms sit is unknown; nothing was folded", path=src)


def _plan_stacks(ckpt, layout, stacks, fam, ev, rows_to_zero, tensor_layer, records, notes, *, k: bool, v: bool,
                 k_options: tuple) -> tuple:
    """(key-fold outcome of the main stack, value-fold steps, tower layer records) over every attention stack;
    ``k_options`` = (approximate, max_logit_change, context, params, epsilon, pairs) for :func:`_plan_k`.  A
    stack whose fold is not exact keeps its biases with a note; refused when every stack is (or the only one)."""
    src = ckpt.source
    outcome = None
    steps: list[TensorStep] = []
    tower_recs: list = []
    refused: list = []
    for name, _, lay, _ in stacks:
        main = lay is layout
        recs = records if main else {lt.layer: {"layer": lt.layer, "tower": name} for lt in lay.layers}
        stack_notes: list[str] = []
        try:
            if not (lay.num_heads and lay.num_kv_heads and lay.head_dim):
                # (MLA's latent text stack beside a vision tower: the tower is still folded)
                raise UnsupportedError("heads / kv heads / head_dim are unknown (config.json incomplete)"
                                       if len(stacks) == 1 else "its heads / kv heads / head_dim are unknown", path=src)
            if k:
                out_k = _plan_k(ckpt, lay, fam if main else None, ev, rows_to_zero, tensor_layer, recs, stack_notes,
                                *k_options)
                outcome = out_k if main else outcome
            if v:
                steps += _plan_v(ckpt, lay, fam if main else None, ev, rows_to_zero, tensor_layer, recs, stack_notes)
        except (RefusedError, UnsupportedError) as e:
            if len(stacks) == 1:
                raise
            refused.append((name, e))
        notes += [n if main or len(layout.stacks()) == 1 else f"tower {name}: {n}" for n in stack_notes]
        if not main:
            tower_recs += [r for _, r in sorted(recs.items()) if len(r) > 2]
    if refused and len(refused) == len(stacks):
        raise refused[0][1]
    for name, e in refused:     # a stack whose fold is not exact keeps its biases: said, not refused
        notes.append(f"attention stack {name}: biases kept ({getattr(e, 'detail', None) or e})")
    return outcome, steps, tower_recs


def _stacks(layout, tower: str | None, src) -> list:
    """The attention stacks ``fold-bias`` works on: every one, or the one ``tower`` names."""
    stacks = layout.stacks()
    if tower is None:
        return stacks
    hit = [s for i, s in enumerate(stacks) if s[0] == tower or (i == 0 and tower in ("text", "main"))]
    if not hit:
        raise CkptError(f"--tower {tower!r}: the file has no such attention stack; it has: "
                        + ", ".join(repr(s[0]) for s in stacks), path=src)
    return hit


def _check_options(src, k, v, center, approximate, max_logit_change, context, pairs, epsilon) -> float:
    """Option combinations that make no sense, refused before anything is read -> epsilon."""
    if not (k or v or center):
        raise CkptError("nothing to do: pass --k (key bias), --v (value bias), --center (residual-writing biases) "
                        "or a combination", path=src)
    if approximate and not k:
        raise CkptError("--approximate applies to the key bias: add --k", path=src)
    if approximate and (max_logit_change is None or not max_logit_change >= 0):
        raise CkptError("--approximate needs --max-logit-change X (X >= 0, attention-logit units)", path=src)
    if max_logit_change is not None and not approximate:
        raise CkptError("--max-logit-change only applies with --approximate", path=src)
    if context is not None and not approximate:
        raise CkptError("--context only applies with --approximate", path=src)
    if pairs not in ("near", "any"):
        raise CkptError(f"pairs must be 'near' or 'any', not {pairs!r}", path=src)
    if epsilon is None:
        from ..analysis.layer_redundancy import DEFAULT_EPSILON
        epsilon = DEFAULT_EPSILON
    return epsilon


def _with_centering(steps: list[TensorStep], centered: list[TensorStep]) -> list[TensorStep]:
    """Merge the centering steps into the value-fold steps: b_o' = center(b_o + W_o b_v) =
    center(b_o) + center(W_o) b_v, so one step writes each output bias."""
    folded_o = {s.out for s in steps}
    steps = [replace(s, params=tuple(sorted(s.params + (("center", True),))), why=s.why + ", centered")
             if any(c.out == s.out for c in centered) else s for s in steps]
    return steps + [c for c in centered if c.out not in folded_o]


def _k_dims(lr, approximate: bool, max_logit_change, pairs_mode: str, notes: list) -> tuple:
    """(dims removed from layer ``lr``'s key bias, their bound, the energy share removed, rotary pairs
    chosen): the exact dims, or with ``approximate`` the pairs :func:`select_pairs` chooses."""
    from ..analysis.layer_redundancy import select_pairs
    if approximate:
        sel = select_pairs(lr, float(max_logit_change), include_exact=True, only_near=(pairs_mode == "near"))
        if sel.note:
            notes.append(f"layer {lr.layer}: {sel.note}")
        return np.asarray(sel.dims, dtype=np.int64), sel.bound, sel.removed_energy_fraction, len(sel.pairs)
    bound = 0.0 if lr.k_class in ("exact", "partial") else None
    return np.asarray(lr.exact_dims, dtype=np.int64), bound, lr.exact_fraction or 0.0, 0


def _k_class_notes(layout, classes: set) -> list[str]:
    """What the plan says of the key-bias classes it removes exactly."""
    notes = []
    if "exact" in classes:
        notes.append(f"key bias: no rotary ({layout.position.type} positions), so q·b_k is constant over the keys and "
                     "softmax ignores it: it is removed exactly")
    if "partial" in classes:
        notes.append(f"key bias: partial rotary (rotary_dim {layout.position.rotary_dim} of head_dim {layout.head_dim}): "
                     "the pass-through dimensions are removed exactly")
    return notes


def _plan_k(ckpt, layout, fam, ev, rows_to_zero, tensor_layer, records, notes, approximate, max_logit_change,
            context, params, epsilon, pairs_mode) -> str | None:
    """Key-bias part of the plan, from the analyzer's classes, exact dims and per-pair bounds
    (:mod:`ckpt_surgeon.analysis.bounds`: module docstring has the derivation)."""
    from ..analysis.redundancy import analyze_checkpoint

    src = ckpt.source
    located = {lt.layer: bias_rows(layout, lt, "k") for lt in layout.layers}
    located = {i: r for i, r in located.items() if r is not None}
    if not located:
        raise RefusedError("has no key bias in any layer: nothing to fold (--k)", path=src)
    quick = analyze_checkpoint(ckpt, context=context, epsilon=epsilon, weights=False, layout=layout, consumers=False)
    by_layer = {lr.layer: lr for lr in quick.layers if lr.layer in located}
    bad = {i: lr for i, lr in by_layer.items() if lr.k_class in ("not-removable", "unknown")}
    if bad:
        first = next(iter(bad.values()))
        why = "; ".join(first.reasons) or first.k_class
        raise RefusedError(f"refused: the key bias is not removable in {layout.architecture} ({why}); "
                           f"layers {_fmt_layers(bad)} keep it", path=src)
    rope_layers = [i for i, lr in by_layer.items() if lr.k_class == "rope"]
    need_bounds = approximate or bool(rope_layers)
    rep = (analyze_checkpoint(ckpt, context=context, epsilon=epsilon, weights=True, layout=layout, consumers=False)
           if need_bounds else quick)
    by_layer = {lr.layer: lr for lr in rep.layers if lr.layer in located}
    if rope_layers and not approximate:
        _refuse_rope(layout, by_layer, rope_layers, src)
    blind = [i for i, lr in by_layer.items() if lr.k_class in ("rope", "partial") and lr.near_fraction is None]
    if approximate and blind:
        # no rotary geometry for this stack (2-D rope of an image tower): no pair has a bound, none is chosen
        raise RefusedError(f"refused: --approximate needs the rotary geometry of the attention stack, which is not "
                           f"established for {layout.architecture} ({layout.position.describe(layout.head_dim)}): no "
                           f"rotary pair of layers {_fmt_layers(blind)} has a bound; nothing was removed", path=src)

    worst = 0.0
    n_pairs = n_dims = 0
    for i, (t, rows) in sorted(located.items()):
        lr = by_layer[i]
        dims, bound, frac, pairs = _k_dims(lr, approximate, max_logit_change, pairs_mode, notes)
        n_pairs += pairs
        removed = rows[dims] if dims.size else np.zeros(0, dtype=np.int64)
        n_dims += int(dims.size)
        rows_to_zero.setdefault(t, set()).update(int(r) for r in removed)
        tensor_layer[t] = i
        worst = max(worst, bound or 0.0)
        records[i].update(k_bias=t, k_class=lr.k_class, k_removed=int(dims.size), k_total=int(rows.size),
                          k_removed_energy=float(frac), k_norm=float(lr.k_bias_l2 or 0.0), k_bound=bound)
    notes += _k_class_notes(layout, {by_layer[i].k_class for i in located})
    if approximate:
        params.update(context=rep.context, epsilon=rep.epsilon, pairs=pairs_mode, bound=worst)
        if n_dims == 0:
            return _nothing_removed(by_layer, rep, pairs_mode, max_logit_change)
        notes.append(f"--approximate: {n_pairs} {'near-redundant ' if pairs_mode == 'near' else ''}rotary pair(s) "
                     f"whose summed bound stays <= {max_logit_change} per layer and kv head are removed (context "
                     f"{rep.context}, epsilon {rep.epsilon:g} rad); largest bound used: {worst:.4g} "
                     "attention-logit units")
    return None


def _nothing_removed(by_layer: dict, rep, pairs_mode: str, budget: float) -> str:
    """The summary line of an --approximate run that removes nothing, and why (issue 24: it used to
    report "removed ... largest bound used: 0" with 0 tensors changed)."""
    ctx = f"{rep.context} positions ({rep.context_source})" if rep.context else "any distance (no context known)"
    if pairs_mode == "near" and not any(lr.near_pairs for lr in by_layer.values()):
        return (f"nothing removed: no rotary pair turns less than epsilon {rep.epsilon:g} rad over {ctx}, so no pair "
                "qualifies as near-redundant; pass --context L with the window you run (e.g. --context 4096), "
                "a larger --epsilon, or --pairs any")
    costs = [float(lr.contributions.max(axis=0).min()) for lr in by_layer.values() if lr.contributions is not None
             and lr.contributions.size]
    cheapest = f" (the cheapest single pair needs {min(costs):.4g})" if costs else ""
    return (f"nothing removed: no rotary pair fits the budget --max-logit-change {budget:g}{cheapest}; raise it, or "
            "pass a shorter --context L")


def _refuse_rope(layout, by_layer: dict, rope_layers: list[int], src: str):
    """The refusal for a key bias that RoPE rotates after the projection, with the numbers of
    the first three such layers (norm, near-redundant energy, bound for removing it all)."""
    def one(i):
        lr = by_layer[i]
        parts = [f"layer {i}: |b_k| {lr.k_bias_l2:.4g}"]
        if lr.near_fraction is not None:
            parts.append(f"near-redundant energy {lr.near_fraction:.1%} (angle < {lr.epsilon:g} rad over {lr.context} "
                         f"positions)")
        if lr.bound_all is not None:
            parts.append(f"removing it all could move a logit by up to {lr.bound_all:.3g}")
        return ", ".join(parts)
    detail = "; ".join(one(i) for i in rope_layers[:3]) + (f"; ... ({len(rope_layers)} layers)" if len(rope_layers) > 3 else "")
    rope = "2-D RoPE (an image's rows and columns)" if layout.position.axes == 2 else "RoPE"
    if any(by_layer[i].near_fraction is None for i in rope_layers):
        # no rotary geometry established for this stack (2-D, windowed, a derived tower): no bound either
        after = ("; no near-redundant pairs or bounds are established for this stack's rotary geometry, so "
                 "--approximate cannot remove any of it either")
    else:
        after = ("; pass --approximate --max-logit-change X to remove only the near-redundant frequency pairs "
                 "whose summed bound stays <= X")
    raise RefusedError(
        f"refused: the key bias is not exactly removable in {layout.architecture}: {rope} rotates every dimension "
        f"after the biased projection (k = rope(W_k x + b_k)), so its logit term depends on the distance "
        f"between tokens ({detail}){after}", path=src)


def _plan_v(ckpt, layout, fam, ev, rows_to_zero, tensor_layer, records, notes) -> list[TensorStep]:
    src = ckpt.source
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    located = [(lt, bias_rows(layout, lt, "v")) for lt in layout.layers]
    located = [(lt, r) for lt, r in located if r is not None]
    if not located:
        raise RefusedError("has no value bias in any layer: nothing to fold (--v)", path=src)
    if layout.derived is not None:      # derived architectures: only a probed fold is exact
        from ..arch.derive.derived import v_fold_verdict
        bad = [lt for lt, _ in located if lt.o_bias and not v_fold_verdict(layout.derived, lt.group)[0]]
        if bad:
            raise RefusedError(f"refused: cannot fold the value bias in {layout.architecture}: "
                               f"{v_fold_verdict(layout.derived, bad[0].group)[1]} (layers "
                               f"{_fmt_layers(lt.layer for lt in bad)})", path=src)
    missing = [lt.layer for lt, _ in located if not lt.o_bias]
    if missing:
        o_name = next((lt.o_weight for lt, _ in located if lt.o_weight), None)
        raise RefusedError(
            f"refused: cannot fold the value bias: the attention output projection"
            f"{f' ({o_name})' if o_name else ''} has no bias in {layout.architecture} (layers {_fmt_layers(missing)}), "
            f"so W_o·b_v has nowhere to go; folding needs an output-projection bias (GPT-2, BERT, BLOOM, GPT-NeoX, "
            f"Phi-2, Falcon ...)", path=src)
    steps = []
    for lt, (t, rows) in located:
        if not lt.o_weight:
            raise UnsupportedError("the output projection weight of this layer was not found", path=src, tensor=lt.o_bias)
        steps.append(TensorStep(
            "fold_v_bias", lt.o_bias, (lt.o_bias, lt.o_weight, t),
            step_params(v_rows=rows, n_heads=h, n_kv_heads=kv, head_dim=d, w_o_in_out=bool(layout.conv1d)),
            like=lt.o_bias, layer=lt.layer, why="b_o + W_o·b_v"))
        rows_to_zero.setdefault(t, set()).update(int(r) for r in rows)
        tensor_layer[t] = lt.layer
        records[lt.layer].update(v_bias=t, v_folded=True, v_norm=float(np.linalg.norm(ev.value(t)[rows])),
                                 o_bias=lt.o_bias)
    notes.append("the value bias is folded into the output bias (b_o' = b_o + W_o·b_v): exact, attention rows sum to 1"
                 + (f"; GQA: query head h reads kv head h // {h // kv}" if kv != h else ""))
    return steps


def _check_centering(layout, config, src) -> None:
    from ..analysis.consumers import stream_readers
    readers = stream_readers(layout, config)
    if not readers.centering:
        raise RefusedError(f"refused: --center is exact only when every reader of the residual stream subtracts the "
                           f"mean (LayerNorm); {readers.reason}; nothing was centered", path=src)


def _centerable(ckpt, name: str, axis: int, n: int | None):
    """The info of tensor ``name``, refused when centering it along ``axis`` would not be exact
    (quantized values) or that axis is not the hidden size ``n``."""
    src, info = ckpt.source, ckpt.tensors[name]
    if info.quantized and ckpt.quantization is not None:
        raise UnsupportedError(f"--center-weights: the weight is quantized ({ckpt.quantization.method}); centering "
                               "its values would re-quantize them (not exact); use --center (biases only)",
                               path=src, tensor=name)
    if info.quantized:
        raise UnsupportedError(f"--center-weights: {info.dtype} is a block-quantized type; centering its "
                               "values would re-quantize them (not exact); use --center (biases only)",
                               path=src, tensor=name)
    if n and info.shape[axis] != n:
        raise UnsupportedError(f"--center: expected the hidden size {n} along axis {axis} of this "
                               f"residual-writing tensor, found shape {list(info.shape)}", path=src, tensor=name)
    return info


def _plan_center(ckpt, layout, weights: bool, records, notes) -> list[TensorStep]:
    """``center`` steps for every residual-writing bias (and weight, with ``weights``): see the
    module docstring; the stream's readers were checked by :func:`_check_centering`."""
    from ..analysis.consumers import WRITER_ROLES, locate_stream_tensors, mean_share, word_embedding_tied

    src = ckpt.source
    n = layout.hidden_size
    tensors = locate_stream_tensors(ckpt, layout)
    tied = word_embedding_tied(ckpt, tensors)
    steps: list[TensorStep] = []
    energy: dict = {}
    skipped = []
    for t in tensors:
        if t.role not in WRITER_ROLES:
            continue
        todo = []
        if t.bias:
            todo.append((t.bias, 0))
        if weights and t.weight:
            if t.role == "embed_token" and tied:
                skipped.append(t.weight)
                continue
            # the hidden-size axis: rows of nn.Linear [hidden, in], last axis of Conv1D [in, hidden] and of
            # embedding tables [rows, hidden]
            todo.append((t.weight, -1 if (t.role.startswith("embed") or layout.conv1d) else 0))
        for name, axis in todo:
            info = _centerable(ckpt, name, axis, n)
            steps.append(TensorStep("center", name, (name,), step_params(axis=axis), like=name, layer=t.layer,
                                    why="mean over the hidden size removed (every stream reader is a LayerNorm)"))
            if t.layer is not None:
                rec = records[t.layer]
                rec["centered"] = rec.get("centered", 0) + 1
                if axis == 0 and len(info.shape) == 1:
                    b = np.asarray(ckpt.read(name), dtype=np.float64)
                    e = energy.setdefault(t.layer, [0.0, 0.0])
                    e[0] += mean_share(b) * float((b ** 2).sum())
                    e[1] += float((b ** 2).sum())
    if not steps:
        raise RefusedError("has no residual-writing bias (attention output, MLP output) to center"
                           + ("" if weights else "; --center-weights also centers the writing weights"), path=src)
    for layer, (rem, tot) in energy.items():
        records[layer]["center_energy"] = rem / tot if tot else 0.0
    notes.append("--center: every reader of the residual stream is a LayerNorm, so the mean component of each "
                 "residual-writing bias" + (" and of each writing weight's columns" if weights else "") +
                 " is subtracted: exact")
    whole = [s.out for s in steps if s.layer is None]
    if whole:
        notes.append(f"--center: whole-model writers are centered too (embedding tables row by row): {', '.join(whole)}")
    if skipped:
        notes.append(f"--center-weights: {', '.join(skipped)} is also read by the output head (tied embeddings), "
                     "so it is not centered")
    return steps


def _layer_prefix(fam, lt) -> str | None:
    """``model.layers.3.`` of this layer, from any placed role tensor."""
    for role in ("q", "k", "v", "qkv", "o"):
        mod = fam.roles.get(role)
        for kind in ("weight", "bias"):
            name = getattr(lt, f"{role}_{kind}", None)
            if name and isinstance(mod, str) and name.endswith(f"{mod}.{kind}"):
                return name[: -len(f"{mod}.{kind}")]
    return None


def _plan_delete(ckpt, layout, fam, ev, steps):
    src = ckpt.source
    if ckpt.naming == "gguf":
        raise RefusedError("refused: --delete is not supported for GGUF outputs (llama.cpp decides per architecture "
                           "whether a bias tensor is required); the folded biases are zeroed instead — rerun "
                           "without --delete", path=src)
    key = fam.attention_bias_key if fam is not None else None
    cfg = dict(ckpt.config or {})
    if not key:
        raise RefusedError(f"refused: --delete: {layout.architecture} has no config switch that removes its attention "
                           "biases (the loader would miss the tensors); they are zeroed instead — rerun without "
                           "--delete", path=src)
    if not cfg.get(key):
        raise RefusedError(f"refused: --delete: config '{key}' is already false", path=src)
    controlled: list[tuple[str, str]] = []
    for lt in layout.layers:
        for role in ("q", "k", "v", "qkv", "o"):
            b = getattr(lt, f"{role}_bias")
            if b:
                controlled.append((b, role))
        prefix = _layer_prefix(fam, lt)
        for mod in fam.bias_switch_extra:
            name = f"{prefix}{mod}.bias" if prefix is not None else None
            if name and name in ckpt.tensors:
                controlled.append((name, mod))
    by_out = {s.out: s for s in steps}
    for name, role in controlled:
        val = ev.run(by_out[name]) if name in by_out else ev.value(name)
        if role == "qkv" and np.any(val != 0):      # name the part of the fused bias that stays
            parts = qkv_row_index(layout.fused_layout, layout.num_heads, layout.num_kv_heads, layout.head_dim)
            role = next(r for r, rows in zip("qkv", parts) if np.any(val[rows] != 0))
        if np.any(val != 0):
            why = {"q": "the query bias multiplies the keys and is never removable",
                   "o": "the output bias is kept (it receives the folded value bias)" if name in by_out else
                        "the output bias is non-zero",
                   "k": "part of the key bias is not removable",
                   "v": "the value bias was not folded (add --v)",
                   "qkv": "part of the fused qkv bias stays"}.get(role, f"config '{key}' also controls this bias")
            raise RefusedError(
                f"refused: --delete needs every bias that config '{key}' controls to be zero after the fold, "
                f"but this one is not ({why}); the folded biases are zeroed instead — rerun without --delete",
                path=src, tensor=name)
    names = sorted({n for n, _ in controlled})
    new_steps = [s for s in steps if s.out not in set(names)]
    new_steps += [TensorStep("delete", None, (n,), why=f"config '{key}' set to false") for n in names]
    old = cfg.get(key)
    cfg[key] = False
    return new_steps, cfg, ((key, old, False),)


def fold_bias(source, out, *, k: bool = False, v: bool = False, approximate: bool = False,
              max_logit_change: float | None = None, context: int | None = None, delete: bool = False,
              epsilon: float | None = None, pairs: str = "near", center: bool = False, center_weights: bool = False,
              force: bool = False, check: str = "auto", source_hash: str = "auto", tower: str | None = None,
              **open_kw):
    """Remove the attention biases that do not change the model: the twin of ``ckpt-surgeon fold-bias``
    (docs/fold-bias.md).  Refuses, with the analyzer's numbers, what is not removable.

    ``source``: an HF folder, a ``.safetensors`` or ``.gguf`` file (any source :func:`open_checkpoint` takes);
    ``out``: a folder, a ``.safetensors`` file or, for a GGUF source, a ``.gguf`` file.  ``k``: the key bias
    where it is exact; with ``approximate`` and ``max_logit_change`` also rotary pairs under that bound at
    ``context`` (``epsilon``, ``pairs``: near | any).  ``v``: fold the value bias into the output bias.
    ``center`` / ``center_weights``: subtract mean components read only by LayerNorms.  ``delete``: drop
    folded biases where a config switch allows.  ``tower``: one attention stack only.  ``force``, ``check``,
    ``source_hash``: the writer's (docs/bad-input.md).

    Returns:
        :class:`~ckpt_surgeon.surgery.plan.SurgeryResult`

    Example::

        import ckpt_surgeon
        res = ckpt_surgeon.fold_bias("all-MiniLM-L6-v2", "minilm-folded", k=True, v=True)
        res.plan.layers[0].k_removed, res.write.bytes_written, res.to_dict()["tensors_changed"]
    """
    from ..checkpoint import open_checkpoint
    from .plan import plan_while_copying

    with open_checkpoint(source, **open_kw) as ck:
        make = lambda: plan_fold_bias(ck, k=k, v=v, approximate=approximate, max_logit_change=max_logit_change,  # noqa: E731
                                      context=context, delete=delete, epsilon=epsilon, pairs=pairs, center=center,
                                      center_weights=center_weights, tower=tower)
        # --approximate reads every W_q to bound the change: overlap that with the copy (values-only
        # changes, so the copy is kept); exact folds read only bias vectors and need no head start
        return plan_while_copying(ck, out, make, force=force, check=check, source_hash=source_hash,
                                  early=approximate and not delete)
