"""The other half of a model (issue 48): tokenizer and chat template, read from every format, compared by
``diff`` and checked by ``lint``.

Planted defects: each one changes exactly one thing in a copy of the tiny Qwen2 fixture (ChatML specials,
its chat template) or in our GGUF of it, and is compared with the untouched other side, across formats
(HF copy against the GGUF, GGUF copy against the HF folder).  ``diff`` must exit 1 and name the part;
the defects visible in one file are also ``lint`` findings.  The untouched pair shows no difference
(the false-alarm side), as do the real SmolLM2 GGUF and its conversion.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_util import _run as run_cli
from ckpt_surgeon.analysis.diff import diff
from ckpt_surgeon.analysis.lint import lint
from ckpt_surgeon.analysis.tokenizer import compare_tokenizers, tokenizer
from ckpt_surgeon.conversion import gguf_to_hf, hf_to_gguf
from gguf_util import rewrite_gguf
from hubenv import hub  # noqa: F401  (the local Hub fixture)


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny Qwen2 HF folder, our GGUF of it)."""
    src = tiny("qwen2")
    return src, hf_to_gguf(src, tmp_path_factory.mktemp("tokpair") / "q.gguf", dtype="f32", name="tiny")


def _edit_json(path: Path, fn) -> None:
    obj = json.loads(path.read_text(encoding="utf-8"))
    fn(obj)
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")


def _swap_ids(d: Path) -> None:
    def swap(tj):
        v = tj["model"]["vocab"]
        a, b = (next(t for t, i in v.items() if i == k) for k in (300, 301))
        v[a], v[b] = 301, 300
    _edit_json(d / "tokenizer.json", swap)


def _template(d: Path, fn) -> None:
    p = d / "chat_template.jinja"
    p.write_text(fn(p.read_text(encoding="utf-8")), encoding="utf-8")


