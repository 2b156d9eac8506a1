"""CLI surface: every command documents itself; the demo runs end to end."""
from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from ckpt_surgeon.cli import cli


def test_every_command_has_help():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0
    assert set(cli.commands) >= {"inspect", "demo"}
    for name, cmd in cli.commands.items():
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, name
        assert cmd.help and len(cmd.help.split()) >= 8, f"{name} needs real --help text"
        assert name in top.output
        for p in cmd.params:
            if p.param_type_name == "option" and p.name != "help":
                assert p.help, f"{name} {p.opts} has no help text"


def test_usage_error_exit_code_is_2():
    res = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect"], capture_output=True, text=True)
    assert res.returncode == 2 and "Missing argument 'SOURCE'" in res.stderr


def test_demo_runs(tmp_path):
    res = CliRunner().invoke(cli, ["demo", "--workdir", str(tmp_path / "demo")])
    assert res.exit_code == 0, res.output
    assert "ckpt-surgeon inspect" in res.output
    assert "Found q/k/v biases in 2 of 2 layers" in res.output
    assert (tmp_path / "demo" / "qwen2-tiny" / "model.safetensors").is_file()
    # the refusals carry the analyzer's reasons, and every verify step passes
    assert "-> exit 2, refused: the key bias is not exactly removable in qwen2" in res.output
    assert "-> exit 2, refused: cannot fold the value bias" in res.output
    assert res.output.count("verify: PASS") == 3 and "MISMATCH" not in res.output
