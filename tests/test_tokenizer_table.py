"""Our table of BPE pre-tokenizers against llama.cpp's own, by source and by behaviour.

1. ``llama-vocab.cpp`` (from the llama-cpp-python source distribution of the installed version,
   in the fixture cache) is parsed: the ``tokenizer_pre == "..."`` chain of ``load()`` (name ->
   ``LLAMA_VOCAB_PRE_TYPE_*`` and flags) and ``llm_tokenizer_bpe``'s switch (type -> regexes,
   ``byte_encode``).  Our :data:`PRE_TOKENIZERS` must have exactly its names, and for each the
   same type, flags and regex strings, so the table cannot drift from the llama.cpp we test.
2. The real llama.cpp runtime (llama-cpp-python) tokenizes, for every name, every text of every
   shipped ``.gguf.inp`` file plus a few targeted texts, with a shipped vocabulary whose
   ``tokenizer.ggml.pre`` is rewritten to that name; the tokenizer we rebuild from the same file
   must give the same ids.  Byte-level names use ``ggml-vocab-gpt-2.gguf``; the raw UTF-8 ones
   (``byte_encode = false``) ``ggml-vocab-gemma-4.gguf`` with ``tokenizer.ggml.model`` = ``gpt2``
   (``whitespace``: its own model of that name, as jina-embeddings-v2-base-zh ships it).
"""
from __future__ import annotations

import dataclasses
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from ckpt_surgeon.conversion.tokenizer import (PRE_TOKENIZERS, PRE_TYPE_REGEXES, PreTokenizer,
                                               hf_tokenizer_files, pre_by_name, pre_name_for,
                                               vocab_from_metadata)
from ckpt_surgeon.formats.gguf import read_header
from test_tokenizer_vectors import SEP, llama_vocab_cpp, vocab_dir  # noqa: F401 - session fixtures

# --- 1. the source table ------------------------------------------------------------------

_C_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _c_tokens(src: str) -> list[tuple[str, str]]:
    """("str", decoded literal) / ("code", text) pieces of C++ source, comments dropped and
    adjacent string literals joined, as the compiler sees them."""
    out: list[tuple[str, str]] = []
    code: list[str] = []
    i = 0
    while i < len(src):
        if src.startswith("//", i):
            i = src.find("\n", i) if "\n" in src[i:] else len(src)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif src[i] == "'":                       # a char literal ('\n', '"') is code
            j = src.index("'", i + (3 if src[i + 1] == "\\" else 2))
            code.append(src[i:j + 1])
            i = j + 1
        elif src[i] == '"':
            j, buf = i + 1, []
            while src[j] != '"':
                if src[j] == "\\" and src[j + 1] == "x":
                    hexdigits = re.match(r"[0-9A-Fa-f]+", src[j + 2:]).group()
                    buf.append(chr(int(hexdigits, 16)))
                    j += 2 + len(hexdigits)
                elif src[j] == "\\":
                    buf.append(_C_ESCAPES[src[j + 1]])
                    j += 2
                else:
                    buf.append(src[j])
                    j += 1
            text = "".join(buf)
            if out and out[-1][0] == "str" and not "".join(code).strip():
                out[-1] = ("str", out[-1][1] + text)
            else:
                if code:
                    out.append(("code", "".join(code)))
                out.append(("str", text))
            code = []
            i = j + 1
        else:
            code.append(src[i])
            i += 1
    if code:
        out.append(("code", "".join(code)))
    return out


def llama_cpp_regexes(src: str) -> dict[str, tuple[tuple[str, ...], bool]]:
    """``llm_tokenizer_bpe``'s switch: TYPE -> (regexes, byte_encode)."""
    start = src.index("llm_tokenizer_bpe(const llama_vocab & vocab) {")
    end = src.index("std::vector<std::string> regex_exprs;", start)
    table: dict[str, tuple[tuple[str, ...], bool]] = {}
    labels: list[str] = []
    regexes: list[str] = []
    in_list, byte_encode = False, True
    for kind, text in _c_tokens(src[start:end]):
        if kind == "str":
            if in_list:
                regexes.append(text)
            continue
        for m in re.finditer(r"case LLAMA_VOCAB_PRE_TYPE_(\w+):|default:|regex_exprs = \{|\}|byte_encode = false|break;",
                             text):
            tok = m.group(0)
            if tok.startswith("case"):
                labels.append(m.group(1))
            elif tok == "default:":
                labels.append("DEFAULT")
            elif tok == "regex_exprs = {":
                in_list, regexes = True, []
            elif tok == "}":
                in_list = False
            elif tok == "byte_encode = false":
                byte_encode = False
            elif tok == "break;":
                table.update({label: (tuple(regexes), byte_encode) for label in labels})
                labels, byte_encode = [], True
    table.update({label: (tuple(regexes), byte_encode) for label in labels})   # default: ends the switch
    return table


