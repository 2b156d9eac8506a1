"""What a quantized checkpoint's quantization is, for ``inspect`` (table and JSON) and ``lint``.

The logical weights (one dense ``[out, in]`` per quantized Linear, :mod:`ckpt_surgeon.formats.quant.quantized`)
are what the parameter count counts; what the files store (packed codes, scales, zero points) is
what the byte figures count.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..formats.quant.schemes import SCHEMES, module_matches


@dataclass(frozen=True)
class QuantSummary:
    method: str
    format: str
    bits: tuple
    group_sizes: tuple
    symmetric: bool | None
    schemes: tuple
    quantized_tensors: int
    quantized_parameters: int
    parameters: int
    unquantized_modules: tuple      # what the config leaves unquantized (ignore / modules_to_not_convert / lm_head)
    dense_linears: tuple            # 2-D weights stored dense (not quantized), by name
    stored_bytes: dict              # stored dtype -> bytes (packed codes and scales included)
    producer: str | None = None
    config_key: str = "quantization_config"
    groups: tuple = ()              # QuantGroup per config group / per-layer algorithm / scheme

    @property
    def share(self) -> float:
        return self.quantized_parameters / self.parameters if self.parameters else 0.0

    def label(self) -> str:
        bits = "/".join(str(b) for b in self.bits)
        return f"{self.method} {bits}-bit"

    def to_dict(self) -> dict:
        return {"method": self.method, "format": self.format, "bits": list(self.bits),
                "group_sizes": list(self.group_sizes), "symmetric": self.symmetric, "schemes": list(self.schemes),
                "scale_semantics": {k: SCHEMES[k].scale for k in self.schemes},
                "quantized_tensors": self.quantized_tensors, "quantized_parameters": self.quantized_parameters,
                "quantized_share": self.share, "unquantized_modules": list(self.unquantized_modules),
                "dense_linears": list(self.dense_linears), "stored_bytes": dict(self.stored_bytes),
                "producer": self.producer, "config_key": self.config_key,
                "groups": [g.to_dict() for g in self.groups]}

    def summary_items(self) -> list[tuple[str, str]]:
        gs = ", ".join("per row" if g < 0 else "per channel / tensor / block" if g == 0 else str(g)
                       for g in self.group_sizes)
        sym = "" if self.symmetric is None else ", symmetric" if self.symmetric else ", zero point"
        unq = ", ".join(self.unquantized_modules) or "-"
        dense = f"; stored dense: {_short(self.dense_linears)}" if self.dense_linears else ""
        items = [
            ("quantization", f"{self.method} ({self.format}), {'/'.join(map(str, self.bits))}-bit, group size {gs}"
                             f"{sym}; {self.quantized_tensors} weights, {self.share:.1%} of parameters quantized"
                             + (f"; by {self.producer}" if self.producer else "")),
        ]
        if len(self.groups) > 1:
            items.append(("quantization groups", "; ".join(g.label() for g in self.groups)))
        return items + [("unquantized modules", unq + dense)]


@dataclass(frozen=True)
class QuantGroup:
    """The modules one config group (compressed-tensors ``config_groups``), one ModelOpt per-layer
    ``quant_algo`` or, elsewhere, one scheme quantizes."""

    name: str                       # config group name, ModelOpt algorithm, or the scheme key
    scheme: str
    format: str | None
    bits: int
    group_size: int
    weights: int
    example: str                    # the first module, for the reader

    def label(self) -> str:
        per = "per channel / tensor" if self.group_size <= 0 else f"per {self.group_size}"
        fmt = f" {self.format}" if self.format and self.format != self.name else ""
        return f"{self.name} ({self.scheme}{fmt}, {self.bits}-bit {per}): {self.weights} weights, e.g. {self.example}"

    def to_dict(self) -> dict:
        return {"name": self.name, "scheme": self.scheme, "format": self.format, "bits": self.bits,
                "group_size": self.group_size, "weights": self.weights, "example": self.example}


def quant_groups(q) -> tuple:
    """The quantized weights by the config group / per-layer algorithm that gave them their scheme."""
    by: dict = {}
    for t in q.tensors.values():
        p = dict(t.params)
        key = (str(p.get("group") or p.get("algo") or t.scheme), t.scheme, p.get("format") or p.get("algo"), t.bits,
               t.group_size)
        by.setdefault(key, []).append(t.module)
    return tuple(QuantGroup(n, sch, fmt, bits, gs, len(mods), sorted(mods)[0])
                 for (n, sch, fmt, bits, gs), mods in sorted(by.items(), key=lambda kv: sorted(kv[1])[0]))


def _short(names, n: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def quant_summary(ck: Checkpoint, parameters: int) -> QuantSummary | None:
    q = ck.quantization
    if q is None:
        return None
    qparams = sum(ck.tensors[n].numel for n in q.tensors)
    dense = tuple(n for n, i in ck.tensors.items()
                  if n.endswith(".weight") and len(i.shape) == 2 and not i.quantized
                  and not n.endswith(("embed_tokens.weight", "wte.weight", "embeddings.weight")))
    stored: dict[str, int] = {}
    for info in ck.stored_tensors.values():
        stored[info.dtype] = stored.get(info.dtype, 0) + info.nbytes
    return QuantSummary(q.method, q.format, q.bits, q.group_sizes, q.symmetric, q.schemes, len(q.tensors), qparams,
                        parameters, q.unquantized, dense, stored, q.producer, q.config_key, quant_groups(q))


def ignored_but_quantized(ck: Checkpoint) -> list[tuple[str, str]]:
    """(ignore-list entry, quantized weight) pairs: the config says a module stays dense, the
    tensors say it is quantized."""
    q = ck.quantization
    if q is None:
        return []
    out = []
    for pat in q.unquantized:
        for t in q.tensors.values():
            if module_matches(pat, t.module):
                out.append((pat, t.logical))
    return out
