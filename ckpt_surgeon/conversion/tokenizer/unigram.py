"""Unigram (``tokenizer.ggml.model = t5``, llama.cpp's UGM), GGUF -> HF.
"""
from __future__ import annotations

from .vocab import GGUFVocab


def unigram_tokenizer(v: GGUFVocab, tokens: list[str]):
    """``t5`` vocabularies (llama.cpp ``llm_tokenizer_ugm``, SentencePiece's unigram model).

    The same Viterbi search over the token scores (unknown code points scored ``min - 10`` and
    runs of them fused into one unknown token, as SentencePiece and tokenizers' ``Unigram`` both
    do) after the same normalisation: SentencePiece's precompiled charsmap when the file has one,
    then with ``remove_extra_whitespaces`` spaces trimmed and collapsed and one put before the
    text, else one put before it with ``add_space_prefix`` (off by default for UGM) unless the text
    is blank, and every space spelled ``▁``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers

    scores = v.scores if v.scores is not None else (0.0,) * len(tokens)
    unk = v.special_ids.get("unk", 2)            # llama.cpp's default for t5
    tok = Tokenizer(models.Unigram([(t, float(s)) for t, s in zip(tokens, scores)],
                                   unk_id=unk if unk < len(tokens) else None, byte_fallback=False))
    norms = []
    if v.precompiled_charsmap:
        charsmap = normalizers.Precompiled(v.precompiled_charsmap)
        # tokenizers' Precompiled looks a whole grapheme cluster up and takes the entry of its
        # first character: "\r\n" becomes one space where SentencePiece and llama.cpp, matching
        # code point by code point, make two.  Mapping "\r" first splits that cluster.
        cr = charsmap.normalize_str("\r")
        if cr != "\r":
            norms.append(normalizers.Replace("\r", cr))
        norms.append(charsmap)
    prefix = bool(v.remove_extra_whitespaces) or bool(v.add_space_prefix)
    if v.remove_extra_whitespaces:
        # only " " counts as a space here, as in llama.cpp (after the charsmap mapped the others)
        norms += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r"\A | \z"), "")]
    if prefix:
        # llama.cpp puts the space before the first non-space character: none in a blank text
        norms.append(normalizers.Replace(Regex(r"\A(?= *[^ ])"), " "))
    norms.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(norms)
    decs = [decoders.Replace("▁", " ")] + ([decoders.Strip(" ", 1, 0)] if prefix else [])
    tok.decoder = decoders.Sequence(decs)
    return tok
