"""Hostile input (issue 16): every case an audit found becomes a regression test with its exact
message; every parser is fuzzed with a fixed seed; killed writers leave nothing behind.

Bad input is one line naming the file (and tensor) and what is wrong, exit code 2, nothing
written: no traceback, no hang, no leftover.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks import fuzz
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.formats.safetensors import DTYPE_BITS

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI as a subprocess (exit code, stderr); a hang fails the test by the timeout."""
    return subprocess.run([sys.executable, "-m", "ckpt_surgeon", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _one_line_exit_2(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: {message}\n"                  # one line, no traceback


def _header_file(path: Path, header: bytes, data: bytes = b"\0" * 4) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _folder(tmp_path: Path, config: dict | str | None = None, *, name: str = "m") -> Path:
    """A qwen2-shaped folder (model.safetensors + config.json) built without transformers."""
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(fuzz.safetensors_bytes(fuzz.qwen2_tensors()))
    cfg = fuzz.QWEN2_CONFIG if config is None else config
    (d / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return d


# --------------------------------------------------------------------------- tracebacks -> one line

def test_safetensors_dtype_given_as_a_list(tmp_path):
    p = _header_file(tmp_path / "a.safetensors", b'{"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}')
    _one_line_exit_2(_cli("inspect", str(p)), f"{p}: tensor 'a': unknown dtype ['F32'] (known: {', '.join(DTYPE_BITS)})")


def test_10000_digit_integer_in_header_index_and_config(tmp_path):
    big = "1" * 10_000
    p = _header_file(tmp_path / "a.safetensors",
                     b'{"a": {"dtype": "F32", "shape": [' + big.encode() + b'], "data_offsets": [0, 4]}}')
    _one_line_exit_2(_cli("inspect", str(p)), f"{p}: header holds a number of 10,000 digits (at most 40 are accepted)")

    d = _folder(tmp_path, f'{{"model_type": "qwen2", "num_hidden_layers": {big}}}')
    _one_line_exit_2(_cli("inspect", str(d)),
                     f"{d / 'config.json'}: holds a number of 10,000 digits (at most 40 are accepted)")

    d = _folder(tmp_path, name="sharded")
    (d / "model.safetensors.index.json").write_text(f'{{"metadata": {{"total_size": {big}}}, "weight_map": {{}}}}')
    _one_line_exit_2(_cli("inspect", str(d)),
                     f"{d / 'model.safetensors.index.json'}: holds a number of 10,000 digits (at most 40 are accepted)")


def test_json_nested_100k_deep_in_header_and_config(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    p = _header_file(tmp_path / "a.safetensors", b'{"__metadata__": {"x": ' + deep + b'}}')
    _one_line_exit_2(_cli("inspect", str(p)),
                     f"{p}: header nests JSON objects/arrays 100,002 deep (at most 128 levels are accepted)")
    d = _folder(tmp_path, '{"model_type": "qwen2", "x": ' + deep.decode() + "}")
    _one_line_exit_2(_cli("inspect", str(d)),
                     f"{d / 'config.json'}: nests JSON objects/arrays 100,001 deep (at most 128 levels are accepted)")


def test_num_attention_heads_as_a_string(tmp_path):
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, num_attention_heads="4"))
    _one_line_exit_2(_cli("inspect", str(d)),
                     f"{d / 'config.json'}: num_attention_heads is '4' (a string); it must be an integer")


def test_model_type_as_a_list(tmp_path):
    """Found by the config fuzz target once model_type took precedence over the class name:
    a list reached transformers' config mapping (TypeError: unhashable type)."""
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, model_type=["F32"]))
    _one_line_exit_2(_cli("inspect", str(d)),
                     f"{d / 'config.json'}: model_type is ['F32'] (a list); it must be a string")


_POS = "it must be a finite positive number"
_F32 = "it must be a finite number above 0 and at most 3.40282e+38"


@pytest.mark.parametrize("command,extra,says", [
    # inspect's KV-cache figures (analysis/memory.py)
    ("inspect", {"kv_lora_rank": "x"}, "kv_lora_rank is 'x' (a string); it must be an integer"),
    ("inspect", {"kv_lora_rank": 8, "qk_rope_head_dim": [4]}, "qk_rope_head_dim is [4] (a list); it must be an integer"),
    ("inspect", {"sliding_window": [4]}, "sliding_window is [4] (a list); it must be an integer"),
    ("inspect", {"sliding_window": -1}, "sliding_window is -1; it must be between 0 and 1,099,511,627,776"),
    # the attention scale (analysis/layer_redundancy.py)
    ("analyze", {"query_pre_attn_scalar": "x"}, f"query_pre_attn_scalar is 'x' (a string); {_F32}"),
    ("analyze", {"attention_multiplier": 1e308}, f"attention_multiplier is 1e+308; {_F32}"),   # overflowed to inf
    # rope scaling, both spellings (arch/rope.py)
    ("analyze", {"rope_scaling": {"rope_type": "yarn", "factor": "x"}}, f"rope_scaling.factor is 'x' (a string); {_F32}"),
    ("inspect", {"rope_scaling": {"rope_type": "yarn", "factor": 4, "attention_factor": 1e300}},
     f"rope_scaling.attention_factor is 1e+300; {_F32}"),
    ("analyze", {"rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": -1, "mscale_all_dim": 1}},
     "rope_scaling.mscale is -1; it must be a finite number between 0 and 3.40282e+38"),
    ("analyze", {"rope_scaling": {"rope_type": "longrope", "short_factor": ["a"], "long_factor": [1, 1]}},
     "rope_scaling.short_factor is ['a'] (a list); it must be a list of finite positive numbers"),
    ("analyze", {"rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 1}},
     "rope_scaling.original_max_position_embeddings is 1; it must be between 2 and 1,099,511,627,776"),
    ("analyze", {"rope_parameters": {"full_attention": {"rope_theta": 1e4},
                                     "sliding_attention": {"rope_theta": "1e4"}}},
     f"rope_parameters.sliding_attention.rope_theta is '1e4' (a string); {_POS}"),
    # architectures (read as class names by every command)
    ("analyze", {"architectures": "Qwen2ForCausalLM"},
     "architectures is 'Qwen2ForCausalLM' (a string); it must be a list of class names (strings)"),
])
def test_config_value_read_by_inspect_or_analyze_is_checked(tmp_path, command, extra, says):
    """Values only inspect's memory figures or analyze's bound read (they used to end in a
    ValueError / TypeError traceback from ``int()`` / ``float()``)."""
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, **extra))
    _one_line_exit_2(_cli(command, str(d)), f"{d / 'config.json'}: {says}")


