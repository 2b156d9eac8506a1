"""One tokenizer record, read from every format: what a checkpoint's tokenizer and chat template are.

* **GGUF**: the ``tokenizer.ggml.*`` keys, ``tokenizer.chat_template`` and its named variants
  ``tokenizer.chat_template.<name>`` (the names listed in ``tokenizer.chat_templates``).
* **HF** (a folder, or a Hub repo whose files are fetched whole by HTTP): ``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, the chat template (``chat_template.jinja`` and
  ``additional_chat_templates/*.jinja``, which transformers prefers, else ``tokenizer_config.json``'s, else
  ``chat_template.json``), and the eos / bos / pad of ``config.json`` and ``generation_config.json``.

Both are put in llama.cpp's terms, so a GGUF and an HF folder compare token for token: an HF
vocabulary is read as llama.cpp's converter would write it (:func:`..conversion.tokenizer.hf_vocab`,
the converter this project checks byte for byte against ``convert_hf_to_gguf.py``); a kind that
converter does not write (WordPiece, Unigram) is read as it stands.  llama.cpp's own view of special
ids, end-of-generation tokens and add-BOS flags comes from :func:`llama_specials` (its load rules).
"""
from __future__ import annotations

import functools
import json
import weakref
from dataclasses import asdict, dataclass, field

from ...conversion.tokenizer.llama_specials import LlamaSpecials, llama_specials
from ...conversion.tokenizer.vocab import CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab
from ...errors import CkptError

TYPE_NAMES = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control", USER_DEFINED: "user-defined",
              UNUSED: "unused", 6: "byte"}
# tokenizer.json model kinds -> llama.cpp vocabulary names (llama-vocab.cpp's LLAMA_VOCAB_TYPE_*)
_HF_KINDS = {"WordPiece": "bert", "Unigram": "t5"}


