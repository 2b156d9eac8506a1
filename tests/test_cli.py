"""CLI surface: every command documents itself; the demo runs end to end."""
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


def test_demo_runs(tmp_path, monkeypatch):
    # the default work folder: one fixed folder under the user cache, named at the start and the end (issue 50
    # item 10: every run used to leave a new demo-* folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    res = CliRunner().invoke(cli, ["demo"])
    assert res.exit_code == 0, res.output
    work = tmp_path / "ckpt-surgeon" / "demo"
    assert [p.name for p in (tmp_path / "ckpt-surgeon").iterdir() if p.name.startswith("demo")] == ["demo"]
    assert f"Work folder: {work} (every demo run reuses it" in res.output and f"files are in {work}" in res.output
    assert "ckpt-surgeon inspect" in res.output
    assert "Found q/k/v biases in 2 of 2 layers" in res.output
    assert (work / "qwen2-tiny" / "model.safetensors").is_file()
    # the refusals carry the analyzer's reasons, and every verify step passes; the refusal's window (the model's
    # 32,768, not the analysis' 4096) is explained before it (issue 50 item 9)
    assert "-> exit 2, refused: the key bias is not exactly removable in qwen2" in res.output
    refuse = res.output.split("[4/7]")[1]
    assert refuse.index("(max_position_embeddings: 32,768 positions), not the 4096-token") < refuse.index(
        "over 32768 positions")
    assert "-> exit 2, refused: cannot fold the value bias" in res.output
    assert res.output.count("verify: PASS") == 3 and "MISMATCH" not in res.output
