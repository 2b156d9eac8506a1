"""No output of any command may touch what the command reads (issue 36, item 9: ``inspect M -o
M/model.safetensors --force`` destroyed the weights it had read; so did ``verify A A -o
A/config.json --force`` and ``fold-bias M -o out --report M/config.json --force``).

The commands and their path options are discovered from the click tree, so a command or an output
option added later is walked too: every output option of every command is pointed at every kind
of input (a file of the input folder, the folder itself, the folder holding it, a symlink to an
input file, the files beside a single weight file, each file-valued input option) with --force,
and must be refused in one line, exit 2, every input byte unchanged.  The inputs are a folder whose
weights are garbage: a command that read before checking would stop at the garbage with another
message, so the refusal is proven to come before any work.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import click
import pytest

from ckpt_surgeon.cli import cli
from ckpt_surgeon.cli.paths import role
from cli_util import _one_line_exit_2, _run


def _commands(group=cli, prefix=()):
    """(argv prefix, command) for every runnable command, sub-commands of groups included."""
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,), cmd


def _flag(p: click.Option) -> str:
    return max(p.opts, key=len)


def _tree_digest(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for dirpath, dirs, names in sorted(os.walk(root)):
            dirs.sort()
            for n in sorted(names + dirs):
                p = Path(dirpath) / n
                h.update(str(p).encode())
                if p.is_file() and not p.is_symlink():
                    h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def inputs(tmp_path):
    """A model folder (config and tokenizer real, weights garbage) and a folder of other input files."""
    m = tmp_path / "work" / "M"
    m.mkdir(parents=True)
    (m / "config.json").write_text('{"model_type": "qwen2"}\n')
    (m / "tokenizer.json").write_text("{}\n")
    (m / "model.safetensors").write_bytes(b"not a safetensors file" * 10)
    extra = tmp_path / "inp"
    extra.mkdir()
    (extra / "file.txt").write_text("hello\n")
    (extra / "tok").mkdir()
    (extra / "tok" / "tokenizer.json").write_text("{}\n")
    return m, extra


def _argv(prefix, cmd, source, target_param, target, extra_opts=(), elsewhere=None):
    """argv running ``cmd`` on ``source`` (every positional), ``target_param`` set to ``target``,
    required options filled with harmless values, --force when the command has it."""
    argv = list(prefix)
    for p in cmd.params:
        if isinstance(p, click.Argument):
            argv.append(str(source))
    for p in cmd.params:
        if not isinstance(p, click.Option) or p is target_param or not p.required:
            continue
        if role(p) in ("output", "into"):
            argv += [_flag(p), str(elsewhere)]
        else:
            argv += [_flag(p), p.type.choices[0] if isinstance(p.type, click.Choice) else "1"]
    argv += [_flag(target_param), str(target), *extra_opts]
    if any(p.name == "force" for p in cmd.params):
        argv.append("--force")
    return argv


def _outputs(cmd):
    return [p for p in cmd.params if isinstance(p, click.Option) and role(p) in ("output", "into")]


def _input_options(cmd):
    return [p for p in cmd.params if isinstance(p, click.Option) and role(p) == "input"]


def test_every_path_parameter_is_declared_input_or_output():
    """A new path option must say what it is (cli/paths.py): an undeclared click.Path is neither
    checked as an output nor protected as an input."""
    undeclared = [f"{' '.join(prefix)} {_flag(p)}" for prefix, cmd in _commands() for p in cmd.params
                  if isinstance(p, click.Option) and isinstance(p.type, click.Path) and role(p) is None]
    assert not undeclared, undeclared
    found = {(" ".join(prefix), _flag(p)) for prefix, cmd in _commands() for p in _outputs(cmd)}
    for must in [("inspect", "--output"), ("analyze", "--output"), ("analyze", "--plot"), ("fold-bias", "--output"),
                 ("fold-bias", "--report"), ("qkv fuse", "--output"), ("qkv split", "--report"),
                 ("convert", "--output"), ("verify", "--output"), ("verify", "--save-reference"),
                 ("diff", "--output"), ("lint", "--output")]:
        assert must in found, (must, sorted(found))


def _refused(argv, *roots):
    before = _tree_digest(*roots)
    res = _run(*argv)
    _one_line_exit_2(res, "the output would")
    assert _tree_digest(*roots) == before, argv


def test_every_output_option_refuses_every_input(inputs, tmp_path):
    m, extra = inputs
    work = m.parent
    link = tmp_path / "link.safetensors"
    link.symlink_to(m / "model.safetensors")
    other = tmp_path / "elsewhere" / "out"        # a required output not under test: harmless
    other.parent.mkdir()
    walked = 0
    for prefix, cmd in _commands():
        if not any(isinstance(p, click.Argument) for p in cmd.params):
            continue                 # nothing read (demo): nothing to protect
        for out in _outputs(cmd):
            # (click itself refuses a file for a folder option and a folder for a file option)
            targets = [m / "new-file", m / "sub"]
            if out.type.file_okay:
                targets += [m / "model.safetensors", m / "config.json", link]
            if out.type.dir_okay:
                targets += [m] + ([] if out.type.into else [work])
            for target in targets:
                _refused(_argv(prefix, cmd, m, out, target, elsewhere=other), work, extra)
            if out.type.file_okay:     # a single weight file reads its folder's config and tokenizer
                _refused(_argv(prefix, cmd, m / "model.safetensors", out, m / "config.json", elsewhere=other),
                         work, extra)
            for inp in _input_options(cmd):
                if not out.type.file_okay:
                    continue
                path = extra / "tok" if isinstance(inp.type, click.ParamType) and not isinstance(
                    inp.type, click.Path) else extra / "file.txt"
                target = path / "tokenizer.json" if path.is_dir() else path
                _refused(_argv(prefix, cmd, m, out, target, [_flag(inp), str(path)], elsewhere=other), work, extra)
            walked += 1
    assert walked >= 12, walked


def test_the_reported_data_loss_is_refused(tiny, tmp_path):
    """The three commands of the report, on a real model: refused, the model byte for byte intact."""
    m = tmp_path / "M"
    shutil.copytree(tiny("qwen2"), m)
    for argv in (["inspect", m, "-o", m / "model.safetensors", "--force"],
                 ["verify", m, m, "-o", m / "config.json", "--force"],
                 ["fold-bias", m, "-o", tmp_path / "out", "--k", "--report", m / "config.json", "--force"]):
        _refused(argv, tmp_path)
        assert not (tmp_path / "out").exists()


def test_a_folder_of_the_input_folder_is_called_a_folder(tiny, tmp_path):
    """Issue 50 item 9: ``-o M/1_Pooling`` (a sub-folder of the input folder) was called "a file of the input
    folder"; a file there still is one."""
    m = tmp_path / "M"
    shutil.copytree(tiny("qwen2"), m)
    (m / "1_Pooling").mkdir()
    res = _run("fold-bias", m, "-o", m / "1_Pooling", "--center", "--force")
    _one_line_exit_2(res, f"the output would overwrite a folder of the input folder {m}")
    res = _run("inspect", m, "-o", m / "config.json", "--force")
    _one_line_exit_2(res, f"the output would overwrite a file of the input folder {m}")