@dataclass(frozen=True)
class TokenizerRecord:
    """A checkpoint's tokenizer and chat template(s), in llama.cpp's terms (see the module text)."""

    source: str
    format: str                                  # gguf | hf
    kind: str | None                             # llama.cpp vocabulary: gpt2 | llama | bert | t5 | ...
    hf_kind: str | None                          # tokenizer.json model type (HF sources)
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]                 # gguf-py TokenType: 1 normal, 3 control, 4 user-defined ...
    merges: tuple[str, ...] | None
    scores: tuple[float, ...] | None
    pre: str | None                              # tokenizer.ggml.pre (HF: the name llama.cpp's converter writes)
    normalizer: dict | None = None               # HF: tokenizer.json's normalizer
    pre_tokenizer: dict | None = None            # HF: tokenizer.json's pre_tokenizer
    special_ids: dict = field(default_factory=dict)    # kind -> id, as the files name them
    special_texts: dict = field(default_factory=dict)  # HF: kind -> token text (tokenizer_config, special_tokens_map)
    llama: LlamaSpecials | None = None           # llama.cpp's special ids, EOG set and add flags
    generation_eos: tuple[int, ...] | None = None    # HF: generation_config.json's (else config.json's) eos ids
    add_bos: bool | None = None                  # as stated (GGUF keys; HF: as the converter reads them)
    add_eos: bool | None = None
    add_sep: bool | None = None
    add_space_prefix: bool | None = None
    templates: dict = field(default_factory=dict)     # name ("default" first) -> template text
    template_sources: dict = field(default_factory=dict)   # name -> where it was read
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    side: object = field(default=None, repr=False, compare=False)   # HF: the files, for effective_pre()
    parsed: object = field(default=None, repr=False, compare=False)  # HF: tokenizer.json parsed (a _Parsed), kept
    #                                                                   while the record lives
    unread: str | None = None                    # why the tokenizer the files describe was not read (then empty)
    scores_from_merges: bool = False             # HF 'llama' without tokenizer.model: scores made from merge ranks

    # -- views ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def eog(self) -> tuple[int, ...]:
        return self.llama.eog if self.llama is not None else ()

    @property
    def template(self) -> str | None:
        return self.templates.get("default")

    def text(self, tid: int | None) -> str | None:
        return self.tokens[tid] if tid is not None and 0 <= tid < len(self.tokens) else None

    def is_special(self, tid: int) -> bool:
        return 0 <= tid < len(self.token_types) and self.token_types[tid] in (CONTROL, USER_DEFINED, UNKNOWN)

    def specials_by_text(self) -> dict[str, int]:
        """Special (control / user-defined) token text -> id."""
        return {t: i for i, (t, ty) in enumerate(zip(self.tokens, self.token_types)) if ty in (CONTROL, USER_DEFINED)}

    def summary(self) -> dict:
        """The short section ``inspect`` shows."""
        from .templates import template_family
        ll = self.llama
        ids = dict(ll.ids) if ll is not None else dict(self.special_ids)
        return {"kind": self.kind or self.hf_kind, "size": self.size,
                "pre_tokenizer": self.pre if self.pre is not None else ("default (not set)" if self.kind == "gpt2"
                                                                        else None),
                "specials": {k: f"{i} {self.text(i)!r}" for k, i in ids.items()},
                "eog": [f"{i} {self.text(i)!r}" for i in self.eog],
                "add_bos": ll.add_bos if ll is not None else self.add_bos,
                "templates": list(self.templates), "template_family": template_family(self.template)}

    def effective_pre(self) -> str | None:
        """HF: llama.cpp's name for the split transformers really runs for these files (some tokenizer classes
        rebuild the file's pre-tokenizer in code: ``Qwen2Tokenizer`` splits with Qwen2's regex whatever
        tokenizer.json says), which is what llama.cpp's converter hashes (:meth:`effective_json`).  GGUF: :attr:`pre`."""
        if self.format != "hf" or self.side is None or self.kind != "gpt2":
            return self.pre
        from ...conversion.tokenizer import pre_name_for_json
        ej = self.effective_json()
        return pre_name_for_json(ej) if ej is not None else self.pre

    def effective_json(self) -> dict | None:
        """HF: tokenizer.json as the tokenizer transformers builds from these files writes it (its class may set
        the split, the normalizer or the BOS template in code); None: no tokenizer.json, or transformers cannot
        load it.  The first answer costs a transformers load; what it changes of the file (the top-level parts,
        and the parts of ``model``, that differ) is kept in the transformers-answer cache
        (:mod:`...conversion.answer_cache`), so later runs parse the file and apply that."""
        if self.format != "hf" or self.side is None or "tokenizer.json" not in self.side.names():
            return None
        from ...conversion import answer_cache
        from ...conversion.tokenizer import effective_tokenizer_json
        tj = self._tokenizer_json()
        with self.side.as_folder() as folder:
            cfg = _json(self.side, "config.json") if "config.json" in self.side.names() else {}
            path = answer_cache.answer_path("effective-tokenizer", cfg.get("model_type"),
                                            answer_cache.folder_inputs(folder))
            got = answer_cache.load(path)
            if got is None:
                ej = effective_tokenizer_json(folder)
                got = {"none": True} if ej is None else _json_patch(tj, json.loads(ej))
                answer_cache.store(path, got)
        if got.get("none"):
            return None
        out = {k: v for k, v in tj.items() if k not in got["drop"]}
        out.update(got["set"])
        model = {k: v for k, v in (tj.get("model") or {}).items() if k not in got["model_drop"]}
        model.update(got["model_set"])
        held = self.parsed if isinstance(self.parsed, _Parsed) else None
        if "merges" not in got["model_set"] and held is not None and held.merges is not None:
            model["merges"] = held.merges       # the file's, made "a b" strings once (merge_strings) for any record
        out["model"] = model
        return out

    def _tokenizer_json(self) -> dict:
        return (self.parsed if isinstance(self.parsed, _Parsed) else _held_tokenizer_json(self.side)).obj

    @functools.cached_property
    def effective(self) -> "TokenizerRecord":
        """HF: the record of the tokenizer transformers really builds from these files (its class may set the
        split, the BOS template or the scores in code), read as llama.cpp's converter reads it: what the GGUF
        of this folder holds.  Costs a transformers load; ``compare_tokenizers`` asks for it only where the
        files as written differ from the other side.  Other formats, or no transformers answer: ``self``."""
        if self.format != "hf" or self.side is None:
            return self
        from ...conversion.tokenizer import hf_vocab
        ej = self.effective_json()
        if ej is None:
            return self
        kind = (self._tokenizer_json().get("model") or {}).get("type")
        if (ej.get("model") or {}).get("type") != kind:
            # transformers may rebuild another model kind as BPE (Qwen2Tokenizer makes a BPE without merges
            # from a WordLevel vocab): the kind written in the file decides what it is
            return self
        try:
            with self.side.as_folder() as folder:
                cfg = _json(self.side, "config.json") if "config.json" in self.side.names() else None
                v = hf_vocab(folder, len(self.tokens), cfg, effective_json=ej)
        except CkptError:
            return self
        keep = {k: getattr(self, k) for k in ("hf_kind", "normalizer", "pre_tokenizer", "special_texts",
                                               "generation_eos", "templates", "template_sources", "files",
                                               "notes", "side", "parsed", "scores_from_merges")}
        return _from_vocab(v, self.source, "hf", **keep)

    @functools.cached_property
    def converter_view(self) -> tuple["TokenizerRecord | None", str | None]:
        """HF, for an architecture that converts through llama.cpp's own converter class (not the native registry,
        whose reading of the files is the one this project checks byte for byte against llama.cpp's converter),
        whose ``set_vocab`` may write a vocabulary kind of its own, fix ids, set flags:

        * ``(record, None)``: the record of the ``tokenizer.*`` key-values that class writes for these files
          (:func:`...conversion.derived.run.converter_tokenizer`), format ``gguf`` (it is that GGUF metadata,
          spelled as the file spells it), this record's HF extras kept beside;
        * ``(None, why)``: the class could not run;
        * ``(None, None)``: not such an architecture, or not an HF record.

        The first question about a folder costs the class's run in a child (seconds); the answer is cached on disk."""
        if self.format != "hf" or self.side is None or self.unread or "config.json" not in self.side.names():
            return None, None
        from ...conversion.derived.listing import engine_of_config
        cfg = _json(self.side, "config.json")
        archs = cfg.get("architectures")
        if engine_of_config(cfg) == "native" or not (isinstance(archs, list) and archs):
            return None, None
        from dataclasses import replace

        from ...conversion.derived.run import converter_tokenizer
        try:
            with self.side.as_folder() as folder:
                got = converter_tokenizer(folder)
        except CkptError as e:
            return None, (f"llama.cpp's converter class for {archs[0]} was not run ({e.detail}): the HF side is read "
                          "as ckpt-surgeon's native converter would write it, which may differ from llama.cpp's file")
        rec = from_gguf_metadata(got["kv"], self.source)
        if rec is None:
            return None, f"llama.cpp's converter class for {archs[0]} writes no tokenizer for these files"
        who = got["converter_class"].rsplit(".", 1)[-1]
        notes = (f"HF side read as llama.cpp's {who} writes it (its architecture {archs[0]} converts through "
                 "llama.cpp's class, whose set_vocab decides the GGUF's tokenizer)",
                 *(f"llama.cpp's {who}: {w}" for w in got.get("warnings") or ()))
        # format "gguf": it is the metadata of the GGUF the class would write (spelled so: a bert vocabulary's "▁")
        return replace(rec, hf_kind=self.hf_kind, normalizer=self.normalizer,
                       pre_tokenizer=self.pre_tokenizer, special_texts=self.special_texts,
                       generation_eos=self.generation_eos, files=self.files, notes=self.notes + notes), None

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("side", "parsed")}
        d["llama"] = asdict(self.llama) if self.llama is not None else None
        d["vocab"] = [{"id": i, "text": t, "type": TYPE_NAMES.get(ty, str(ty))}
                      for i, (t, ty) in enumerate(zip(self.tokens, self.token_types))]
        del d["tokens"], d["token_types"]
        d["summary"] = self.summary()
        return d


