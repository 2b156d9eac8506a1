"""Human tables written to a pipe or a file (issue 24): no cell is ever cut, COLUMNS is honoured,
no line ends in padding.  Real subprocesses with stdout a pipe, as `ckpt-surgeon X > out.txt`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _cli(*args, columns: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "ckpt_surgeon", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def long_names(tiny, tmp_path_factory):
    """A GPT-2 folder (long tensor names) under a deep path, its copy with one tensor changed, and
    a q/k/v-fused Qwen2 whose lint finding names a file and a tensor."""
    from safetensors.numpy import load_file, save_file

    from ckpt_surgeon.surgery.qkv import qkv_fuse
    root = tmp_path_factory.mktemp("a-rather-long-folder-name-for-the-file-column") / "and-a-nested-model-folder"
    a = root / "gpt2-original-checkpoint"
    b = root / "gpt2-changed-checkpoint"
    shutil.copytree(tiny("gpt2"), a)
    shutil.copytree(tiny("gpt2"), b)
    st = load_file(str(b / "model.safetensors"))
    st["transformer.h.1.attn.c_attn.weight"] = st["transformer.h.1.attn.c_attn.weight"] * 2
    save_file(st, str(b / "model.safetensors"), metadata={"format": "pt"})
    fused = root / "qwen2-with-a-fused-qkv-projection"
    qkv_fuse(tiny("qwen2"), fused)
    return a, b, fused


def _names_whole(text: str, names) -> None:
    for n in names:
        assert n in text, (n, text[-2000:])
    assert "…" not in text
    assert all(line == line.rstrip() for line in text.splitlines()), "a line ends in padding"


def test_piped_tables_keep_every_name_whole(long_names):
    a, b, fused = long_names
    lint = _cli("lint", fused)
    assert lint.returncode == 1, lint.stderr
    with __import__("ckpt_surgeon").checkpoint.open_checkpoint(fused) as ck:
        files = sorted({i.file for i in ck.tensors.values()})
    _names_whole(lint.stdout, ["model.layers.0.self_attn.qkv_proj.bias", str(fused / "config.json"), *files])
    diff = _cli("diff", a, b)
    assert diff.returncode == 1, diff.stderr
    _names_whole(diff.stdout, ["transformer.h.1.attn.c_attn.weight", str(a), str(b)])
    for cmd in (["inspect", a], ["analyze", a]):
        res = _cli(*cmd)
        assert res.returncode == 0, res.stderr
        _names_whole(res.stdout, [str(a)])
    fold = _cli("fold-bias", a, "-o", a.parent / "folded", "--k", "--v", "--dry-run")
    assert fold.returncode == 0, fold.stderr
    _names_whole(fold.stdout, [str(a)])
    conv = _cli("convert", a, "-o", a.parent / "gpt2-as-a-gguf-file-with-a-long-name.gguf")
    assert conv.returncode == 0, conv.stderr
    _names_whole(conv.stdout, [str(a.parent / "gpt2-as-a-gguf-file-with-a-long-name.gguf")])


def test_columns_is_honoured_and_cells_wrap(long_names):
    _, _, fused = long_names
    res = _cli("lint", fused, columns="80")
    assert res.returncode == 1, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "…" not in res.stdout and all(line == line.rstrip() for line in lines)
    wide = _cli("lint", fused)
    assert max(len(line) for line in wide.stdout.splitlines()) > 80      # without COLUMNS: the content's width
    # the JSON says the same as the table, whatever the width
    js = json.loads(_cli("lint", fused, "--format", "json", columns="40").stdout)
    assert any(f["tensor"] == "model.layers.0.self_attn.qkv_proj.bias" for f in js["findings"])


def test_bracketed_text_is_shown_not_taken_for_markup(tiny):
    """The architecture line's "[registry: qwen2]" tag (and any bracketed text in a cell or note) is
    data: rich's markup parser used to swallow it, so no table ever showed where the facts came from."""
    r = _cli("inspect", tiny("qwen2"))
    assert r.returncode == 0, r.stderr
    assert "[registry: qwen2]" in r.stdout, r.stdout
    from ckpt_surgeon.cli.render import to_table
    text = to_table([{"tensor": "w[0]", "note": "[bold]x"}], summary=[("k", "v [not in registry]")], notes=["n [y]"])
    for s in ("w[0]", "[bold]x", "v [not in registry]", "note: n [y]"):
        assert s in text, text