def test_rope_scaling_values_that_are_valid_still_analyze(tmp_path):
    for i, rope in enumerate(({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                               "mscale": 1.0, "mscale_all_dim": 0.7},
                              {"rope_type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [2, 3],
                               "original_max_position_embeddings": 32})):
        d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, rope_scaling=rope, sliding_window=64), name=f"m{i}")
        r = CliRunner().invoke(cli, ["analyze", str(d), "--format", "json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["rope"]["rope_type"] == rope["rope_type"]


def test_lone_surrogate_tensor_name_in_fold_bias(tmp_path):
    p = _header_file(tmp_path / "a.safetensors", b'{"a\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
    out = tmp_path / "out"
    _one_line_exit_2(_cli("fold-bias", str(p), "-o", str(out), "--k"),
                     f"{p}: header holds the string 'a\\ud800' with a lone surrogate (\\u escape of half a UTF-16 "
                     "pair), which is not valid Unicode")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.safetensors"]      # nothing written


@pytest.mark.parametrize("flag", [[], ["--allow-truncated"]])
def test_truncated_safetensors_is_refused_with_or_without_allow_truncated(tmp_path, flag):
    """--allow-truncated is GGUF's (README, --help): a safetensors file whose data is shorter than
    its header promises fails header validation, one line, exit 2, either way."""
    d = _folder(tmp_path)
    p = d / "model.safetensors"
    os.truncate(p, p.stat().st_size - 10)
    _one_line_exit_2(_cli("inspect", str(p), *flag),
                     f"{p}: file is truncated: the header promises 8640 bytes of data but only 8630 are present "
                     "(10 bytes missing; 1 tensor(s) affected, first 'model.layers.1.input_layernorm.weight')")
    r = CliRunner().invoke(cli, ["inspect", "--help"])
    assert "A truncated safetensors file is refused either way" in " ".join(r.output.split())


def test_gguf_string_length_2_pow_63(tmp_path):
    blob = fuzz.gguf_bytes(fuzz.qwen2_gguf_kvs(), fuzz.qwen2_gguf_tensors())
    # the length prefix of token 't1' inside tokenizer.ggml.tokens (the vectorised string-array pass)
    at = blob.index(struct.pack("<Q", 2) + b"t1")
    p = tmp_path / "m.gguf"
    p.write_bytes(blob[:at] + struct.pack("<Q", 2 ** 63) + blob[at + 8:])
    _one_line_exit_2(_cli("inspect", str(p)),
                     f"{p}: file is truncated or corrupt: reading the value of 'tokenizer.ggml.tokens'[1] "
                     f"(9,223,372,036,854,775,808-byte string) at byte {at + 8:,} needs 9,223,372,036,854,775,808 "
                     f"bytes, but the file ends at byte {len(blob):,} (inside the metadata, key-value pair 11 of 12 "
                     "('tokenizer.ggml.tokens'))")


def test_metadata_values_must_be_strings(tmp_path):
    p = _header_file(tmp_path / "a.safetensors",
                     b'{"__metadata__": {"format": 1}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
    _one_line_exit_2(_cli("inspect", str(p)),
                     f"{p}: __metadata__ value of 'format' is a number; the safetensors format allows only strings")


def test_bad_gguf_magic_is_named_for_what_it_looks_like(tmp_path):
    blob = fuzz.gguf_bytes(fuzz.qwen2_gguf_kvs(), fuzz.qwen2_gguf_tensors())
    damaged = b"GGUX" + blob[4:]
    named = tmp_path / "m.gguf"
    named.write_bytes(damaged)
    _one_line_exit_2(_cli("inspect", str(named)), f"{named}: not a GGUF file: magic is b'GGUX', expected b'GGUF'")
    _one_line_exit_2(_cli("convert", str(named), "-o", str(tmp_path / "hf")),
                     f"{named}: not a GGUF file: magic is b'GGUX', expected b'GGUF'")
    anon = tmp_path / "model.bin"
    anon.write_bytes(damaged)
    looks = ("is not a safetensors, GGUF or pickle file: it starts like a GGUF file with a damaged magic (bytes 4-7 "
             "read as GGUF version 3, but the magic is b'GGUX', not b'GGUF'); first bytes "
             f"{damaged[:16]!r} ...")
    _one_line_exit_2(_cli("inspect", str(anon)), f"{anon}: {looks}")
    r = _cli("convert", str(anon), "-o", str(tmp_path / "x.gguf"))
    _one_line_exit_2(r, f"{anon}: {looks}")
    assert "HF model" not in r.stderr and not (tmp_path / "x.gguf").exists()


# --------------------------------------------------------------------------- hangs

def test_weight_map_naming_a_fifo_does_not_block(tmp_path):
    d = _folder(tmp_path)
    os.mkfifo(d / "pipe.safetensors")
    first = next(iter(fuzz.qwen2_tensors()))
    wm = {n: "model.safetensors" for n in fuzz.qwen2_tensors()}
    wm[first] = "pipe.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    _one_line_exit_2(_cli("inspect", str(d), timeout=60),
                     f"{d / 'model.safetensors.index.json'}: tensor '{first}': weight_map names 'pipe.safetensors', "
                     "which is a FIFO (named pipe), not a regular file; only regular files are read")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_fifo_or_folder_in_place_of_a_file_does_not_block(tmp_path, name):
    d = _folder(tmp_path)
    (d / name).unlink()
    os.mkfifo(d / name)
    _one_line_exit_2(_cli("inspect", str(d), timeout=60),
                     f"{d / name}: is a FIFO (named pipe), not a regular file; only regular files are read")
    (d / name).unlink()
    (d / name).mkdir()
    r = _cli("inspect", str(d), timeout=60)
    if name == "config.json":
        _one_line_exit_2(r, f"{d / name}: is a folder, not a regular file; only regular files are read")
    else:       # no model.safetensors file: the folder's *.safetensors glob finds the folder
        _one_line_exit_2(r, f"{d / name}: is a folder, not a regular file; only regular files are read")


def test_side_file_fifo_does_not_block_fold_bias(tiny, tmp_path):
    src = tmp_path / "gpt2"
    shutil.copytree(tiny("gpt2"), src)
    os.mkfifo(src / "notes.txt")
    out = tmp_path / "out"
    _one_line_exit_2(_cli("fold-bias", str(src), "-o", str(out), "--k", timeout=120),
                     f"{src / 'notes.txt'}: side file is a FIFO (named pipe), not a regular file; only regular "
                     "files are read")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["gpt2"]


def test_a_trillion_layers_is_refused_before_any_loop(tmp_path):
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, num_hidden_layers=1_000_000_000_000))
    _one_line_exit_2(_cli("inspect", str(d), timeout=60),
                     f"{d / 'config.json'}: num_hidden_layers is 1,000,000,000,000; it must be between 0 and 100,000")


# --------------------------------------------------------------------------- config <-> tensors

_TOO_MANY = ("the config counts 3 layers, but layer 2 has no tensors (tensors exist for 2 layer(s), the last "
             "being layer 1): a truncated download, a missing shard or a wrong layer count")


@pytest.mark.parametrize("command", ["inspect", "analyze", "fold-bias", "qkv", "convert", "verify", "diff"])
def test_more_layers_in_the_config_than_in_the_tensors(tiny, tmp_path, command):
    src = tmp_path / "gpt2"
    shutil.copytree(tiny("gpt2"), src)
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["n_layer"] == 2
    (src / "config.json").write_text(json.dumps(dict(cfg, n_layer=3)))
    out = tmp_path / "out"
    args = {"inspect": ["inspect", str(src)], "analyze": ["analyze", str(src)],
            "fold-bias": ["fold-bias", str(src), "-o", str(out), "--k", "--v"],
            "qkv": ["qkv", "split", str(src), "-o", str(out)],
            "convert": ["convert", str(src), "-o", str(out) + ".gguf"],
            "verify": ["verify", str(src), str(src)], "diff": ["diff", str(src), str(tiny("gpt2"))]}[command]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1] == f"error: {src / 'config.json'}: {_TOO_MANY}"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["gpt2"]             # nothing written


