"""Float64 probes: facts about an attention block that only a forward pass can establish.

A shrunken random instance of the checkpoint's own transformers class (same config, fewer
layers / heads / features, same head_dim so within-head dimensions map one to one: :mod:`.shrink`)
is run in float64 on random token ids, biases drawn with std 0.5 (:mod:`.instance`).  ``r = max|logits' - logits| /
max|logits|`` compares a modified instance with the original:

* **exact key bias**: zeroing every key-bias row of a group (every block of it at once) leaves
  ``r < INVARIANT_TOL``.  A *control* first checks the probe can see the group at all: a unit-scale
  perturbation of its ``W_k`` must move the logits by more than ``SENSITIVE_TOL`` (else invariance would be
  vacuous and nothing is claimed).
* **pass-through dims** (partial rotary): when the whole bias is not redundant, each
  dimension of kv head 0 is removed alone; the invariant ones, repeated in every kv head, are
  then removed together in every block and must leave ``r < INVARIANT_TOL``.
* **fused layout**: with the fused weight and bias of one block zeroed, q = k = const and
  v = 0, so the attention output is 0 whatever the softmax does; setting bias row i to 1 moves
  the logits exactly when i is a value row.  The layout (``concat`` / ``per_head`` /
  ``grouped``, :mod:`ckpt_surgeon.arch.layouts`) whose value rows are those rows is taken; any
  exact key claim made with it is then checked by the removal probe above.  A candidate layout is
  tried first: its value rows one by one, the other rows together (seeded values, which must leave
  the logits still); only when no layout is confirmed is every row tried alone (its rows then named
  in the refusal).
* **gated query** (a q projection of ``2 x heads x head_dim`` rows, query + output gate): with
  the rows a candidate layout calls the query zeroed (weights and bias), q = 0 after any q-norm
  and rotary, every logit is 0 and the attention is uniform, so perturbing ``W_k`` must leave the
  logits invariant; zeroing gate rows instead leaves the keys visible.  The candidate
  (:data:`~ckpt_surgeon.arch.layouts.GATE_LAYOUTS`) that passes, and only that one, is taken;
  none or several: ``unknown`` (the analysis then reads no query vectors).
* **value-bias fold**: ``b_o += W_o b_v`` (GQA-expanded, computed through the output module
  itself so its weight orientation does not matter) and ``b_v = 0`` in every block of the group
  must leave ``r < INVARIANT_TOL``.

Why these tolerances: float64 rounding through a few tiny layers, a softmax and a shifted
logit row leaves relative differences of ~1e-15..1e-13; a real dependence on a bias of std 0.5
moves the logits by ~1e-2.  ``INVARIANT_TOL = 1e-11`` sits far from both.
"""
from __future__ import annotations

import re

import numpy as np

from .instance import ProbeInstance
from .modtree import TOWER_PATH, Block, Fact, GroupFacts, read_blocks
from .shrink import layers_needed, shrink_candidates
from ..layouts import GATE_LAYOUTS, LAYOUTS, query_row_index, qkv_row_index

INVARIANT_TOL = 1e-11
SENSITIVE_TOL = 1e-7
_LAYER_PATH = re.compile(r"^(.*?\.\d+)\.(.+)$")      # (layer module, block path within it)


def _zero_rows(t, rows):
    v = t.detach().clone()
    v[list(rows)] = 0
    return v


def _fused_layout(inst: ProbeInstance, b: Block) -> tuple[str | None, str]:
    """Layout of one fused block from its value rows (see the module docstring)."""
    torch = inst.torch
    mod = inst.module(b, "qkv")
    if mod.bias is None:
        return None, "the fused projection has no bias: its value rows cannot be probed"
    h, kv, d = b.heads
    zero_w, zero_b = torch.zeros_like(mod.weight), torch.zeros_like(mod.bias)
    with torch.no_grad():
        saved = mod.weight.detach().clone(), mod.bias.detach().clone()
        mod.weight.copy_(zero_w)
        mod.bias.copy_(zero_b)
        try:
            ref = inst.run()

            def moves(rows, values) -> bool:
                mod.bias.zero_()
                mod.bias[rows] = values
                return float((inst.run() - ref).abs().max()) / inst.scale > SENSITIVE_TOL
            n = mod.bias.shape[0]
            v_rows = _v_rows_of_a_layout(moves, n, h, kv, d, torch)
            if v_rows is None:      # no layout's rows confirmed: every row alone, for the message below
                v_rows = [i for i in range(n) if moves([i], 1.0)]
        finally:
            mod.weight.copy_(saved[0])
            mod.bias.copy_(saved[1])
    found = []
    for layout in LAYOUTS:
        try:
            idx = qkv_row_index(layout, h, kv, d)
        except ValueError:
            continue
        if sorted(idx[2].tolist()) == v_rows:
            found.append((layout, idx))
    if not found:
        return None, f"value rows {v_rows[:6]}... match no known fused layout"
    first = found[0]
    if any(not (np.array_equal(first[1][0], o[1][0]) and np.array_equal(first[1][1], o[1][1])) for o in found[1:]):
        return None, "value rows fit several layouts that order q and k differently"
    return first[0], f"value rows probed ({len(v_rows)} rows) fit the {first[0]!r} layout"


