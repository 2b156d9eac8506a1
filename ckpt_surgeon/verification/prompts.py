"""Prompts ``verify`` runs through both models: a built-in default set and ``--prompts FILE``.

The default set is short (every prompt fits a 128-position encoder with room for 32 generated
tokens) and varied on purpose: English prose, code, digits, CJK and emoji take different
tokenizer paths (merges, byte fallback, multi-byte UTF-8), a chat-formatted prompt exercises
special tokens, and a repetitive prompt gives near-deterministic next tokens on real models
(where a mismatch in greedy decoding is easy to see).
"""
from __future__ import annotations

from pathlib import Path

from ..analysis.prompts import load_prompts  # noqa: F401  (one reader for --prompts FILE, shared)
from ..analysis.prompts import parse_json_text, read_text_file
from ..errors import CkptError

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The attention layer projects every token into a query, a key and a value.",
    "The capital of France is",
    "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    "注意力机制把每个词映射为查询、键和值。",
    "<|im_start|>user\nWhat is a key bias?<|im_end|>\n<|im_start|>assistant\n",
    "Great work! 🎉 The model converted cleanly 🚀 and",
    "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the",
)


def default_prompts() -> list[str]:
    """The built-in prompt set (a fresh list)."""
    return list(DEFAULT_PROMPTS)


def load_token_ids(path: str | Path) -> list[list[int]]:
    """Read ``--token-ids FILE``: JSON, either one list of token ids (one prompt) or a list of
    such lists (one per prompt).  For models without a tokenizer, or to pin the exact ids.

    Raises CkptError for a missing file, bad JSON, a non-integer or negative id, or an empty
    prompt; ids beyond the model's vocabulary are checked by ``verify`` against the config.
    """
    p = Path(path)
    text = read_text_file(p, "token ids file")
    data = parse_json_text(text, p, "token ids file", lambda e: f"is not valid JSON ({e.msg} at line {e.lineno}); "
                                                                "expected a list of token ids or a list of such lists")
    if isinstance(data, list) and data and all(_is_id(x) for x in data):
        data = [data]
    if not isinstance(data, list) or not data:
        raise CkptError("must hold a non-empty JSON list of token ids, or a list of such lists", path=str(p))
    for i, ids in enumerate(data):
        if not isinstance(ids, list) or not ids:
            raise CkptError(f"entry {i} is not a non-empty list of token ids", path=str(p))
        bad = next((x for x in ids if not _is_id(x)), None)
        if bad is not None or any(x < 0 for x in ids):
            what = bad if bad is not None else min(ids)
            raise CkptError(f"entry {i} holds {what!r}, not a token id (a non-negative integer)", path=str(p))
    return [list(ids) for ids in data]


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
