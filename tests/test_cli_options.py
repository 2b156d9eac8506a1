"""Options every command shares, through the real CLI: one rule for report files (--output /
--report: an existing file is refused without --force, as surgery outputs are), one progress
switch (--progress/--no-progress, on by default only when stderr is a terminal), and the
inspect table's "-" where nothing of a key bias is removable."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parent.parent


from cli_util import _one_line_exit_2, _run  # noqa: E402  (shared CLI test helpers)


# --- report files: refuse an existing one unless --force --------------------------------------

def test_report_output_refuses_an_existing_file_without_force(tiny, tmp_path):
    src = tiny("qwen2")
    out = tmp_path / "report.json"
    out.write_text("keep me\n")
    for cmd in (["inspect", src], ["analyze", src], ["verify", src, src, "--max-new-tokens", "0"], ["lint", src],
                ["diff", src, src]):
        res = _run(*cmd, "--format", "json", "--output", out)
        _one_line_exit_2(res, f"error: {out}: already exists (pass --force to replace it)")
        assert out.read_text() == "keep me\n"          # untouched, and refused before any work
        assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]    # no temp file left
    res = _run("inspect", src, "--format", "json", "--output", out, "--force")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["num_layers"] == 2
    assert res.stderr == f"wrote {out}\n"
    fresh = tmp_path / "new.json"
    assert _run("analyze", src, "--format", "json", "-o", fresh).exit_code == 0 and fresh.is_file()


def test_report_output_never_replaces_an_input(tiny, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny("gpt2"), folder)
    weights = folder / "model.safetensors"
    before = weights.read_bytes()
    res = _run("inspect", weights, "--format", "json", "-o", weights, "--force")
    _one_line_exit_2(res, str(weights), "the output would overwrite the input")
    assert weights.read_bytes() == before
    as_dir = _run("inspect", folder, "-o", folder, "--force")
    assert as_dir.exit_code == 2 and f"File '{folder}' is a directory" in as_dir.stderr
    _one_line_exit_2(_run("inspect", folder, "-o", tmp_path / "no" / "r.json"), "does not exist")


def test_surgery_report_file_follows_the_same_rule(tiny, tmp_path):
    src = tiny("gpt2")
    report = tmp_path / "fold.json"
    report.write_text("old\n")
    out = tmp_path / "folded"
    res = _run("fold-bias", src, "-o", out, "--k", "--v", "--format", "json", "--report", report)
    _one_line_exit_2(res, f"{report}: already exists (pass --force to replace it)")
    assert not out.exists() and report.read_text() == "old\n"           # nothing written at all
    res = _run("fold-bias", src, "-o", out, "--k", "--v", "--format", "json", "--report", report, "--force")
    assert res.exit_code == 0, res.output
    assert json.loads(report.read_text())["out"] == str(out) and (out / "model.safetensors").is_file()


# --- --progress/--no-progress: the same switch everywhere -----------------------------------------

LONG_COMMANDS = (["inspect"], ["analyze"], ["verify"], ["convert"], ["fold-bias"], ["qkv", "split"], ["qkv", "fuse"],
                 ["diff"], ["lint"])


def test_every_long_command_has_the_same_progress_switch():
    helps = {}
    for cmd in LONG_COMMANDS:
        res = _run(*cmd, "--help")
        assert res.exit_code == 0, res.output
        flat = " ".join(res.output.split())
        m = re.search(r"--progress / --no-progress (.*?)(?= -[-a-zA-Z]|$)", flat)
        assert m, (cmd, flat)
        helps[" ".join(cmd)] = m.group(1)
    assert len(set(helps.values())) == 1, helps
    assert "only when stderr is a terminal" in next(iter(helps.values()))


def _subprocess(args, *, tty: bool, tmp_path: Path):
    """Run the CLI in a child; stderr is a pseudo-terminal when ``tty`` (stdout stays a pipe)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CKPT_SURGEON_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "ckpt_surgeon", *map(str, args)]
    if not tty:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        return r.returncode, r.stderr
    master, slave = pty.openpty()
    # A real terminal has a size; a fresh pty is 0x0, where tqdm would print empty bars.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.communicate(timeout=300)
    os.close(master)
    return p.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_convert_progress_default_follows_the_terminal_and_the_switch_overrides(tiny, tmp_path):
    src = tiny("qwen2")
    runs = {
        "pipe, default": ([], False, False),
        "terminal, default": ([], True, True),
        "terminal, --no-progress": (["--no-progress"], True, False),
        "pipe, --progress": (["--progress"], False, True),
    }
    for i, (label, (flags, tty, bar)) in enumerate(runs.items()):
        out = tmp_path / f"m{i}.gguf"
        code, err = _subprocess(["convert", src, "-o", out, *flags], tty=tty, tmp_path=tmp_path)
        assert code == 0, (label, err)
        assert out.is_file()
        assert (f"writing {out.name}" in err) is bar, (label, err)


