"""Memory figures for ``inspect``: weight bytes per dtype, KV-cache bytes for a context, a batch and a
cache type, recurrent state, and the total per device of a tensor-parallel split.

KV cache per token and attention layer: K and V, ``n_kv_heads x head_dim`` elements each (llama.cpp
``llama_kv_cache`` and transformers' ``DynamicCache`` both store them per kv head, before GQA
expansion).  Which layers are full, sliding-window, MLA or recurrent, and how each is counted:
:mod:`.kv_layers`.  Tokens: ``context`` per sequence, times ``batch`` sequences (llama.cpp's
``n_ctx`` is shared by its sequences; give ``--context`` per sequence).

Element sizes come from the one ggml type table (:mod:`..formats.quant.ggml_types`): a row of ``n``
elements of a block type takes ``n / block_size`` blocks of ``type_size`` bytes (llama.cpp refuses a
cache type whose block does not divide the head size).  ``fp8`` (e4m3, vLLM's ``kv_cache_dtype``)
is 1 byte per element plus one f32 scale per K and per V tensor of each layer.

Tensor parallelism over ``devices``: weight tensors of two or more axes are split ``1/N`` (rows or
columns, embeddings by vocabulary), one-axis tensors (norms, biases) are replicated; K/V heads are
split when ``N`` divides ``n_kv_heads``, each device keeps one kv head when ``n_kv_heads`` divides
``N`` (each head replicated ``N / n_kv_heads`` times), else every device keeps them all; an MLA
latent is replicated (one latent serves every head); recurrent states are split like their heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UnsupportedError
from ..formats.quant.ggml_types import ggml_type
from .kv_layers import STATE_BYTES_PER_ELEMENT, layer_plan
from ..arch.checked import MAX_WIDTH, config_int

TOKENS = 1000
_NO_KV = ("recurrent", "none")   # layer kinds that cache no K / V (arch/kv_layers.py)
# llama.cpp's --cache-type-k/-v choices (common/arg.cpp kv_cache_types), then vLLM's fp8 (e4m3)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "fp8")
_ALIASES = {"fp8_e4m3": "fp8", "fp8_e4m3fn": "fp8"}
FP8_SCALE_BYTES = 4             # one f32 scale per K / V tensor and layer
DEFAULT_TYPES = ("f16", "q8_0")  # the two shown when no --cache-type is given


def cache_type(name: str) -> str:
    """A cache type's canonical name; UnsupportedError (one line listing the known ones) if unknown."""
    n = str(name).strip().lower()
    n = _ALIASES.get(n, n)
    if n not in CACHE_TYPES:
        raise UnsupportedError(f"unknown KV-cache type {name!r}; known: {', '.join(CACHE_TYPES)} "
                               f"(fp8 = fp8_e4m3, 1 byte + a per-tensor scale)")
    return n