# --------------------------------------------------------------------------- GGUF


def named_templates(meta: dict) -> dict[str, str]:
    """``tokenizer.chat_template`` as "default", then every ``tokenizer.chat_template.<name>``."""
    out: dict[str, str] = {}
    if isinstance(meta.get("tokenizer.chat_template"), str):
        out["default"] = meta["tokenizer.chat_template"]
    prefix = "tokenizer.chat_template."
    for k in sorted(meta):
        if k.startswith(prefix) and isinstance(meta[k], str):
            out[k[len(prefix):]] = meta[k]
    return out


def from_gguf_metadata(meta: dict, source: str) -> TokenizerRecord | None:
    """The record of a GGUF's metadata (None when it holds no tokenizer)."""
    from ...conversion.tokenizer.vocab import vocab_from_metadata
    v = vocab_from_metadata(meta, source, strict=False)
    if v is None:
        return None
    keys = {k.removeprefix("tokenizer.ggml."): meta[k] for k in meta
            if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")}
    return _from_vocab(v, source, "gguf", keys=keys, templates=named_templates(meta),
                       template_sources={n: ("tokenizer.chat_template" + ("" if n == "default" else f".{n}"))
                                         for n in named_templates(meta)}, files=(source,))


def _from_vocab(v: GGUFVocab, source: str, fmt: str, keys: dict | None = None, **kw) -> TokenizerRecord:
    ll = llama_specials(v, keys)
    kw["notes"] = tuple(kw.get("notes", ())) + tuple(n for n in ll.notes if "outside" in n)
    return TokenizerRecord(source, fmt, v.model, kw.pop("hf_kind", None), v.tokens, v.token_types, v.merges,
                           v.scores, v.pre, special_ids=dict(v.special_ids), llama=ll,
                           add_bos=v.add_bos, add_eos=v.add_eos, add_sep=v.add_sep,
                           add_space_prefix=v.add_space_prefix, **kw)


# --------------------------------------------------------------------------- HF


def _json(files, name: str) -> dict:
    raw = files.read(name)
    if raw is None:
        return {}
    from ...formats.safe_input import loads_json
    obj = loads_json(raw, path=files.path(name), error=CkptError)
    return obj if isinstance(obj, dict) else {}


class _Parsed:
    """A tokenizer.json parsed, held by the records read from it: diff reads two folders that often share one
    (~10 MB, most of the cost), so a second read of the same bytes finds it while the first record lives, and the
    parse is freed with the records (a weak-valued cache: nothing kept after them)."""
    __slots__ = ("obj", "merges", "__weakref__")

    def __init__(self, obj):
        self.obj = obj
        self.merges = None      # model.merges as llama.cpp's "a b" strings, once a record has made them

    def __deepcopy__(self, memo):       # dataclasses.asdict copies fields: the parse is shared, never copied
        return self


_PARSED: "weakref.WeakValueDictionary[bytes, _Parsed]" = weakref.WeakValueDictionary()   # sha256 -> parse


def _parsed(raw: bytes, path: str) -> _Parsed:
    """``raw`` parsed with the JSON limits of every input, once per content while a record holds it."""
    import hashlib

    from ...formats.safe_input import loads_json
    key = hashlib.sha256(raw).digest()
    held = _PARSED.get(key)
    if held is None:
        held = _Parsed(loads_json(raw, path=path, error=CkptError))
        _PARSED[key] = held
    return held


def _json_patch(file: dict, effective: dict) -> dict:
    """What ``effective`` changes of ``file`` (two tokenizer.json objects): the top-level parts, and the parts of
    ``model``, set or dropped; merges compared as "a b" strings (transformers may write them as pairs)."""
    from ...conversion.tokenizer.bpe import merge_strings

    def changes(a: dict, b: dict, skip=()):
        return ({k: v for k, v in b.items() if k not in skip and a.get(k, _ABSENT) != v},
                sorted(k for k in a if k not in skip and k not in b))
    top_set, top_drop = changes(file, effective, skip=("model",))
    fm, em = file.get("model") or {}, effective.get("model") or {}
    model_set, model_drop = changes(fm, em, skip=("merges",))
    if "merges" in fm or "merges" in em:
        try:
            same = merge_strings(fm.get("merges") or [], "") == merge_strings(em.get("merges") or [], "")
        except CkptError:
            same = False
        if not same:
            model_set["merges"] = em.get("merges") or []
    return {"set": top_set, "drop": top_drop, "model_set": model_set, "model_drop": model_drop}


_ABSENT = object()


def hf_templates(files) -> tuple[dict[str, str], dict[str, str]]:
    """The chat templates transformers loads for these files, and where each came from: the ``.jinja`` files
    take priority over tokenizer_config.json (transformers' ``from_pretrained``), chat_template.json last."""
    out: dict[str, str] = {}
    where: dict[str, str] = {}
    names = files.names()
    if "chat_template.jinja" in names:
        out["default"], where["default"] = files.read("chat_template.jinja").decode("utf-8", "replace"), \
            "chat_template.jinja"
    for n in names:
        if n.startswith("additional_chat_templates/"):
            key = n.split("/", 1)[1].removesuffix(".jinja")
            out[key], where[key] = files.read(n).decode("utf-8", "replace"), n
    if not out:
        for src in ("tokenizer_config.json", "chat_template.json"):
            ct = _json(files, src).get("chat_template") if src in names else None
            if isinstance(ct, str):
                out["default"], where["default"] = ct, src
            elif isinstance(ct, list):
                for t in ct:
                    if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str):
                        out[t["name"]], where[t["name"]] = t["template"], src
            elif isinstance(ct, dict):
                for k, t in ct.items():
                    if isinstance(t, str):
                        out[str(k)], where[str(k)] = t, src
            if out:
                break
    if "default" in out:
        out = {"default": out["default"], **{k: t for k, t in out.items() if k != "default"}}
    return out, where


