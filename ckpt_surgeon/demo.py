"""``ckpt-surgeon demo``: the main job on a small built-in model, end to end.

Builds a tiny Qwen2-architecture model (random weights, non-zero q/k/v biases,
a small tokenizer) into a work folder, then runs each capability on it and says
what it is doing.  Steps are data: each names the capability it shows and a
function taking the shared :class:`DemoContext`.  Library code, so it never
prints: it reports lines through ``ctx.say``.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class DemoContext:
    workdir: Path
    say: Callable[[str], None]
    model: Path | None = None
    results: dict = field(default_factory=dict)


def _step_build(ctx: DemoContext) -> None:
    from .tiny import build_tiny
    ctx.say("Building a tiny Qwen2-architecture model (2 layers, 4 query / 2 kv heads, head_dim 16, RoPE theta 1e6, "
            "context 32768, random weights with non-zero q/k/v biases) ...")
    ctx.model = build_tiny("qwen2_long", ctx.workdir / "qwen2-tiny")
    ctx.say(f"  -> {ctx.model}")


def _step_inspect(ctx: DemoContext) -> None:
    from .analysis.inspect import inspect
    from .cli.render import to_table
    ctx.say(f"$ ckpt-surgeon inspect {ctx.model}")
    rep = inspect(ctx.model)
    ctx.results["inspect"] = rep
    ctx.say(to_table(rep.rows(), rep.summary_items(), rep.notes).rstrip())
    ctx.say(f"Found q/k/v biases in {rep.layers_with_qkv_bias} of {rep.num_layers} layers. "
            f"RoPE is applied after the biased key projection, so the key bias is NOT removable by "
            f"softmax shift-invariance here.")


STEPS: tuple[tuple[str, Callable[[DemoContext], None]], ...] = (
    ("build", _step_build),
    ("inspect", _step_inspect),
)


def run_demo(workdir: str | os.PathLike | None = None, say: Callable[[str], None] = lambda s: None) -> DemoContext:
    """Run every demo step; returns the context with per-step results."""
    if workdir is None:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ckpt-surgeon"
        base.mkdir(parents=True, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="demo-", dir=base)
    ctx = DemoContext(workdir=Path(workdir), say=say)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    for i, (name, fn) in enumerate(STEPS, 1):
        say(f"\n[{i}/{len(STEPS)}] {name}")
        fn(ctx)
    return ctx
