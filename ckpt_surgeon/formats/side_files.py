"""The small files beside a checkpoint's weights (tokenizer, chat template, generation config), read
from wherever the weights come from: a local folder, or a Hub repo by HTTP (``hub/ranges.py``).

A reader answers :meth:`names` (what exists, relative to the weights' folder) and :meth:`read`
(the whole file, or None when it is not there).  Files are size-checked as every JSON input is
(``safe_input.MAX_JSON_FILE``); nothing here parses them.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError
from .safe_input import MAX_JSON_FILE, read_regular

# Files that describe a tokenizer and how it is used (transformers' and llama.cpp's converter's names).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "config.json", "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.txt",
                   "merges.txt", "added_tokens.json")
TEMPLATE_DIR = "additional_chat_templates"


class FolderFiles:
    """Side files of a local folder."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.label = str(self.folder)

    def names(self) -> list[str]:
        out = [n for n in TOKENIZER_FILES if (self.folder / n).is_file()]
        tdir = self.folder / TEMPLATE_DIR
        if tdir.is_dir():
            out += sorted(f"{TEMPLATE_DIR}/{p.name}" for p in tdir.glob("*.jinja") if p.is_file())
        return out

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def read(self, name: str) -> bytes | None:
        p = self.folder / name
        if not p.is_file():
            return None
        return read_regular(p, max_bytes=MAX_JSON_FILE, error=ConfigError)

    @contextmanager
    def as_folder(self):
        """A local folder holding the files (this one)."""
        yield self.folder


class RemoteFiles:
    """Side files fetched through ``fetch(name) -> bytes`` (whole files, cached by the caller) from a
    listing of the repository."""

    def __init__(self, label: str, listing, fetch, base: str = ""):
        self.label = label
        self._fetch = fetch
        self._base = base
        prefix = f"{base}/" if base else ""
        files = {f[len(prefix):] for f in listing if f.startswith(prefix)}
        self._names = [n for n in TOKENIZER_FILES if n in files] + \
            sorted(n for n in files if n.startswith(f"{TEMPLATE_DIR}/") and n.endswith(".jinja") and n.count("/") == 1)
        self._cache: dict[str, bytes] = {}

    def names(self) -> list[str]:
        return list(self._names)

    def path(self, name: str) -> str:
        return f"{self.label}/{name}"

    def read(self, name: str) -> bytes | None:
        if name not in self._names:
            return None
        if name not in self._cache:
            self._cache[name] = self._fetch(f"{self._base}/{name}" if self._base else name)
        return self._cache[name]

    @contextmanager
    def as_folder(self):
        """A temporary local folder holding copies of the files (for readers that take a folder)."""
        with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-side-") as tmp:
            for n in self._names:
                data = self.read(n)
                if data is not None:
                    (Path(tmp) / n).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / n).write_bytes(data)
            yield Path(tmp)
