"""GGUF reader: real SmolLM2 file, files written by gguf-py from the tiny fixtures, damaged files.

Reference implementations: gguf-py's ``GGUFReader`` (metadata, tensor table, byte offsets of
every section, which the damaged-file tests use so they never trust the parser under test)
and ``gguf.quants.dequantize``.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import gguf

from ckpt_surgeon.analysis.inspect import inspect
from ckpt_surgeon.arch.gguf_config import config_from_gguf
from ckpt_surgeon.arch.layouts import llama_unpermute_index
from ckpt_surgeon.checkpoint import open_checkpoint, open_gguf_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import FormatError, TruncatedError
from ckpt_surgeon.formats.gguf import GGUFFile, StringArray, parse_header, NeedMoreBytes

from gguf_util import section_offsets, write_gguf


# --------------------------------------------------------------------------- real file: SmolLM2-135M Q4_1

def test_smollm_inspect_reports_the_real_model(smollm_gguf):
    r = inspect(smollm_gguf)
    assert (r.format, r.architecture, r.family) == ("gguf", "llama", "llama")
    assert (r.num_layers, r.num_heads, r.num_kv_heads, r.head_dim, r.hidden_size) == (30, 9, 3, 64, 576)
    assert r.layers_with_qkv_bias == 0 and r.bias_parameters == 0
    assert len(r.layers) == 30
    assert all(lr.q_bias is None and lr.k_bias is None and lr.v_bias is None for lr in r.layers)
    # llama-arch GGUF: Q/K rows are interleaved rotary pairs
    assert r.position_encoding.type == "rope" and r.position_encoding.pair_layout == "interleaved"
    assert r.position_encoding.theta == 100000.0 and r.position_encoding.rotary_dim == 64
    assert r.max_positions == 8192
    assert r.file_metadata == {
        "name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "architecture": "llama", "context_length": 8192,
        "rope_theta": 100000.0, "file_type": "MOSTLY_Q4_1", "tokenizer_model": "gpt2", "vocab_size": 49152,
        "gguf_version": 3, "alignment": 32, "tensor_count": 272, "kv_count": 33}
    assert r.tensor_types["token_embd.weight"] == "Q8_0"
    assert r.tensor_types["blk.0.attn_q.weight"] == "Q4_1"
    assert r.tensor_types["blk.0.attn_norm.weight"] == "F32"
    assert r.num_tensors == 272 and not r.missing and r.missing_bytes == 0
    d = r.to_dict()
    assert d["file_metadata"]["file_type"] == "MOSTLY_Q4_1" and d["tensor_types"]["output_norm.weight"] == "F32"
    json.dumps(d)   # the contract is JSON-serialisable


def test_smollm_metadata_and_tensor_table_equal_gguf_reader(smollm_gguf):
    ref = gguf.GGUFReader(str(smollm_gguf))
    with GGUFFile(smollm_gguf) as g:
        h = g.header
        assert (h.version, h.tensor_count, h.kv_count) == (
            ref.fields["GGUF.version"].contents(), ref.fields["GGUF.tensor_count"].contents(),
            ref.fields["GGUF.kv_count"].contents())
        keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert list(h.metadata) == keys
        for k in keys:
            ours, theirs = h.metadata[k], ref.fields[k].contents()
            if isinstance(ours, StringArray):
                ours = ours.tolist()
            assert ours == theirs, k
            assert h.fields[k].type == ref.fields[k].types[0].name, k
        assert isinstance(h.metadata["tokenizer.ggml.tokens"], StringArray)
        assert h.data_start == ref.data_offset and h.alignment == ref.alignment
        assert list(h.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            info = h.tensors[t.name]
            assert info.dtype == t.tensor_type.name
            assert info.shape == tuple(reversed(t.shape.tolist()))
            assert (info.start, info.end) == (t.data_offset, t.data_offset + int(t.n_bytes))
            assert not info.missing and info.quantized == (t.tensor_type.name not in ("F32", "F16"))


def test_smollm_token_embedding_equals_gguf_py(smollm_gguf):
    ref = gguf.GGUFReader(str(smollm_gguf))
    t = next(t for t in ref.tensors if t.name == "token_embd.weight")
    with open_gguf_checkpoint(smollm_gguf) as ck:
        ours = ck.read("token_embd.weight")
        assert ck.read_raw("token_embd.weight") == t.data.tobytes()
    theirs = gguf.quants.dequantize(t.data, t.tensor_type)
    assert ours.shape == theirs.shape == (49152, 576) and ours.dtype == np.float32
    # bit-exact: same operations in the same order (see formats/quant/dequant.py)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_smollm_config_mapping(smollm_gguf):
    with open_checkpoint(smollm_gguf) as ck:
        c = ck.config
    assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"]
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == (30, 9, 3)
    assert (c["hidden_size"], c["intermediate_size"], c["head_dim"], c["vocab_size"]) == (576, 1536, 64, 49152)
    assert c["max_position_embeddings"] == 8192
    assert c["rope_theta"] == 100000.0
    assert c["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 1.0}
    assert c["rms_norm_eps"] == pytest.approx(1e-5, rel=1e-6)   # stored as float32
    assert c["tie_word_embeddings"] is True and c["attention_bias"] is False


def test_inspect_on_gguf_does_not_import_torch(smollm_gguf):
    code = ("import sys; from ckpt_surgeon.analysis.inspect import inspect; r = inspect(sys.argv[1]); "
            "assert r.num_layers == 30; bad = [m for m in ('torch', 'transformers', 'gguf') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code, str(smollm_gguf)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


# --------------------------------------------------------------------------- files written from the tiny fixtures

@pytest.fixture(scope="module")
def written(tiny, tmp_path_factory):
    """family -> (HF folder, GGUF path written by gguf-py)."""
    d = tmp_path_factory.mktemp("gguf")
    cache = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in cache:
            src = tiny(name)
            cache[name] = (src, write_gguf(src, d / f"{name}.gguf"))
        return cache[name]
    return get


def _flat(x) -> list:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _flat(item)]
    if isinstance(x, dict):
        return [y for k in sorted(x) for y in _flat(x[k])]
    return [x]


def _bias_stats(report):
    out = []
    for lr in report.layers:
        row = {}
        for role in ("q", "k", "v"):
            b = getattr(lr, f"{role}_bias")
            row[role] = None if b is None else (b.l2, b.max_abs, b.per_head_l2)
        out.append(row)
    return out


@pytest.mark.parametrize("name", ["qwen2", "llama_bias", "phi3", "gpt2"])
def test_inspect_gguf_matches_safetensors(written, name):
    """Same report contract and the same per-layer bias statistics as the safetensors source.

    The GGUF holds the same float32 values (F32) and llama's Q/K rows are only permuted *within*
    each head, so the statistics are the same numbers; for llama the float64 sums of squares run
    in a different order, which changes the last bits (relative error <= 16 * 2**-53 < 1e-14 for
    these 64-element sums), hence ``rel=1e-12`` for llama and exact equality otherwise.
    """
    src, path = written(name)
    a, b = inspect(src), inspect(path)
    da, db = a.to_dict(), b.to_dict()
    assert set(da) == set(db)
    assert [set(x) for x in da["layers"]] == [set(x) for x in db["layers"]]
    for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "qk_norm", "norm_placement",
                "max_positions", "parameter_count", "layers_with_qkv_bias", "bias_parameters", "bias_share"):
        assert da[key] == db[key], key
    assert da["position_encoding"] == db["position_encoding"]
    sa, sb = _flat(_bias_stats(a)), _flat(_bias_stats(b))
    assert [x is None for x in sa] == [x is None for x in sb]
    if name.startswith("llama"):
        assert [x for x in sa if x is not None] == pytest.approx([x for x in sb if x is not None], rel=1e-12)
    else:
        assert sa == sb
    assert b.layers_with_qkv_bias == (0 if name == "phi3" else 2)   # Phi-3's qkv_proj has no bias
    assert db["format"] == "gguf" and db["file_metadata"]["architecture"] == b.architecture
    assert set(db["tensor_types"].values()) == {"F32"}
    fused = {"qwen2": None, "llama_bias": None, "phi3": "concat", "gpt2": "concat"}[name]
    assert db["fused_layout"] == fused and all(lr["fused_qkv"] == (fused is not None) for lr in db["layers"])
    pairs = {"qwen2": "rotate_half", "llama_bias": "interleaved", "phi3": "rotate_half", "gpt2": None}[name]
    assert db["pair_layout"] == pairs


def test_llama_gguf_rows_are_permuted_and_undo_exactly(written):
    src, path = written("llama_bias")
    with open_checkpoint(src) as hf, open_checkpoint(path) as gg:
        lay = gg.layout()
        assert lay.qk_permuted and lay.position.pair_layout == "interleaved"
        h, kv, d = lay.num_heads, lay.num_kv_heads, lay.head_dim
        for role, n, hf_mod in (("q", h, "q_proj"), ("k", kv, "k_proj")):
            for kind in ("weight", "bias"):
                g = gg.read(f"blk.0.attn_{role}.{kind}")
                ref = hf.read(f"model.layers.0.self_attn.{hf_mod}.{kind}")
                assert not np.array_equal(g, ref)            # really permuted
                assert np.array_equal(g[llama_unpermute_index(n, d)], ref)


@pytest.mark.parametrize("name", ["qwen2", "llama", "phi3", "gpt2", "phi", "gpt_neox", "falcon", "bloom", "bert", "gemma3",
                                  "qwen3", "starcoder2", "olmo2"])
def test_config_from_gguf_matches_hf_config(written, name):
    src, path = written(name)
    with open_checkpoint(src) as hf:
        ref = hf.layout()
        tie = hf.config.get("tie_word_embeddings", True)
    with open_checkpoint(path) as gg:
        c = gg.config
        lay = gg.layout()
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]) == (
        ref.num_layers, ref.num_heads, ref.num_kv_heads, ref.head_dim, ref.hidden_size)
    if ref.max_positions is not None:   # BLOOM (ALiBi) has none; the writer then stores 2048
        assert c["max_position_embeddings"] == ref.max_positions
    assert lay.position.type == ref.position.type
    if ref.position.type == "rope":
        assert lay.position.rotary_dim == ref.position.rotary_dim
        assert c["rope_parameters"]["rope_theta"] == c["rope_theta"] == ref.position.theta
        assert c["partial_rotary_factor"] == ref.position.rotary_dim / ref.head_dim
    # tied embeddings <=> no output.weight in the GGUF (BERT has no LM head at all)
    if name != "bert":
        assert c["tie_word_embeddings"] == tie
    with open_checkpoint(src) as hf:
        assert c["vocab_size"] == hf.config["vocab_size"]


def test_value_types_nested_arrays_and_version_2(tmp_path):
    """Every GGUF value type, typed arrays, arrays of arrays, strings with any bytes; v2 layout."""
    from gguf import GGUFValueType as V

    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    values = {
        "t.u8": (7, V.UINT8), "t.i8": (-7, V.INT8), "t.u16": (65535, V.UINT16), "t.i16": (-300, V.INT16),
        "t.u32": (2**32 - 1, V.UINT32), "t.i32": (-2**31, V.INT32), "t.f32": (0.25, V.FLOAT32), "t.b": (True, V.BOOL),
        "t.u64": (2**64 - 1, V.UINT64), "t.i64": (-2**63, V.INT64), "t.f64": (1e-300, V.FLOAT64),
        "t.s": ("héllo ✓", V.STRING), "t.empty_s": ("", V.STRING),
    }
    for k, (v, vt) in values.items():
        w.add_key_value(k, v, vt)
    w.add_key_value("t.arr_u64", [1, 2**63], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("t.arr_f64", [0.5, -1.5], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("t.arr_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_array("t.arr_s", ["a", "", "ü", "x" * 300])
    w.add_array("t.nested", [[1, 2, 3], [4], [5, 6]])
    w.add_array("t.nested_s", [["a", "b"], ["c"]])
    w.add_array("t.deep", [[[1.5], [2.5, 3.5]]])
    w.add_tensor("x", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

    def check(p):
        with GGUFFile(p) as g:
            md, f = g.metadata, g.header.fields
            for k, (v, vt) in values.items():
                assert md[k] == v and f[k].type == vt.name, k
            assert md["t.arr_u64"] == [1, 2**63] and f["t.arr_u64"].item_type == "UINT64" and f["t.arr_u64"].count == 2
            assert md["t.arr_f64"] == [0.5, -1.5] and md["t.arr_bool"] == [True, False, True]
            assert md["t.arr_s"] == ["a", "", "ü", "x" * 300] and isinstance(md["t.arr_s"], StringArray)
            assert md["t.arr_s"][-1] == "x" * 300 and md["t.arr_s"][1:3] == ["", "ü"]
            assert md["t.nested"] == [[1, 2, 3], [4], [5, 6]] and f["t.nested"].item_type == "ARRAY"
            assert [list(x) for x in md["t.nested_s"]] == [["a", "b"], ["c"]]
            assert md["t.deep"] == [[[1.5], [2.5, 3.5]]]
            assert g.read(g.tensors["x"]).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
            return g.header.version

    assert check(path) == 3
    v2 = tmp_path / "v2.gguf"
    blob = bytearray(path.read_bytes())
    blob[4:8] = struct.pack("<I", 2)   # v2 and v3 differ only in byte-order support
    v2.write_bytes(bytes(blob))
    assert check(v2) == 2


def test_string_array_is_a_lossless_sequence(tmp_path):
    path = tmp_path / "s.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    toks = [f"t{i}" for i in range(1000)]
    w.add_token_list(toks)
    w.add_key_value("bad.utf8", [b"ok", b"\xff\xfe", b"\xc3\xa9"], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.STRING)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with GGUFFile(path) as g:
        s = g.metadata["tokenizer.ggml.tokens"]
        assert len(s) == 1000 and s[0] == "t0" and s[-1] == "t999" and s[10:13] == ["t10", "t11", "t12"]
        assert list(s) == toks and s == toks and s.tolist() == toks and "t5" in s
        with pytest.raises(IndexError):
            s[1000]
        b = g.metadata["bad.utf8"]
        assert b.raw(1) == b"\xff\xfe" and b[1].encode("utf-8", "surrogateescape") == b"\xff\xfe" and b[2] == "é"


def test_big_vocabulary_string_array(tmp_path):
    """A 262,144-token vocabulary (Gemma-3 size) parses into a lazy array equal to the written list."""
    path = tmp_path / "vocab.gguf"
    toks = [f"▁tok{i}" + "x" * (i % 13) for i in range(262144)]
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_token_list(toks)
    w.add_token_scores([float(i % 7) for i in range(len(toks))])
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with GGUFFile(path) as g:
        s = g.metadata["tokenizer.ggml.tokens"]
        assert len(s) == 262144 and s[200001] == toks[200001] and s.tolist() == toks
        assert g.metadata["tokenizer.ggml.scores"][:8] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0]


def test_prefix_buffer_asks_for_more_bytes(smollm_gguf):
    blob = Path(smollm_gguf).read_bytes()[:3_000_000]
    size = os.path.getsize(smollm_gguf)
    with pytest.raises(NeedMoreBytes) as e:
        parse_header(blob[:100_000], str(smollm_gguf), size)
    assert 100_000 < e.value.needed <= size
    h = parse_header(blob, str(smollm_gguf), size)   # the 1.8 MB header fits in 3 MB
    assert h.tensor_count == 272 and h.missing_bytes == 0


# --------------------------------------------------------------------------- damaged files

@pytest.fixture(scope="module")
def base(written):
    """A qwen2 GGUF (F32, q/k/v biases) and its section offsets, found by gguf-py's reader."""
    _, path = written("qwen2")
    return path, path.read_bytes(), section_offsets(path)


