"""The vocabulary record both directions share: a GGUF's ``tokenizer.*`` key-values, typed.

Token types are gguf-py's ``TokenType``: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte.  :func:`vocab_from_metadata` reads the record from a GGUF's metadata, every
value checked where read; :meth:`GGUFVocab.key_values` is what HF -> GGUF writes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...arch.checked import TOKEN_ID, Bounds, describe, gguf_value
from ...errors import FormatError


NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


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
    named_templates: dict = field(default_factory=dict)   # tokenizer.chat_template.<name> -> text (not the default)

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
        if self.named_templates:
            # gguf-py's GGUFWriter.add_chat_template: one key per named template, and their names
            kv += [(f"tokenizer.chat_template.{n}", t, "str") for n, t in self.named_templates.items()]
            kv.append(("tokenizer.chat_templates", list(self.named_templates), "str[]"))
        return kv
# special token kind -> GGUF key suffix (gguf-py constants.py Keys.Tokenizer)
SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                "pad": "padding_token_id", "sep": "seperator_token_id", "cls": "cls_token_id",
                "mask": "mask_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
                "fim_pre": "fim_pre_token_id", "fim_suf": "fim_suf_token_id", "fim_mid": "fim_mid_token_id",
                "fim_pad": "fim_pad_token_id", "fim_rep": "fim_rep_token_id", "fim_sep": "fim_sep_token_id"}
# older spellings llama.cpp still reads (after the fim_* keys, so they win where both are set)
DEPRECATED_SPECIAL_KEYS = {"fim_pre": "prefix_token_id", "fim_suf": "suffix_token_id", "fim_mid": "middle_token_id"}
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
    elif item is str and type(v).__name__ == "StringArray":
        return v.tolist()                  # the GGUF reader's lazy string array: every item is a str
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


def vocab_from_metadata(meta: dict, path: str | None = None, *, strict: bool = True) -> GGUFVocab | None:
    """Typed view of a GGUF's ``tokenizer.*`` metadata (None when it has no tokenizer).  ``strict=False``: a special
    id outside the vocabulary is left out, as llama.cpp ignores it (with a warning), instead of refused."""
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
    for typ, key in [*SPECIAL_KEYS.items(), *DEPRECATED_SPECIAL_KEYS.items()]:
        v = gguf_value(meta, f"tokenizer.ggml.{key}", TOKEN_ID, path=path)
        if v is not None:
            if v >= len(tokens) and not strict:
                continue
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
        precompiled_charsmap=_charsmap(meta, path), named_templates=_named_templates(meta, path))


def _named_templates(meta: dict, path: str | None) -> dict:
    """``tokenizer.chat_template.<name>`` values (the default template is ``tokenizer.chat_template``)."""
    prefix = "tokenizer.chat_template."
    return {k[len(prefix):]: gguf_value(meta, k, _TEXT, path=path) for k in sorted(meta) if k.startswith(prefix)}


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
