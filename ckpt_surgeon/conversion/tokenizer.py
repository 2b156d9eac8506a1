"""Tokenizers both ways: ``tokenizer.json`` (+ config files) <-> GGUF ``tokenizer.ggml.*``.

Two vocabulary kinds cover the families we convert:

``gpt2`` (byte-level BPE: GPT-2, Qwen2, Llama 3, SmolLM ...)
    tokens are stored in the byte-to-unicode spelling (``Ġthe``), merges as ``"a b"`` strings.
    How text is split *before* BPE is a separate choice, ``tokenizer.ggml.pre``, which llama.cpp
    maps to a fixed list of regexes (``llama-vocab.cpp`` ``llm_tokenizer_bpe``).  We keep both
    sides of that mapping in one table, :data:`PRE_TOKENIZERS`, so ``pre`` is recognised from
    ``tokenizer.json`` and rebuilt from a GGUF the same way.
``llama`` (SentencePiece-style BPE with byte fallback: Llama 2, Mistral v0.1, Phi-3 ...)
    tokens spelled with ``▁``; llama.cpp merges the adjacent pair whose concatenation has the
    highest *score* (``llm_tokenizer_spm``), while ``tokenizer.json`` lists *merges* by rank.
    HF -> GGUF: scores come from ``tokenizer.model`` when present (exact, like llama.cpp's
    ``_set_vocab_sentencepiece``), else ``-rank`` of the merge that produces each token.
    GGUF -> HF: merges are every split of a token into two vocabulary pieces, ordered by the
    token's score, which is how SentencePiece's own BPE picks pairs.

Token types are gguf-py's ``TokenType``: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte.  Vocabulary rows the model has beyond the tokenizer (embeddings padded to a
multiple of 64) become ``[PAD{id}]`` UNUSED tokens, as ``convert_hf_to_gguf.py`` does, and are
dropped again on the way back.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..arch.checked import TOKEN_ID, Bounds, describe, gguf_value
from ..errors import ConfigError, FormatError, UnsupportedError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# --- pre-tokenizers -----------------------------------------------------------------------
#
# llama.cpp's own table, mirrored as data (llama-vocab.cpp of the llama-cpp-python version the
# tests run against; tests/test_tokenizer_table.py parses that file and fails on any drift):
#
# * ``llama_vocab::impl::load`` maps each ``tokenizer.ggml.pre`` name to a pre-tokenizer type
#   ``LLAMA_VOCAB_PRE_TYPE_<TYPE>`` and sets flags: :data:`_PRE_NAMES` below, one line per
#   ``else if`` block of that chain.
# * ``llm_tokenizer_bpe`` gives each type a list of regexes, applied one after the other to every
#   piece the previous ones left (matches and the text between them both kept), and whether
#   pieces are byte-level encoded: :data:`PRE_TYPE_REGEXES`, the strings exactly as llama.cpp
#   writes them.  :func:`_oniguruma` turns one into the regex tokenizers' Oniguruma must run to
#   split the same way.

# llama.cpp's adaptation of tokenizer.json's (?i:'s|'t|...) (std::regex has no inline flags).  The
# adapted spelling is the one run here too: it is what llama.cpp does, and Oniguruma's (?i:...)
# would also fold Unicode case ("it'ſ" -> "'ſ" joined) where llama.cpp does not.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
# llama.cpp's adaptation of tiktoken's cased-word classes for std::regex (``(?=[\p{L}])([^a-z])``
# for an upper-case letter): with its collapsed categories every letter outside a-z counts.
_CASED_LOOKAHEAD = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
                    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?")
_DEEPSEEK3 = ('[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+'
              '| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+')
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_NEWLINES = r"[^\n]+|[\n]+"
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# LLAMA_VOCAB_PRE_TYPE_<TYPE> -> (regexes, byte_encode)
PRE_TYPE_REGEXES: dict[str, tuple[tuple[str, ...], bool]] = {
    "DEFAULT": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), True),
    "LLAMA3": ((_LLAMA3,), True),
    "DBRX": ((_LLAMA3,), True),
    "SMAUG": ((_LLAMA3,), True),
    "CHATGLM4": ((_LLAMA3,), True),
    "JAIS2": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
                r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",), True),
    # DeepSeek LLM: cased letters spelled out as ranges (no \p{L}), ASCII and full-width punctuation.
    "DEEPSEEK_LLM": (("[\r\n]",
                      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                      r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", "[一-龥ࠀ-一가-퟿]+", r"\p{N}+"), True),
    "DEEPSEEK3_LLM": ((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3), True),
    "HUNYUAN_DENSE": ((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3), True),
    "JOYAI_LLM": ((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3), True),
    "HY_V4": ((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3), True),
    "SPARK2_5": ((r"\p{N}{1,3}", _CJK_KANA,
                  _DEEPSEEK3.replace("[\r\n]*|\\s*[\r\n]+", "|[\r\n]"), r"\p{N}"), True),
    "YOUTU": (("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA,
               _CASED.replace(r"[\p{Lu}", "[\\p{Lu}") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
              True),
    "DEEPSEEK_CODER": (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"), True),
    "FALCON": ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"), True),
    **{t: ((r"\p{N}", _GPT2), True) for t in ("STARCODER", "REFACT", "COMMAND_R", "SMOLLM", "CODESHELL",
                                              "EXAONE", "MINERVA", "MELLUM2")},
    **{t: ((_GPT2,), True) for t in ("GPT2", "MPT", "OLMO", "JAIS", "TRILLION", "GRANITE_DOCLING")},
    **{t: ((_QWEN2,), True) for t in ("STABLELM2", "QWEN2", "HUNYUAN", "SOLAR_OPEN", "GROK_2")},
    "QWEN35": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+",), True),
    "PORO": ((_BLOOM,), True),
    "BLOOM": ((_BLOOM,), True),
    "GPT3_FINNISH": ((_BLOOM,), True),
    "VIKING": ((_BLOOM, r"\p{N}"), True),
    "TEKKEN": ((_CASED_LOOKAHEAD.replace(_CONTRACTIONS + "?", "")
                + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "CHAMELEON": (("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                   r"[\p{P}!-/:-@\[-`{-~]", _GPT2), True),
    "GPT4O": ((_CASED_LOOKAHEAD + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "MINIMAX_M2": ((_CASED_LOOKAHEAD + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "GRANITE_EMB_MULTI": ((_CASED_LOOKAHEAD.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
                           + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "TINY_AYA": ((r"\d{1,3}(?=(?:\d{3})*\b)",
                  _CASED + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True),
    "KIMI_K2": ((r"\p{Han}+",), True),
    "SUPERBPE": ((r"\p{N}+", r"(?=(\d{3})+(?!\d))"), True),
    "BAILINGMOE": ((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    "SEED_CODER": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
                   True),
    "UFAKZEKA": ((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "AFMOE": ((r"\p{AFMoE_digits}",
               "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff가-\ud7afᄀ-ᇿ]+",
               _DEEPSEEK3.replace("\r\n", r"\r\n")), True),
    "LAGUNA": ((_NEWLINES, _QWEN2), True),
    "EXAONE_MOE": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    # SPM-style BPE over raw UTF-8 (byte_encode = false): spaces spelled ▁, <0xNN> byte fallback.
    "GEMMA4": ((_NEWLINES,), False),
    "SARVAM_MOE": ((_NEWLINES,), False),
    "MINICPM5": ((r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+"), True),
    "WHITESPACE": ((r"\S+",), False),
}

# ``tokenizer.ggml.pre`` names, one line per block of llama.cpp's chain: TYPE, flags : names.
# Flags (llama.cpp's settings): ignore_merges (a piece that is a whole token skips BPE), add_bos
# (default for tokenizer.ggml.add_bos_token), add_sep, escape_whitespaces (spaces become ▁ before
# the split), keep_spaces (clean_spaces = false: no clean-up when decoding), no_bos (special_bos_id
# = LLAMA_TOKEN_NULL unless the file names one), no_lowercase (normalizer_opts.lowercase = false).
_PRE_NAMES = """
DEFAULT                                     : default
MINICPM5 ignore_merges                      : minicpm5
LLAMA3 add_bos ignore_merges                : llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano
DEEPSEEK_LLM keep_spaces                    : deepseek-llm
DEEPSEEK_CODER keep_spaces                  : deepseek-coder
DEEPSEEK3_LLM keep_spaces                   : deepseek-v3
SPARK2_5 keep_spaces                        : spark2_5
YOUTU ignore_merges keep_spaces             : youtu
FALCON                                      : falcon
MPT                                         : mpt
STARCODER                                   : starcoder
GPT2                                        : gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert
JAIS2                                       : jais-2
GEMMA4 escape_whitespaces                   : gemma4 granite-embed-multi-311m
SARVAM_MOE escape_whitespaces keep_spaces   : sarvam-moe
GPT2 add_sep                                : jina-v1-en jina-v2-code roberta-bpe
WHITESPACE no_lowercase                     : whitespace
REFACT                                      : refact
COMMAND_R keep_spaces                       : command-r
QWEN2 keep_spaces                           : qwen2 deepseek-r1-qwen kormo f2llmv2
QWEN35 keep_spaces                          : qwen35
STABLELM2                                   : stablelm2
OLMO                                        : olmo
DBRX                                        : dbrx
SMAUG                                       : smaug-bpe
PORO keep_spaces                            : poro-chat
CHATGLM4 no_bos                             : chatglm-bpe
CHATGLM4 ignore_merges no_bos               : glm4 glm5
VIKING keep_spaces                          : viking
JAIS                                        : jais
TEKKEN add_bos ignore_merges keep_spaces    : tekken
SMOLLM keep_spaces                          : smollm
CODESHELL                                   : codeshell
BLOOM                                       : bloom
GPT3_FINNISH                                : gpt3-finnish
EXAONE                                      : exaone
GPT2                                        : exaone4
EXAONE_MOE                                  : exaone-moe
CHAMELEON add_bos keep_spaces               : chameleon
MINERVA                                     : minerva-7b
QWEN2                                       : megrez
GPT4O keep_spaces                           : gpt-4o llama4 kanana2 talkie
GRANITE_EMB_MULTI ignore_merges keep_spaces : granite-embed-multi-97m
TINY_AYA keep_spaces                        : tiny_aya cohere2moe
SUPERBPE keep_spaces                        : superbpe
TRILLION keep_spaces                        : trillion
GRANITE_DOCLING keep_spaces                 : granite-docling
BAILINGMOE keep_spaces                      : bailingmoe bailingmoe2 llada-moe
SEED_CODER keep_spaces                      : seed-coder
HUNYUAN keep_spaces                         : hunyuan
HUNYUAN_DENSE keep_spaces                   : hunyuan-dense
HY_V4 keep_spaces                           : hy_v4
JOYAI_LLM keep_spaces                       : joyai-llm
KIMI_K2 keep_spaces                         : kimi-k2
UFAKZEKA keep_spaces                        : ufakzeka
GROK_2 keep_spaces                          : grok-2
AFMOE keep_spaces                           : afmoe
LAGUNA keep_spaces                          : laguna
MINIMAX_M2 keep_spaces                      : minimax-m2
SOLAR_OPEN keep_spaces                      : solar-open
MELLUM2                                     : mellum2
"""
_PRE_FLAGS = ("ignore_merges", "add_bos", "add_sep", "escape_whitespaces", "keep_spaces", "no_bos", "no_lowercase")

# Han as llama.cpp's unicode_cpt_is_han has it (unicode.cpp), not Unicode's Script=Han.
_HAN = r"\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}"
# llama.cpp does not run these regexes: unicode_regex_split_custom recognises them and runs a
# hand-written splitter instead.  Each value is an Oniguruma regex that splits as that code does.
_CUSTOM_SPLITTERS = {
    # unicode_regex_split_custom_kimi_k2: runs of Han; words of letters (\p{L} only: the
    # original's \p{M} is not joined) that are not Han, with an optional leading non-letter and
    # a trailing contraction; then Llama 3's number, punctuation and space rules.
    r"\p{Han}+": (r"[{H}]+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^{H}]]+(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+").replace("{H}", _HAN),
    # unicode_regex_split_custom_afmoe: a run of digits is cut into its first len % 3 digits and
    # then groups of three.  tiny_aya's regex is routed to the same code, so its \b (which would
    # not cut "1234abc" between 4 and a) is not what llama.cpp does.
    r"\p{AFMoE_digits}": r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
    r"\d{1,3}(?=(?:\d{3})*\b)": r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
}
# What llama.cpp's std::regex fallback sees (unicode_regex_split): in a regex using \p{...}
# categories every letter, upper- or lower-case, is collapsed to one code, so \p{Lu}, \p{Ll},
# \p{Lt}, \p{Lm} and \p{Lo} all mean \p{L} there; tokenizer.json's originals tell the cases apart
# (they split "ÖL" as one word, llama.cpp as "Ö" + "L" under the look-ahead adaptation).
_COLLAPSED_LETTERS = re.compile(r"\\p\{L[ultmo]\}")
_CATEGORIES = (r"\p{N}", r"\p{L}", r"\p{P}", r"\p{M}", r"\p{S}", r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}")


def _oniguruma(regex: str) -> str:
    """The Oniguruma regex that splits text as llama.cpp's handling of ``regex`` does."""
    if regex in _CUSTOM_SPLITTERS:
        return _CUSTOM_SPLITTERS[regex]
    # ECMAScript \d (std::regex / std::wregex in the C locale) is ASCII; Oniguruma's is Unicode Nd.
    regex = regex.replace(r"\d", "[0-9]")
    if any(c in regex for c in _CATEGORIES):
        regex = _COLLAPSED_LETTERS.sub(r"\\p{L}", regex)
    return regex