def row_bytes(ctype: str, n: int) -> int:
    """Bytes of one token's row of ``n`` elements in cache type ``ctype`` (whole blocks, rounded up)."""
    if ctype == "fp8":
        return n
    t = ggml_type(ctype.upper())
    return -(-n // t.block_size) * t.type_size


def whole_blocks(ctype: str, n: int) -> bool:
    return ctype == "fp8" or n % ggml_type(ctype.upper()).block_size == 0


@dataclass(frozen=True)
class MemoryOptions:
    """What ``inspect --context/--batch/--cache-type(-k/-v)/--devices`` asked for."""
    context: int = TOKENS
    batch: int = 1
    type_k: str | None = None       # None: the f16 + q8_0 pair of the default view
    type_v: str | None = None
    devices: int = 1

    def __post_init__(self):
        for name in ("type_k", "type_v"):        # canonical names (fp8_e4m3 -> fp8); unknown: one line
            if getattr(self, name) is not None:
                object.__setattr__(self, name, cache_type(getattr(self, name)))
        for name in ("context", "batch", "devices"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UnsupportedError(f"memory figures: {name} must be a positive integer, got {v!r}")

    @property
    def default(self) -> bool:
        return self == MemoryOptions()

    @property
    def types(self) -> tuple[str, str]:
        return (self.type_k or "f16", self.type_v or "f16")


@dataclass(frozen=True)
class MemoryFigures:
    weight_bytes: dict              # dtype -> bytes stored
    kv_elements_per_1000: int | None  # K + V elements cached for `context` tokens x batch over all layers
    kv_bytes_per_1000: dict         # "f16" / "q8_0" -> bytes (the default view)
    kv_note: str | None = None      # how sliding-window / MLA / recurrent layers were counted, or why unknown
    options: MemoryOptions = field(default_factory=MemoryOptions)
    kv_bytes_k: int | None = None   # at options.types
    kv_bytes_v: int | None = None
    layers: dict = field(default_factory=dict)   # kind -> layer count
    window: int | None = None
    state_bytes: int | None = None  # recurrent state, all layers, all sequences (f32)
    per_device: dict | None = None

    @property
    def kv_bytes(self) -> int | None:
        return None if self.kv_bytes_k is None else self.kv_bytes_k + self.kv_bytes_v

    @property
    def total_bytes(self) -> int:
        return sum(self.weight_bytes.values()) + (self.kv_bytes or 0) + (self.state_bytes or 0)

    def to_dict(self) -> dict:
        o = self.options
        return {"weight_bytes": dict(self.weight_bytes), "weight_bytes_total": sum(self.weight_bytes.values()),
                "kv_cache_tokens": o.context, "kv_cache_elements": self.kv_elements_per_1000,
                "kv_cache_bytes": dict(self.kv_bytes_per_1000), "kv_cache_note": self.kv_note,
                "kv_cache_batch": o.batch, "kv_cache_type_k": o.types[0], "kv_cache_type_v": o.types[1],
                "kv_cache_bytes_k": self.kv_bytes_k, "kv_cache_bytes_v": self.kv_bytes_v,
                "kv_cache_layers": dict(self.layers), "sliding_window": self.window,
                "recurrent_state_bytes": self.state_bytes, "total_bytes": self.total_bytes,
                "devices": o.devices, "per_device": dict(self.per_device) if self.per_device else None}

    def summary_items(self) -> list[tuple[str, str]]:
        o = self.options
        w = ", ".join(f"{k} {_mib(v)}" for k, v in sorted(self.weight_bytes.items(), key=lambda kv: -kv[1]))
        items = [("weight bytes", f"{_mib(sum(self.weight_bytes.values()))} ({w})" if w else "-")]
        label = f"KV cache / {o.context:,} tokens" + (f" x {o.batch} sequences" if o.batch != 1 else "")
        note = f" ({self.kv_note})" if self.kv_note else ""
        if self.kv_elements_per_1000 is None:
            items.append((label, f"unknown ({self.kv_note})"))
        elif o.type_k is None and o.type_v is None:
            items.append((label, ", ".join(f"{k} {_mib(v)}" for k, v in self.kv_bytes_per_1000.items()) + note))
        else:
            items.append((label, f"K {o.types[0]} {_mib(self.kv_bytes_k)} + V {o.types[1]} "
                                 f"{_mib(self.kv_bytes_v)} = {_mib(self.kv_bytes)}{note}"))
        if self.state_bytes is not None:
            items.append(("recurrent state", f"{_mib(self.state_bytes)} (f32, fixed per sequence)"))
        if not o.default:
            items.append(("weights + KV", _mib(self.total_bytes)))
        if self.per_device:
            d = self.per_device
            items.append((f"per device ({o.devices}-way tensor parallel)",
                          f"{_mib(d['total_bytes'])} (weights {_mib(d['weight_bytes'])}, KV "
                          f"{_mib(d['kv_cache_bytes'])}; {d['kv_split']})"))
        return items


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _tokens(kind: str, context: int, window: int | None) -> int:
    return min(context, window) if kind == "sliding" and window else context


def _kv_bytes(plan, rows: dict, ctype: str, part: int, tokens: int) -> int:
    """K (part 0) or V (part 1) bytes over every caching layer, for ``tokens`` tokens per sequence x batch."""
    total = 0
    for kind in plan.kinds:
        if kind in _NO_KV or not rows[kind][part]:
            continue
        total += _tokens(kind, tokens, plan.window) * row_bytes(ctype, rows[kind][part])
        total += FP8_SCALE_BYTES if ctype == "fp8" else 0
    return total


def _kv_split(n_kv: int | None, devices: int, mla: bool) -> tuple[float, str]:
    """(the share of the attention KV each device keeps, how) for a ``devices``-way split."""
    if mla:
        return 1.0, "MLA latent replicated on every device"
    if n_kv and n_kv >= devices and n_kv % devices == 0:
        return 1 / devices, f"{n_kv} kv heads split {devices} ways"
    if n_kv and devices % n_kv == 0:
        return 1 / n_kv, f"one of {n_kv} kv heads per device, each replicated {devices // n_kv} times"
    return 1.0, f"{n_kv or '?'} kv heads replicated on every device"


def _per_device(tensors: dict, figs: dict, n_kv: int | None, devices: int, mla: bool) -> dict:
    weights = sum(i.nbytes / devices if len(i.shape) >= 2 else i.nbytes for i in tensors.values())
    share, how = _kv_split(n_kv, devices, mla)
    kv = (figs["kv"] or 0) * share
    state = (figs["state"] or 0) / devices
    return {"weight_bytes": round(weights), "kv_cache_bytes": round(kv), "recurrent_state_bytes": round(state),
            "total_bytes": round(weights + kv + state), "kv_split": how,
            "rule": "tensors of 2+ axes split 1/N, 1-axis tensors (norms, biases) replicated"}


def _notes(plan, rows, head: int, options: MemoryOptions, max_positions: int | None) -> list[str]:
    notes = []
    if plan.count("sliding"):
        notes.append(f"{plan.count('sliding')} sliding-window layer(s) keep at most {plan.window} tokens")
    if plan.count("mla"):
        notes.append(f"MLA: compressed latent + rotary key per token ({rows['mla'][0]} elements, one copy for "
                     f"all heads) on {plan.count('mla')} layer(s)")
    if plan.count("none"):
        notes.append(f"{plan.count('none')} layer(s) without attention heads in the file (head_count_kv 0): no KV "
                     "cache; recurrent or MLP-only as llama.cpp's architecture defines, any state not counted"
                     if plan.how.endswith("(GGUF)") else f"{plan.count('none')} MLP-only layer(s): no KV cache, no state")
    if plan.count("recurrent"):
        n = plan.count("recurrent")
        notes.append(f"{n} recurrent layer(s) keep a fixed state of {plan.state_elements:,} f32 elements per "
                     f"sequence, not per token" if plan.state_elements is not None else
                     f"{n} recurrent layer(s): state size not in the config, not counted")
    for t in sorted(set(options.types) if (options.type_k or options.type_v) else set()):
        if head and not whole_blocks(t, head):
            notes.append(f"{t}: its {ggml_type(t.upper()).block_size}-element blocks do not divide the head size "
                         f"{head}; llama.cpp refuses this cache type (bytes rounded up to whole blocks)")
    if max_positions and options.context > max_positions and not options.default:
        notes.append(f"context {options.context:,} is beyond the model's {max_positions:,} positions")
    return notes


def _gguf_mla(cfg: dict, metadata: dict | None) -> dict:
    """A GGUF's config has no ``kv_lora_rank``: read it (and the rotary width) from the file's own keys."""
    arch = (metadata or {}).get("general.architecture")
    if not isinstance(arch, str) or f"{arch}.attention.kv_lora_rank" not in metadata or "kv_lora_rank" in cfg:
        return cfg
    return {**cfg, "kv_lora_rank": metadata[f"{arch}.attention.kv_lora_rank"],
            "qk_rope_head_dim": metadata.get(f"{arch}.rope.dimension_count")}


def memory_figures(tensors: dict, config: dict | None, layout, options: MemoryOptions | None = None,
                   metadata: dict | None = None) -> MemoryFigures:
    """``metadata``: a GGUF file's key-values (its MLA rank is not in the derived config)."""
    options = options or MemoryOptions()
    weight: dict[str, int] = {}
    for info in tensors.values():
        weight[info.dtype] = weight.get(info.dtype, 0) + info.nbytes
    if layout.tower_kind in ("vision", "audio"):     # an mmproj file: encoders only, run once per image / clip
        return MemoryFigures(weight, None, {}, f"no KV cache: a {layout.tower_kind} encoder, not a decoder",
                             options)
    cfg, n_layers, where = _gguf_mla(dict(config or {}), metadata), layout.num_layers, layout.config_source
    # config.json values are untrusted: type and range checked where read (arch/checked.py)
    rank = config_int(cfg, ("kv_lora_rank",), path=where, minimum=0, maximum=MAX_WIDTH)
    plan = layer_plan(cfg, n_layers, where, mla=bool(rank), hidden=layout.hidden_size) if n_layers else None
    attention_only_unknown = not (rank or (layout.num_kv_heads and layout.head_dim))
    if plan is None or (attention_only_unknown and plan.count("recurrent") + plan.count("none") < n_layers):
        # (every layer recurrent or without attention: no K/V)
        return MemoryFigures(weight, None, {}, "kv heads / head_dim unknown", options)
    attn = (layout.num_kv_heads or 0) * (layout.head_dim or 0)
    mla_row = (rank or 0) + (config_int(cfg, ("qk_rope_head_dim",), path=where, minimum=0, maximum=MAX_WIDTH) or 0)
    rows = {"full": (attn, attn), "sliding": (attn, attn), "mla": (mla_row, 0)}
    b, ctx = options.batch, options.context
    elements = b * sum(_tokens(k, ctx, plan.window) * sum(rows[k]) for k in plan.kinds if k not in _NO_KV)
    pair = {t: b * (_kv_bytes(plan, rows, t, 0, ctx) + _kv_bytes(plan, rows, t, 1, ctx)) for t in DEFAULT_TYPES}
    tk, tv = options.types
    kb, vb = b * _kv_bytes(plan, rows, tk, 0, ctx), b * _kv_bytes(plan, rows, tv, 1, ctx)
    state = (b * plan.count("recurrent") * plan.state_elements * STATE_BYTES_PER_ELEMENT
             if plan.count("recurrent") and plan.state_elements is not None else None)
    notes = _notes(plan, rows, mla_row if rank else (layout.head_dim or 0), options, layout.max_positions)
    layers = {k: plan.count(k) for k in ("full", "sliding", "mla", "recurrent", "none") if k != "none" or plan.count(k)}
    per_device = _per_device(tensors, {"kv": kb + vb, "state": state}, layout.num_kv_heads, options.devices,
                             bool(rank)) if options.devices > 1 else None
    return MemoryFigures(weight, elements, pair, "; ".join(notes) or None, options, kb, vb, layers,
                         plan.window, state, per_device)
