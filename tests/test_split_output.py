"""``convert --split-max-size / --split-max-tensors``: llama.cpp's split GGUF output (issue 33 item 3).

Against llama.cpp's own ``convert_hf_to_gguf.py`` with the same split options (run from the
llama-cpp-python sdist with its own gguf-py, tests/llamacpp_ref_split.py; outputs cached in the
fixture cache): the same number of parts, the same file names, every part after the first
byte-identical, the first identical from its tensor infos on (its model keys differ only by the
provenance labels tests/test_llamacpp_converter.py exempts).  Then llama.cpp loads the set;
inspect, verify and convert read it back; bad options and existing outputs are refused in one
line with exit 2; a failure leaves no part behind.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import forkserver
import pytest
from click.testing import CliRunner

from llamacpp_src import llamacpp_source

from ckpt_surgeon import tiny_cache
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import convert
from ckpt_surgeon.conversion.split_output import (SplitRequest, parse_split_size, shard_paths, shard_ranges)
from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.formats.write.shard_io import STAGE_OBSERVERS
from fixtures.build_fixtures import fixture_base

_RUNNER = Path(__file__).with_name("llamacpp_ref_split.py")
QUANT = Path(__file__).resolve().parent.parent / "fixtures" / "quant"
# provenance labels llama.cpp's converter derives from the folder name (tests/test_llamacpp_converter.py EXEMPT)
_EXEMPT = {"general.name", "general.basename", "general.finetune", "general.size_label", "general.type"}
# (family, outtype, split options): a dense model cut by size, the same cut by count and size at
# q8_0, a MoE model (stacked experts) cut by count, and a first part holding the metadata only
CASES = [("qwen2", "f16", ("--split-max-size", "20K")),
         ("qwen2", "q8_0", ("--split-max-tensors", "5", "--split-max-size", "30K")),
         ("qwen2_moe", "bf16", ("--split-max-tensors", "4")),
         ("qwen2", "f16", ("--no-tensor-first-split", "--split-max-tensors", "8"))]


def _key(folder: Path, outtype: str, options) -> str:
    h = hashlib.sha256()
    h.update(importlib.metadata.version("llama-cpp-python").encode())
    h.update(_RUNNER.read_bytes())
    h.update(json.dumps([outtype, *options]).encode())
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _reference(folder: Path, outtype: str, options) -> list[Path]:
    """llama.cpp's split set for ``folder`` (``m-0000i-of-0000n.gguf``), cached."""
    # the pre-tokenizer transformers runs (tests/test_llamacpp_converter.py _pre_tokenizer)
    pre = "qwen2" if json.loads((folder / "config.json").read_text())["model_type"] == "qwen2" else "gpt-2"
    def build(tmp: Path) -> None:
        root = llamacpp_source()
        env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
        r = forkserver.run([_RUNNER, root, folder, tmp / "m.gguf", pre, outtype, *options], env=env)
        if r.returncode != 0:
            pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed: {r.stderr.strip()[-1500:]}")

    key = _key(folder, outtype, (pre, *options))
    d = tiny_cache.cached_build(fixture_base() / "llamacpp-ref-split" / f"{folder.name}-{key}", build)
    return sorted(d.glob("m*.gguf"))