_BYTELEVEL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


@dataclass(frozen=True)
class PreTokenizer:
    """One ``tokenizer.ggml.pre`` name as llama.cpp loads it."""

    name: str
    type: str                          # LLAMA_VOCAB_PRE_TYPE_<type>
    regexes: tuple[str, ...]           # exactly as llama-vocab.cpp writes them
    byte_encode: bool = True           # pieces byte-level encoded (GPT-2 alphabet) before BPE
    ignore_merges: bool = False        # a piece that is a whole token skips BPE (Llama 3)
    add_bos: bool = False
    add_sep: bool = False
    escape_whitespaces: bool = False   # " " -> "▁" before splitting (SPM-style BPE)
    clean_spaces: bool = True
    bos_null: bool = False
    lowercase: bool = True

    @property
    def pre_tokenizer(self) -> dict:
        """tokenizer.json's pre_tokenizer: llama.cpp applies its regexes one after the other, each
        to every piece the previous ones left, keeping matches and the text between them as
        pieces; a chain of ``Split(..., "isolated")`` does the same, then a regex-free
        ``ByteLevel`` spells the bytes."""
        steps = [{"type": "Split", "pattern": {"Regex": _oniguruma(r)}, "behavior": "Isolated", "invert": False}
                 for r in self.regexes]
        if self.byte_encode:
            steps.append(dict(_BYTELEVEL_NOREGEX))
        return {"type": "Sequence", "pretokenizers": steps}