def test_more_layers_in_gguf_metadata_than_tensors(tmp_path):
    blob = fuzz.gguf_bytes(fuzz.qwen2_gguf_kvs(), fuzz.qwen2_gguf_tensors())
    at = blob.index(b"qwen2.block_count") + len("qwen2.block_count") + 4
    p = tmp_path / "m.gguf"
    p.write_bytes(blob[:at] + struct.pack("<I", 3) + blob[at + 4:])
    for args in (["inspect", str(p)], ["convert", str(p), "-o", str(tmp_path / "hf")]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, res.output
        assert res.output.strip().splitlines()[-1] == f"error: {p}: {_TOO_MANY}"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]


def test_hidden_size_doubled_and_zero_heads_on_llama(tiny, tmp_path):
    src = tmp_path / "llama"
    shutil.copytree(tiny("llama"), src)
    cfg = json.loads((src / "config.json").read_text())
    hidden, heads, head_dim = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    (src / "config.json").write_text(json.dumps(dict(cfg, hidden_size=2 * hidden)))
    res = CliRunner().invoke(cli, ["inspect", str(src)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1] == (
        f"error: {src / 'config.json'}: tensor 'model.layers.0.self_attn.q_proj.weight': config says hidden_size = "
        f"{2 * hidden}, but the tensor has shape [{heads * head_dim}, {hidden}] (columns: {hidden})")
    (src / "config.json").write_text(json.dumps(dict(cfg, num_attention_heads=0)))
    res = CliRunner().invoke(cli, ["inspect", str(src)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1] == (
        f"error: {src / 'config.json'}: num_attention_heads is 0; it must be between 1 and 16,777,216")


def _split_part(tmp_path: Path, name: str, kind: str, count: int) -> Path:
    p = tmp_path / name
    p.write_bytes(fuzz.gguf_bytes(fuzz.qwen2_gguf_kvs([("split.no", "u16", 0), ("split.count", kind, count)]),
                                  fuzz.qwen2_gguf_tensors()))
    return p


@pytest.mark.parametrize("kind,count,says", [
    # a 4-billion-name list of parts used to be built before any part was looked for
    ("u32", 2 ** 32 - 1, "split.count is 4,294,967,295, over the 99,999 parts a split GGUF can have (part numbers "
                         "in names are 5 digits)"),
    ("u64", 2 ** 64 - 1, "metadata key 'split.count' must be an unsigned integer of at most 32 bits (gguf-split "
                         "writes UINT16), not UINT64"),
    ("i32", 3, "metadata key 'split.count' must be an unsigned integer of at most 32 bits (gguf-split writes "
               "UINT16), not INT32"),
])
def test_split_count_out_of_range_or_of_the_wrong_type(tmp_path, kind, count, says):
    p = _split_part(tmp_path, f"m-00001-of-{count:05d}.gguf", kind, count)
    _one_line_exit_2(_cli("inspect", str(p)), f"{p}: {says}")


def test_split_count_at_the_limit_and_names_with_six_digit_counts(tmp_path):
    p = _split_part(tmp_path, "m-00001-of-99999.gguf", "u32", 99_999)
    _one_line_exit_2(_cli("inspect", str(p)),
                     f"{tmp_path / 'm-00002-of-99999.gguf'}: split part missing (expected beside {p.name})")
    # gguf-split never writes a 6-digit part count: such a name is an ordinary GGUF's, whatever it says
    from ckpt_surgeon.formats.gguf import group_gguf_names, parse_split_name
    big = "m-00001-of-" + "9" * 200 + ".gguf"
    assert parse_split_name(big) is None and parse_split_name("m-00001-of-100000.gguf") is None
    assert group_gguf_names([big, "m-00001-of-00002.gguf"]) == [("m-00001-of-00002.gguf",), (big,)]


def test_gguf_tensor_with_a_zero_dimension(tmp_path):
    t = fuzz.qwen2_gguf_tensors()
    blob = fuzz.gguf_bytes(fuzz.qwen2_gguf_kvs(), t)
    name = b"blk.0.attn_q.bias"
    at = blob.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4     # its ne[0]
    p = tmp_path / "m.gguf"
    p.write_bytes(blob[:at] + struct.pack("<Q", 0) + blob[at + 8:])
    _one_line_exit_2(_cli("inspect", str(p)),
                     f"{p}: tensor 'blk.0.attn_q.bias': has a zero dimension ([0], innermost first): an empty tensor "
                     "is not a model weight")


# --------------------------------------------------------------------------- converter hyper-parameters

def _gguf_with(tmp_path: Path, key: str, kind: str, value) -> Path:
    """The fuzz seed GGUF (qwen2-shaped) with one metadata key set to ``value`` of GGUF type ``kind``."""
    kvs = [kv for kv in fuzz.qwen2_gguf_kvs() if kv[0] != key] + [(key, kind, value)]
    p = tmp_path / "m.gguf"
    p.write_bytes(fuzz.gguf_bytes(kvs, fuzz.qwen2_gguf_tensors()))
    return p


_INT = "it must be an integer"
_COUNT = "it must be between 1 and 16,777,216"


@pytest.mark.parametrize("key,kind,value,says", [
    ("qwen2.attention.head_count", "str", "4", f"is '4' (a string); {_INT}"),
    ("qwen2.attention.head_count", "i32", -4, f"is -4; {_COUNT}"),
    ("qwen2.attention.head_count_kv", "u64", 2 ** 64 - 1, f"is 18,446,744,073,709,551,615; {_COUNT}"),
    ("qwen2.feed_forward_length", "i32", -1, f"is -1; {_COUNT}"),
    # 0 heads / FFN width: an attention-free layer, which llama.cpp writes for Mamba and hybrids, never for a
    # registry family
    ("qwen2.attention.head_count_kv", "i32", 0, f"is 0; {_COUNT}"),
    ("qwen2.feed_forward_length", "i32s", [64, 0], f"is 0; {_COUNT}"),
    ("qwen2.block_count", "bool", True, f"is True (a boolean); {_INT}"),
    ("qwen2.context_length", "f32", 4.0, f"is 4.0 (a float); {_INT}"),
    ("qwen2.attention.layer_norm_rms_epsilon", "f32", float("nan"),
     "is nan (not a number); it must be a finite number between 0 and 1"),
    ("qwen2.rope.freq_base", "f32", -1.0, "is -1; it must be a finite number above 0 and at most 3.40282e+38"),
    ("qwen2.rope.freq_base", "str", "1e4", "is '1e4' (a string); it must be a finite number above 0 and at most "
                                          "3.40282e+38"),
    # read only by the converter's own hyper-parameters (hparams_from_gguf) and its special-token ids
    ("qwen2.attention.value_length", "str", "4", f"is '4' (a string); {_INT}"),
    ("tokenizer.ggml.unknown_token_id", "i32s", [1, 2], f"is [1, 2] (a list); {_INT}"),
])
def test_convert_gguf_hyper_parameter_checked_where_read(tmp_path, key, kind, value, says):
    p = _gguf_with(tmp_path, key, kind, value)
    out = tmp_path / "hf"
    _one_line_exit_2(_cli("convert", str(p), "-o", str(out)), f"{p}: GGUF metadata key '{key}' {says}")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]            # OUT not created


def test_convert_gguf_per_layer_head_counts_that_differ(tmp_path):
    p = _gguf_with(tmp_path, "qwen2.attention.head_count_kv", "i32s", [2, 1])
    _one_line_exit_2(_cli("convert", str(p), "-o", str(tmp_path / "hf")),
                     f"{p}: qwen2.attention.head_count_kv varies per layer ([2, 1] ...): not converted")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]


