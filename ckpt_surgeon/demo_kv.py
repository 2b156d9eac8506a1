"""``ckpt-surgeon demo --kv``: docs/kv-cache.md's recipe, end to end, on the key-bias fixture it was measured on.

The fixture (:mod:`ckpt_surgeon.tiny_kv`, ``concentrated``): a Qwen2 with Qwen2.5-7B's head_dim 128 carrying the
public Qwen2.5-7B key-bias profile (‖b_k‖ 605 at the first layer, 921 at the last, in four low-frequency rotary
pairs per kv head).  The steps are the recipe's four commands, through their Python twins:

1. build      the fixture (cached beside the tiny models)
2. predict    ``analyze --kv-cache q4_0,q8_0``
3. equalize   ``kv-equalize --cache-type-k T`` for each T
4. convert    the original and each equalized model to an f16 GGUF
5. check      ``verify --cache-sweep`` in llama.cpp over the shipped corpus (``--corpus builtin --ctx 256
              --chunks 8``): the original under each K type, then each equalized model against the original's
              f16-cache run; the mean KLD before / after is the doc's table (3.69x for q4_0, 11.88x for q8_0)

Library code, so it never prints: lines go through ``say`` and reports through ``table``, as :mod:`.demo`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .demo import DemoContext, default_workdir, summary_text

TYPES = ("q4_0", "q8_0")
CTX, CHUNKS = 256, 8             # docs/kv-cache.md's table: 8 x 256 tokens of the shipped corpus


def _sweep(ctx: DemoContext, ref: Path, cand: Path, types, chunks: int):
    from .verification.cache_sweep import verify_cache_sweep
    sweep = ",".join(f"{t}/f16" for t in types)
    ctx.say(f"$ ckpt-surgeon verify {ref} {cand} --corpus builtin --ctx {CTX} --chunks {chunks} --cache-sweep {sweep}")
    rep = verify_cache_sweep(ref, cand, cache_sweep=sweep, corpus="builtin", ctx=CTX, chunks=chunks, device="cpu")
    ctx.say(ctx.table(rep))
    return {r.cache.k: r.stats for r in rep.rows_}


def run_kv_demo(workdir: str | os.PathLike | None = None, say: Callable[[str], None] = lambda s: None,
                table: Callable[[object], str] = summary_text, *, chunks: int = CHUNKS) -> DemoContext:
    """Run the recipe's steps; ``ctx.results`` holds ``original`` / ``equalized`` ({K type: FidelityStats}) and
    ``ratio`` ({K type: original mean KLD / equalized mean KLD}).  ``chunks``: corpus chunks scored (8: the
    doc's figures)."""
    from . import convert, kv_equalize
    from .analysis.kv_cache import analyze_kv_cache
    from .tiny_kv import kv_fixture_path

    ctx = DemoContext(workdir=Path(workdir) if workdir is not None else default_workdir(), say=say, table=table)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    say(f"Work folder: {ctx.workdir}" + (" (every demo run reuses it; --workdir DIR for another)"
                                         if workdir is None else ""))
    say("\n[1/5] build the Qwen2.5-7B key-bias fixture (head_dim 128, 6 layers; |b_k| 605 / 921 at the first / "
        "last layer, in 4 low-frequency rotary pairs per kv head)")
    ctx.model = kv_fixture_path("concentrated")
    say(f"  -> {ctx.model}")
    say("\n[2/5] predict which layers a quantized K cache hurts")
    say(f"$ ckpt-surgeon analyze {ctx.model} --kv-cache {','.join(TYPES)}")
    say(table(analyze_kv_cache(str(ctx.model), ",".join(TYPES))))
    say("\n[3/5] equalize: exact q/k pair rescaling (and turns) against each K type")
    eq = {}
    for t in TYPES:
        eq[t] = ctx.workdir / f"kv-eq-{t}"
        say(f"$ ckpt-surgeon kv-equalize {ctx.model} -o {eq[t]} --cache-type-k {t} --force")
        say(table(kv_equalize(str(ctx.model), eq[t], cache_type_k=t, force=True)))
    say("\n[4/5] convert the original and the equalized models to f16 GGUFs (what llama.cpp runs)")
    gguf = {}
    for name, src in (("original", ctx.model), *((t, eq[t]) for t in TYPES)):
        gguf[name] = ctx.workdir / (f"kv-{name}.f16.gguf" if name == "original" else f"kv-eq-{name}.f16.gguf")
        say(f"$ ckpt-surgeon convert {src} -o {gguf[name]} --dtype f16 --force")
        convert(src, gguf[name], dtype="f16", force=True)
    say("\n[5/5] check in llama.cpp: each K cache against the original's f16-cache run")
    orig = _sweep(ctx, gguf["original"], gguf["original"], TYPES, chunks)
    after = {t: _sweep(ctx, gguf["original"], gguf[t], (t,), chunks)[t] for t in TYPES}
    ctx.results.update(original=orig, equalized=after,
                       ratio={t: orig[t].kl_mean / after[t].kl_mean for t in TYPES})
    for t in TYPES:
        say(f"K {t}: mean KLD {orig[t].kl_mean:.6f} -> {after[t].kl_mean:.6f} equalized "
            f"({ctx.results['ratio'][t]:.2f}x lower); same top {100 * orig[t].same_top:.1f} % -> "
            f"{100 * after[t].same_top:.1f} %")
    if chunks == CHUNKS:
        say("These are docs/kv-cache.md's figures (3.69x for q4_0, 11.88x for q8_0, llama-cpp-python 0.3.36).")
    return ctx
