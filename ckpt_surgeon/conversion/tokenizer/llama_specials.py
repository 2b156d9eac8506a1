"""Which ids a GGUF vocabulary's special tokens get in llama.cpp, and which ids end generation.

llama.cpp decides this at load time (``llama_vocab::impl::load`` in llama-vocab.cpp of the
llama-cpp-python version the tests run against), in four steps mirrored here as data:

1. defaults per ``tokenizer.ggml.model`` (:data:`MODEL_DEFAULTS`: a ``gpt2`` vocabulary gets
   bos = eos = 11 unless the file names them, a ``llama`` one 1 / 2 / unk 0 ...), and for BPE the
   flags of its ``tokenizer.ggml.pre`` name (:mod:`.pretokenizers`: add_bos, no BOS);
2. the ``tokenizer.ggml.*_token_id`` keys override them (an id outside the vocabulary keeps the
   default: llama.cpp warns "bad special token");
3. tokens found by their text where no key named them (:data:`AUTO_SPECIALS`: ``<|im_end|>`` is
   an end-of-turn token, ``<|fim_prefix|>`` a fill-in-the-middle prefix ...);
4. the end-of-generation set (:data:`EOG_TEXTS`): FIM pad / repo / separator, every token whose
   text is in the list, then eos, eot and eom; then two work-arounds (o200k-harmony's and
   solar-open's ``<|end|>`` is not EOG; gemma4's and plamo's ``</s>`` is a normal token).

``tests/test_tokenizer_specials.py`` holds the mirror there twice: the lists are parsed out of the
installed llama-cpp-python's ``llama-vocab.cpp`` and must be equal, and llama.cpp itself (vocab
only) must give the same special ids, EOG set and add flags on real and planted vocabularies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .pretokenizers import pre_by_name
from .vocab import BYTE, CONTROL, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab

# step 1: tokenizer.ggml.model -> default special ids (None: LLAMA_TOKEN_NULL) and add flags
_NULL_IDS = {"bos": None, "eos": None, "unk": None, "sep": None, "pad": None, "mask": None}
MODEL_DEFAULTS: dict[str, tuple[dict, dict]] = {
    "llama": ({**_NULL_IDS, "bos": 1, "eos": 2, "unk": 0}, {"add_bos": True, "add_eos": False, "add_sep": False}),
    "bert": ({"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
             {"add_bos": True, "add_eos": False, "add_sep": True}),
    "gpt2": ({**_NULL_IDS, "bos": 11, "eos": 11}, {"add_bos": False, "add_eos": False, "add_sep": False}),
    "t5": ({**_NULL_IDS, "eos": 1, "unk": 2, "pad": 0}, {"add_bos": False, "add_eos": True, "add_sep": False}),
    "rwkv": (dict(_NULL_IDS), {"add_bos": False, "add_eos": False, "add_sep": False}),
    "plamo2": ({**_NULL_IDS, "bos": 1, "eos": 2, "unk": 0, "pad": 3},
               {"add_bos": False, "add_eos": False, "add_sep": False}),
    "gemma4": (dict(_NULL_IDS), {"add_bos": False, "add_eos": False, "add_sep": False}),
}
MODEL_DEFAULTS["hybriddna"] = MODEL_DEFAULTS["whitespace"] = MODEL_DEFAULTS["gpt2"]
BPE_MODELS = ("gpt2", "hybriddna", "whitespace", "gemma4")

# step 2: the keys llama.cpp reads, in its order (gguf-py Keys.Tokenizer); the deprecated
# prefix / suffix / middle keys come last and win over the fim_* ones.
ID_KEYS: tuple[tuple[str, str], ...] = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
    ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"))
SPECIAL_KINDS = ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre", "fim_suf", "fim_mid",
                 "fim_pad", "fim_rep", "fim_sep")

# step 3: special ids found by their text when no key names them (the first match in llama.cpp's
# walk over its token map wins; which one that is, when a vocabulary holds two, is the hash map's order)
AUTO_SPECIALS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

# step 4: tokens that end generation by their text
EOG_TEXTS: tuple[str, ...] = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
# the work-arounds: <|end|> leaves the set beside <|return|> + <|call|> (o200k-harmony) or <|calls|> +
# <|flush|> (solar-open); </s> leaves it beside <|tool_response> (gemma4) or <|plamo:eos|> (plamo)
_END_DROPPED_BY = (("<|return|>", "<|call|>"), ("<|calls|>", "<|flush|>"))
_S_DROPPED_BY = ("<|tool_response>", "<|plamo:eos|>")


@dataclass(frozen=True)
class LlamaSpecials:
    """A vocabulary's special ids and generation stops as llama.cpp loads them."""

    ids: dict                      # kind (SPECIAL_KINDS) -> id, only those that are set
    eog: tuple[int, ...]           # ids that end generation, sorted
    add_bos: bool
    add_eos: bool
    add_sep: bool
    found_by_text: tuple[str, ...] = ()    # kinds found by their text (step 3), not by a key
    notes: tuple[str, ...] = field(default=())


