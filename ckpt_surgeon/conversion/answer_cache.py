"""transformers' answers about a config, cached on disk, so that only the first run pays for torch.

``convert`` (HF -> GGUF: :func:`.model_check.probe_folder`; GGUF -> HF: the model's tensor shapes)
and ``lint``'s ``loads-cleanly`` check ask transformers questions whose answer depends only on
the config, the tokenizer files or the tensor set they are given, and on the transformers release:
importing torch + transformers to answer them costs seconds of CPU and ~400 MB each run.  The
answers are JSON, kept as the derived-architecture cache keeps its facts (:mod:`ckpt_surgeon.arch.derive.derived`):
under the same directory (``$CKPT_SURGEON_CACHE_DIR``, else the user cache), one file per
(question, model_type, transformers version, hash of this code's :data:`CACHE_VERSION`, the
package version and every input), written atomically (:func:`ckpt_surgeon.publish.write_file_atomic`).
A changed input is a different file; a corrupt or unreadable file is a miss, never an error.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..arch.derive.derived import cache_dir
from ..errors import CkptError
from ..formats.safe_input import MAX_JSON_FILE, read_json, read_regular
from ..publish import write_file_atomic
from ..version import __version__

# Bumped whenever an answer's meaning or shape changes (what probe_folder returns, what a
# load-keys report holds), so that an older answer is never read as a newer one.
CACHE_VERSION = 1
SUBDIR = "_transformers_answers"   # beside derive's <model_type>/ folders; no model_type starts with "_"

# Files of an HF folder that transformers' AutoConfig / AutoTokenizer may read (config, tokenizer
# vocabularies and settings, chat templates); weights are not among them, so not hashed.
_INPUT_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")


def transformers_version() -> str | None:
    """The installed transformers' version, from its package metadata (no import); None without it."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def folder_inputs(folder: str | Path) -> dict[str, str] | None:
    """``file name -> sha256`` of the files of ``folder`` transformers reads for a config and a
    tokenizer; None when one cannot be read (the caller asks transformers, which says why)."""
    out = {}
    try:
        for p in sorted(Path(folder).iterdir()):
            if p.name.endswith(_INPUT_SUFFIXES) and p.is_file():
                out[p.name] = hashlib.sha256(read_regular(p, max_bytes=MAX_JSON_FILE)).hexdigest()
    except (CkptError, OSError):
        return None
    return out


def answer_path(question: str, model_type, inputs) -> Path | None:
    """Where the answer to ``question`` about ``inputs`` (JSON-able: a config, tensor shapes, file
    hashes) is kept; None when transformers is not installed (nothing to cache an answer of) or
    ``inputs`` is None (they could not be read)."""
    tv = transformers_version()
    if tv is None or inputs is None:
        return None
    body = json.dumps(inputs, sort_keys=True, default=str)
    h = hashlib.sha256(f"{CACHE_VERSION}\n{__version__}\n{question}\n{body}".encode()).hexdigest()[:24]
    mt = re.sub(r"[^A-Za-z0-9_.-]", "_", str(model_type))
    return cache_dir() / SUBDIR / question / mt / tv / f"{h}.json"


def config_inputs(cfg: dict) -> dict:
    """A config as a cache input: the keys that name where or by what it was saved are left out
    (as derive's cache leaves them out), so a copy of a model hits the same entry."""
    return {k: v for k, v in cfg.items() if k not in ("transformers_version", "_name_or_path")}


def load(path: Path | None) -> dict | None:
    """The stored answer, or None (absent, corrupt, or no cache)."""
    if path is None:
        return None
    try:
        got = read_json(path, max_bytes=MAX_JSON_FILE, what="cached transformers answer")
    except (CkptError, OSError, ValueError, TypeError):
        return None
    return got.get("answer") if isinstance(got, dict) and isinstance(got.get("answer"), dict) else None


def store(path: Path | None, answer: dict) -> None:
    """Keep ``answer`` (atomic: concurrent runs never read half of one); a read-only cache only
    costs the next run the question again."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, json.dumps({"answer": answer}).encode())
    except OSError:
        pass
