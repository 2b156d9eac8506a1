"""The ``ckpt-surgeon`` command line: thin click commands over the library API.

Each command lives in its own ``cmd_*.py`` module exposing ``command`` and is
discovered here, so adding a command never edits this file.  One handler turns
every :class:`~ckpt_surgeon.errors.CkptError` into a single ``error: ...`` line
on stderr and its exit code (2 for bad input, 1 for a verification mismatch).
Tracebacks only with ``--debug`` or ``CKPT_SURGEON_DEBUG=1``.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import click

from ..errors import CkptError
from .paths import guard_command


def debug_enabled(ctx: click.Context | None = None) -> bool:
    if os.environ.get("CKPT_SURGEON_DEBUG", "").lower() in ("1", "true", "yes"):
        return True
    root = ctx.find_root() if ctx else None
    return bool(root and root.obj and root.obj.get("debug"))


class SurgeonGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CkptError as e:
            if debug_enabled(ctx):
                raise
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except OSError as e:
            # Disk full, permission denied ... : one line naming the file.
            if debug_enabled(ctx):
                raise
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            click.echo(f"error: {where}{e.strerror or e}", err=True)
            ctx.exit(2)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence: still one line, exit 2
            # An untyped exception is a defect of ours (issue 24: BLOOM's stray num_key_value_heads
            # reached the user as a traceback), but the user still gets one line and exit 2.
            if debug_enabled(ctx):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            click.echo(f"error: internal error ({type(e).__name__}: {first}); this is a bug in ckpt-surgeon: "
                       "rerun with --debug for the traceback and report it", err=True)
            ctx.exit(2)

    def list_commands(self, ctx):
        # Keep the documented order; anything else after it.
        order = ["inspect", "analyze", "fold-bias", "kv-equalize", "qkv", "convert", "verify", "diff", "lint", "demo"]
        names = super().list_commands(ctx)
        return [n for n in order if n in names] + [n for n in names if n not in order]


@click.group(cls=SurgeonGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ckpt-surgeon", prog_name="ckpt-surgeon")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors (or set CKPT_SURGEON_DEBUG=1).")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Look inside LLM checkpoints and operate on them safely.

    SOURCE is a Hugging Face folder, a .safetensors or .gguf file (any part of a split GGUF), a quantized
    HF checkpoint, or a Hub repo id (owner/name; convert reads a local copy).  Exit codes: 0 success, 1 a
    finding (a mismatch, a lint error, a difference), 2 bad input.  --debug may also follow the command.

    \b
    Examples:
      ckpt-surgeon demo
      ckpt-surgeon inspect Qwen/Qwen2.5-7B
      ckpt-surgeon analyze ./all-MiniLM-L6-v2 --measure

    Docs: README.md, docs/commands.md.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _set_debug(ctx: click.Context, _param, value: bool) -> None:
    if value:
        root = ctx.find_root()
        root.ensure_object(dict)
        root.obj["debug"] = True


def _accept_debug(cmd: click.Command) -> click.Command:
    """``--debug`` after the command's name too (``ckpt-surgeon inspect M --debug``), as before it."""
    if not any(p.name == "debug" for p in cmd.params):
        cmd.params.append(click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                                       callback=_set_debug, help="Show full tracebacks on errors (as ckpt-surgeon "
                                                                 "--debug COMMAND)."))
    for sub in getattr(cmd, "commands", {}).values():
        _accept_debug(sub)
    return cmd


def _register() -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            module = importlib.import_module(f"{__name__}.{mod.name}")
            cli.add_command(_accept_debug(guard_command(module.command)))


_register()


def main() -> None:
    try:
        cli(prog_name="ckpt-surgeon")
    except SystemExit as e:
        dist_env = sys.modules.get("ckpt_surgeon.verification.dist_env")   # loaded only under torchrun
        if dist_env is not None:
            dist_env.end_process(e.code)
        raise
