"""CLI surface: every command documents itself (the demo runs end to end in tests/test_docs.py, as the
README's tour shows it)."""
from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from ckpt_surgeon.cli import cli


def _commands(group, prefix=()):
    """Every leaf command, with its path (``qkv fuse``), walking into groups (a group's own
    ``params`` are empty: its subcommands hold the options)."""
    import click
    for name, cmd in group.commands.items():
        path = (*prefix, name)
        if isinstance(cmd, click.Group):
            yield path, cmd
            yield from _commands(cmd, path)
        else:
            yield path, cmd


def test_every_command_has_help():
    import click
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0
    assert set(cli.commands) >= {"inspect", "demo"}
    walked = list(_commands(cli))
    assert ("qkv", "fuse") in [p for p, _ in walked] and ("qkv", "split") in [p for p, _ in walked]
    n_options = 0
    for path, cmd in walked:
        res = runner.invoke(cli, [*path, "--help"])
        assert res.exit_code == 0, path
        assert cmd.help and len(cmd.help.split()) >= 8, f"{' '.join(path)} needs real --help text"
        assert path[-1] in (top.output if len(path) == 1 else runner.invoke(cli, [*path[:-1], "--help"]).output)
        if isinstance(cmd, click.Group):
            continue
        for p in cmd.params:
            if p.param_type_name == "option" and p.name != "help":
                n_options += 1
                assert p.help, f"{' '.join(path)} {p.opts} has no help text"
                assert p.opts[0] in res.output, f"{' '.join(path)} --help does not show {p.opts[0]}"
    assert n_options >= 40, n_options   # every command's options were really walked


def test_convert_help_names_every_converted_architecture():
    """`convert --help` lists the architectures by hand (the CLI does not load the registry to
    print help); it must name every one the registry converts, by a model type or its GGUF name."""
    import re

    from ckpt_surgeon.conversion import names as N
    text = " ".join(CliRunner().invoke(cli, ["convert", "--help"]).output.split())
    assert len(N.ARCHS) >= 20
    for spec in N.ARCHS:
        assert any(re.search(rf"\b{re.escape(n)}\b", text) for n in (*spec.hf_model_types, spec.gguf_arch)), \
            spec.gguf_arch
    for spec in N.ARCHS:       # and every scaled RoPE it converts
        for rope in spec.rope_scalings:
            assert re.search(rf"\b{rope}\b", text), (spec.gguf_arch, rope)


def test_usage_error_exit_code_is_2():
    res = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect"], capture_output=True, text=True)
    assert res.returncode == 2 and "Missing argument 'SOURCE'" in res.stderr
