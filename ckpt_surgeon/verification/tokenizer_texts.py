"""The built-in texts and conversations of verify's tokenizer section (:mod:`.tokenizer_check`).

Texts: where tokenizers are known to part ways (pre-tokenizer regexes split digits, whitespace runs,
apostrophes and scripts differently; byte fallback and normalizers show on emoji, combining marks and
rare scripts; special tokens written inside text are matched or not).  The special-token texts are
built per pair from both sides' own special tokens (:func:`special_texts`), and the rendered
conversations are tokenized too: a chat prompt is what a deployed model is fed.

Conversations: system + multi-turn, without a system message (many templates add a default one
then), a single user turn, and a tool call with its result (rendered only where the template reads
``tools`` / ``tool_calls``).  Each is rendered with and without ``add_generation_prompt``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TEXTS", "CONVERSATIONS", "Conversation", "special_texts", "TOOLS"]

TEXTS: tuple[str, ...] = (
    # plain English, apostrophes, punctuation
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, isn't it? We'd've known.",
    # multilingual
    "Grüße aus Köln – naïve café, señor, smørrebrød, Łódź.",
    "Привет, как дела? Всё хорошо.",
    "你好，世界！今天天气很好。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Ελληνικά γράμματα και τόνοι",
    "ภาษาไทย ไม่มีช่องว่าง",
    # whitespace runs
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "a\n\nb\n\n\n\nc",
    "   \n   \n",
    "\n",
    " ",
    "line one\r\nline two",
    "word     five spaces",
    "\u00a0no-break\u2003em space\u200bzero width",
    # digits
    "1234567890",
    "3.14159265358979",
    "1,000,000 and 1 000 000",
    "12:30 on 2024-01-15",
    "0x1F 0b1010 1e-10 -42",
    "99999999999999999999",
    # code
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<div class=\"x\">&amp;</div>",
    "{\"key\": [1, 2, 3], \"none\": null}",
    "    indented\n\tand tabbed\n",
    # emoji and composed characters
    "😀 😃 😄",
    "👍🏽 family: 👨‍👩‍👧‍👦",
    "🇫🇷 flags 🏳️‍🌈",
    "ﬁ ligature, Å vs A\u030a, e\u0301",
    # mixed
    "Hello 世界 123 😀 \n\tend",
)


def special_texts(tokens) -> tuple[str, ...]:
    """Texts with special tokens written in them: each token at the start, between words and before a
    newline, and all of them run together (``tokens``: both sides' special token strings, in order)."""
    toks = [t for t in dict.fromkeys(tokens) if t]
    out = [f"{t}Hello{t} world {t}\n" for t in toks]
    if len(toks) > 1:
        out.append("".join(toks))
    return tuple(out)


@dataclass(frozen=True)
class Conversation:
    """One built-in conversation: its name (what the report says), messages (``role`` / ``content``,
    plus ``tool_calls`` on a tool-calling assistant turn) and whether it needs a template that takes
    tools."""

    name: str
    messages: tuple
    tools: bool = False


def _m(role: str, content: str, **extra) -> dict:
    return {"role": role, "content": content, **extra}


TOOLS: tuple[dict, ...] = ({
    "type": "function",
    "function": {"name": "get_weather", "description": "The current weather in a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}},)

CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation("system+multi-turn", (
        _m("system", "You are a terse assistant."),
        _m("user", "What is 2 + 2?"),
        _m("assistant", "4."),
        _m("user", "And times 3? Answer in Chinese: 十二 or not."))),
    Conversation("multi-turn, no system", (
        _m("user", "Hi! 😀"),
        _m("assistant", "Hello. How can I help?"),
        _m("user", "Write `print(1)` in Python.\n  Keep   the spaces."))),
    Conversation("one user turn", (
        _m("user", "What is the capital of France?"),)),
    Conversation("tool call", (
        _m("system", "You can call tools."),
        _m("user", "Weather in Paris?"),
        _m("assistant", "", tool_calls=[{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]),
        _m("tool", "{\"temperature_c\": 21}", name="get_weather"),
        _m("assistant", "It is 21 °C in Paris.")), tools=True),
)