_FLAG_SETTINGS = {("ignore_merges", "true"): "ignore_merges", ("add_bos", "true"): "add_bos",
                  ("add_sep", "true"): "add_sep", ("escape_whitespaces", "true"): "escape_whitespaces",
                  ("clean_spaces", "false"): "keep_spaces", ("special_bos_id", "LLAMA_TOKEN_NULL"): "no_bos",
                  ("normalizer_opts.lowercase", "false"): "no_lowercase"}


def llama_cpp_names(src: str) -> dict[str, tuple[str, frozenset]]:
    """``load()``'s chain: tokenizer.ggml.pre name -> (TYPE, flags it sets)."""
    start = src.index("if (tokenizer_pre.empty())")
    end = src.index("unknown pre-tokenizer type", start)
    out = {}
    for block in re.split(r"\}\s*else if\s*\(", src[start:end])[1:]:
        typ = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", block).group(1)
        settings = re.findall(r"\b([\w.]+)\s*=\s*(\w+);", block)
        unknown = [s for s in settings if s[0] != "pre_type" and s not in _FLAG_SETTINGS]
        assert not unknown, f"llama-vocab.cpp sets {unknown} for a pre name: the table has no column for it"
        flags = frozenset(_FLAG_SETTINGS[s] for s in settings if s in _FLAG_SETTINGS)
        for name in re.findall(r'tokenizer_pre == "([^"]+)"', block):
            out[name] = (typ, flags)
    return out


def _our_names() -> dict[str, tuple[str, frozenset]]:
    out = {}
    for p in PRE_TOKENIZERS:
        flags = {"ignore_merges": p.ignore_merges, "add_bos": p.add_bos, "add_sep": p.add_sep,
                 "escape_whitespaces": p.escape_whitespaces, "keep_spaces": not p.clean_spaces,
                 "no_bos": p.bos_null, "no_lowercase": not p.lowercase}
        out[p.name] = (p.type, frozenset(k for k, on in flags.items() if on))
    return out


def test_table_is_llama_cpps(llama_vocab_cpp):
    src = llama_vocab_cpp.read_text(encoding="utf-8")
    names = llama_cpp_names(src)
    assert len(names) > 80          # the parser found the chain, not a fragment of it
    assert _our_names() == names
    assert PRE_TYPE_REGEXES == llama_cpp_regexes(src)
    for p in PRE_TOKENIZERS:
        assert (p.regexes, p.byte_encode) == PRE_TYPE_REGEXES[p.type], p.name


def test_table_check_sees_a_change(llama_vocab_cpp):
    """The comparison above fails when llama.cpp adds a name, moves one, or edits a regex."""
    src = llama_vocab_cpp.read_text(encoding="utf-8")
    added = src.replace('tokenizer_pre == "mpt") {', 'tokenizer_pre == "mpt" || tokenizer_pre == "mpt-2") {', 1)
    assert llama_cpp_names(added) != _our_names() and llama_cpp_names(added)["mpt-2"][0] == "MPT"
    flagged = src.replace('pre_type = LLAMA_VOCAB_PRE_TYPE_MPT;', 'pre_type = LLAMA_VOCAB_PRE_TYPE_MPT;\n'
                          '                ignore_merges = true;', 1)
    assert llama_cpp_names(flagged)["mpt"] == ("MPT", frozenset({"ignore_merges"}))
    edited = src.replace('"[0-9][0-9][0-9]",\n                };\n                break;\n            case '
                         'LLAMA_VOCAB_PRE_TYPE_STARCODER', '"[0-9][0-9]",\n                };\n                break;\n'
                         '            case LLAMA_VOCAB_PRE_TYPE_STARCODER', 1)
    assert edited != src and llama_cpp_regexes(edited)["FALCON"][0][-1] == "[0-9][0-9]"


# --- 2. the runtime -----------------------------------------------------------------------