@pytest.mark.parametrize("key,value,says", [
    ("intermediate_size", "4", f"is '4' (a string); {_INT}"),
    ("num_key_value_heads", -2, f"is -2; {_COUNT}"),
    ("rms_norm_eps", float("nan"), "is nan (not a number); it must be a finite number between 0 and 1"),
    ("rms_norm_eps", -1e-6, "is -1e-06; it must be a finite number between 0 and 1"),
    ("sliding_window", True, f"is True (a boolean); {_INT}"),
    # llama.cpp stores counts as uint32: a context over 2**32 - 1 cannot be written
    ("max_position_embeddings", 2 ** 40, "is 1,099,511,627,776; it must be between 1 and 4,294,967,295"),
    ("partial_rotary_factor", 1.5, "is 1.5; it must be a finite number above 0 and at most 1"),
    ("original_max_position_embeddings", [64], f"is [64] (a list); {_INT}"),
])
def test_convert_config_hyper_parameter_checked_where_read(tmp_path, key, value, says):
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, **{key: value}))
    out = tmp_path / "m.gguf"
    _one_line_exit_2(_cli("convert", str(d), "-o", str(out)), f"{d / 'config.json'}: {key} {says}")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m"] and not out.exists()


def test_convert_config_value_transformers_cannot_build(tmp_path):
    """A value no hyper-parameter check knows (an activation name) fails in transformers' model
    build: one line naming config.json, not a KeyError traceback."""
    d = _folder(tmp_path, dict(fuzz.QWEN2_CONFIG, hidden_act="4"))
    _one_line_exit_2(_cli("convert", str(d), "-o", str(tmp_path / "m.gguf")),
                     f"{d / 'config.json'}: transformers cannot build a model from this config (KeyError: '4')")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m"]


