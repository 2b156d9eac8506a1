"""llama.cpp's special-token load rules as we mirror them (``conversion/tokenizer/llama_specials.py``), held to
llama.cpp twice:

1. **Source.**  The lists in ``llama_vocab::impl::load`` (llama-vocab.cpp of the installed llama-cpp-python, in
   the fixture cache) are parsed: the tokens found by their text (end-of-turn, end-of-message, the six FIM kinds),
   the end-of-generation texts, and the default ids per ``tokenizer.ggml.model``.  Ours must be equal.
2. **Runtime.**  llama.cpp itself (llama-cpp-python, vocab only, in a child process) loads every shipped
   ``ggml-vocab-*.gguf`` and planted variants of them (a key dropped or changed, the o200k-harmony and gemma4
   work-arounds, an id outside the vocabulary, add-BOS switched), and its bos / eos / eot / sep / pad / mask /
   FIM ids, its EOG set (``llama_vocab_is_eog`` over every id) and its add-BOS / EOS / SEP flags must be ours.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_surgeon.conversion.tokenizer import vocab_from_metadata
from ckpt_surgeon.conversion.tokenizer.llama_specials import (AUTO_SPECIALS, EOG_TEXTS, MODEL_DEFAULTS,
                                                              llama_specials)
from ckpt_surgeon.formats.gguf import read_header
from gguf_util import rewrite_gguf
from test_tokenizer_vectors import llama_vocab_cpp, vocab_dir  # noqa: F401 - session fixtures

_LITERAL = re.compile(r't\.first == "((?:[^"\\]|\\.)*)"')


def _between(src: str, start: str, end: str) -> str:
    a = src.index(start)
    return src[a:src.index(end, a)]


def test_the_text_rules_are_llama_cpps(llama_vocab_cpp):
    src = llama_vocab_cpp.read_text(encoding="utf-8")
    block = _between(src, "// auto-detect special tokens by text", "// auto-detect unused tokens")
    found = {}
    for kind, body in re.findall(r"if \(special_(\w+)_id == LLAMA_TOKEN_NULL\) \{(.*?)\n            \}\n", block,
                                 re.S):
        found[kind] = tuple(_LITERAL.findall(body))
    assert found == AUTO_SPECIALS
    eog = _between(src, "special_eog_ids.clear();", "// @ngxson")
    assert tuple(_LITERAL.findall(eog)) == EOG_TEXTS
    # the two work-arounds name exactly the texts we drop on
    fix = _between(src, "// TODO: workaround for o200k_harmony", "// build special tokens cache")
    assert set(re.findall(r'text == "([^"]+)"', fix)) == {"<|return|>", "<|call|>", "<|calls|>", "<|flush|>",
                                                            "<|end|>", "<|tool_response>", "<|plamo:eos|>", "</s>"}


def test_the_default_ids_per_model_are_llama_cpps(llama_vocab_cpp):
    src = llama_vocab_cpp.read_text(encoding="utf-8")
    chain = _between(src, 'if (tokenizer_model == "no_vocab"', "// for now, only BPE models have pre-tokenizers")
    parts = re.split(r'tokenizer_model == "(\w+)"', chain)
    seen = {}
    for i in range(1, len(parts), 2):
        names = [parts[i]]
        body = parts[i + 1]
        while body.strip().startswith("||"):          # "gpt2" || tokenizer_model == "hybriddna" || ...
            i += 2
            names.append(parts[i])
            body = parts[i + 1]
        ids = {k: (None if v == "LLAMA_TOKEN_NULL" else int(v))
               for k, v in re.findall(r"special_(bos|eos|unk|sep|pad|mask)_id\s*=\s*(\w+);", body)}
        for n in names:
            seen.setdefault(n, ids)
    for model, (ids, _) in MODEL_DEFAULTS.items():
        got = {k: v for k, v in ids.items() if k in seen[model]}
        assert got == seen[model], model


_CHILD = r"""
import json, sys
import llama_cpp
llama_cpp.llama_backend_init()
KINDS = ("bos", "eos", "eot", "sep", "pad", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
out = {}
for name, path in json.load(sys.stdin).items():
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        out[name] = None
        continue
    v = llama_cpp.llama_model_get_vocab(model)
    n = llama_cpp.llama_vocab_n_tokens(v)
    ids = {k: getattr(llama_cpp, "llama_vocab_" + k)(v) for k in KINDS}
    out[name] = {"ids": {k: i for k, i in ids.items() if i >= 0},
                 "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)],
                 "flags": [bool(getattr(llama_cpp, "llama_vocab_get_add_" + k)(v)) for k in ("bos", "eos", "sep")]}
    llama_cpp.llama_model_free(model)
json.dump(out, sys.stdout)
"""


def _llama_cpp(files: dict[str, Path], log: Path) -> dict:
    with open(log, "w") as err:
        r = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps({k: str(v) for k, v in files.items()}),
                           stdout=subprocess.PIPE, stderr=err, text=True, timeout=600)
    assert r.returncode == 0, log.read_text(errors="replace")[-2000:]
    return json.loads(r.stdout)


def _renamed(src: Path, dst: Path, texts: dict[int, str], **kw) -> Path:
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(src) as ck:
        toks = list(ck.metadata["tokenizer.ggml.tokens"])
    for i, t in texts.items():
        toks[i] = t
    set_kv = dict(kw.pop("set_kv", {}), **{"tokenizer.ggml.tokens": (toks, None)})
    return rewrite_gguf(src, dst, set_kv=set_kv, **kw)


def _variants(vocab_dir: Path, tmp: Path) -> dict[str, Path]:
    import gguf
    u32, boolean = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL
    files = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf"): p for p in vocab_dir.glob("ggml-vocab-*.gguf")}
    gpt2, qwen2, spm, bert = (vocab_dir / f"ggml-vocab-{n}.gguf" for n in ("gpt-2", "qwen2", "llama-spm", "bert-bge"))
    files["gpt-2-no-eos"] = rewrite_gguf(gpt2, tmp / "a.gguf", drop=("tokenizer.ggml.eos_token_id",
                                                                     "tokenizer.ggml.bos_token_id"))
    files["qwen2-eot-key"] = rewrite_gguf(qwen2, tmp / "b.gguf", set_kv={"tokenizer.ggml.eot_token_id": (1000, u32)})
    files["qwen2-eos-outside"] = rewrite_gguf(qwen2, tmp / "c.gguf",
                                              set_kv={"tokenizer.ggml.eos_token_id": (10 ** 7, None)})
    files["qwen2-add-bos"] = rewrite_gguf(qwen2, tmp / "d.gguf", set_kv={"tokenizer.ggml.add_bos_token": (True, boolean)})
    files["spm-no-add-bos"] = rewrite_gguf(spm, tmp / "e.gguf", set_kv={"tokenizer.ggml.add_bos_token": (False, boolean),
                                                                      "tokenizer.ggml.add_eos_token": (True, boolean)})
    files["gpt-2-harmony"] = _renamed(gpt2, tmp / "f.gguf", {100: "<|return|>", 101: "<|call|>", 102: "<|end|>"})
    files["gpt-2-end-only"] = _renamed(gpt2, tmp / "g.gguf", {102: "<|end|>", 103: "<|im_end|>", 104: "<|fim_pad|>"})
    files["gpt-2-gemma4-s"] = _renamed(gpt2, tmp / "h.gguf", {100: "</s>", 101: "<|tool_response>"})
    files["gpt-2-fim-keys"] = rewrite_gguf(gpt2, tmp / "i.gguf", set_kv={
        "tokenizer.ggml.fim_pre_token_id": (200, u32), "tokenizer.ggml.fim_sep_token_id": (201, u32),
        "tokenizer.ggml.prefix_token_id": (202, u32)})
    files["bert-no-keys"] = rewrite_gguf(bert, tmp / "j.gguf", drop=tuple(
        f"tokenizer.ggml.{k}" for k in ("bos_token_id", "eos_token_id", "seperator_token_id", "padding_token_id",
                                        "unknown_token_id", "mask_token_id", "cls_token_id")))
    files["qwen2-chatglm"] = rewrite_gguf(qwen2, tmp / "k.gguf", set_kv={"tokenizer.ggml.pre": ("chatglm-bpe", None)},
                                          drop=("tokenizer.ggml.bos_token_id",))
    files["qwen2-llama3-pre"] = rewrite_gguf(qwen2, tmp / "l.gguf", set_kv={"tokenizer.ggml.pre": ("llama-bpe", None)},
                                             drop=("tokenizer.ggml.add_bos_token",))
    return files


def test_special_ids_eog_and_flags_are_llama_cpps(vocab_dir, tmp_path):
    files = _variants(vocab_dir, tmp_path)
    got = _llama_cpp(files, tmp_path / "llama.log")
    compared = 0
    for name, path in sorted(files.items()):
        theirs = got[name]
        if theirs is None:                       # llama.cpp refuses the file (none of these should be)
            pytest.fail(f"llama.cpp did not load {name}")
        meta = read_header(path).metadata
        v = vocab_from_metadata(_in_range(meta), str(path))
        keys = {k.removeprefix("tokenizer.ggml."): meta[k] for k in meta if k.endswith("_token_id")}
        ours = llama_specials(v, keys)
        ambiguous = {n.split(":")[0] for n in ours.notes if "hash map" in n}
        mine = {k: i for k, i in ours.ids.items() if k in theirs["ids"] or k in ("bos", "eos", "eot", "sep", "pad",
                                                                                    "mask") or k.startswith("fim")}
        mine = {k: i for k, i in mine.items() if k not in ("unk", "eom") and k not in ambiguous}
        assert mine == {k: i for k, i in theirs["ids"].items() if k not in ambiguous}, name
        assert list(ours.eog) == theirs["eog"], name
        assert [ours.add_bos, ours.add_eos, ours.add_sep] == theirs["flags"], name
        compared += 1
    assert compared == len(files) >= 27


def _in_range(meta: dict) -> dict:
    """The metadata without special-id keys outside the vocabulary (our reader refuses them where llama.cpp only
    warns; llama_specials gets them through ``keys`` and ignores them as llama.cpp does)."""
    n = len(meta["tokenizer.ggml.tokens"])
    return {k: v for k, v in meta.items() if not (k.endswith("_token_id") and isinstance(v, int) and v >= n)}
