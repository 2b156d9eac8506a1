"""``qkv fuse`` / ``qkv split``: move between separate q/k/v projections and a fused one.

Layouts (arch/layouts.py): ``concat`` rows ``[Q; K; V]`` (Phi-3 ``qkv_proj``, GGUF ``attn_qkv``),
``per_head`` ``[h, 3, d]`` (GPT-NeoX, BLOOM), ``grouped`` ``[kv, q_per_kv + 2, d]`` (Falcon new
decoder), and ``conv1d``: GPT-2's ``Conv1D`` ``[in, 3*out]`` (``concat`` on the last axis).  Both
directions are pure row gathers on the stored bit patterns (whole rows of bytes along axis 0, so
quantized GGUF rows move intact), hence ``split(fuse(x)) == x`` bit for bit.

Names come from the registry (``Family.roles``: ``q``/``k``/``v`` and ``qkv`` module paths).  When
the family declares an :class:`~ckpt_surgeon.arch.families.ArchRewrite` (Phi-3 -> Llama, or
Mistral when a sliding window is set), ``split`` writes that architecture: the tensor splits it
lists (Phi-3's ``gate_up_proj`` -> ``gate_proj`` + ``up_proj``) are applied and ``config.json``
gets the new ``model_type`` / ``architectures`` (rope settings kept).  Otherwise the config is
kept and the fused layout is recorded in ``__metadata__`` so ``fuse`` can restore it exactly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..arch import families as F
from ..arch.gguf_names import gguf_roles
from ..arch.layouts import LAYOUTS
from ..arch.resolve import family_fused_layout, rope_params
from ..errors import CkptError, RefusedError, UnsupportedError
from ..formats.quant.schemes import SCHEMES
from .plan import Plan, TensorStep, step_params

CLI_LAYOUTS = LAYOUTS + ("conv1d",)


@dataclass(frozen=True)
class QkvLayer:
    layer: int
    fused: str                 # fused tensor (weight)
    q: str
    k: str
    v: str
    layout: str
    bias: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def row(self) -> dict:
        return {"layer": self.layer, "fused": self.fused, "layout": self.layout, "bias": self.bias}


def _recorded_layout(ckpt) -> str | None:
    """The fused layout a previous ckpt-surgeon run recorded in the source's ``__metadata__``."""
    raw = (ckpt.metadata or {}).get("ckpt_surgeon") if ckpt.format == "safetensors" else None
    if not isinstance(raw, str):
        return None
    from ..formats.write.writer import recorded_operations
    for op in reversed(recorded_operations(raw)):
        params = op.get("params")
        lay = params.get("qkv_layout") if isinstance(params, dict) else None
        if isinstance(lay, str) and lay:
            return lay
    return None


def _resolve_layout(layout_opt: str | None, default: str | None, fam, src) -> tuple[str, int]:
    """(row layout, weight axis) from --layout / the registry; ``conv1d`` = concat on the last axis."""
    lay = layout_opt or default
    if lay is None:
        raise UnsupportedError("the fused layout is unknown for this architecture; pass --layout", path=src)
    if lay == "conv1d":
        if not fam.conv1d:
            raise CkptError("--layout conv1d is GPT-2's Conv1D storage ([in, 3*out]); this architecture stores "
                            "weights [out, in]", path=src)
        return "concat", -1
    if lay not in LAYOUTS:
        raise CkptError(f"unknown --layout {lay!r} (choose from {', '.join(CLI_LAYOUTS)})", path=src)
    return lay, (-1 if fam.conv1d else 0)


def _check_layout(layout: str, h: int, kv: int, d: int, src) -> None:
    from ..arch.layouts import qkv_row_index
    try:
        qkv_row_index(layout, h, kv, d)
    except ValueError as e:
        raise CkptError(f"--layout {layout}: {e}", path=src) from None


def _swap_module(name: str, old: str, new: str) -> str:
    for kind in (".weight", ".bias"):
        if name.endswith(old + kind):
            return name[: -len(old + kind)] + new + kind
    raise CkptError(f"tensor name does not end in {old}.weight/.bias", tensor=name)


