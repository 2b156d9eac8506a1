"""A checkpoint's tokenizer and chat template, read from any format (:mod:`.record`), compared
(:mod:`.compare`, for ``diff``), rendered and recognised (:mod:`.templates`) and checked on one file
(:mod:`.checks`, for ``lint``)."""
from __future__ import annotations

from .compare import TokenizerDiff, compare_tokenizers
from .record import TokenizerRecord, read_tokenizer, tokenizer

__all__ = ["TokenizerDiff", "TokenizerRecord", "compare_tokenizers", "read_tokenizer", "tokenizer"]
