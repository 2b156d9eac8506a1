"""Split GGUFs (llama.cpp ``gguf-split``: ``name-00001-of-00003.gguf`` ...) open as one model.

The split sets are written here from the tiny fixtures by :func:`split_gguf`, a splitter on
gguf-py's ``GGUFWriter`` that lays the parts out as ``tools/gguf-split/gguf-split.cpp`` does:
part 1 holds every metadata key of the model followed by ``split.no`` (u16), ``split.count``
(u16) and ``split.tensors.count`` (i32); later parts hold only those three keys; each part holds
a contiguous run of the tensors (file order), its offsets relative to its own data section.
llama.cpp itself (llama-cpp-python; it ships no gguf-split binary) loads these sets with logits
equal to the unsplit file's, and its quantizer with ``keep_split`` writes split sets with the
same key layout, which our reader opens too (:func:`test_llama_cpp_loads_our_split_and_writes_one_we_read`).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.analysis.inspect import inspect
from ckpt_surgeon.analysis.redundancy import analyze
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import (
    FormatError,
    HubError,
    SourceNotFoundError,
    TruncatedError,
    UnsupportedError,
)
from ckpt_surgeon.formats import gguf as gg
from ckpt_surgeon.formats.hub import ranges as hubmod
from tests.gguf_util import write_gguf
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubenv import hub  # noqa: E402,F401  (the local Hub fixture; conftest's env gives it a clean environment)


def split_gguf(src, prefix, n_parts: int, *, kv: dict | None = None, extra: dict | None = None) -> list[Path]:
    """Split the GGUF ``src`` into ``n_parts`` files ``{prefix}-0000i-of-0000n.gguf`` as gguf-split does.

    The source is read with gguf-py's ``GGUFReader`` (not our parser) and every key keeps its
    type.  Test hooks: ``kv={part: {key: (value, GGUFValueType) or None}}`` sets (or, None,
    deletes) keys of a part after the split keys are added; ``extra={part: [tensor, ...]}``
    also writes those tensors into that part (duplicates).
    """
    import gguf
    from gguf import GGUFValueType as T

    r = gguf.GGUFReader(str(src))
    fields = [(k, f) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    tensors = list(r.tensors)
    by_name = {t.name: t for t in tensors}
    per = -(-len(tensors) // n_parts)
    arch = r.fields["general.architecture"].contents()
    paths = []
    for i in range(n_parts):
        path = Path(f"{prefix}-{i + 1:05d}-of-{n_parts:05d}.gguf")
        w = gguf.GGUFWriter(str(path), arch)
        w.kv_data[0].clear()          # gguf-split starts every part empty (gguf_init_empty) ...
        if i == 0:                    # ... and copies the model's keys into part 1 only (gguf_set_kv)
            for key, f in fields:
                main = T(f.types[0])
                w.add_key_value(key, f.contents(), main, sub_type=T(f.types[1]) if main == T.ARRAY else None)
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", n_parts)
        w.add_int32("split.tensors.count", len(tensors))
        for key, val in (kv or {}).get(i, {}).items():
            if val is None:
                w.kv_data[0].pop(key)
            else:
                w.add_key_value(key, val[0], val[1])
        for t in tensors[i * per:(i + 1) * per] + [by_name[n] for n in (extra or {}).get(i, [])]:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=gguf.GGMLQuantizationType(t.tensor_type))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def qwen_sets(tiny, tmp_path_factory):
    """qtype -> (unsplit file, [3 parts]) for the tiny qwen2 (q/k/v biases), F32 and Q8_0."""
    out = {}
    for qtype in ("F32", "Q8_0"):
        d = tmp_path_factory.mktemp(f"split-{qtype}")
        (d / "whole").mkdir()
        (d / "set").mkdir()
        src = write_gguf(tiny("qwen2"), d / "whole" / "qwen2.gguf", qtype=qtype)
        out[qtype] = (src, split_gguf(src, d / "set" / "qwen2", 3))
    return out


def _set_copy(qwen_sets, tmp_path, qtype="F32", **kw) -> list[Path]:
    """A fresh split set in ``tmp_path`` (for tests that damage it)."""
    src, _ = qwen_sets[qtype]
    return split_gguf(src, tmp_path / "q", 3, **kw)


def _bits(a: np.ndarray) -> tuple:
    return a.dtype.str, a.shape, a.tobytes()


# ------------------------------------------------------------------ the set reads like the file


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("part", [0, 1, 2])
def test_any_part_opens_the_whole_set_bit_for_bit(qwen_sets, qtype, part):
    src, parts = qwen_sets[qtype]
    with open_checkpoint(src) as whole, open_checkpoint(parts[part]) as ck:
        assert ck.format == "gguf" and ck.source == str(parts[part])
        assert ck.files == tuple(str(p) for p in parts)
        assert [(n, i.dtype, i.shape) for n, i in ck.tensors.items()] == \
               [(n, i.dtype, i.shape) for n, i in whole.tensors.items()]
        # every tensor is read from its own part: the three parts each hold some
        assert {ck.tensors[n].file for n in ck.tensors} == set(ck.files)
        for name in whole.tensors:
            assert _bits(ck.read(name)) == _bits(whole.read(name)), name
            assert ck.read_raw(name) == whole.read_raw(name), name
        assert ck.config == whole.config and ck.gguf_arch == whole.gguf_arch == "qwen2"
        assert ck.config_path == str(parts[0])                    # the model metadata is part 1's
        assert {k: v for k, v in ck.metadata.items() if not k.startswith("split.")} == dict(whole.metadata)
        assert ck.missing_bytes == 0 and ck.warnings == []
        # headers of all three parts were parsed, plus exactly the tensor bytes read
        header_bytes = sum(gg.read_header(p).header_end for p in parts)
        assert ck.bytes_read == header_bytes + 2 * sum(i.nbytes for i in ck.tensors.values())


def test_open_gguf_returns_a_split_reader_with_the_file_reader_interface(qwen_sets):
    src, parts = qwen_sets["Q8_0"]
    with gg.open_gguf(parts[2]) as s, gg.open_gguf(src) as g:
        assert isinstance(s, gg.SplitGGUF) and isinstance(g, gg.GGUFFile)
        assert s.paths == tuple(str(p) for p in parts) and g.paths == (str(src),)
        assert s.header.path == str(parts[0]) and s.architecture == "qwen2"
        assert [len(h.tensors) for h in s.headers] == [9, 9, 9]
        name = "blk.1.attn_q.weight"
        assert _bits(s.read(s.tensors[name], threads=2)) == _bits(g.read(g.tensors[name]))
        assert s.read_torch(s.tensors[name]).numpy().tobytes() == g.read(g.tensors[name]).tobytes()


def test_inspect_and_analyze_equal_the_unsplit_file(qwen_sets):
    src, parts = qwen_sets["Q8_0"]
    a, b = inspect(str(parts[1])).to_dict(), inspect(str(src)).to_dict()
    fa, fb = a.pop("file_metadata"), b.pop("file_metadata")
    for d in (a, b):
        for k in ("source", "bytes_read"):
            d.pop(k)
    assert a == b and a["layers_with_qkv_bias"] == 2 and a["num_tensors"] == 27
    assert fa.pop("split_count") == 3
    assert fa.pop("split_files") == [p.name for p in parts]
    assert fa.pop("kv_count") == fb.pop("kv_count") + 3          # part 1 adds the three split keys
    assert fa == fb and fa["tensor_count"] == 27                  # counted over all parts
    ra, rb = analyze(str(parts[0])).to_dict(), analyze(str(src)).to_dict()
    for d in (ra, rb):
        for k in ("source", "bytes_read"):
            d.pop(k)
    assert ra == rb


def test_cli_inspect_of_part_two_in_json(qwen_sets):
    src, parts = qwen_sets["F32"]
    res = CliRunner().invoke(cli, ["inspect", str(parts[1]), "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["file_metadata"]["split_files"] == [p.name for p in parts]
    assert rep["tensor_types"] == inspect(str(src)).tensor_types


def test_folder_with_one_split_set_opens_it_and_two_models_are_listed(qwen_sets, tmp_path):
    src, parts = qwen_sets["F32"]
    folder = tmp_path / "m"
    folder.mkdir()
    for p in parts:
        shutil.copy(p, folder / p.name)
    with open_checkpoint(folder) as ck:
        assert ck.source == str(folder / parts[0].name)
        assert len(ck.files) == 3 and len(ck.tensors) == 27
    shutil.copy(src, folder / "other.gguf")
    with pytest.raises(SourceNotFoundError) as ei:
        open_checkpoint(folder)
    assert str(ei.value) == (f"{folder}: folder holds 2 GGUF models (other.gguf, qwen2-00001-of-00003.gguf (+2 parts)); "
                             "pass one of them (any part of a split GGUF opens all its parts)")


def test_convert_to_hf_from_the_split_set_equals_the_unsplit_file(qwen_sets, tmp_path):
    from safetensors.numpy import load_file

    from ckpt_surgeon.conversion import gguf_to_hf

    src, parts = qwen_sets["Q8_0"]
    a = gguf_to_hf(parts[1], tmp_path / "from-split")
    b = gguf_to_hf(src, tmp_path / "from-file")
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert list(ta) == list(tb) and len(ta) > 20
    for name in tb:
        assert _bits(ta[name]) == _bits(tb[name]), name
    for side in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / side).read_bytes() == (b / side).read_bytes(), side


# ------------------------------------------------------------------ llama.cpp agrees


def _llama_logits(path, toks=(5, 17, 42, 99, 7, 123, 64, 250)):
    import llama_cpp
    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    m.eval(list(toks))
    out = np.array(m.scores[:len(toks)])
    m.close()
    return out


def test_llama_cpp_loads_our_split_and_writes_one_we_read(qwen_sets, tmp_path):
    import gguf
    import llama_cpp

    src, parts = qwen_sets["F32"]
    # llama.cpp loads the set from part 1 (it refuses any other part) with the unsplit file's logits:
    # the same tensors from the same bytes, so equal exactly.
    assert np.array_equal(_llama_logits(parts[0]), _llama_logits(src))
    # ... and it really reads every part: without part 3 it refuses to load.
    lone = tmp_path / "lone"
    lone.mkdir()
    for p in parts[:2]:
        shutil.copy(p, lone / p.name)
    with pytest.raises(ValueError):
        _llama_logits(lone / parts[0].name)

    # llama.cpp's own split writer: its quantizer with keep_split re-splits our set like the input.
    def quantize(inp, out, keep_split):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.keep_split = keep_split
        assert llama_cpp.llama_model_quantize(str(inp).encode(), str(out).encode(), ctypes.byref(params)) == 0

    quantize(parts[0], tmp_path / "lq", True)                   # writes lq-0000i-of-00003.gguf
    quantize(src, tmp_path / "lq-whole.gguf", False)
    theirs = [tmp_path / f"lq-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    # the key layout of llama.cpp's parts is the one our splitter writes
    for i, (ours, lc) in enumerate(zip(parts, theirs)):
        ko, kl = gguf.GGUFReader(str(ours)).fields, gguf.GGUFReader(str(lc)).fields
        for key, t in (("split.no", "UINT16"), ("split.count", "UINT16"), ("split.tensors.count", "INT32")):
            assert kl[key].types[0].name == ko[key].types[0].name == t
        if i:
            assert [k for k in kl if not k.startswith("GGUF.")] == [k for k in ko if not k.startswith("GGUF.")] == \
                   ["split.no", "split.count", "split.tensors.count"]
    with open_checkpoint(theirs[1]) as ck, open_checkpoint(tmp_path / "lq-whole.gguf") as whole:
        assert ck.files == tuple(str(p) for p in theirs)
        assert sorted(ck.tensors) == sorted(whole.tensors)
        for name in whole.tensors:
            assert ck.tensors[name].dtype == whole.tensors[name].dtype
            assert ck.read_raw(name) == whole.read_raw(name), name


# ------------------------------------------------------------------ bad sets: one line, exit 2

def _bad_cases():
    """case -> (split_gguf keywords, damage, part opened, expected message)."""
    from gguf import GGUFValueType as T
    return {
        "missing part": ({}, "missing", 0,
                         "{p1}: split part missing (expected beside q-00001-of-00003.gguf)"),
        "wrong split.count": ({"kv": {1: {"split.count": (2, T.UINT16)}}}, None, 0,
                              ("{p1}: split.count is 2, but the part names say 3 parts (-of-00003): the parts come "
                               "from different splits")),
        "duplicate tensor": ({"extra": {2: ["token_embd.weight"]}}, None, 1,
                             ("{p2}: tensor 'token_embd.weight': is also in q-00001-of-00003.gguf: a tensor may be "
                              "in one part only")),
        "wrong total": ({"kv": {i: {"split.tensors.count": (26, T.INT32)} for i in range(3)}}, None, 2,
                        "{p0}: split.tensors.count is 26, but the 3 parts hold 27 tensors"),
        "totals disagree": ({"kv": {1: {"split.tensors.count": (26, T.INT32)}}}, None, 0,
                            ("{p1}: split.tensors.count is 26, but part 1 (q-00001-of-00003.gguf) says 27: the parts "
                             "come from different splits")),
        "wrong split.no": ({"kv": {2: {"split.no": (1, T.UINT16)}}}, None, 0,
                           "{p2}: split.no is 1 (part 2), but its name says part 3 of 3"),
        "other architecture": ({"kv": {1: {"general.architecture": ("llama", T.STRING)}}}, None, 0,
                               "{p1}: general.architecture is 'llama', but part 1 (q-00001-of-00003.gguf) says 'qwen2'"),
        "no split keys": ({"kv": {2: {"split.count": None, "split.no": None}}}, None, 0,
                          ("{p2}: has no split keys (split.count > 1): it is not part 3 of the 3-part split GGUF "
                           "q-00001-of-00003.gguf belongs to")),
        "no split.no": ({"kv": {1: {"split.no": None}}}, None, 0,
                        "{p1}: split.count is 3 but the split.no key is missing (every part of a split GGUF has it)"),
        "string split.count": ({"kv": {0: {"split.count": ("3", T.STRING)}}}, None, 0,
                               ("{p0}: metadata key 'split.count' must be an integer (gguf-split writes UINT16), "
                                "not STRING")),
        "renamed part": ({}, "renamed", 0,
                         ("{renamed}: is part 1 of a 3-part split GGUF (split.no 0, split.count 3), but its name does "
                          "not end in '-00001-of-00003.gguf', so the other parts cannot be found (keep the file names "
                          "llama-gguf-split gave the parts)")),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_split_sets_give_one_line_and_exit_2(qwen_sets, tmp_path, case):
    kw, damage, opened, expected = _bad_cases()[case]
    parts = _set_copy(qwen_sets, tmp_path, **kw)
    target = parts[opened]
    if damage == "missing":
        parts[1].unlink()
    elif damage == "renamed":
        target = tmp_path / "q-first.gguf"
        os.rename(parts[0], target)
    msg = expected.format(p0=parts[0], p1=parts[1], p2=parts[2], renamed=target)
    with pytest.raises((FormatError, SourceNotFoundError)) as ei:
        open_checkpoint(target)
    assert str(ei.value) == msg
    res = CliRunner().invoke(cli, ["inspect", str(target)])
    assert res.exit_code == 2 and res.stderr == f"error: {msg}\n" and res.stdout == ""


def test_missing_part_exit_code_from_a_real_process(qwen_sets, tmp_path):
    parts = _set_copy(qwen_sets, tmp_path)
    parts[2].unlink()
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", str(parts[0])], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: {parts[2]}: split part missing (expected beside q-00001-of-00003.gguf)\n"


def test_truncated_part_opens_and_names_what_is_missing(qwen_sets, tmp_path):
    parts = _set_copy(qwen_sets, tmp_path)
    with open_checkpoint(parts[0]) as ck:
        victim = ck.tensors["blk.1.attn_v.bias"]
        promised = max(i.end for i in ck.tensors.values() if i.file == victim.file)   # end of that part's data
    cut_file = Path(victim.file)
    with open(cut_file, "r+b") as f:                   # cut inside the bias: it and all after it are gone
        f.truncate(victim.start + 8)
    with open_checkpoint(parts[1]) as ck:
        gone = [n for n, i in ck.tensors.items() if i.missing]
        assert "blk.1.attn_v.bias" in gone and all(ck.tensors[n].file == str(cut_file) for n in gone)
        assert ck.missing_bytes == promised - (victim.start + 8)
        assert len(ck.warnings) == 1 and ck.warnings[0].startswith(f"{cut_file.name}: file is truncated: ")
        with pytest.raises(TruncatedError) as ei:
            ck.read("blk.1.attn_v.bias")
        assert ei.value.path == str(cut_file) and ei.value.tensor == "blk.1.attn_v.bias"
        assert ck.read("token_embd.weight").shape == ck.tensors["token_embd.weight"].shape   # other parts read fine
    res = CliRunner().invoke(cli, ["inspect", str(parts[0])])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {parts[0]}: file is truncated: ")
    assert "blk.1.attn_v.bias" in res.stderr and res.stderr.count("\n") == 1


# ------------------------------------------------------------------ writers


def test_fold_bias_gguf_to_gguf_from_a_split_source_is_refused_and_writes_nothing(tiny, tmp_path):
    src = write_gguf(tiny("gpt2"), tmp_path / "g.gguf", qtype="F32")
    (tmp_path / "set").mkdir()
    parts = split_gguf(src, tmp_path / "set" / "g", 2)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "set"))
    out = tmp_path / "folded.gguf"
    res = CliRunner().invoke(cli, ["fold-bias", str(parts[0]), "-o", str(out), "--k", "--v"])
    assert res.exit_code == 2, res.output
    assert res.stderr == (f"error: {parts[0]}: is a split GGUF (2 parts); split GGUF sources cannot be written as GGUF "
                          "yet: convert to safetensors first (ckpt-surgeon convert) or merge the parts with "
                          "llama-gguf-split --merge\n")
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "set"))) == before
    from ckpt_surgeon.formats.write.writer import open_writer
    with open_checkpoint(parts[1]) as ck, pytest.raises(UnsupportedError):
        open_writer(out, ck)
    # the same file unsplit is written (the refusal is about the split source only)
    assert CliRunner().invoke(cli, ["fold-bias", str(src), "-o", str(out), "--k", "--v"]).exit_code == 0


# ------------------------------------------------------------------ names


def test_split_names_follow_llama_split_path():
    assert gg.split_part_name("m/Qwen-q4", 1, 3) == "m/Qwen-q4-00002-of-00003.gguf"
    assert gg.parse_split_name("Qwen-q4-00002-of-00003.gguf") == ("Qwen-q4", 1, 3)
    for name in ("Qwen-q4-00004-of-00003.gguf", "Qwen-q4-00000-of-00003.gguf", "q-0002-of-0003.gguf",
                 "q-00001-of-00003.safetensors", "-00001-of-00002.gguf"):
        assert gg.parse_split_name(name) is None, name
    groups = gg.group_gguf_names(["b-00002-of-00002.gguf", "a.gguf", "b-00001-of-00002.gguf", "c-00001-of-00001.gguf",
                                  "b-00001-of-00003.gguf"])
    assert groups == [("a.gguf",), ("b-00001-of-00002.gguf", "b-00002-of-00002.gguf"), ("b-00001-of-00003.gguf",),
                      ("c-00001-of-00001.gguf",)]
    assert gg.describe_gguf_groups(groups, limit=2) == "a.gguf, b-00001-of-00002.gguf (+1 part) ..."


# ------------------------------------------------------------------ Hub repos


def test_hub_split_repo_reads_headers_and_biases_by_range_only(hub, qwen_sets, monkeypatch):  # noqa: F811
    src, parts = qwen_sets["F32"]
    # ranges scaled to the tiny files: part 1's header (with the vocabulary) is ~10 KB, the
    # later parts' (three keys and nine tensor infos) ~600 bytes
    monkeypatch.setattr(hubmod, "GGUF_FIRST_RANGE", 16384)
    monkeypatch.setattr(hubmod, "GGUF_PART_FIRST_RANGE", 4096)
    hub.add_repo("owner/split", {**{p.name: p for p in parts}, "README.md": b"# split"})
    rep = inspect("owner/split")
    local = inspect(str(parts[0]))
    a, b = rep.to_dict(), local.to_dict()
    fa, fb = a.pop("file_metadata"), b.pop("file_metadata")
    for d in (a, b):
        for k in ("source", "format", "bytes_read", "requests"):
            d.pop(k)
    assert a == b and rep.format == "hub-gguf" and rep.layers_with_qkv_bias == 2
    assert {k: fa[k] for k in fb} == fb and fa["hub_repo"] == "owner/split"
    with open_checkpoint(src) as ck:
        bias_bytes = sum(i.nbytes for n, i in ck.tensors.items() if n.endswith(".bias"))
    api = sum(r.sent for r in hub.log if r.path.startswith("/api/models/"))
    total = sum(p.stat().st_size for p in parts)
    # one header range per part + the bias vectors, nothing else
    assert rep.bytes_read - api <= 16384 + 2 * 4096 + bias_bytes
    assert rep.bytes_read < 0.06 * total
    cdn = [r for r in hub.log if r.path.startswith("/cdn/")]
    assert all(r.range and r.status == 206 for r in cdn)          # never a whole part
    assert {r.path.split("?")[0].rsplit("/", 1)[-1] for r in cdn} == {p.name for p in parts}
    # cached: a second inspect only resolves the branch
    hub.reset_stats()
    assert inspect("owner/split").requests == 1 == hub.repo_requests


def test_hub_file_option_naming_any_part_selects_the_set_and_reads_like_local(hub, qwen_sets):  # noqa: F811
    src, parts = qwen_sets["Q8_0"]
    f32 = qwen_sets["F32"][1]
    files = {f"q8/{p.name}": p for p in parts} | {p.name.replace("qwen2", "qwen2-f32"): p for p in f32}
    files["other.gguf"] = src
    hub.add_repo("owner/multi", files)
    with pytest.raises(HubError) as ei:
        open_checkpoint("owner/multi")
    assert str(ei.value) == ("owner/multi@main: repository holds 2 GGUF models (other.gguf, qwen2-f32-00001-of-00003.gguf "
                             "(+2 parts)) (pick one with --file; any part of a split GGUF selects all its parts)")
    with open_checkpoint("owner/multi", file=f"q8/{parts[2].name}") as ck, open_checkpoint(src) as whole:
        assert ck.files == tuple(f"owner/multi/q8/{p.name}" for p in parts)
        assert list(ck.tensors) == list(whole.tensors)
        ck.prefetch(list(ck.tensors))                             # one parallel batch over the three parts
        for name in whole.tensors:
            assert _bits(ck.read(name)) == _bits(whole.read(name)), name
    res = CliRunner().invoke(cli, ["inspect", "owner/multi", "--file", f"q8/{parts[1].name}", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["file_metadata"]["split_files"] == [p.name for p in parts]


def test_hub_split_part_missing_in_the_repo(hub, qwen_sets):  # noqa: F811
    _, parts = qwen_sets["F32"]
    hub.add_repo("owner/gap", {parts[0].name: parts[0], parts[2].name: parts[2]})
    with pytest.raises(HubError) as ei:
        open_checkpoint("owner/gap")
    assert str(ei.value) == (f"owner/gap/{parts[1].name}: split part missing at revision 'main' (expected beside "
                             f"{parts[0].name})")
    res = CliRunner().invoke(cli, ["inspect", "owner/gap"])
    assert res.exit_code == 2 and res.stderr == f"error: {ei.value}\n"

