"""Fuzz every parser of untrusted input; every failure must be the project's typed error.

Targets (one per parser): ``safetensors`` (header bytes), ``index`` (``model.safetensors.index.json``
of a sharded folder), ``config`` (``config.json`` of a tiny qwen2-shaped folder, through the
layout resolver and ``inspect``), ``gguf`` (header bytes, then the GGUF -> config mapping and the
resolver), ``gguf-split`` (one part of a two-part split set, opened as a set), and the converters'
own hyper-parameter reading: ``gguf-hparams`` (GGUF metadata values -> HF config, GGUF -> HF)
and ``config-hparams`` (config.json values -> GGUF keys, HF -> GGUF).

Each target starts from a valid seed built here (numpy and the standard library only; no model
download, no transformers) and mutates it: byte flips, integer fields set to boundary values
(0, 2**31, 2**63, 2**64 - 1), cuts, and JSON-aware replacements (a value swapped for a list, a
10,000-digit integer, 100,000-deep nesting, a lone surrogate, a string where a count belongs ...).
An outcome is ``ok`` (parsed), ``typed`` (a :class:`~ckpt_surgeon.errors.CkptError`) or
``untyped`` (anything else: a bug).

    python -m benchmarks.fuzz                       # 100,000 iterations per parser, bounded child
    python -m benchmarks.fuzz --iterations 2000 --targets gguf safetensors

The iterations run in a child process under ``RLIMIT_AS`` (``--memory-mb``, default 2048), so a
parser that allocates by an untrusted count dies with MemoryError instead of taking the machine;
every iteration is timed and those over ``--max-seconds`` (default 2) are counted.  The test suite
runs the same targets in-process with a fixed seed and a few thousand iterations
(``tests/test_hostile.py``).
"""
from __future__ import annotations

import abc
import argparse
import json
import os
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------- seeds

HIDDEN, HEADS, KV, HEAD_DIM, LAYERS, VOCAB = 16, 4, 2, 4, 2, 32
QWEN2_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
                "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": LAYERS,
                "intermediate_size": 32, "vocab_size": VOCAB, "max_position_embeddings": 128,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}


def qwen2_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of a 2-layer qwen2-shaped model (attention and norms only)."""
    rng = np.random.default_rng(seed)
    out = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)), "model.norm.weight": np.ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for r, rows in (("q", HEADS * HEAD_DIM), ("k", KV * HEAD_DIM), ("v", KV * HEAD_DIM)):
            out[p + f"self_attn.{r}_proj.weight"] = rng.standard_normal((rows, HIDDEN))
            out[p + f"self_attn.{r}_proj.bias"] = rng.standard_normal(rows)
        out[p + "self_attn.o_proj.weight"] = rng.standard_normal((HIDDEN, HEADS * HEAD_DIM))
        out[p + "input_layernorm.weight"] = np.ones(HIDDEN)
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict | None = None) -> bytes:
    hdr: dict = {"__metadata__": metadata} if metadata else {}
    pos, blobs = 0, []
    for name, a in tensors.items():
        b = a.tobytes()
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
        blobs.append(b)
    js = json.dumps(hdr).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(blobs)


def _gguf_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


_GGUF_SCALAR = {"u32": (4, "<I"), "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "u16": (2, "<H"),
                "u64": (10, "<Q")}


def _gguf_value(kind: str, v) -> bytes:
    if kind == "str":
        return struct.pack("<I", 8) + _gguf_str(v)
    if kind == "strs":
        return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_gguf_str(s) for s in v)
    if kind == "i32s":
        return struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v)
    tid, fmt = _GGUF_SCALAR[kind]
    return struct.pack("<I", tid) + struct.pack(fmt, v)


def gguf_bytes(kvs: list[tuple[str, str, object]], tensors: dict[str, np.ndarray], alignment: int = 32) -> bytes:
    """A GGUF v3 file (F32 tensors, numpy shapes stored innermost-first as ggml ``ne``)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    head += b"".join(_gguf_str(k) + _gguf_value(kind, v) for k, kind, v in kvs)
    offs, data = [], b""
    for a in tensors.values():
        data += b"\0" * (-len(data) % alignment)
        offs.append(len(data))
        data += a.tobytes()
    for (name, a), off in zip(tensors.items(), offs):
        ne = tuple(reversed(a.shape))
        head += _gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", 0, off)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def qwen2_gguf_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    ren = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    out = {}
    for k, v in qwen2_tensors(seed).items():
        if k in ren:
            out[ren[k]] = v
            continue
        i = k.split(".")[2]
        role = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "input_layernorm": "attn_norm"}[k.split(".")[-2]]
        out[f"blk.{i}.{role}.{k.split('.')[-1]}"] = v
    return out


