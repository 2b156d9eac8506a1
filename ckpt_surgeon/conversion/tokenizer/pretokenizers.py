"""Pre-tokenizers: how text is split before BPE, as llama.cpp names and runs each split.

llama.cpp's own table, mirrored as data (llama-vocab.cpp of the llama-cpp-python version the
tests run against; tests/test_tokenizer_table.py parses that file and fails on any drift):

* ``llama_vocab::impl::load`` maps each ``tokenizer.ggml.pre`` name to a pre-tokenizer type
  ``LLAMA_VOCAB_PRE_TYPE_<TYPE>`` and sets flags: :data:`_PRE_NAMES` below, one line per
  ``else if`` block of that chain.
* ``llm_tokenizer_bpe`` gives each type a list of regexes, applied one after the other to every
  piece the previous ones left (matches and the text between them both kept), and whether
  pieces are byte-level encoded: :data:`PRE_TYPE_REGEXES`, the strings exactly as llama.cpp
  writes them.  :func:`_oniguruma` turns one into the regex tokenizers' Oniguruma must run to
  split the same way.

Both sides of the mapping live here, :data:`PRE_TOKENIZERS`, so ``tokenizer.ggml.pre`` is
recognised from ``tokenizer.json`` (:func:`pre_name_for`) and rebuilt from a GGUF
(:func:`pre_by_name`) the same way.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass


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


def pre_name_for_json(tokenizer_json: dict) -> str | None:
    """:func:`pre_name_for` on a whole ``tokenizer.json`` (its split, its BPE model's ignore_merges).  A WordPiece
    vocabulary gets ``default``: llama.cpp writes it as a ``bert`` (WPM) vocabulary, whose tokenizer splits words
    itself ("only BPE models have pre-tokenizers", llama-vocab.cpp), so the name is metadata only and ``default``
    is what llama.cpp's own converter writes where no hash is needed."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") == "WordPiece":
        return "default"
    return pre_name_for(tokenizer_json.get("pre_tokenizer"), ignore_merges=bool(model.get("ignore_merges")))


def pre_by_name(name: str | None) -> PreTokenizer | None:
    return _PRE_BY_NAME.get(name)
