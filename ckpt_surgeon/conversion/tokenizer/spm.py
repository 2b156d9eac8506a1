"""SentencePiece-style BPE with byte fallback (``tokenizer.ggml.model = llama``: Llama 2, Mistral
v0.1, Phi-3 ...) both ways.

Tokens are spelled with ``▁``; llama.cpp merges the adjacent pair whose concatenation has the
highest *score* (``llm_tokenizer_spm``), while ``tokenizer.json`` lists *merges* by rank.
HF -> GGUF: scores come from ``tokenizer.model`` when present (exact, like llama.cpp's
``_set_vocab_sentencepiece``), else ``-rank`` of the merge that produces each token
(:func:`spm_scores`); :func:`spm_model_vocab` walks ``tokenizer.model`` piece by piece as a
converter with quirks does (InternLM2).  GGUF -> HF (:func:`spm_bpe`): merges are every split
of a token into two vocabulary pieces, ordered by the token's score, which is how
SentencePiece's own BPE picks pairs.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError
from .hf_files import read_folder_json
from .vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, GGUFVocab


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


def spm_scores(folder: Path, merges: list[str], tokens: list[str], types: list[int]) -> list[float]:
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


def spm_adds_prefix(tj: dict) -> bool:
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


def spm_bpe(v: GGUFVocab, tokens: list[str], types: list[int]):
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
    tcfg = read_folder_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    overrides = [(int(tid), data) for tid, data in (tcfg.get("added_tokens_decoder") or {}).items()]
    tj = read_folder_json(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else {}
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
        for content in read_folder_json(folder / "added_tokens.json"):
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