# Texts beyond llama.cpp's own test inputs, aimed at the regex families of the table: digit
# grouping, Han / kana / hangul runs, cased words, combining marks, capital contractions,
# chameleon's image and sentinel tokens, whitespace runs, non-ASCII spaces, code points without
# a Unicode category.
EXTRA_TEXTS = (
    "1234567 and 12345678 and 123abc4567 and ٣٤٥٦٧ and 1,000,000.50",
    "ÖL ÄÖü Straße ſtop it'S it'Ll WE'RE HELLO World mIxEd CamelCase YouTube iPhone JavaScript McDonald",
    "中文字符和日本語のテキスト 한국어 ｶﾀｶﾅ ㄅㄆ 𠀀𠀁 「引用」、句読点。",
    "Hello   world\n\n\t x \u00a0nbsp\u3000ideographic  \r\n end  ",
    "<sentinel:12> IMGIMGABZ IMGIMGABCDEFZ    four  two\ttab",
    "e\u0301te\u0301 नमस्ते สวัสดี ব্যাকরণ",
    "path/to/file.py: x+=1; y=$z^2 | a~b `code` <tag> @user #hash",
    "a" * 40 + " " + "9" * 20 + " " + "\n" * 5 + "!" * 7,
    "it'\u017f ok x \u0378\u0378 y \u0378! a\U000E0001b helloWorld",   # long s, unassigned, tag char
)

# Texts with control-token text in them (gpt-2's, gemma-4's and T5's), tokenized with llama.cpp's
# parse_special: the token, not its spelling.
SPECIAL_TEXTS = ("Hi<|endoftext|>there <|endoftext|>\n", "<bos>x<eos> <start_of_turn>user\n", "x</s>y <pad>")

# name -> texts on which llama.cpp and the rebuilt tokenizer are known to differ (each listed in
# docs/tokenizers.md with the reason); every other name must match on every text.
KNOWN_DIFFERENCES: dict[str, int] = {}

_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _GGUF_FIXED:
        return pos + _GGUF_FIXED[vtype]
    if vtype == _GGUF_STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    assert vtype == _GGUF_ARRAY, vtype
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _GGUF_FIXED:
        return pos + count * _GGUF_FIXED[etype]
    for _ in range(count):
        pos = _skip_value(buf, pos, etype)
    return pos


def _string_kv(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", _GGUF_STRING, len(v)) + v


def with_strings(buf: bytes, values: dict[str, str]) -> bytes:
    """A vocab-only GGUF (no tensors) with string keys replaced, or appended where missing."""
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and n_tensors == 0
    pos, parts, todo = 24, [b""], dict(values)
    for _ in range(n_kv):
        start = pos
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen].decode()
        pos = _skip_value(buf, pos + 12 + klen, struct.unpack_from("<I", buf, pos + 8 + klen)[0])
        parts.append(_string_kv(key, todo.pop(key)) if key in todo else buf[start:pos])
    parts.extend(_string_kv(k, v) for k, v in todo.items())
    parts[0] = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + len(todo))
    return b"".join(parts) + buf[pos:]


# llama.cpp in a child process: an abort there (GGML_ASSERT) must fail the test, not kill pytest.
_LLAMA_CPP_CHILD = r"""
import json, sys
import llama_cpp
llama_cpp.llama_backend_init()
SPECIAL_TEXTS = %r
jobs = json.load(sys.stdin)
out = {}
def tokenize(vocab, text, add_special, parse_special=False):
    b = text.encode()
    buf = (llama_cpp.llama_token * (len(b) + 8))()
    n = llama_cpp.llama_tokenize(vocab, b, len(b), buf, len(buf), add_special, parse_special)
    assert n >= 0, (text, n)
    return list(buf[:n])
for name, path in jobs["files"].items():
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        out[name] = None
        continue
    vocab = llama_cpp.llama_model_get_vocab(model)
    out[name] = {"plain": [tokenize(vocab, t, False) for t in jobs["texts"]],
                 "special": tokenize(vocab, jobs["texts"][0], True),
                 "parsed": [tokenize(vocab, t, False, True) for t in SPECIAL_TEXTS]}
    llama_cpp.llama_model_free(model)
json.dump(out, sys.stdout)
"""


