"""Byte-level BPE (``tokenizer.ggml.model = gpt2``: GPT-2, Qwen2, Llama 3, SmolLM ...) both ways,
and BPE over raw UTF-8 (``gemma4``, ``whitespace``).

Tokens are stored in the byte-to-unicode spelling (``Ġthe``), merges as ``"a b"`` strings.  How
text is split *before* BPE is ``tokenizer.ggml.pre`` (:mod:`.pretokenizers`).
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import FormatError, UnsupportedError
from .pretokenizers import PRE_TOKENIZERS, PreTokenizer, pre_by_name, pre_name_for_json
from .vocab import GGUFVocab


_SPACE_IN_MERGE = chr(ord(" ") + 256)      # U+0120


def merge_strings(merges: list, path: str) -> list[str]:
    """tokenizer.json's merges (``"a b"`` strings or ``[a, b]`` pairs) as ``"a b"`` strings."""
    try:            # the common cases at comprehension speed: strings already (tokenizers < 0.20 writes them, and a
        if all(type(m) is str for m in merges):         # record passes its own), or pairs without a space in them
            return list(merges)
        if all(type(m) is list and len(m) == 2 and type(m[0]) is str and type(m[1]) is str for m in merges):
            out = [f"{a} {b}" for a, b in merges]
            if all(o.count(" ") == 1 for o in out):
                return out
    except TypeError:
        pass
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


def gpt2_pre_name(tj: dict, tj_path: Path) -> str:
    """llama.cpp's name for a byte-level tokenizer's pre_tokenizer; unknown ones are refused."""
    pre = pre_name_for_json(tj)
    if pre is None:
        raise UnsupportedError(
            "tokenizer.json's pre_tokenizer is not one llama.cpp knows by name "
            f"({json.dumps(tj.get('pre_tokenizer'))[:160]}); llama.cpp would split text differently",
            path=str(tj_path), hint=f"known: {', '.join(p.name for p in PRE_TOKENIZERS)}")
    return pre


def bytes_to_unicode() -> dict[int, str]:
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


def rebuild_pre(v: GGUFVocab, warnings: list[str]):
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


def byte_level_bpe(v: GGUFVocab, tokens: list[str], types: list[int], pre, path: str | None):
    """A byte-level BPE tokenizer (``gpt2``) from the GGUF vocabulary."""
    from tokenizers import Tokenizer, decoders, models

    # Every token keeps its stored spelling.  Control tokens are matched as added (special) tokens
    # before BPE, by their raw text, and an added token takes the id the vocabulary gives its
    # content: re-spelled in the byte alphabet, a non-ASCII control token (DeepSeek's
    # <｜begin▁of▁sentence｜>) would be added at a new id past the vocabulary.  Normal tokens outside
    # the byte alphabet (command-r's raw "\u200d") are ones llama.cpp's BPE never produces, and
    # user-defined ones (mpt's runs of spaces) llama.cpp matches in the raw text before BPE: they
    # cannot shadow the byte-level token with the same bytes.
    vocab_tokens = list(tokens)
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


def raw_bpe(v: GGUFVocab, tokens: list[str], pre: PreTokenizer, path: str | None):
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
