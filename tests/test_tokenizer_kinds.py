"""HF -> GGUF: every tokenizer model kind `convert` accepts gives a file llama.cpp loads, and every
other kind is refused in one line, exit 2, nothing written (issue 36 item 5: a WordLevel
tokenizer became a 'gpt2' vocabulary without merges, which llama.cpp refuses to load, exit 0).

The refused tokenizers are the tiny Qwen2's own vocabulary rebuilt as each model kind by the
``tokenizers`` library (as a user's hand-made tokenizer.json would be)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from convert_variants import MULTILINGUAL, spm_llama

import llama_cpp  # noqa: E402  (installed by the test extra)


def _loads_and_tokenizes_like_transformers(src: Path, gguf: Path) -> None:
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(src)
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)   # raises if llama.cpp refuses it
    try:
        text = MULTILINGUAL.split("\n")[0]
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == hf.encode(text, add_special_tokens=False)
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["bpe-byte-level", "bpe-sentencepiece"])
def test_every_accepted_kind_loads_in_llama_cpp(kind, tiny, tmp_path):
    src = tiny("qwen2") if kind == "bpe-byte-level" else spm_llama(tiny, tmp_path / "spm")
    out = tmp_path / "m.gguf"
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--dtype", "f32", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert ("gpt2" if kind == "bpe-byte-level" else "llama") in r.output    # the vocabulary kind written
    _loads_and_tokenizes_like_transformers(src, out)


def _with_tokenizer(tiny, tmp_path: Path, kind: str) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    src = tmp_path / "src"
    shutil.copytree(tiny("qwen2"), src)
    tj = json.loads((src / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    unk = next(iter(vocab))
    model = {"WordLevel": lambda: models.WordLevel(vocab=vocab, unk_token=unk),
             "WordPiece": lambda: models.WordPiece(vocab=vocab, unk_token=unk),
             "Unigram": lambda: models.Unigram([(t, -1.0 - i / len(vocab)) for t, i in vocab.items()], 0),
             "BPE": lambda: models.BPE(vocab=vocab, merges=[])}[kind]()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    new = json.loads(tok.to_str())
    new["added_tokens"] = tj.get("added_tokens", [])
    (src / "tokenizer.json").write_text(json.dumps(new))
    return src


@pytest.mark.parametrize("kind,says", [
    ("WordLevel", "tokenizer model type 'WordLevel' is not converted: llama.cpp's vocabularies are BPE"),
    ("WordPiece", "tokenizer model type 'WordPiece' is not converted"),
    ("Unigram", "tokenizer model type 'Unigram' is not converted"),
    ("BPE", "byte-level BPE tokenizer without merges: llama.cpp refuses"),
])
def test_other_kinds_are_refused_in_one_line(kind, says, tiny, tmp_path):
    src = _with_tokenizer(tiny, tmp_path, kind)
    out = tmp_path / "m.gguf"
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--no-progress"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {src / 'tokenizer.json'}: {says}"), r.output
    assert "nothing was written" in lines[0]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]
