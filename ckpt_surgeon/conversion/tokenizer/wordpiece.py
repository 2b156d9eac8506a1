"""WordPiece (``tokenizer.ggml.model = bert``), GGUF -> HF.
"""
from __future__ import annotations

from .vocab import BYTE, NORMAL, UNUSED, GGUFVocab


def wordpiece_tokenizer(v: GGUFVocab, tokens: list[str], types: list[int]):
    """``bert`` vocabularies (llama.cpp ``llm_tokenizer_wpm``).

    llama.cpp stores a word-initial piece as ``▁piece`` and a continuation as the bare piece, and
    matches greedily longest-first over ``▁word``; WordPiece stores them as ``piece`` and
    ``##piece`` and matches the same way, so the spellings are swapped and nothing else.  Words
    are split at whitespace, around punctuation, ASCII symbols and CJK ideographs, after
    lowercasing and accent stripping (BERT's normalizer, what ``BertNormalizer`` +
    ``BertPreTokenizer`` do); a word with any piece missing becomes ``[UNK]`` whatever its length.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (NORMAL, UNUSED, BYTE):
            t = t[1:] if t.startswith("▁") else "##" + t
        if t:
            vocab.setdefault(t, i)
    unk = v.special_ids.get("unk")
    unk_token = tokens[unk] if unk is not None else "[UNK]"
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk_token, max_input_chars_per_word=1 << 30))
    # llama.cpp: tokenizer.ggml.normalizer.lowercase (default on), strip_accents follows it.
    lower = True if v.lowercase is None else bool(v.lowercase)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=lower, lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok
