"""HF -> GGUF: the GGUF vocabulary of an HF folder (:func:`hf_vocab`).

Vocabulary rows the model has beyond the tokenizer (embeddings padded to a multiple of 64)
become ``[PAD{id}]`` UNUSED tokens, as ``convert_hf_to_gguf.py`` does.
"""
from __future__ import annotations

import re
from pathlib import Path

from ...arch.families import LLAMACPP_NAME_TOKENS
from ...errors import ConfigError, FormatError, UnsupportedError
from .bpe import gpt2_pre_name, merge_strings
from .hf_files import read_chat_template, read_folder_json, read_named_templates, vocab_sources
from .specials import HF_SPECIAL_NAMES, adds_bos_eos, adds_sep, special_token_ids, token_content
from .spm import spm_adds_prefix, spm_scores
from .vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab


_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


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


# The tokenizer.json model kinds llama.cpp has a vocabulary for (llama-vocab.cpp's vocab types:
# SPM 'llama', BPE 'gpt2', WPM 'bert', UGM 't5', RWKV, PLaMo-2), and the ones written here.
_WRITTEN = "BPE (byte-level: 'gpt2'; with byte fallback, SentencePiece-style: 'llama')"


def _check_kind(kind, tj_path: Path) -> None:
    """Refuse a tokenizer model kind that would give a GGUF llama.cpp cannot load (or that this
    converter does not write), in one line naming it."""
    if kind != "BPE":
        raise UnsupportedError(f"tokenizer model type {kind!r} is not converted: llama.cpp's vocabularies are BPE, "
                               "SentencePiece, WordPiece and Unigram (no WordLevel), and this converter writes "
                               f"{_WRITTEN}; nothing was written", path=str(tj_path))


def check_name_for_llamacpp(name: str, vocab: GGUFVocab, path: str | None) -> None:
    """Refuse a ``general.name`` on which llama.cpp keys a tokenizer quirk needing tokens this
    vocabulary lacks: the file would not load (the default name is the source folder's)."""
    low = (name or "").lower()
    have = set(vocab.tokens)
    for needles, tokens in LLAMACPP_NAME_TOKENS:
        hit = next((n for n in needles if n in low), None)
        missing = [t for t in tokens if t not in have]
        if hit is not None and missing:
            raise UnsupportedError(f"general.name {name!r} contains {hit!r}, on which llama.cpp requires the tokens "
                                   f"{', '.join(tokens)}, and this vocabulary lacks {', '.join(missing)}: "
                                   "the file would not load; nothing was written", path=path,
                                   hint=f"give --name NAME without {' / '.join(repr(n) for n in needles)}")


def hf_vocab(folder: str | Path, n_vocab: int, config: dict | None = None, *,
             effective_json: str | dict | None | bool = False) -> GGUFVocab:
    """Build the GGUF vocabulary for a model with ``n_vocab`` embedding rows from an HF folder.

    ``effective_json``: :func:`effective_tokenizer_json` of the folder when the caller has it
    already (computed in another process, so that this one never imports transformers);
    ``False``: computed here; None or tokenizer.json already parsed (a dict): the file as written."""
    folder = Path(folder)
    tj_path, tj, tcfg = vocab_sources(folder, effective_json)
    model = tj.get("model") or {}
    if tj_path.name == "tokenizer.json" and not (effective_json is None or isinstance(effective_json, dict)):
        # transformers may rebuild another model kind as BPE (Qwen2Tokenizer makes a BPE without
        # merges from a WordLevel vocab): the kind written in the file decides what it is
        _check_kind((read_folder_json(tj_path).get("model") or {}).get("type"), tj_path)
    _check_kind(model.get("type"), tj_path)
    vocab: dict = dict(model.get("vocab") or {})
    added = tj.get("added_tokens") or []
    for a in added:
        vocab.setdefault(a["content"], a["id"])
    id_to_tok = _ids_to_tokens(vocab, n_vocab, tj_path)
    spm = bool(model.get("byte_fallback"))
    kind = "llama" if spm else "gpt2"

    special_added = {a["content"]: bool(a.get("special")) for a in added}
    specials_by_name = {}
    for typ in HF_SPECIAL_NAMES:
        content = token_content(tcfg.get(f"{typ}_token"))
        if content is not None and content in vocab:
            specials_by_name[typ] = content
    unk = model.get("unk_token") if isinstance(model.get("unk_token"), str) else specials_by_name.get("unk")
    tokens, types = _tokens_and_types(id_to_tok, n_vocab, unk, special_added, spm)

    merges = merge_strings(model.get("merges") or [], str(tj_path))
    if not spm and not merges:
        # llama.cpp's BPE vocabulary needs its merges (llama_vocab::impl::load: "cannot find
        # tokenizer merges in model file"): such a file would not load
        raise UnsupportedError("byte-level BPE tokenizer without merges: llama.cpp refuses a 'gpt2' vocabulary that "
                               "has none, so nothing was written", path=str(tj_path))
    scores = None
    add_space_prefix = None
    if spm:
        scores = spm_scores(folder, merges, tokens, types)
        add_space_prefix = spm_adds_prefix(tj)
        pre = "default"
    else:
        pre = gpt2_pre_name(tj, tj_path)

    ids = special_token_ids(folder, vocab, specials_by_name, config, n_vocab)
    add_bos, add_eos = adds_bos_eos(tj, tcfg, specials_by_name.get("bos"), specials_by_name.get("eos"))
    add_sep = adds_sep(tj, tcfg, token_content(tcfg.get("sep_token")), token_content(tcfg.get("eos_token")))
    return GGUFVocab(model=kind, pre=pre, tokens=tuple(tokens), token_types=tuple(types),
                     scores=tuple(scores) if scores is not None else None,
                     merges=tuple(merges) if (merges and not spm) else None,
                     special_ids=ids, add_bos=add_bos, add_eos=add_eos, add_sep=add_sep,
                     add_space_prefix=add_space_prefix,
                     chat_template=read_chat_template(folder, tcfg),
                     named_templates=read_named_templates(folder, tcfg))