def qwen2_gguf_kvs(extra: list | None = None) -> list:
    return [("general.architecture", "str", "qwen2"), ("general.name", "str", "fuzz"),
            ("qwen2.block_count", "u32", LAYERS), ("qwen2.embedding_length", "u32", HIDDEN),
            ("qwen2.attention.head_count", "u32", HEADS), ("qwen2.attention.head_count_kv", "u32", KV),
            ("qwen2.context_length", "u32", 128), ("qwen2.feed_forward_length", "u32", 32),
            ("qwen2.rope.freq_base", "f32", 10000.0), ("qwen2.attention.layer_norm_rms_epsilon", "f32", 1e-6),
            ("tokenizer.ggml.tokens", "strs", [f"t{i}" for i in range(VOCAB)]),
            ("tokenizer.ggml.token_type", "i32s", [1] * VOCAB)] + (extra or [])


# --------------------------------------------------------------------------- mutators

_BOUNDARY = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1)
_HOSTILE_JSON = (
    ["F32"], {"a": 1}, None, True, -1, 0, 2**64, 1e308, "4", "", "\ud800", 10**9, 10**12, 0.5, [],
    "DEEP", "BIGINT", "NAN",
)


def _hostile_json_text(rng: random.Random) -> str:
    v = rng.choice(_HOSTILE_JSON)
    if v == "DEEP":
        n = rng.choice((200, 5000, 100_000))
        return "[" * n + "]" * n
    if v == "BIGINT":
        return "9" * rng.choice((41, 4301, 10_000))
    if v == "NAN":
        return rng.choice(("NaN", "Infinity", "-Infinity"))
    return json.dumps(v)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if not b:
            break
        if op < 0.35:                                   # flip a byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op < 0.65:                                 # boundary integer over 4 or 8 bytes
            width = rng.choice((4, 8))
            at = rng.randrange(max(1, len(b) - width))
            v = rng.choice(_BOUNDARY) % (1 << (8 * width))
            b[at:at + width] = v.to_bytes(width, "little")
        elif op < 0.8:                                  # cut
            del b[rng.randrange(len(b)):]
        elif op < 0.9:                                  # duplicate a slice
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 64)]
        else:                                           # delete a slice
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 64)]
    return bytes(b)


def mutate_json_text(text: str, rng: random.Random) -> str:
    """Swap one JSON value (after a ``:`` or inside a list) for a hostile one, or mutate bytes."""
    if rng.random() < 0.25:
        return mutate_bytes(text.encode("utf-8", "surrogatepass"), rng).decode("utf-8", "surrogateescape")
    cuts = [i for i, c in enumerate(text) if c in ":[,"]
    if not cuts:
        return text
    i = rng.choice(cuts) + 1
    j = i
    depth = 0
    while j < len(text):                                # end of the value starting at i
        c = text[j]
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        elif c == '"':
            j = text.find('"', j + 1)
            if j < 0:
                return text
        j += 1
    return text[:i] + _hostile_json_text(rng) + text[j:]


def mutate_header_json(data: bytes, rng: random.Random) -> bytes:
    """A safetensors file with its JSON header mutated (and the length prefix kept consistent)."""
    n = int.from_bytes(data[:8], "little")
    js = data[8:8 + n].decode()
    new = mutate_json_text(js, rng).encode("utf-8", "surrogateescape")
    keep_len = rng.random() < 0.8
    return (len(new).to_bytes(8, "little") if keep_len else data[:8]) + new + data[8 + n:]


# --------------------------------------------------------------------------- targets