class LlamaCppRun:
    """llama.cpp tokenizing ``texts`` with each of ``files`` in a child process (started at once,
    so the caller's own work overlaps it).  ``result()``: name -> {"plain": ids per text without
    special tokens, "special": ids of texts[0] with them, "parsed": ids of SPECIAL_TEXTS with
    special-token text read as those tokens}, None where llama.cpp refused the file."""

    def __init__(self, files: dict[str, Path], texts: list[str], log: Path):
        self.log = log
        with open(log, "w") as err:    # a file: llama.cpp's chatter must not fill a pipe nobody reads yet
            self.child = subprocess.Popen([sys.executable, "-c", _LLAMA_CPP_CHILD % (SPECIAL_TEXTS,)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=err, text=True)
        self.child.stdin.write(json.dumps({"files": {n: str(f) for n, f in files.items()}, "texts": texts}))
        self.child.stdin.close()

    def result(self) -> dict:
        out = self.child.stdout.read()
        assert self.child.wait() == 0, f"llama.cpp failed: {self.log.read_text(errors='replace')[-2000:]}"
        return json.loads(out)


def all_test_texts(vocab_dir: Path) -> list[str]:
    """Every text of every shipped .gguf.inp, plus EXTRA_TEXTS."""
    texts = set(EXTRA_TEXTS)
    for inp in vocab_dir.glob("*.gguf.inp"):
        texts.update(inp.read_text(encoding="utf-8").split(SEP))
    return sorted(texts)


def _base_file(p) -> tuple[str, dict[str, str]]:
    if p.byte_encode:
        return "gpt-2", {"tokenizer.ggml.pre": p.name}
    return "gemma-4", {"tokenizer.ggml.pre": p.name,
                       "tokenizer.ggml.model": "whitespace" if p.name == "whitespace" else "gpt2"}


def test_every_pre_name_tokenizes_like_llama_cpp(vocab_dir, tmp_path_factory):
    texts = all_test_texts(vocab_dir)
    assert len(texts) > 50
    tmp = tmp_path_factory.mktemp("pre-names")
    bases = {b: (vocab_dir / f"ggml-vocab-{b}.gguf").read_bytes() for b in ("gpt-2", "gemma-4")}
    files = {}
    for p in PRE_TOKENIZERS:
        base, values = _base_file(p)
        files[p.name] = tmp / f"{p.name}.gguf"
        files[p.name].write_bytes(with_strings(bases[base], values))
    child = LlamaCppRun(files, texts, tmp / "llama-cpp.log")

    # Ours, while llama.cpp runs: each base file read once, the name set in its vocabulary as
    # in the rewritten file.  Names whose table rows are equal but for the name rebuild the
    # same tokenizer (the name is only looked up), so each distinct row is built once.
    vocabs = {b: vocab_from_metadata(read_header(vocab_dir / f"ggml-vocab-{b}.gguf").metadata) for b in bases}
    ours: dict[str, tuple] = {}
    built: dict[PreTokenizer, tuple] = {}
    for p in PRE_TOKENIZERS:
        row = dataclasses.replace(p, name="")
        if row not in built:
            base, values = _base_file(p)
            vocab = dataclasses.replace(vocabs[base], pre=values["tokenizer.ggml.pre"],
                                        model=values.get("tokenizer.ggml.model", vocabs[base].model))
            rebuilt = hf_tokenizer_files(vocab, path=str(files[p.name]))
            assert rebuilt.warnings == (), (p.name, rebuilt.warnings)
            tok = Tokenizer.from_str(rebuilt.tokenizer_json)
            built[row] = ([tok.encode(t, add_special_tokens=False).ids for t in texts], tok.encode(texts[0]).ids,
                          [tok.encode(t, add_special_tokens=False).ids for t in SPECIAL_TEXTS])
        ours[p.name] = built[row]
    theirs = child.result()

    report, differ = {}, {}
    for p in PRE_TOKENIZERS:
        assert theirs[p.name] is not None, f"llama.cpp did not load {files[p.name]}"
        plain, special, parsed = ours[p.name]
        bad = [t for t, a, b in zip(texts, theirs[p.name]["plain"], plain) if a != b]
        report[p.name] = len(texts) - len(bad)
        if bad:
            differ[p.name] = [t[:40] for t in bad]
        # with add_special: BOS where llama.cpp adds one (add_bos defaults per name)
        assert theirs[p.name]["special"] == special, (p.name, theirs[p.name]["special"][:3], special[:3])
        # control-token text read as the token (llama.cpp parse_special; tokenizers' added tokens)
        assert theirs[p.name]["parsed"] == parsed, p.name
    expected = {p.name: len(texts) - KNOWN_DIFFERENCES.get(p.name, 0) for p in PRE_TOKENIZERS}
    assert report == expected, f"texts that differ from llama.cpp: {differ}"


# --- HF -> GGUF: the name a tokenizer.json pre-tokenizer gets --------------------------------

def test_every_rebuilt_pre_tokenizer_maps_back_to_a_name_that_splits_alike():
    for p in PRE_TOKENIZERS:
        if not p.byte_encode:
            continue          # raw UTF-8 types: their tokenizer.json is refused HF -> GGUF
        name = pre_name_for(p.pre_tokenizer, ignore_merges=p.ignore_merges)
        back = pre_by_name(name)
        assert (back.regexes, back.ignore_merges) == (p.regexes, p.ignore_merges), (p.name, name)


def test_tokenizer_json_originals_are_recognised():
    """The spellings models ship (tokenizer.json's case-insensitive contractions, GPT-2's
    ByteLevel regex, SmolLM's Digits) get the names convert_hf_to_gguf.py gives them."""
    def split(regex):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    contractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    llama3 = contractions + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    qwen2 = llama3.replace(r"\p{N}{1,3}", r"\p{N}")
    assert pre_name_for(split(llama3), ignore_merges=True) == "llama-bpe"
    assert pre_name_for(split(llama3), ignore_merges=False) == "dbrx"       # same split, no ignore_merges
    assert pre_name_for(split(qwen2), ignore_merges=False) == "qwen2"
    assert pre_name_for({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True}) == "gpt-2"
    assert pre_name_for({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}) == "smollm"
    assert pre_name_for(split(r"\p{L}+")) is None


def test_whole_tokenizer_json_names_wordpiece_default_and_bpe_by_its_split(llama_vocab_cpp):
    """A WordPiece vocabulary is written as llama.cpp's ``bert`` (WPM) one, which has no pre-tokenizer ("only BPE
    models have pre-tokenizers", llama-vocab.cpp): named ``default`` whatever its split; a BPE one by its split and
    its model's ignore_merges, as :func:`pre_name_for`."""
    from ckpt_surgeon.conversion.tokenizer import pre_name_for_json
    bert = {"model": {"type": "WordPiece"}, "pre_tokenizer": {"type": "BertPreTokenizer"}}
    assert pre_name_for(bert["pre_tokenizer"]) is None and pre_name_for_json(bert) == "default"
    gpt2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    assert pre_name_for_json({"model": {"type": "BPE"}, "pre_tokenizer": gpt2}) == "gpt-2"
    assert pre_name_for_json({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "BertPreTokenizer"}}) is None
    src = llama_vocab_cpp.read_text()
    wpm = src.index("only BPE models have pre-tokenizers")
    assert src[wpm:wpm + 200].split("\n")[1].strip() == "if (type == LLAMA_VOCAB_TYPE_BPE) {", src[wpm:wpm + 200]


