"""Pipeline over decoder layers: each rank holds a contiguous block of layers of both models.

Every rank builds both models' skeletons on the meta device and loads what is not a layer, an
embedding or a head (norms, rotary tables: small) the way :mod:`.stream` does, then loads its
block of layers once through our readers (:meth:`.stream._Model.load_layer`).  Rank 0 embeds a
chunk (only the embedding rows of its tokens are read) and learns what each layer is called with
from the model's own forward (masks, rotary ``position_embeddings``); the other ranks learn the same
from a zero input of the chunk's length.  A chunk then goes down the ranks: each runs its layers,
reference then candidate, records the attention / MLP / layer output divergence of its layers
(as the streamed run does) and sends both hidden states on.  The last rank applies the final norm
and the head (held whole there) and sends the logits to rank 0.  Rank 0 keeps up to
:data:`.dist_plan.IN_FLIGHT` chunks going before it waits for the first one's logits, so that
every rank computes while the others do.

The numbers are the streamed run's: the same modules, weights and inputs in the same order.
"""
from __future__ import annotations

import numpy as np

from .dist_env import drain, recv_arrays, send_arrays
from .dist_plan import IN_FLIGHT
from .localize import DEFAULT_THRESHOLDS, DiffAccumulator, PointDiff
from .stream import (ACTIVATIONS_IN_RAM_BYTES, StreamedLayers, _Model, _np, _PartRecorder, _same_structure,
                     host_item, open_source)


