"""``ckpt-surgeon demo``."""
from __future__ import annotations

import click

from .paths import WriteInto


@click.command("demo")
@click.option("--workdir", type=WriteInto(), default=None,
              help="Folder for the demo model and outputs (default: ~/.cache/ckpt-surgeon/demo, $XDG_CACHE_HOME "
                   "honoured, reused and overwritten by every run).")
def command(workdir):
    """Run the main job end to end on a small built-in Qwen2-architecture model.

    Builds a tiny random model with non-zero q/k/v biases (no download), then
    inspects it and runs the other capabilities on it, explaining each step.
    Needs torch and transformers (installed with ckpt-surgeon).
    """
    from ..demo import run_demo
    from .render import to_table

    def table(rep) -> str:
        return to_table(rep.rows(), rep.summary_items(), getattr(rep, "notes", ())).rstrip()
    ctx = run_demo(workdir, say=lambda s: click.echo(s), table=table)
    click.echo(f"\nDemo finished; files are in {ctx.workdir}")
