"""How a distributed ``verify`` splits its work, decided from the headers before anything loads.

*data* (data-parallel over corpus chunks): every rank holds both models whole and runs every
``world``-th chunk; chosen when both models fit one rank with the single-process plan's headroom
(:func:`.core.plan_memory` says "parallel" for the smallest free memory of any rank).

*pipeline* (over decoder layers): rank ``r`` holds a contiguous block of decoder layers of both
models, rank 0 embeds (reading only the embedding rows of a chunk's tokens), the last rank applies
the final norm and the head (held whole there: one vocabulary x hidden matrix per model, the
embedding itself when tied); hidden states pass rank to rank with :data:`IN_FLIGHT` chunks in
flight.  The blocks balance what each rank holds in bytes, the head counted on the last rank
(:func:`blocks_for`).  Chosen when both models do not fit one rank; refused in one line when a
rank's share would not fit either, or when there are more ranks than layers.
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
    head: int = 0                 # of ``rest``: what the last rank holds whole (one vocab-row matrix per model)
    by_rows: int = 0              # of ``rest``: every vocab-row matrix (embeddings, heads), not held by every rank


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
    rest, hidden, vocab, head, by_rows = 0, 0, 0, 0, 0
    for p in paths:
        ck = open_checkpoint(p)
        try:
            cfg = ck.config or {}
            text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
            hidden = max(hidden, int(text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0))
            vocab = max(vocab, int(text.get("vocab_size") or 0))
            outside = []
            for name, info in ck.tensors.items():
                if info.dtype.upper() in NOT_WEIGHTS:
                    continue
                m = LAYER_KEY.search(name)
                if m:
                    per[int(m.group(1))] = per.get(int(m.group(1)), 0) + info.numel
                else:
                    rest += info.numel
                    outside.append(info)
            h, r = head_numel(outside, int(text.get("vocab_size") or 0))
            head, by_rows = head + h, by_rows + r
        finally:
            ck.close()
    n = max(per) + 1 if per else 0
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0) if paths else 0
    if 0 < layers < n:           # stored layers the model does not run (DeepSeek-V3's MTP layer 61)
        rest += sum(per.get(i, 0) for i in range(layers, n))
        n = layers
    return LayerSizes(tuple(per.get(i, 0) for i in range(n)), rest, hidden, vocab, head, by_rows)


def head_numel(outside, vocab: int) -> tuple:
    """``(head, all)``: among a model's tensors outside the decoder layers, the parameters of the
    largest one with a row per vocabulary entry (the head, or the embedding a tied head is; an
    untied pair is two of the same size, and the last rank holds one), and of all such tensors.
    Found by shape, not name."""
    rows = [info.numel for info in outside if info.shape and vocab and int(info.shape[0]) == vocab]
    return max(rows, default=0), sum(rows)


def blocks_for(per_layer, world: int, *, first: int = 0, last: int = 0) -> tuple:
    """Contiguous blocks of layers, one per rank (every block at least one layer), that balance what
    each rank holds: its layers, plus ``first`` on rank 0 and ``last`` on the last rank (the head).

    The heaviest rank is made as light as the layer boundaries allow (the smallest achievable
    maximum); among the splits that reach it, the one whose boundaries lie closest to the even
    shares ``(first + layers + last) * r / world``.  When ``last`` alone exceeds an even share the
    last rank gets one layer and the bound is ``last`` + that layer."""
    n = len(per_layer)
    if world > n:
        raise CkptError(f"a pipeline over decoder layers needs a layer per rank: the models have {n} decoder layers "
                        f"and this run has {world} ranks; it would use {n} ranks (torchrun --nproc-per-node with "
                        f"{n} processes in all), or the data-parallel mode when both models fit one rank")
    cum = [0]
    for x in per_layer:
        cum.append(cum[-1] + x)
    weight = _block_weight(cum, world, first, last)
    bound = _least_max(n, world, weight)
    total = float(first + cum[-1] + last)
    # cost[r][s]: the least summed squared distance of the boundaries after ranks 0..r-1 (rank r's
    # block starting at layer s) from the even shares, every block within the bound
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(world + 1)]
    back = [[0] * (n + 1) for _ in range(world + 1)]
    cost[0][0] = 0.0
    for r in range(1, world + 1):
        for s in range(r, n - (world - r) + 1):
            off = 0.0 if r == world else (first + cum[s] - total * r / world) ** 2
            for t in range(r - 1, s):
                if cost[r - 1][t] < inf and weight(r - 1, t, s) <= bound and cost[r - 1][t] + off < cost[r][s]:
                    cost[r][s], back[r][s] = cost[r - 1][t] + off, t
    edges = [n]
    for r in range(world, 0, -1):
        edges.append(back[r][edges[-1]])
    edges.reverse()
    return tuple((edges[i], edges[i + 1]) for i in range(world))


def _block_weight(cum, world: int, first: int, last: int):
    def weight(r: int, a: int, b: int) -> int:
        return cum[b] - cum[a] + (first if r == 0 else 0) + (last if r == world - 1 else 0)
    return weight


def _least_max(n: int, world: int, weight) -> int:
    """The smallest achievable weight of the heaviest block (contiguous, at least one layer each)."""
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(world + 1)]
    best[0][0] = 0
    for r in range(1, world + 1):
        for s in range(r, n - (world - r) + 1):
            best[r][s] = min((max(best[r - 1][t], weight(r - 1, t, s)) for t in range(r - 1, s)
                              if best[r - 1][t] < inf), default=inf)
    return best[world][n]


def rank_weights(per_layer, blocks, *, first: int = 0, last: int = 0) -> list:
    """What each rank of ``blocks`` holds, in the units of ``per_layer`` (its layers, rank 0 plus
    ``first``, the last rank plus ``last``)."""
    return [sum(per_layer[a:b]) + (first if r == 0 else 0) + (last if r == len(blocks) - 1 else 0)
            for r, (a, b) in enumerate(blocks)]


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
        blocks = blocks_for(sizes.per_layer, world, last=sizes.head)
        heaviest = max(rank_weights(sizes.per_layer, blocks, last=sizes.head)) * item
        flight = IN_FLIGHT * 2 * hidden_rows * max(sizes.hidden, 1) * item * 3
        logits = IN_FLIGHT * 2 * hidden_rows * max(sizes.vocab, 1) * 4
        # every rank: the small rest (norms, rotary tables; the embedding is read by rows on rank 0)
        need["pipeline"] = int(heaviest * PARALLEL_HEADROOM) + (sizes.rest - sizes.by_rows) * item + flight + \
            logits + PARALLEL_EXTRA_BYTES
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
                        hint="more ranks, a larger memory budget, or a narrower --dtype (bfloat16 holds half of float32)")
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