def _v_rows_of_a_layout(moves, n: int, h: int, kv: int, d: int, torch) -> list | None:
    """The value rows of the first known layout the probe confirms, or None: every row the layout does not
    call a value row set at once (seeded normal values) must leave the logits still (q and k rows do, exactly,
    with v = 0), and each of its value rows set to 1 alone must move them, as the row-by-row probe asks of it.
    (The rows outside are then tested together, not one by one: a value row among them would move the
    logits unless the seeded values cancel exactly.)  ``n`` + layouts runs at most instead of ``n`` + 1."""
    tried = set()
    for layout in LAYOUTS:
        try:
            want = tuple(sorted(int(i) for i in qkv_row_index(layout, h, kv, d)[2]))
        except ValueError:
            continue
        if want in tried or not want or max(want) >= n:
            continue
        tried.add(want)
        others = sorted(set(range(n)) - set(want))
        values = torch.randn(len(others), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        if others and moves(others, values):
            continue
        if all(moves([i], 1.0) for i in want):
            return list(want)
    return None


def _shaken(inst: ProbeInstance, w, rows, conv: bool, gen):
    """``W_k`` with N(0, 1/fan_in) added to ``rows``: with transformers' small init the attention is
    nearly uniform and scaling W_k barely shows; a unit-scale perturbation of the keys does."""
    v = w.detach().clone()
    noise = inst.torch.randn(v.shape, generator=gen, dtype=v.dtype) / (v.shape[0] if conv else v.shape[1]) ** 0.5
    if conv:
        v[:, list(rows)] += noise[:, list(rows)]
    else:
        v[list(rows)] += noise[list(rows)]
    return v


def _gate_layout(inst: ProbeInstance, b: Block) -> tuple[str | None, str]:
    """Which rows of a gated q projection are the query (see the module docstring)."""
    h, kv, d = b.heads
    q, k = inst.module(b, "q"), inst.module(b, "k")
    shake = [(k.weight, _shaken(inst, k.weight, range(kv * d), False, inst.torch.Generator().manual_seed(11)))]
    control = inst.edit(shake)
    if control <= SENSITIVE_TOL:
        return None, f"probe control: perturbing W_k moved the logits by only {control:.2g}; the query rows are unknown"
    passed, seen = [], []
    for layout in GATE_LAYOUTS:
        rows = query_row_index(layout, h, d)
        zero = [(t, _zero_rows(t, rows)) for t in (q.weight, q.bias) if t is not None]
        with inst.patched(zero):
            ref = inst.run()
            with inst.patched(shake):
                r = float((inst.run() - ref).abs().max()) / inst.scale
        seen.append(f"{layout}: {r:.2g}")
        if r < INVARIANT_TOL:
            passed.append(layout)
    if len(passed) != 1 and not (len(passed) == 2 and h == 1):     # one head: both layouts are the same rows
        return None, f"no single layout zeroes the whole query (W_k perturbation with those rows zeroed: {', '.join(seen)})"
    return passed[0], (f"with the {passed[0]!r} query rows zeroed the logits ignore W_k ({', '.join(seen)}; control "
                       f"{control:.2g}): those rows are the query, the others the output gate")


def _k_rows(b: Block, layout: str | None):
    h, kv, d = b.heads
    if b.role("k"):
        return np.arange(kv * d)
    if layout is None:
        return None
    return qkv_row_index(layout, h, kv, d)[1]


def _k_param(inst: ProbeInstance, b: Block, which: str):
    mod = inst.module(b, "k" if b.role("k") else "qkv")
    return getattr(mod, which)


def _probe_k(inst, blocks, layout, pos, head_dim_kept) -> tuple[str, tuple, tuple, tuple]:
    """(class, reasons, pass dims, facts) of a group's key bias."""
    b0 = blocks[0]
    rows = [_k_rows(b, layout) for b in blocks]
    if rows[0] is None:
        return "unknown", ("fused layout not established: the key rows are unknown",), (), ()
    biases = [_k_param(inst, b, "bias") for b in blocks]
    if any(x is None for x in biases):
        return "unknown", ("no key bias in this configuration",), (), ()
    weights = [_k_param(inst, b, "weight") for b in blocks]
    conv = b0.conv1d

    gen = inst.torch.Generator().manual_seed(7)
    control = inst.edit([(w, _shaken(inst, w, r, conv, gen)) for w, r in zip(weights, rows)])
    if control <= SENSITIVE_TOL:
        return "invisible", (f"probe control: perturbing W_k moved the logits by only {control:.2g}; the probe cannot "
                             "see this attention, so nothing is claimed",), (), ()
    full = inst.edit([(t, _zero_rows(t, r)) for t, r in zip(biases, rows)])
    facts = [Fact("k_bias_removal", f"max relative logit change {full:.3g}", "probed",
                  f"every key-bias row of the group zeroed at once (control: perturbing W_k moves {control:.3g})")]
    if full < INVARIANT_TOL:
        return "exact", (f"probe: removing the whole key bias leaves the logits invariant (relative change {full:.2g}, "
                         "float64): q.b_k is constant over the keys",), (), tuple(facts)
    h, kv, d = b0.heads
    head0 = [d0 for d0 in range(d) if inst.edit([(biases[0], _zero_rows(biases[0], [rows[0][d0]]))]) < INVARIANT_TOL]
    reasons = []
    if b0.qk_norm:
        reasons.append("a norm follows the key projection (q/k-norm): the key bias passes through a nonlinearity")
    if b0.sinks:
        reasons.append("attention sinks: a constant logit shift changes the weight of the sink")
    if head0 and head_dim_kept:
        tail = list(range(head0[0], d)) == head0
        sel = [[r[g * d + x] for g in range(kv) for x in head0] for r in rows]
        joint = inst.edit([(t, _zero_rows(t, s)) for t, s in zip(biases, sel)])
        facts.append(Fact("k_pass_dims", f"{head0[0]}..{d - 1}" if tail else head0, "probed",
                          f"dims removed together in every kv head and block: relative change {joint:.3g}"))
        if joint < INVARIANT_TOL and tail:
            return "partial", (f"probe: within-head key dims {head0[0]}..{d - 1} pass through unrotated (removing them "
                               f"leaves the logits invariant, relative change {joint:.2g}); the other dims depend on "
                               "the distance",), tuple(head0), tuple(facts)
    if reasons:
        return "not-removable", tuple(reasons), (), tuple(facts)
    if pos == "rope":
        return "rope", ("probe: no key-bias dimension is removable without changing the logits, and the model "
                        "rotates q/k (rotary module): the bias term depends on the distance n - m",), (), tuple(facts)
    return "not-removable", (f"probe: removing the key bias changes the logits (relative {full:.2g}) although no "
                             "rotary module was found (norm, soft-capping or another nonlinearity after the "
                             "projection)",), (), tuple(facts)


def _probe_v(inst, blocks, layout) -> tuple[bool | None, Fact | None]:
    torch = inst.torch
    changes = []
    for b in blocks:
        h, kv, d = b.heads
        if not b.role("o"):
            return None, None
        o = inst.module(b, "o")
        if getattr(o, "bias", None) is None:
            return False, Fact("v_fold", False, "derived", "the output projection has no bias")
        if b.role("v"):
            vb, vrows = inst.module(b, "v").bias, np.arange(kv * d)
        else:
            if layout is None:
                return None, None
            vb, vrows = inst.module(b, "qkv").bias, qkv_row_index(layout, h, kv, d)[2]
        if vb is None:
            return None, None
        bv = vb.detach()[list(vrows)].reshape(kv, d)
        full = bv.repeat_interleave(h // kv, dim=0).reshape(1, h * d)      # query head h reads kv head h // group
        with torch.no_grad():
            y1, y0 = o(full), o(torch.zeros_like(full))
        if not (isinstance(y1, torch.Tensor) and isinstance(y0, torch.Tensor)):
            return None, Fact("v_fold", None, "derived", f"the output projection ({type(o).__name__}) is not a plain linear map")
        delta = (y1 - y0)[0]
        changes += [(o.bias, o.bias.detach() + delta), (vb, _zero_rows(vb, vrows))]
    # control: b_v alone zeroed must show, else invariance would be vacuous (a block the forward never runs)
    control = inst.edit(changes[1::2])
    if control <= SENSITIVE_TOL:
        return None, Fact("v_fold", None, "probed", f"probe control: zeroing b_v moved the logits by only {control:.2g}; "
                                                    "nothing is claimed")
    r = inst.edit(changes)
    ok = r < INVARIANT_TOL
    return ok, Fact("v_fold", ok, "probed", f"b_o += W_o b_v, b_v = 0 in every block: relative logit change {r:.3g}")


def _probe_group(inst, pblocks, g: str, k: str, pos: str, heads: tuple) -> GroupFacts:
    members = [b for b in pblocks if b.group == g and b.heads]
    if not members:
        return GroupFacts(g, k, "unknown", ("the shrunken probe instance has no block of this group",))
    facts, layout, gate = [], None, None
    if members[0].role("qkv"):
        layout, how = _fused_layout(inst, members[0])
        if layout is None and how.startswith("value rows []"):
            # no value row moves the output: this forward never runs the block (a vision tower's, on token
            # ids); said as invisible, so that the caller probes it where it runs (probe_groups)
            return GroupFacts(g, k, "invisible", ("probe: no value row of the fused projection moves the output: "
                                                  "this forward pass does not run the block",))
        facts.append(Fact("fused_layout", layout, "probed", how))
    if members[0].q_gate:
        gate, how = _gate_layout(inst, members[0])
        facts.append(Fact("q_gate_layout", gate, "probed", how))
        gate = gate or "unknown"
    kept = members[0].heads[2] == heads[2]
    cls, reasons, pass_dims, kf = _probe_k(inst, members, layout, pos, kept)
    vf, vfact = _probe_v(inst, members, layout)
    facts += list(kf) + ([vfact] if vfact else [])
    try:
        norm, how = norm_placement(inst, members[0])
    except Exception:   # noqa: BLE001 - a trace that cannot run claims no placement; the key-bias facts stand
        norm, how = None, ""
    if norm:
        facts.append(Fact("norm_placement", norm, "probed", how))
    return GroupFacts(g, k, cls, tuple(reasons), tuple(int(x) for x in pass_dims), layout, vf, tuple(facts), gate,
                      norm)


def norm_placement(inst, b: Block) -> tuple[str | None, str]:
    """("pre" | "post" | None, how) for block ``b``, traced in one forward pass of ``inst``: ``pre`` when the
    attention's input is the output of a norm of its own layer (x + attn(norm(x))), ``post`` when it is the
    layer's input and a norm of the layer runs after it (norm(x + attn(x))); None otherwise (a block outside a
    layer list, or a data flow neither describes)."""
    m = _LAYER_PATH.match(b.path)
    if not m:
        return None, ""
    layer_path, rel = m.group(1), m.group(2)
    layer, attn = inst.root.get_submodule(layer_path), inst.root.get_submodule(b.path)
    norms = [(n, mod) for n, mod in layer.named_modules() if "norm" in type(mod).__name__.lower()
             and not (n == rel or n.startswith(rel + "."))]
    if not norms:
        return None, ""
    seen: dict = {"norm_out": [], "order": []}

    def first_tensor(args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
        return x if isinstance(x, inst.torch.Tensor) else None

    def same(a, c):
        return a is not None and c is not None and (a is c or (a.data_ptr() == c.data_ptr() and a.shape == c.shape))

    # (hooks return None: a value returned would replace the module's inputs or output)
    def on_layer(mod, a, kw):
        seen.setdefault("layer_in", first_tensor(a, kw))

    def on_attn(mod, a, kw):
        seen.setdefault("attn_in", first_tensor(a, kw))
        seen["order"].append("attn")

    def on_norm(name):
        def hook(mod, a, out):
            seen["norm_out"].append(out if isinstance(out, inst.torch.Tensor) else None)
            seen["order"].append(name)
        return hook

    hooks = [layer.register_forward_pre_hook(on_layer, with_kwargs=True),
             attn.register_forward_pre_hook(on_attn, with_kwargs=True)]
    hooks += [mod.register_forward_hook(on_norm(name)) for name, mod in norms]
    try:
        inst.run()
    finally:
        for h in hooks:
            h.remove()
    x = seen.get("attn_in")
    if x is None or "attn" not in seen["order"]:
        return None, ""
    if any(same(x, o) for o in seen["norm_out"]):
        return "pre", "probe: the attention's input is the output of a norm of its layer (forward hooks)"
    after = seen["order"][seen["order"].index("attn") + 1:]
    if same(x, seen.get("layer_in")) and after:
        return "post", (f"probe: the attention reads the layer's input; {after[0]} runs after it (forward hooks)")
    return None, ""


def _seq2seq_class(model_type: str, klass):
    """The encoder-decoder class of the same model type (BART's cross-attention never runs in
    ``BartForCausalLM``: it is probed where it does), or None."""
    import transformers
    from transformers.models.auto import modeling_auto as ma
    name = ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    alt = getattr(transformers, name, None) if isinstance(name, str) else None
    return alt if alt is not None and alt is not klass else None


def probe_groups(cfg: dict, conf, klass, blocks, heads: tuple, pos: str) -> tuple:
    """GroupFacts for every group of ``blocks`` (the real model's), probed on a small instance."""
    groups: dict = {}
    for b in blocks:
        groups.setdefault(b.group, b.kind)
    out = []
    roleless = {b.group for b in blocks if b.kind != "none" and not b.roles}
    attn = {g: k for g, k in groups.items() if k != "none" and g not in roleless}
    for g, k in groups.items():
        if k == "none":
            out.append(GroupFacts(g, k, "none", ("no softmax attention in this layer",)))
        elif g in roleless:
            out.append(GroupFacts(g, k, "none", ("attention without q/k/v projections (MLA-style latent keys): no key "
                                                 "bias to analyse",)))
    if not attn:
        return tuple(out)
    # a latent-attention text stack has no readable heads: a tower beside it is probed with its own
    heads = heads or next((b.heads for b in blocks if b.heads and b.group in attn), ())
    if not heads:
        return tuple(out) + tuple(GroupFacts(g, k, "unknown", ("head counts could not be read",)) for g, k in attn.items())
    inst, pblocks, used, err = _small_instance(cfg, klass, blocks, heads)
    if inst is None:    # nothing is claimed, and the report says why
        return tuple(out) + tuple(GroupFacts(g, k, "unknown", (_failure(err),)) for g, k in attn.items())
    alt = None
    for g, k in attn.items():
        try:
            gf = _probe_group(inst, pblocks, g, k, pos, heads)
        except Exception as e:   # noqa: BLE001 - a probe that cannot run claims nothing (and says why)
            gf = GroupFacts(g, k, "unknown", (_failure(e).replace("built or run", "run on this block"),))
        if gf.k_class == "invisible" and k == "cross" and _seq2seq_class(conf.model_type, klass) is not None:
            try:
                if alt is None:
                    # a config saved by the decoder-only class says is_encoder_decoder=False
                    alt = ProbeInstance(dict(used, is_encoder_decoder=True, is_decoder=False),
                                    _seq2seq_class(conf.model_type, klass))
                    alt_blocks, _ = read_blocks(alt.model, alt.conf)
                gf2 = _probe_group(alt, alt_blocks, g, k, pos, heads)
                if gf2.k_class != "invisible":
                    note = Fact("probe_class", type(alt.model).__name__, "derived",
                                f"{type(inst.model).__name__} never runs this block; probed where it runs")
                    gf = GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})
            except Exception as e:   # noqa: BLE001 - as above: the reason is reported, nothing claimed
                gf = GroupFacts(g, k, "unknown", (_failure(e),))
        if gf.k_class == "invisible" and k == "cross":
            gf = _probe_with_encoder_states(inst, pblocks, g, k, pos, heads, gf)
        if gf.k_class == "invisible":     # a tower, Q-Former or sub-encoder the whole forward never runs
            gf = _probe_through_tower(inst, pblocks, g, k, pos, heads, gf)
        if gf.k_class == "invisible":
            tower = (("the probe feeds token ids only: this block is part of a vision / audio tower that such a forward "
                      "pass never runs",) if TOWER_PATH.search(g) else ())
            gf = GroupFacts(**{**gf.__dict__, "k_class": "unknown", "reasons": tower + tuple(gf.reasons)})
        out.append(_with_tower_norm(inst, pblocks, gf))
    return tuple(out)


def _with_tower_norm(inst, pblocks, gf):
    """``gf`` with its norm placement traced through the tower run alone when the whole forward never ran the
    block and nothing else made the probe run it (a Whisper-style encoder without key biases)."""
    member = next((b for b in pblocks if b.group == gf.group and b.heads), None)
    if gf.norm is not None or member is None:
        return gf
    try:
        view = inst.tower(gf.group)
        norm, how = norm_placement(view, member) if view is not None else (None, "")
    except Exception:   # noqa: BLE001 - no placement claimed
        return gf
    if norm is None:
        return gf
    return GroupFacts(**{**gf.__dict__, "norm": norm, "facts": gf.facts + (Fact("norm_placement", norm, "probed", how),)})


def _small_instance(cfg: dict, klass, blocks, heads: tuple) -> tuple:
    """The smallest shrunk model that builds and reads: (instance, its blocks, its config, None), else
    (None, None, None, the last failure)."""
    err = None
    # a model sharing one block's weights with a later one (Zamba) needs two blocks of the group
    cands = shrink_candidates(cfg, layers=layers_needed(blocks), heads=heads[:2], vocab=4096)
    cands += [c for c in shrink_candidates(cfg, layers=layers_needed(blocks, 2), heads=heads[:2], vocab=4096)[:1]
              if c not in cands]
    for small in cands:
        try:
            inst = ProbeInstance(small, klass)
            pblocks, _ = read_blocks(inst.model, inst.conf)
            return inst, pblocks, small, None
        except Exception as e:   # noqa: BLE001 - any build/forward failure: try a milder shrink
            err = e
    return None, None, None, err


def _probe_through_tower(inst, pblocks, g: str, k: str, pos: str, heads: tuple, gf):
    """A vision-tower block a token-id forward never runs, probed through the tower on random pixels
    (``gf`` unchanged when that sees nothing either)."""
    try:
        view = inst.tower(g)
        gf2 = _probe_group(view, pblocks, g, k, pos, heads) if view is not None else gf
        if gf2.k_class != "invisible" and view is not None:
            note = Fact("probe_input", f"{type(view.model).__name__}({', '.join(view.inputs)})", "derived",
                        "a token-id forward never runs this tower block; probed through the tower alone on seeded "
                        "inputs built from its config")
            gf = GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})
    except Exception as e:   # noqa: BLE001 - a probe that cannot run claims nothing (and says why)
        gf = GroupFacts(g, k, "unknown", (_failure(e).replace("built or run", "run on this block"),))
    return gf