# --- tokenizer.ggml.add_sep_token: decided as gguf-py decides it (issue 24) -----------------------

_S = lambda t: {"SpecialToken": {"id": t, "type_id": 0}}      # noqa: E731
_Q = lambda s: {"Sequence": {"id": s, "type_id": 0}}          # noqa: E731


@pytest.mark.parametrize("post, tcfg", [
    # llama / mistral / mixtral: <s> A, pair <s> A <s> B -> the converter writes add_sep_token = false
    ({"type": "TemplateProcessing", "single": [_S("<s>"), _Q("A")], "pair": [_S("<s>"), _Q("A"), _S("<s>"), _Q("B")]},
     {"bos_token": "<s>", "eos_token": "</s>"}),
    # a separator between the sequences: true
    ({"type": "TemplateProcessing", "single": [_S("<s>"), _Q("A")], "pair": [_S("<s>"), _Q("A"), _S("</s>"), _Q("B")]},
     {"bos_token": "<s>", "eos_token": "</s>"}),
    # BERT-style [CLS] A [SEP], pair [CLS] A [SEP] B [SEP]: the trailing special is the eos; none in between
    ({"type": "TemplateProcessing", "single": [_S("[CLS]"), _Q("A"), _S("[SEP]")],
      "pair": [_S("[CLS]"), _Q("A"), _S("[SEP]"), _Q("B"), _S("[SEP]")]},
     {"cls_token": "[CLS]", "sep_token": "[SEP]"}),
    ({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}, {"bos_token": "<s>", "eos_token": "</s>"}),
    ({"type": "ByteLevel"}, {"add_sep_token": True}),       # no template: tokenizer_config's flag
    ({"type": "ByteLevel"}, {}),                             # nothing: no key at all
])
def test_add_sep_token_as_gguf_py_decides(tmp_path, post, tcfg):
    """Our value (None: no key) against gguf-py's SpecialVocab, which llama.cpp's converter uses."""
    import gguf

    from ckpt_surgeon.conversion.tokenizer.specials import adds_sep, token_content
    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "[CLS]", "[SEP]", "a", "b"])}
    tj = {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True} for t, i in vocab.items()
                                             if not t.isalpha()],
          "post_processor": post, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    ref = gguf.SpecialVocab(tmp_path, load_merges=False, n_vocab=len(vocab)).add_special_token.get("sep")
    assert adds_sep(tj, tcfg, token_content(tcfg.get("sep_token")), token_content(tcfg.get("eos_token"))) == ref
