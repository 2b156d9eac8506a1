"""``ckpt-surgeon demo``."""
from __future__ import annotations

import click

from .paths import WriteInto


@click.command("demo")
@click.option("--workdir", type=WriteInto(), default=None,
              help="Folder for the demo model and outputs (default: ~/.cache/ckpt-surgeon/demo, reused by every run).")
@click.option("--kv", is_flag=True,
              help="Run docs/kv-cache.md's recipe instead, on the key-bias fixture it was measured on (needs "
                   "llama-cpp-python; 2-5 minutes).")
def command(workdir, kv):
    """Run the main job end to end on small built-in models, explaining each step.

    Builds a tiny Qwen2-architecture model with non-zero q/k/v biases (and a tiny GPT-2) without a download,
    then runs inspect, analyze, the refused and the approximate fold-bias, an exact GPT-2 fold and an
    HF -> GGUF -> HF round trip, each followed by verify.  --kv runs the quantized-KV-cache recipe instead
    (docs/kv-cache.md).  Needs torch and transformers (installed with it).

    \b
    Examples:
      ckpt-surgeon demo
      ckpt-surgeon demo --kv
      ckpt-surgeon demo --workdir ./demo

    Docs: README.md.
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