def _kvs(path: Path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(path))
    return {k: (f.types[0].name, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _after_kv(path: Path) -> tuple:
    """Tensor infos (name, type, shape, offset within the data) and the data section's bytes."""
    import gguf
    r = gguf.GGUFReader(str(path))
    start = min((t.data_offset for t in r.tensors), default=len(r.data))
    infos = [(t.name, int(t.tensor_type), tuple(int(x) for x in t.shape), int(t.data_offset) - start) for t in r.tensors]
    return infos, bytes(r.data[start:])


def _split_args(options) -> dict:
    flag = "--no-tensor-first-split" in options
    it = iter(o for o in options if o != "--no-tensor-first-split")
    args = dict(zip(it, it))
    return {"split_max_size": args.get("--split-max-size"), "no_tensor_first_split": flag,
            "split_max_tensors": int(args["--split-max-tensors"]) if "--split-max-tensors" in args else None}


@pytest.mark.parametrize("family,outtype,options", CASES, ids=lambda v: "_".join(v) if isinstance(v, tuple) else v)
def test_parts_are_llama_cpp_converters_parts(tiny, tmp_path, family, outtype, options):
    folder = tiny(family)
    ref = _reference(folder, outtype, options)
    rep = convert(folder, tmp_path / "m.gguf", dtype=outtype, name="x", **_split_args(options))
    ours = [Path(f) for f in rep.files]
    assert len(ref) > 2 and [p.name for p in ours] == [p.name for p in ref]        # same count, same names
    assert rep.output == str(ours[0]) and not (tmp_path / "m.gguf").exists()
    for a, b in zip(ours[1:], ref[1:]):
        assert a.read_bytes() == b.read_bytes(), a.name                            # whole files
    # part 1: tensor infos and data identical; keys: llama.cpp's, with the same types and values,
    # except its provenance labels, and the three split keys last in both
    assert _after_kv(ours[0]) == _after_kv(ref[0])
    ko, kr = _kvs(ours[0]), _kvs(ref[0])
    assert {k: v for k, v in kr.items() if k not in _EXEMPT}.items() <= ko.items()
    assert list(ko)[-3:] == list(kr)[-3:] == ["split.no", "split.count", "split.tensors.count"]
    assert ko["split.count"] == ("UINT16", len(ref)) and ko["split.tensors.count"][0] == "INT32"
    # a set we write unsplit holds the same tensors in the same order: splitting moves no byte of a tensor
    whole = convert(folder, tmp_path / "whole.gguf", dtype=outtype, name="x")
    with open_checkpoint(whole.output) as w, open_checkpoint(ours[1]) as s:
        assert list(s.tensors) == list(w.tensors) and s.files == tuple(map(str, ours))
        assert all(s.read_raw(n) == w.read_raw(n) for n in w.tensors)


def _llama_logits(path, toks=(5, 17, 42, 99, 7, 123, 64, 250)):
    import llama_cpp
    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    m.eval(list(toks))
    out = np.array(m.scores[:len(toks)])
    m.close()
    return out


def test_llama_cpp_loads_the_set_with_the_unsplit_files_logits(tiny, tmp_path):
    folder = tiny("qwen2")
    whole = convert(folder, tmp_path / "w.gguf", dtype="f32")
    rep = convert(folder, tmp_path / "s.gguf", dtype="f32", split_max_tensors=7)
    assert len(rep.files) == 4
    # the same tensors from the same bytes: equal exactly
    want = _llama_logits(whole.output)
    assert np.array_equal(_llama_logits(rep.files[0]), want)
    # a first part with the metadata only (--no-tensor-first-split, alone: two parts)
    small = convert(folder, tmp_path / "k.gguf", dtype="f32", no_tensor_first_split=True)
    assert len(small.files) == 2 and np.array_equal(_llama_logits(small.files[0]), want)
    with open_checkpoint(small.files[0]) as ck:
        assert list(ck.tensors) == list(open_checkpoint(whole.output).tensors)


def test_one_pass_k_quant_set_equals_llama_quantize_keep_split(tmp_path):
    """FP8 block-quantized HF -> q4_k_m split in one pass == llama.cpp's converter at f32 split the
    same way, then llama-quantize --keep-split: each part holds the same tensors with the same
    bytes.  (DeepSeek's FP8 format, 256 wide: the mixture uses real k-quants.)"""
    import llama_cpp
    folder = QUANT / "fp8_block_deepseek"
    options = ("--split-max-tensors", "6")
    ref_f32 = _reference(folder, "f32", options)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.keep_split = True
    assert llama_cpp.llama_model_quantize(str(ref_f32[0]).encode(), str(tmp_path / "lq").encode(),
                                          ctypes.byref(params)) == 0
    theirs = [tmp_path / f"lq-{i + 1:05d}-of-{len(ref_f32):05d}.gguf" for i in range(len(ref_f32))]
    rep = convert(folder, tmp_path / "m.gguf", dtype="q4_k_m", split_max_tensors=6, name="x")
    assert len(rep.files) == len(theirs) > 2
    kinds = set()
    for ours, lc in zip(rep.files, theirs):
        with open_checkpoint(ours) as a, open_checkpoint(lc) as b:
            part_a = {n for n, i in a.tensors.items() if i.file == ours}
            part_b = {n for n, i in b.tensors.items() if i.file == str(lc)}
            assert part_a == part_b, ours
            for n in part_a:
                assert (a.tensors[n].dtype, a.read_raw(n)) == (b.tensors[n].dtype, b.read_raw(n)), n
                kinds.add(a.tensors[n].dtype)
    assert {"Q4_K", "Q6_K", "F32"} <= kinds         # k-quants were compared, not only copies


def test_gguf_sources_split_and_are_read_back(tiny, tmp_path):
    """GGUF -> split GGUF (quantize), split GGUF -> GGUF (merge / quantize), split GGUF -> HF:
    each equals the same conversion of the unsplit file; inspect reads the set from any part."""
    folder = tiny("qwen2")
    f32 = convert(folder, tmp_path / "f32.gguf", dtype="f32").output
    q = convert(f32, tmp_path / "q.gguf", dtype="q8_0")
    qs = convert(f32, tmp_path / "qs.gguf", dtype="q8_0", split_max_size="25K")
    assert len(qs.files) > 3
    f32s = convert(folder, tmp_path / "f32s.gguf", dtype="f32", split_max_tensors=9)
    from_set = convert(f32s.files[2], tmp_path / "q-from-set.gguf", dtype="q8_0")
    assert Path(from_set.output).read_bytes() == Path(q.output).read_bytes()      # split keys dropped
    with open_checkpoint(q.output) as w, open_checkpoint(qs.files[-1]) as s:
        assert list(s.tensors) == list(w.tensors)
        assert all(s.read_raw(n) == w.read_raw(n) for n in w.tensors)
    hf_a = convert(f32s.files[1], tmp_path / "hf-a")
    hf_b = convert(f32, tmp_path / "hf-b")
    from safetensors.numpy import load_file
    ta, tb = load_file(Path(hf_a.output) / "model.safetensors"), load_file(Path(hf_b.output) / "model.safetensors")
    assert list(ta) == list(tb) and all(ta[n].tobytes() == tb[n].tobytes() for n in ta)
    ra = CliRunner().invoke(cli, ["inspect", qs.files[1], "--format", "json"])
    rb = CliRunner().invoke(cli, ["inspect", q.output, "--format", "json"])
    assert ra.exit_code == rb.exit_code == 0, ra.output
    da, db = json.loads(ra.stdout), json.loads(rb.stdout)
    for key in ("num_tensors", "parameter_count", "dtypes", "tensor_types", "layers_with_qkv_bias"):
        assert da[key] == db[key], key


def test_quantized_hf_source_splits(tmp_path):
    """A quantized HF folder (FP8 blocks, DeepSeek's format) -> split q8_0 GGUF: the tensors of the
    unsplit conversion."""
    src = QUANT / "fp8_block_deepseek"
    whole = convert(src, tmp_path / "w.gguf", dtype="q8_0", name="x")
    rep = convert(src, tmp_path / "s.gguf", dtype="q8_0", name="x", split_max_size="30K")
    assert len(rep.files) > 2
    with open_checkpoint(whole.output) as w, open_checkpoint(rep.files[0]) as s:
        assert list(s.tensors) == list(w.tensors)
        assert all(s.read_raw(n) == w.read_raw(n) for n in w.tensors)


def test_verify_reads_a_split_set(tiny, tmp_path):
    folder = tiny("qwen2")
    rep = convert(folder, tmp_path / "s.gguf", dtype="f32", split_max_tensors=10)
    res = CliRunner().invoke(cli, ["verify", str(folder), rep.files[1], "--format", "json"])
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------ rules, bad input, atomicity


def test_rules_follow_gguf_py():
    assert [parse_split_size(s) for s in ("123", "5K", "5M", "2G")] == [123, 5000, 5 * 10**6, 2 * 10**9]
    # count and size limits, a tensor larger than the limit alone in its part, never an empty part
    assert shard_ranges([10, 10, 10], SplitRequest(max_tensors=2)) == [(0, 2), (2, 3)]
    assert shard_ranges([5, 50, 5, 5], SplitRequest(max_size=20)) == [(0, 1), (1, 2), (2, 4)]
    assert shard_ranges([10, 10], SplitRequest(max_size=20)) == [(0, 2)]       # = the limit fits
    assert shard_ranges([10, 10], None) == [(0, 2)]
    assert [p.name for p in shard_paths(Path("/x/m.q8.gguf"), 2)] == ["m.q8-00001-of-00002.gguf",
                                                                      "m.q8-00002-of-00002.gguf"]
    assert shard_paths(Path("/x/m.gguf"), 1) == [Path("/x/m.gguf")]


@pytest.mark.parametrize("args,message", [
    (["--split-max-size", "0"], "--split-max-size '0' must be positive"),
    (["--split-max-size", "-5M"], "--split-max-size '-5M' is not a size"),
    (["--split-max-size", "4GB"], "--split-max-size '4GB' is not a size"),
    (["--split-max-size", "1.5G"], "--split-max-size '1.5G' is not a size"),
    (["--split-max-tensors", "0"], "--split-max-tensors 0 must be a positive whole number"),
])
def test_bad_split_options_one_line_exit_2_nothing_written(tiny, tmp_path, args, message):
    out = tmp_path / "out"
    out.mkdir()
    res = CliRunner().invoke(cli, ["convert", str(tiny("qwen2")), "-o", str(out / "m.gguf"), *args])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.output
    assert os.listdir(out) == []


def test_existing_parts_refused_without_force_and_replaced_with_it(tiny, tmp_path):
    folder = tiny("qwen2")
    first = convert(folder, tmp_path / "m.gguf", dtype="f16", split_max_tensors=10)
    before = {f: Path(f).read_bytes() for f in first.files}
    res = CliRunner().invoke(cli, ["convert", str(folder), "-o", str(tmp_path / "m.gguf"), "--split-max-tensors", "5"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "already exists" in res.stderr, res.output
    assert {f: Path(f).read_bytes() for f in first.files} == before
    # --split-max-tensors cannot shard an HF folder output
    res = CliRunner().invoke(cli, ["convert", first.files[0], "-o", str(tmp_path / "hf"), "--split-max-tensors", "5"])
    assert res.exit_code == 2 and "--split-max-tensors splits a GGUF output" in res.stderr
    res = CliRunner().invoke(cli, ["convert", first.files[0], "-o", str(tmp_path / "hf"), "--no-tensor-first-split"])
    assert res.exit_code == 2 and "--no-tensor-first-split splits a GGUF output" in res.stderr
    assert not (tmp_path / "hf").exists()
    again = convert(folder, tmp_path / "m.gguf", dtype="f16", split_max_tensors=10, force=True)
    assert again.files == first.files


def test_a_failure_leaves_no_part_behind(tiny, tmp_path):
    """A failure after two parts are written (here raised at the writer's stage) removes every temp:
    no part, no temp beside them."""
    def fail(stage: str) -> None:
        if stage == "shard-written:1":
            raise OSError(28, "No space left on device")
    out = tmp_path / "out"
    out.mkdir()
    STAGE_OBSERVERS.append(fail)
    try:
        with pytest.raises((OSError, CkptError)):
            convert(tiny("qwen2"), out / "m.gguf", dtype="f16", split_max_tensors=5)
    finally:
        STAGE_OBSERVERS.remove(fail)
    assert os.listdir(out) == []


# ------------------------------------------------------------------ resume after a kill

_PAUSE_AT = Path(__file__).resolve().parent / "pause_at.py"


def _kill_at(stage: str, src: Path, out: Path, *options) -> None:
    """Run ``convert SRC -o OUT OPTIONS`` in a process paused at the writer stage ``stage``, SIGKILL it there."""
    import signal
    import time
    marker = out.parent / "paused"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), CKPT_SURGEON_PAUSE_AT=stage,
               CKPT_SURGEON_PAUSE_FILE=str(marker))
    p = subprocess.Popen([sys.executable, str(_PAUSE_AT), "-m", "ckpt_surgeon", "convert", str(src), "-o", str(out),
                          "--no-progress", *options], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the converter never reached the stage"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    marker.unlink()


def _stages(fn):
    seen: list[str] = []
    STAGE_OBSERVERS.append(seen.append)
    try:
        return fn(), seen
    finally:
        STAGE_OBSERVERS.remove(seen.append)


def test_killed_split_conversion_resumes_at_the_first_unfinished_part(tiny, tmp_path):
    folder = tiny("qwen2")
    (tmp_path / "fresh").mkdir()
    fresh = convert(folder, tmp_path / "fresh" / "m.gguf", dtype="q8_0", split_max_tensors=5)
    out = tmp_path / "out"
    out.mkdir()
    _kill_at("shard-written:2", folder, out / "m.gguf", "--dtype", "q8_0", "--split-max-tensors", "5")
    # killed after part 3 of 6: no part at its final name, the three finished ones kept hidden
    hidden = out / ".m.gguf.ckpt-surgeon-parts"
    assert [p.name for p in out.iterdir()] == [hidden.name]
    assert sorted(p.name for p in hidden.glob("m-*.gguf")) == [f"m-0000{i}-of-00006.gguf" for i in (1, 2, 3)]
    # a part damaged meanwhile is checked (CRC-32 of its bytes) and written again, not reused
    damaged = hidden / "m-00002-of-00006.gguf"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    rep, seen = _stages(lambda: convert(folder, out / "m.gguf", dtype="q8_0", split_max_tensors=5))
    assert [s for s in seen if s.startswith(("shard-reused", "shard-written"))] == \
           ["shard-reused:0", "shard-written:1", "shard-reused:2"] + [f"shard-written:{i}" for i in (3, 4, 5)]
    assert any(w.startswith("resumed: 2 of 6 parts") for w in rep.warnings)
    assert sorted(p.name for p in out.iterdir()) == [Path(f).name for f in fresh.files]      # folder gone
    for a, b in zip(rep.files, fresh.files):
        assert Path(a).read_bytes() == Path(b).read_bytes(), a


def test_finished_parts_of_another_conversion_are_not_reused(tiny, tmp_path):
    folder = tiny("qwen2")
    out = tmp_path / "m.gguf"
    _kill_at("shard-written:1", folder, out, "--dtype", "f16", "--split-max-tensors", "5")
    # same output, another dtype: the header blocks differ, so nothing is reused
    rep, seen = _stages(lambda: convert(folder, out, dtype="q8_0", split_max_tensors=5))
    assert not any(s.startswith("shard-reused") for s in seen) and not any("resumed" in w for w in rep.warnings)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(f).name for f in rep.files)
    with open_checkpoint(rep.files[0]) as ck:
        assert {i.dtype for i in ck.tensors.values()} == {"Q8_0", "F32"}


def test_progress_bar_counts_tensors_bytes_and_parts(capsys):
    """The bar (real tqdm, on stderr) shows bytes with rate and ETA, and tensors done and the part."""
    from types import SimpleNamespace

    from ckpt_surgeon.conversion.split_output import SetBar
    plan = [SimpleNamespace(nbytes=n, ggml_type="F16") for n in (100, 50, 50, 200)]
    wbar = SetBar(True, plan, Path("m.gguf"), 2)
    wbar.update(60)                       # inside the first tensor
    assert wbar._bar.postfix == "tensor 0/4, shard 1/2"
    wbar.update(90)                       # the first two done
    wbar.at_shard(1)
    wbar.update(250)
    assert wbar._bar.postfix == "tensor 4/4, shard 2/2" and wbar._bar.n == wbar._bar.total == 400
    wbar._bar.refresh()
    err = capsys.readouterr().err
    assert "writing m.gguf" in err and "400/400" in err and "tensor 4/4, shard 2/2" in err
    wbar.close()
