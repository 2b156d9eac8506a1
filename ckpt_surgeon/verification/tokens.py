"""Prompt ids for ``verify`` and ``--localize``: the tokenizer used, the candidate's own tokenizer
checked to encode every prompt the same, token ids checked against the vocabulary, and prompts
cut to the model's context."""
from __future__ import annotations

import os

from ..errors import CkptError, ConfigError
from ..runtime import load_tokenizer
from .loading import PreparedModel
from .metrics import first_difference


def check_tokenizer_source(tokenizer) -> None:
    """``--tokenizer`` checked before any work (issue 36: a GGUF there cost 25 s of loading, then an
    internal error): a local file must be a ``tokenizer.json``; a folder or a Hub id is left to
    ``AutoTokenizer``.  A GGUF's vocabulary is not read here: ``convert`` writes it as tokenizer.json."""
    from ..formats.magic import kind_of_bytes
    if tokenizer is None or not os.path.isfile(os.fspath(tokenizer)):
        return
    p = os.fspath(tokenizer)
    with open(p, "rb") as f:
        head = f.read(64)
    kind = kind_of_bytes(head, os.path.getsize(p))
    if kind is None and head.lstrip()[:1] == b"{":
        return
    what = f"a {'GGUF' if kind == 'gguf' else kind} file" if kind else "not a tokenizer.json (JSON) file"
    hint = (f"its vocabulary becomes tokenizer.json with ckpt-surgeon convert {p} -o DIR; then pass --tokenizer DIR"
            if kind == "gguf" else "pass a folder, a tokenizer.json file or a Hub id")
    raise ConfigError(f"--tokenizer is {what}, not a tokenizer (a folder, a tokenizer.json file or a Hub id)",
                      path=p, hint=hint)


def tokenize_pair(ref: PreparedModel, cand: PreparedModel, prompts, token_ids, tokenizer, kind, max_new_tokens,
                  notes, *, own_judged: str | None = None):
    """Ids per prompt -> (tokenizer or None, ids).  The tokenizer is ``tokenizer`` when given, else
    the reference's; every model that ships its own tokenizer must encode each prompt the same,
    except the candidate when ``own_judged`` says why not (verify's tokenizer section compares both
    sides' own tokenizers and reports a difference, or was switched off): both models are then fed
    the reference's ids, and a note says so.
    With ``token_ids`` the ids are taken as given (checked against the vocabulary size)."""
    tok = None
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer, path=os.fspath(tokenizer), local_files_only=False)
    elif ref.has_tokenizer:
        tok = load_tokenizer(ref.folder, path=ref.given)
    elif token_ids is None:
        raise ConfigError("has no tokenizer files; verify tokenizes the prompts with the reference's tokenizer",
                          path=ref.given, hint="pass --tokenizer PATH_OR_ID (any folder, tokenizer.json or Hub id "
                                               "AutoTokenizer takes) or --token-ids FILE")
    if token_ids is not None:
        full = token_ids
        vocab = _vocab_size(ref.config)
        for i, ids in enumerate(full):
            if vocab is not None and max(ids) >= vocab:
                raise ConfigError(f"token ids entry {i} holds id {max(ids)}, beyond the model's vocabulary "
                                  f"({vocab} tokens)", path=ref.given)
        notes.append("prompts given as token ids; no tokenizer was used to encode them")
    else:
        full = [list(tok(p, add_special_tokens=True)["input_ids"]) for p in prompts]
        given = tokenizer is not None
        used = os.fspath(tokenizer) if given else "the reference's"
        if given:
            notes.append(f"prompts tokenized with {used}")
        for pm in ((ref, cand) if given else (cand,)):
            if pm.has_tokenizer:
                try:
                    _same_ids(load_tokenizer(pm.folder, path=pm.given), pm, prompts, full, given=given)
                except ConfigError as e:
                    if not own_judged or given:
                        raise
                    notes.append(f"{pm.given}: {e.detail.split('; ')[0]}: both models are fed the reference's ids "
                                 f"({own_judged})")
            else:
                notes.append(f"{pm.given} has no tokenizer files; prompts are tokenized with {used}")
    return tok, cut_to_context(full, max_positions(ref.config, tok), max_new_tokens if kind.generates else 0, notes)


def cut_to_context(full, positions: int | None, max_new_tokens: int, notes: list) -> list:
    """Each prompt's ids cut to the model's ``positions`` less the greedy tokens (said in ``notes``); an empty
    prompt, or no room left for one, is an error."""
    limit = positions - max_new_tokens if positions is not None else None
    if limit is not None and limit < 1:
        raise CkptError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's "
                        f"{positions} positions")
    out = []
    for i, ids in enumerate(full):
        if not ids:
            raise CkptError(f"prompt {i} tokenizes to no tokens")
        if limit is not None and len(ids) > limit:
            notes.append(f"prompt {i} truncated from {len(ids)} to {limit} tokens (model context)")
            ids = ids[:limit]
        out.append(ids)
    return out


def _same_ids(other_tok, pm: PreparedModel, prompts, full, *, given: bool) -> None:
    """``pm``'s own tokenizer must give the ids the prompts were encoded to (by the tokenizer
    given, or else the reference's), or the outputs would not be comparable."""
    for i, (p, a) in enumerate(zip(prompts, full)):
        b = list(other_tok(p, add_special_tokens=True)["input_ids"])
        j = first_difference(a, b)
        if j is not None:
            got = b[j] if j < len(b) else "end"
            want = a[j] if j < len(a) else "end"
            against = "the tokenizer given" if given else "the reference's"
            raise ConfigError(
                f"tokenizer encodes prompt {i} ({p[:30]!r}) differently from {against} (token {j}: "
                f"{pm.role} id {got}, {'expected' if given else 'reference'} id {want}); the outputs would not be "
                "comparable", path=pm.given,
                hint="pass the tokenizer that belongs to both models with --tokenizer" if given
                else "give the candidate the reference's tokenizer files")


def _vocab_size(config: dict) -> int | None:
    v = config.get("vocab_size")
    if v is None and isinstance(config.get("text_config"), dict):
        v = config["text_config"].get("vocab_size")
    return v if isinstance(v, int) and v > 0 else None


def max_positions(config: dict, tok) -> int | None:
    lims = [v for v in (config.get("max_position_embeddings"), config.get("n_positions"),
                        getattr(tok, "model_max_length", None) if tok is not None else None)
            if isinstance(v, int) and 0 < v < 10**8]
    return min(lims) if lims else None