def test_every_converter_hyper_parameter_has_bounds():
    """A GGUF key added to the converters' table without a type and range would be read unchecked."""
    from ckpt_surgeon.arch.checked import GGUF_BOUNDS
    from ckpt_surgeon.conversion import names as N
    from ckpt_surgeon.conversion.to_gguf import _hparam_bounds
    assert set(N.GGUF_HPARAM_KEYS.values()) <= set(GGUF_BOUNDS)
    assert [k for k in N.HF_HPARAM_KEYS if _hparam_bounds(k) is None] == [
        "tie", "layer_types", "query_pre_attn_scalar", "norm_topk_prob"]    # llama.cpp constants, compared


def test_token_ids_and_prompts_files_nested_deep_or_with_huge_numbers(tmp_path):
    """``verify --token-ids`` / ``--prompts`` JSON files get the shared parser's limits (they used
    to end in RecursionError / ValueError tracebacks)."""
    from ckpt_surgeon.verification.prompts import load_prompts, load_token_ids
    deep, big = tmp_path / "deep.json", tmp_path / "big.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    big.write_text("[[" + "9" * 5000 + "]]")
    for load, what in ((load_token_ids, "token ids file"), (load_prompts, "prompts file")):
        with pytest.raises(CkptError) as e:
            load(deep)
        assert str(e.value) == f"{deep}: {what} nests JSON objects/arrays 100,000 deep (at most 128 levels are accepted)"
        with pytest.raises(CkptError) as e:
            load(big)
        assert str(e.value) == f"{big}: {what} holds a number of 5,000 digits (at most 40 are accepted)"


