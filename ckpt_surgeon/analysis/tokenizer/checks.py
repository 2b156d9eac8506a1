"""``lint`` checks on a checkpoint's tokenizer and chat template, each visible in one file, no reference needed.

Each check takes lint's context and returns findings (:class:`~ckpt_surgeon.analysis.lint.Finding`).  They
share one :class:`TokenizerView` per run: the record (:mod:`.record`) and the built-in conversations
rendered with transformers' own renderer (:mod:`.templates`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...conversion.tokenizer.llama_specials import AUTO_SPECIALS
from ...conversion.tokenizer.vocab import CONTROL, NORMAL
from ..findings import Finding
from .record import TokenizerRecord, read_tokenizer
from .templates import end_of_turn, printed_tokens, renderings, token_shapes

# Control tokens that mark the end of a chat turn (llama.cpp's end-of-turn texts, AUTO_SPECIALS["eot"]), less
# the generic end-of-document ones a base model has too: a vocabulary holding one is a chat vocabulary.
_DOCUMENT_ENDS = {"<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"}
CHAT_MARKERS = tuple(t for t in AUTO_SPECIALS["eot"] if t not in _DOCUMENT_ENDS)


@dataclass
class TokenizerView:
    rec: TokenizerRecord | None
    where: str | None                             # the file findings name
    parse_errors: dict = field(default_factory=dict)   # template name -> reason
    rendered: dict = field(default_factory=dict)  # template name -> {conversation: text}


def view(ctx) -> TokenizerView:
    """The record and renderings, built once per lint run."""
    memo = ctx.memo
    if "tokenizer" not in memo:
        rec = read_tokenizer(ctx.ck)
        if rec is not None and rec.unread:
            ctx.skipped.append(("tokenizer checks", f"not read: {rec.unread}"))
            rec = None
        where = None
        if rec is not None:
            where = ctx.ck.source if rec.format == "gguf" else (rec.files[0] if rec.files else ctx.file)
        v = TokenizerView(rec, where)
        if rec is not None:
            specials = _special_texts(rec)
            for name, text in rec.templates.items():
                why, rendered = renderings(text, specials)
                if why is not None:
                    v.parse_errors[name] = why
                else:
                    v.rendered[name] = rendered
        memo["tokenizer"] = v
    return memo["tokenizer"]


def _special_texts(rec: TokenizerRecord) -> dict:
    """bos / eos / unk / pad ... texts for the template's variables (``bos_token`` ...), as transformers
    passes them (HF: the configs' texts; GGUF: the texts of llama.cpp's ids)."""
    if rec.special_texts:
        return dict(rec.special_texts)
    ids = rec.llama.ids if rec.llama is not None else rec.special_ids
    return {k: rec.text(ids[k]) for k in ("bos", "eos", "unk", "pad", "sep", "cls", "mask") if k in ids}


def _template_file(v: TokenizerView, name: str) -> str | None:
    rec = v.rec
    src = rec.template_sources.get(name) if rec is not None else None
    if rec is not None and rec.format == "hf" and src and rec.files:
        return f"{rec.files[0].rsplit('/', 1)[0]}/{src}"
    return v.where


def _llama_view(ctx) -> TokenizerView | None:
    """The view, where the record has llama.cpp's resolution of its special ids (else None: nothing to check)."""
    v = view(ctx)
    return v if v.rec is not None and v.rec.llama is not None else None


def _f(check, severity, file, message, fix):
    return Finding(check, severity, file, None, message, fix)


def check_template_parses(ctx) -> list:
    v = view(ctx)
    return [_f("template-parse", "error", _template_file(v, n), f"chat template {n!r} does not parse in "
               f"transformers' jinja environment: {why}", "fix the template's syntax")
            for n, why in v.parse_errors.items()]


def check_template_tokens(ctx) -> list:
    """Token-looking text a template prints that the vocabulary does not have as a token."""
    v = view(ctx)
    rec = v.rec
    if rec is None or not v.rendered:
        return []
    vocab = set(rec.tokens)
    control = [t for t, ty in zip(rec.tokens, rec.token_types) if ty == CONTROL]
    shapes = token_shapes(control)
    out = []
    for name, convs in v.rendered.items():
        missing: dict[str, str] = {}
        for conv, text in convs.items():
            for t in printed_tokens(text, shapes):
                if t not in vocab:
                    missing.setdefault(t, conv)
        if missing:
            shown = ", ".join(f"{t!r}" for t in list(missing)[:5])
            first = next(iter(missing.values()))
            out.append(_f("template-tokens", "error", _template_file(v, name),
                          f"chat template {name!r} prints {shown}, which the vocabulary does not have as a token "
                          f"(seen rendering the {first!r} conversation): the model reads it as plain text",
                          "use the special tokens the vocabulary has, or add the token to the tokenizer"))
    return out


