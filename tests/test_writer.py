"""The streaming atomic writer: byte identity, metadata, sharding, atomicity under SIGKILL, errors."""
from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.errors import CkptError, OutputExistsError, WriteError
from ckpt_surgeon.formats import safetensors as st
from ckpt_surgeon.formats.write.writer import CheckpointWriter

REPO = Path(__file__).resolve().parent.parent
PAUSE_AT = Path(__file__).resolve().parent / "pause_at.py"


def tree_digest(path: Path) -> dict:
    """sha256 of every file under path (the source must be untouched by any run)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def make_sharded(tmp: Path, *, mb: int = 2, dtype=np.float32) -> Path:
    """A two-shard safetensors folder written by the safetensors library itself (independent of ours)."""
    d = tmp / "src"
    d.mkdir()
    rng = np.random.default_rng(0)
    n = mb * (1 << 20) // 4 // 2
    s1 = {"a.weight": rng.standard_normal((n // 64, 64)).astype(dtype), "a.bias": rng.standard_normal(64).astype(dtype)}
    s2 = {"b.weight": rng.standard_normal((n // 64, 64)).astype(dtype), "b.bias": rng.standard_normal(64).astype(dtype),
          "c.bias": rng.standard_normal(7).astype(dtype)}
    save_file(s1, str(d / "model-00001-of-00002.safetensors"), metadata={"format": "pt", "origin": "test"})
    save_file(s2, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    wm = {k: "model-00001-of-00002.safetensors" for k in s1} | {k: "model-00002-of-00002.safetensors" for k in s2}
    total = sum(v.nbytes for v in s1.values()) + sum(v.nbytes for v in s2.values())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    (d / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 64}))
    (d / "tokenizer.json").write_text("{}")
    (d / "sub").mkdir()
    (d / "sub" / "extra.txt").write_text("side file in a sub-folder")
    (d / "pytorch_model.bin").write_bytes(b"stale pickle")
    return d


def test_untouched_tensors_byte_identical_and_metadata(tmp_path):
    src = make_sharded(tmp_path)
    before = tree_digest(src)
    ck = open_checkpoint(src)
    out = tmp_path / "out"
    new_bias = np.arange(64, dtype=np.float64) / 3
    with CheckpointWriter(out, ck) as w:
        w.put("b.bias", new_bias)
        w.record("test-op", {"x": 1})
    res = w.result
    assert tree_digest(src) == before                                   # source untouched
    ck2 = open_checkpoint(out)
    assert sorted(ck2.tensors) == sorted(ck.tensors)
    for name in ck.tensors:
        if name != "b.bias":
            assert ck2.read_raw(name) == ck.read_raw(name), name
    assert np.array_equal(ck2.read("b.bias"), new_bias.astype(np.float32))
    # both shards kept their names and their tensor order; value-only changes take the patch path
    assert sorted(os.listdir(out)) == ["config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json", "sub",
                                      "tokenizer.json"]
    assert {s.mode for s in res.shards} == {"patch"}
    assert res.skipped_files == ("pytorch_model.bin",)                   # a stale weight file is not carried over
    assert (out / "sub" / "extra.txt").read_text() == "side file in a sub-folder"
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        a, b = st.read_header(src / shard), st.read_header(out / shard)
        assert list(a.tensors) == list(b.tensors)
        assert a.data_start % 4096 == b.data_start % 4096             # block-aligned kernel copies stay possible
        meta = b.metadata
        assert meta["format"] == "pt"
        entry = json.loads(meta["ckpt_surgeon"])
        assert entry["operations"] == [{"op": "test-op", "params": {"x": 1}}]
        # full hash: sha256 over (name, size, bytes) of each source file in shard order
        h = hashlib.sha256()
        for f in sorted(src.glob("*.safetensors")):
            h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
            h.update(f.read_bytes())
        assert entry["source"] == {"name": "src", "hash": "sha256:" + h.hexdigest(), "hash_scope": "full"}
    assert load_file(str(out / "model-00001-of-00002.safetensors"))["a.bias"].tobytes() == ck.read_raw("a.bias")
    assert st.read_header(out / "model-00001-of-00002.safetensors").metadata["origin"] == "test"   # source metadata kept


def test_structural_changes_stream_and_update_the_index(tmp_path):
    src = make_sharded(tmp_path)
    ck = open_checkpoint(src)
    out = tmp_path / "out"
    with CheckpointWriter(out, ck) as w:
        w.drop("a.bias")
        w.copy("c.bias", as_name="c2.bias")
        w.drop("c.bias")
        w.put("new.weight", lambda: np.ones((3, 5)), dtype="F16", shape=(3, 5), like="b.bias")
    modes = {s.file: s.mode for s in w.result.shards}
    assert modes == {"model-00001-of-00002.safetensors": "stream", "model-00002-of-00002.safetensors": "stream"}
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(idx["weight_map"]) == {"a.weight", "b.weight", "b.bias", "new.weight", "c2.bias"}
    assert idx["weight_map"]["new.weight"] == "model-00002-of-00002.safetensors"
    ck2 = open_checkpoint(out)
    assert idx["metadata"]["total_size"] == sum(i.nbytes for i in ck2.tensors.values())
    # source order kept; a new tensor follows its like= tensor, a renamed one takes the old slot
    expected = []
    for name in st.read_header(src / "model-00002-of-00002.safetensors").tensors:
        expected += {"b.bias": ["b.bias", "new.weight"], "c.bias": ["c2.bias"]}.get(name, [name])
    assert list(st.read_header(out / "model-00002-of-00002.safetensors").tensors) == expected
    assert ck2.read_raw("c2.bias") == ck.read_raw("c.bias")
    assert ck2.tensors["new.weight"].dtype == "F16" and (ck2.read("new.weight") == 1).all()


def _bf16_rne(x: float) -> int:
    """bfloat16 bits of float64 x by exact comparison of its two bfloat16 neighbours (normal range)."""
    u = int(np.array([x], dtype=np.float64).view(np.uint64)[0])
    lo = u & ~((1 << 45) - 1)
    hi = lo + (1 << 45)
    flo, fhi = (float(np.array([b], dtype=np.uint64).view(np.float64)[0]) for b in (lo, hi))
    dlo, dhi = abs(x - flo), abs(fhi - x)
    pick = lo if dlo < dhi else hi if dhi < dlo else (lo if not (lo >> 45) & 1 else hi)
    f = np.array([pick], dtype=np.uint64).view(np.float64)[0]
    return int(np.array([f], dtype=np.float32).view(np.uint32)[0] >> 16)


def test_single_file_output_and_bf16_rounding(tmp_path):
    import torch
    from safetensors.torch import save_file as save_torch
    src = tmp_path / "m.safetensors"
    save_torch({"w": torch.randn(16, 8).to(torch.bfloat16), "u": torch.randn(4).to(torch.bfloat16)}, str(src))
    ck = open_checkpoint(src)
    assert ck.tensors["w"].dtype == "BF16"
    vals = np.random.default_rng(4).standard_normal((16, 8))
    out = tmp_path / "o.safetensors"
    with CheckpointWriter(out, ck) as w:
        w.put("w", vals)
    assert out.is_file() and w.result.shards[0].mode == "patch"
    ck2 = open_checkpoint(out)
    assert ck2.read_raw("u") == ck.read_raw("u")
    got = np.frombuffer(ck2.read_raw("w"), dtype="<u2")
    # cast once from float64 with round-to-nearest-even
    assert got.tolist() == [_bf16_rne(float(v)) for v in vals.reshape(-1)]


def test_force_and_refusals(tmp_path):
    src = make_sharded(tmp_path)
    ck = open_checkpoint(src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="already exists; pass --force"):
        CheckpointWriter(out, ck)
    with CheckpointWriter(out, ck, force=True):
        pass
    assert not (out / "old.txt").exists() and (out / "config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]      # no temp or old dir left
    for bad in (src, src / "inner"):
        with pytest.raises(CkptError, match="the output would (overwrite|be written inside)"):
            CheckpointWriter(bad, ck, force=True)
    with pytest.raises(CkptError, match="declared twice"):
        with CheckpointWriter(tmp_path / "o2", ck) as w:
            w.put("a.bias", np.zeros(64))
            w.put("a.bias", np.zeros(64))
    assert not (tmp_path / "o2").exists()
    with pytest.raises(CkptError, match="computed shape \\[3\\] differs from the declared \\[64\\]"):
        with CheckpointWriter(tmp_path / "o3", ck) as w:
            w.put("a.bias", lambda: np.zeros(3), shape=(64,))
    assert not (tmp_path / "o3").exists()
    assert not [p for p in tmp_path.iterdir() if ".ckpt-surgeon-" in p.name]


def test_parent_not_a_folder(tmp_path):
    src = make_sharded(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(WriteError, match="the parent folder does not exist"):
        CheckpointWriter(tmp_path / "afile" / "out", open_checkpoint(src))


_RUN = textwrap.dedent("""
    import sys, numpy as np
    from ckpt_surgeon import open_checkpoint
    from ckpt_surgeon.formats.write.writer import CheckpointWriter
    from ckpt_surgeon.errors import CkptError
    src, out = sys.argv[1], sys.argv[2]
    ck = open_checkpoint(src)
    try:
        with CheckpointWriter(out, ck) as w:
            w.put("b.bias", np.zeros(64))
            w.drop("c.bias")            # shard 2 streams, shard 1 is patched
    except CkptError as e:
        print("error:", e, file=sys.stderr)
        sys.exit(2)