def test_convert_gguf_to_hf_progress_follows_the_terminal_and_the_switch(tiny, tmp_path):
    """The other direction too: GGUF -> HF writes through the checkpoint writer, whose bar follows
    the same rule (a terminal's stderr: on; a pipe: off; the switch overrides either way)."""
    from ckpt_surgeon.conversion import hf_to_gguf
    src = hf_to_gguf(tiny("qwen2"), tmp_path / "m.gguf", dtype="f32")
    runs = {"pipe, default": ([], False, False), "terminal, default": ([], True, True),
            "terminal, --no-progress": (["--no-progress"], True, False), "pipe, --progress": (["--progress"], False, True)}
    for i, (label, (flags, tty, bar)) in enumerate(runs.items()):
        out = tmp_path / f"hf{i}"
        code, err = _subprocess(["convert", src, "-o", out, *flags], tty=tty, tmp_path=tmp_path)
        assert code == 0, (label, err)
        assert (out / "config.json").is_file()
        assert (f"writing {out.name}" in err) is bar, (label, err)


def test_surgery_progress_switch(tiny, tmp_path):
    src = tiny("gpt2")
    code, err = _subprocess(["fold-bias", src, "-o", tmp_path / "a", "--k", "--progress"], tty=False, tmp_path=tmp_path)
    assert code == 0 and "writing a" in err, err
    code, err = _subprocess(["fold-bias", src, "-o", tmp_path / "b", "--k"], tty=False, tmp_path=tmp_path)
    assert code == 0 and "writing b" not in err and "%|" not in err, err


# --- inspect: "-" where nothing of the key bias is removable --------------------------------------

def _table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith(("│", "┃")):
            rows.append([c.strip() for c in re.split(r"[│┃]", line)[1:-1]])
    return rows


@pytest.mark.parametrize("name, klass", [("qwen2_long", "rope"), ("olmo2", "not-removable"), ("gpt2", "exact")])
def test_inspect_table_dash_for_nothing_removable_numbers_in_json(tiny, name, klass):
    src = tiny(name)
    table = _run("inspect", src)
    assert table.exit_code == 0, table.output
    rows = _table_rows(table.stdout)
    head = rows[0]
    body = [dict(zip(head, r)) for r in rows[1:]]
    assert [r["k_class"] for r in body] == [klass, klass]
    data = json.loads(_run("inspect", src, "--format", "json").stdout)
    red = [lr["k_bias_redundancy"] for lr in data["layers"]]
    if klass == "not-removable":      # q/k-norm after the projection
        assert all(r["k_exact"] == r["k_near"] == r["k_bound"] == "-" for r in body), body
        assert all(x["exact_fraction"] == 0.0 and x["near_fraction"] == 0.0 for x in red), red
    elif klass == "rope":
        # rope theta 1e6 over 32768 positions: no pair turns < 0.1 rad, nothing removable:: "-", not "0 / 0 / 0" (which would read as "removing it is free") ...
        assert all(r["k_exact"] == r["k_near"] == r["k_bound"] == "-" for r in body), body
        # ... while the JSON keeps the numbers.
        assert all(x["exact_fraction"] == 0.0 and x["near_fraction"] == 0.0 and x["bound"] == 0.0 for x in red), red
    else:
        # All of a non-rotary key bias is removable at no cost: a true zero bound shows as 0.0.
        assert all(r["k_exact"] == "1" and r["k_bound"] == "0.0" for r in body), body
        assert all(x["exact_fraction"] == 1.0 and x["bound"] == 0.0 for x in red), red


# --- -o/--output: one spelling for what a command writes (issue 24) -------------------------------


def test_output_is_spelled_the_same_everywhere_and_old_spellings_still_work(tiny, tmp_path):
    src = tiny("gpt2")
    for cmd in (["fold-bias"], ["qkv", "split"], ["qkv", "fuse"], ["convert"]):
        flat = " ".join(_run(*cmd, "--help").output.split())
        assert "-o, --output, --out PATH" in flat, (cmd, flat)
    for cmd in (["inspect"], ["analyze"], ["lint"], ["diff"], ["verify"]):
        assert "-o, --output FILE" in " ".join(_run(*cmd, "--help").output.split()), cmd
    for i, spelling in enumerate(("-o", "--output", "--out")):
        out = tmp_path / f"f{i}"
        res = _run("fold-bias", src, spelling, out, "--k")
        assert res.exit_code == 0 and (out / "model.safetensors").is_file(), res.output
    res = _run("convert", src, "--out", tmp_path / "g.gguf")
    assert res.exit_code == 0 and (tmp_path / "g.gguf").is_file(), res.output