def check_double_bos(ctx) -> list:
    """BOS added by the tokenizer and printed by the template: the prompt starts with two."""
    v = _llama_view(ctx)
    if v is None:
        return []
    rec = v.rec
    bos = rec.llama.ids.get("bos")
    add = rec.llama.add_bos
    if bos is None or not add:
        return []
    btext = rec.text(bos)
    out = []
    for name, convs in v.rendered.items():
        hits = [c for c, t in convs.items() if btext and t.startswith(btext)]
        if hits:
            flag = "tokenizer.ggml.add_bos_token" if rec.format == "gguf" else "add_bos_token"
            out.append(_f("double-bos", "warning", _template_file(v, name),
                          f"chat template {name!r} starts with the BOS token {btext!r} and the tokenizer adds BOS "
                          f"too ({flag} on): the prompt starts with two (llama.cpp warns about this at run time)",
                          f"drop {btext!r} from the template, or set {flag} to false"))
    return out


def check_end_of_turn(ctx) -> list:
    """The template's end-of-turn token must end generation: llama.cpp's EOG set (GGUF), generation_config's
    eos list (HF)."""
    v = view(ctx)
    rec = v.rec
    if rec is None or not v.rendered:
        return []
    specials = rec.specials_by_text()
    out = []
    for name, convs in v.rendered.items():
        ends = {end_of_turn(t, specials) for c, t in convs.items() if c.startswith(("user-assistant",
                                                                                     "system-multiturn"))}
        ends.discard(None)
        for end in sorted(ends):
            tid = specials[end]
            if rec.format == "gguf":
                stops, what = set(rec.eog), "llama.cpp's end-of-generation set"
                fix = f"set tokenizer.ggml.eos_token_id (or eot_token_id) to {tid}"
            else:
                if rec.generation_eos is None:
                    continue
                stops, what = set(rec.generation_eos), "generation_config.json's eos_token_id"
                fix = f"add {tid} to eos_token_id in generation_config.json"
            if tid not in stops:
                out.append(_f("end-of-turn", "error", _template_file(v, name),
                              f"chat template {name!r} ends an assistant turn with {end!r} (id {tid}), which is not "
                              f"in {what} ({', '.join(f'{i} {rec.text(i)!r}' for i in sorted(stops)) or 'empty'}): "
                              "generation runs on past the turn", fix))
    return out


def check_special_ids(ctx) -> list:
    """bos / eos / eot ids that point at ordinary tokens."""
    v = _llama_view(ctx)
    if v is None:
        return []
    rec = v.rec
    out = []
    for kind in ("bos", "eos", "eot"):
        tid = rec.llama.ids.get(kind)
        if tid is None or rec.token_types[tid] != NORMAL:
            continue
        src = "a default of llama.cpp (no key names it)" if rec.format == "gguf" and kind not in rec.special_ids \
            and kind not in rec.llama.found_by_text else "the file"
        key = f"tokenizer.ggml.{kind}_token_id" if rec.format == "gguf" else f"{kind}_token"
        out.append(_f("special-ids", "error", v.where,
                      f"the {kind} id is {tid} {rec.text(tid)!r} ({src}), an ordinary token: the model never "
                      f"{'starts with' if kind == 'bos' else 'stops at'} it as intended",
                      f"set {key} to the id of the real {kind} token"))
    return out


