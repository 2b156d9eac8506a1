"""Chat templates: which family llama.cpp takes one for, how transformers renders it, and what it prints.

* :func:`template_family`: the name of llama.cpp's built-in renderer that renders the template
  (``llama_chat_apply_template``, what llama.cpp uses without ``--jinja``: it recognises a template by
  its text and renders it with that built-in).  Found by rendering one probe conversation with the
  template and with every built-in name (``llama_chat_builtin_templates``) and taking the one that
  renders alike; nothing about the families is retyped here.
* :func:`render`: transformers' own renderer (``render_jinja_template``, the sandboxed jinja
  environment ``apply_chat_template`` uses), with the tokenizer's special-token texts as variables.
* :func:`printed_tokens`: the token-looking strings a rendered conversation contains (``<|...|>``,
  and the shapes of the vocabulary's own special tokens).
"""
from __future__ import annotations

import functools
import re

# Conversations every check renders: the system + multi-turn case, a conversation without a system
# message, and one with a tool call (templates that take tools render it; others may refuse it).
ASSISTANT_MARK = "Paris is the capital of France."
CONVERSATIONS: dict[str, list[dict]] = {
    "system-multiturn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": ASSISTANT_MARK},
        {"role": "user", "content": "And of Italy?"}],
    "user-assistant": [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": ASSISTANT_MARK}],
    "tool-call": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "name": "get_weather", "content": "22 degrees and sunny"}],
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}]
# token-looking text whatever the vocabulary: <|...|> (ChatML, Llama 3, Phi, Qwen, gpt-oss ...)
_PIPE_TOKEN = re.compile(r"<\|[^|<>\s]{1,64}\|>")
_WORD = re.compile(r"[A-Za-z0-9_]+")


# --------------------------------------------------------------------------- llama.cpp's renderer


def _llama_cpp():
    try:
        import llama_cpp
    except Exception:           # noqa: BLE001 - not installed (the `llama` extra), or its library fails to load
        return None
    return llama_cpp


def apply_chat_template(llama_cpp, template: bytes, messages, add_assistant: bool) -> str | None:
    """``llama_chat_apply_template`` of the bindings ``llama_cpp`` on ``messages`` ((role, content) pairs): the
    rendered chat, or None where llama.cpp recognises no family in the template (it returns -1:
    ``llm_chat_detect_template`` found none).  Used here and by verify's llama.cpp child."""
    import ctypes
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role.encode("utf-8"), content.encode("utf-8")) for role, content in messages])
    size = 2 * sum(len(r.encode()) + len(c.encode()) for r, c in messages) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template, chat, len(messages), add_assistant, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1        # the first call said how much it needs
    raise RuntimeError("llama_chat_apply_template kept asking for a larger buffer")


def llama_render(template: str, messages: list[dict], add_assistant: bool) -> str | None:
    """llama.cpp's built-in rendering of ``messages`` with ``template`` (a template text or a built-in
    name); None when llama.cpp recognises no built-in for it (or llama-cpp-python is not installed)."""
    ll = _llama_cpp()
    if ll is None:
        return None
    pairs = [(m["role"], str(m.get("content") or "")) for m in messages]
    return apply_chat_template(ll, template.encode(), pairs, add_assistant)


@functools.lru_cache(maxsize=1)
def builtin_templates() -> tuple[str, ...]:
    import ctypes
    ll = _llama_cpp()
    if ll is None:
        return ()
    n = ll.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    ll.llama_chat_builtin_templates(arr, n)
    return tuple(x.decode() for x in arr)


@functools.lru_cache(maxsize=64)
def template_family(template: str | None) -> str | None:
    """The llama.cpp built-in that renders ``template`` ("chatml", "llama3", "gemma" ...); "unrecognised"
    when llama.cpp has none for it (it then needs ``--jinja``); None without a template; "unknown" when
    llama-cpp-python is not installed."""
    if not template:
        return None
    if _llama_cpp() is None:
        return "unknown (llama-cpp-python not installed)"
    probe = CONVERSATIONS["system-multiturn"]
    got = llama_render(template, probe, True)
    if got is None:
        return "unrecognised"
    for name in builtin_templates():
        if llama_render(name, probe, True) == got:
            return name
    return "unrecognised"


# --------------------------------------------------------------------------- transformers' renderer