def _pre_table() -> tuple[PreTokenizer, ...]:
    out = []
    for line in _PRE_NAMES.strip().splitlines():
        left, _, names = line.partition(":")
        typ, *flags = left.split()
        unknown = set(flags) - set(_PRE_FLAGS)
        assert not unknown, f"unknown flag {unknown} in _PRE_NAMES"
        regexes, byte_encode = PRE_TYPE_REGEXES[typ]
        for name in names.split():
            out.append(PreTokenizer(
                name, typ, regexes, byte_encode, ignore_merges="ignore_merges" in flags, add_bos="add_bos" in flags,
                add_sep="add_sep" in flags, escape_whitespaces="escape_whitespaces" in flags,
                clean_spaces="keep_spaces" not in flags, bos_null="no_bos" in flags,
                lowercase="no_lowercase" not in flags))
    return tuple(out)


PRE_TOKENIZERS: tuple[PreTokenizer, ...] = _pre_table()
_PRE_BY_NAME = {p.name: p for p in PRE_TOKENIZERS}

# tokenizer.json spellings that are not our generated chain but split the same way, as models
# ship them (recognised HF -> GGUF).  ByteLevel's own regex is GPT-2's plus "|\s+", which only
# re-joins text the split chain keeps as a piece anyway.
_HF_SPELLINGS = {
    "gpt-2": ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},),
    "smollm": ({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},),
}
# Names picked HF -> GGUF when several split the same way: what convert_hf_to_gguf.py writes.
_PREFERRED = ("gpt-2", "llama-bpe", "qwen2", "starcoder", "gpt-4o")
# tokenizer.json's case-insensitive contractions; llama.cpp spells them out (std::regex has no
# (?i:...)), which differs only for Unicode case folds such as "ſ" -> "s" that llama.cpp's
# ASCII classes do not make.
_HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"


def _canon_pre(pt) -> str:
    """Pre-tokenizer JSON without fields that do not change the split (offsets, prefix handling
    is kept), so two spellings of the same behaviour compare equal."""
    def strip(node):
        if isinstance(node, dict):
            out = {k: strip(v) for k, v in sorted(node.items()) if k not in ("trim_offsets",)}
            if node.get("type") == "Split" and isinstance(out.get("pattern"), dict) and "Regex" in out["pattern"]:
                out["pattern"] = {"Regex": out["pattern"]["Regex"].replace(_HF_CONTRACTIONS, _CONTRACTIONS)}
            return out
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    if isinstance(pt, dict) and pt.get("type") == "Sequence" and len(pt.get("pretokenizers", [])) == 1:
        pt = pt["pretokenizers"][0]
    if isinstance(pt, dict) and pt.get("type") == "ByteLevel" and pt.get("use_regex") is False:
        pt = dict(pt, add_prefix_space=bool(pt.get("add_prefix_space")))
    return json.dumps(strip(pt), sort_keys=True)


def pre_name_for(pre_tokenizer, ignore_merges: bool | None = None) -> str | None:
    """The ``tokenizer.ggml.pre`` name whose split ``pre_tokenizer`` (tokenizer.json) performs;
    among names that split alike, the one whose ignore_merges matches the BPE model's."""
    want = _canon_pre(pre_tokenizer)
    for name, spellings in _HF_SPELLINGS.items():
        if any(_canon_pre(s) == want for s in spellings):
            return name
    found = [p for p in PRE_TOKENIZERS if p.byte_encode and _canon_pre(p.pre_tokenizer) == want]
    if ignore_merges is not None and any(p.ignore_merges == ignore_merges for p in found):
        found = [p for p in found if p.ignore_merges == ignore_merges]
    found.sort(key=lambda p: _PREFERRED.index(p.name) if p.name in _PREFERRED else len(_PREFERRED))
    return found[0].name if found else None


def pre_by_name(name: str | None) -> PreTokenizer | None:
    return _PRE_BY_NAME.get(name)


# --- the GGUF side ------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFVocab:
    """The ``tokenizer.*`` key-values of a GGUF file (typed, nothing else)."""

    model: str                                   # gpt2 | llama
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] | None = None
    merges: tuple[str, ...] | None = None
    special_ids: dict = field(default_factory=dict)   # bos | eos | unk | pad | sep | eot ... -> id
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_sep: bool | None = None                  # tokenizer.ggml.add_sep_token, where llama.cpp's converter writes it
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    lowercase: bool | None = None                # tokenizer.ggml.normalizer.lowercase (bert)
    remove_extra_whitespaces: bool | None = None  # t5 (UGM)
    precompiled_charsmap: bytes | None = None     # t5 (UGM): SentencePiece's normalisation table

    def key_values(self) -> list[tuple[str, object, str]]:
        """(key, value, kind) with kind one of str | u32 | bool | str[] | i32[] | f32[]."""
        kv: list[tuple[str, object, str]] = [("tokenizer.ggml.model", self.model, "str")]
        if self.pre:
            kv.append(("tokenizer.ggml.pre", self.pre, "str"))
        kv.append(("tokenizer.ggml.tokens", list(self.tokens), "str[]"))
        if self.scores is not None:
            kv.append(("tokenizer.ggml.scores", list(self.scores), "f32[]"))
        kv.append(("tokenizer.ggml.token_type", list(self.token_types), "i32[]"))
        if self.merges:
            kv.append(("tokenizer.ggml.merges", list(self.merges), "str[]"))
        for typ, tid in self.special_ids.items():
            key = SPECIAL_KEYS[typ]
            kv.append((f"tokenizer.ggml.{key}", int(tid), "u32"))
        if self.add_bos is not None:
            kv.append(("tokenizer.ggml.add_bos_token", bool(self.add_bos), "bool"))
        if self.add_eos is not None:
            kv.append(("tokenizer.ggml.add_eos_token", bool(self.add_eos), "bool"))
        if self.add_sep is not None:
            kv.append(("tokenizer.ggml.add_sep_token", bool(self.add_sep), "bool"))
        if self.add_space_prefix is not None:
            kv.append(("tokenizer.ggml.add_space_prefix", bool(self.add_space_prefix), "bool"))
        if self.lowercase is not None:
            kv.append(("tokenizer.ggml.normalizer.lowercase", bool(self.lowercase), "bool"))
        if self.chat_template:
            kv.append(("tokenizer.chat_template", self.chat_template, "str"))
        return kv