def check_pre_tokenizer(ctx) -> list:
    """A BPE pre-tokenizer llama.cpp does not know: it splits with 'default' (or refuses the file)."""
    v = view(ctx)
    rec = v.rec
    if rec is None or rec.kind not in ("gpt2",):
        return []
    from ...conversion.tokenizer import pre_by_name
    if rec.format == "gguf":
        if rec.pre is None:
            return [_f("pre-tokenizer", "warning", v.where, "no tokenizer.ggml.pre: llama.cpp splits text with its "
                       "'default' regexes (it warns 'GENERATION QUALITY WILL BE DEGRADED'), not as the model was "
                       "trained", "set tokenizer.ggml.pre to the model's name (convert it again from its HF folder)")]
        if pre_by_name(rec.pre) is None:
            return [_f("pre-tokenizer", "error", v.where, f"tokenizer.ggml.pre {rec.pre!r} is not a name llama.cpp "
                       "knows: it refuses to load the file ('unknown pre-tokenizer type')",
                       "set tokenizer.ggml.pre to a name llama.cpp knows")]
        return []
    if rec.effective_pre() is None:
        return [_f("pre-tokenizer", "warning", v.where, "tokenizer.json's pre-tokenizer splits text as no llama.cpp "
                   "pre-tokenizer does: llama.cpp's converter refuses it, and a GGUF made otherwise splits with "
                   "'default'", "check the pre_tokenizer of tokenizer.json")]
    return []


def check_missing_template(ctx) -> list:
    """A chat model without a chat template.  A chat model is one that stops at the end of a turn: its eos
    (GGUF) or a generation eos (HF) is a chat end-of-turn token.  The vocabulary alone does not say it: base
    models share their instruct models' vocabularies (Gemma 3, Qwen2.5 and Llama 3 base hold their turn tokens,
    stop at a document end, and ship no template)."""
    v = view(ctx)
    rec = v.rec
    if rec is None or rec.templates:
        return []
    stops = [rec.llama.ids.get("eos")] if rec.format == "gguf" and rec.llama is not None else \
        list(rec.generation_eos or ())
    turn = [rec.text(i) for i in stops if rec.text(i) in CHAT_MARKERS and rec.token_types[i] == CONTROL]
    if not turn:
        return []
    where = "tokenizer.chat_template" if rec.format == "gguf" else "chat_template.jinja / tokenizer_config.json"
    return [_f("missing-template", "warning", v.where,
               f"a chat model (it stops at the turn token {turn[0]!r}) without a chat template ({where}): chat "
               "front-ends fall back to a guess", "add the model's chat template")]


def check_template_sources(ctx) -> list:
    """Two default templates in one HF folder: transformers runs chat_template.jinja, llama.cpp's converter
    writes tokenizer_config.json's."""
    v = view(ctx)
    rec = v.rec
    if rec is None or rec.format != "hf" or rec.template_sources.get("default") != "chat_template.jinja":
        return []
    from .record import _json
    other = _json(ctx.ck.side_files, "tokenizer_config.json").get("chat_template") \
        if "tokenizer_config.json" in ctx.ck.side_files.names() else None
    if isinstance(other, str) and other != rec.templates["default"]:
        return [_f("template-sources", "warning", _template_file(v, "default"),
                   "chat_template.jinja and tokenizer_config.json's chat_template differ: transformers runs the "
                   ".jinja file, llama.cpp's converter writes tokenizer_config.json's into the GGUF",
                   "keep one template (delete the other)")]
    return []


TOKENIZER_CHECKS = (
    ("template-parse", "error", check_template_parses,
     "the chat template(s) parse in transformers' jinja environment"),
    ("template-tokens", "error", check_template_tokens,
     "the chat template prints no token-looking text (<|...|>, or shaped like the vocabulary's control tokens) that "
     "the vocabulary lacks"),
    ("double-bos", "warning", check_double_bos, "the template does not print BOS when the tokenizer adds it too"),
    ("end-of-turn", "error", check_end_of_turn,
     "the template's end-of-turn token ends generation (llama.cpp's EOG set for GGUF, generation_config's eos list "
     "for HF)"),
    ("special-ids", "error", check_special_ids, "bos / eos / eot ids point at special tokens, not ordinary ones"),
    ("pre-tokenizer", "warning", check_pre_tokenizer,
     "a BPE vocabulary's pre-tokenizer is one llama.cpp knows (else it splits with 'default', or refuses the file)"),
    ("missing-template", "warning", check_missing_template,
     "a chat model (its eos / generation eos is a turn token: <|im_end|>, <end_of_turn>, <|eot_id|> ...) has a "
     "chat template"),
    ("template-sources", "warning", check_template_sources,
     "an HF folder's chat_template.jinja and tokenizer_config.json's template agree"),
)