def compile_check(template: str) -> str | None:
    """None when transformers' chat-template environment parses ``template``, else the reason in one line."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template
    try:
        render_jinja_template(conversations=[[]], chat_template=template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return msg + (f" (line {e.lineno})" if e.lineno else "")
    except Exception:           # noqa: BLE001 - it parsed; an empty conversation may still be refused
        return None
    return None


def render(template: str, messages: list[dict], *, add_generation_prompt: bool, specials: dict | None = None,
           tools: list | None = None) -> str:
    """``messages`` rendered by transformers' own chat-template renderer; raises on a template error."""
    from transformers.utils.chat_template_utils import render_jinja_template
    kw = {f"{k}_token": v for k, v in (specials or {}).items() if v is not None}
    out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                   add_generation_prompt=add_generation_prompt, **kw)
    return out[0]


def _renderings(template: str, specials: dict | None) -> dict[str, str]:
    from ...quiet import quiet_transformers
    out = {}
    with quiet_transformers():
        for name, msgs in CONVERSATIONS.items():
            for gen in (False, True):
                if name == "tool-call" and not gen:
                    continue
                try:
                    out[name + ("+gen" if gen else "")] = render(template, msgs, add_generation_prompt=gen,
                                                                 specials=specials,
                                                                 tools=TOOLS if name == "tool-call" else None)
                except Exception:    # noqa: BLE001 - a template may refuse a conversation on purpose
                    continue
    return out


def renderings(template: str, specials: dict | None = None) -> tuple[str | None, dict[str, str]]:
    """(why the template does not parse, or None; every built-in conversation that renders -> its text), the
    conversation named with ``+gen`` for add_generation_prompt; ones the template refuses (raise_exception, a
    role it does not take) are left out.  transformers' answer is kept in its answer cache
    (:mod:`...conversion.answer_cache`): a later run on the same template does not import it."""
    import hashlib
    from ...conversion import answer_cache
    inputs = {"template": hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest(),
              "specials": dict(sorted((specials or {}).items())),
              "conversations": hashlib.sha256(repr((CONVERSATIONS, TOOLS)).encode()).hexdigest()}
    path = answer_cache.answer_path("chat-renderings", "template", inputs)
    got = answer_cache.load(path)
    if got is None:
        why = compile_check(template)
        got = {"parse_error": why, "rendered": {} if why is not None else _renderings(template, specials)}
        answer_cache.store(path, got)
    return got.get("parse_error"), dict(got.get("rendered") or {})


# --------------------------------------------------------------------------- what a rendering prints


def token_shapes(control_texts) -> list[re.Pattern]:
    """Regexes for text shaped like the vocabulary's own control tokens: each one's letters and digits made a
    wildcard (``<start_of_turn>`` -> ``<\\w+>``, ``[INST]`` -> ``\\[\\w+\\]``), only for control tokens that
    are a bracketed word of 3 or more letters (not ``</s>``, whose shape is ordinary markup).  Control tokens
    only: a user-defined token such as Qwen's ``<tool_call>`` is text the model reads, and its shape is
    the shape of the markup tool prompts print (``<tools>``)."""
    shapes, seen = [_PIPE_TOKEN], {_PIPE_TOKEN.pattern}
    for t in control_texts:
        if len(t) < 4 or not (t[0] in "<[" and t[-1] in ">]") or len("".join(_WORD.findall(t))) < 3:
            continue
        parts = _WORD.split(t)
        if len(parts) < 2 or any(_WORD.search(p) for p in parts):
            continue
        # not inside a doubled bracket: Llama 2's "<<SYS>>" is not a token shaped like "<unk>"
        pat = r"(?<![<\[])" + r"[A-Za-z0-9_]{2,64}".join(re.escape(p) for p in parts) + r"(?![>\]])"
        if pat not in seen:
            seen.add(pat)
            shapes.append(re.compile(pat))
    return shapes


def printed_tokens(text: str, shapes: list[re.Pattern]) -> list[str]:
    """Token-looking strings in ``text``, in order of first appearance."""
    found: dict[str, int] = {}
    for pat in shapes:
        for m in pat.finditer(text):
            found.setdefault(m.group(0), m.start())
    return sorted(found, key=found.get)


def end_of_turn(rendered: str, specials_by_text: dict[str, int]) -> str | None:
    """The special token the template prints right after an assistant message (its end-of-turn), if any:
    the longest special-token text the rendering continues with after :data:`ASSISTANT_MARK`."""
    at = rendered.find(ASSISTANT_MARK)
    if at < 0:
        return None
    rest = rendered[at + len(ASSISTANT_MARK):].lstrip(" ")
    best = None
    for t in specials_by_text:
        if t and rest.startswith(t) and (best is None or len(t) > len(best)):
            best = t
    return best