def _swap_stored(name: str, old: str, new: str) -> str:
    """A quantized weight's stored member (``...q_proj.scales``, ``...q_proj.weight.absmax``) under
    the other module's name."""
    i = name.rfind(old + ".")
    if i < 0 or (i and name[i - 1] != "."):
        raise CkptError(f"tensor name does not contain the module {old}", tensor=name)
    return name[:i] + new + name[i + len(old):]


def _heads(layout, src):
    h, kv, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    if not (h and kv and d):
        raise UnsupportedError("heads / kv heads / head_dim are unknown (config.json incomplete)", path=src)
    return h, kv, d


def _family(layout, src):
    fam = F.by_name(layout.family)
    if fam is None:
        raise UnsupportedError(f"architecture {layout.architecture!r} is not in the registry; q/k/v names unknown", path=src)
    return fam


def _roles(fam, ckpt) -> dict:
    """Module names per role: GGUF files use one naming for every family (attn_q ... attn_qkv)."""
    return gguf_roles() if ckpt.naming == "gguf" else fam.roles


def _quantized_members(ckpt, names: list, op: str) -> list | None:
    """The stored tensors that move when the logical weights ``names`` (q, k, v, or the fused one)
    are fused or split: ``(kind, stored names, role)`` with kind ``rows`` (axis 0 is the output row:
    cut / joined like the weight), ``cols`` (the last axis is the output: GPTQ / AWQ, packed members
    in whole words) or ``shared`` (one value per tensor: joined only when q/k/v hold
    the same bytes).  None for a dense weight.  Refused in one line naming the scheme where outputs
    do not move exactly: bitsandbytes 4-bit blocks over the flattened weight, scales per tensor /
    block, a weight_shape to rewrite, q/k/v g_idx that differ."""
    q = ckpt.quantization
    if q is None or not any(n in q.tensors for n in names):
        return None
    ts = [q.tensors.get(n) for n in names]
    label = f"{q.method}, {'/'.join(str(b) for b in q.bits)}-bit"

    def refuse(why, tensor=None):
        raise UnsupportedError(f"qkv {op}: refused: the q/k/v weights are quantized ({label}): {why}; nothing written",
                               path=ckpt.source, tensor=tensor or names[0])

    if any(t is None for t in ts):
        refuse("some of q/k/v are quantized and some are not")
    sch = SCHEMES[ts[0].scheme]
    label = f"{label}, {sch.key}"
    cols = dict(sch.col_members)
    if not sch.row_members and not cols:
        refuse(f"{sch.key} stores its codes as {sch.packing}, so output rows do not move on their own")
    if len({(t.scheme, t.bits, t.group_size, t.block) for t in ts}) != 1:
        refuse("q/k/v are quantized with different parameters")
    moves = []
    for role, _ in ts[0].members:
        if role == "bias":
            continue
        stored = tuple(t.member(role) for t in ts)
        if None in stored:
            refuse(f"{role} is present for only some of q/k/v")
        infos = [ckpt.stored_tensors[n] for n in stored]
        if role in sch.row_members:
            if any(not i.shape or i.shape[0] != t.shape[0] for i, t in zip(infos, ts)):
                refuse(f"{role} {list(infos[0].shape)} is not one row per output row (a per-tensor, group or block "
                       "scale cannot be joined exactly)", stored[0])
            moves.append(("rows", stored, role, 0, 1))
        elif role in cols:
            # GPTQ / AWQ keep outputs on the last axis; packed members hold 32/bits outputs per word,
            # so they move in whole words: a head (and each of q, k, v) must be whole words
            unit = 32 // ts[0].bits if cols[role] else 1
            if any(len(i.shape) != 2 or i.shape[-1] * unit != t.shape[0] for i, t in zip(infos, ts)) \
                    or ckpt.layout().head_dim % unit:
                refuse(f"{role} {list(infos[0].shape)} does not hold whole heads of outputs on its last axis", stored[0])
            moves.append(("cols", stored, role, -1, unit))
        elif role in sch.shared_members:
            if len({ckpt.read_raw(n) for n in stored}) != 1:
                refuse(f"q/k/v {role} differ, and a joined tensor has one", stored[0])
            moves.append(("shared", stored, role, 0, 1))
        else:
            refuse(f"{role} would have to be rewritten", stored[0])
    return moves


