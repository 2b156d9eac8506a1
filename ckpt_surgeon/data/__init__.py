"""Data shipped with ckpt-surgeon.

``corpus.txt``: a corpus ``verify --corpus builtin`` scores without a download (issue 50 item 4): the first
128 KB of this project's own documentation (``docs/*.md`` concatenated in name order, blank line between files,
cut at a paragraph; English prose, tables and code) as of 2026-11-29, frozen so that figures measured on it
stay reproducible when the docs change (42,107 tokens with SmolLM2's tokenizer).  For figures comparable with llama.cpp users' posts use wikitext-2
(``wiki.test.raw``, llama.cpp's ``scripts/get-wikitext-2.sh``).
"""
from __future__ import annotations

from pathlib import Path

BUILTIN = "builtin"
CORPUS = Path(__file__).with_name("corpus.txt")


def corpus_file(value):
    """``value`` with :data:`BUILTIN` replaced by the shipped corpus' path (anything else as given)."""
    return CORPUS if isinstance(value, str) and value == BUILTIN else value
