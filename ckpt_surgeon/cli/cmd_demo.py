"""``ckpt-surgeon demo``."""
from __future__ import annotations

import click

from .paths import WriteInto


@click.command("demo")
@click.option("--workdir", type=WriteInto(), default=None,
              help="Folder for the demo model and outputs (default: ~/.cache/ckpt-surgeon/demo, $XDG_CACHE_HOME "
                   "honoured, reused and overwritten by every run).")
@click.option("--kv", is_flag=True,
              help="Run docs/kv-cache.md's recipe instead (analyze --kv-cache, kv-equalize, convert, verify "
                   "--cache-sweep in llama.cpp over the shipped corpus) on the Qwen2.5-7B key-bias fixture it was "
                   "measured on, printing the doc's figures. Needs llama-cpp-python; 2-5 minutes on 2 cores.")
def command(workdir, kv):
    """Run the main job end to end on a small built-in Qwen2-architecture model.

    Builds a tiny random model with non-zero q/k/v biases (no download), then
    inspects it and runs the other capabilities on it, explaining each step.
    Needs torch and transformers (installed with ckpt-surgeon).  --kv runs the
    quantized-KV-cache recipe instead (docs/kv-cache.md).
    """
    from .render import to_table

    def table(rep) -> str:
        return to_table(rep.rows(), rep.summary_items(), getattr(rep, "notes", ())).rstrip()
    if kv:
        from ..demo_kv import run_kv_demo
        ctx = run_kv_demo(workdir, say=lambda s: click.echo(s), table=table)
    else:
        from ..demo import run_demo
        ctx = run_demo(workdir, say=lambda s: click.echo(s), table=table)
    click.echo(f"\nDemo finished; files are in {ctx.workdir}")