# special token kind -> GGUF key suffix (gguf-py constants.py Keys.Tokenizer)
SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                "pad": "padding_token_id", "sep": "seperator_token_id", "cls": "cls_token_id",
                "mask": "mask_token_id", "eot": "eot_token_id"}
_HF_SPECIAL_NAMES = ("bos", "eos", "unk", "pad", "sep", "cls", "mask")


_ITEMS = {str: "strings", int: "integers", float: "numbers"}
_FLAG, _TEXT = Bounds("bool"), Bounds("str")


def _array(meta: dict, key: str, item: type, path: str | None) -> list | None:
    """``meta[key]`` as a list of ``item`` values (None when absent).  GGUF arrays arrive as lists,
    numpy arrays or the reader's lazy string arrays; anything else, or an item of another type
    (a GGUF array of arrays, of strings where numbers belong), is one FormatError."""
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (str, bytes)):
        v = [v]
    elif hasattr(v, "tolist"):
        v = list(v.tolist())
    elif isinstance(v, (list, tuple)):
        v = list(v)
    else:
        raise FormatError(f"{key} is {describe(v)}; it must be an array of {_ITEMS[item]}", path=path)
    want = (int, float) if item is float else item
    bad = next((x for x in v if not isinstance(x, want) or isinstance(x, bool)), None)
    if bad is not None:
        raise FormatError(f"{key} holds {describe(bad)}; it must be an array of {_ITEMS[item]}", path=path)
    return v


def vocab_from_metadata(meta: dict, path: str | None = None) -> GGUFVocab | None:
    """Typed view of a GGUF's ``tokenizer.*`` metadata (None when it has no tokenizer)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        return None
    tokens = _array(meta, "tokenizer.ggml.tokens", str, path)
    if not tokens:
        raise FormatError("tokenizer.ggml.tokens is missing, empty or not a string array", path=path)
    types = _array(meta, "tokenizer.ggml.token_type", int, path) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise FormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens", path=path)
    scores = _array(meta, "tokenizer.ggml.scores", float, path)
    if scores is not None and len(scores) != len(tokens):
        raise FormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens", path=path)
    merges = _array(meta, "tokenizer.ggml.merges", str, path)
    specials = {}
    for typ, key in SPECIAL_KEYS.items():
        v = gguf_value(meta, f"tokenizer.ggml.{key}", TOKEN_ID, path=path)
        if v is not None:
            if v >= len(tokens):
                raise FormatError(f"tokenizer.ggml.{key} = {v} is outside the {len(tokens)}-token vocabulary", path=path)
            specials[typ] = v
    def flag(key):
        return gguf_value(meta, key, _FLAG, path=path)

    def text(key):
        return gguf_value(meta, key, _TEXT, path=path)

    return GGUFVocab(
        model=text("tokenizer.ggml.model"), pre=text("tokenizer.ggml.pre"), tokens=tuple(tokens),
        token_types=tuple(types),
        scores=tuple(float(s) for s in scores) if scores is not None else None,
        merges=tuple(merges) if merges is not None else None,
        special_ids=specials, add_bos=flag("tokenizer.ggml.add_bos_token"), add_eos=flag("tokenizer.ggml.add_eos_token"),
        add_space_prefix=flag("tokenizer.ggml.add_space_prefix"), chat_template=text("tokenizer.chat_template"),
        lowercase=flag("tokenizer.ggml.normalizer.lowercase"),
        remove_extra_whitespaces=flag("tokenizer.ggml.remove_extra_whitespaces"),
        precompiled_charsmap=_charsmap(meta, path))


def _charsmap(meta: dict, path: str | None) -> bytes | None:
    """``tokenizer.ggml.precompiled_charsmap``: a GGUF u8 / i8 array, as bytes."""
    key = "tokenizer.ggml.precompiled_charsmap"
    v = meta.get(key)
    if isinstance(v, bytes):
        return v
    items = _array(meta, key, int, path)
    if items is None:
        return None
    if any(not -128 <= b <= 255 for b in items):
        raise FormatError(f"{key} holds a value outside a byte's range", path=path)
    return bytes(b & 0xFF for b in items)


# --- HF -> GGUF ---------------------------------------------------------------------------

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _read_json(p: Path) -> dict:
    from ..formats.safe_input import read_json
    return read_json(p, error=ConfigError)


def _token_content(entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _chat_template(folder: Path, tcfg: dict) -> str | None:
    ct = tcfg.get("chat_template")
    if ct is None and (folder / "chat_template.jinja").is_file():
        from ..formats.safe_input import MAX_JSON_FILE, read_regular
        path = folder / "chat_template.jinja"
        raw = read_regular(path, max_bytes=MAX_JSON_FILE, error=ConfigError)
        try:
            ct = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"is not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    if ct is None and (folder / "chat_template.json").is_file():
        ct = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(ct, list):  # named templates: llama.cpp's tokenizer.chat_template is the default one
        named = {t.get("name"): t.get("template") for t in ct if isinstance(t, dict) and isinstance(t.get("name"), str)}
        ct = named.get("default") or next(iter(named.values()), None)
    return ct if isinstance(ct, str) else None


_SPACE_IN_MERGE = chr(ord(" ") + 256)      # U+0120


def _merge_strings(merges: list, path: str) -> list[str]:
    out = []
    for m in merges:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, (list, tuple)) and len(m) == 2:
            # tokenizers >= 0.20 stores pairs; a space inside a piece is written as U+0120 + 256
            # offset, the way gguf-py's SpecialVocab encodes it for llama.cpp.
            out.append(f"{m[0].replace(' ', _SPACE_IN_MERGE)} {m[1].replace(' ', _SPACE_IN_MERGE)}")
        else:
            raise FormatError(f"merge entry {m!r} is neither 'a b' nor [a, b]", path=path)
    return out


def _add_bos_eos(tj: dict, tcfg: dict, bos: str | None, eos: str | None) -> tuple[bool, bool]:
    """Whether encoding adds BOS / EOS: tokenizer_config's flags win, else the post-processor template."""
    add_bos = tcfg.get("add_bos_token")
    add_eos = tcfg.get("add_eos_token")
    pp = tj.get("post_processor") or {}
    procs = pp.get("processors", [pp]) if isinstance(pp, dict) else []
    for proc in procs:
        if isinstance(proc, dict) and proc.get("type") == "TemplateProcessing":
            single = proc.get("single") or []
            first = single[0].get("SpecialToken", {}).get("id") if single else None
            last = single[-1].get("SpecialToken", {}).get("id") if single else None
            if add_bos is None:
                add_bos = first is not None and first == bos
            if add_eos is None:
                add_eos = last is not None and last == eos
    return bool(add_bos), bool(add_eos)


