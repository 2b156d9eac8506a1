"""Reading an HF tokenizer folder: ``tokenizer.json`` (as transformers runs it), ``tokenizer_config.json``,
the chat template, any other JSON beside them; each read checked (one ConfigError naming the file).
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError


def read_folder_json(p: Path) -> dict:
    from ...formats.safe_input import read_json
    return read_json(p, error=ConfigError)


def vocab_sources(folder: Path, effective_json: str | dict | None | bool) -> tuple[Path, dict, dict]:
    """tokenizer.json's path, its effective content and tokenizer_config.json (``{}`` when absent).
    ``effective_json``: the content as text (transformers' effective tokenizer), or tokenizer.json itself
    already parsed (a dict), None to read the file, False to compute the effective one here."""
    tj_path = folder / "tokenizer.json"
    if not tj_path.is_file() and isinstance(effective_json, str) and (folder / "tokenizer.model").is_file():
        # no tokenizer.json, but transformers built the tokenizer from tokenizer.model (InternLM2's
        # folders, read through the class computing the same function)
        tj_path = folder / "tokenizer.model"
    elif not tj_path.is_file():
        raise ConfigError("no tokenizer.json: llama.cpp needs the vocabulary inside the GGUF",
                          path=str(folder), hint="save the tokenizer with AutoTokenizer.save_pretrained(folder) first")
    if effective_json is False:
        effective_json = effective_tokenizer_json(folder)
    tj = effective_json if isinstance(effective_json, dict) else \
        (json.loads(effective_json) if effective_json else read_folder_json(tj_path))
    tcfg = read_folder_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    return tj_path, tj, tcfg


def effective_tokenizer_json(folder: str | Path) -> str | None:
    """The tokenizer transformers actually runs for this folder, as tokenizer.json text.

    transformers >= 5 picks a tokenizer class from config.json's model_type and some classes
    rebuild parts of the pipeline in code: ``Qwen2Tokenizer`` splits with the Qwen2 regex
    whatever tokenizer.json's pre_tokenizer says.  llama.cpp must split like the tokenizer users
    run, so the vocabulary, merges and pre-tokenizer are read from the loaded tokenizer's
    backend; None (read the file itself) when transformers cannot load it.
    """
    try:
        from transformers import AutoTokenizer
        from ...quiet import quiet_transformers
        with quiet_transformers():
            # never the folder's own code (transformers would ask on a terminal): a tokenizer module of the model's
            # own is refused here, and the file as written is read
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is not None:
            return backend.to_str()
    except Exception:  # noqa: BLE001 - fall back to the file as written
        pass
    return None


def _template_name(name: str) -> str:
    """A template name as gguf-py writes it into a key (``GGUFWriter.add_chat_template``: only letters, digits, _)."""
    import string
    return "".join(c if c in string.ascii_letters + string.digits else "_" for c in name)


def read_named_templates(folder: Path, tcfg: dict) -> dict[str, str]:
    """The named (not default) chat templates llama.cpp's converter carries (gguf-py ``SpecialVocab``):
    tokenizer_config.json's list of ``{name, template}``, else, beside chat_template.jinja,
    ``additional_chat_templates/*.jinja``."""
    ct = tcfg.get("chat_template")
    out: dict[str, str] = {}
    if isinstance(ct, list):
        for t in ct:
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str):
                out[t["name"]] = t["template"]
    elif ct is None and (folder / "chat_template.jinja").is_file() and (folder / "additional_chat_templates").is_dir():
        from ...formats.safe_input import MAX_JSON_FILE, read_regular
        for p in sorted((folder / "additional_chat_templates").glob("*.jinja")):
            out[p.stem] = read_regular(p, max_bytes=MAX_JSON_FILE, error=ConfigError).decode("utf-8", "replace")
    return {_template_name(n): t for n, t in out.items() if n != "default" and _template_name(n)}


def read_chat_template(folder: Path, tcfg: dict) -> str | None:
    ct = tcfg.get("chat_template")
    if ct is None and (folder / "chat_template.jinja").is_file():
        from ...formats.safe_input import MAX_JSON_FILE, read_regular
        path = folder / "chat_template.jinja"
        raw = read_regular(path, max_bytes=MAX_JSON_FILE, error=ConfigError)
        try:
            ct = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"is not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    if ct is None and (folder / "chat_template.json").is_file():
        ct = read_folder_json(folder / "chat_template.json").get("chat_template")
    if isinstance(ct, list):  # named templates: llama.cpp's tokenizer.chat_template is the default one
        named = {t.get("name"): t.get("template") for t in ct if isinstance(t, dict) and isinstance(t.get("name"), str)}
        ct = named.get("default")     # none named "default": gguf-py's add_chat_template writes no default either
    return ct if isinstance(ct, str) else None
