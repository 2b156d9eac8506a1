"""Memory planning for a verify run: how both models will be held, chosen from the headers alone.

*parallel* keeps both models loaded; *sequential* loads one at a time (the reference's outputs
saved to disk in between); *stream* (:mod:`.stream`) runs both one decoder layer at a time.
:func:`plan_memory` picks the first that fits the free memory (or a budget) and refuses, in one
line saying what the run would need, a run that would not fit even streamed: a run the kernel
would kill is never started.  Used by :func:`.core.verify` and by fidelity mode
(:mod:`.corpus`), which also streams when the models do not fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import CkptError

# Both models in memory at once only with this margin over their weights: activations, the
# logits of one prompt, the allocator's slack.
PARALLEL_HEADROOM = 1.25
PARALLEL_EXTRA_BYTES = 512 << 20

# A decoder layer's tensors in HF naming (model.layers.3., transformer.h.3., encoder.layer.3.,
# gpt_neox.layers.3. ...: the spellings hook_points falls back to) or GGUF naming (blk.3.), for
# planning before any model is built.
LAYER_KEY = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks|blk)\.(\d+)\.")


BYTES_PER_PARAM = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def available_bytes(dev: str, torch) -> int | None:
    if dev == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None



@dataclass(frozen=True)
class ModelSizes:
    """What memory planning knows of one input from its headers: parameters, the largest decoder
    layer's parameters, hidden width and vocabulary (config)."""

    params: int
    largest_layer: int
    hidden: int
    vocab: int


@dataclass(frozen=True)
class MemoryPlan:
    """How a verify run will hold its models: ``mode`` and why, and the estimates it came from."""

    mode: str                    # parallel | sequential | stream
    why: str
    available: int | None        # bytes free (or the budget given)
    need: dict                   # mode -> estimated bytes


def plan_memory(ref: ModelSizes, cand: ModelSizes, *, dtype: str, device: str, device_map: str | None,
                sequential: bool | None, stream: bool | None, available: int | None, positions: int) -> MemoryPlan:
    """Choose how to run a pair so that the process never outgrows the memory it has.

    parallel (both models loaded) when both fit ``available`` with headroom; else sequential (one
    model at a time) when one fits; else layer-streamed (one layer at a time, float32 / float64 / bfloat16)
    when that fits; else a one-line refusal that says what the run would need.  A run that would
    be killed by the kernel is never started.  ``--sequential`` / ``--stream`` force a mode
    (sequential turns into streaming when one model does not fit); ``device_map`` leaves the
    placement to accelerate (sequential)."""
    from .stream import STREAM_DTYPES, stream_need_from_sizes

    item = BYTES_PER_PARAM[dtype]
    both = (ref.params + cand.params) * item
    one = max(ref.params, cand.params) * item
    need = {"parallel": int(both * PARALLEL_HEADROOM) + PARALLEL_EXTRA_BYTES,
            "sequential": int(one * PARALLEL_HEADROOM) + PARALLEL_EXTRA_BYTES,
            "stream": stream_need_from_sizes(max(ref.largest_layer, cand.largest_layer) * item, positions,
                                             max(ref.hidden, cand.hidden), max(ref.vocab, cand.vocab), item)}
    layer = max(ref.largest_layer, cand.largest_layer)
    hidden, vocab = max(ref.hidden, cand.hidden), max(ref.vocab, cand.vocab)

    def plan(mode, why):
        return MemoryPlan(mode, why, available, need)
    if stream:
        return plan("stream", f"asked for (~{human_size(need['stream'])} in {dtype})")
    if device_map:
        return plan("sequential", "device_map=auto spreads each model over every device; they are loaded one at a time")
    if available is None:
        return plan("sequential", "free memory unknown")
    free = f"{human_size(available)} free on {device}"
    if not sequential and need["parallel"] <= available:
        return plan("parallel", f"both models loaded at once (~{human_size(both)} in {dtype}, {free})")
    if need["sequential"] <= available:
        why = "asked for" if sequential else f"both models need ~{human_size(both)} in {dtype}, {free}"
        return plan("sequential", why)
    if dtype in STREAM_DTYPES and need["stream"] <= available:
        return plan("stream", f"one model needs ~{human_size(one)} in {dtype}, {free}: run layer by layer "
                              f"(~{human_size(need['stream'])})")
    if dtype in STREAM_DTYPES:
        raise CkptError(f"not enough memory: one model needs ~{human_size(one)} in {dtype} and a layer-streamed "
                        f"run ~{human_size(need['stream'])}, {free}")
    streamed16 = stream_need_from_sizes(layer * 2, positions, hidden, vocab, 2)
    raise CkptError(f"not enough memory: one model needs ~{human_size(one)} in {dtype}, {free}; a layer-streamed "
                    f"run (--dtype bfloat16) would need ~{human_size(streamed16)}")


def model_sizes(source, revision) -> ModelSizes:
    """:class:`ModelSizes` of an input from its headers (no tensor is read).  An input that does not
    open gets zeros here; the real open that follows reports what is wrong with it."""
    from ..checkpoint import open_checkpoint
    from .loading import NOT_WEIGHTS
    try:
        ck = open_checkpoint(source, revision=revision) if revision else open_checkpoint(source)
    except (CkptError, OSError, ModuleNotFoundError):
        return ModelSizes(0, 0, 0, 0)
    try:
        params, per_layer = 0, {}
        for name, info in ck.tensors.items():
            if info.dtype.upper() in NOT_WEIGHTS:
                continue
            params += info.numel
            m = LAYER_KEY.search(name)
            if m:
                per_layer[m.group(1)] = per_layer.get(m.group(1), 0) + info.numel
        cfg = ck.config or {}
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        hidden = text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0
        vocab = text.get("vocab_size") or 0
        return ModelSizes(params, max(per_layer.values(), default=params), int(hidden or 0), int(vocab or 0))
    finally:
        ck.close()



def budget(dev: str, torch, memory_budget: int | None) -> int | None:
    """Bytes the run may use: the device's free memory, or ``memory_budget`` when smaller."""
    avail = available_bytes(dev, torch)
    if memory_budget is None:
        return avail
    return memory_budget if avail is None else min(avail, memory_budget)


def positions_bound(prompts, token_ids) -> int:
    """An upper bound on the positions before tokenizing: ids as given, else one per character."""
    if token_ids is not None:
        return sum(len(t) for t in token_ids)
    return sum(len(p) + 2 for p in prompts)


def check_memory_arguments(stream, dtype, device_map, memory_budget, max_memory) -> None:
    from .stream import STREAM_DTYPES
    if stream and dtype not in STREAM_DTYPES:
        raise CkptError(f"--stream computes in {', '.join(STREAM_DTYPES[:-1])} or {STREAM_DTYPES[-1]}, not {dtype}")
    if stream and device_map:
        raise CkptError("give --stream or --device-map, not both (streaming runs on one device)")
    if memory_budget is not None and not (isinstance(memory_budget, int) and memory_budget > 0):
        raise CkptError(f"memory budget must be a positive number of bytes, got {memory_budget!r}")
    if max_memory is not None and not device_map:
        raise CkptError("--max-memory applies to --device-map auto (accelerate's per-device limits)")



def human_size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.1f} MiB"