def _special_id(item) -> str | None:
    return item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None


def _add_sep(tj: dict, tcfg: dict, sep: str | None, eos: str | None) -> bool | None:
    """Whether encoding a pair puts a separator between the sequences, decided as llama.cpp's
    converter decides it (gguf-py ``SpecialVocab._try_load_from_tokenizer_json``): RobertaProcessing
    adds one; a TemplateProcessing ``pair`` template ``[first] A X [Y] B [last]`` adds one when X
    (or Y) is the sep or eos token (X only when the single template has no trailing special);
    else tokenizer_config's ``add_sep_token``.  None where the converter writes no key."""
    add = None
    pp = tj.get("post_processor") or {}
    for proc in (pp.get("processors", [pp]) if isinstance(pp, dict) else []):
        kind = proc.get("type") if isinstance(proc, dict) else None
        if kind == "RobertaProcessing":
            add = True
        elif kind == "TemplateProcessing":
            single, pair = proc.get("single") or [], proc.get("pair") or []
            first = _special_id(single[0]) if len(single) > 1 else None
            last = _special_id(single[-1]) if len(single) > 1 else None
            end_token = last or eos          # a trailing special of the single template becomes its eos
            if not pair:
                continue
            start = 1 if first and _special_id(pair[0]) == first else 0
            stop = -1 if last and _special_id(pair[-1]) == last else None
            mid = pair[start:stop]
            seq = [m.get("Sequence", {}).get("id") if isinstance(m, dict) else None for m in mid[:1] + mid[-1:]]
            inner = mid[1:-1]
            if seq == ["A", "B"] and inner:
                add = bool(_special_id(inner[0]) in (sep, end_token) and _special_id(inner[0]) is not None
                           and not last)
                if len(inner) == 2 and _special_id(inner[1]) is not None and _special_id(inner[1]) in (sep, end_token):
                    add = True
    if add is None and isinstance(tcfg.get("add_sep_token"), bool):
        add = tcfg["add_sep_token"]
    return add


def _spm_scores_from_model(path: Path, n: int) -> list[float] | None:
    """Exact scores from a SentencePiece ``tokenizer.model`` (as llama.cpp's converter reads them)."""
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:  # optional: fall back to merge ranks
        return None
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(path))
    if sp.vocab_size() > n:
        return None
    return [sp.GetScore(i) for i in range(sp.vocab_size())]


def _vocab_sources(folder: Path, effective_json: str | None | bool) -> tuple[Path, dict, dict]:
    """tokenizer.json's path, its effective content and tokenizer_config.json (``{}`` when absent)."""
    tj_path = folder / "tokenizer.json"
    if not tj_path.is_file() and isinstance(effective_json, str) and (folder / "tokenizer.model").is_file():
        # no tokenizer.json, but transformers built the tokenizer from tokenizer.model (InternLM2's
        # folders, read through the class computing the same function)
        tj_path = folder / "tokenizer.model"
    elif not tj_path.is_file():
        raise ConfigError("no tokenizer.json: llama.cpp needs the vocabulary inside the GGUF",
                          path=str(folder), hint="save the tokenizer with AutoTokenizer.save_pretrained(folder) first")
    if effective_json is False:
        effective_json = effective_tokenizer_json(folder)
    tj = json.loads(effective_json) if effective_json else _read_json(tj_path)
    tcfg = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    return tj_path, tj, tcfg


def _ids_to_tokens(vocab: dict, n_vocab: int, tj_path: Path) -> dict[int, str]:
    """Invert ``vocab``; colliding ids and ids past the embedding's rows are errors."""
    id_to_tok: dict[int, str] = {}
    for tok, i in vocab.items():
        if i in id_to_tok and id_to_tok[i] != tok:
            raise FormatError(f"ids collide: {id_to_tok[i]!r} and {tok!r} both have id {i}", path=str(tj_path))
        id_to_tok[i] = tok
    top = max(id_to_tok) + 1
    if top > n_vocab:
        raise ConfigError(f"the tokenizer has ids up to {top - 1} but the model's embedding has only {n_vocab} rows",
                          path=str(tj_path))
    return id_to_tok


def _tokens_and_types(id_to_tok: dict[int, str], n_vocab: int, unk, special_added: dict[str, bool],
                      spm: bool) -> tuple[list[str], list[int]]:
    """One token string and GGUF token type per embedding row (``[PADi]``/UNUSED for holes)."""
    tokens, types = [], []
    for i in range(n_vocab):
        tok = id_to_tok.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if tok == unk and spm:
            types.append(UNKNOWN)     # SentencePiece's <unk>: llama.cpp's SPM path looks for this type
        elif tok in special_added:
            types.append(CONTROL if special_added[tok] else USER_DEFINED)
        elif spm and _BYTE_TOKEN.match(tok):
            types.append(BYTE)
        elif tok == unk:
            types.append(UNKNOWN)
        else:
            types.append(NORMAL)
        tokens.append(tok)
    return tokens, types


def _gpt2_pre_name(tj: dict, model: dict, tj_path: Path) -> str:
    """llama.cpp's name for a byte-level tokenizer's pre_tokenizer; unknown ones are refused."""
    pre = pre_name_for(tj.get("pre_tokenizer"), ignore_merges=bool(model.get("ignore_merges")))
    if pre is None:
        raise UnsupportedError(
            "tokenizer.json's pre_tokenizer is not one llama.cpp knows by name "
            f"({json.dumps(tj.get('pre_tokenizer'))[:160]}); llama.cpp would split text differently",
            path=str(tj_path), hint=f"known: {', '.join(p.name for p in PRE_TOKENIZERS)}")
    return pre


