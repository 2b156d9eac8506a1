"""Two tokenizer records compared part by part (what ``diff`` adds to the weights' verdict).

The parts, each a stable JSON key of :class:`TokenizerDiff`: ``presence`` (one side has no tokenizer),
``kind``, ``vocab`` (token texts by id), ``token_types`` (special or not), ``merges``, ``scores``,
``pre_tokenizer`` (llama.cpp's split: two names that split alike are the same), ``normalizer`` (HF
against HF), ``special_ids`` (bos, eos, eot, pad ... as llama.cpp resolves them), ``eog`` (llama.cpp's
end-of-generation set), ``generation_eos`` (HF against HF: generation_config's eos list), ``add_flags``
(add_bos / add_eos / add_sep / add_space_prefix as llama.cpp takes them), ``chat_template`` (the
default template) and ``named_templates``.

Trailing ``[PAD{i}]`` rows (a GGUF's vocabulary padded to the embedding's rows, as llama.cpp's
converter pads it) are not tokens and are not compared.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from ...conversion.tokenizer.vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED
from .record import TokenizerRecord

PARTS = ("presence", "kind", "vocab", "token_types", "merges", "scores", "pre_tokenizer", "normalizer",
         "special_ids", "eog", "generation_eos", "add_flags", "chat_template", "named_templates")
# how a part is named in the verdict line
_LABELS = {"vocab": "token ids", "token_types": "token types", "pre_tokenizer": "pre-tokenizer",
           "special_ids": "special tokens", "eog": "end-of-generation tokens", "generation_eos": "generation eos ids",
           "add_flags": "add-BOS/EOS flags", "chat_template": "chat template", "named_templates": "named templates",
           "presence": "present on one side only", "kind": "tokenizer kind"}
FIRST = 5               # differing ids / merges named in the details
TEMPLATE_DIFF_LINES = 24


@dataclass(frozen=True)
class TokenizerDiff:
    """What differs between the tokenizers of A and B (``differs`` empty: the same)."""

    differs: tuple[str, ...]
    line: str                           # "tokenizer differs: 2 token ids, chat template" | "tokenizer identical"
    details: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    compared: bool = True               # False: one side's tokenizer could not be read (``line`` says why)

    @property
    def same(self) -> bool:
        return not self.differs

    def to_dict(self) -> dict:
        return {"same": self.same, "compared": self.compared, "differs": list(self.differs), "line": self.line,
                **{p: self.details.get(p) for p in PARTS}, "notes": list(self.notes)}

    def summary_items(self) -> list[tuple[str, str]]:
        items = [("tokenizer", self.line)]
        for p in self.differs:
            d = self.details.get(p) or {}
            if d.get("text"):
                items.append((f"  {_LABELS.get(p, p)}", d["text"]))
        return items


# llama.cpp's converters pad a vocabulary to the embedding's rows with [PAD{i}] (a bert vocabulary spells it
# ▁[PAD{i}]: it is not a control token; some converters number them from another offset)
_PAD = re.compile(r"▁?\[PAD\d+\]")


def _is_pad(t: str) -> bool:
    return t == "" or _PAD.fullmatch(t) is not None


def _unpadded(rec: TokenizerRecord) -> tuple[tuple, tuple]:
    """The tokens without the trailing padding rows: [PAD{i}] at id i (or an empty hole), whatever their type
    (llama.cpp's converters type them unused, or unknown as its Phi-3 conversion did)."""
    toks, types = list(rec.tokens), list(rec.token_types)
    while toks and _is_pad(toks[-1]) and types[-1] in (UNUSED, UNKNOWN, NORMAL):
        toks.pop()
        types.pop()
    return tuple(toks), tuple(types)


def _hf_spelling(rec: TokenizerRecord, toks: tuple, types: tuple) -> tuple:
    """A GGUF ``bert`` vocabulary in WordPiece's own spelling (llama.cpp writes a word-initial piece as
    ``▁piece`` and a continuation bare; WordPiece as ``piece`` and ``##piece``)."""
    if rec.format != "gguf" or rec.kind != "bert":
        return toks
    return tuple((t[1:] if t.startswith("▁") else "##" + t) if ty in (NORMAL, UNUSED, BYTE) else t
                 for t, ty in zip(toks, types))


def _hole(t: str, ty: int, i: int) -> bool:
    return ty in (UNUSED, UNKNOWN, NORMAL) and _is_pad(t)


def _unk_typing(a: TokenizerRecord, b: TokenizerRecord, ya: tuple, yb: tuple) -> tuple[tuple, tuple, str | None]:
    """The unknown token typed control on one side and unknown on the other is one note, not a difference: llama.cpp
    maps unknown pieces to its id either way (only its printing differs: '▅' when typed unknown), and the HF
    side has no such distinction to convert (an HF SentencePiece vocabulary's unk becomes 'unknown')."""
    ids = {r.llama.ids.get("unk") for r in (a, b) if r.llama is not None} - {None}
    for i in ids:
        if i < len(ya) and i < len(yb) and {ya[i], yb[i]} == {CONTROL, UNKNOWN}:
            ya, yb = ya[:i] + (yb[i],) + ya[i + 1:], yb
            return ya, yb, (f"the unk token ({i} {a.text(i)!r}) is typed {'control' if yb[i] == UNKNOWN else 'unknown'} "
                            f"in A and {'unknown' if yb[i] == UNKNOWN else 'control'} in B (llama.cpp prints it as "
                            "'▅' only when typed unknown; the ids are the same)")
    return ya, yb, None


def _vocab(a: TokenizerRecord, b: TokenizerRecord) -> tuple[dict | None, dict | None, list[str]]:
    """(token texts that differ, token types that differ, notes)."""
    ta, ya = _unpadded(a)
    tb, yb = _unpadded(b)
    ya, yb, unk = _unk_typing(a, b, ya, yb)
    notes = [unk] if unk else []
    if a.kind == "bert" or b.kind == "bert":
        ta, tb = _hf_spelling(a, ta, ya), _hf_spelling(b, tb, yb)
    if ta == tb and ya == yb:          # the common case, at C speed
        return None, None, notes
    n = max(len(ta), len(tb))
    text_diff, type_diff = [], []
    for i in range(n):
        xa = (ta[i], ya[i]) if i < len(ta) else None
        xb = (tb[i], yb[i]) if i < len(tb) else None
        if xa == xb or (xa is not None and xb is not None and _hole(*xa, i) and _hole(*xb, i)):
            continue
        if xa is None or xb is None or xa[0] != xb[0]:
            text_diff.append(i)
        elif xa[1] != xb[1] and not (_hole(*xa, i) and _hole(*xb, i)):
            type_diff.append(i)
    vocab = None
    if text_diff:
        first = [{"id": i, "a": ta[i] if i < len(ta) else None, "b": tb[i] if i < len(tb) else None}
                 for i in text_diff[:FIRST]]
        sizes = f" (A {len(ta):,} tokens, B {len(tb):,})" if len(ta) != len(tb) else ""
        vocab = {"count": len(text_diff), "size_a": len(ta), "size_b": len(tb), "first": first,
                 "text": f"{len(text_diff):,} ids differ{sizes}; first: " +
                         ", ".join(f"{f['id']}: {f['a']!r} vs {f['b']!r}" for f in first)}
    both = {i for i in set((a.llama.ids if a.llama else {}).values()) & set((b.llama.ids if b.llama else {}).values())}
    named = [i for i in type_diff if i in both and {ya[i], yb[i]} <= {NORMAL, CONTROL}]
    if named:       # a special id typed normal in a GGUF: transformers makes every token it names special
        type_diff = [i for i in type_diff if i not in named]
        notes.append(f"{', '.join(f'{i} {ta[i]!r}' for i in named[:3])}: a special id on both sides, typed "
                      f"{'normal' if ya[named[0]] == NORMAL else 'control'} in A and "
                      f"{'normal' if yb[named[0]] == NORMAL else 'control'} in B (transformers makes every token a "
                      "tokenizer names special; llama.cpp keeps a GGUF's type)")
    types = None
    if type_diff:
        from .record import TYPE_NAMES
        first = [{"id": i, "token": ta[i], "a": TYPE_NAMES.get(ya[i]), "b": TYPE_NAMES.get(yb[i])}
                 for i in type_diff[:FIRST]]
        types = {"count": len(type_diff), "first": first,
                 "text": f"{len(type_diff):,} ids typed differently; first: " +
                         ", ".join(f"{f['id']} {f['token']!r}: {f['a']} vs {f['b']}" for f in first)}
    return vocab, types, notes


def _seq(name: str, a, b) -> dict | None:
    """Merges / scores: equal, or the count and the first differing positions."""
    a, b = tuple(a or ()), tuple(b or ())
    if a == b:
        return None
    diffs = [i for i in range(max(len(a), len(b))) if (a[i] if i < len(a) else None) != (b[i] if i < len(b) else None)]
    first = [{"index": i, "a": a[i] if i < len(a) else None, "b": b[i] if i < len(b) else None} for i in diffs[:FIRST]]
    return {"count": len(diffs), "size_a": len(a), "size_b": len(b), "first": first,
            "text": f"{len(diffs):,} {name} differ (A {len(a):,}, B {len(b):,}); first at " +
                    ", ".join(f"{f['index']}: {f['a']!r} vs {f['b']!r}" for f in first[:3])}


def _merge_order(rec: TokenizerRecord, ids: list[int]) -> list[int]:
    """``ids`` in the order a SentencePiece-style vocabulary's scores rank them: llama.cpp's tokenizer takes the
    highest score first, ties by id."""
    sc = rec.scores
    return sorted(ids, key=lambda i: (-sc[i], i))


def _mergeable(a: TokenizerRecord, b: TokenizerRecord, n: int) -> list[int]:
    """Ordinary tokens of 2+ characters that a merge makes: where scores are merge ranks (score = -rank), the ones
    scored above the floor given to a token no merge makes (its score orders nothing)."""
    toks, types = a.tokens, a.token_types
    ids = [i for i in range(n) if types[i] == NORMAL and len(toks[i]) > 1 and not _hole(toks[i], types[i], i)]
    for r in (a, b):
        if r.scores_from_merges and r.scores:
            floor = min(r.scores[i] for i in ids) if ids else 0.0
            ids = [i for i in ids if r.scores[i] > floor]
    return ids


def _scores(a: TokenizerRecord, b: TokenizerRecord) -> dict | None:
    """Scores compared as values, or, where one side's were made from merge ranks (an HF SentencePiece-style
    tokenizer without its tokenizer.model: score = -rank), as the order they give the merges, which is all
    llama.cpp's tokenizer reads of them."""
    na, nb = len(_unpadded(a)[0]), len(_unpadded(b)[0])
    if not (a.scores_from_merges or b.scores_from_merges):
        return _seq("scores", a.scores[:na], b.scores[:nb])
    ids = _mergeable(a, b, min(na, nb))
    oa, ob = _merge_order(a, ids), _merge_order(b, ids)
    if oa == ob:
        return None
    first = next(k for k in range(min(len(oa), len(ob))) if oa[k] != ob[k]) if oa[:len(ob)] != ob[:len(oa)] \
        else min(len(oa), len(ob))
    return {"count": None, "size_a": na, "size_b": nb, "first": [],
            "text": f"the scores order the merges differently (from rank {first:,}: A {a.text(oa[first]) if first < len(oa) else None!r}, "
                    f"B {b.text(ob[first]) if first < len(ob) else None!r}); one side's scores are merge ranks"}


def _split_of(kind: str | None, name: str | None):
    """What llama.cpp runs for a pre-tokenizer name (regexes, byte-level, flags), for BPE."""
    from ...conversion.tokenizer import pre_by_name
    if kind not in ("gpt2", "gemma4", "whitespace"):
        return ("n/a", kind)
    p = pre_by_name(name or "default")
    if p is None:
        return ("unknown", name)
    return (p.regexes, p.byte_encode, p.ignore_merges, p.escape_whitespaces)


def _pre(a: TokenizerRecord, b: TokenizerRecord) -> dict | None:
    """Two names that split alike are the same pre-tokenizer.  An HF side splits as transformers really runs
    its files (:meth:`TokenizerRecord.effective_pre`), which may not be what its tokenizer.json says."""
    if a.kind is None or b.kind is None:
        return None
    pa, pb = a.effective_pre(), b.effective_pre()
    if _split_of(a.kind, pa) == _split_of(b.kind, pb):
        return None

    def show(rec, name):
        if name is None:
            return "(none: llama.cpp uses 'default')"
        return name if name == rec.pre else f"{name} (transformers' run of a file that says {rec.pre})"
    return {"a": pa, "b": pb, "same_split": False,
            "text": f"A {show(a, pa)}, B {show(b, pb)}: they split text differently"}


def _specials(a: TokenizerRecord, b: TokenizerRecord, names=("A", "B")) -> dict | None:
    ia = dict(a.llama.ids) if a.llama else dict(a.special_ids)
    ib = dict(b.llama.ids) if b.llama else dict(b.special_ids)
    kinds = [k for k in dict.fromkeys([*ia, *ib]) if ia.get(k) != ib.get(k)]
    if not kinds:
        return None

    def show(rec, ids, k):
        return "none" if ids.get(k) is None else f"{ids[k]} {rec.text(ids[k])!r}"
    return {"a": {k: ia.get(k) for k in kinds}, "b": {k: ib.get(k) for k in kinds}, "kinds": kinds,
            "text": "; ".join(f"{k}: {names[0]} {show(a, ia, k)}, {names[1]} {show(b, ib, k)}" for k in kinds)}


def _ids_set(name: str, a: TokenizerRecord, b: TokenizerRecord, xa, xb) -> dict | None:
    if xa is None or xb is None or tuple(xa) == tuple(xb):
        return None
    only_a, only_b = sorted(set(xa) - set(xb)), sorted(set(xb) - set(xa))
    parts = [f"only A: {', '.join(f'{i} {a.text(i)!r}' for i in only_a)}" if only_a else "",
             f"only B: {', '.join(f'{i} {b.text(i)!r}' for i in only_b)}" if only_b else ""]
    return {"a": list(xa), "b": list(xb), "only_a": only_a, "only_b": only_b,
            "text": "; ".join(p for p in parts if p) or f"A {list(xa)}, B {list(xb)} (order)"}


def _flags(a: TokenizerRecord, b: TokenizerRecord, names=("A", "B")) -> dict | None:
    def flags(r):
        ll = r.llama
        out = {"add_bos": ll.add_bos if ll else r.add_bos, "add_eos": ll.add_eos if ll else r.add_eos,
               "add_sep": ll.add_sep if ll else r.add_sep}
        if r.kind == "llama":       # SentencePiece-style: the prefix space matters (llama.cpp's default: on)
            out["add_space_prefix"] = True if r.add_space_prefix is None else r.add_space_prefix
        return out
    fa, fb = flags(a), flags(b)
    keys = [k for k in fa if k in fb and fa[k] != fb[k]]
    if not keys:
        return None
    return {"a": {k: fa[k] for k in keys}, "b": {k: fb[k] for k in keys},
            "text": ", ".join(f"{k}: {names[0]} {fa[k]}, {names[1]} {fb[k]}" for k in keys)}


def template_diff(ta: str | None, tb: str | None, *, lines: int = TEMPLATE_DIFF_LINES, width: int = 160) -> str:
    """A short unified diff of two template texts; where a changed line is long (many templates are one
    line), the changed spans of characters with a little context instead."""
    out = list(difflib.unified_diff((ta or "").splitlines(), (tb or "").splitlines(), "A", "B", lineterm="", n=1))
    if any(len(x) > width for x in out) and ta and tb:
        out = ["--- A", "+++ B"]
        ops = [op for op in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes() if op[0] != "equal"]
        for tag, i1, i2, j1, j2 in ops[:4]:
            ctx = 30
            out += [f"@@ character {i1} @@", f"-...{ta[max(0, i1 - ctx):i2 + ctx]}...",
                    f"+...{tb[max(0, j1 - ctx):j2 + ctx]}..."]
        if len(ops) > 4:
            out.append(f"... ({len(ops) - 4} more changed spans)")
    if len(out) > lines:
        out = out[:lines] + [f"... ({len(out) - lines} more diff lines)"]
    return "\n".join(out)


def _templates(a: TokenizerRecord, b: TokenizerRecord) -> tuple[dict | None, dict | None]:
    ta, tb = a.templates.get("default"), b.templates.get("default")
    default = None
    if ta != tb:
        what = "A has none" if ta is None else ("B has none" if tb is None else "texts differ")
        udiff = template_diff(ta, tb)
        default = {"a_present": ta is not None, "b_present": tb is not None, "diff": udiff,
                   "text": what + (":\n" + udiff if ta is not None and tb is not None else "")}
    na = {k: v for k, v in a.templates.items() if k != "default"}
    nb = {k: v for k, v in b.templates.items() if k != "default"}
    named = None
    if na != nb:
        changed = sorted(k for k in set(na) | set(nb) if na.get(k) != nb.get(k))
        named = {"names": changed, "only_a": sorted(set(na) - set(nb)), "only_b": sorted(set(nb) - set(na)),
                 "text": ", ".join(changed)}
    return default, named


def compare_tokenizers(a: TokenizerRecord | None, b: TokenizerRecord | None) -> TokenizerDiff:
    """What differs between the tokenizers ``a`` and ``b`` (either may be None: no tokenizer).  An HF side is
    the tokenizer transformers builds from its files: read as the files are written first, and, where that
    differs from the other side, as transformers builds it (:attr:`TokenizerRecord.effective`)."""
    from ...formats.safe_input import paused_gc
    with paused_gc():
        return _compare_effective(a, b)


def _compare_effective(a: TokenizerRecord | None, b: TokenizerRecord | None) -> TokenizerDiff:
    d = _compare(a, b)
    if d.same or a is None or b is None or "hf" not in (a.format, b.format):
        return d
    if {a.format, b.format} == {"hf", "gguf"}:
        hf = a if a.format == "hf" else b
        conv, why = hf.converter_view
        if conv is not None:        # llama.cpp's own class decides this architecture's GGUF tokenizer
            dc = _compare(conv, b) if hf is a else _compare(a, conv)
            return _noted(dc, [n for n in conv.notes if n not in hf.notes] + _departures(hf, conv))
        if why is not None:
            d = _noted(d, [why])
    ea, eb = a.effective, b.effective
    if ea is a and eb is b:
        return d
    return _noted(_compare(ea, eb), list(d.notes))


def _noted(d: TokenizerDiff, notes: list[str]) -> TokenizerDiff:
    from dataclasses import replace
    return replace(d, notes=tuple(d.notes) + tuple(n for n in notes if n not in d.notes))


def _departures(files: TokenizerRecord, conv: TokenizerRecord) -> list[str]:
    """Where llama.cpp's converter class writes special ids or add flags other than the folder's files name
    (HunYuan's eos from the config, an end-of-turn token it names): a note, so the choice is seen even when the
    GGUF agrees with the class."""
    out = []
    names = ("files", "llama.cpp")
    for part, got in (("special tokens", _specials(files, conv, names)), ("add-BOS/EOS flags", _flags(files, conv, names))):
        if got is not None:
            out.append(f"llama.cpp's converter departs from the folder's files in {part}: {got['text']}")
    return out


def _compare(a: TokenizerRecord | None, b: TokenizerRecord | None) -> TokenizerDiff:
    if a is None and b is None:
        return TokenizerDiff((), "no tokenizer on either side")
    unread = [(n, r.unread) for n, r in (("A", a), ("B", b)) if r is not None and r.unread]
    if unread:
        why = "; ".join(f"{n}: {u}" for n, u in unread)
        return TokenizerDiff((), f"tokenizer not compared ({why})", notes=(f"tokenizer not compared: {why}",),
                             compared=False)
    if a is None or b is None:
        side = "A" if a is None else "B"
        return TokenizerDiff(("presence",), f"tokenizer differs: {side} has none",
                             {"presence": {"a": a is not None, "b": b is not None, "text": f"{side} has no tokenizer"}})
    d: dict = {}
    if (a.kind or a.hf_kind) != (b.kind or b.hf_kind):
        d["kind"] = {"a": a.kind or a.hf_kind, "b": b.kind or b.hf_kind,
                     "text": f"A {a.kind or a.hf_kind}, B {b.kind or b.hf_kind}"}
    d["vocab"], d["token_types"], vocab_notes = _vocab(a, b)
    d["merges"] = _seq("merges", a.merges, b.merges)
    if a.scores is not None and b.scores is not None:       # of the tokens, not of padding rows
        d["scores"] = _scores(a, b)
    d["pre_tokenizer"] = _pre(a, b)
    notes = []
    if a.format == b.format == "hf" and a.normalizer != b.normalizer:
        d["normalizer"] = {"a": a.normalizer, "b": b.normalizer, "text": "tokenizer.json's normalizer differs"}
    elif a.format != b.format:
        notes.append("GGUF against HF: the HF side is read as llama.cpp's converter writes it (its normalizer "
                     "is what llama.cpp's vocabulary type implies)")
    d["special_ids"] = _specials(a, b)
    d["eog"] = _ids_set("eog", a, b, a.eog, b.eog)
    if a.format == b.format == "hf":
        d["generation_eos"] = _ids_set("generation_eos", a, b, a.generation_eos, b.generation_eos)
    d["add_flags"] = _flags(a, b)
    d["chat_template"], d["named_templates"] = _templates(a, b)
    d = {k: v for k, v in d.items() if v is not None}
    notes += vocab_notes
    differs = tuple(p for p in PARTS if p in d)
    if not differs:
        return TokenizerDiff((), "tokenizer identical", d, tuple(notes))
    bits = []
    for p in differs:
        if p == "vocab":
            bits.append(f"{d['vocab']['count']:,} token ids")
        else:
            bits.append(_LABELS.get(p, p))
    return TokenizerDiff(differs, "tokenizer differs: " + ", ".join(bits), d, tuple(notes))