class Target(abc.ABC):
    """``run(rng)`` mutates the seed and feeds it to the parser (raising whatever it raises)."""

    name = ""

    def __init__(self, workdir: Path):
        self.dir = workdir

    @abc.abstractmethod
    def run(self, rng: random.Random) -> None:
        """One iteration."""


class SafetensorsTarget(Target):
    name = "safetensors"

    def __init__(self, workdir):
        super().__init__(workdir)
        self.seed = safetensors_bytes(qwen2_tensors(), {"format": "pt"})

    def run(self, rng):
        from ckpt_surgeon.formats.safetensors import parse_header_bytes
        data = mutate_header_json(self.seed, rng) if rng.random() < 0.6 else mutate_bytes(self.seed, rng)
        parse_header_bytes("fuzz.safetensors", data, len(data))


class _FolderTarget(Target):
    """A qwen2-shaped folder (two shards and an index, or one file) with its config.json; one JSON
    file is replaced per run (the next run overwrites it again)."""

    sharded = True

    def __init__(self, workdir):
        super().__init__(workdir)
        t = qwen2_tensors()
        names = list(t)
        half = len(names) // 2
        self.shards = ({"model-00001-of-00002.safetensors": {n: t[n] for n in names[:half]},
                        "model-00002-of-00002.safetensors": {n: t[n] for n in names[half:]}}
                       if self.sharded else {"model.safetensors": t})
        for fn, part in self.shards.items():
            (workdir / fn).write_bytes(safetensors_bytes(part))
        self.index = json.dumps({"metadata": {"total_size": 0},
                                 "weight_map": {n: fn for fn, part in self.shards.items() for n in part}}, indent=1)
        self.config = json.dumps(QWEN2_CONFIG, indent=1)
        os.mkfifo(workdir / "pipe.safetensors")
        (workdir / "sub").mkdir()
        if self.sharded:
            self.write("model.safetensors.index.json", self.index)
        self.write("config.json", self.config)

    def write(self, rel: str, text: str) -> None:
        (self.dir / rel).write_bytes(text.encode("utf-8", "surrogateescape"))

    def open_and_inspect(self) -> None:
        from ckpt_surgeon.analysis.inspect import inspect_checkpoint
        from ckpt_surgeon.checkpoint import open_checkpoint
        with open_checkpoint(self.dir) as ck:
            inspect_checkpoint(ck)


class IndexTarget(_FolderTarget):
    name = "index"
    _NAMES = ("pipe.safetensors", "sub", "../x.safetensors", "/dev/zero", "config.json", "", "a\\b",
              "model-00001-of-00002.safetensors", "missing.safetensors")

    def run(self, rng):
        text = mutate_json_text(self.index, rng)
        if rng.random() < 0.3:                           # a weight_map entry naming something hostile
            d = json.loads(self.index)
            k = rng.choice(list(d["weight_map"]))
            d["weight_map"][k] = rng.choice(self._NAMES)
            text = json.dumps(d)
        self.write("model.safetensors.index.json", text)
        self.open_and_inspect()