def _eos_ids(files) -> tuple[int, ...] | None:
    for name in ("generation_config.json", "config.json"):
        v = _json(files, name).get("eos_token_id") if name in files.names() else None
        if isinstance(v, int) and not isinstance(v, bool):
            return (v,)
        if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return tuple(v)
    return None


def _hf_special_texts(files) -> dict[str, str]:
    from ...conversion.tokenizer.specials import HF_SPECIAL_NAMES, token_content
    out = {}
    for src in ("tokenizer_config.json", "special_tokens_map.json"):      # the map wins, as in transformers
        cfg = _json(files, src) if src in files.names() else {}
        for typ in HF_SPECIAL_NAMES:
            c = token_content(cfg.get(f"{typ}_token"))
            if c is not None:
                out[typ] = c
    return out


def _size(tj: dict) -> int:
    """The number of ids tokenizer.json spans (its largest id + 1)."""
    vocab = (tj.get("model") or {}).get("vocab") or {}
    ids = [i for i in (vocab.values() if isinstance(vocab, dict) else range(len(vocab))) if isinstance(i, int)]
    ids += [a["id"] for a in tj.get("added_tokens") or [] if isinstance(a, dict) and isinstance(a.get("id"), int)]
    return max(ids) + 1 if ids else 0


def _native_vocab(tj: dict) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Tokens by id as tokenizer.json has them (holes: empty text, type unused); added tokens are control
    (special) or user-defined (not special), as llama.cpp's converter types them."""
    model = tj.get("model") or {}
    vocab = model.get("vocab") or {}
    pairs = [(t, i) for t, i in vocab.items()] if isinstance(vocab, dict) else \
        [(e[0], i) for i, e in enumerate(vocab) if isinstance(e, (list, tuple)) and e]
    by_id = {i: t for t, i in pairs if isinstance(i, int)}
    kinds = {}
    for a in tj.get("added_tokens") or []:
        if isinstance(a, dict) and isinstance(a.get("id"), int) and isinstance(a.get("content"), str):
            by_id[a["id"]] = a["content"]
            kinds[a["id"]] = CONTROL if a.get("special") else USER_DEFINED
    n = max(by_id) + 1 if by_id else 0
    # the model's unknown token, where it is not an added special one: llama.cpp's converters type it unknown
    unk = model.get("unk_id") if isinstance(model.get("unk_id"), int) else \
        next((i for t, i in pairs if t == model.get("unk_token")), None)
    if unk is not None and unk in by_id and unk not in kinds:
        kinds[unk] = UNKNOWN
    tokens = tuple(by_id.get(i, "") for i in range(n))
    types = tuple(kinds.get(i, NORMAL if i in by_id else UNUSED) for i in range(n))
    return tokens, types


