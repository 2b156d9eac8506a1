"""One side of verify's tokenizer section (:mod:`.tokenizer_check`): where its own tokenizer is, what
it holds, and how it encodes and renders.

An HF side is its folder's tokenizer loaded by transformers (``AutoTokenizer``), its templates the
tokenizer's ``chat_template`` (a string, or named templates); a GGUF side is the file's metadata
read by our validated header reader (``tokenizer.ggml.*``, ``tokenizer.chat_template`` and its named
variants ``tokenizer.chat_template.<name>``), encoded by llama.cpp itself (:mod:`.llama_vocab`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .tokenizer_texts import TOOLS

__all__ = ["Side", "resolve", "load_side", "render_jinja", "encode_hf", "Unnormalized", "takes_tools"]

_LLAMA_CONTROL = 3       # llama_token_type LLAMA_TOKEN_TYPE_CONTROL (llama.h), as gguf-py's TokenType.CONTROL


@dataclass
class Side:
    """A side's own tokenizer, loaded (:func:`load_side`)."""

    role: str                     # reference | candidate
    given: str
    kind: str                     # hf | gguf
    path: str                     # the HF folder, or the .gguf file
    tok: object = None            # transformers tokenizer (hf)
    templates: dict = field(default_factory=dict)    # name ("default" for the unnamed one) -> text
    specials: list = field(default_factory=list)     # special token strings, the named ones first
    bos: str | None = None        # bos / eos token texts: what a template sees as bos_token / eos_token
    eos: str | None = None
    eos_id: int | None = None
    llama: dict = field(default_factory=dict)        # the llama.cpp child's answer (gguf)

    @property
    def encoder(self) -> str:
        return "llama.cpp" if self.kind == "gguf" else "transformers"


def resolve(given: str, role: str, revision: str | None, progress) -> tuple[str, str] | str:
    """(kind, path) of a side's own tokenizer, or a sentence saying why it has none.  A Hub repo id is
    downloaded into the Hugging Face cache as verify downloads it (the same copy is loaded later)."""
    p = Path(given)
    if not p.exists():
        from ..checkpoint import is_hub_source
        if not is_hub_source(given):
            return f"the {role} {given} does not exist"
        from ..formats.hub.snapshot import download
        p = download(given, revision=revision, progress=progress)
    if p.is_file():
        from ..formats.magic import kind_of_bytes
        with open(p, "rb") as f:
            head = f.read(64)
        if kind_of_bytes(head, p.stat().st_size) == "gguf":
            return "gguf", str(p)
        p = p.parent                    # a single .safetensors file: the tokenizer files beside it
    from ..runtime import has_tokenizer
    if has_tokenizer(p):
        return "hf", str(p)
    return f"the {role} has no tokenizer files of its own"


def load_side(role: str, given: str, kind: str, path: str) -> Side | str:
    """The side loaded, or a sentence saying why it has no tokenizer after all (a GGUF without
    ``tokenizer.ggml.*``).  An HF tokenizer that cannot be loaded is a ConfigError (one line)."""
    side = Side(role, given, kind, path)
    if kind == "gguf":
        return _load_gguf(side) or side
    _load_hf(side)
    return side


def _load_hf(side: Side) -> None:
    from ..runtime import load_tokenizer
    tok = load_tokenizer(side.path, path=side.given, why="the tokenizer section cannot load the tokenizer")
    side.tok = tok
    tmpl = getattr(tok, "chat_template", None)
    if isinstance(tmpl, dict):
        side.templates = {str(k): v for k, v in tmpl.items() if isinstance(v, str)}
    elif isinstance(tmpl, str):
        side.templates = {"default": tmpl}
    side.bos, side.eos, side.eos_id = tok.bos_token, tok.eos_token, tok.eos_token_id
    named = [t for t in (tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token) if t]
    added = [t.content for _, t in sorted(tok.added_tokens_decoder.items()) if t.special]
    side.specials = list(dict.fromkeys(named + list(tok.all_special_tokens) + added))