class ConfigTarget(_FolderTarget):
    """``inspect`` and ``analyze`` (static path: bias bounds, rope geometry, attention scale) of a
    folder whose config.json is mutated, or has one known key (or one field of a rope-scaling
    dict) set to a hostile value."""

    name = "config"
    sharded = False
    _KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
             "rope_theta", "max_position_embeddings", "partial_rotary_factor", "model_type", "rope_parameters",
             "rotary_dim", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types",
             "query_pre_attn_scalar", "attention_multiplier", "original_max_position_embeddings", "rope_scaling")
    # rope-scaling dicts whose every field the readers use (arch/rope.py), one field made hostile
    _ROPE = ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 1.0,
              "mscale_all_dim": 0.7},
             {"rope_type": "longrope", "short_factor": [1.0] * (HEAD_DIM // 2),
              "long_factor": [2.0] * (HEAD_DIM // 2), "original_max_position_embeddings": 32},
             {"rope_type": "linear", "factor": 2.0})

    def run(self, rng):
        if rng.random() < 0.5:
            text = mutate_json_text(self.config, rng)
        else:                                            # a known key set to a hostile value
            d = dict(QWEN2_CONFIG)
            k = rng.choice(self._KEYS)
            if k in ("rope_scaling", "rope_parameters") and rng.random() < 0.7:
                rope = dict(rng.choice(self._ROPE))
                rope[rng.choice([f for f in rope if f != "rope_type"] + ["rope_theta", "attention_factor"])] = "HOSTILE"
                value = json.dumps(rope).replace('"HOSTILE"', _hostile_json_text(rng))
            else:
                value = _hostile_json_text(rng)
            text = json.dumps({x: v for x, v in d.items() if x != k})[:-1] + f', "{k}": {value}' + "}"
        self.write("config.json", text)
        self.open_inspect_analyze()

    def open_inspect_analyze(self) -> None:
        from ckpt_surgeon.analysis.inspect import inspect_checkpoint
        from ckpt_surgeon.analysis.redundancy import analyze_checkpoint
        from ckpt_surgeon.checkpoint import open_checkpoint
        with open_checkpoint(self.dir) as ck:
            layout = ck.layout()
            inspect_checkpoint(ck)
            analyze_checkpoint(ck, layout=layout)


class GGUFTarget(Target):
    name = "gguf"

    def __init__(self, workdir):
        super().__init__(workdir)
        self.seed = gguf_bytes(qwen2_gguf_kvs(), qwen2_gguf_tensors())

    def run(self, rng):
        from ckpt_surgeon.arch.gguf_config import config_from_gguf
        from ckpt_surgeon.arch.resolve import resolve
        from ckpt_surgeon.formats.gguf import parse_header
        data = mutate_bytes(self.seed, rng)
        h = parse_header(data, "fuzz.gguf", len(data))
        cfg = config_from_gguf(h.metadata, h.tensors, path="fuzz.gguf")
        resolve(cfg, h.tensors, naming="gguf", config_source="fuzz.gguf", gguf_arch=h.architecture)


class GGUFSplitTarget(Target):
    name = "gguf-split"

    def __init__(self, workdir):
        super().__init__(workdir)
        t = qwen2_gguf_tensors()
        names = list(t)
        half = len(names) // 2
        split = [("split.count", "u16", 2), ("split.tensors.count", "i32", len(names))]
        self.parts = [gguf_bytes(qwen2_gguf_kvs([("split.no", "u16", 0)] + split), {n: t[n] for n in names[:half]}),
                      gguf_bytes([("general.architecture", "str", "qwen2"), ("split.no", "u16", 1)] + split,
                                 {n: t[n] for n in names[half:]})]
        self.paths = [workdir / f"m-0000{i + 1}-of-00002.gguf" for i in range(2)]
        for p, b in zip(self.paths, self.parts):
            p.write_bytes(b)
        self.dirty: int | None = None

    # part counts for names and split.count values: the limit (99,999: 5 digits), past it, u32/u64 ends
    _COUNTS = (1, 2, 3, 65_535, 99_999, 100_000, 2 ** 32 - 1, 2 ** 64 - 1)

    def run(self, rng):
        from ckpt_surgeon.checkpoint import open_checkpoint
        if rng.random() < 0.25:
            self.run_renamed(rng)
            return
        i = rng.randrange(2)
        if self.dirty is not None and self.dirty != i:      # one damaged part at a time
            self.paths[self.dirty].write_bytes(self.parts[self.dirty])
        self.paths[i].write_bytes(mutate_bytes(self.parts[i], rng))
        self.dirty = i
        with open_checkpoint(self.paths[0]) as ck:
            ck.layout()

    def run_renamed(self, rng):
        """Part 1 under a name ``-of-NNNNN`` with another part count (5 digits or more), its
        split.count set to that count, another one or left at 2, in a type gguf-split writes or not."""
        from ckpt_surgeon.checkpoint import open_checkpoint
        t = qwen2_gguf_tensors()
        n_name = rng.choice(self._COUNTS)
        count = rng.choice((n_name, n_name, 2, *self._COUNTS))
        kind = rng.choice([k for k, hi in (("u16", 2 ** 16), ("u16", 2 ** 16), ("u32", 2 ** 32), ("u32", 2 ** 32),
                                            ("i32", 2 ** 31), ("u64", 2 ** 64)) if count < hi])
        kvs = qwen2_gguf_kvs([("split.no", "u16", 0), ("split.count", kind, count),
                              ("split.tensors.count", "i32", len(t))])
        p = self.dir / "renamed" / f"m-00001-of-{n_name:05d}.gguf"
        p.parent.mkdir(exist_ok=True)
        for old in p.parent.iterdir():
            old.unlink()
        p.write_bytes(gguf_bytes(kvs, dict(list(t.items())[: len(t) // 2])))
        with open_checkpoint(p) as ck:
            ck.layout()


# Values of every GGUF type (as the reader returns them) a hostile file can put under any key.
_HOSTILE_GGUF = (0, 1, -1, -(2 ** 63), 2 ** 31, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1, 10 ** 12, 4.0, 0.5, -1.0, 0.0,
                 1e39, float("nan"), float("inf"), float("-inf"), True, False, "4", "", "\udc80", [], [1, 2], [2, 2],
                 [0], [-1], ["a"], [[1]], [1.5], [True])


def _hostile_gguf_value(rng: random.Random):
    v = rng.choice(_HOSTILE_GGUF)
    return list(v) if isinstance(v, list) else v


class GGUFHparamsTarget(Target):
    """What ``convert`` (GGUF -> HF) reads from the metadata before it writes anything: the
    config mapping and layout (as ``Checkpoint.layout``), the converter's own hyper-parameters
    (``hf_config_from_gguf``, ``hparams_from_gguf``) and the tokenizer keys; one to three values replaced
    by hostile ones of every GGUF type, or removed.  The header is parsed once (the bytes are
    the ``gguf`` target's); the values are swapped in the parsed metadata."""

    name = "gguf-hparams"
    _EXTRA = [("qwen2.attention.key_length", "u32", HEAD_DIM), ("qwen2.attention.value_length", "u32", HEAD_DIM),
              ("qwen2.rope.dimension_count", "u32", HEAD_DIM), ("qwen2.attention.sliding_window", "u32", 64),
              ("qwen2.vocab_size", "u32", VOCAB), ("tokenizer.ggml.model", "str", "gpt2"),
              ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
              ("tokenizer.ggml.padding_token_id", "u32", 0), ("tokenizer.ggml.unknown_token_id", "u32", 0)]

    def __init__(self, workdir):
        super().__init__(workdir)
        from ckpt_surgeon.arch.checked import GGUF_BOUNDS
        from ckpt_surgeon.conversion.tokenizer import SPECIAL_KEYS
        from ckpt_surgeon.formats.gguf import parse_header
        data = gguf_bytes(qwen2_gguf_kvs(self._EXTRA), qwen2_gguf_tensors())
        h = parse_header(data, "fuzz.gguf", len(data))
        self.meta, self.tensors = h.metadata, h.tensors
        self.keys = sorted(set(self.meta) | {f"qwen2.{s}" for s in GGUF_BOUNDS}
                           | {f"tokenizer.ggml.{k}" for k in SPECIAL_KEYS.values()}
                           | {"tokenizer.ggml.token_type_count", "tokenizer.ggml.scores", "tokenizer.ggml.merges",
                              "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"})

    def run(self, rng):
        from ckpt_surgeon.arch.gguf_config import config_from_gguf
        from ckpt_surgeon.arch.resolve import resolve
        from ckpt_surgeon.conversion import names as N
        from ckpt_surgeon.conversion.from_gguf import hparams_from_gguf, hf_config_from_gguf
        from ckpt_surgeon.conversion.tokenizer import hf_tokenizer_files, vocab_from_metadata
        meta = dict(self.meta)
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(self.keys)
            if rng.random() < 0.1:
                meta.pop(k, None)
            else:
                meta[k] = _hostile_gguf_value(rng)
        path = "fuzz.gguf"
        arch = meta.get("general.architecture")
        resolve(config_from_gguf(meta, self.tensors, path=path), self.tensors, naming="gguf", config_source=path,
                gguf_arch=arch if isinstance(arch, str) else None, shapes=False)
        spec = N.by_gguf_arch(arch if isinstance(arch, str) else None)
        if spec is None:
            return
        hf_config_from_gguf(meta, spec, self.tensors, dtype="float32", tied=True, path=path)
        hparams_from_gguf(meta, spec.gguf_arch, path)
        vocab = vocab_from_metadata(meta, path)
        if vocab is not None:
            hf_tokenizer_files(vocab, model_max_length=128, path=path)


class ConfigHparamsTarget(Target):
    """What ``convert`` (HF -> GGUF) reads from ``config.json``: every hyper-parameter checked as
    written (``check_hparam_values``) and the GGUF hyper-parameters (``hparams_from_config``), for
    a qwen2, a GPT-2, a Phi-3 and a Gemma-3 config (each family reads other spellings and
    llama.cpp constants).  A value is set to a hostile JSON value, or the text is mutated and parsed
    with the project's JSON reader.  transformers is not in the loop: its config classes would
    stop some values first, and the converter must not rely on that."""

    name = "config-hparams"
    _CONFIGS = (
        QWEN2_CONFIG,
        {"model_type": "gpt2", "n_embd": HIDDEN, "n_head": HEADS, "n_layer": LAYERS, "n_positions": 128,
         "n_inner": None, "layer_norm_epsilon": 1e-5, "vocab_size": VOCAB},
        {"model_type": "phi3", "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV,
         "num_hidden_layers": LAYERS, "intermediate_size": 32, "max_position_embeddings": 128,
         "original_max_position_embeddings": 64, "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
         "rms_norm_eps": 1e-5, "sliding_window": 64},
        {"model_type": "gemma3_text", "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV,
         "num_hidden_layers": LAYERS, "intermediate_size": 32, "max_position_embeddings": 128, "head_dim": HEAD_DIM,
         "rms_norm_eps": 1e-6, "query_pre_attn_scalar": HEAD_DIM, "layer_types": ["sliding_attention"] * LAYERS,
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    )

    def __init__(self, workdir):
        super().__init__(workdir)
        from ckpt_surgeon.conversion import names as N
        self.keys = sorted({k.split(".")[0] for ks in N.HF_HPARAM_KEYS.values() for k in ks}
                           | {"model_type", "rope_scaling", "rotary_pct"})

    def run(self, rng):
        from ckpt_surgeon.conversion import names as N
        from ckpt_surgeon.conversion.to_gguf import check_hparam_values, hparams_from_config
        from ckpt_surgeon.errors import ConfigError
        from ckpt_surgeon.formats.safe_input import loads_json
        base = rng.choice(self._CONFIGS)
        if rng.random() < 0.5:
            text = mutate_json_text(json.dumps(base), rng)
        else:                                            # a known key (or a nested rope key) set to a hostile value
            d = json.loads(json.dumps(base))
            k = rng.choice(self.keys)
            inner = d.get("rope_parameters") if k == "rope_parameters" and rng.random() < 0.7 else None
            if isinstance(inner, dict):
                inner = inner.get(rng.choice(list(inner))) if all(isinstance(v, dict) for v in inner.values()) else inner
                inner[rng.choice(("rope_theta", "partial_rotary_factor", "rope_type"))] = "HOSTILE"
            else:
                d[k] = "HOSTILE"
            text = json.dumps(d).replace('"HOSTILE"', _hostile_json_text(rng))
        cfg = loads_json(text.encode("utf-8", "surrogateescape"), path="config.json", error=ConfigError)
        if not isinstance(cfg, dict):
            return
        check_hparam_values(cfg, "config.json")
        mt = cfg.get("model_type")
        spec = N.by_model_type(mt) if isinstance(mt, str) else None
        if spec is not None:
            hparams_from_config(cfg, spec, VOCAB, "config.json")


TARGETS = {t.name: t for t in (SafetensorsTarget, IndexTarget, ConfigTarget, GGUFTarget, GGUFSplitTarget,
                                GGUFHparamsTarget, ConfigHparamsTarget)}


# --------------------------------------------------------------------------- driver

class _Hung(Exception):
    pass


def _alarm(signum, frame):
    raise _Hung()


def run_target(name: str, iterations: int, seed: int, workdir: Path, max_seconds: float = 2.0,
               hard_limit: float | None = None) -> dict:
    """Run one target in this process -> counts and the first few untyped failures.

    ``hard_limit`` (main thread only): an iteration still running after that many seconds is
    interrupted by SIGALRM and counted as ``hung`` (a hang must not stop the run)."""
    import signal

    from ckpt_surgeon.errors import CkptError
    target = TARGETS[name](workdir)
    rng = random.Random(seed)
    counts = {"ok": 0, "typed": 0, "untyped": 0, "memory_errors": 0, "over_time": 0, "hung": 0}
    worst, failures = 0.0, []
    previous = signal.signal(signal.SIGALRM, _alarm) if hard_limit else None
    try:
        for i in range(iterations):
            t0 = time.perf_counter()
            if hard_limit:
                signal.setitimer(signal.ITIMER_REAL, hard_limit)
            try:
                target.run(rng)
                counts["ok"] += 1
            except _Hung:
                counts["hung"] += 1
                failures.append((i, "hung", f"interrupted after {hard_limit} s"))
            except CkptError:
                counts["typed"] += 1
            except MemoryError:
                counts["memory_errors"] += 1
                failures.append((i, "MemoryError", ""))
            except Exception as e:  # noqa: BLE001 - the point: anything untyped is a finding
                counts["untyped"] += 1
                if len(failures) < 10:
                    failures.append((i, type(e).__name__, str(e)[:200]))
            finally:
                if hard_limit:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            dt = time.perf_counter() - t0
            worst = max(worst, dt)
            if dt > max_seconds:
                counts["over_time"] += 1
                if len(failures) < 10:
                    failures.append((i, "over_time", f"{dt:.2f} s"))
    finally:
        if hard_limit:
            signal.signal(signal.SIGALRM, previous)     # the caller's own (pytest runs this in its process)
    return {"target": name, "iterations": iterations, **counts, "max_iteration_s": round(worst, 4),
            "failures": failures}


def _child(name: str, iterations: int, seed: int, memory_mb: int, max_seconds: float) -> None:
    import resource
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # A config naming a model_type outside the registry goes to transformers (arch/derive), which
    # imports torch and transformers the first time: seconds, once per process, whatever the
    # input.  They are imported here, before the timed iterations, so the per-iteration bound
    # measures what an input costs, not the library's import (still under the same RLIMIT_AS).
    import torch  # noqa: F401
    import transformers  # noqa: F401
    with tempfile.TemporaryDirectory(prefix=f"ckpt-surgeon-fuzz-{name}-") as d:
        t0 = time.perf_counter()
        res = run_target(name, iterations, seed, Path(d), max_seconds, hard_limit=max(30.0, 10 * max_seconds))
        res["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(res))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-mb", type=int, default=2048, help="RLIMIT_AS of the child running the iterations")
    ap.add_argument("--max-seconds", type=float, default=2.0, help="an iteration slower than this is counted")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child, a.iterations, a.seed, a.memory_mb, a.max_seconds)
        return 0
    import subprocess
    bad = 0
    print(f"{'target':<12} {'iterations':>10} {'ok':>8} {'typed':>8} {'untyped':>8} {'memory':>7} "
          f"{'>' + format(a.max_seconds, 'g') + 's':>5} {'hung':>5} {'max s':>7} {'total s':>8}")
    for name in a.targets:
        p = subprocess.run([sys.executable, "-m", "benchmarks.fuzz", "--child", name, "--iterations", str(a.iterations),
                            "--seed", str(a.seed), "--memory-mb", str(a.memory_mb), "--max-seconds", str(a.max_seconds)],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
        if p.returncode != 0:
            print(f"{name:<12} child failed (exit {p.returncode}): {p.stderr.strip()[-500:]}")
            bad += 1
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{name:<12} {r['iterations']:>10,} {r['ok']:>8,} {r['typed']:>8,} {r['untyped']:>8,} "
              f"{r['memory_errors']:>7,} {r['over_time']:>5,} {r['hung']:>5,} {r['max_iteration_s']:>7.3f} "
              f"{r['seconds']:>8.1f}")
        for f in r["failures"]:
            print(f"    iteration {f[0]}: {f[1]}: {f[2]}")
        bad += r["untyped"] + r["memory_errors"] + r["over_time"] + r["hung"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
