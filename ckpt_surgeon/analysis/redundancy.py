"""Static key/value/query-bias redundancy analysis of a checkpoint (numpy only, no forward pass).

Works on any :class:`~ckpt_surgeon.checkpoint.Checkpoint` (HF folder, .safetensors, GGUF,
Hub) through its :class:`~ckpt_surgeon.arch.resolve.ModelLayout`; nothing here branches on a
model name.  This module reads what each layer needs (bias vectors; ``W_q`` and the input norm
where a bound needs them) and composes the report: the math is :mod:`.bounds`, one layer's
verdict :mod:`.layer_redundancy`, the report record and its views :mod:`.redundancy_report`.
"""
from __future__ import annotations

import math

import numpy as np

from ..arch.layouts import GATE_LAYOUTS, query_row_index, qkv_row_index
from ..arch.resolve import LayerTensors, ModelLayout
from ..arch.rope import rope_geometry
from ..errors import CkptError
from .layer_redundancy import DEFAULT_EPSILON, analyze_layer, attention_scale, classify, sink_layers
from .redundancy_report import AnalysisReport


def _vec(ck, name: str | None):
    if not name:
        return None
    info = ck.tensors[name]
    if info.missing:
        return None
    return np.asarray(ck.read(name), dtype=np.float64).reshape(-1)


def layer_vectors(ck, layout: ModelLayout, lt: LayerTensors) -> dict:
    """``{"q": b_q, "k": b_k, "v": b_v}`` for one layer (fused biases split by the layout; None
    where absent or unreadable) plus ``"k_tensor"``: the tensor the key bias lives in."""
    out = {"q": None, "k": None, "v": None, "k_tensor": lt.k_bias or (lt.qkv_bias if lt.qkv_bias else None)}
    if lt.qkv_bias:
        vec = _vec(ck, lt.qkv_bias)
        if vec is not None and layout.num_heads and layout.num_kv_heads and layout.head_dim:
            idx = qkv_row_index(layout.fused_layout or "concat", layout.num_heads, layout.num_kv_heads, layout.head_dim)
            out.update(q=vec[idx[0]], k=vec[idx[1]], v=vec[idx[2]])
    for role in ("q", "k", "v"):
        name = getattr(lt, f"{role}_bias")
        if name:
            out[role] = _vec(ck, name)
    if lt.q_bias and layout.q_gate and out["q"] is not None:
        out["q"] = _query_part(layout, out["q"])
    return out


def _query_part(layout: ModelLayout, rows: np.ndarray) -> np.ndarray | None:
    """The query rows of a gated q projection (query + output gate); None while unknown."""
    if layout.q_gate not in GATE_LAYOUTS:
        return None
    return rows[query_row_index(layout.q_gate, layout.num_heads, layout.head_dim)]


def q_weight(ck, layout: ModelLayout, lt: LayerTensors) -> np.ndarray | None:
    """``W_q`` ``[H*head_dim, D]`` (numpy order; GPT-2 Conv1D transposed; fused rows selected)."""
    name = lt.q_weight or lt.qkv_weight
    if not name or ck.tensors[name].missing:
        return None
    w = ck.read(name)
    # BF16 / F16 / F32 widen exactly to float32; q_pair_bound works in float64 one head at a
    # time, so a float64 copy of the whole matrix (~0.1 GB and ~0.06 s per 7B layer) buys nothing
    w = np.asarray(w, dtype=np.float32 if w.dtype in (np.float32, np.float16) else np.float64)
    if layout.conv1d:
        w = w.T
    if not lt.q_weight:
        iq, _, _ = qkv_row_index(layout.fused_layout or "concat", layout.num_heads, layout.num_kv_heads, layout.head_dim)
        w = w[iq]
    elif layout.q_gate:
        w = _query_part(layout, w)
    return w


def _norm_params(ck, layout: ModelLayout, lt: LayerTensors):
    """(gamma, beta, why-not) of the attention-input norm."""
    if layout.norm_placement != "pre" or layout.input_norm not in ("rms", "layer"):
        return None, None, ("no norm feeds the attention projections (post-norm or unknown architecture): "
                            "|q~| has no static bound")
    if not lt.attn_norm:
        return None, None, "the attention-input norm tensor was not found: |q~| has no static bound"
    g = _vec(ck, lt.attn_norm)
    if g is None:
        return None, None, "the attention-input norm tensor is missing from the (truncated) file"
    g = g + layout.norm_weight_offset
    b = None
    if layout.input_norm == "layer" and lt.attn_norm_bias:
        b = _vec(ck, lt.attn_norm_bias)
        if b is None:
            return None, None, "the attention-input norm bias is missing from the (truncated) file"
    return g, b, None