def _load_gguf(side: Side) -> str | None:
    from ..formats.gguf import read_header, split_part_names
    header = read_header(side.path)
    parts = split_part_names(Path(side.path).name, header)
    if parts and Path(side.path).name != parts[0]:
        # a later part of a split set: part 1 holds the metadata, and llama.cpp is given part 1 (llama_split_prefix)
        side.path = str(Path(side.path).with_name(parts[0]))
        header = read_header(side.path)
    md = header.metadata
    tokens = md.get("tokenizer.ggml.tokens")
    if md.get("tokenizer.ggml.model") in (None, "none") or not tokens:
        return f"the {side.role} GGUF has no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens)"
    prefix = "tokenizer.chat_template"
    side.templates = {("default" if k == prefix else k[len(prefix) + 1:]): v for k, v in md.items()
                      if (k == prefix or k.startswith(prefix + ".")) and isinstance(v, str)}

    def text(key):
        i = md.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    side.bos, side.eos = text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id")
    side.eos_id = md.get("tokenizer.ggml.eos_token_id") if side.eos is not None else None
    named = [text(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "eom", "unknown", "padding")]
    types = md.get("tokenizer.ggml.token_type") or ()
    control = [tokens[i] for i, t in enumerate(types) if t == _LLAMA_CONTROL]
    side.specials = list(dict.fromkeys(t for t in named + control if t))
    return None


def takes_tools(template: str) -> bool:
    """Whether a template reads the tools (or tool calls) it is given."""
    return "tools" in template or "tool_calls" in template


def render_jinja(side: Side, name: str, conv, add_generation_prompt: bool) -> str:
    """One conversation through jinja: transformers' ``apply_chat_template`` (an HF side) or
    transformers' renderer of a template string with the GGUF's bos / eos token texts (a GGUF side,
    the two variables llama.cpp's ``--jinja`` gives a template: ``common_chat_templates_init``).  An
    exception is the outcome ``"error: <type>: <message>"``: a template may refuse a conversation on
    purpose (``raise_exception``), and both sides refusing alike is agreement."""
    messages = [dict(m) for m in conv.messages]
    tools = list(TOOLS) if conv.tools else None
    try:
        if side.kind == "hf":
            from ..runtime import quiet_transformers
            with quiet_transformers():
                return side.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                    chat_template=None if name == "default" else name,
                                                    add_generation_prompt=add_generation_prompt)
        from transformers.utils.chat_template_utils import render_jinja_template
        out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=side.templates[name],
                                       add_generation_prompt=add_generation_prompt,
                                       bos_token=side.bos or "", eos_token=side.eos or "")
        return out[0]
    except Exception as e:       # noqa: BLE001 -- a template raises anything (TemplateError, TypeError, ...)
        return f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def encode_hf(side: Side, texts, modes) -> list[list[list[int]]]:
    """Each text's ids per mode (``(add_special, _)``) by transformers: special tokens written in the
    text are matched as tokens, as llama.cpp does with ``parse_special``."""
    from ..runtime import quiet_transformers
    with quiet_transformers():
        return [[list(side.tok(t, add_special_tokens=add)["input_ids"]) for add, _ in modes] for t in texts]



class Unnormalized:
    """An HF side's tokenizer without its normalizer (tokenizers' ``Tokenizer`` rebuilt from the fast
    tokenizer's JSON, ``normalizer`` removed), or ``None`` from :meth:`of` where the tokenizer has no
    normalizer to remove.  llama.cpp applies no normalizer to a BPE vocabulary (src/llama-vocab.cpp
    normalizes only WPM input, to NFD), so an NFC-normalizing HF tokenizer (Qwen2's) and its GGUF part
    ways exactly on text that NFC changes: :meth:`explains` tells such a difference from any other."""

    def __init__(self, side: Side, with_norm, without):
        self.side, self._with, self._without = side, with_norm, without
        self.name = type(with_norm.normalizer).__name__

    @classmethod
    def of(cls, side: Side):
        backend = getattr(side.tok, "backend_tokenizer", None)
        if backend is None or backend.normalizer is None:
            return None
        from tokenizers import Tokenizer
        with_norm, without = Tokenizer.from_str(backend.to_str()), Tokenizer.from_str(backend.to_str())
        without.normalizer = None
        return cls(side, with_norm, without)

    def explains(self, text: str, add_special: bool, hf_ids, other_ids) -> bool:
        """Whether ``other_ids`` are exactly what this tokenizer gives ``text`` without its normalizer,
        while with it, it gives ``hf_ids`` (what transformers gave: the rebuilt tokenizer is that one)."""
        return (list(self._with.encode(text, add_special_tokens=add_special).ids) == list(hf_ids)
                and list(self._without.encode(text, add_special_tokens=add_special).ids) == list(other_ids))