def _held_tokenizer_json(files) -> _Parsed:
    """tokenizer.json through the shared parse (:class:`_Parsed`); an empty one when absent or not an object."""
    raw = files.read("tokenizer.json")
    held = _parsed(raw, files.path("tokenizer.json")) if raw is not None else None
    return held if held is not None and isinstance(held.obj, dict) else _Parsed({})


def from_hf_files(files, source: str, config: dict | None = None) -> TokenizerRecord | None:
    """The record of an HF tokenizer (``files``: :mod:`..formats.side_files`); None without tokenizer.json."""
    from ...conversion.tokenizer import hf_vocab
    names = files.names()
    tcfg = _json(files, "tokenizer_config.json") if "tokenizer_config.json" in names else {}
    unread = None
    if "AutoTokenizer" in (tcfg.get("auto_map") or {}):
        unread = "its tokenizer is a tokenizer module of the model's own (auto_map), which is not run"
    elif "tokenizer.json" not in names:
        others = [n for n in ("tokenizer.model", "vocab.json", "vocab.txt", "merges.txt") if n in names]
        if not others:
            return None
        unread = f"no tokenizer.json beside {', '.join(others)}: only tokenizer.json is read"
    if unread:
        return TokenizerRecord(source, "hf", None, None, (), (), None, None, None,
                               templates=hf_templates(files)[0], files=tuple(files.path(n) for n in names),
                               unread=unread)
    held = _held_tokenizer_json(files)
    tj = held.obj
    model = tj.get("model") or {}
    hf_kind = model.get("type") if isinstance(model.get("type"), str) else None
    n_tokens = _size(tj)
    templates, where = hf_templates(files)
    common = dict(hf_kind=hf_kind, normalizer=tj.get("normalizer"), pre_tokenizer=tj.get("pre_tokenizer"),
                  special_texts=_hf_special_texts(files), generation_eos=_eos_ids(files), templates=templates,
                  template_sources=where, files=tuple(files.path(n) for n in names))
    notes = []
    try:
        with files.as_folder() as folder:
            v = hf_vocab(folder, n_tokens, config, effective_json=tj)
    except CkptError as e:
        notes.append(f"not in llama.cpp's terms: {e.detail}")
        v = None
    if v is not None:
        held.merges = v.merges if v.merges is not None else held.merges
        return _from_vocab(v, source, "hf", notes=tuple(notes), side=files, parsed=held,
                           scores_from_merges=v.model == "llama" and "tokenizer.model" not in names, **common)
    tokens, types = _native_vocab(tj)
    kind = "gpt2" if hf_kind == "BPE" and not model.get("byte_fallback") else \
        ("llama" if hf_kind == "BPE" else _HF_KINDS.get(hf_kind))
    merges = model.get("merges")
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in merges) if isinstance(merges, list) else None
    scores = tuple(float(e[1]) for e in model["vocab"]) if hf_kind == "Unigram" and isinstance(model.get("vocab"),
                                                                                                   list) else None
    # the special ids and add flags llama.cpp's converter writes for it (gguf-py SpecialVocab: bos is the cls token
    # and eos the sep token where none is named; add_bos / add_eos from the post-processor's template)
    from ...conversion.tokenizer.specials import adds_bos_eos
    texts = dict(common["special_texts"])
    if "bos" not in texts and "cls" in texts:
        texts["bos"] = texts["cls"]
    if "eos" not in texts and "sep" in texts:
        texts["eos"] = texts["sep"]
    add_bos, add_eos = adds_bos_eos(tj, tcfg, texts.get("bos"), texts.get("eos"))
    gv = GGUFVocab(model=kind or "none", pre=None, tokens=tokens, token_types=types, scores=scores, merges=merges,
                   special_ids=_ids_of(texts, tokens), add_bos=add_bos, add_eos=add_eos)
    return TokenizerRecord(source, "hf", kind, hf_kind, tokens, types, merges, scores, None,
                           special_ids=dict(gv.special_ids), llama=llama_specials(gv) if kind else None,
                           add_bos=add_bos, add_eos=add_eos,
                           notes=tuple(notes), side=files, parsed=held,
                           **{k: v for k, v in common.items() if k != "hf_kind"})