def test_prompts_file_over_the_size_limit_or_a_fifo(tmp_path):
    """``--prompts`` / ``--token-ids`` files are read through safe_input: a regular file of at most
    16 MiB (it was read whole, whatever its size; a FIFO blocked)."""
    from ckpt_surgeon.analysis.prompts import MAX_TEXT_FILE
    d = _folder(tmp_path)
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(MAX_TEXT_FILE + 1)                     # sparse: no 16 MiB written
    _one_line_exit_2(_cli("analyze", str(d), "--measure", "--prompts", str(big)),
                     f"{big}: prompts file is 16,777,217 bytes, over the 16,777,216-byte limit for this kind of file")
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    _one_line_exit_2(_cli("verify", str(d), str(d), "--token-ids", str(fifo), timeout=60),
                     f"{fifo}: token ids file is a FIFO (named pipe), not a regular file; only regular files are read")


def test_hub_cache_files_corrupt_or_hostile_are_a_cache_miss(tmp_path):
    """files.json / meta.json / refs in the Hub cache are parsed with safe_input's limits; a
    100k-deep, 10,000-digit, non-object or FIFO entry is a miss (fetched again), not a RecursionError."""
    from ckpt_surgeon.formats.hub.range_cache import RepoCache
    sha = "a" * 40
    cache = RepoCache(tmp_path, "owner/name")
    store_dir = cache.dir / sha / "files" / "model.safetensors"
    store_dir.mkdir(parents=True)
    (cache.dir / "refs").mkdir()
    for bad in ("[" * 100_000 + "]" * 100_000, "[" + "9" * 10_000 + "]", "[1, 2]", "{", "FIFO"):
        for f in (cache.dir / sha / "files.json", store_dir / "meta.json", cache.dir / "refs" / "main"):
            f.unlink(missing_ok=True)
            if bad == "FIFO":
                os.mkfifo(f)
            else:
                f.write_text(bad)
        assert cache.listing(sha) is None
        assert cache.store(sha, "model.safetensors").meta == {}
        assert cache.ref("main") is None
    (cache.dir / sha / "files.json").unlink()
    cache.set_listing(sha, ["config.json"])
    assert cache.listing(sha) == ["config.json"]
    # values of the right JSON shape but the wrong type or range are dropped, not used
    meta = store_dir / "meta.json"
    meta.unlink()
    for bad in ({"size": "12"}, {"size": -1}, {"size": 1 << 60}, {"size": True}, {"header_len": 1.5}, {"full": 1}):
        meta.write_text(json.dumps(dict(bad, etag="x")))
        assert cache.store(sha, "model.safetensors").meta == {"etag": "x"}, bad
        meta.unlink()
    meta.write_text(json.dumps({"size": 1234, "header_len": 80, "full": False}))
    assert cache.store(sha, "model.safetensors").meta == {"size": 1234, "header_len": 80, "full": False}