class _Stage:
    """This rank's share of a pipeline job: the models' skeletons, its block of layers loaded."""

    def __init__(self, sess, job: dict):
        import torch

        from ..runtime import quiet_transformers
        self.sess, self.job = sess, job
        self.rank, self.world = sess.rank, sess.world
        self.start, self.stop = job["blocks"][self.rank]
        self.first, self.last = self.rank == 0, self.rank == self.world - 1
        self.seqs = job["sequences"]
        self.srcs = [open_source(p, role=r) for p, r in zip(job["paths"], job["roles"])]
        with quiet_transformers():
            self.models = [_Model(s, job["dtype"], job["device"]) for s in self.srcs]
        if len(self.models) == 2:
            _same_structure(*self.models)
        self.warnings = [f"{m.src.given}: {len(m.unused)} tensor(s) not used by {type(m.model).__name__} "
                         f"({', '.join(m.unused[:3])}{' ...' if len(m.unused) > 3 else ''})"
                         for m in self.models if m.unused]
        for m in self.models:
            m.load_rest()
            for i in range(self.start, self.stop):
                m.load_layer(i)
        positions = sum(len(s) for s in self.seqs)
        width = int(self.models[0].embed.weight.shape[-1])
        item = host_item(torch.finfo(self.models[0].tdtype).bits // 8)    # the kept outputs: float32 for bf16
        self.parts = 2 * positions * width * item <= ACTIVATIONS_IN_RAM_BYTES
        self.points = [(k, la, part, path) for k, (la, part, path, _) in enumerate(self.models[0].points)
                       if self.start <= la < self.stop and (self.parts or part == "output")]
        self.accs = {k: DiffAccumulator() for k, *_ in self.points}
        self.recs = [{i: _PartRecorder(m.points, i, self.parts) for i in range(self.start, self.stop)}
                     for m in self.models]
        self._calls: list = [{} for _ in self.models]
        self.head = None
        if self.last:
            self._load_heads()

    def _load_heads(self) -> None:
        self.head = []
        for m in self.models:
            if m.head is None:
                self.head.append(None)
                continue
            m.install_chunk_head()
            self.head.append(m.read_head(0, m.head_rows()))

    def calls(self, k: int, length: int):
        """What model ``k``'s layers are called with for a chunk of ``length`` tokens."""
        import torch
        if length not in self._calls[k]:
            m = self.models[k]
            width = int(m.embed.weight.shape[-1])
            zeros = torch.zeros((1, length, width), dtype=m.tdtype, device=m.device)
            self._calls[k][length] = m.layer_calls(zeros)[1]
        return self._calls[k][length]

    def embed(self, s: int) -> list:
        """Rank 0: layer 0's input for chunk ``s``, per model (the model's own embedding path)."""
        out = []
        for k, m in enumerate(self.models):
            e = m.embed_sequences([self.seqs[s]])[0]
            h0, calls = m.layer_calls(e)
            self._calls[k].setdefault(len(self.seqs[s]), calls)
            out.append(h0)
        return out

    def run_block(self, s: int, hidden: list) -> list:
        """This rank's layers on chunk ``s``; the per-layer divergence accumulated on the way."""
        length = len(self.seqs[s])
        for i in range(self.start, self.stop):
            outs, got = [], []
            for k, m in enumerate(self.models):
                rec = self.recs[k][i]
                rec.start()
                outs.append(m.run_layer(i, hidden[k], self.calls(k, length)[i]))
                got.append(rec.got())
            if len(self.models) == 2:
                for key, arr in got[0].items():
                    if key in self.accs:
                        self.accs[key].add(arr, got[1][key])
                self.accs[self.recs[0][i].output_index].add(_np(outs[0][0]), _np(outs[1][0]))
            hidden = outs
        return hidden

    def tail(self, s: int, hidden: list) -> list:
        """The last rank: final norm and head of each model on the scored rows of chunk ``s``."""
        import torch
        rows = self.job["rows"][s] if self.job["rows"] is not None else None
        out = []
        for k, m in enumerate(self.models):
            h = hidden[k]
            r = None if rows is None else torch.as_tensor(np.asarray(rows, dtype=np.int64), device=h.device)
            if self.head[k] is None:
                out.append(m.tail(h, torch.zeros_like(h), rows=r))
            else:
                w, b = self.head[k]
                out.append(m.tail(h, torch.zeros_like(h), w, b, r))
        return out

    def layer_stats(self) -> list:
        return [(k, la, part, path, a.max_abs, a.dd, a.rr) for (k, la, part, path), a in
                ((p, self.accs[p[0]]) for p in self.points)]

    def close(self) -> None:
        for recs in self.recs:
            for r in recs.values():
                r.close()
        for s in self.srcs:
            s.close()


def pipeline_driver(sess, job: dict):
    """Rank 0: yields ``(chunk, *outputs)`` in chunk order; ``job["result"]`` gets the warnings and
    the per-layer statistics of every rank at the end."""
    import torch
    stage = _Stage(sess, job)
    pending: list = []
    n, k = len(job["sequences"]), len(job["paths"])
    try:
        with torch.no_grad():
            done = 0
            for s in range(n):
                hidden = stage.run_block(s, stage.embed(s))
                send_arrays(sess, 1, hidden, pending, limit=IN_FLIGHT)
                if s - done + 1 >= IN_FLIGHT:
                    yield (done, *recv_arrays(sess, sess.world - 1, k))
                    done += 1
            while done < n:
                yield (done, *recv_arrays(sess, sess.world - 1, k))
                done += 1
            drain(pending)
        from .dist_env import all_gather
        gathered = all_gather((stage.warnings, stage.layer_stats()))
        job["result"] = _merge(gathered, job)
    finally:
        stage.close()


def pipeline_worker(sess, job: dict) -> None:
    """A rank after 0: receive each chunk's hidden states, run the block, pass them on (the last
    rank: the logits, to rank 0)."""
    import torch
    stage = _Stage(sess, job)
    pending: list = []
    k = len(job["paths"])
    try:
        with torch.no_grad():
            for s in range(len(job["sequences"])):
                hidden = [t.to(stage.models[0].device) for t in recv_arrays(sess, sess.rank - 1, k, tensors=True)]
                hidden = stage.run_block(s, hidden)
                if stage.last:
                    send_arrays(sess, 0, [o.cpu() for o in stage.tail(s, hidden)], pending, limit=IN_FLIGHT)
                else:
                    send_arrays(sess, sess.rank + 1, hidden, pending, limit=IN_FLIGHT)
                sess.mark("chunks", f"{job['index']}:{s + 1}")
            drain(pending)
        from .dist_env import all_gather
        all_gather((stage.warnings, stage.layer_stats()))
    finally:
        stage.close()


def _merge(gathered: list, job: dict) -> dict:
    """Every rank's warnings (once) and per-layer statistics in execution order."""
    warnings = list(dict.fromkeys(w for ws, _ in gathered for w in ws))
    stats = sorted((row for _, rows in gathered for row in rows), key=lambda row: row[0])
    threshold = job.get("threshold") or DEFAULT_THRESHOLDS.get(job["dtype"], DEFAULT_THRESHOLDS["float32"])
    points = []
    for _k, la, part, path, max_abs, dd, rr in stats:
        acc = DiffAccumulator()
        acc.max_abs, acc.dd, acc.rr = max_abs, dd, rr
        points.append(PointDiff(la, part, path, max_abs, acc.rel(), acc.rel() > threshold))
    return {"warnings": warnings, "layers": StreamedLayers(tuple(points), float(threshold))
            if len(job["paths"]) == 2 else None}
