"""CLI helpers shared by the test modules: run a command in-process, expect one error line."""
from __future__ import annotations

from click.testing import CliRunner

from ckpt_surgeon.cli import cli


def _run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _one_line_exit_2(res, *needles):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