# --------------------------------------------------------------------------- leftovers of killed runs

def _run_paused(args: list[str], stage: str, marker: Path) -> subprocess.Popen:
    env = dict(ENV, CKPT_SURGEON_PAUSE_AT=stage, CKPT_SURGEON_PAUSE_FILE=str(marker))
    pause_at = Path(__file__).resolve().parent / "pause_at.py"   # the writer pauses at `stage` there
    p = subprocess.Popen([sys.executable, str(pause_at), "-m", "ckpt_surgeon", *args], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 180
    while not marker.exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the writer never reached the stage"
        time.sleep(0.02)
    return p


@pytest.mark.parametrize("command", ["fold-bias", "convert", "convert-to-gguf"])
def test_killed_runs_leave_nothing_after_the_next_run(tiny, tmp_path, command):
    """SIGKILL at several points (once left unreaped: a zombie owner), then one normal run to the
    same OUT: OUT is complete and nothing else is left beside it."""
    out = tmp_path / "work" / "out"
    if command == "convert":
        from tests.gguf_util import write_gguf
        (tmp_path / "src").mkdir()
        src = write_gguf(tiny("qwen2"), tmp_path / "src" / "q.gguf")
        stages = ["temp-created", "shard-written:0", "before-rename"]
    elif command == "convert-to-gguf":                # HF folder -> one GGUF file (conversion/to_gguf.py)
        command, src, out = "convert", tiny("qwen2"), tmp_path / "work" / "out.gguf"
        stages = ["temp-created", "header-written", "shard-written:0", "before-rename"]
    else:
        src = tmp_path / "src"
        shutil.copytree(tiny("gpt2"), src)
        stages = ["temp-created", "data-copied:0", "shard-written:0", "before-rename"]
    out.parent.mkdir()
    args = [command, str(src), "-o", str(out)] + (["--k", "--v"] if command == "fold-bias" else [])
    zombie = None
    for i, stage in enumerate(stages):
        p = _run_paused(args, stage, tmp_path / f"paused{i}")
        os.killpg(p.pid, signal.SIGKILL)          # the process and any child it started
        if i == len(stages) - 1:
            zombie = p                            # not reaped before the next run
        else:
            p.wait()
    assert not out.exists()
    left = sorted(x.name for x in out.parent.iterdir())
    # each killed run already swept its dead predecessor's temp; the last one's (a zombie) is left
    assert len(left) == 1 and left[0].startswith(f".{out.name}.ckpt-surgeon-{zombie.pid}-"), left
    r = _cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(x.name for x in out.parent.iterdir()) == [out.name]
    zombie.wait()
    if out.suffix == ".gguf":                         # a correct OUT: reference bytes, tensors readable
        from ckpt_surgeon.checkpoint import open_checkpoint
        ref = tmp_path / "ref.gguf"
        assert _cli("convert", str(src), "-o", str(ref), timeout=300).returncode == 0
        assert out.read_bytes() == ref.read_bytes()
        with open_checkpoint(out) as ck:
            assert ck.layout().num_layers > 0 and all(ck.read(n).size for n in ck.tensors)


def test_stale_temps_of_every_writer_are_swept(tmp_path):
    """The publish module's sweep, as every writer uses it: a dead owner's temp goes, a live
    owner's (locked) temp stays, another destination's temp is not touched."""
    from ckpt_surgeon.publish import Staging, write_file_atomic
    dest = tmp_path / "report.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".report.json.ckpt-surgeon-{dead.pid}-0badc0de.tmp"
    stale.write_text("half a report")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    other = tmp_path / f".other.json.ckpt-surgeon-{dead.pid}-0badc0de.tmp"
    other.write_text("not ours")
    with Staging(dest, folder=True) as live:          # held by this (live) process
        write_file_atomic(dest, b"{}")
        assert dest.read_bytes() == b"{}"
        assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["report.json", other.name, live.path.name])
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["report.json", other.name])


