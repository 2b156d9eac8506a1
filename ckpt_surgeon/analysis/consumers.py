"""What consumes each bias, and how much of it that consumer provably ignores (numpy only).

Three identities decide it (docs/architecture.md "analyze: who consumes a bias"):

* **softmax** (``q·k``): a key-bias term ``q_m·b_k`` constant over the keys is ignored; the key
  analyzer (:mod:`.redundancy`) gives the exact share per layer (all of it without rotary).
* **BatchNorm** would remove all of a bias (it subtracts the per-feature batch mean); no
  transformer family here feeds a bias into one.
* **LayerNorm** subtracts the mean over features, so of a vector ``b`` added into what it
  reads only ``b - mean(b)·1`` survives: the removable share of ``|b|^2`` is
  ``n·mean(b)^2 / |b|^2`` (``n`` = hidden size).  **RMSNorm** subtracts nothing: share 0.

A bias that writes into the residual stream (attention output, MLP output, embedding tables)
is read by *every* later reader of the stream, so its mean component is exactly removable only
when every reader is a centering norm.  That is a registry fact per family
(``Family.residual_readers_centering``, cited from the transformers modeling files), never
assumed: an architecture outside the registry, an RMSNorm model, or one whose head reads the
unnormalised stream gets share 0 and ``fold-bias --center`` refuses it.  Tables (embeddings)
are rows written into the stream one at a time, so their share is
``sum_r n·mean(E_r)^2 / |E|^2``; a word embedding tied to the output head is also read by the
head and keeps share 0.

Other consumers: an MLP input bias feeds the activation (nothing removable); the value bias is
averaged by attention rows that sum to 1 and folds into the output bias (``fold-bias --v``),
but is not removable on its own; an output-head bias moves the logits (share 0: a constant over
the vocabulary is invisible to softmax sampling but not to the logits).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..arch import families as F
from ..arch import stream as S
from ..arch.resolve import ModelLayout
from ..records import finite_or_none as _f

# A trained LayerNorm model leaves a residual-writing bias's mean direction at its init (it gets
# no gradient: all-MiniLM-L6-v2 <= 0.6% of the energy in every layer); a random vector holds
# ~1/n of it.  Flag a share above both 25% and 16/n (chi-square(1) > 16: p ~ 6e-5 for noise).
SUSPICIOUS_MEAN_SHARE = 0.25
CONSUMERS = ("softmax", "attention-average", "layernorm", "rmsnorm", "unnormalised", "activation", "head", "unknown")
WRITER_ROLES = ("o", "mlp_out", "embed_add", "embed_token", "embed_norm")


@dataclass(frozen=True)
class StreamReaders:
    """Whether every reader of the residual stream is a centering norm, and why (registry)."""

    centering: bool | None
    consumer: str            # layernorm | rmsnorm | unnormalised | unknown
    reason: str

    def to_dict(self) -> dict:
        return {"centering": self.centering, "consumer": self.consumer, "reason": self.reason}


def stream_readers(layout: ModelLayout, config: dict | None = None) -> StreamReaders:
    """The registry's answer for ``layout``'s family (and ``config``, for the family's rules), with
    the reader that is not a centering norm."""
    fam = F.by_name(layout.family)
    if fam is None:
        return StreamReaders(None, "unknown", f"architecture {layout.architecture!r} is not in the registry: what reads "
                             "its residual stream (and whether it subtracts the mean) is unknown")
    for key, value, reason in fam.residual_readers_rules:
        if (config or {}).get(key) == value:
            return StreamReaders(False, "unnormalised", f"{fam.name}: {reason}")
    c = fam.residual_readers_centering
    if c is None:
        return StreamReaders(None, "unknown", f"the registry does not establish what reads the residual stream of "
                             f"{fam.name}")
    if c:
        how = ("each sublayer output + residual feeds a LayerNorm (post-norm)" if fam.norm_placement == "post"
               else "every norm reading the stream (per-layer and final) is a LayerNorm")
        return StreamReaders(True, "layernorm", f"{fam.name}: {how}; the mean over features is subtracted")
    if fam.input_norm == "rms":
        return StreamReaders(False, "rmsnorm", f"{fam.name}: RMSNorm reads the residual stream (the per-layer input "
                             "norms and the final norm); it rescales without subtracting the mean")
    return StreamReaders(False, "unnormalised", f"{fam.name}: the attention projections read the residual stream "
                         "without a norm (the sublayer outputs pass through RMSNorm, which does not subtract the mean)")


@dataclass(frozen=True)
class StreamTensor:
    """A residual-stream writer or MLP input located in a checkpoint (names; None where absent)."""

    role: str                 # o | mlp_out | mlp_in | embed_add | embed_token | embed_norm | head
    layer: int | None
    weight: str | None
    bias: str | None


def _layer_pattern(ck, layout: ModelLayout) -> str | None:
    if ck.naming == "gguf":
        return F.GGUF_LAYER
    fam = F.by_name(layout.family)
    return fam.layer if fam else None


def locate_stream_tensors(ck, layout: ModelLayout) -> tuple[StreamTensor, ...]:
    """Attention-output (registry roles), MLP, embedding and head tensors of ``ck`` (by name)."""
    out = [StreamTensor("o", lt.layer, lt.o_weight, lt.o_bias) for lt in layout.layers if lt.o_weight or lt.o_bias]
    pattern = _layer_pattern(ck, layout)
    gguf = ck.naming == "gguf"
    if pattern:
        found: dict = {}
        for role, mods in (("mlp_out", S.GGUF_MLP_OUT if gguf else S.MLP_OUT),
                           ("mlp_in", S.GGUF_MLP_IN if gguf else S.MLP_IN)):
            rx = S.layer_module_regex(pattern, mods)
            for name in ck.tensors:
                m = rx.match(name)
                if m:
                    found.setdefault((role, int(m.group(1)), m.group(2)), {})[m.group(3)] = name
        for (role, layer, _), d in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            out.append(StreamTensor(role, layer, d.get("weight"), d.get("bias")))
    for role, rx in (S.GGUF_EMBEDDINGS if gguf else S.EMBEDDINGS):
        for name in sorted(ck.tensors):
            if rx.search(name):
                out.append(StreamTensor(role, None, name, None))
    if layout.norm_placement == "pre":     # post-norm: the embedding norm's output is read by projections
        rx = S.GGUF_EMBED_NORM if gguf else S.EMBED_NORM
        out += [StreamTensor("embed_norm", None, None, n) for n in sorted(ck.tensors) if rx.search(n)]
    head = S.GGUF_HEAD if gguf else S.HEAD
    hw = next((n for n in sorted(ck.tensors) if head.search(n) and n.endswith(".weight")), None)
    hb = next((n for n in sorted(ck.tensors) if head.search(n) and n.endswith(".bias")), None)
    if hw or hb:
        out.append(StreamTensor("head", None, hw, hb))
    return tuple(out)


_HEAD_ARCH = re.compile(r"(LMHeadModel|ForCausalLM|ForMaskedLM|ForPreTraining|ForConditionalGeneration)$")


def word_embedding_tied(ck, tensors: tuple[StreamTensor, ...]) -> bool:
    """Is the token embedding also read by the output head (tied)?  Conservative: yes unless a
    separate head weight exists, the config unties it, or the architecture has no LM head."""
    if any(t.role == "head" and t.weight for t in tensors):
        return False
    cfg = dict(ck.config or {})
    if cfg.get("tie_word_embeddings") is False:
        return False
    if ck.naming == "gguf":
        return True
    archs = cfg.get("architectures") or []
    return not archs or any(_HEAD_ARCH.search(a) for a in archs)


# ------------------------------------------------------------------------------- pure math

def mean_share(b: np.ndarray) -> float:
    """``n·mean(b)^2 / |b|^2`` for a vector ``[n]`` (1.0 for an all-zero vector: trivially removable)."""
    v = np.asarray(b, dtype=np.float64).reshape(-1)
    tot = float((v ** 2).sum())
    return 1.0 if tot == 0 else float(v.size * v.mean() ** 2 / tot)


def table_mean_share(e: np.ndarray) -> float:
    """``sum_r n·mean(E_r)^2 / |E|^2`` for a table ``[rows, n]`` whose rows each enter the stream."""
    t = np.asarray(e, dtype=np.float64)
    tot = float((t ** 2).sum())
    return 1.0 if tot == 0 else float(t.shape[-1] * (t.mean(axis=-1) ** 2).sum() / tot)


# ------------------------------------------------------------------------------- records

@dataclass(frozen=True)
class BiasConsumer:
    """One bias (or additive embedding table): its consumer and the exactly removable share."""

    tensor: str
    role: str                       # q | k | v | o | mlp_in | mlp_out | embed_add | embed_token | head
    layer: int | None
    consumer: str                   # one of CONSUMERS
    size: int
    l2: float | None
    mean: float | None
    removable_share: float | None   # of |b|^2 (None: unknown)
    how: str

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "role": self.role, "layer": self.layer, "consumer": self.consumer,
                "size": self.size, "l2": _f(self.l2), "mean": _f(self.mean),
                "removable_share": _f(self.removable_share), "how": self.how}


@dataclass(frozen=True, eq=False)
class ConsumerReport:
    """``analyze``'s per-bias consumer table plus the residual-stream verdict and flags."""

    readers: StreamReaders
    biases: tuple
    flags: tuple = ()

    def rows(self) -> list[dict]:
        return [{"layer": b.layer, "role": b.role, "consumer": b.consumer, "l2": b.l2, "mean": b.mean,
                 "removable": b.removable_share, "tensor": b.tensor} for b in self.biases]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([b.to_dict() for b in self.biases])

    def to_dict(self) -> dict:
        return {"residual_readers": self.readers.to_dict(), "biases": [b.to_dict() for b in self.biases],
                "flags": list(self.flags)}

    def summary_items(self) -> list[tuple[str, str]]:
        verdict = {True: "all centering (LayerNorm)", False: "not all centering", None: "unknown"}[self.readers.centering]
        writers = [b for b in self.biases if b.role in ("o", "mlp_out") and b.removable_share is not None]
        share = (f"{min(b.removable_share for b in writers):.2%} .. {max(b.removable_share for b in writers):.2%} "
                 "of each residual-writing bias" if writers else "-")
        return [("residual-stream readers", f"{verdict}: {self.readers.reason}"),
                ("removable mean component", share if self.readers.centering else "0 (no centering reader)")]


def _vec(ck, name):
    info = ck.tensors.get(name)
    if info is None or info.missing:
        return None
    return np.asarray(ck.read(name), dtype=np.float64)


def _bias_row(tensor, role, layer, consumer, v, share, how) -> BiasConsumer:
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return BiasConsumer(tensor, role, layer, consumer, int(v.size), float(np.sqrt((v ** 2).sum())),
                        float(v.mean()) if v.size else None, share, how)


def _qkv_rows(layout: ModelLayout, key_layers, qkv_vectors) -> list:
    """Rows of the attention's own q/k/v biases (softmax and attention-average consumers)."""
    by_k = {lr.layer: lr for lr in key_layers}
    rows = []
    for lt in layout.layers:
        vecs = (qkv_vectors or {}).get(lt.layer) or {}
        for role in ("q", "k", "v"):
            v = vecs.get(role)
            if v is None:
                continue
            name = getattr(lt, f"{role}_bias") or lt.qkv_bias
            if role == "q":
                rows.append(_bias_row(name, "q", lt.layer, "softmax", v, 0.0,
                                      "q~ multiplies every key: changes every logit differently"))
            elif role == "k":
                lr = by_k.get(lt.layer)
                share = lr.exact_fraction if lr is not None else None
                rows.append(_bias_row(name, "k", lt.layer, "softmax", v, share,
                                      f"key-bias class {lr.k_class if lr else 'unknown'}: the share constant over "
                                      "the keys (softmax ignores it)"))
            else:
                how = ("attention rows sum to 1: folds exactly into the output bias (fold-bias --v), not removable "
                       "on its own" if lt.o_bias else "attention rows sum to 1, but no output bias to fold it into")
                rows.append(_bias_row(name, "v", lt.layer, "attention-average", v, 0.0, how))
    return rows


def _stream_rows(ck, layout: ModelLayout, tensors, readers, tied: bool, flags: list) -> list:
    """Rows of the tensors that write to or read from the residual stream (output, MLP and
    embedding biases, embedding tables, the head's bias); ``flags`` gets mean-heavy biases."""
    stream_consumer = readers.consumer
    n = layout.hidden_size
    rows = []
    for t in tensors:
        if t.role in ("o", "mlp_out", "embed_norm") and t.bias:
            v = _vec(ck, t.bias)
            if v is None:
                continue
            share = mean_share(v) if readers.centering else 0.0
            rows.append(_bias_row(t.bias, t.role, t.layer, stream_consumer, v, share,
                                  ("mean component: n·mean(b)^2/|b|^2 (every stream reader subtracts the mean)"
                                   if readers.centering else readers.reason)))
            if (readers.centering and v.size and share > max(SUSPICIOUS_MEAN_SHARE, 16.0 / v.size)):
                flags.append(f"mean-heavy-residual-bias: layer {t.layer} {t.bias}: {share:.1%} of its energy is the "
                             f"mean direction, which every LayerNorm reader removes (gets no gradient, stays at its "
                             f"init ~0 in trained models); a conversion or merge error (a shifted tensor)?")
        elif t.role == "mlp_in" and t.bias:
            v = _vec(ck, t.bias)
            if v is not None:
                rows.append(_bias_row(t.bias, "mlp_in", t.layer, "activation", v, 0.0,
                                      "feeds the MLP activation (nonlinear): nothing is removable"))
        elif t.role in ("embed_add", "embed_token") and t.weight and readers.centering:
            e = _vec(ck, t.weight)
            if e is None or e.ndim != 2 or (n and e.shape[-1] != n):
                continue
            if t.role == "embed_token" and tied:
                rows.append(BiasConsumer(t.weight, t.role, None, "head", int(e.size), float(np.sqrt((e ** 2).sum())),
                                         float(e.mean()), 0.0, "tied to the output head, which reads it unnormalised"))
                continue
            rows.append(BiasConsumer(t.weight, t.role, None, stream_consumer, int(e.size),
                                     float(np.sqrt((e ** 2).sum())), float(e.mean()), table_mean_share(e),
                                     "rows enter the stream: sum_r n·mean(E_r)^2/|E|^2"))
        elif t.role == "head" and t.bias:
            v = _vec(ck, t.bias)
            if v is not None:
                rows.append(_bias_row(t.bias, "head", None, "head", v, 0.0,
                                      "moves the logits (a constant over the vocabulary is invisible only to softmax)"))
    return rows


def bias_consumers(ck, layout: ModelLayout, key_layers=(), qkv_vectors=None) -> ConsumerReport:
    """Consumer and removable share of every bias of ``ck``.

    ``key_layers``: the key analyzer's :class:`~.layer_redundancy.LayerRedundancy` records (their
    ``exact_fraction`` is the softmax share of each key bias); ``qkv_vectors``: ``layer ->
    {"q", "k", "v", "k_tensor"}`` as :func:`.redundancy.layer_vectors` returns (read once there).
    """
    readers = stream_readers(layout, ck.config)
    tensors = locate_stream_tensors(ck, layout)
    tied = word_embedding_tied(ck, tensors)
    flags: list[str] = []
    rows: list[BiasConsumer] = _qkv_rows(layout, key_layers, qkv_vectors)
    rows += _stream_rows(ck, layout, tensors, readers, tied, flags)
    order = ("q", "k", "v", "o", "mlp_in", "mlp_out", "embed_token", "embed_add", "embed_norm", "head")
    rows.sort(key=lambda r: (r.layer is None, r.layer or 0, order.index(r.role)))
    return ConsumerReport(readers, tuple(rows), tuple(flags))