""")


def _spawn(src, out, env_extra=None, preexec=None):
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env_extra or {}))
    # tests/pause_at.py pauses the writer at CKPT_SURGEON_PAUSE_AT (when set) so it can be killed there
    return subprocess.Popen([sys.executable, str(PAUSE_AT), "-c", _RUN, str(src), str(out)], env=env, stderr=subprocess.PIPE,
                            preexec_fn=preexec)


@pytest.mark.parametrize("stage", ["temp-created", "data-copied:0", "shard-written:0", "shard-written:1", "before-rename"])
def test_sigkill_at_each_stage_leaves_no_out(tmp_path, stage):
    src = make_sharded(tmp_path)
    before = tree_digest(src)
    out = tmp_path / "out"
    marker = tmp_path / "paused"
    p = _spawn(src, out, {"CKPT_SURGEON_PAUSE_AT": stage, "CKPT_SURGEON_PAUSE_FILE": str(marker)})
    deadline = time.time() + 60
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the writer never reached the stage"
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not out.exists()
    leftovers = [x.name for x in tmp_path.iterdir() if x.name.startswith(".out.ckpt-surgeon-")]
    assert len(leftovers) == 1                              # the dead run's hidden temp dir ...
    assert tree_digest(src) == before
    q = _spawn(src, out)
    assert q.wait(60) == 0, q.stderr.read().decode()
    assert out.is_dir()
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".out.ckpt-surgeon-")] == []   # ... swept by the next run
    assert (open_checkpoint(out).read("b.bias") == 0).all()


def test_sigkill_at_random_times_never_leaves_a_partial_out(tmp_path):
    """Kill after N ms for several N: OUT is either absent or complete and correct, never partial."""
    src = make_sharded(tmp_path, mb=48)
    before = tree_digest(src)
    ck = open_checkpoint(src)
    seen = set()
    for i, ms in enumerate([150, 300, 450, 600, 800, 1100, 1500, 2500]):
        out = tmp_path / f"out{i}"
        p = _spawn(src, out)
        time.sleep(ms / 1000)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():
            seen.add("complete")
            ck2 = open_checkpoint(out)
            assert sorted(ck2.tensors) == ["a.bias", "a.weight", "b.bias", "b.weight"]
            for name in ("a.weight", "a.bias", "b.weight"):
                assert ck2.read_raw(name) == ck.read_raw(name)
        else:
            seen.add("absent")
    assert tree_digest(src) == before
    assert "absent" in seen      # at least the early kills land before the rename


def test_file_size_limit_gives_a_clear_error_and_no_out(tmp_path):
    """'Disk full' as root: RLIMIT_FSIZE makes writes past the limit fail with EFBIG."""
    src = make_sharded(tmp_path, mb=8)
    out = tmp_path / "out"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = _spawn(src, out, preexec=limit)
    err = p.stderr.read().decode()
    assert p.wait(60) == 2, err
    assert "cannot write the output: File too large" in err
    assert "the file size limit was reached" in err and "nothing was written" in err
    assert not out.exists()
    assert [x.name for x in tmp_path.iterdir() if ".ckpt-surgeon-" in x.name] == []


def test_gguf_output_is_atomic_too(tiny, tmp_path):
    """GGUF -> GGUF goes through the same temp-beside-OUT + rename: a kill before the rename
    leaves no OUT."""
    from tests.gguf_util import write_gguf
    src = write_gguf(tiny("gpt2"), tmp_path / "g.gguf", qtype="F32")
    out, marker = tmp_path / "o.gguf", tmp_path / "paused"
    code = textwrap.dedent("""
        import sys
        from ckpt_surgeon.surgery.fold import fold_bias
        fold_bias(sys.argv[1], sys.argv[2], k=True, v=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), CKPT_SURGEON_PAUSE_AT="before-rename", CKPT_SURGEON_PAUSE_FILE=str(marker))
    p = subprocess.Popen([sys.executable, str(PAUSE_AT), "-c", code, str(src), str(out)], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not out.exists()
    with pytest.raises(CkptError, match="the output would (overwrite|be written inside)"):
        CheckpointWriter(src, open_checkpoint(src), force=True)      # never over the source, even with force


def test_begin_copy_overlaps_planning(tmp_path):
    """begin_copy(): the data is copied while the caller plans; a patchable shard keeps it (data
    section moved by exactly PRECOPY_RESERVE, so offsets stay congruent mod 4096), a restructured
    shard is streamed afresh, and an abort (a refusal while planning) leaves nothing."""
    from ckpt_surgeon.formats.write.writer import PRECOPY_RESERVE
    src = make_sharded(tmp_path)
    ck = open_checkpoint(src)
    w = CheckpointWriter(tmp_path / "out", ck)
    assert w.begin_copy()
    w.put("a.bias", np.zeros(64))
    w.drop("c.bias")
    w.commit()
    modes = {s.file: s.mode for s in w.result.shards}
    assert modes == {"model-00001-of-00002.safetensors": "patch", "model-00002-of-00002.safetensors": "stream"}
    h_src, h_out = st.read_header(src / "model-00001-of-00002.safetensors"), st.read_header(tmp_path / "out" / "model-00001-of-00002.safetensors")
    assert h_out.data_start == h_src.data_start + PRECOPY_RESERVE
    ck2 = open_checkpoint(tmp_path / "out")
    assert ck2.read_raw("a.weight") == ck.read_raw("a.weight") and (ck2.read("a.bias") == 0).all()
    assert ck2.read_raw("b.weight") == ck.read_raw("b.weight") and "c.bias" not in ck2.tensors
    w2 = CheckpointWriter(tmp_path / "out2", ck)
    w2.begin_copy()
    w2.abort()
    assert not (tmp_path / "out2").exists()
    assert [x.name for x in tmp_path.iterdir() if ".ckpt-surgeon-" in x.name] == []


def test_values_only_sharded_commit_copies_shards_in_parallel(tmp_path):
    """A commit whose every shard is patchable (values changed, same tensors) starts the parallel
    kernel copy itself: the data sections land PRECOPY_RESERVE after their source offsets (the
    begin_copy layout), untouched tensors stay byte-identical and the changed ones hold the values."""
    from ckpt_surgeon.formats.write.writer import PRECOPY_RESERVE
    src = make_sharded(tmp_path)
    ck = open_checkpoint(src)
    with CheckpointWriter(tmp_path / "out", ck) as w:
        w.put("a.bias", np.zeros(64))
        w.put("c.bias", np.ones(7))
    assert [s.mode for s in w.result.shards] == ["patch", "patch"]
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert st.read_header(tmp_path / "out" / shard).data_start == st.read_header(src / shard).data_start + PRECOPY_RESERVE
    out = open_checkpoint(tmp_path / "out")
    for name in ("a.weight", "b.weight", "b.bias"):
        assert out.read_raw(name) == ck.read_raw(name), name
    assert (out.read("a.bias") == 0).all() and (out.read("c.bias") == 1).all()


def test_before_publish_hook_gates_the_output(tmp_path):
    """before_publish runs after every shard is written and reread, before the rename: when it
    raises, nothing is published and the temp output is removed; when it returns, OUT appears."""
    src = make_sharded(tmp_path)
    ck = open_checkpoint(src)
    seen = []

    def refuse():
        seen.append(sorted(p.name for p in tmp_path.iterdir() if ".ckpt-surgeon-" in p.name))
        raise CkptError("model check failed")

    w = CheckpointWriter(tmp_path / "out", ck, before_publish=refuse)
    w.put("a.bias", np.zeros(64))
    with pytest.raises(CkptError, match="model check failed"):
        w.commit()
    assert len(seen) == 1 and len(seen[0]) == 1        # the temp output existed when the hook ran
    assert not (tmp_path / "out").exists()
    assert [x.name for x in tmp_path.iterdir() if ".ckpt-surgeon-" in x.name] == []
    with CheckpointWriter(tmp_path / "out", ck, before_publish=lambda: seen.append("ok")) as w2:
        w2.put("a.bias", np.zeros(64))
    assert seen[-1] == "ok" and (open_checkpoint(tmp_path / "out").read("a.bias") == 0).all()


def test_gguf_key_values_pack_as_gguf_py():
    """Our GGUF key-value encoding equals gguf-py's writer (``GGUFWriter._pack_val``), including what its
    struct packing accepts: a bool stores any value's truth (llama.cpp's ERNIE 4.5 class writes
    ``add_space_prefix`` None, as false); a value the type cannot hold is one error naming the key."""
    import gguf

    from ckpt_surgeon.formats.write import gguf as gw
    w = gguf.GGUFWriter(None, "llama")
    VT = gguf.GGUFValueType
    cases = [(VT.BOOL, None, None), (VT.BOOL, False, None), (VT.BOOL, True, None), (VT.BOOL, 2, None),
             (VT.UINT32, 7, None), (VT.INT32, -3, None), (VT.FLOAT32, 0.1, None), (VT.STRING, "é", None),
             (VT.ARRAY, [True, None, 1], VT.BOOL), (VT.ARRAY, [1, 2], VT.INT32), (VT.ARRAY, ["a", "bc"], VT.STRING)]
    for vtype, value, sub in cases:
        theirs = w._pack_val(value, vtype, add_vtype=True, sub_type=sub)
        ours = gw.encode_kv(gw.KV("k", int(vtype), value, None if sub is None else int(sub)))
        assert ours == gw.encode_string("k") + theirs, (vtype, value)
    with pytest.raises(ValueError, match="GGUF key 'x.head_count': value None"):
        gw.encode_kv(gw.KV("x.head_count", int(VT.UINT32), None, None))


def test_a_tensor_computed_in_pieces_is_written_in_order_and_its_size_checked(tmp_path):
    """A producer returning an iterator (a large tensor gathered a slab at a time) is written piece by piece;
    the pieces must add up to the declared size, else one error naming the tensor and nothing is written."""
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    with CheckpointWriter(tmp_path / "ok", force=False) as w:
        w.put("x", lambda: (x[a:a + 2] for a in range(0, 6, 2)), dtype="F32", shape=(6, 4))
        w.put("y", lambda: iter([x[:3].astype(np.float64), x[3:].astype(np.float64)]), dtype="BF16", shape=(6, 4))
    got = load_file(tmp_path / "ok" / "model.safetensors")
    assert np.array_equal(got["x"], x)
    assert np.array_equal(got["y"].view(np.uint16), (x.view(np.uint32) >> 16).astype(np.uint16))  # exact in bf16
    for pieces in ([x[:2], x[2:4]], [x, x[:1]]):          # too few bytes; too many
        w = CheckpointWriter(tmp_path / "bad", force=False)
        w.put("x", lambda p=pieces: iter(p), dtype="F32", shape=(6, 4))
        with pytest.raises(CkptError, match="computed more or fewer bytes"):
            w.commit()
        assert not (tmp_path / "bad").exists()