def _tower_layers(ck, lay: ModelLayout, context, epsilon, warnings: list, name: str) -> tuple:
    """A tower's per-block verdicts: the classes its derivation established; no bounds (a tower's rotary
    geometry, 2-D or windowed, is not read), so W_q is not read either."""
    out = []
    for lt in lay.layers:
        vecs = layer_vectors(ck, lay, lt)
        if vecs["k_tensor"] and vecs["k"] is None:
            warnings.append(f"tower {name} block {lt.layer}: key bias {vecs['k_tensor']} could not be read "
                            "(truncated file or unknown heads)")
        cls, _ = classify(lay, lt)
        note = ("a tower's rotary geometry (2-D / windowed) is not read: no bound" if cls in ("partial", "rope")
                else None)
        out.append(analyze_layer(lay, lt, b_k=vecs["k"], b_q=vecs["q"], b_v=vecs["v"], w_q=None, gamma=None,
                                 beta=None, rope=None, scale=float("nan"), context=context, epsilon=epsilon, sinks=False,
                                 weights_note=note, k_tensor=vecs["k_tensor"]))
    return tuple(out)


def _context(layout: ModelLayout, context: int | None) -> tuple[int | None, str]:
    if context is not None:
        if int(context) < 1:
            raise CkptError(f"--context must be a positive number of positions (got {context})")
        return int(context), "--context"
    if layout.max_positions:
        return int(layout.max_positions), "config max positions"
    return None, "config has no max positions: pass --context L (bounds assume any distance)"


def analyze_checkpoint(ck, *, context: int | None = None, epsilon: float = DEFAULT_EPSILON,
                       weights: bool = True, layout: ModelLayout | None = None,
                       consumers: bool = True) -> AnalysisReport:
    """Static analysis of every layer.  ``weights=False`` reads bias vectors only (inspect);
    ``consumers=False`` skips the per-bias consumer table (:mod:`.consumers`)."""
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise CkptError(f"--epsilon must be a finite angle >= 0 in radians (got {epsilon})")
    layout = layout or ck.layout()
    L, L_src = _context(layout, context)
    rope = rope_geometry(layout, ck.config)
    scale = attention_scale(layout, ck.config)
    sinks = sink_layers(ck.tensors)
    notes, warnings = _notes_and_warnings(ck, layout, rope, L, L_src)
    layers = []
    qkv_vectors = {}
    for lt in layout.layers:
        vecs = layer_vectors(ck, layout, lt)
        qkv_vectors[lt.layer] = vecs
        if vecs["k_tensor"] and vecs["k"] is None:
            warnings.append(f"layer {lt.layer}: key bias {vecs['k_tensor']} could not be read (truncated file or unknown heads)")
        cls, _ = classify(layout, lt, sinks=lt.layer in sinks)
        w_q, gamma, beta, wnote = _bound_inputs(ck, layout, lt, weights) if (
            vecs["k"] is not None and cls in ("partial", "rope")) else (None, None, None, None)
        layers.append(analyze_layer(layout, lt, b_k=vecs["k"], b_q=vecs["q"], b_v=vecs["v"], w_q=w_q, gamma=gamma,
                                    beta=beta, rope=rope, scale=scale, context=L, epsilon=epsilon,
                                    sinks=lt.layer in sinks, weights_note=wnote, k_tensor=vecs["k_tensor"]))
    towers = [(n, k, how, _tower_layers(ck, lay, L, epsilon, warnings, n)) for n, k, lay, how in layout.stacks()[1:]]
    towers = [(layout.stacks()[0][0], layout.stacks()[0][1], layout.stacks()[0][3], tuple(layers))] + towers
    cons = None
    if consumers:
        from .consumers import bias_consumers
        cons = bias_consumers(ck, layout, key_layers=layers, qkv_vectors=qkv_vectors)
    return AnalysisReport(
        **layout.summary(), source=ck.source, format=ck.format, input_norm=layout.input_norm, context=L, context_source=L_src, epsilon=float(epsilon), attn_scale=scale, rope=rope, layers=tuple(layers),
        notes=tuple(notes), warnings=tuple(warnings), bytes_read=ck.bytes_read, consumers=cons,
        facts=tuple(layout.facts()), derivation=layout.derivation(), towers=tuple(towers),
        tower_shapes=tuple({"num_heads": lay.num_heads, "num_kv_heads": lay.num_kv_heads, "head_dim": lay.head_dim,
                            "position_encoding": lay.position.to_dict(), "norm_placement": lay.norm_placement}
                           for _, _, lay, _ in layout.stacks()),
        missing_config=getattr(ck, "missing_config", None))


