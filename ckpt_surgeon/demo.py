"""``ckpt-surgeon demo``: the main job on small built-in models, end to end.

Builds a tiny Qwen2-architecture model (random weights, non-zero q/k/v biases, a
small tokenizer, RoPE theta 1e6) into a work folder, then runs each capability
on it and says what it is doing and why:

1. build      the tiny Qwen2 model (and a tiny GPT-2, the no-rotary contrast)
2. inspect    per-layer q/k/v bias norms
3. analyze    which parts of each key bias are removable, with the sound bound
4. refuse     fold-bias --k / --v on Qwen2 are refused, with the analyzer's reasons
5. approx     fold-bias --k --approximate for a 4096-token deployment, then verify
6. exact      GPT-2: key bias dropped and value bias folded exactly, verify passes
7. convert    Qwen2 -> GGUF -> HF, verify the round trip

Steps are data (:data:`STEPS`).  Library code, so it never prints: it reports
lines through ``ctx.say`` and tables through ``ctx.table``, both given by the caller (the CLI's
``cmd_demo`` passes its own table renderer, so nothing here imports the interface layer).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The approximate fold targets a deployment that never sees more than this many tokens.
DEMO_CONTEXT = 4096
DEMO_MAX_LOGIT_CHANGE = 0.05


def summary_text(rep) -> str:
    """A report as ``key: value`` lines: the table renderer a caller without one gets."""
    return "\n".join(f"{k}: {v}" for k, v in rep.summary_items())


@dataclass
class DemoContext:
    workdir: Path
    say: Callable[[str], None]
    table: Callable[[object], str] = summary_text     # a report -> its text (the CLI: cli/render's table)
    model: Path | None = None
    gpt2: Path | None = None
    results: dict = field(default_factory=dict)


def _verify_line(rep) -> str:
    m = rep.to_dict()["metrics"]
    keys = [k for k in ("max_abs_diff", "max_rel_diff", "mean_kl", "max_kl", "top1_agreement",
                        "greedy_identical") if k in m]
    body = ", ".join(f"{k}={m[k]:.3g}" if isinstance(m[k], float) else f"{k}={m[k]}" for k in keys)
    return f"verify: {'PASS' if rep.passed else 'MISMATCH'} ({body})"


def _step_build(ctx: DemoContext) -> None:
    from .tiny import build_tiny
    ctx.say("Building a tiny Qwen2-architecture model (2 layers, 4 query / 2 kv heads, head_dim 16, RoPE theta 1e6, "
            "context 32768, random weights with non-zero q/k/v biases) and a tiny GPT-2 (learned absolute positions) ...")
    ctx.model = build_tiny("qwen2_long", ctx.workdir / "qwen2-tiny")
    ctx.gpt2 = build_tiny("gpt2", ctx.workdir / "gpt2-tiny")
    ctx.say(f"  -> {ctx.model}\n  -> {ctx.gpt2}")


def _step_inspect(ctx: DemoContext) -> None:
    from .analysis.inspect import inspect
    ctx.say(f"$ ckpt-surgeon inspect {ctx.model}")
    rep = inspect(ctx.model)
    ctx.results["inspect"] = rep
    ctx.say(ctx.table(rep))
    ctx.say(f"Found q/k/v biases in {rep.layers_with_qkv_bias} of {rep.num_layers} layers. RoPE is applied after the "
            "biased key projection, so softmax shift-invariance does NOT make the key bias redundant here.")


def _step_analyze(ctx: DemoContext) -> None:
    from . import analyze
    ctx.say(f"$ ckpt-surgeon analyze {ctx.model} --context {DEMO_CONTEXT}")
    rep = analyze(ctx.model, context=DEMO_CONTEXT)
    ctx.results["analyze"] = rep
    ctx.say(ctx.table(rep))
    ctx.say(f"Over a {DEMO_CONTEXT}-token window the slowest rotary pairs barely turn: their share of each key bias "
            "is 'near'-redundant, and 'bound' is a proven limit on how much removing it can move any attention logit.")


def _step_refuse(ctx: DemoContext) -> None:
    from . import fold_bias
    from .errors import RefusedError, UnsupportedError
    import json
    window = json.loads((ctx.model / "config.json").read_text()).get("max_position_embeddings")
    # issue 50 item 9: the refusal's figures are over the model's window, not the 4096 above; say why
    ctx.say(f"An exact fold must hold at every position the model can see, so fold-bias judges it over the "
            f"model's whole window (max_position_embeddings: {window:,} positions), not the {DEMO_CONTEXT}-token "
            "deployment of the analysis above; --approximate --context (step 5) is the deployment's question.")
    for flag, kw in (("--k", {"k": True}), ("--v", {"v": True})):
        ctx.say(f"$ ckpt-surgeon fold-bias {ctx.model} -o {ctx.workdir / 'refused'} {flag}")
        try:
            fold_bias(ctx.model, ctx.workdir / "refused", **kw)
        except (RefusedError, UnsupportedError) as e:
            ctx.say(f"-> exit 2, {e.detail}")
            ctx.results[f"refused{flag}"] = str(e)
        else:  # pragma: no cover - the demo model is built so that both are refused
            raise AssertionError(f"fold-bias {flag} was expected to be refused on Qwen2")


def _fold_and_verify(ctx: DemoContext, key: str, src: Path, out: Path, flags: str, why: str, **kw) -> None:
    """Run one fold-bias, show its plan table, verify it against its source, and explain."""
    from . import fold_bias, verify
    ctx.say(f"$ ckpt-surgeon fold-bias {src} -o {out} {flags} --force")
    res = fold_bias(src, out, force=True, **kw)
    ctx.results[key] = res
    ctx.say(ctx.table(res))
    ctx.say(f"$ ckpt-surgeon verify {src} {out}")
    rep = verify(src, out, max_new_tokens=16)
    ctx.results[f"{key}_verify"] = rep
    ctx.say(_verify_line(rep))
    ctx.say(why)


def _step_approx(ctx: DemoContext) -> None:
    _fold_and_verify(
        ctx, "approx", ctx.model, ctx.workdir / "qwen2-tiny-kfold-approx",
        f"--k --approximate --max-logit-change {DEMO_MAX_LOGIT_CHANGE} --context {DEMO_CONTEXT}",
        "The removed pairs change logits by at most the bound above; verify shows what that does to the "
        "outputs (float32 thresholds are strict, so a tiny non-zero change can still be reported).",
        k=True, approximate=True, max_logit_change=DEMO_MAX_LOGIT_CHANGE, context=DEMO_CONTEXT)


def _step_exact(ctx: DemoContext) -> None:
    _fold_and_verify(
        ctx, "exact", ctx.gpt2, ctx.workdir / "gpt2-tiny-folded", "--k --v",
        "GPT-2 has no rotary embedding: its key bias adds a constant per query that softmax ignores, and its value "
        "bias folds into c_proj's bias (attention rows sum to 1). Same outputs up to float32 rounding.",
        k=True, v=True)


def _step_convert(ctx: DemoContext) -> None:
    from . import convert, verify
    gguf = ctx.workdir / "qwen2-tiny.f32.gguf"
    back = ctx.workdir / "qwen2-tiny-from-gguf"
    ctx.say(f"$ ckpt-surgeon convert {ctx.model} -o {gguf} --dtype f32 --force")
    convert(ctx.model, gguf, dtype="f32", force=True)
    ctx.say(f"$ ckpt-surgeon convert {gguf} -o {back} --dtype float32 --force")
    convert(gguf, back, dtype="float32", force=True)
    ctx.say(f"$ ckpt-surgeon verify {ctx.model} {back}")
    rep = verify(ctx.model, back, max_new_tokens=16)
    ctx.results["convert_verify"] = rep
    ctx.say(_verify_line(rep))
    ctx.say("The GGUF carries the q/k/v biases in F32 and rope theta 1e6 (llama.cpp would silently assume 10000); "
            "converting back gives the same model.")


STEPS: tuple[tuple[str, Callable[[DemoContext], None]], ...] = (
    ("build", _step_build),
    ("inspect", _step_inspect),
    ("analyze", _step_analyze),
    ("fold-bias refused on Qwen2", _step_refuse),
    ("fold-bias --approximate + verify", _step_approx),
    ("exact fold on GPT-2 + verify", _step_exact),
    ("convert HF -> GGUF -> HF + verify", _step_convert),
)


def default_workdir() -> Path:
    """The one folder every demo run reuses (issue 50 item 10: each run used to leave a new ``demo-*`` folder):
    ``<xdg cache>/ckpt-surgeon/demo``; the models are rebuilt and the outputs replaced in it."""
    from .userdirs import xdg_cache
    return xdg_cache() / "ckpt-surgeon" / "demo"


def run_demo(workdir: str | os.PathLike | None = None, say: Callable[[str], None] = lambda s: None,
             table: Callable[[object], str] = summary_text) -> DemoContext:
    """Run every demo step; returns the context with per-step results.  ``say`` takes each line,
    ``table`` turns a report into the text ``say`` is given for it."""
    ctx = DemoContext(workdir=Path(workdir) if workdir is not None else default_workdir(), say=say, table=table)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    say(f"Work folder: {ctx.workdir}" + (" (every demo run reuses it; --workdir DIR for another)"
                                         if workdir is None else ""))
    for i, (name, fn) in enumerate(STEPS, 1):
        say(f"\n[{i}/{len(STEPS)}] {name}")
        fn(ctx)
    return ctx
