"""Special tokens of an HF tokenizer: which ids they have, and whether encoding adds BOS, EOS
or a separator, decided as llama.cpp's converter (gguf-py ``SpecialVocab``) decides them.
"""
from __future__ import annotations

from pathlib import Path

from .hf_files import read_folder_json


HF_SPECIAL_NAMES = ("bos", "eos", "unk", "pad", "sep", "cls", "mask")


def token_content(entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def adds_bos_eos(tj: dict, tcfg: dict, bos: str | None, eos: str | None) -> tuple[bool, bool]:
    """Whether encoding adds BOS / EOS: tokenizer_config's flags win, else the post-processor template."""
    add_bos = tcfg.get("add_bos_token")
    add_eos = tcfg.get("add_eos_token")
    pp = tj.get("post_processor") or {}
    procs = pp.get("processors", [pp]) if isinstance(pp, dict) else []
    for proc in procs:
        if isinstance(proc, dict) and proc.get("type") == "TemplateProcessing":
            single = proc.get("single") or []
            first = single[0].get("SpecialToken", {}).get("id") if single else None
            last = single[-1].get("SpecialToken", {}).get("id") if single else None
            if add_bos is None:
                add_bos = first is not None and first == bos
            if add_eos is None:
                add_eos = last is not None and last == eos
    return bool(add_bos), bool(add_eos)


def _special_id(item) -> str | None:
    return item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None


def adds_sep(tj: dict, tcfg: dict, sep: str | None, eos: str | None) -> bool | None:
    """Whether encoding a pair puts a separator between the sequences, decided as llama.cpp's
    converter decides it (gguf-py ``SpecialVocab._try_load_from_tokenizer_json``): RobertaProcessing
    adds one; a TemplateProcessing ``pair`` template ``[first] A X [Y] B [last]`` adds one when X
    (or Y) is the sep or eos token (X only when the single template has no trailing special);
    else tokenizer_config's ``add_sep_token``.  None where the converter writes no key."""
    add = None
    pp = tj.get("post_processor") or {}
    for proc in (pp.get("processors", [pp]) if isinstance(pp, dict) else []):
        kind = proc.get("type") if isinstance(proc, dict) else None
        if kind == "RobertaProcessing":
            add = True
        elif kind == "TemplateProcessing":
            single, pair = proc.get("single") or [], proc.get("pair") or []
            first = _special_id(single[0]) if len(single) > 1 else None
            last = _special_id(single[-1]) if len(single) > 1 else None
            end_token = last or eos          # a trailing special of the single template becomes its eos
            if not pair:
                continue
            start = 1 if first and _special_id(pair[0]) == first else 0
            stop = -1 if last and _special_id(pair[-1]) == last else None
            mid = pair[start:stop]
            seq = [m.get("Sequence", {}).get("id") if isinstance(m, dict) else None for m in mid[:1] + mid[-1:]]
            inner = mid[1:-1]
            if seq == ["A", "B"] and inner:
                add = bool(_special_id(inner[0]) in (sep, end_token) and _special_id(inner[0]) is not None
                           and not last)
                if len(inner) == 2 and _special_id(inner[1]) is not None and _special_id(inner[1]) in (sep, end_token):
                    add = True
    if add is None and isinstance(tcfg.get("add_sep_token"), bool):
        add = tcfg["add_sep_token"]
    return add


def special_token_ids(folder: Path, vocab: dict, specials_by_name: dict, config: dict | None,
                      n_vocab: int) -> dict[str, int]:
    """Special ids: tokenizer_config names them; config.json / generation_config.json fill gaps."""
    ids = {typ: vocab[c] for typ, c in specials_by_name.items()}
    cfgs = [config or {}]
    if (folder / "generation_config.json").is_file():
        cfgs.insert(0, read_folder_json(folder / "generation_config.json"))
    for typ in ("bos", "eos", "pad"):
        for c in cfgs:
            v = c.get(f"{typ}_token_id")
            if isinstance(v, list):
                v = v[0] if v else None
            if typ not in ids and isinstance(v, int) and 0 <= v < n_vocab:
                ids[typ] = v
    return ids