def _defaults(v: GGUFVocab) -> tuple[dict, dict, list]:
    ids, flags = MODEL_DEFAULTS.get(v.model, (dict(_NULL_IDS), {"add_bos": False, "add_eos": False,
                                                                 "add_sep": False}))
    ids, flags, notes = dict(ids), dict(flags), []
    if v.model in BPE_MODELS:
        name = "gemma4" if v.model == "gemma4" else (v.pre or "default")
        pre = pre_by_name(name)
        if not v.pre and v.model != "gemma4":
            notes.append("no tokenizer.ggml.pre: llama.cpp splits with its 'default' regexes (and warns: "
                         "'GENERATION QUALITY WILL BE DEGRADED')")
        if pre is None:
            notes.append(f"tokenizer.ggml.pre {name!r} is not a name llama.cpp knows: it refuses to load the file")
        else:
            flags["add_bos"] = flags["add_bos"] or pre.add_bos
            flags["add_sep"] = flags["add_sep"] or pre.add_sep
            if pre.bos_null:
                ids["bos"] = None
    return ids, flags, notes


def llama_specials(v: GGUFVocab, keys: dict | None = None) -> LlamaSpecials:
    """llama.cpp's special ids, EOG set and add flags for the vocabulary ``v``.

    ``keys``: the ``tokenizer.ggml.*_token_id`` values the file holds, by key suffix (default: the
    ones :class:`GGUFVocab` carries); a value outside the vocabulary is ignored, as llama.cpp does."""
    n = len(v.tokens)
    ids, flags, notes = _defaults(v)
    ids = {k: (i if i is not None and i < n else None) for k, i in ids.items()}
    given = keys if keys is not None else {suffix: v.special_ids[kind] for kind, suffix in ID_KEYS
                                           if kind in v.special_ids}
    for kind, suffix in ID_KEYS:
        got = given.get(suffix)
        if isinstance(got, int) and not isinstance(got, bool):
            if 0 <= got < n:
                ids[kind] = got
            else:
                notes.append(f"tokenizer.ggml.{suffix} = {got} is outside the {n}-token vocabulary: llama.cpp "
                             "ignores it")
    for key, attr in (("add_bos", v.add_bos), ("add_eos", v.add_eos), ("add_sep", v.add_sep)):
        if attr is not None:
            flags[key] = bool(attr)
    if v.model == "gemma4" and not flags["add_bos"]:
        flags["add_bos"] = True                 # llama.cpp's Gemma 4 work-around
    # step 3: by text, where no key (and no default) set the kind
    by_text = _first_ids(v.tokens)
    found = []
    for kind, texts in AUTO_SPECIALS.items():
        if ids.get(kind) is None:
            hits = [by_text[t] for t in texts if t in by_text]
            if hits:
                ids[kind] = min(hits)
                found.append(kind)
                if len(hits) > 1:
                    notes.append(f"{kind}: the vocabulary holds {len(hits)} tokens llama.cpp would take for it "
                                 f"({', '.join(repr(v.tokens[h]) for h in sorted(hits))}); which one it takes "
                                 "depends on its hash map's order")
    eog = _eog(v, ids, by_text)
    return LlamaSpecials({k: i for k, i in ids.items() if i is not None}, eog, flags["add_bos"], flags["add_eos"],
                         flags["add_sep"], tuple(found), tuple(notes))


