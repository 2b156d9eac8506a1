"""Built-in prompts for ``analyze --measure`` (and anyone who wants a varied, offline prompt set).

The set mixes short English, Chinese, German/French and code prompts (different tokenizer paths,
different attention patterns) with one long document, so that the measured effect of removing a
rotary key bias covers distances up to ``max_tokens`` (the bias term depends on ``n - m``; short
prompts alone would never exercise the low-frequency pairs).  Everything is generated
deterministically, no file or network access.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CkptError, SourceNotFoundError

SHORT_PROMPTS: tuple[str, ...] = (
    "The attention layer projects every token into a query, a key and a value, and the softmax of "
    "the scaled dot products decides how much of each value reaches the output.",
    "注意力机制把每个词映射为查询、键和值。模型的权重保存在文件中，偏置项也是权重的一部分。",
    "Die Aufmerksamkeit vergleicht jede Anfrage mit allen Schlüsseln. Le biais de la clé est-il "
    "vraiment inutile ? ¿Y el sesgo del valor?",
    "def attention(q, k, v, scale):\n    scores = [[scale * sum(a * b for a, b in zip(qi, kj)) for kj in k] for qi in q]\n"
    "    out = []\n    for row in scores:\n        m = max(row)\n        e = [math.exp(x - m) for x in row]\n"
    "        s = sum(e)\n        out.append([sum(w / s * vj[d] for w, vj in zip(e, v)) for d in range(len(v[0]))])\n"
    "    return out\n",
)

_TOPICS = (
    ("rotary embeddings", "turn each pair of query and key dimensions by an angle proportional to the position"),
    ("the key bias", "is constant over keys only when nothing rotates it after the projection"),
    ("safetensors files", "start with a JSON header that names every tensor and its byte range"),
    ("quantized GGUF files", "store weights in blocks with one scale per block and metadata beside them"),
    ("layer normalisation", "rescales the hidden state before the attention projections read it"),
    ("grouped-query attention", "lets several query heads share one key and value head"),
    ("a long context window", "makes the slow rotary pairs turn through larger angles"),
    ("the value bias", "adds a constant to the attention output because softmax rows sum to one"),
)


def long_context_prompt(paragraphs: int = 96) -> str:
    """A long, varied document (numbered sections cycling through topics and numbers).

    ~100 tokens per paragraph with a byte-level BPE; callers truncate to their token budget.
    """
    out = []
    for i in range(paragraphs):
        topic, fact = _TOPICS[i % len(_TOPICS)]
        n = (i * 7919) % 1000
        out.append(f"Section {i + 1}. In this part we look again at {topic}, which {fact}. "
                   f"Example {n}: with {n % 13 + 2} heads and {(n % 5 + 1) * 64} dimensions per head, "
                   f"position {n * 3} is {n * 3 - i} tokens away from position {i}. "
                   f"Remember item {chr(65 + i % 26)}{i} for the summary at the end.")
    out.append("Summary: list every item you were asked to remember, in order.")
    return "\n\n".join(out)


def default_prompts() -> list[str]:
    """The built-in set: short multilingual text, code, and one long-context document (a fresh list)."""
    return list(SHORT_PROMPTS) + [long_context_prompt()]


# Prompts / token-id files are tokenized and run through two models: 16 MiB of text is already
# millions of tokens.  A larger file (or /dev/zero) is refused before it is read.
MAX_TEXT_FILE = 16 << 20


def read_text_file(p: Path, what: str) -> str:
    """A user's UTF-8 text file (``what``: "prompts file" ...), or one CkptError line: a regular file
    (a FIFO would block, a device never end) of at most :data:`MAX_TEXT_FILE` bytes."""
    from ..formats.safe_input import read_regular
    if not os.path.exists(p):
        raise SourceNotFoundError(f"{what} not found", path=str(p))
    raw = read_regular(p, max_bytes=MAX_TEXT_FILE, error=CkptError, what=what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CkptError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})", path=str(p)) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")    # universal newlines, as Path.read_text


def parse_json_text(text: str, p: Path, what: str, bad) -> object:
    """``json.loads`` with its syntax error reported as ``bad(e)``; a document past the nesting
    or number limits gets the shared parser's message (:func:`~ckpt_surgeon.formats.safe_input.loads_json`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CkptError(bad(e), path=str(p)) from None
    except (RecursionError, ValueError):
        from ..formats.safe_input import loads_json
        loads_json(text, path=str(p), error=CkptError, what=what)
        raise


def load_prompts(path: str | Path) -> list[str]:
    """Read ``--prompts FILE`` (``analyze --measure`` and ``verify``): a JSON list of strings,
    or else one prompt per non-empty line.

    A file whose first non-blank character is ``[`` must be a JSON list of strings (so a typo in
    it is reported, not silently read as lines).  Raises CkptError for a missing file, bad JSON,
    non-string entries or an empty set.
    """
    p = Path(path)
    text = read_text_file(p, "prompts file")
    if text.lstrip().startswith("["):
        data = parse_json_text(text, p, "prompts file",
                               lambda e: f"starts with '[' but is not valid JSON ({e.msg} at line {e.lineno})")
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise CkptError("a JSON prompts file must hold a list of strings", path=str(p))
        prompts = [x for x in data if x.strip()]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise CkptError("prompts file holds no non-empty prompt", path=str(p))
    return prompts