def _fuse_stored(ckpt, moves, q_mod, qkv_mod, row_layout, h, kv, d, layer) -> list:
    """Steps fusing a quantized q/k/v: every row member joined in the fused row layout (its bytes
    moved, no arithmetic), every shared member written once, the parts deleted."""
    steps = []
    for kind, stored, role, axis, unit in moves:
        out = _swap_stored(stored[0], q_mod, qkv_mod)
        info = ckpt.stored_tensors[stored[0]]
        if kind in ("rows", "cols"):
            shape = list(info.shape)
            shape[axis] = (h + 2 * kv) * d // unit
            steps.append(TensorStep("fuse_qkv", out, stored, step_params(layout=row_layout, axis=axis, n_heads=h,
                                    n_kv_heads=kv, head_dim=d // unit), like=stored[0], dtype=info.dtype,
                                    shape=tuple(shape), layer=layer,
                                    why=f"{row_layout} fused {role} (quantized weight's outputs)"))
        else:
            steps.append(TensorStep("rename", out, (stored[0],), layer=layer, why=f"{role}: the same for q/k/v"))
        steps += [TensorStep("delete", None, (n,), layer=layer, why="moved into the fused tensor") for n in stored]
    return steps


def _split_stored(ckpt, moves, qkv_mod, roles, row_layout, h, kv, d, layer) -> list:
    """Steps splitting a quantized fused qkv weight: each row member cut into q/k/v rows, each
    shared member copied to all three, the fused tensors deleted."""
    steps = []
    for kind, (fused,), role, axis, unit in moves:
        info = ckpt.stored_tensors[fused]
        for r in "qkv":
            out = _swap_stored(fused, qkv_mod, roles[r])
            if kind in ("rows", "cols"):
                shape = list(info.shape)
                shape[axis] = (h if r == "q" else kv) * d // unit
                steps.append(TensorStep("split_qkv", out, (fused,), step_params(
                    part=r, layout=row_layout, axis=axis, n_heads=h, n_kv_heads=kv, head_dim=d // unit), like=fused,
                    dtype=info.dtype, shape=tuple(shape), layer=layer, why=f"{r} outputs of the fused {role}"))
            else:
                steps.append(TensorStep("rename", out, (fused,), layer=layer, why=f"{role}: the same for q/k/v"))
        steps.append(TensorStep("delete", None, (fused,), layer=layer, why="replaced by q/k/v"))
    return steps


def _check_llamacpp_takes_split(fam, fused: str, roles: dict, src) -> None:
    """A GGUF is for llama.cpp: refuse a split whose q/k/v tensors its graph for this architecture has
    no slot for (the registry's ``llamacpp_absent``), which would give a file it does not load."""
    absent = fam.conversion.llamacpp_absent if fam.conversion is not None else ()
    q_name = _swap_module(fused, roles["qkv"], roles["q"])
    layer = re.sub(r"^blk\.(\d+)\..*", r"\1", q_name)
    if any(t.replace("{L}", layer) == q_name for t in absent):
        raise UnsupportedError(f"llama.cpp's {fam.gguf_archs[0] if fam.gguf_archs else fam.name} graph takes only the "
                           f"fused {roles['qkv']} (it has no {roles['q']} / {roles['k']} / {roles['v']} slots), so a "
                           "split GGUF would not load there; nothing was written", path=src, tensor=fused,
                           hint="convert the GGUF to an HF folder and split that")


def plan_qkv_split(ckpt, *, layout: str | None = None, to: str | None = None) -> Plan:
    """Separate q/k/v from each layer's fused projection (weights and biases)."""
    src = ckpt.source
    ckpt.refuse_truncated()        # every tensor is copied: a file cut short is refused before planning
    lay_ = ckpt.layout()
    fam = _family(lay_, src)
    h, kv, d = _heads(lay_, src)
    fused_layers = [lt for lt in lay_.layers if lt.qkv_weight]
    if not fused_layers:
        raise RefusedError("has no fused qkv projection to split (it already has separate q/k/v?)", path=src)
    roles = _roles(fam, ckpt)
    if not all(isinstance(roles.get(r), str) for r in ("q", "k", "v", "qkv")):
        raise UnsupportedError(f"the registry names no separate q/k/v modules for {fam.name}", path=src)
    if ckpt.naming == "gguf":
        _check_llamacpp_takes_split(fam, fused_layers[0].qkv_weight, roles, src)
    rec = _recorded_layout(ckpt)
    row_layout, axis = _resolve_layout(layout, rec or (lay_.fused_layout if not lay_.conv1d else "conv1d"), fam, src)
    _check_layout(row_layout, h, kv, d, src)
    steps, layers = [], []
    qkv_mod = roles["qkv"]
    if ckpt.naming == "gguf" and to not in (None, "same"):
        raise UnsupportedError("architecture rewrites apply to Hugging Face checkpoints, not GGUF", path=src)
    rewrite = _pick_rewrite(fam, ckpt.config or {}, to, src) if (to != "same" and ckpt.naming != "gguf") else None
    for lt in fused_layers:
        for kind, fused in (("weight", lt.qkv_weight), ("bias", lt.qkv_bias)):
            if fused is None:
                continue
            info = ckpt.tensors[fused]
            a = axis if kind == "weight" else 0
            names = [_swap_module(fused, qkv_mod, roles[r]) for r in ("q", "k", "v")]
            moves = _quantized_members(ckpt, [fused], "split") if kind == "weight" else None
            if moves is not None:
                if a != 0:
                    raise UnsupportedError("qkv split: refused: a quantized Conv1D weight", path=src, tensor=fused)
                steps += _split_stored(ckpt, moves, qkv_mod, roles, row_layout, h, kv, d, lt.layer)
                continue
            steps += _split_steps(info, fused, names, a, row_layout, (h, kv, d), lt.layer, kind)
            steps.append(TensorStep("delete", None, (fused,), layer=lt.layer, why="replaced by q/k/v"))
        q, k, v = (_swap_module(lt.qkv_weight, qkv_mod, roles[r]) for r in ("q", "k", "v"))
        layers.append(QkvLayer(lt.layer, lt.qkv_weight, q, k, v, row_layout if axis == 0 else "conv1d",
                               lt.qkv_bias is not None))
    notes, config, changes = [], None, ()
    record = {"qkv_layout": row_layout if axis == 0 else "conv1d"}
    if rewrite is not None:
        extra, config, changes = _apply_rewrite(ckpt, lay_, fam, rewrite, fused_layers, src)
        steps += extra
        notes.append(f"written as {rewrite.architectures[0]} ({rewrite.model_type}): q/k/v split from {qkv_mod}"
                     + "".join(f", {m} split into {a} + {b}" for m, (a, b) in rewrite.tensor_splits))
    else:
        notes.append(_split_note(ckpt, fam, lay_, roles, record["qkv_layout"]))
    return Plan("qkv-split", src, {"layout": record["qkv_layout"], "to": rewrite.model_type if rewrite else None},
                tuple(steps), config=config, config_changes=changes, layers=tuple(layers), notes=tuple(notes),
                record=record)


def _split_note(ckpt, fam, lay_, roles: dict, layout: str) -> str:
    """What loads a split checkpoint that keeps its config (no architecture rewrite)."""
    if ckpt.naming == "gguf":
        # _check_llamacpp_takes_split let it through: the graph takes separate q/k/v too
        return ("llama.cpp loads blk.N.attn_q / attn_k / attn_v in place of attn_qkv for this architecture "
                "(llama-model.cpp create_tensor_qkv), so this GGUF runs there as it is")
    cls = fam.hf_class or lay_.architecture
    if "qkv" in fam.surgery_roles:
        # the family's own modules are separate q/k/v (Qwen2, Llama): splitting a `qkv fuse` output
        # gives back the layout transformers reads (issue 24: this note used to say the opposite)
        return (f"config kept ({lay_.architecture}); q/k/v are split back into {roles['q']}, {roles['k']} and "
                f"{roles['v']}, the modules transformers' {cls} has, so it loads this folder as it is")
    return (f"config kept ({lay_.architecture}); transformers' {cls} reads the fused {roles['qkv']}, not separate "
            "q/k/v (it would initialise that at random), so load this with a runtime that takes separate q/k/v, "
            f"or run `qkv fuse` to restore it (the {layout} layout is recorded in the metadata)")


def _split_steps(info, fused: str, names: list, a: int, row_layout: str, heads: tuple, layer: int,
                 kind: str) -> list:
    """The three ``split_qkv`` steps taking q, k and v (``names``) out of tensor ``fused`` along axis ``a``."""
    h, kv, d = heads
    steps = []
    for r, out in zip("qkv", names):
        rows = (h if r == "q" else kv) * d
        shape = list(info.shape)
        shape[a] = rows
        if info.quantized and a != 0:
            raise UnsupportedError("cannot split a quantized tensor along its inner axis", tensor=fused)
        steps.append(TensorStep("split_qkv", out, (fused,), step_params(
            part=r, layout=row_layout, axis=a, n_heads=h, n_kv_heads=kv, head_dim=d),
            like=fused, dtype=info.dtype, shape=tuple(shape), layer=layer,
            why=f"{r} rows of the {row_layout} fused {kind}"))
    return steps


def _pick_rewrite(fam, cfg, to, src):
    if not fam.unfused_as:
        if to not in (None, "same"):
            raise UnsupportedError(f"no declared rewrite of {fam.name} as {to!r}", path=src)
        return None
    cands = [r for r in fam.unfused_as if to is None or r.model_type == to]
    if not cands:
        raise UnsupportedError(f"{fam.name} can be written as {', '.join(r.model_type for r in fam.unfused_as)}, "
                               f"not {to!r}", path=src)
    if to is None:
        for r in cands:
            if r.when_set is None or cfg.get(r.when_set) is not None:
                return r
    return cands[0]


def _apply_rewrite(ckpt, layout, fam, rw, fused_layers, src):
    """Steps for the rewrite's tensor splits and the rewritten config."""
    cfg = dict(ckpt.config or {})
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = (rp.get("rope_type") or rp.get("type") or "default") if isinstance(rp, dict) else "default"
    if rope_type not in rw.rope_types:
        raise RefusedError(f"refused: rope_type {rope_type!r} is not verified for {rw.architectures[0]}; "
                           f"the split keeps {fam.name} (pass --to same)", path=src)
    if layout.position.rotary_dim is not None and layout.head_dim and layout.position.rotary_dim != layout.head_dim:
        raise RefusedError(f"refused: partial rotary ({layout.position.rotary_dim} of {layout.head_dim} dims); "
                           f"{rw.architectures[0]} rotates whole heads (pass --to same)", path=src)
    biased = [lt.qkv_bias or lt.o_bias for lt in layout.layers if lt.qkv_bias or lt.o_bias]
    if biased:
        raise RefusedError(f"refused: attention biases present ({biased[0]}); the rewrite to {rw.architectures[0]} "
                           "assumes none (pass --to same)", path=src)
    steps = []
    for lt in fused_layers:
        prefix = lt.qkv_weight[: -len(fam.roles["qkv"] + ".weight")]
        for mod, (a, b) in rw.tensor_splits:
            for kind in ("weight", "bias"):
                name = f"{prefix}{mod}.{kind}"
                if name not in ckpt.tensors:
                    continue
                if ckpt.quantization is not None and name in ckpt.quantization.tensors:
                    raise UnsupportedError(f"qkv split --to {rw.model_type}: refused: {mod} is quantized "
                                           f"({ckpt.quantization.method}); its halves are not cut by this tool",
                                           path=src, tensor=name)
                info = ckpt.tensors[name]
                half = list(info.shape)
                half[0] //= 2
                for part, new in ((0, a), (1, b)):
                    steps.append(TensorStep("split_halves", f"{prefix}{new}.{kind}", (name,),
                                            step_params(part=part, axis=0), like=name, dtype=info.dtype,
                                            shape=tuple(half), layer=lt.layer, why=f"{'first' if part == 0 else 'second'} half of {mod}"))
                steps.append(TensorStep("delete", None, (name,), layer=lt.layer, why=f"replaced by {a} + {b}"))
    changes = []
    new = {k: v for k, v in cfg.items() if k not in rw.drop_config_keys}
    for k in rw.drop_config_keys:
        if cfg.get(k) is not None:
            changes.append((k, cfg[k], None))
    for k, v in (("model_type", rw.model_type), ("architectures", list(rw.architectures)),
                 ("head_dim", layout.head_dim), ("attention_bias", False), ("mlp_bias", False)):
        if cfg.get(k) != v and not (k in ("attention_bias", "mlp_bias") and not cfg.get(k)):
            changes.append((k, cfg.get(k), v))
        new[k] = v
    if "rope_parameters" not in new and "rope_theta" not in new:
        new["rope_theta"] = rope_params(cfg)["theta"]
    return steps, new, tuple(changes)


def plan_qkv_fuse(ckpt, *, layout: str | None = None) -> Plan:
    """Fuse each layer's separate q/k/v projections (weights and biases) into one tensor."""
    src = ckpt.source
    ckpt.refuse_truncated()        # every tensor is copied: a file cut short is refused before planning
    lay_ = ckpt.layout()
    fam = _family(lay_, src)
    h, kv, d = _heads(lay_, src)
    sep = [lt for lt in lay_.layers if lt.q_weight and lt.k_weight and lt.v_weight]
    if not sep:
        raise RefusedError("has no separate q/k/v projections to fuse", path=src)
    roles = _roles(fam, ckpt)
    if not isinstance(roles.get("qkv"), str):
        raise UnsupportedError(f"the registry names no fused qkv module for {fam.name}", path=src)
    rec = _recorded_layout(ckpt)
    default = rec or ("concat" if ckpt.naming == "gguf" else
                      (family_fused_layout(fam, ckpt.config or {}) if not lay_.conv1d else "conv1d")) or "concat"
    row_layout, axis = _resolve_layout(layout, default, fam, src)
    _check_layout(row_layout, h, kv, d, src)
    qkv_mod, q_mod = roles["qkv"], roles["q"]
    steps, layers = [], []
    for lt in sep:
        for kind in ("weight", "bias"):
            names = [getattr(lt, f"{r}_{kind}") for r in "qkv"]
            if not any(names):
                continue
            if not all(names):
                raise RefusedError(f"refused: layer {lt.layer} has a {kind} on only some of q/k/v; a fused {kind} "
                                   "needs all three", path=src, tensor=next(n for n in names if n))
            moves = _quantized_members(ckpt, names, "fuse") if kind == "weight" else None
            if moves is not None:
                if axis != 0:
                    raise UnsupportedError("qkv fuse: refused: a quantized Conv1D weight", path=src, tensor=names[0])
                steps += _fuse_stored(ckpt, moves, q_mod, qkv_mod, row_layout, h, kv, d, lt.layer)
                continue
            infos = [ckpt.tensors[n] for n in names]
            if len({i.dtype for i in infos}) != 1:
                raise RefusedError(f"refused: q/k/v {kind}s of layer {lt.layer} have different dtypes "
                                   f"({', '.join(i.dtype for i in infos)})", path=src, tensor=names[0])
            a = axis if kind == "weight" else 0
            shape = list(infos[0].shape)
            shape[a] = (h + 2 * kv) * d
            if infos[0].quantized and a != 0:
                raise UnsupportedError("cannot fuse quantized tensors along their inner axis", tensor=names[0])
            out = _swap_module(names[0], q_mod, qkv_mod)
            steps.append(TensorStep("fuse_qkv", out, tuple(names), step_params(
                layout=row_layout, axis=a, n_heads=h, n_kv_heads=kv, head_dim=d), like=names[0],
                dtype=infos[0].dtype, shape=tuple(shape), layer=lt.layer, why=f"{row_layout} fused {kind}"))
            steps += [TensorStep("delete", None, (n,), layer=lt.layer, why="moved into the fused tensor") for n in names]
        layers.append(QkvLayer(lt.layer, _swap_module(lt.q_weight, q_mod, qkv_mod), lt.q_weight, lt.k_weight,
                               lt.v_weight, row_layout if axis == 0 else "conv1d", lt.q_bias is not None))
    record = {"qkv_layout": row_layout if axis == 0 else "conv1d"}
    notes = _fuse_notes(ckpt, fam, lay_, roles, record["qkv_layout"])
    return Plan("qkv-fuse", src, {"layout": record["qkv_layout"]}, tuple(steps), layers=tuple(layers),
                notes=tuple(notes), record=record)


def _fuse_notes(ckpt, fam, lay_, roles: dict, fused_layout: str) -> list[str]:
    """What a fuse plan says: where the fused tensor went and, when the family's own modules are
    separate, what the fused file is for (issue 24)."""
    qkv_mod = roles["qkv"]
    notes = [f"q/k/v fused into {qkv_mod} ({fused_layout} layout, recorded in the metadata); config kept"]
    if "qkv" not in fam.surgery_roles:
        return notes
    if ckpt.naming == "gguf":
        notes.append("llama.cpp loads blk.N.attn_qkv in place of attn_q / attn_k / attn_v (llama-model.cpp "
                     "create_tensor_qkv), so this GGUF runs there as it is")
    else:
        notes.append(f"transformers' {fam.hf_class or lay_.architecture} has no {qkv_mod}: it would drop it and "
                     f"initialise {roles['q']} / {roles['k']} / {roles['v']} at random (`ckpt-surgeon lint` says "
                     "so), so this folder is for tools that take one fused [Q; K; V] tensor (as GGUF's attn_qkv, "
                     "which llama.cpp loads for this architecture); `qkv split` restores the original bit for bit")
    return notes


def qkv_split(source, out, *, layout: str | None = None, to: str | None = None, force: bool = False,
              check: str = "auto", source_hash: str = "auto", **open_kw):
    """Split fused q/k/v projections into separate ones, bit for bit: the twin of ``ckpt-surgeon qkv split``
    (docs/qkv.md).

    ``layout``: the fused layout (concat | per_head | grouped | conv1d; default the architecture's own or the
    one an earlier run recorded); ``to``: ``same`` keeps a Phi-3 a Phi-3 (default: written as Llama).

    Returns:
        :class:`~ckpt_surgeon.surgery.plan.SurgeryResult`

    Example::

        import ckpt_surgeon
        ckpt_surgeon.qkv_split("Phi-3-mini", "phi3-llama")          # a LlamaForCausalLM, the same logits
    """
    from ..checkpoint import open_checkpoint
    from .plan import execute

    with open_checkpoint(source, **open_kw) as ck:
        return execute(ck, plan_qkv_split(ck, layout=layout, to=to), out, force=force, check=check,
                       source_hash=source_hash)


def qkv_fuse(source, out, *, layout: str | None = None, force: bool = False, check: str = "auto",
             source_hash: str = "auto", **open_kw):
    """Fuse separate q/k/v projections into one tensor, bit for bit: the twin of ``ckpt-surgeon qkv fuse``
    (docs/qkv.md).  ``layout``: concat | per_head | grouped | conv1d (default: the architecture's own).

    Returns:
        :class:`~ckpt_surgeon.surgery.plan.SurgeryResult`

    Example::

        import ckpt_surgeon
        res = ckpt_surgeon.qkv_fuse("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-fused.gguf")
        ckpt_surgeon.qkv_split("smollm2-fused.gguf", "smollm2-split.gguf")   # the original tensors again
    """
    from ..checkpoint import open_checkpoint
    from .plan import execute

    with open_checkpoint(source, **open_kw) as ck:
        return execute(ck, plan_qkv_fuse(ck, layout=layout), out, force=force, check=check, source_hash=source_hash)
