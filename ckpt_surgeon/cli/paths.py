"""Which parameters of a command name files it reads and files it writes, and the one check
between them that every command gets before any work (issue 36).

A command declares its paths by type: :class:`ReadPath` (or :class:`ReadPathOrId` for a path that
may also be a Hub id) for what it reads, :class:`WritePath` / :class:`WriteInto` for what it
writes, :class:`ScratchDir` for a temp folder.  Positional arguments (SOURCE, A B, REFERENCE
CANDIDATE) and ``click.Path(exists=True)`` options are inputs, and an option spelled ``-o`` /
``--output`` / ``--out`` is an output, whatever its type, so a new command is covered without
declaring anything.  :func:`guard_command` wraps every registered command's callback: each output
is refused if it would touch an input (even with ``--force``), and its folder must take a new
file (``publish.check_writable``) before the command starts its work.
"""
from __future__ import annotations

import functools

import click

OUTPUT_FLAGS = frozenset({"-o", "--output", "--out"})


class ReadPath(click.Path):
    """A file or folder the command reads."""


class WritePath(click.Path):
    """A file or folder the command writes (replacing it whole)."""

    into = False


class WriteInto(WritePath):
    """A folder the command writes files into (created when missing)."""

    into = True

    def __init__(self, **kw):
        kw.setdefault("file_okay", False)
        super().__init__(**kw)


class ScratchDir(click.Path):
    """A folder for temporary files, removed at the end: neither an input nor an output."""

    def __init__(self, **kw):
        kw.setdefault("file_okay", False)
        super().__init__(**kw)


class ReadPathOrId(click.ParamType):
    """A local path the command reads, or a Hub repo id."""

    name = "path_or_id"

    def convert(self, value, param, ctx):
        return value if value is None else str(value)


def role(param: click.Parameter) -> str | None:
    """'input' | 'output' | 'into' | 'scratch' | None (not a path)."""
    t = param.type
    if isinstance(t, WritePath):
        return "into" if t.into else "output"
    if isinstance(t, ScratchDir):
        return "scratch"
    if isinstance(param, click.Option) and OUTPUT_FLAGS & set(param.opts):
        return "output"
    if isinstance(t, (ReadPath, ReadPathOrId)) or isinstance(param, click.Argument):
        return "input"
    if isinstance(t, click.Path):
        return "input" if t.exists else None
    return None


def _values(v) -> list[str]:
    if v is None:
        return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]


def check_paths(ctx: click.Context) -> None:
    """Every output of the command being run against every input (``publish.refuse_onto_inputs``),
    then whether its folder takes a new file (``publish.check_writable``); before any work."""
    from ..publish import check_writable, refuse_onto_inputs

    inputs, outputs = [], []
    for p in ctx.command.params:
        r = role(p)
        if r == "input":
            inputs += _values(ctx.params.get(p.name))
        elif r in ("output", "into"):
            # a --dry-run writes no model: its -o need not be writable (a --report still is)
            dry = bool(ctx.params.get("dry_run")) and bool(OUTPUT_FLAGS & set(getattr(p, "opts", ())))
            outputs += [(v, r == "into", dry) for v in _values(ctx.params.get(p.name))]
    for out, into, _ in outputs:
        refuse_onto_inputs(out, inputs, into=into)
    for out, into, dry in outputs:
        if not dry:
            check_writable(out, into=into)


def guard_command(cmd: click.Command) -> click.Command:
    """Run :func:`check_paths` before ``cmd``'s own callback (and every sub-command's of a group)."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            guard_command(sub)
        return cmd
    inner = cmd.callback
    if inner is None or getattr(inner, "_paths_guarded", False):
        return cmd

    @functools.wraps(inner)
    def guarded(*args, **kwargs):
        check_paths(click.get_current_context())
        return inner(*args, **kwargs)

    guarded._paths_guarded = True
    cmd.callback = guarded
    return cmd