@pytest.fixture
def unwritable(tmp_path):
    """A folder that refuses new files even to root: chmod 555, and chattr +i where the mode is not
    enough (root ignores it); /sys (sysfs takes no new file from anyone) where neither works."""
    import subprocess
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)

    def writable(folder):
        try:
            (folder / ".probe").touch()
        except OSError:
            return False
        (folder / ".probe").unlink()
        return True

    immutable = False
    if writable(d):
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    chosen = d if not writable(d) else Path("/sys")
    assert not writable(chosen)
    yield chosen
    if immutable:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    d.chmod(0o755)


def test_an_unwritable_output_folder_is_refused_before_any_work(tiny, unwritable, tmp_path):
    """Issue 36, item 13: convert found a read-only output folder 40 s into the work and named its
    hidden temp file.  Every output of every command: one line naming the folder, the hint, exit 2."""
    other = tmp_path / "elsewhere" / "out"
    other.parent.mkdir()
    src = tiny("qwen2")
    walked = 0
    for prefix, cmd in _commands():
        if not any(isinstance(p, click.Argument) for p in cmd.params):
            continue
        for out in _outputs(cmd):
            target = unwritable / ("x.gguf" if prefix == ("convert",) else "report-or-folder")
            res = _run(*_argv(prefix, cmd, src, out, target, elsewhere=other))
            _one_line_exit_2(res, f"error: {unwritable}: cannot write the output: ",
                             f"(check write permission on {unwritable}; nothing was written)")
            assert ".ckpt-surgeon-" not in res.stderr       # never the hidden temp file's name
            walked += 1
    assert walked >= 12 and not list(other.parent.iterdir())