def test_convert_summary_is_on_stdout(tiny, tmp_path):
    """`convert ... > log` left the log empty: the summary went to stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(tiny("gpt2")), "-o",
                        str(tmp_path / "g.gguf")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "ckpt-surgeon convert" and "hf->gguf" in r.stdout and r.stderr == ""


# --- issue 36, item 17: options that disagreed ----------------------------------------------------

def test_debug_after_the_command_name_too(tmp_path, monkeypatch):
    """--debug worked only before the subcommand; after it, it was an unknown option."""
    monkeypatch.delenv("CKPT_SURGEON_DEBUG", raising=False)
    missing = tmp_path / "missing"
    from ckpt_surgeon.errors import SourceNotFoundError
    _one_line_exit_2(_run("inspect", missing), "no such file or folder")
    for argv in (["--debug", "inspect", missing], ["inspect", missing, "--debug"],
                 ["qkv", "fuse", missing, "-o", tmp_path / "o", "--debug"]):
        res = _run(*argv)
        assert isinstance(res.exception, SourceNotFoundError), (argv, res.output)   # raised: the traceback


def test_convert_names_a_hub_id_and_says_how(tmp_path):
    _one_line_exit_2(_run("convert", "someone/some-model", "-o", tmp_path / "x.gguf"),
                     "error: someone/some-model: convert reads a local model, and this is a Hub repo id: download it "
                     "first (hf download someone/some-model --local-dir DIR) and convert DIR")
    _one_line_exit_2(_run("convert", tmp_path / "nothing", "-o", tmp_path / "x.gguf"), "no such file or folder")
    assert not list(tmp_path.iterdir())


def test_epsilon_is_one_option_and_format_help_says_what_rows():
    from ckpt_surgeon.cli import cli
    eps = [next(p for p in cli.commands[c].params if p.name == "epsilon") for c in ("analyze", "fold-bias")]
    assert {(type(p.type), p.default, p.metavar, p.show_default) for p in eps} == {(type(eps[0].type), 0.1, "RAD", True)}
    for c in ("lint", "diff", "verify", "inspect", "analyze"):
        fmt = next(p for p in cli.commands[c].params if p.name == "fmt")
        assert "per-layer rows" not in fmt.help, c


# --- issue 36, items 15 / 16: misleading or overlong output -------------------------------------

def test_no_python_none_and_one_post_norm_note(minilm_dir, tiny, tmp_path):
    """Python's None reached tables ("norm placement / input norm  post / None"); MiniLM's post-norm
    note was printed twice (the registry's line and analyze's own)."""
    bare = tmp_path / "bare.safetensors"                     # no config.json beside it: settings unknown
    shutil.copy(tiny("qwen2") / "model.safetensors", bare)
    for argv in (["inspect", minilm_dir], ["analyze", minilm_dir], ["lint", minilm_dir], ["inspect", bare],
                 ["analyze", bare], ["fold-bias", minilm_dir, "--v", "--k", "--dry-run", "-o", tmp_path / "o"]):
        res = _run(*argv)
        assert res.exit_code in (0, 1), (argv, res.output)
        assert not re.search(r"\bNone\b", res.stdout), (argv, res.stdout)
    out = _run("analyze", minilm_dir).stdout
    assert "post / none" in out and sum(line.startswith("note: post-norm") for line in out.splitlines()) == 1


def test_fold_bias_shows_only_the_columns_of_what_it_did(minilm_dir, tmp_path):
    """`fold-bias --v` alone printed k_class none, k_total 0, k_norm 0.0 beside a real key bias."""
    res = _run("fold-bias", minilm_dir, "--v", "--dry-run", "-o", tmp_path / "o")
    assert res.exit_code == 0, res.output
    header = next(line for line in res.stdout.splitlines() if "layer" in line and "v_folded" in line)
    assert "k_class" not in header and "k_norm" not in header and "centered" not in header
    both = _run("fold-bias", minilm_dir, "--v", "--k", "--dry-run", "-o", tmp_path / "o").stdout
    assert "k_class" in both and "exact" in both                          # MiniLM's key bias: exactly redundant


def test_diff_names_the_quantized_types():
    """Two quantized folders: "F32 -> F32" was listed as dtype_changed (the dequantized view)."""
    q = REPO / "fixtures" / "quant"
    res = _run("diff", q / "mlx_4bit", q / "mlx_8bit", "--format", "json")
    rows = [t for t in json.loads(res.stdout)["tensors"] if t["status"] == "dtype_changed"]
    assert rows and all(t["dtype_a"] != t["dtype_b"] for t in rows)
    assert {(t["dtype_a"], t["dtype_b"]) for t in rows} == {("mlx 4-bit g64", "mlx 8-bit g64")}


def test_inspect_folds_layers_that_agree(smollm_gguf):
    """SmolLM2 (30 layers, no biases) gave 30 rows of "-": one row "0–29" in the table; CSV keeps 30."""
    table = _run("inspect", smollm_gguf).stdout
    assert re.search(r"│\s+0–29\s+│", table) and not re.search(r"│\s+17\s+│", table)
    csv_rows = _run("inspect", smollm_gguf, "--format", "csv").stdout.strip().splitlines()
    assert len(csv_rows) == 31