def _ids_of(texts: dict, tokens) -> dict:
    index = {t: i for i, t in enumerate(tokens)}
    return {k: index[t] for k, t in texts.items() if t in index}


# --------------------------------------------------------------------------- any checkpoint


def read_tokenizer(ck) -> TokenizerRecord | None:
    """The tokenizer record of an open :class:`~ckpt_surgeon.checkpoint.Checkpoint` (None: it has none)."""
    from ...formats.safe_input import paused_gc
    if ck.naming == "gguf":
        with paused_gc():
            return from_gguf_metadata(ck.metadata, ck.source)
    if ck.side_files is None:
        return None
    with paused_gc():
        return from_hf_files(ck.side_files, ck.source, ck.config)


def tokenizer(source, **open_kwargs) -> TokenizerRecord | None:
    """The tokenizer and chat template(s) of ``source``, in llama.cpp's terms: the record ``inspect`` shows in
    short and ``diff`` compares (docs/lint.md, "Is this GGUF the same model?").

    ``source``: an HF folder, a GGUF file, a Hub repo id (its tokenizer files fetched by HTTP) or an open
    :class:`~ckpt_surgeon.checkpoint.Checkpoint`.  None when the source carries no tokenizer.

    Returns:
        :class:`~ckpt_surgeon.analysis.tokenizer.record.TokenizerRecord` (``.summary()``, ``.to_dict()``)

    Example::

        import ckpt_surgeon
        t = ckpt_surgeon.tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
        t.kind, t.size, t.pre, t.llama.ids["eos"], t.eog, list(t.templates)
    """
    import os

    from ...checkpoint import Checkpoint, open_checkpoint
    if isinstance(source, Checkpoint):
        return read_tokenizer(source)
    if os.path.isdir(source):               # a folder: its tokenizer files, whether or not weights sit beside them
        from ...formats.side_files import FolderFiles
        files = FolderFiles(source)
        cfg = _json(files, "config.json") if "config.json" in files.names() else None
        return from_hf_files(files, str(source), cfg)
    with open_checkpoint(source, **open_kwargs) as ck:
        return read_tokenizer(ck)


def dumps(rec: TokenizerRecord) -> str:
    return json.dumps(rec.to_dict(), ensure_ascii=False)
