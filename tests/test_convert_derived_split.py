"""Split output on the derived path (issue 33 items 3 and 4 for architectures outside the registry):
``convert --split-max-size / --split-max-tensors`` on a folder llama.cpp's own class converts.

The plan is the class's (ckpt_surgeon/conversion/derived/child.py), the parts are cut and written by
the native path's splitter (conversion/split_output.py via derived/split_write.py).  Checked against
llama.cpp's ``convert_hf_to_gguf.py`` with the same split options on the same tiny folder
(tests/llamacpp_ref_split.py, cached by tests/test_split_output.py ``_reference``): the same part
names, and every part byte-identical, the first one included (both name the model after the folder).
A killed run resumes at its first unfinished part, as on the native path.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from derived_util import converter_src  # noqa: F401 -- the module's autouse fixture
from test_convert_derived import folder  # noqa: F401 -- fixture
from test_split_output import _reference, _split_args

from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import convert

# (zoo model type, outtype, split options): by count with a metadata-only first part, and by size at q8_0
# (Q8_0 blocks: sizes as written)
CASES = [("olmo", "f16", ("--no-tensor-first-split", "--split-max-tensors", "5")),
         ("smollm3", "q8_0", ("--split-max-size", "20K"))]


@pytest.mark.parametrize("model_type,outtype,options", CASES, ids=lambda v: "_".join(v) if isinstance(v, tuple) else v)
def test_derived_split_set_is_llama_cpp_converters(model_type, outtype, options, folder, tmp_path):  # noqa: F811
    src = folder(model_type)
    ref = _reference(src, outtype, options)
    rep = convert(src, tmp_path / "m.gguf", outtype, **_split_args(options))
    assert rep.engine.startswith("derived: llama.cpp "), rep.engine
    ours = [Path(f) for f in rep.files]
    assert len(ref) > 2 and [p.name for p in ours] == [p.name for p in ref]
    assert rep.output == str(ours[0]) and not (tmp_path / "m.gguf").exists()
    assert rep.bytes_written == sum(p.stat().st_size for p in ours)
    for a, b in zip(ours, ref):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_derived_split_refuses_existing_parts_one_line(folder, tmp_path):  # noqa: F811
    src = folder("olmo")
    first = convert(src, tmp_path / "m.gguf", "f16", split_max_tensors=8)
    before = {f: Path(f).read_bytes() for f in first.files}
    res = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "m.gguf"), "--split-max-tensors", "6"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "already exists" in res.stderr, res.output
    assert {f: Path(f).read_bytes() for f in first.files} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(f).name for f in first.files)


_SITE = '''import os, time
if os.environ.get("CKPT_SURGEON_PAUSE_AT"):
    from ckpt_surgeon.formats.write.shard_io import STAGE_OBSERVERS

    def _pause(name):
        if name == os.environ["CKPT_SURGEON_PAUSE_AT"]:
            with open(os.environ["CKPT_SURGEON_PAUSE_FILE"], "w") as f:
                f.write(f"{os.getpid()} {name}\\n")
            time.sleep(3600)
    STAGE_OBSERVERS.append(_pause)
'''


def _kill_derived_at(stage: str, src: Path, out: Path, *options) -> None:
    """Run ``convert`` on a derived folder; its writer (the child process llama.cpp's class runs in)
    pauses at ``stage`` (a ``sitecustomize`` both processes import registers the pause); SIGKILL the
    ``convert`` process there -- the child ends with it (PR_SET_PDEATHSIG)."""
    site = out.parent.parent / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE)
    marker = out.parent.parent / "paused"
    repo = Path(__file__).resolve().parent.parent
    # TMPDIR: the killed converter's scratch folder (it cannot remove it) stays under the test's folder, not in /tmp
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(site), str(repo))), CKPT_SURGEON_PAUSE_AT=stage,
               CKPT_SURGEON_PAUSE_FILE=str(marker), TMPDIR=str(out.parent.parent))
    p = subprocess.Popen([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(out), "--no-progress",
                          *options], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the converter never reached the stage"
        time.sleep(0.05)
    child = int(marker.read_text().split()[0])
    assert child != p.pid                      # the writer runs in the child
    p.send_signal(signal.SIGKILL)
    p.wait()
    while time.time() < deadline:              # the child follows its parent
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the converter's child outlived it")


def test_killed_derived_split_resumes_at_the_first_unfinished_part(folder, tmp_path):  # noqa: F811
    src = folder("olmo")
    (tmp_path / "fresh").mkdir()
    fresh = convert(src, tmp_path / "fresh" / "m.gguf", "q8_0", split_max_tensors=5)
    n = len(fresh.files)
    assert n >= 4
    out = tmp_path / "out"
    out.mkdir()
    _kill_derived_at("shard-written:1", src, out / "m.gguf", "--dtype", "q8_0", "--split-max-tensors", "5")
    hidden = out / ".m.gguf.ckpt-surgeon-parts"
    assert [p.name for p in out.iterdir()] == [hidden.name]
    assert sorted(p.name for p in hidden.glob("m-*.gguf")) == [f"m-0000{i}-of-0000{n}.gguf" for i in (1, 2)]
    # the stages run in the child: the rerun's reuse shows in its warning and in the parts' inode numbers
    kept = {p.name: p.stat().st_ino for p in hidden.glob("m-*.gguf")}
    rep = convert(src, out / "m.gguf", "q8_0", split_max_tensors=5)
    assert any(w.startswith(f"resumed: 2 of {n} parts") for w in rep.warnings), rep.warnings
    assert sorted(p.name for p in out.iterdir()) == [Path(f).name for f in fresh.files]      # folder gone
    assert {name: (out / name).stat().st_ino for name in kept} == kept                     # renamed, not rewritten
    for a, b in zip(rep.files, fresh.files):
        assert Path(a).read_bytes() == Path(b).read_bytes(), a