def _probe_with_encoder_states(inst, pblocks, g: str, k: str, pos: str, heads: tuple, gf):
    """A decoder's cross-attention that a token-id forward never runs (TrOCRForCausalLM, no encoder of its
    own), probed with seeded ``encoder_hidden_states`` of the width its config names (``gf`` unchanged when the
    forward takes none or that sees nothing either)."""
    from .feeds import _configs, _get, _params
    width = _get(_configs(inst.model), ("cross_attention_hidden_size", "encoder_hidden_size", "hidden_size", "d_model"))
    if "encoder_hidden_states" not in _params(inst.model) or not isinstance(width, int):
        return gf
    try:
        g64 = inst.torch.Generator().manual_seed(5)
        states = inst.torch.randn((1, 10, width), generator=g64, dtype=inst.torch.float64)
        view = inst.view(inst.model, dict(inst.inputs, encoder_hidden_states=states), inst.outputs)
        gf2 = _probe_group(view, pblocks, g, k, pos, heads)
    except Exception:   # noqa: BLE001 - the forward refuses encoder states: nothing more is claimed
        return gf
    if gf2.k_class == "invisible":
        return gf
    note = Fact("probe_input", "encoder_hidden_states", "derived", "a token-id forward never runs this cross-attention; "
                "probed with seeded encoder states of the width the config names")
    return GroupFacts(**{**gf2.__dict__, "facts": gf2.facts + (note,)})


def _failure(e: Exception) -> str:
    first = str(e).splitlines()[0][:160] if str(e) else ""
    return f"probe instance could not be built or run ({type(e).__name__}: {first})"
