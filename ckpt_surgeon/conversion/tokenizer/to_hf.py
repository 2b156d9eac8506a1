"""GGUF -> HF: ``tokenizer.json`` + ``tokenizer_config.json`` rebuilt from a GGUF vocabulary
(:func:`hf_tokenizer_files`), with the tokenizer kind's model (:mod:`.bpe`, :mod:`.spm`,
:mod:`.wordpiece`, :mod:`.unigram`) and the BOS / EOS templates llama.cpp applies.  Trailing
``[PAD{id}]`` UNUSED rows (embedding padding) are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UnsupportedError
from .bpe import byte_level_bpe, raw_bpe, rebuild_pre
from .spm import spm_bpe
from .unigram import unigram_tokenizer
from .vocab import CONTROL, UNUSED, USER_DEFINED, GGUFVocab
from .wordpiece import wordpiece_tokenizer


def _kept_ids(v: GGUFVocab) -> int:
    """Number of leading ids the HF tokenizer keeps: trailing ``[PAD{i}]`` UNUSED rows are padding."""
    n = len(v.tokens)
    while n > 0 and v.token_types[n - 1] == UNUSED and v.tokens[n - 1] == f"[PAD{n - 1}]":
        n -= 1
    return n


@dataclass(frozen=True)
class HFTokenizerFiles:
    """The text of the files written into the HF folder."""

    tokenizer_json: str
    tokenizer_config: dict
    special_ids: dict                  # generation_config.json's content
    warnings: tuple[str, ...] = ()
    extra_files: dict = field(default_factory=dict)   # relative path -> text (chat templates as .jinja files)


def _rebuild_model(v: GGUFVocab, tokens: list[str], types: list[int], pre, path: str | None):
    """The tokenizers ``Tokenizer`` for the vocabulary's model kind, before added tokens."""
    if pre is not None and not pre.byte_encode:
        return raw_bpe(v, tokens, pre, path)
    if v.model == "gpt2":
        return byte_level_bpe(v, tokens, types, pre, path)
    if v.model == "llama":
        return spm_bpe(v, tokens, types)
    if v.model == "bert":
        return wordpiece_tokenizer(v, tokens, types)
    if v.model == "t5":
        return unigram_tokenizer(v, tokens)
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


def _template_files(v: GGUFVocab, tcfg: dict) -> dict:
    """The chat templates: in tokenizer_config.json (``tcfg``, changed in place), or, with named ones, as the
    files transformers reads named templates from (additional_chat_templates/<name>.jinja, the default in
    chat_template.jinja beside them: they replace any template in tokenizer_config.json)."""
    if not v.named_templates:
        if v.chat_template:
            tcfg["chat_template"] = v.chat_template
        return {}
    extra = {"chat_template.jinja": v.chat_template} if v.chat_template else {}
    extra.update({f"additional_chat_templates/{k}.jinja": t for k, t in v.named_templates.items()})
    return extra


def hf_tokenizer_files(v: GGUFVocab, *, model_max_length: int | None = None, path: str | None = None,
                       model_name: str | None = None, arch: str | None = None) -> HFTokenizerFiles:
    """Rebuild ``tokenizer.json`` + ``tokenizer_config.json`` from a GGUF vocabulary.  ``model_name`` /
    ``arch``: the file's ``general.name`` / ``general.architecture``, on which llama.cpp strips whitespace
    beside some special tokens (Phi-3's turn tokens: :func:`.llama_specials.strip_attributes`)."""
    from tokenizers import AddedToken

    from .llama_specials import strip_attributes

    warnings = []
    n = _kept_ids(v)
    tokens = list(v.tokens[:n])
    types = list(v.token_types[:n])
    pre = rebuild_pre(v, warnings)
    tok = _rebuild_model(v, tokens, types, pre, path)

    strip = strip_attributes(v, model_name, arch)
    specials = [AddedToken(t, special=True, normalized=False, **strip.get(i, {}))
                for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False, **strip.get(i, {}))
            for i, (t, ty) in enumerate(zip(tokens, types)) if ty == USER_DEFINED]
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
    extra = _template_files(v, tcfg)
    # generation_config.json: the file's eos alone.  llama.cpp also stops at every token of its EOG set
    # (llama_specials), but the GGUF does not say which of them the source's generation_config listed; the
    # HF -> GGUF -> HF round trip must give the source's file back.
    ids = {f"{typ}_token_id": i for typ, i in v.special_ids.items() if typ in ("bos", "eos", "pad") and i < n}
    return HFTokenizerFiles(tok.to_str(pretty=True), tcfg, ids, tuple(warnings), extra)