def _special_ids(folder: Path, vocab: dict, specials_by_name: dict, config: dict | None,
                 n_vocab: int) -> dict[str, int]:
    """Special ids: tokenizer_config names them; config.json / generation_config.json fill gaps."""
    ids = {typ: vocab[c] for typ, c in specials_by_name.items()}
    cfgs = [config or {}]
    if (folder / "generation_config.json").is_file():
        cfgs.insert(0, _read_json(folder / "generation_config.json"))
    for typ in ("bos", "eos", "pad"):
        for c in cfgs:
            v = c.get(f"{typ}_token_id")
            if isinstance(v, list):
                v = v[0] if v else None
            if typ not in ids and isinstance(v, int) and 0 <= v < n_vocab:
                ids[typ] = v
    return ids


def hf_vocab(folder: str | Path, n_vocab: int, config: dict | None = None, *,
             effective_json: str | None | bool = False) -> GGUFVocab:
    """Build the GGUF vocabulary for a model with ``n_vocab`` embedding rows from an HF folder.

    ``effective_json``: :func:`effective_tokenizer_json` of the folder when the caller has it
    already (computed in another process, so that this one never imports transformers);
    ``False``: computed here."""
    folder = Path(folder)
    tj_path, tj, tcfg = _vocab_sources(folder, effective_json)
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedError(f"tokenizer model type {model.get('type')!r}: only BPE (byte-level or SentencePiece-style) "
                               "vocabularies convert to GGUF here", path=str(tj_path))
    vocab: dict = dict(model.get("vocab") or {})
    added = tj.get("added_tokens") or []
    for a in added:
        vocab.setdefault(a["content"], a["id"])
    id_to_tok = _ids_to_tokens(vocab, n_vocab, tj_path)
    spm = bool(model.get("byte_fallback"))
    kind = "llama" if spm else "gpt2"

    special_added = {a["content"]: bool(a.get("special")) for a in added}
    specials_by_name = {}
    for typ in _HF_SPECIAL_NAMES:
        content = _token_content(tcfg.get(f"{typ}_token"))
        if content is not None and content in vocab:
            specials_by_name[typ] = content
    unk = model.get("unk_token") if isinstance(model.get("unk_token"), str) else specials_by_name.get("unk")
    tokens, types = _tokens_and_types(id_to_tok, n_vocab, unk, special_added, spm)

    merges = _merge_strings(model.get("merges") or [], str(tj_path))
    scores = None
    add_space_prefix = None
    if spm:
        scores = _spm_scores(folder, merges, tokens, types)
        add_space_prefix = _spm_adds_prefix(tj)
        pre = "default"
    else:
        pre = _gpt2_pre_name(tj, model, tj_path)

    ids = _special_ids(folder, vocab, specials_by_name, config, n_vocab)
    add_bos, add_eos = _add_bos_eos(tj, tcfg, specials_by_name.get("bos"), specials_by_name.get("eos"))
    add_sep = _add_sep(tj, tcfg, _token_content(tcfg.get("sep_token")), _token_content(tcfg.get("eos_token")))
    return GGUFVocab(model=kind, pre=pre, tokens=tuple(tokens), token_types=tuple(types),
                     scores=tuple(scores) if scores is not None else None,
                     merges=tuple(merges) if (merges and not spm) else None,
                     special_ids=ids, add_bos=add_bos, add_eos=add_eos, add_sep=add_sep,
                     add_space_prefix=add_space_prefix,
                     chat_template=_chat_template(folder, tcfg))


def effective_tokenizer_json(folder: str | Path) -> str | None:
    """The tokenizer transformers actually runs for this folder, as tokenizer.json text.

    transformers >= 5 picks a tokenizer class from config.json's model_type and some classes
    rebuild parts of the pipeline in code: ``Qwen2Tokenizer`` splits with the Qwen2 regex
    whatever tokenizer.json's pre_tokenizer says.  llama.cpp must split like the tokenizer users
    run, so the vocabulary, merges and pre-tokenizer are read from the loaded tokenizer's
    backend; None (read the file itself) when transformers cannot load it.
    """
    try:
        from transformers import AutoTokenizer
        from ..quiet import quiet_transformers
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is not None:
            return backend.to_str()
    except Exception:  # noqa: BLE001 - fall back to the file as written
        pass
    return None


def _spm_scores(folder: Path, merges: list[str], tokens: list[str], types: list[int]) -> list[float]:
    if (folder / "tokenizer.model").is_file():
        exact = _spm_scores_from_model(folder / "tokenizer.model", len(tokens))
        if exact is not None:
            # rows past the SentencePiece model scored as llama.cpp's _create_vocab_sentencepiece
            # does: an added token -1000, a [PAD{i}] row -10000
            return exact + [-10000.0 if types[i] == UNUSED else -1000.0 for i in range(len(exact), len(tokens))]
    # llama.cpp picks the pair with the highest score; tokenizers picks the lowest merge rank.
    # score = -rank of the first merge that produces the token makes the two orders agree.
    rank: dict[str, int] = {}
    for r, m in enumerate(merges):
        a, _, b = m.partition(" ")
        rank.setdefault(a + b, r)
    out = []
    for tok, typ in zip(tokens, types):
        if typ == NORMAL and tok in rank:
            out.append(-float(rank[tok]))
        elif typ == NORMAL and len(tok) > 1:
            out.append(-float(len(merges) + 1))   # reachable by no merge: lowest priority
        else:
            out.append(0.0)
    return out


def _spm_adds_prefix(tj: dict) -> bool:
    """Does the tokenizer put ``▁`` in front of the text (Metaspace prepend / Prepend normalizer)?"""
    text = json.dumps([tj.get("normalizer"), tj.get("pre_tokenizer")])
    if '"Prepend"' in text:
        return True
    pt = tj.get("pre_tokenizer") or {}
    for node in (pt.get("pretokenizers") or [pt]) if isinstance(pt, dict) else []:
        if isinstance(node, dict) and node.get("type") == "Metaspace":
            scheme = node.get("prepend_scheme")
            if scheme is None:
                return bool(node.get("add_prefix_space", True))
            return scheme in ("first", "always")
    return False


# --- GGUF -> HF ---------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode table (openai/gpt-2 encoder.py bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _kept_ids(v: GGUFVocab) -> int:
    """Number of leading ids the HF tokenizer keeps: trailing ``[PAD{i}]`` UNUSED rows are padding."""
    n = len(v.tokens)
    while n > 0 and v.token_types[n - 1] == UNUSED and v.tokens[n - 1] == f"[PAD{n - 1}]":
        n -= 1
    return n


def _spm_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary pieces, best score first (ties: lower ids)."""
    found = []
    for tok, tid in vocab.items():
        if len(tok) < 2:
            continue
        for i in range(1, len(tok)):
            a, b = tok[:i], tok[i:]
            if a in vocab and b in vocab:
                found.append((-scores.get(tok, 0.0), tid, vocab[a], vocab[b], a, b))
    found.sort()
    return [(a, b) for *_, a, b in found]


def _merge_pairs(v: GGUFVocab, path: str | None) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` (``"a b"`` strings) as pairs."""
    merges = []
    for m in v.merges or ():
        a, sep, b = m.partition(" ")
        if not sep:
            raise FormatError(f"tokenizer.ggml.merges entry {m!r} has no space", path=path)
        merges.append((a, b))
    return merges


