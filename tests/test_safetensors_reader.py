"""The safetensors reader: full header validation with exact messages, lazy reads, sharded folders."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.errors import FormatError, PickleRefusedError, SourceNotFoundError, TruncatedError
from ckpt_surgeon.formats.safetensors import DTYPE_BITS, LocalFile, read_header


def raw_file(path: Path, header: dict | bytes, data: bytes = b"", hlen: int | None = None) -> Path:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + data)
    return path


def two_tensors(tmp_path: Path, **over) -> Path:
    hdr = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 20]}}
    hdr.update(over)
    return raw_file(tmp_path / "m.safetensors", hdr, np.arange(5, dtype=np.float32).tobytes())


def test_reads_what_safetensors_wrote(tmp_path):
    ts = {"w": torch.randn(3, 4), "b": torch.randn(4).to(torch.bfloat16), "h": torch.randn(2, 2).half(),
          "i": torch.arange(6, dtype=torch.int64), "f8": torch.randn(8).to(torch.float8_e4m3fn)}
    p = tmp_path / "x.safetensors"
    save_file(ts, str(p), metadata={"format": "pt"})
    lf = LocalFile(p)
    assert lf.header.metadata == {"format": "pt"}
    assert set(lf.header.tensors) == set(ts)
    for name, t in ts.items():
        got = lf.read(lf.header.tensors[name])
        want = t.float().numpy() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t.numpy()
        np.testing.assert_array_equal(got, want)  # widening bf16/f8 -> f32 is exact
    # lazy: only the header plus the requested tensors were read
    assert lf.bytes_read == 8 + lf.header.header_len + sum(i.nbytes for i in lf.header.tensors.values())
    lf.close()


def test_every_safetensors_dtype_is_known():
    for dt in ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
               "F64", "I64", "U64"):
        assert dt in DTYPE_BITS


@pytest.mark.parametrize("case, expected", [
    ("tiny", "file is too small to be safetensors (3 bytes; the 8-byte header length is missing)"),
    ("huge_header", "header length 200000000 exceeds the 100 MB limit: not a safetensors file or corrupted"),
    ("past_eof", "header length 4096 runs past the end of the file (48 bytes): file truncated or not safetensors"),
    ("bad_json", "header is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ("not_object", "header is JSON but not an object (got list)"),
    ("unknown_dtype", "tensor 'a': unknown dtype 'F12' (known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, C64, F4, F6_E2M3, F6_E3M2)"),
    ("size_mismatch", "tensor 'b': size mismatch: shape [4] of F32 needs 16 bytes but data_offsets [8, 20] hold 12"),
    ("overlap", "tensor 'b': data_offsets [4, 16] overlap tensor 'a' (which ends at 8)"),
    ("gap", "tensor 'b': data_offsets [12, 24] leave a gap of 4 bytes after tensor 'a': offsets must be contiguous"),
    ("trailing", "4 bytes after the last tensor are not covered by the header: offsets must cover the data exactly"),
    ("truncated", "file is truncated: the header promises 20 bytes of data but only 12 are present (8 bytes missing; 1 tensor(s) affected, first 'b')"),
    ("duplicate", "tensor 'a': header names this tensor twice"),
    ("bad_shape", "tensor 'a': shape [-2] is not a list of non-negative integers"),
    ("missing_key", "tensor 'a': header entry lacks dtype/shape/data_offsets"),
])
def test_bad_headers_have_exact_messages(tmp_path, case, expected):
    data = np.arange(5, dtype=np.float32).tobytes()
    p = tmp_path / "m.safetensors"
    a = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    b = {"dtype": "F32", "shape": [3], "data_offsets": [8, 20]}
    if case == "tiny":
        p.write_bytes(b"abc")
    elif case == "huge_header":
        raw_file(p, b"{}", data, hlen=200_000_000)
    elif case == "past_eof":
        raw_file(p, json.dumps({"a": a, "b": b}).encode()[:40], hlen=4096)
    elif case == "bad_json":
        raw_file(p, b"nope", data)
    elif case == "not_object":
        raw_file(p, b"[1, 2]", data)
    elif case == "unknown_dtype":
        raw_file(p, {"a": dict(a, dtype="F12"), "b": b}, data)
    elif case == "size_mismatch":
        raw_file(p, {"a": a, "b": dict(b, shape=[4])}, data)
    elif case == "overlap":
        raw_file(p, {"a": a, "b": dict(b, data_offsets=[4, 16])}, data)
    elif case == "gap":
        raw_file(p, {"a": a, "b": dict(b, data_offsets=[12, 24])}, data + b"\0" * 4)
    elif case == "trailing":
        raw_file(p, {"a": a, "b": b}, data + b"\0" * 4)
    elif case == "truncated":
        raw_file(p, {"a": a, "b": b}, data[:12])
    elif case == "duplicate":
        raw_file(p, b'{"a": %s, "a": %s}' % (json.dumps(a).encode(), json.dumps(a).encode()), data[:8])
    elif case == "bad_shape":
        raw_file(p, {"a": dict(a, shape=[-2]), "b": b}, data)
    elif case == "missing_key":
        raw_file(p, {"a": {"dtype": "F32", "shape": [2]}, "b": b}, data)
    with pytest.raises(FormatError) as ei:
        read_header(p)
    assert str(ei.value) == f"{p}: {expected}"
    if case == "truncated":
        assert isinstance(ei.value, TruncatedError) and ei.value.missing_bytes == 8 and ei.value.tensors == ("b",)


def test_huge_shape_is_rejected_without_allocating(tmp_path):
    p = raw_file(tmp_path / "m.safetensors", {"a": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, 8]}},
                 b"\0" * 8)
    with pytest.raises(FormatError, match=r"needs 4835703278458516698824704 bytes but data_offsets \[0, 8\] hold 8"):
        read_header(p)


def _sharded(tmp_path: Path) -> Path:
    d = tmp_path / "sharded"
    d.mkdir()
    save_file({"x.q_proj.bias": torch.ones(4)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"x.k_proj.bias": torch.ones(2)}, str(d / "model-00002-of-00002.safetensors"))
    idx = {"metadata": {}, "weight_map": {"x.q_proj.bias": "model-00001-of-00002.safetensors",
                                          "x.k_proj.bias": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    return d


def _set_index(d: Path, wm: dict) -> Path:
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return d / "model.safetensors.index.json"


def test_sharded_folder_opens(tmp_path):
    d = _sharded(tmp_path)
    ck = open_checkpoint(d)
    assert set(ck.tensors) == {"x.q_proj.bias", "x.k_proj.bias"} and len(ck.files) == 2
    np.testing.assert_array_equal(ck.read("x.k_proj.bias"), np.ones(2, np.float32))


@pytest.mark.parametrize("entry, expected", [
    ("../outside.safetensors", "weight_map names '../outside.safetensors', which is not a plain file inside the folder"),
    ("/etc/passwd", "weight_map names '/etc/passwd', which is not a plain file inside the folder"),
    ("model-00003-of-00002.safetensors", "weight_map names shard 'model-00003-of-00002.safetensors', which does not exist"),
    ("model-00001-of-00002.safetensors", "weight_map says this tensor is in model-00001-of-00002.safetensors, but that file does not hold it"),
])
def test_weight_map_is_validated(tmp_path, entry, expected):
    d = _sharded(tmp_path)
    idx = _set_index(d, {"x.q_proj.bias": "model-00001-of-00002.safetensors", "x.k_proj.bias": entry})
    with pytest.raises(FormatError) as ei:
        open_checkpoint(d)
    assert str(ei.value) == f"{idx}: tensor 'x.k_proj.bias': {expected}"


def test_weight_map_symlink_pointing_outside_is_followed(tmp_path):
    # Issue 11: symlinks are the user's own filesystem (the Hugging Face cache keeps every
    # snapshot file as a symlink into ../../blobs/); only the *name* in weight_map is checked.
    d = _sharded(tmp_path)
    outside = tmp_path / "outside.safetensors"
    save_file({"x.k_proj.bias": torch.full((2,), 3.0)}, str(outside))
    (d / "model-00002-of-00002.safetensors").unlink()
    os.symlink(outside, d / "link.safetensors")
    _set_index(d, {"x.q_proj.bias": "model-00001-of-00002.safetensors", "x.k_proj.bias": "link.safetensors"})
    ck = open_checkpoint(d)
    np.testing.assert_array_equal(ck.read("x.k_proj.bias"), np.full(2, 3.0, np.float32))


def test_weight_map_dangling_symlink_is_one_line(tmp_path):
    d = _sharded(tmp_path)
    os.symlink(tmp_path / "gone.safetensors", d / "link.safetensors")
    idx = _set_index(d, {"x.q_proj.bias": "model-00001-of-00002.safetensors", "x.k_proj.bias": "link.safetensors"})
    with pytest.raises(FormatError) as ei:
        open_checkpoint(d)
    assert str(ei.value) == f"{idx}: tensor 'x.k_proj.bias': weight_map names shard 'link.safetensors', which does not exist"


def test_pickle_is_refused_and_never_unpickled(tmp_path):
    d = tmp_path / "pk"
    d.mkdir()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Evil()}))
    with pytest.raises(PickleRefusedError) as ei:
        open_checkpoint(d)
    assert str(ei.value) == (f"{d / 'pytorch_model.bin'}: is a pickle checkpoint; unpickling can run arbitrary code, so it is not "
                             "loaded (convert it to safetensors, or pass --allow-pickle to load it with torch.load(weights_only=True))")
    # even with the flag, the restricted unpickler refuses to call os.system
    with pytest.raises(FormatError, match="torch.load\\(weights_only=True\\) refused or failed"):
        open_checkpoint(d, allow_pickle=True)
    assert not marker.exists()


def test_allow_pickle_reads_plain_state_dict(tmp_path):
    d = tmp_path / "pk"
    d.mkdir()
    torch.save({"layer.0.attention.self.key.bias": torch.arange(4.0)}, d / "pytorch_model.bin")
    ck = open_checkpoint(d, allow_pickle=True)
    np.testing.assert_array_equal(ck.read("layer.0.attention.self.key.bias"), np.arange(4.0, dtype=np.float32))


def test_missing_source(tmp_path):
    with pytest.raises(SourceNotFoundError) as ei:
        open_checkpoint(tmp_path / "nope")
    assert str(ei.value) == f"{tmp_path / 'nope'}: no such file or folder (and not a Hub repo id of the form owner/name)"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceNotFoundError, match="no model.safetensors, sharded safetensors index, or .gguf file found"):
        open_checkpoint(empty)


def test_file_identified_by_content_not_extension(tmp_path):
    p = tmp_path / "looks.gguf"
    save_file({"a": torch.zeros(2)}, str(p))
    ck = open_checkpoint(p)
    assert ck.format == "safetensors" and list(ck.tensors) == ["a"]


def test_every_local_reader_is_a_tensor_source_and_checkpoint_reads_through_it(tmp_path, smollm_gguf):
    """Each kind of local source opens to a reader that declares the protocol; read, read_raw and
    read_rows_into give the same bytes whichever reader serves them, and the counters add up."""
    from ckpt_surgeon.formats.gguf import GGUFFile
    from ckpt_surgeon.formats.pickle import TorchTensors
    from ckpt_surgeon.formats.source import ShardSet, TensorSource

    shards = tmp_path / "sharded"
    shards.mkdir()
    save_file({"a": torch.arange(12.0).reshape(4, 3)}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.arange(6.0).to(torch.bfloat16).reshape(3, 2)}, str(shards / "model-00002-of-00002.safetensors"))
    pk = tmp_path / "pk"
    pk.mkdir()
    torch.save({"c": torch.arange(8.0).reshape(2, 4)}, pk / "pytorch_model.bin")
    cases = [(shards, ShardSet, "a"), (shards / "model-00002-of-00002.safetensors", ShardSet, "b"),
             (pk, TorchTensors, "c"), (smollm_gguf, GGUFFile, "blk.0.attn_q.weight")]
    for source, kind, name in cases:
        with open_checkpoint(source, allow_pickle=True) as ck:
            assert isinstance(ck.reader, TensorSource) and isinstance(ck.reader, kind), (source, type(ck.reader))
            assert ck.tensors is ck.reader.tensors and ck.files == ck.reader.files and ck.requests == 0
            info = ck.tensors[name]
            raw = ck.read_raw(name)
            assert len(raw) == info.nbytes
            rows = info.shape[0]
            buf = bytearray(info.nbytes + 7)               # a larger reused buffer: only the rows' bytes are filled
            view = ck.read_rows_into(name, 1, rows, buf)
            assert bytes(view) == raw[info.nbytes // rows:] == ck.read_rows(name, 1, rows, raw=True)
            np.testing.assert_array_equal(ck.read_rows(name, 1, rows), ck.read(name)[1:])
    with open_checkpoint(shards) as ck:
        before = ck.bytes_read        # the two headers
        ck.read("a")
        ck.read("b")
        assert ck.bytes_read == before + 48 + 12
        assert before == sum(8 + p.header.header_len for p in ck.reader.parts)