# --------------------------------------------------------------------------- fuzzing

# A warning is a failure too (issue 50 item 11: a hostile FLOAT64 hyper-parameter overflowed numpy's float32 cast)
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("target,iterations", [("safetensors", 3000), ("gguf", 3000), ("index", 1000),
                                               ("config", 1000), ("gguf-split", 1000), ("gguf-hparams", 3000),
                                               ("config-hparams", 3000)])
def test_fuzz_every_failure_is_typed(tmp_path, target, iterations):
    # A config naming a model_type transformers implements goes to arch/derive, which imports
    # torch and transformers the first time: seconds once per process, not a per-input cost (the
    # benchmark's child imports them first too).
    import torch  # noqa: F401
    import transformers  # noqa: F401
    # No input may take over 2 s (issue 16's target; benchmarks/fuzz.py counts it as over_time)
    # nor hang: an iteration still running after 30 s is interrupted (SIGALRM) and counted as hung.
    res = fuzz.run_target(target, iterations, seed=16, workdir=tmp_path, max_seconds=2.0, hard_limit=30.0)
    assert res["untyped"] == 0 and res["memory_errors"] == 0, res["failures"]
    assert res["over_time"] == 0 and res["hung"] == 0, res["failures"]
    # the mutations reach both outcomes: a fuzzer that only ever fails (or never does) tests nothing
    assert res["ok"] > 0 and res["typed"] > iterations // 10, res


def test_float_beyond_float32_range_is_kept_without_a_cast_overflow():
    """A GGUF hyper-parameter stored as FLOAT64 beyond float32's range (1e300, -1e39) is kept as it is
    by f32_decimal's own range check: no float32 holds it, and numpy's cast never sees it."""
    import warnings

    import numpy as np

    from ckpt_surgeon.arch.gguf_config import f32_decimal
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f32_decimal(1e300) == 1e300 and f32_decimal(-1e39) == -1e39
        assert f32_decimal(float(np.float32(1e-5))) == 1e-05


def test_fuzz_mutators_produce_the_audit_cases():
    """The JSON mutator emits the hostile values the audit found (list dtype, 10,000 digits,
    100k-deep nesting, lone surrogate, a string count)."""
    rng = random.Random(0)
    seen = {fuzz._hostile_json_text(rng) for _ in range(2000)}
    assert '["F32"]' in seen and "9" * 10_000 in seen and "[" * 100_000 + "]" * 100_000 in seen
    assert json.dumps("\ud800") in seen and '"4"' in seen


def test_typed_error_is_the_only_outcome_of_parse_on_known_bad_bytes():
    from ckpt_surgeon.formats.gguf import parse_header
    from ckpt_surgeon.formats.safetensors import parse_header_bytes
    for bad in (b"", b"\0" * 7, b"GGUF", b"\xff" * 64, struct.pack("<Q", 2 ** 64 - 1) + b"{}"):
        with pytest.raises(CkptError):
            parse_header_bytes("x", bad, len(bad))
        buf = bad if bad[:4] == b"GGUF" else b"GGUF" + bad
        with pytest.raises(CkptError):
            parse_header(buf, "x", len(buf))