def _set_pre_tokenizer(tok, pre: PreTokenizer) -> None:
    # The pre-tokenizer goes through a model-less tokenizer.json: the table keeps the JSON
    # spelling, and re-serialising the whole vocabulary for it costs seconds at 256k tokens.
    from tokenizers import Tokenizer
    tok.pre_tokenizer = Tokenizer.from_str(json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "vocab": {}, "unk_token": ""},
         "pre_tokenizer": pre.pre_tokenizer})).pre_tokenizer


def _raw_bpe(v: GGUFVocab, tokens: list[str], pre: PreTokenizer, path: str | None):
    """BPE over raw UTF-8 (llama.cpp ``byte_encode = false``: the ``gemma4`` model, and the
    gemma4 / sarvam-moe / whitespace pre types): merges as stored, spaces spelled ``▁`` first when
    the pre type escapes them, the type's split, ``<0xNN>`` byte tokens for what no piece covers.
    The ``whitespace`` model (llm_tokenizer_whitespace_session) first drops whitespace, cutting
    the text there, and lowercases unless told not to."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = v.special_ids.get("unk")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merge_pairs(v, path), byte_fallback=True,
                               unk_token=tokens[unk] if unk is not None else None))
    decs = [decoders.ByteFallback(), decoders.Fuse()]
    if pre.escape_whitespaces:
        tok.normalizer = normalizers.Replace(" ", "▁")
        decs.insert(0, decoders.Replace("▁", " "))
    _set_pre_tokenizer(tok, pre)
    if v.model == "whitespace":
        if v.lowercase if v.lowercase is not None else pre.lowercase:
            tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), tok.pre_tokenizer])
    tok.decoder = decoders.Sequence(decs)
    return tok


def _wordpiece(v: GGUFVocab, tokens: list[str], types: list[int]):
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


def _unigram(v: GGUFVocab, tokens: list[str]):
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


@dataclass(frozen=True)
class HFTokenizerFiles:
    """The text of the files written into the HF folder."""

    tokenizer_json: str
    tokenizer_config: dict
    special_ids: dict
    warnings: tuple[str, ...] = ()


def _rebuild_pre(v: GGUFVocab, warnings: list[str]):
    """The pre-tokenizer llama.cpp uses for a gpt2/gemma4/whitespace vocabulary (None for others)."""
    if v.model not in ("gpt2", "gemma4", "whitespace"):
        return None
    # llama.cpp: a gemma4 model always uses the gemma4 pre type; a gpt2 one without a name
    # the "default" regexes (with a loud warning), and an unknown name does not load at all.
    pre = pre_by_name("gemma4" if v.model == "gemma4" else (v.pre or "default"))
    if v.model != "gemma4" and not v.pre:
        warnings.append("tokenizer.ggml.pre is missing: llama.cpp splits such a file with its 'default' "
                        "regexes, and so does the rebuilt tokenizer")
    if pre is None:
        warnings.append(f"tokenizer.ggml.pre={v.pre!r} is not in llama.cpp's table (llama.cpp refuses to load "
                        "the file); using GPT-2's split")
        pre = pre_by_name("gpt-2")
    return pre


def _byte_level_bpe(v: GGUFVocab, tokens: list[str], types: list[int], pre, path: str | None):
    """A byte-level BPE tokenizer (``gpt2``) from the GGUF vocabulary."""
    from tokenizers import Tokenizer, decoders, models

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # Control tokens are stored as raw text; the BPE vocabulary wants them byte-level spelled
    # (transformers integrations/gguf byte_level_tokenizer does the same).  Normal tokens
    # outside the byte alphabet (command-r's raw "\u200d") are ones llama.cpp's BPE never
    # produces, and user-defined ones (mpt's runs of spaces) llama.cpp matches in the raw
    # text before BPE: both keep their stored spelling, so they cannot shadow the byte-level
    # token with the same bytes.
    vocab_tokens = [t if set(t) <= alphabet or ty != CONTROL else "".join(spelling[b] for b in t.encode("utf-8"))
                    for t, ty in zip(tokens, types)]
    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    if len(vocab) != len(vocab_tokens):
        vocab = {}
        for i, t in enumerate(vocab_tokens):
            vocab.setdefault(t, i)
    merges = _merge_pairs(v, path)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    _set_pre_tokenizer(tok, pre)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    return tok


def _spm_bpe(v: GGUFVocab, tokens: list[str], types: list[int]):
    """A SentencePiece-style BPE tokenizer (``llama``) with byte fallback from the GGUF vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    scores = {t: (v.scores[i] if v.scores else -float(i)) for i, t in enumerate(tokens)}
    normal = {t: i for t, i in vocab.items() if types[i] in (NORMAL, UNKNOWN)}
    merges = _spm_merges(normal, scores)
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = v.add_space_prefix if v.add_space_prefix is not None else True
    norms = ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(norms)
    decs = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        decs.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(decs)
    return tok


def _rebuild_model(v: GGUFVocab, tokens: list[str], types: list[int], pre, path: str | None):
    """The tokenizers ``Tokenizer`` for the vocabulary's model kind, before added tokens."""
    if pre is not None and not pre.byte_encode:
        return _raw_bpe(v, tokens, pre, path)
    if v.model == "gpt2":
        return _byte_level_bpe(v, tokens, types, pre, path)
    if v.model == "llama":
        return _spm_bpe(v, tokens, types)
    if v.model == "bert":
        return _wordpiece(v, tokens, types)
    if v.model == "t5":
        return _unigram(v, tokens)
    raise UnsupportedError(f"tokenizer.ggml.model={v.model!r}: only 'gpt2' (byte-level BPE), 'llama' "
                           "(SentencePiece BPE), 'gemma4' / 'whitespace' (raw UTF-8 BPE), 'bert' (WordPiece) and 't5' (unigram) "
                           "vocabularies are rebuilt", path=path)


def _set_post_processor(tok, v: GGUFVocab, tokens: list[str], names: dict[str, str],
                        add_bos: bool, add_eos: bool) -> None:
    """BOS/EOS (or BERT's [CLS] ... [SEP]) templates as llama.cpp adds them."""
    from tokenizers import processors

    bos, eos = names.get("bos"), names.get("eos")
    single, pair, sp = "$A", "$A $B", []
    if add_bos and bos is not None:
        single, pair = f"{bos} {single}", f"{bos} $A {bos} $B"
        sp.append((bos, v.special_ids["bos"]))
    if add_eos and eos is not None:
        single, pair = f"{single} {eos}", f"{pair} {eos}"
        sp.append((eos, v.special_ids["eos"]))
    cls, sep = v.special_ids.get("cls", v.special_ids.get("bos")), v.special_ids.get("sep")
    if v.model == "bert" and cls is not None and sep is not None:
        # llama.cpp's WPM adds [CLS] ... [SEP] (whatever the flags), as BERT's own template does.
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[cls]} $A {tokens[sep]}", pair=f"{tokens[cls]} $A {tokens[sep]} $B:1 {tokens[sep]}:1",
            special_tokens=sorted({(tokens[cls], cls), (tokens[sep], sep)}))
    elif sp:
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=sorted(set(sp)))
    elif v.model == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)