_TEXTS = frozenset(EOG_TEXTS) | frozenset(t for texts in AUTO_SPECIALS.values() for t in texts) | \
    frozenset(t for pair in _END_DROPPED_BY for t in pair) | frozenset(_S_DROPPED_BY)


def _first_ids(tokens) -> dict[str, int]:
    """id of each text the rules look for that the vocabulary holds (the first, where a text repeats: llama.cpp's
    token_to_id keeps one; no real file repeats one of these)."""
    tokens = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
    return {t: tokens.index(t) for t in _TEXTS.intersection(tokens)}


def _eog(v: GGUFVocab, ids: dict, by_text: dict) -> tuple[int, ...]:
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids.get(k) is not None}
    eog |= {by_text[t] for t in EOG_TEXTS if t in by_text}
    eog |= {ids[k] for k in ("eos", "eot", "eom") if ids.get(k) is not None}
    texts = {v.tokens[i]: i for i in eog}
    if "<|end|>" in texts and any(all(t in texts for t in pair) for pair in _END_DROPPED_BY):
        eog.discard(texts["<|end|>"])
    if "</s>" in texts and any(t in texts for t in _S_DROPPED_BY):
        eog.discard(texts["</s>"])
    return tuple(sorted(eog))


# llama.cpp's token attributes by model name (llama_vocab::impl::load, "set attributes by model/tokenizer/
# architecture name"): (where the needle is looked for, needles, token text or "*special*", LSTRIP / RSTRIP,
# on or off), in its order; the first matching block applies.
STRIP_RULES: tuple = (
    ((("pre", ("jina-v2-de", "jina-v2-es", "jina-v2-code")), ("arch", ("nomic-bert-moe", "jina-bert-v3"))),
     (("<mask>", "lstrip", True),)),
    ((("name", ("phi-3", "phi3")),),
     (("*special*", "rstrip", True), ("</s>", "rstrip", True), ("<unk>", "rstrip", False), ("<s>", "rstrip", False),
      ("<|endoftext|>", "rstrip", False))),
    ((("name", ("modern-bert",)),), (("[MASK]", "lstrip", True),)),
)


def strip_attributes(v: GGUFVocab, name: str | None, arch: str | None) -> dict[int, dict]:
    """id -> {"lstrip": bool, "rstrip": bool}: the whitespace llama.cpp strips beside a special token, set by
    model name (``general.name``, lowercased), pre-tokenizer or architecture (the :data:`STRIP_RULES` block that
    matches first).  Only tokens it sets an attribute on are in the answer."""
    where = {"name": (name or "").lower(), "pre": v.pre or "", "arch": arch or ""}
    for conditions, settings in STRIP_RULES:
        if not any(any(n in where[k] for n in needles) for k, needles in conditions):
            continue
        out: dict[int, dict] = {}
        index = {t: i for i, t in enumerate(v.tokens) if t in {s[0] for s in settings}}
        for text, attr, on in settings:
            ids = [i for i, ty in enumerate(v.token_types) if ty in (CONTROL, USER_DEFINED, UNKNOWN)] \
                if text == "*special*" else ([index[text]] if text in index else [])
            for i in ids:
                out.setdefault(i, {"lstrip": False, "rstrip": False})[attr] = on
        return out
    return {}


def is_special_type(t: int) -> bool:
    """A GGUF token type llama.cpp treats as special text (control, user-defined; not byte or unused)."""
    return t in (CONTROL, USER_DEFINED)


__all__ = ["AUTO_SPECIALS", "BYTE", "EOG_TEXTS", "ID_KEYS", "LlamaSpecials", "MODEL_DEFAULTS", "SPECIAL_KINDS",
           "UNUSED", "is_special_type", "llama_specials"]