def _made_special(d: Path) -> None:
    """An ordinary token of the vocabulary added again as a special token (transformers and llama.cpp's converter
    then treat it as control text: never split, skipped when decoding)."""
    def add(tj):
        text = next(t for t, i in tj["model"]["vocab"].items() if i == 250)
        tj["added_tokens"].append({"id": 250, "content": text, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    _edit_json(d / "tokenizer.json", add)


def _eos(d: Path, text: str, tid: int) -> None:
    _edit_json(d / "tokenizer_config.json", lambda c: c.__setitem__("eos_token", text))
    _edit_json(d / "generation_config.json", lambda c: c.__setitem__("eos_token_id", tid))


def _ordinary_eos(d: Path) -> None:
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    text, tid = next((t, i) for t, i in tj["model"]["vocab"].items() if i == 200)
    _eos(d, text, tid)


def _double_bos(d: Path) -> None:
    _edit_json(d / "tokenizer_config.json", lambda c: c.__setitem__("add_bos_token", True))
    _template(d, lambda t: "{{ bos_token }}" + t)


# name -> (how the HF copy is changed, diff parts it must name, lint check ids it must raise)
HF_DEFECTS = {
    "two-ids-swapped": (_swap_ids, {"vocab"}, set()),
    "im_start-renamed": (lambda d: _template(d, lambda t: t.replace("<|im_start|>", "<|im_begin|>")),
                         {"chat_template"}, {"template-tokens"}),
    "eos-changed": (lambda d: _eos(d, "<|endoftext|>", 0), {"special_ids"}, {"end-of-turn"}),
    # transformers makes a token it is told is eos a special one: the token's type differs from the GGUF's too
    "eos-an-ordinary-token": (_ordinary_eos, {"token_types", "special_ids", "eog"}, {"special-ids", "end-of-turn"}),
    "add-bos-on": (lambda d: _edit_json(d / "tokenizer_config.json", lambda c: c.__setitem__("add_bos_token", True)),
                   {"add_flags"}, set()),
    "bos-twice": (_double_bos, {"add_flags", "chat_template"}, {"double-bos"}),
    "merge-dropped": (lambda d: _edit_json(d / "tokenizer.json", lambda tj: tj["model"]["merges"].pop(10)),
                      {"merges"}, set()),
    "template-removed": (lambda d: (d / "chat_template.jinja").unlink(), {"chat_template"}, {"missing-template"}),
    "template-unparsable": (lambda d: _template(d, lambda t: t + "{% if %}"), {"chat_template"}, {"template-parse"}),
    "ordinary-token-made-special": (_made_special, {"token_types"}, set()),
}

def _renamed_token(path: Path):
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(path) as ck:
        toks = list(ck.metadata["tokenizer.ggml.tokens"])
    toks[250] = toks[250] + "x"
    return {"tokenizer.ggml.tokens": (toks, None)}


# name -> (rewrite kwargs of tests/gguf_util.rewrite_gguf, or a function of the file giving set_kv), parts, lint
GGUF_DEFECTS = {
    "gguf-template-removed": ({"drop": ("tokenizer.chat_template",)}, {"chat_template"}, {"missing-template"}),
    "gguf-pre-removed": ({"drop": ("tokenizer.ggml.pre",)}, {"pre_tokenizer"}, {"pre-tokenizer"}),
    "gguf-other-pre": ({"set_kv": {"tokenizer.ggml.pre": ("gpt-2", None)}}, {"pre_tokenizer"}, set()),
    "gguf-unknown-pre": ({"set_kv": {"tokenizer.ggml.pre": ("not-a-tokenizer", None)}}, {"pre_tokenizer"},
                         {"pre-tokenizer"}),
    "gguf-eos-changed": ({"set_kv": {"tokenizer.ggml.eos_token_id": (0, None)}}, {"special_ids"}, set()),
    "gguf-eos-removed": ({"drop": ("tokenizer.ggml.eos_token_id",)}, {"special_ids", "eog"}, {"special-ids"}),
    "gguf-add-bos-on": ({"set_kv": {"tokenizer.ggml.add_bos_token": (True, None)}}, {"add_flags"}, set()),
    "gguf-token-renamed": (_renamed_token, {"vocab"}, set()),
}


def _hf_copy(src: Path, dst: Path, fn) -> Path:
    shutil.copytree(src, dst)
    fn(dst)
    return dst


def _gguf_copy(g: Path, dst: Path, how) -> Path:
    """A rewritten copy; ``set_kv`` values are (value, type): the type is the file's own for a key it has."""
    return rewrite_gguf(g, dst, **({"set_kv": how(g)} if callable(how) else how))


def test_the_untouched_pair_shows_no_tokenizer_difference(pair):
    src, g = pair
    d = compare_tokenizers(tokenizer(src), tokenizer(g))
    assert d.same, d.to_dict()
    rep = diff(src, g)
    assert rep.tokenizer.same and "tokenizer" not in rep.verdict_line
    assert not [f for f in lint(g).findings if f.check in _TOKENIZER_IDS]
    assert not [f for f in lint(src).findings if f.check in _TOKENIZER_IDS]


_TOKENIZER_IDS = {"template-parse", "template-tokens", "double-bos", "end-of-turn", "special-ids", "pre-tokenizer",
                  "missing-template", "template-sources"}


@pytest.mark.parametrize("name", list(HF_DEFECTS))
def test_a_planted_hf_defect_is_named_by_diff_and_lint(name, pair, tmp_path):
    src, g = pair
    fn, parts, checks = HF_DEFECTS[name]
    bad = _hf_copy(src, tmp_path / name, fn)
    rep = diff(g, bad)
    assert not rep.identical and set(rep.tokenizer.differs) == parts, rep.tokenizer.to_dict()
    assert rep.tokenizer.line in rep.verdict_line
    found = {f.check for f in lint(bad).findings if f.check in _TOKENIZER_IDS}
    assert found == checks, [f.message for f in lint(bad).findings]


@pytest.mark.parametrize("name", list(GGUF_DEFECTS))
def test_a_planted_gguf_defect_is_named_by_diff_and_lint(name, pair, tmp_path):
    src, g = pair
    how, parts, checks = GGUF_DEFECTS[name]
    bad = _gguf_copy(g, tmp_path / f"{name}.gguf", how)
    rep = diff(src, bad)
    assert not rep.identical and set(rep.tokenizer.differs) == parts, rep.tokenizer.to_dict()
    found = {f.check for f in lint(bad).findings if f.check in _TOKENIZER_IDS}
    assert found == checks, [f.message for f in lint(bad).findings]


def test_diff_cli_names_the_tokenizer_and_exits_1(pair, tmp_path):
    """Identical weights, one template token renamed: the verdict says so, exit 1; the JSON keys are stable."""
    src, _ = pair
    bad = _hf_copy(src, tmp_path / "bad", HF_DEFECTS["im_start-renamed"][0])
    r = run_cli("diff", str(src), str(bad))
    assert r.exit_code == 1
    assert "identical weights; tokenizer differs: chat template" in r.output
    assert "+...essage in messages %}{{ '<|im_begin|>' + message" in r.output     # the changed span, with context
    r = run_cli("diff", str(src), str(bad), "--format", "json")
    got = json.loads(r.stdout)
    assert got["verdict"] == "tokenizer_differs" and got["tokenizer"]["differs"] == ["chat_template"]
    assert set(got["tokenizer"]) >= {"same", "differs", "line", "vocab", "special_ids", "eog", "chat_template",
                                     "pre_tokenizer", "notes"}
    assert "<|im_begin|>" in got["tokenizer"]["chat_template"]["diff"]
    same = json.loads(run_cli("diff", str(src), str(src), "--format", "json").stdout)
    assert same["verdict"] == "identical" and same["tokenizer"]["same"] is True


def test_the_real_smollm2_gguf_and_its_conversion_agree(smollm_gguf, tmp_path):
    """The real SmolLM2 GGUF (llama.cpp's converter wrote it) against our HF conversion of it, and back."""
    hf = gguf_to_hf(smollm_gguf, tmp_path / "hf")
    a, b = tokenizer(smollm_gguf), tokenizer(hf)
    d = compare_tokenizers(a, b)
    assert d.same, d.to_dict()
    assert a.eog == (0, 2, 4) and a.llama.ids["eos"] == 2          # llama.cpp's own answer (test_tokenizer_specials)
    assert not [f for f in lint(hf).findings if f.check in _TOKENIZER_IDS]
    assert not [f for f in lint(smollm_gguf).findings if f.check in _TOKENIZER_IDS]


def test_minilm_has_no_tokenizer_finding(minilm_dir):
    rec = tokenizer(minilm_dir)
    assert rec.kind == "bert" and rec.size == 30522 and not rec.templates
    assert not [f for f in lint(minilm_dir).findings if f.check in _TOKENIZER_IDS]


def test_named_templates_are_read_from_both_formats(pair, tmp_path):
    """transformers' additional_chat_templates/*.jinja and the GGUF's tokenizer.chat_template.<name>."""
    src, g = pair
    hf = _hf_copy(src, tmp_path / "named", lambda d: ((d / "additional_chat_templates").mkdir(),
                                                      (d / "additional_chat_templates" / "tool_use.jinja")
                                                      .write_text("{{ messages[0]['content'] }}")))
    assert list(tokenizer(hf).templates) == ["default", "tool_use"]
    rep = diff(g, hf)
    assert "named_templates" in rep.tokenizer.differs
    import gguf
    named = rewrite_gguf(g, tmp_path / "named.gguf", set_kv={
        "tokenizer.chat_template.tool_use": ("{{ messages[0]['content'] }}", gguf.GGUFValueType.STRING)})
    assert list(tokenizer(named).templates) == ["default", "tool_use"]
    assert compare_tokenizers(tokenizer(named), tokenizer(hf)).same


def test_inspect_shows_a_short_tokenizer_section_and_json_has_the_record(pair, smollm_gguf):
    src, g = pair
    r = run_cli("inspect", str(smollm_gguf))
    assert r.exit_code == 0, r.output
    assert "gpt2, 49,152 tokens, pre-tokenizer smollm" in r.output
    assert "eos 2 '<|im_end|>'" in r.output and "0 '<|endoftext|>', 2 '<|im_end|>', 4 '<reponame>'" in r.output
    assert "default (llama.cpp renders it as its built-in 'chatml')" in r.output
    rec = json.loads(run_cli("inspect", str(g), "--format", "json").stdout)["tokenizer"]
    assert rec["format"] == "gguf" and rec["kind"] == "gpt2" and rec["pre"] == "qwen2"
    assert rec["vocab"][2] == {"id": 2, "text": "<|im_end|>", "type": "control"}
    assert rec["templates"]["default"] == (src / "chat_template.jinja").read_text()
    hf = json.loads(run_cli("inspect", str(src), "--format", "json").stdout)["tokenizer"]
    assert hf["format"] == "hf" and hf["template_sources"] == {"default": "chat_template.jinja"}
    assert hf["generation_eos"] == [2] and hf["summary"]["template_family"] == "chatml"


def test_a_hub_repo_tokenizer_is_read_by_http_as_the_local_folder(hub, pair):
    """Hub repos: the tokenizer files are fetched (whole, through the range cache) from the local Hub server."""
    src, g = pair
    hub.add_repo("owner/tiny", src)
    remote, local = tokenizer("owner/tiny"), tokenizer(src)
    assert remote.format == "hf" and remote.tokens == local.tokens and remote.templates == local.templates
    assert remote.special_ids == local.special_ids and remote.generation_eos == local.generation_eos
    assert compare_tokenizers(remote, tokenizer(g)).same
    rep = json.loads(run_cli("inspect", "owner/tiny", "--format", "json").stdout)
    assert rep["tokenizer"] is None and "not read from the Hub by inspect" in rep["tokenizer_note"]


def test_convert_keeps_named_templates_both_ways(pair, tmp_path):
    """HF with additional_chat_templates/ -> GGUF (tokenizer.chat_template.<name> + tokenizer.chat_templates, as
    gguf-py writes them) -> HF (chat_template.jinja + additional_chat_templates/, which transformers reads)."""
    src, _ = pair
    hf = _hf_copy(src, tmp_path / "named", lambda d: ((d / "additional_chat_templates").mkdir(),
                                                      (d / "additional_chat_templates" / "tool_use.jinja")
                                                      .write_text("{{ messages[0]['content'] }}")))
    g = hf_to_gguf(hf, tmp_path / "named.gguf", dtype="f32", name="tiny")
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(g) as ck:
        assert ck.metadata["tokenizer.chat_template.tool_use"] == "{{ messages[0]['content'] }}"
        assert list(ck.metadata["tokenizer.chat_templates"]) == ["tool_use"]
    back = gguf_to_hf(g, tmp_path / "back")
    assert (back / "additional_chat_templates" / "tool_use.jinja").read_text() == "{{ messages[0]['content'] }}"
    for x, y in ((hf, g), (g, back), (hf, back)):
        d = compare_tokenizers(tokenizer(x), tokenizer(y))
        assert d.same, (x, y, d.to_dict())
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(back)
    assert set(tok.chat_template) == {"default", "tool_use"}


def test_the_real_gemma3_gguf_has_no_finding_and_its_tokenizer_comes_back(gemma3_gguf, tmp_path):
    """google/gemma-3-270m (base: no chat template; its vocabulary holds Gemma's turn tokens, its eos is <eos>):
    no lint finding; its tokenizer converted to HF files and read back is the same tokenizer (SentencePiece scores
    compared as the merge order they give; the unk token's typing a note)."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.conversion.from_gguf import write_hf_tokenizer
    assert not [f for f in lint(gemma3_gguf).findings], [f.message for f in lint(gemma3_gguf).findings]
    rec = tokenizer(gemma3_gguf)
    assert rec.kind == "llama" and rec.size == 262144 and not rec.templates
    assert rec.llama.ids["eos"] == 1 and rec.llama.ids["eot"] == 106 and rec.llama.add_bos
    with open_checkpoint(gemma3_gguf) as ck:
        assert write_hf_tokenizer(ck, {"max_position_embeddings": 32768}, tmp_path)
    d = compare_tokenizers(rec, tokenizer(tmp_path))
    assert d.same, d.to_dict()
    assert any("unk token" in n for n in d.notes)


# Where a llama.cpp test vocabulary and its HF conversion really differ, and why (each checked by name below).
VOCAB_ROUND_TRIP_DIFFERS = {
    # ggml-vocab-bert-bge.gguf was written by an older llama.cpp converter, without an eos key; converting its HF
    # files today, llama.cpp's converter (gguf-py's SpecialVocab) writes the sep token as eos, which is then EOG
    "bert-bge": {"special_ids", "eog"},
    # an HF tokenizer of llama.cpp's raw-UTF-8 'gemma4' kind is read in llama.cpp's terms as our HF -> GGUF
    # converter would write it, which knows only 'gpt2' and 'llama' vocabularies (docs/tokenizers.md)
    "gemma-4": {"kind", "merges", "scores", "pre_tokenizer"},
}


def test_llamacpps_test_vocabularies_come_back_through_hf_files(tmp_path):
    """Every ggml-vocab-*.gguf llama.cpp ships, converted to HF tokenizer files and read back, is the same tokenizer:
    DeepSeek's non-ASCII control tokens keep their ids, Phi-3's turn tokens strip the whitespace after them as
    llama.cpp does, padding rows are padding, scores made from merge ranks order the merges as the GGUF's do."""
    from ckpt_surgeon.checkpoint import open_checkpoint
    from ckpt_surgeon.conversion.from_gguf import write_hf_tokenizer
    from llamacpp_src import llamacpp_source
    files = sorted((llamacpp_source() / "models").glob("ggml-vocab-*.gguf"))
    assert len(files) >= 18
    for g in files:
        name = g.name.removeprefix("ggml-vocab-").removesuffix(".gguf")
        out = tmp_path / name
        out.mkdir()
        with open_checkpoint(g) as ck:
            assert write_hf_tokenizer(ck, {}, out)
        d = compare_tokenizers(tokenizer(g), tokenizer(out))
        assert set(d.differs) == VOCAB_ROUND_TRIP_DIFFERS.get(name, set()), (name, d.to_dict())
