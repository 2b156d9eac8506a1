"""How a distributed ``verify`` splits its work, decided from the headers before anything loads.

*data* (data-parallel over corpus chunks): every rank holds both models whole and runs every
``world``-th chunk; chosen when both models fit one rank with the single-process plan's headroom
(:func:`.core.plan_memory` says "parallel" for the smallest free memory of any rank).

*pipeline* (over decoder layers): rank ``r`` holds a contiguous block of decoder layers of both
models (blocks balanced by parameter count), rank 0 embeds, the last rank applies the final norm
and the head; hidden states pass rank to rank with :data:`IN_FLIGHT` chunks in flight.  Chosen
when both models do not fit one rank; refused in one line when a rank's share would not fit
either, or when there are more ranks than layers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import CkptError

MODES = ("auto", "data", "pipeline")
# Chunks (sequences) between rank 0 and the last rank at once: enough that every stage has work
# while the others compute, bounded so that in-flight hidden states stay small.
IN_FLIGHT = 4


@dataclass(frozen=True)
class LayerSizes:
    """Per decoder layer parameter counts (both models summed) and the rest, from the headers."""

    per_layer: tuple
    rest: int                     # embedding, head, final norm (both models)
    hidden: int
    vocab: int


@dataclass(frozen=True)
class DistPlan:
    mode: str                     # data | pipeline
    why: str
    world: int
    blocks: tuple                 # pipeline: (start, stop) decoder layers per rank; data: ()
    per_rank: dict                # mode -> estimated bytes on the busiest rank

    def to_dict(self) -> dict:
        return dict(mode=self.mode, why=self.why, world=self.world, blocks=[list(b) for b in self.blocks],
                    per_rank=dict(self.per_rank))


def layer_sizes(paths, revision=None) -> LayerSizes:
    """Headers only: per-layer parameters of the given inputs summed layer by layer."""
    from ..checkpoint import open_checkpoint
    from .loading import NOT_WEIGHTS
    from .memory import LAYER_KEY
    per: dict = {}
    rest, hidden, vocab = 0, 0, 0
    for p in paths:
        ck = open_checkpoint(p)
        try:
            for name, info in ck.tensors.items():
                if info.dtype.upper() in NOT_WEIGHTS:
                    continue
                m = LAYER_KEY.search(name)
                if m:
                    per[int(m.group(1))] = per.get(int(m.group(1)), 0) + info.numel
                else:
                    rest += info.numel
            cfg = ck.config or {}
            text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
            hidden = max(hidden, int(text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0))
            vocab = max(vocab, int(text.get("vocab_size") or 0))
        finally:
            ck.close()
    n = max(per) + 1 if per else 0
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0) if paths else 0
    if 0 < layers < n:           # stored layers the model does not run (DeepSeek-V3's MTP layer 61)
        rest += sum(per.get(i, 0) for i in range(layers, n))
        n = layers
    return LayerSizes(tuple(per.get(i, 0) for i in range(n)), rest, hidden, vocab)


def blocks_for(per_layer, world: int) -> tuple:
    """Contiguous blocks of layers, one per rank, each as close to 1/world of the parameters as
    the layer boundaries allow (every block at least one layer)."""
    n = len(per_layer)
    if world > n:
        raise CkptError(f"a pipeline over decoder layers needs a layer per rank: the models have {n} decoder layers "
                        f"and this run has {world} ranks; it would use {n} ranks (torchrun --nproc-per-node with "
                        f"{n} processes in all), or the data-parallel mode when both models fit one rank")
    total = float(sum(per_layer))
    cum = [0]
    for x in per_layer:
        cum.append(cum[-1] + x)
    edges = [0]
    for r in range(1, world):
        target = total * r / world
        edges.append(min(range(edges[-1] + 1, n - (world - r) + 1), key=lambda s: abs(cum[s] - target)))
    edges.append(n)
    return tuple((edges[i], edges[i + 1]) for i in range(world))


def plan_distributed(paths, *, dtype: str, world: int, available: int | None, positions: int, hidden_rows: int,
                     forced: str = "auto", one_at_a_time: bool = False) -> DistPlan:
    """Choose data or pipeline for ``paths`` (the model inputs that run in transformers) on
    ``world`` ranks with ``available`` bytes free on the tightest one.  ``one_at_a_time``: the
    models run one after the other (``--save-reference`` / ``--reference``): a rank holds one."""
    from .memory import BYTES_PER_PARAM, PARALLEL_EXTRA_BYTES, PARALLEL_HEADROOM, human_size
    if forced not in MODES:
        raise CkptError(f"unknown distributed mode {forced!r}; choose one of {', '.join(MODES)}")
    if one_at_a_time and len(paths) > 1:
        each = [layer_sizes([p]) for p in paths]
        sizes = max(each, key=lambda x: sum(x.per_layer) + x.rest)
    else:
        sizes = layer_sizes(paths)
    item = BYTES_PER_PARAM.get(dtype, 4)
    both = (sum(sizes.per_layer) + sizes.rest) * item
    data_need = int(both * PARALLEL_HEADROOM) + PARALLEL_EXTRA_BYTES
    need = {"data": data_need}
    blocks: tuple = ()
    if sizes.per_layer and world <= len(sizes.per_layer):
        blocks = blocks_for(sizes.per_layer, world)
        heaviest = max(sum(sizes.per_layer[a:b]) for a, b in blocks) * item
        flight = IN_FLIGHT * 2 * hidden_rows * max(sizes.hidden, 1) * item * 3
        logits = IN_FLIGHT * 2 * hidden_rows * max(sizes.vocab, 1) * 4
        need["pipeline"] = int(heaviest * PARALLEL_HEADROOM) + sizes.rest * item + flight + logits + \
            PARALLEL_EXTRA_BYTES
    free = "free memory unknown" if available is None else f"{human_size(available)} free on the tightest rank"
    if forced == "data" or (forced == "auto" and (available is None or data_need <= available)):
        why = "asked for" if forced == "data" else f"the models fit one rank (~{human_size(data_need)}, {free})"
        return DistPlan("data", why, world, (), need)
    if not blocks:
        blocks_for(sizes.per_layer, world)          # raises the one-line refusal
    if forced == "pipeline":
        return DistPlan("pipeline", "asked for", world, blocks, need)
    if need["pipeline"] > available:
        raise CkptError(f"not enough memory per rank: both models need ~{human_size(data_need)} on one rank and a "
                        f"{world}-rank pipeline ~{human_size(need['pipeline'])} on its busiest rank, {free}",
                        hint="more ranks, a larger memory budget, or --dtype float32 instead of float64")
    return DistPlan("pipeline", f"both models need ~{human_size(data_need)}, {free}: {world} ranks hold "
                                f"{len(sizes.per_layer)} layers in blocks {list(blocks)} (~{human_size(need['pipeline'])} "
                                "on the busiest)", world, blocks, need)


def fingerprint(paths) -> list:
    """What each rank must see alike: per file of each input its size and the sha256 of its first
    64 KiB (safetensors and GGUF headers and config.json live there)."""
    import hashlib
    out = []
    for p in paths:
        if p is None:
            continue
        p = os.fspath(p)
        files = [p] if os.path.isfile(p) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs) if os.path.isdir(p) else []
        for f in files:
            try:
                with open(f, "rb") as fh:
                    head = fh.read(1 << 16)
                out.append((f, os.path.getsize(f), hashlib.sha256(head).hexdigest()))
            except OSError:
                out.append((f, -1, ""))
        if not files:
            out.append((p, -1, "missing"))
    return out


def compare_fingerprints(all_prints: list) -> str | None:
    """The first difference between rank 0's files and another rank's, as a line, or None."""
    base = {f: (s, h) for f, s, h in all_prints[0]}
    for r, prints in enumerate(all_prints[1:], start=1):
        mine = {f: (s, h) for f, s, h in prints}
        for f in sorted(set(base) | set(mine)):
            a, b = base.get(f), mine.get(f)
            if a != b:
                what = "is missing" if b is None or b[0] < 0 else (
                    f"has {b[0]} bytes (rank 0: {a[0] if a else 'missing'})" if a is None or a[0] != b[0]
                    else "has other header bytes than on rank 0")
                return f"rank {r} sees different files: {f} {what}; every rank must read the same inputs"
    return None
