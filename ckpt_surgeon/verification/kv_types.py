"""llama.cpp's KV cache types, as ``verify --runtime llama.cpp`` sets them (``--cache-type-k``,
``--cache-type-v``, ``--kv-cache`` for both, ``--cache-sweep`` for several at once).

The names are llama.cpp's own (``common/arg.cpp``'s ``kv_cache_types``: f32, f16, bf16, q8_0,
q4_0, q4_1, iq4_nl, q5_0, q5_1); the ids handed to llama-cpp-python's ``type_k`` / ``type_v``
are ggml's, read from gguf-py's ``GGMLQuantizationType`` (the file format's numbering, the same
enum), never retyped.

Flash attention: llama.cpp stores V transposed when flash attention is off (``v_trans =
!cparams.flash_attn`` in ``src/llama-context.cpp``), one element per row, which a block type
cannot hold, so it refuses a quantized V cache without it ("quantized V cache was requested, but
this requires Flash Attention").  A quantized K cache runs either way: both paths quantize Q to
the K type's ``vec_dot_type`` (q8_0 for q4_0 / q5_0 / q8_0 / iq4_nl, q8_1 for q4_1 / q5_1) before
the dot product.  ``flash_attn="auto"`` therefore turns it on exactly when a V cache in the run is
quantized, for every llama.cpp side of the run alike (the reference too, so that the two sides
differ by the cache alone and not by the attention kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CkptError, UnsupportedError

# llama.cpp's list, in its --help order (common/arg.cpp kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLOAT_TYPES = ("f32", "f16", "bf16")
FLASH_ATTN = ("auto", "on", "off")


def check_type(name, option: str = "--cache-type-k") -> str:
    """``name`` as one of :data:`CACHE_TYPES` (case-insensitive), else one line listing them."""
    s = str(name).strip().lower() if name is not None else ""
    if s not in CACHE_TYPES:
        raise CkptError(f"unknown {option} {name!r}; llama.cpp's cache types are {', '.join(CACHE_TYPES)}")
    return s


def ggml_id(name: str) -> int:
    """The ggml type id llama.cpp's ``type_k`` / ``type_v`` take."""
    import gguf
    return int(gguf.GGMLQuantizationType[check_type(name).upper()])


@dataclass(frozen=True)
class CacheTypes:
    """The K and V cache types of one llama.cpp run."""

    k: str = "f16"
    v: str = "f16"

    @property
    def quantized(self) -> bool:
        return self.k not in FLOAT_TYPES or self.v not in FLOAT_TYPES

    @property
    def v_quantized(self) -> bool:
        return self.v not in FLOAT_TYPES

    @property
    def label(self) -> str:
        return f"K {self.k} / V {self.v}"

    def to_dict(self) -> dict:
        return {"type_k": self.k, "type_v": self.v}


def cache_types(kv_cache: str = "f16", cache_type_k: str | None = None,
                cache_type_v: str | None = None) -> tuple[CacheTypes, CacheTypes]:
    """(reference's, candidate's) caches: ``kv_cache`` for K and V of every side, ``cache_type_k``
    / ``cache_type_v`` replacing the candidate's K / V."""
    both = check_type(kv_cache, "--kv-cache")
    k = check_type(cache_type_k, "--cache-type-k") if cache_type_k is not None else both
    v = check_type(cache_type_v, "--cache-type-v") if cache_type_v is not None else both
    return CacheTypes(both, both), CacheTypes(k, v)


def parse_sweep(spec, *, kv_cache: str = "f16") -> tuple[CacheTypes, ...]:
    """``--cache-sweep`` items: ``K/V`` (``q4_0/f16``: K q4_0, V f16) or one name for K and V both
    (``q8_0``, as ``--kv-cache`` means both).  A comma-separated string or a sequence of items
    (strings or :class:`CacheTypes`); repeated rows are kept once, in order."""
    items = [s for s in str(spec).split(",")] if isinstance(spec, str) else list(spec)
    rows: list[CacheTypes] = []
    for item in items:
        if isinstance(item, CacheTypes):
            row = CacheTypes(check_type(item.k), check_type(item.v, "--cache-type-v"))
        else:
            k, sep, v = str(item).strip().partition("/")
            if not k.strip():
                raise CkptError(f"--cache-sweep item {item!r} is empty; give K or K/V, e.g. q8_0,q4_0/f16")
            row = CacheTypes(check_type(k, "--cache-sweep type"), check_type(v if sep else k, "--cache-sweep type"))
        if row not in rows:
            rows.append(row)
    if not rows:
        raise CkptError("--cache-sweep needs at least one cache type, e.g. q8_0,q4_0/f16")
    check_type(kv_cache, "--kv-cache")
    return tuple(rows)


def use_flash_attn(flash_attn: str | bool | None, caches) -> bool:
    """Whether the llama.cpp sides run with flash attention: ``on`` / ``off`` as given, ``auto``
    (or None) when any of ``caches`` has a quantized V; ``off`` with a quantized V is refused in
    one line (llama.cpp would refuse the context)."""
    mode = {True: "on", False: "off", None: "auto"}.get(flash_attn, flash_attn)
    if mode not in FLASH_ATTN:
        raise CkptError(f"unknown --flash-attn {flash_attn!r}; choose one of {', '.join(FLASH_ATTN)}")
    needs = [c for c in caches if c.v_quantized]
    if mode == "off" and needs:
        raise CkptError(f"a quantized V cache ({needs[0].label}) needs flash attention in llama.cpp (it stores V "
                        "transposed without it); drop --flash-attn off")
    return mode == "on" or (mode == "auto" and bool(needs))


def gguf_head_sizes(metadata: dict, path: str | None = None) -> tuple[set, set]:
    """(K head sizes, V head sizes) of a GGUF as llama.cpp reads them (``llama_model::load_hparams``):
    ``{arch}.attention.key_length`` / ``value_length``, else ``embedding_length / head_count`` (the first
    layer's count), and the sliding-window layers' ``key_length_swa`` / ``value_length_swa`` where given."""
    from ..arch.checked import gguf_hparam
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return set(), set()
    heads = gguf_hparam(metadata, arch, "attention.head_count", path=path, per_layer=True, zero_means_none=True)
    heads = heads[0] if isinstance(heads, list) else heads
    embd = gguf_hparam(metadata, arch, "embedding_length", path=path)
    default = embd // heads if heads and embd else None
    out = []
    for full, swa in (("attention.key_length", "attention.key_length_swa"),
                      ("attention.value_length", "attention.value_length_swa")):
        size = gguf_hparam(metadata, arch, full, path=path)
        size = default if size is None else size
        sizes = {size, gguf_hparam(metadata, arch, swa, path=path) or size} - {None}
        out.append(sizes)
    return out[0], out[1]


def check_cache_fits(caches, head_sizes: tuple[set, set], path: str | None = None) -> None:
    """One line (UnsupportedError), before any run, when one of ``caches`` cannot act on this model in llama.cpp:
    a quantized K or V type whose block does not divide the head size (issue 50 item 5: a cache sweep of a
    head_dim 16 model ran for minutes and printed identical rows of 0.000000)."""
    from ..analysis.kv_rot import head_block_problem
    for c in caches:
        why = head_block_problem(c.k, head_sizes[0], "K") or head_block_problem(c.v, head_sizes[1], "V")
        if why:
            raise UnsupportedError(f"{c.label}: {why}", path=path)