def hf_tokenizer_files(v: GGUFVocab, *, model_max_length: int | None = None, path: str | None = None) -> HFTokenizerFiles:
    """Rebuild ``tokenizer.json`` + ``tokenizer_config.json`` from a GGUF vocabulary."""
    from tokenizers import AddedToken

    warnings = []
    n = _kept_ids(v)
    tokens = list(v.tokens[:n])
    types = list(v.token_types[:n])
    pre = _rebuild_pre(v, warnings)
    tok = _rebuild_model(v, tokens, types, pre, path)

    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if specials:
        tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)

    names = {typ: tokens[i] for typ, i in v.special_ids.items() if i < n}
    # llama.cpp: add_bos defaults on for SPM and WPM and for the BPE pre names that set it
    # (Llama 3, tekken, chameleon); the file's tokenizer.ggml.add_bos_token overrides; the gemma4
    # pre type forces it on.
    add_bos = bool(v.add_bos) if v.add_bos is not None else (v.model in ("llama", "bert")
                                                               or (pre is not None and pre.add_bos))
    if pre is not None and pre.type == "GEMMA4":
        add_bos = True
    add_eos = bool(v.add_eos) if v.add_eos is not None else v.model == "t5"   # llama.cpp: UGM adds EOS
    if v.model == "bert":
        # llama.cpp's WPM adds [CLS] ... [SEP] whatever the file's add_bos / add_eos say
        # (llama_vocab::impl::tokenize, LLAMA_VOCAB_TYPE_WPM); tokenizer.ggml.add_sep_token is not
        # read by its tokenizer at all (only by callers formatting rerank pairs)
        add_bos, add_eos = True, False
    _set_post_processor(tok, v, tokens, names, add_bos, add_eos)

    tcfg: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  "add_bos_token": add_bos, "add_eos_token": add_eos}
    for typ in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        if typ in names:
            tcfg[f"{typ}_token"] = names[typ]
    if model_max_length:
        tcfg["model_max_length"] = int(model_max_length)
    if v.chat_template:
        tcfg["chat_template"] = v.chat_template
    ids = {f"{typ}_token_id": i for typ, i in v.special_ids.items() if typ in ("bos", "eos", "pad") and i < n}
    return HFTokenizerFiles(tok.to_str(pretty=True), tcfg, ids, tuple(warnings))


def _sp_pieces(sp, n: int, quirks: dict) -> tuple[list, list, list]:
    """The first ``n`` pieces of a SentencePiece model -> (tokens, scores, types), with the
    ``replace`` and ``unused_prefix`` quirks applied."""
    replace, unused = quirks.get("replace", {}), quirks.get("unused_prefix")
    tokens, scores, types = [], [], []
    for i in range(min(n, sp.vocab_size())):
        piece = sp.IdToPiece(i)
        tokens.append(replace.get(piece, piece))
        scores.append(sp.GetScore(i))
        typ = (UNKNOWN if sp.IsUnknown(i) else CONTROL if sp.IsControl(i) else UNUSED if sp.IsUnused(i)
               else BYTE if sp.IsByte(i) else NORMAL)
        types.append(UNUSED if unused and piece.startswith(unused) else typ)
    return tokens, scores, types


def _added_token_overrides(folder: Path) -> list[tuple[int, dict]]:
    """(id, entry) of tokenizer_config.json's ``added_tokens_decoder``, then tokenizer.json's
    ``added_tokens`` (later entries win)."""
    tcfg = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    overrides = [(int(tid), data) for tid, data in (tcfg.get("added_tokens_decoder") or {}).items()]
    tj = _read_json(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else {}
    return overrides + [(int(a["id"]), a) for a in tj.get("added_tokens") or []]


def spm_model_vocab(vocab: GGUFVocab, folder: str | Path, quirks: dict) -> GGUFVocab:
    """``vocab``'s tokens, scores and types re-read from ``tokenizer.model`` piece by piece, as a
    llama.cpp converter that walks the SentencePiece model does (InternLM2Model.set_vocab), with
    that converter's ``quirks`` (registry ``Conversion.spm_quirks``):

    * ``replace``: piece text -> the text written instead (InternLM2: ``"\\x00"`` -> ``"🐉"``, which
      llama.cpp would otherwise read as an empty string);
    * ``unused_prefix``: pieces starting with it are typed UNUSED (InternLM2's ``[UNUSED_TOKEN_*]``);
    * ``chat_eos``: when an added token has this content, it becomes the eos id (the chat model's
      ``<|im_end|>`` ends a turn).

    SentencePiece's own types are kept (user-defined pieces read as NORMAL, as the converter has
    it); then added_tokens.json appends tokens, and tokenizer_config.json's ``added_tokens_decoder``
    and tokenizer.json's ``added_tokens`` override theirs (score -1000, CONTROL when special,
    USER_DEFINED otherwise).  Special ids, add_bos / add_eos and the chat template stay ``vocab``'s.
    """
    import dataclasses

    from sentencepiece import SentencePieceProcessor

    folder = Path(folder)
    path = folder / "tokenizer.model"
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(path))
    n = len(vocab.tokens)
    if sp.vocab_size() < n and not (folder / "added_tokens.json").is_file():
        raise ConfigError(f"{sp.vocab_size()} SentencePiece pieces for {n} embedding rows", path=str(path))
    tokens, scores, types = _sp_pieces(sp, n, quirks)
    if (folder / "added_tokens.json").is_file():
        for content in _read_json(folder / "added_tokens.json"):
            tokens.append(content)
            scores.append(-1000.0)
            types.append(USER_DEFINED)
    chat_eos = None
    for tid, data in _added_token_overrides(folder):
        if not 0 <= tid < len(tokens):
            raise ConfigError(f"added token {data.get('content')!r} has id {tid}, past the {len(tokens)} tokens",
                              path=str(path))
        tokens[tid], scores[tid] = data["content"], -1000.0
        types[tid] = CONTROL if data.get("special") else USER_DEFINED
        if data["content"] == quirks.get("chat_eos"):
            chat_eos = tid
    if len(tokens) != n:
        raise ConfigError(f"{len(tokens)} tokens (tokenizer.model and added tokens) for {n} embedding rows",
                          path=str(path))
    special_ids = dict(vocab.special_ids, **({"eos": chat_eos} if chat_eos is not None else {}))
    return dataclasses.replace(vocab, tokens=tuple(tokens), scores=tuple(scores), token_types=tuple(types),
                               special_ids=special_ids)
