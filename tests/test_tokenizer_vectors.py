"""GGUF -> HF tokenizer rebuild against llama.cpp's own tokenizer test vectors.

llama.cpp ships vocab-only GGUFs (``models/ggml-vocab-<name>.gguf``) with test texts
(``.gguf.inp``, texts separated by a ``__ggml_vocab_test__`` line) and the ids llama.cpp's
tokenizer gives them (``.gguf.out``, one line of space-separated ids per text).  Its
``tests/test-tokenizer-0.cpp`` reads them into a map keyed by text (duplicates collapse) and
tokenizes with ``add_special = false`` and ``parse_special = false``: no BOS/EOS, and control-token
text is plain text.  The files come from the llama-cpp-python source distribution of the installed
version, downloaded once with pip into the fixture cache (tests/llamacpp_src.py).

For every vocabulary we rebuild ``tokenizer.json`` exactly as ``convert`` GGUF -> HF does
(:func:`vocab_from_metadata` + :func:`hf_tokenizer_files`), encode every text with
``add_special_tokens=False`` and count the texts whose ids equal llama.cpp's.  EXPECTED pins that
count per vocabulary, so any regression fails; what is still short of the total is explained in
docs/tokenizers.md.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llamacpp_src import llamacpp_source

from ckpt_surgeon.conversion.tokenizer import hf_tokenizer_files, vocab_from_metadata
from ckpt_surgeon.formats.gguf import read_header

SEP = "\n__ggml_vocab_test__\n"

# name -> (texts matching llama.cpp, texts in the file after de-duplication).
EXPECTED: dict[str, tuple[int, int]] = {
    "bert-bge": (46, 46),
    "command-r": (46, 46),
    "deepseek-coder": (46, 46),
    "deepseek-llm": (46, 46),
    "falcon": (46, 46),
    "gemma-4": (46, 46),
    "gpt-2": (46, 46),
    "llama-bpe": (46, 46),
    "llama-spm": (46, 46),
    "mpt": (46, 46),
    "phi-3": (46, 46),
    "qwen2": (46, 46),
    "qwen35": (50, 50),
    "refact": (46, 46),
    "starcoder": (46, 46),
}


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    return llamacpp_source() / "models"


@pytest.fixture(scope="session")
def llama_vocab_cpp() -> Path:
    """src/llama-vocab.cpp of the llama.cpp inside the installed llama-cpp-python (its
    pre-tokenizer table, which tests/test_tokenizer_table.py holds ours to)."""
    return llamacpp_source() / "src" / "llama-vocab.cpp"


def read_vectors(gguf: Path) -> dict[str, list[int]]:
    """Text -> expected ids, read as test-tokenizer-0.cpp reads them."""
    raw = Path(f"{gguf}.inp").read_text(encoding="utf-8")
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    outs = Path(f"{gguf}.out").read_text(encoding="utf-8").split("\n")
    assert len(outs) >= len(texts), f"{gguf}.out has fewer lines than {gguf}.inp has texts"
    return {t: [int(x) for x in o.split()] for t, o in zip(texts, outs)}


def test_every_vocab_is_known(vocab_dir):
    found = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in vocab_dir.glob("ggml-vocab-*.gguf")
                   if Path(f"{p}.inp").exists())
    # A new llama-cpp-python adding or dropping vocabularies must be looked at, not passed over.
    assert found == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rebuilt_tokenizer_matches_llama_cpp(name, vocab_dir):
    gguf = vocab_dir / f"ggml-vocab-{name}.gguf"
    vectors = read_vectors(gguf)
    header = read_header(gguf)
    # Vocab-only files end right after their header (no data padding): complete, not truncated.
    assert (header.tensor_count, header.missing_bytes, header.warnings) == (0, 0, ())
    vocab = vocab_from_metadata(header.metadata, str(gguf))
    files = hf_tokenizer_files(vocab, path=str(gguf))
    tok = Tokenizer.from_str(files.tokenizer_json)
    differ = [t for t, ids in vectors.items() if tok.encode(t, add_special_tokens=False).ids != ids]
    assert (len(vectors) - len(differ), len(vectors)) == EXPECTED[name], \
        f"{name}: texts that now differ from llama.cpp: {[t[:40] for t in differ]}"
    _assert_special_tokens_match(tok, gguf, name)



# llama.cpp's own add_special behaviour: llama.cpp's tokenize(add_bos=True) -- its add_special --
# against our rebuilt tokenizer's encode(add_special_tokens=True).
SPECIAL_TEXTS = ("Hello world", " leading space", "a\nb", "")


def _assert_special_tokens_match(tok, src: Path, label) -> None:
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(src), vocab_only=True, verbose=False)
    try:
        for text in SPECIAL_TEXTS:
            assert tok.encode(text, add_special_tokens=True).ids == \
                llm.tokenize(text.encode(), add_bos=True, special=False), (label, text)
    finally:
        llm.close()


# One vocabulary per tokenizer kind with the file's add_bos / add_eos forced off and on (the
# shipped settings are checked for every vocabulary above): WPM ignores them (always [CLS] ...
# [SEP]), SPM and BPE follow them.
@pytest.mark.parametrize("flags", [False, True], ids=["off", "on"])
@pytest.mark.parametrize("name", ["bert-bge", "llama-spm", "phi-3", "gpt-2"])
def test_added_special_tokens_follow_the_file_flags_as_llama_cpp(name, flags, vocab_dir, tmp_path):
    import gguf as G

    from gguf_util import rewrite_gguf

    keys = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")
    src = rewrite_gguf(vocab_dir / f"ggml-vocab-{name}.gguf", tmp_path / f"{name}.gguf", drop=keys,
                       set_kv={k: (flags, G.GGUFValueType.BOOL) for k in keys})
    header = read_header(src)
    tok = Tokenizer.from_str(hf_tokenizer_files(vocab_from_metadata(header.metadata, str(src)),
                                                path=str(src)).tokenizer_json)
    _assert_special_tokens_match(tok, src, (name, flags))