def _write(tmp_path, blob: bytes, name: str = "damaged.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(blob)
    return str(p)


def _patch(blob: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(blob)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def _open_error(path: str):
    with pytest.raises(FormatError) as e:
        GGUFFile(path)
    return e


def test_section_layout_of_the_base_file(base):
    path, blob, off = base
    with GGUFFile(path) as g:
        assert g.header.kv_count == 18 and g.header.tensor_count == 27
        assert g.header.header_end == off["header_end"] and g.header.data_start == off["data_start"]
        assert off["data_start"] > off["header_end"]            # there is alignment padding to cut into
        assert g.header.file_size == len(blob) == off["tensor_data"]["output_norm.weight"][1]


def test_truncated_in_fixed_header_or_early_metadata(base, tmp_path):
    _, blob, off = base
    for cut in (24, off["kv"]["qwen2.block_count"] + 3):
        p = _write(tmp_path, blob[:cut])
        e = _open_error(p)
        assert e.type is FormatError
        assert str(e.value) == (f"{p}: header declares 27 tensors and 18 key-value pairs, which need at least 906 bytes, "
                                f"but the file has {cut} (corrupt count or truncated file)")
    p = _write(tmp_path, blob[:10])
    assert str(_open_error(p).value) == (f"{p}: file is truncated or corrupt: reading the tensor count at byte 8 needs 8 "
                                         "bytes, but the file ends at byte 10 (inside the file header)")


def _kv_index(off, key: str) -> int:
    return list(off["kv"]).index(key) + 1


def _tensor_index(off, name: str) -> int:
    return list(off["tensor_info"]).index(name) + 1


def test_truncated_inside_the_metadata(base, tmp_path):
    _, blob, off = base
    key = "tokenizer.ggml.tokens"
    i_kv = _kv_index(off, key)
    v = off["kv_value"][key]                                  # u32 item type, u64 count, then 448 strings
    # cut where fewer bytes remain than 448 length prefixes need: refused before walking them
    cut = v + 12 + 2000
    p = _write(tmp_path, blob[:cut])
    e = _open_error(p)
    assert e.type is TruncatedError
    assert str(e.value) == (f"{p}: value of '{key}': array of 448 STRING items needs at least 3,584 bytes, but only "
                            f"2,000 remain before the end of the file at byte {cut:,} (truncated file or corrupt count)")
    # cut near the end of the array: the string that crosses the end is named
    end_of_array = off["kv"]["tokenizer.ggml.token_type"]
    cut = end_of_array - 50
    assert cut - (v + 12) >= 448 * 8
    p = _write(tmp_path, blob[:cut])
    e = _open_error(p)
    pos, i = v + 12, 0
    while True:   # walk the length prefixes (as the parser does) to find the item the cut falls in
        n = struct.unpack_from("<Q", blob, pos)[0]
        if pos + 8 > cut or pos + 8 + n > cut:
            break
        pos, i = pos + 8 + n, i + 1
    what = (f"value of '{key}'[{i}] ({n}-byte string)" if pos + 8 <= cut else f"length of the value of '{key}'[{i}]")
    at, need = (pos + 8, n) if pos + 8 <= cut else (pos, 8)
    assert str(e.value) == (f"{p}: file is truncated or corrupt: reading the {what} at byte {at:,} needs {need:,} "
                            f"bytes, but the file ends at byte {cut:,} (inside the metadata, key-value pair {i_kv} of 18 "
                            f"('{key}'))")
    # a cut inside a key string
    key = "tokenizer.ggml.merges"
    k = off["kv"][key]
    p = _write(tmp_path, blob[:k + 12])
    assert str(_open_error(p).value) == (
        f"{p}: file is truncated or corrupt: reading the key {_kv_index(off, key)} of 18 (21-byte string) at byte "
        f"{k + 8:,} needs 21 bytes, but the file ends at byte {k + 12:,} (inside the metadata, key-value pair "
        f"{_kv_index(off, key)} of 18)")


def test_truncated_inside_the_tensor_table(base, tmp_path):
    _, blob, off = base
    first = off["tensor_info"]["output.weight"]
    p = _write(tmp_path, blob[:first])                       # exactly at the metadata / tensor-table boundary
    assert str(_open_error(p).value) == (
        f"{p}: file is truncated or corrupt: reading the length of the name of tensor 1 of 27 at byte {first:,} needs "
        f"8 bytes, but the file ends at byte {first:,} (inside the tensor table, tensor 1 of 27)")
    t = off["tensor_offset"]["blk.0.attn_k.bias"]
    p = _write(tmp_path, blob[:t + 3])                       # inside one tensor's u64 data offset
    e = _open_error(p)
    assert e.type is TruncatedError
    assert str(e.value) == (
        f"{p}: file is truncated or corrupt: reading the data offset of 'blk.0.attn_k.bias' at byte {t:,} needs 8 bytes, "
        f"but the file ends at byte {t + 3:,} (inside the tensor table, tensor {_tensor_index(off, 'blk.0.attn_k.bias')} "
        "of 27 ('blk.0.attn_k.bias'))")


@pytest.mark.parametrize("where", ["header_end", "padding", "data_start"])
def test_truncated_before_any_tensor_data_still_opens(base, tmp_path, where):
    _, blob, off = base
    cut = {"header_end": off["header_end"], "padding": off["header_end"] + 3, "data_start": off["data_start"]}[where]
    p = _write(tmp_path, blob[:cut])
    with open_checkpoint(p) as ck:
        assert len(ck.metadata) == 18 and len(ck.tensors) == 27       # metadata and table are all there
        assert all(t.missing for t in ck.tensors.values())
        assert ck.missing_bytes == len(blob) - cut
        assert ck.warnings == [f"file is truncated: {len(blob) - cut:,} bytes of tensor data are missing; 27 of 27 "
                               "tensor(s) lie past the end of the file (first 'output.weight')"]
        assert ck.config["num_hidden_layers"] == 2


def test_truncated_mid_tensor_marks_exactly_the_cut_tensors(base, tmp_path):
    path, blob, off = base
    s, e = off["tensor_data"]["blk.1.attn_q.bias"]
    cut = s + 10                                               # mid-tensor
    p = _write(tmp_path, blob[:cut])
    expect_missing = {n for n, (a, b) in off["tensor_data"].items() if b > cut}
    with open_checkpoint(p) as ck, open_checkpoint(path) as full:
        assert {n for n, t in ck.tensors.items() if t.missing} == expect_missing
        assert "blk.1.attn_q.bias" in expect_missing and "blk.1.attn_k.bias" not in expect_missing
        assert ck.missing_bytes == len(blob) - cut
        for n in ck.tensors:
            if n not in expect_missing:
                assert np.array_equal(ck.read(n), full.read(n)), n
        with pytest.raises(TruncatedError) as err:
            ck.read("blk.1.attn_q.bias")
        assert str(err.value) == (f"{p}: tensor 'blk.1.attn_q.bias': data lies past the end of the truncated file: "
                                  f"bytes {s:,}..{e:,} are needed but the file ends at byte {cut:,} ({e - cut} of "
                                  f"{e - s} bytes missing)")
        assert err.value.tensors == ("blk.1.attn_q.bias",) and err.value.missing_bytes == e - cut
        with pytest.raises(TruncatedError):
            ck.read_raw("blk.1.attn_v.weight")

    # a cut exactly at a tensor boundary: the next tensors are missing, none partially
    s2, _ = off["tensor_data"]["blk.1.attn_k.weight"]
    with open_checkpoint(_write(tmp_path, blob[:s2], "b.gguf")) as ck:
        assert {n for n, t in ck.tensors.items() if t.missing} == {n for n, (a, _) in off["tensor_data"].items() if a >= s2}


def test_inspect_on_truncated_file_reports_missing_statistics(base, tmp_path):
    _, blob, off = base
    s, _ = off["tensor_data"]["blk.1.attn_q.bias"]
    p = _write(tmp_path, blob[:s + 10])
    r = inspect(p)
    reason = "data lies past the end of the (truncated) file"
    # the biases whose statistics could not be computed first, then every other tensor past the end
    past_end = [n for n, (a, b) in sorted(off["tensor_data"].items(), key=lambda kv: kv[1]) if b > s + 10]
    assert r.missing[:2] == (("blk.1.attn_q.bias", reason), ("blk.1.attn_v.bias", reason))
    assert r.missing[2:] == tuple((n, reason) for n in past_end if n not in ("blk.1.attn_q.bias", "blk.1.attn_v.bias"))
    assert len(r.missing) == len(past_end) == 5
    assert r.missing_bytes == len(blob) - s - 10
    d = r.to_dict()
    assert d["layers"][1]["q_bias"]["l2"] is None and d["layers"][1]["q_bias"]["missing"] is True
    assert d["layers"][1]["k_bias"]["l2"] is not None and d["layers"][0]["q_bias"]["l2"] is not None


def _expected_cli_error(p: str, missing: int) -> str:
    return (f"error: {p}: file is truncated: {missing:,} bytes missing; 5 tensor(s) lie past the end of the file "
            "(blk.1.attn_q.bias, blk.1.attn_v.bias, blk.1.attn_q.weight, blk.1.attn_v.weight ...) "
            "(--allow-truncated exits 0 with the structure only)")


def test_cli_inspect_truncated_file_prints_table_then_exits_2(base, tmp_path):
    _, blob, off = base
    s, _ = off["tensor_data"]["blk.1.attn_q.bias"]
    p = _write(tmp_path, blob[:s + 10])
    missing = len(blob) - s - 10

    res = CliRunner().invoke(cli, ["inspect", p])
    assert res.exit_code == 2
    assert "k_bias_l2" in res.output and "qwen2" in res.output          # the structure is still printed
    assert res.output.strip().splitlines()[-1] == _expected_cli_error(p, missing)

    proc = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", p, "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert report["missing_bytes"] == missing and len(report["missing"]) == 5
    assert proc.stderr.strip().splitlines() == [_expected_cli_error(p, missing)]


def test_cli_inspect_file_truncated_only_in_other_tensors_exits_2(base, tmp_path):
    # no bias is cut, but the file is still truncated: exit 2 naming the tensor (issue 16: this
    # used to exit 0 with "missing": []); --allow-truncated gives exit 0 and the same structure
    _, blob, off = base
    p = _write(tmp_path, blob[:-100])               # only output_norm.weight is cut
    proc = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", p, "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {p}: file is truncated: 100 bytes missing; 1 tensor(s) lie past the end of the "
                           "file (output_norm.weight) (--allow-truncated exits 0 with the structure only)\n")
    report = json.loads(proc.stdout)
    assert report["missing"] == [{"tensor": "output_norm.weight", "reason": "data lies past the end of the (truncated) file"}]
    assert report["missing_bytes"] == 100
    ok = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", p, "--allow-truncated"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    out = " ".join((ok.stdout + ok.stderr).split())     # a piped table wraps long cells (never cuts them)
    assert ("file is truncated: 100 bytes of tensor data are missing; 1 of 27 tensor(s) lie past the end of the file "
            "(first 'output_norm.weight')") in out


def test_bad_magic_and_version(base, tmp_path):
    _, blob, _ = base
    p = _write(tmp_path, b"GGUX" + blob[4:])
    assert str(_open_error(p).value) == f"{p}: not a GGUF file: magic is b'GGUX', expected b'GGUF'"
    p = _write(tmp_path, _patch(blob, 4, "<I", 1))
    assert str(_open_error(p).value) == f"{p}: unsupported GGUF version 1 (supported: 2, 3)"
    p = _write(tmp_path, _patch(blob, 4, ">I", 3))
    assert str(_open_error(p).value) == f"{p}: big-endian GGUF (version 3) is not supported"
    p = _write(tmp_path, b"GG")
    assert str(_open_error(p).value) == f"{p}: not a GGUF file: only 2 bytes, too short for the 4-byte magic"


def test_huge_counts_are_rejected_without_allocating(base, tmp_path):
    _, blob, off = base
    n = len(blob)
    p = _write(tmp_path, _patch(blob, 8, "<Q", 2**60))
    assert str(_open_error(p).value) == (
        f"{p}: header declares 1,152,921,504,606,846,976 tensors and 18 key-value pairs, which need at least "
        f"27,670,116,110,564,327,682 bytes, but the file has {n:,} (corrupt count or truncated file)")
    p = _write(tmp_path, _patch(blob, 16, "<Q", 2**60))
    assert "1,152,921,504,606,846,976 key-value pairs" in str(_open_error(p).value)
    v = off["kv_value"]["tokenizer.ggml.tokens"]
    p = _write(tmp_path, _patch(blob, v + 4, "<Q", 2**60))
    e = _open_error(p)
    assert e.type is TruncatedError
    assert str(e.value) == (
        f"{p}: value of 'tokenizer.ggml.tokens': array of 1,152,921,504,606,846,976 STRING items needs at least "
        f"9,223,372,036,854,775,808 bytes, but only {n - v - 12:,} remain before the end of the file at byte {n:,} "
        "(truncated file or corrupt count)")
    v = off["kv_value"]["tokenizer.ggml.token_type"]
    p = _write(tmp_path, _patch(blob, v + 4, "<Q", 2**62))
    assert "array of 4,611,686,018,427,387,904 INT32 items" in str(_open_error(p).value)


def test_string_length_past_eof(base, tmp_path):
    _, blob, off = base
    v = off["kv_value"]["general.name"]
    p = _write(tmp_path, _patch(blob, v, "<Q", 2**40))
    e = _open_error(p)
    assert str(e.value) == (
        f"{p}: file is truncated or corrupt: reading the value of 'general.name' (1,099,511,627,776-byte string) at "
        f"byte {v + 8:,} needs 1,099,511,627,776 bytes, but the file ends at byte {len(blob):,} (inside the metadata, "
        f"key-value pair {_kv_index(off, 'general.name')} of 18 ('general.name'))")
    # a token string inside the big array
    v = off["kv_value"]["tokenizer.ggml.tokens"]
    p = _write(tmp_path, _patch(blob, v + 12, "<Q", 2**50))
    assert str(_open_error(p).value) == (
        f"{p}: file is truncated or corrupt: reading the value of 'tokenizer.ggml.tokens'[0] "
        f"(1,125,899,906,842,624-byte string) at byte {v + 20:,} needs 1,125,899,906,842,624 bytes, but the file ends "
        f"at byte {len(blob):,} (inside the metadata, key-value pair {_kv_index(off, 'tokenizer.ggml.tokens')} of 18 "
        "('tokenizer.ggml.tokens'))")


def test_unknown_value_type(base, tmp_path):
    _, blob, off = base
    k = off["kv"]["qwen2.block_count"]
    p = _write(tmp_path, _patch(blob, off["kv_value"]["qwen2.block_count"] - 4, "<I", 13))
    assert str(_open_error(p).value) == f"{p}: metadata key 'qwen2.block_count' has unknown value type 13 (known: 0-12)"
    assert k < off["kv_value"]["qwen2.block_count"]


def test_unknown_ggml_type_is_reported_per_tensor(base, tmp_path):
    _, blob, off = base
    name = "blk.0.ffn_up.weight"
    # 77: no ggml type, and outside ik_llama.cpp's ids (those are refused: tests/test_gguf_ik_llama.py)
    p = _write(tmp_path, _patch(blob, off["tensor_type"][name], "<I", 77))
    with open_checkpoint(p) as ck:
        info = ck.tensors[name]
        assert info.dtype == "UNKNOWN_77" and not info.missing
        assert ck.warnings == [f"tensor '{name}' has unknown ggml type id 77: it is listed, but its size and values are unknown"]
        with pytest.raises(FormatError) as e:
            ck.read(name)
        assert str(e.value) == f"{p}: tensor '{name}': has unknown ggml type id 77; its data cannot be read"
        assert ck.read("blk.0.attn_q.bias").shape == (64,)
    r = inspect(p)                                  # not fatal to inspect: the biases are readable
    assert r.tensor_types[name] == "UNKNOWN_77" and r.layers_with_qkv_bias == 2
    assert any("unknown ggml type id 77" in w for w in r.warnings)


def test_misaligned_and_overlapping_offsets(base, tmp_path):
    _, blob, off = base
    name = "blk.0.attn_k.bias"
    rel = off["tensor_data"][name][0] - off["data_start"]
    p = _write(tmp_path, _patch(blob, off["tensor_offset"][name], "<Q", rel + 4))
    assert str(_open_error(p).value) == f"{p}: tensor '{name}': data offset {rel + 4} is not a multiple of the alignment 32"
    # point attn_k.weight at attn_k.bias's data
    other = "blk.0.attn_k.weight"
    p = _write(tmp_path, _patch(blob, off["tensor_offset"][other], "<Q", rel))
    e = _open_error(p)
    ob = off["tensor_data"][other][1] - off["tensor_data"][other][0]
    bb = off["tensor_data"][name][1] - off["tensor_data"][name][0]
    assert str(e.value) == (f"{p}: tensor '{other}': data bytes [{rel}, {rel + ob}) overlap tensor '{name}' "
                            f"(which ends at {rel + bb})")


def test_other_header_corruptions(base, tmp_path):
    _, blob, off = base
    name = "blk.0.attn_q.bias"
    ndims_at = off["tensor_info"][name] + 8 + len(name)
    p = _write(tmp_path, _patch(blob, ndims_at, "<I", 5))
    assert str(_open_error(p).value) == f"{p}: tensor '{name}': has 5 dimensions (1 to 4 allowed)"
    # a row length that is not whole blocks: claim Q4_K (256-element blocks) for a 64-element bias
    p = _write(tmp_path, _patch(blob, off["tensor_type"][name], "<I", 12))
    assert str(_open_error(p).value) == f"{p}: tensor '{name}': row length 64 is not a multiple of the Q4_K block size 256"
    # duplicate tensor name: rename attn_k.bias (same length) to attn_q.bias
    at = off["tensor_info"]["blk.0.attn_k.bias"] + 8
    b = bytearray(blob)
    b[at:at + len(name)] = name.encode()
    p = _write(tmp_path, bytes(b))
    first, second = sorted((_tensor_index(off, name), _tensor_index(off, "blk.0.attn_k.bias")))
    assert str(_open_error(p).value) == (f"{p}: tensor '{name}': tensor table lists this tensor twice "
                                         f"(entries {first} and {second})")
    # duplicate metadata key: rename 'qwen2.context_length' to the equally long 'tokenizer.ggml.model'
    first, dup = sorted(("tokenizer.ggml.model", "qwen2.context_length"), key=lambda k: off["kv"][k])
    b = bytearray(blob)
    b[off["kv"][dup] + 8:off["kv"][dup] + 8 + len(dup)] = first.encode()
    p = _write(tmp_path, bytes(b))
    assert str(_open_error(p).value) == (f"{p}: metadata key '{first}' appears twice (pairs at bytes {off['kv'][first]} "
                                         f"and {off['kv'][dup]})")
    # general.alignment of the wrong type
    w_path = tmp_path / "align64.gguf"
    w = gguf.GGUFWriter(str(w_path), "llama")
    w.add_uint64("general.alignment", 32)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    assert str(_open_error(str(w_path)).value) == f"{w_path}: general.alignment must be a UINT32, not UINT64"
    # alignment that is not a power of two
    w_path = tmp_path / "align.gguf"
    w = gguf.GGUFWriter(str(w_path), "llama")
    w.add_uint32("general.alignment", 48)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    assert str(_open_error(str(w_path)).value) == f"{w_path}: general.alignment 48 is not a power of two"


def test_custom_alignment_is_honoured(tmp_path):
    path = tmp_path / "a64.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.data_alignment = 64
    w.add_uint32("general.alignment", 64)
    w.add_tensor("a", np.arange(3, dtype=np.float32))
    w.add_tensor("b", np.arange(5, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    ref = gguf.GGUFReader(str(path))
    with GGUFFile(path) as g:
        assert g.header.alignment == 64 and g.header.data_start == ref.data_offset and g.header.data_start % 64 == 0
        assert g.tensors["b"].start == ref.tensors[1].data_offset and (g.tensors["b"].start - g.header.data_start) % 64 == 0
        assert g.read(g.tensors["b"]).tolist() == [0, 1, 2, 3, 4]


def test_checkpoint_contract(written):
    _, path = written("qwen2")
    with open_checkpoint(path) as ck:
        assert ck.format == "gguf" and ck.naming == "gguf" and ck.gguf_arch == "qwen2"
        assert ck.source == str(path) and ck.config_path == str(path) and ck.files == (str(path),)
        info = ck.tensors["blk.0.attn_q.weight"]
        assert info.shape == (64, 64) and info.dtype == "F32" and info.file == str(path) and not info.quantized
        before = ck.bytes_read
        assert ck.read("blk.0.attn_q.bias").dtype == np.float32
        assert ck.bytes_read == before + 64 * 4
        assert ck.file_summary["architecture"] == "qwen2" and ck.file_summary["vocab_size"] == 448
        assert ck.file_summary["file_type"] == "ALL_F32" and ck.file_summary["tokenizer_model"] == "gpt2"


def test_folder_with_one_gguf_opens_it(written, tmp_path):
    _, path = written("gpt2")
    d = tmp_path / "folder"
    d.mkdir()
    shutil.copy(path, d / "model.gguf")
    with open_checkpoint(d) as ck:
        assert ck.format == "gguf" and ck.gguf_arch == "gpt2"
        assert config_from_gguf(ck.metadata, ck.tensors)["tie_word_embeddings"] is True


@pytest.mark.parametrize("name", ["qwen2", "llama_bias", "gpt2", "phi"])
def test_written_gguf_runs_in_llama_cpp_like_transformers(written, name):
    """The fixture writer's files are real GGUFs: llama.cpp loads them and its logits match the
    transformers forward pass of the source model, so the llama Q/K permutation, the GPT-2
    transposes and the biases are what llama.cpp expects (the premise of the parity tests above).

    Tolerance 1e-3 on logits of magnitude ~0.5: both run float32, but llama.cpp accumulates
    matmuls in a different order (and uses its own rope/softmax kernels); measured ~1.3e-4.
    """
    import llama_cpp
    import torch
    import transformers

    src, path = written(name)
    toks = [3, 10, 20, 30, 40, 7]
    m = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
    try:
        m.eval(toks)
        ours = np.array(m.scores[:len(toks)])
    finally:
        m.close()
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([toks])).logits[0].numpy()
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(ours, ref, atol=1e-3, rtol=0)


# ------------------------------------------------------------------ ggml's layout rule (issue 24)


def _swap_first_two_tensors(src: Path, dst: Path) -> tuple[str, str, int]:
    """``src`` with the data of its first two tensors (in tensor-info order) stored the other way
    round, their offsets changed to match: every value still reads right, but the data is not in
    tensor-info order, which ggml's loader refuses.  -> (first name, second name, first's new offset)."""
    from ckpt_surgeon.formats.gguf import read_header
    h = read_header(src)
    buf = bytearray(src.read_bytes())
    (na, ia), (nb, ib) = list(h.tensors.items())[:2]

    def pad(n):
        return (n + h.alignment - 1) // h.alignment * h.alignment
    assert ia.start == h.data_start and ib.start == h.data_start + pad(ia.nbytes)
    da, db = bytes(buf[ia.start:ia.end]), bytes(buf[ib.start:ib.end])
    span = pad(ia.nbytes) + pad(ib.nbytes)
    block = db + b"\0" * (pad(ib.nbytes) - len(db)) + da + b"\0" * (pad(ia.nbytes) - len(da))
    buf[h.data_start:h.data_start + span] = block

    def offset_field(name: str, n_dims: int) -> int:
        key = struct.pack("<Q", len(name)) + name.encode()
        at = buf.index(key, 0, h.header_end)
        return at + len(key) + 4 + 8 * n_dims + 4
    struct.pack_into("<Q", buf, offset_field(na, len(ia.shape)), pad(ib.nbytes))
    struct.pack_into("<Q", buf, offset_field(nb, len(ib.shape)), 0)
    dst.write_bytes(bytes(buf))
    return na, nb, pad(ib.nbytes)


def test_data_out_of_tensor_info_order_warned_linted_refused_by_ggml_never_written(tiny, tmp_path):
    """In 3,000 mutated GGUFs compared with ggml's parser this was the one case we accepted
    silently: ggml's loader requires tensor i's data where tensor i-1's padded data ends."""
    from ckpt_surgeon.analysis.lint import lint
    src = write_gguf(tiny("llama_bias"), tmp_path / "ok.gguf")
    bad = tmp_path / "swapped.gguf"
    first, second, offset = _swap_first_two_tensors(src, bad)
    msg = (f"tensor '{first}' has data offset {offset}, but ggml's loader expects 0 (tensor data must follow the "
           "tensor-info order, each tensor padded to 32 bytes): llama.cpp refuses to load this file")
    with open_checkpoint(src) as a, open_checkpoint(bad) as b:
        assert b.warnings == [msg] and not a.warnings
        for n in (first, second):       # the values still read right: other readers accept the file
            assert np.array_equal(a.read(n), b.read(n))
    rep = inspect(bad)
    assert msg in rep.warnings
    found = [f for f in lint(bad).findings if f.check == "ggml-layout"]
    assert [(f.severity, f.file, f.tensor, f.message) for f in found] == [("error", str(bad), first, msg)]
    assert not [f for f in lint(src).findings if f.check == "ggml-layout"]
    # ggml itself refuses it, with the numbers we give
    code = ("import sys, llama_cpp\n"
            "try:\n    llama_cpp.Llama(model_path=sys.argv[1], n_ctx=32, verbose=True)\n"
            "except ValueError:\n    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True)
    assert r.returncode == 3 and f"tensor '{first}' has offset {offset}, expected 0" in r.stderr, r.stderr[-800:]
    # ... and what we write from it follows ggml's rule, and llama.cpp loads it
    res = CliRunner().invoke(cli, ["fold-bias", str(bad), "-o", str(tmp_path / "folded.gguf"), "--v"])
    assert res.exit_code == 0, res.output
    with open_checkpoint(tmp_path / "folded.gguf") as ck:
        assert not ck.warnings
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "folded.gguf")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-800:]


def _every_command():
    """(argv prefix, command) of every runnable command, found in the click tree (new ones included)."""
    import click
    todo = [((), cli)]
    while todo:
        prefix, group = todo.pop()
        for name, cmd in sorted(group.commands.items()):
            if isinstance(cmd, click.Group):
                todo.append((prefix + (name,), cmd))
            else:
                yield prefix + (name,), cmd


def test_every_command_refuses_a_truncated_gguf_alike(base, tmp_path):
    """Issue 36: analyze reported a truncated GGUF with exit 0 (layer 1 all '-') while inspect,
    convert and lint exited 2.  Every command that reads a SOURCE now exits 2 with one line on
    stderr naming the file and the cut (inspect still prints the structure on stdout first)."""
    import click
    from ckpt_surgeon.cli.paths import role
    _, blob, off = base
    s, _ = off["tensor_data"]["blk.1.attn_q.bias"]
    p = _write(tmp_path, blob[:s + 10])
    ran = []
    for prefix, cmd in _every_command():
        args = [p for q in cmd.params if isinstance(q, click.Argument)]
        if not args:
            continue
        argv = [*prefix, *args]
        for q in cmd.params:
            if isinstance(q, click.Option) and q.required and role(q) in ("output", "into"):
                # a GGUF source: convert writes a folder, the surgeries a GGUF
                ext = "" if prefix == ("convert",) else ".gguf"
                argv += [max(q.opts, key=len), str(tmp_path / f"out-{'-'.join(prefix)}{ext}")]
        if prefix == ("fold-bias",):
            argv.append("--center")            # an operation to plan (the file is refused before it)
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 2, (argv, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {p}: file is truncated: "), (argv, res.stderr)
        assert "tensor(s) lie past the end of the file (blk.1.attn_q" in lines[0], (argv, lines[0])
        ran.append(" ".join(prefix))
    assert {"inspect", "analyze", "lint", "convert", "verify", "diff", "fold-bias", "qkv split", "qkv fuse"} <= set(ran)
    # GGUF -> GGUF convert (the requantizer) gives the same line (issue 50 item 9: "is truncated (N bytes missing)")
    res = CliRunner().invoke(cli, ["convert", p, "-o", str(tmp_path / "out-q8.gguf"), "--dtype", "q8_0"])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {p}: file is truncated: "), res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "lie past the end of the file (blk.1.attn_q" in res.stderr
    assert not [q for q in tmp_path.iterdir() if q.name.startswith("out")]      # nothing written