def _bound_inputs(ck, layout: ModelLayout, lt: LayerTensors, weights: bool) -> tuple:
    """(W_q, gamma, beta, why-not) a rotated key bias's bound needs; ``weights=False``: none read."""
    if not weights:
        return None, None, None, "needs W_q (reads the query weights): run `ckpt-surgeon analyze`"
    gamma, beta, wnote = _norm_params(ck, layout, lt)
    if wnote is not None:
        return None, gamma, beta, wnote
    w_q = q_weight(ck, layout, lt)
    return w_q, gamma, beta, ("W_q is missing or unreadable: no bound" if w_q is None else None)


def _notes_and_warnings(ck, layout: ModelLayout, rope, L: int | None, L_src: str) -> tuple[list, list]:
    """The report's notes and its first warnings (the reader's, unplaced tensors, a missing config)."""
    warnings = list(getattr(ck, "warnings", ()))
    from ..arch.model_layout import unplaced_warning, unreported
    if unplaced_warning(unreported(layout)):
        warnings.append(unplaced_warning(unreported(layout)))
    notes = list(layout.notes)
    if getattr(ck, "missing_config", None):
        # say what is missing, not "unknown architecture" (the registry is not the problem)
        warnings.insert(0, ck.missing_config_warning())
        notes = [n for n in notes if "is not in the registry" not in n]
    if layout.norm_placement == "post":
        notes = [n for n in notes if not n.startswith("post-norm:")]   # the registry's shorter line says the same
        notes.append("post-norm: the claim that LayerNorm's beta makes the q/k/v biases redundant is not an identity "
                     "(beta passes through W_q / W_k and differs from b_q / b_k); this report does not treat it as one")
    if rope and rope.note:
        notes.append(rope.note)
    if L is None and rope is not None:      # a context only matters to the bounds of rotated pairs
        notes.append(L_src)
    q = getattr(ck, "quantization", None)
    if q is not None:
        notes.append(f"quantized checkpoint ({q.method}, {'/'.join(str(b) for b in q.bits)}-bit): bounds use the "
                     "dequantized weights, i.e. they are the quantized model's")
    return notes, warnings


def inspect_summary(layout: ModelLayout, config: dict | None, lt: LayerTensors, b_k: np.ndarray | None, *,
                    sinks: bool = False, context: int | None = None, epsilon: float = DEFAULT_EPSILON) -> dict | None:
    """The ``k_bias_redundancy`` object for ``inspect`` (bias vector only, no weights read).

    The bound is 0 where removing exact + near parts needs none (no near pairs); otherwise it is
    null with a note: computing it needs ``W_q`` (the query weights, ~hidden^2 values per layer,
    ~0.7 GB for a 7B bf16 model), which ``inspect`` does not read; ``analyze`` does.
    """
    if b_k is None:
        return None
    L, _ = _context(layout, context)
    lr = analyze_layer(layout, lt, b_k=b_k, rope=rope_geometry(layout, config), scale=attention_scale(layout, config),
                       context=L, epsilon=epsilon, sinks=sinks, k_tensor=lt.k_bias or lt.qkv_bias,
                       weights_note="needs W_q (the query weights); run `ckpt-surgeon analyze` for the bound")
    return lr.redundancy_dict()


def analyze(source, context: int | None = None, epsilon: float = DEFAULT_EPSILON, **open_kwargs) -> AnalysisReport:
    """Static analysis of ``source`` (folder, .safetensors, .gguf, Hub repo id or an open
    Checkpoint): :func:`analyze_checkpoint` on it, opened with ``open_kwargs``.  With measured
    mode too: :func:`ckpt_surgeon.analysis.api.analyze` (``ckpt_surgeon.analyze``)."""
    from ..checkpoint import Checkpoint, open_checkpoint
    if isinstance(source, Checkpoint):
        source.refuse_truncated()
        return analyze_checkpoint(source, context=context, epsilon=epsilon)
    with open_checkpoint(source, **open_kwargs) as ck:
        ck.refuse_truncated()        # as every command but inspect (which shows the structure)
        return analyze_checkpoint(ck, context=context, epsilon=epsilon)
