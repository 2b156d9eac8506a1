"""GGUF -> HF for ``tokenizer.ggml.model`` = ``t5`` (UGM, SentencePiece unigram) against llama.cpp.

llama.cpp ships no UGM test vocabulary, so one is made here: a SentencePiece unigram model is
trained (the sentencepiece library, on llama.cpp's test texts and the words of its GPT-2 test
vocabulary, both fixed by the llama-cpp-python version, so the models are too) and written as a
vocab-only GGUF with exactly the keys ``convert_hf_to_gguf.py``'s T5 model writes (t5.py
``set_vocab``: tokens, scores, types from the SentencePiece model, ``add_space_prefix`` =
``add_dummy_prefix``, ``remove_extra_whitespaces``, the precompiled charsmap, special ids).  The
real llama.cpp runtime tokenizes every test text with it and the tokenizer we rebuild from the
file must give the same ids, for the normaliser settings SentencePiece models come with.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Tokenizer

from ckpt_surgeon.conversion.tokenizer import hf_tokenizer_files, vocab_from_metadata
from ckpt_surgeon.conversion.tokenizer.bpe import bytes_to_unicode
from ckpt_surgeon.formats.gguf import read_header
from test_tokenizer_table import EXTRA_TEXTS, SPECIAL_TEXTS, LlamaCppRun, all_test_texts
from test_tokenizer_vectors import vocab_dir  # noqa: F401 - session fixture

# (normalization rule, remove_extra_whitespaces, add_dummy_prefix): T5's own settings first, then
# each whitespace rule on its own, and a charsmap that keeps control characters (nfkc_cf).
CONFIGS = {
    "t5-like": ("nmt_nfkc", True, True),
    "no-normalizer": ("identity", False, False),
    "prefix-only": ("nmt_nfkc", False, True),
    "merge-only": ("nfkc_cf", True, False),
}
# texts whose best tokenizations tie (measured; each the same pieces in another order)
TIES = {"t5-like": 0, "no-normalizer": 0, "prefix-only": 0, "merge-only": 0}
BLANK_AND_SPACED = ("", " ", "   ", "  leading and   inner   spaces  ", "tab\there\nnew", "ﬁne ① Ｆｕｌｌ é e\u0301")

_UNKNOWN, _CONTROL, _UNUSED, _BYTE, _NORMAL = 2, 3, 5, 6, 1


def write_t5_gguf(path: Path, corpus: list[str], rule: str, merge: bool, prefix: bool) -> None:
    import io
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=400,
                                   model_type="unigram", character_coverage=0.98, pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, normalization_rule_name=rule, remove_extra_whitespaces=merge,
                                   add_dummy_prefix=prefix, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    w = gguf.GGUFWriter(str(path), "llama")
    # a vocab-only file still names an architecture llama.cpp knows, with its hyper-parameters
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(64)
    ids = range(sp.vocab_size())
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.IdToPiece(i).encode() for i in ids])
    w.add_token_scores([sp.GetScore(i) for i in ids])
    w.add_token_types([_UNKNOWN if sp.IsUnknown(i) else _CONTROL if sp.IsControl(i) else _UNUSED if sp.IsUnused(i)
                       else _BYTE if sp.IsByte(i) else _NORMAL for i in ids])
    w.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
    w.add_remove_extra_whitespaces(proto.normalizer_spec.remove_extra_whitespaces)
    if proto.normalizer_spec.precompiled_charsmap:
        w.add_precompiled_charsmap(proto.normalizer_spec.precompiled_charsmap)
    w.add_eos_token_id(1)
    w.add_unk_token_id(2)
    w.add_pad_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def _gpt2_words(vocab_dir: Path) -> list[str]:
    """The text of ggml-vocab-gpt-2.gguf's first 20000 tokens, twelve to a line."""
    decode = {c: b for b, c in bytes_to_unicode().items()}
    words = []
    for t in read_header(vocab_dir / "ggml-vocab-gpt-2.gguf").metadata["tokenizer.ggml.tokens"]:
        try:
            words.append(bytes(decode[c] for c in t).decode("utf-8").strip())
        except (KeyError, UnicodeDecodeError):
            continue
    words = [w for w in words if w][:20000]
    return [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]


@pytest.fixture(scope="module")
def ugm_runs(vocab_dir, tmp_path_factory):
    texts = all_test_texts(vocab_dir)
    texts = list(dict.fromkeys([texts[0], *BLANK_AND_SPACED, *texts[1:]]))
    # trained on llama.cpp's texts only (not on EXTRA_TEXTS, which the other tests may extend)
    corpus = [line for t in texts if t not in EXTRA_TEXTS for line in t.splitlines() if line.strip()]
    corpus += _gpt2_words(vocab_dir)
    tmp = tmp_path_factory.mktemp("ugm")
    files = {}
    for name, (rule, merge, prefix) in CONFIGS.items():
        files[name] = tmp / f"{name}.gguf"
        write_t5_gguf(files[name], corpus, rule, merge, prefix)
    return files, texts, LlamaCppRun(files, texts, tmp / "llama-cpp.log").result()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_t5_vocab_tokenizes_like_llama_cpp(name, ugm_runs):
    files, texts, theirs = ugm_runs
    assert theirs[name] is not None, f"llama.cpp did not load {files[name]}"
    meta = read_header(files[name]).metadata
    assert bool(meta.get("tokenizer.ggml.precompiled_charsmap") is not None) == (CONFIGS[name][0] != "identity")
    rebuilt = hf_tokenizer_files(vocab_from_metadata(meta, str(files[name])), path=str(files[name]))
    tok = Tokenizer.from_str(rebuilt.tokenizer_json)
    differ = {t: (ids, tok.encode(t, add_special_tokens=False).ids) for t, ids in zip(texts, theirs[name]["plain"])}
    differ = {t: pair for t, pair in differ.items() if pair[0] != pair[1]}
    # The only differences allowed are exact ties: the same pieces in another order, so the same
    # score, which llama.cpp's Viterbi (first best kept, scores summed in path order) and
    # tokenizers' break differently (docs/tokenizers.md).  Anything else is a real difference.
    not_ties = [t[:40] for t, (a, b) in differ.items() if sorted(a) != sorted(b)]
    assert not_ties == []
    assert len(differ) == TIES[name], [t[:40] for t in differ]
    # with special tokens: UGM appends EOS (llama.cpp's default add_eos for t5), no BOS
    assert tok.encode(texts[0]).ids == theirs[name]["special"] and theirs[name]["special"][-1] == 1
    assert rebuilt.tokenizer_config["add_eos_token"] is True and rebuilt.tokenizer_config["eos_token"] == "</s>"
    # control-token text read as the token (llama.cpp parse_special; tokenizers' added tokens)
    assert [tok.encode(t, add_special_tokens=False).ids for t in SPECIAL_TEXTS] == theirs[name]["parsed"]
