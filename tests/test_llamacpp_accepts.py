"""Outputs meant for llama.cpp that it would refuse are refused here first, in one line, exit 2,
nothing written (issue 36 item 5's class: an output its consumer rejects while we exit 0).

* ``convert`` HF -> GGUF with a ``general.name`` containing "phi3" / "phi-3" (by default the
  source folder's name): llama.cpp then looks up Phi-3's <s>, </s>, <unk>, <|endoftext|> by name
  (llama-vocab.cpp) and fails to load a vocabulary without them ("unordered_map::at").
* ``qkv split`` of a GGUF whose llama.cpp graph takes only the fused ``attn_qkv`` (gpt2, bloom,
  gptneox, falcon: "tensor 'blk.0.attn_qkv.weight' not found").  Where the graph takes separate
  q/k/v too (phi3), the split file loads."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import hf_to_gguf

import llama_cpp  # noqa: E402  (installed by the test extra)


def _one_line_refusal(r, *says) -> str:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


def _loads(path) -> None:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, verbose=False)   # raises if llama.cpp refuses it
    llm.close()


def test_a_phi3_name_without_phi3_tokens_is_refused(tiny, tmp_path):
    src = tmp_path / "my-phi3-finetune"
    shutil.copytree(tiny("phi3"), src)      # the tiny tokenizer has no <s> / </s> / <unk>
    out = tmp_path / "p.gguf"
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--dtype", "f32", "--no-progress"])
    _one_line_refusal(r, "general.name 'my-phi3-finetune' contains 'phi3'", "lacks <unk>, <s>, </s>",
                      "nothing was written", "--name")
    assert not out.exists()
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--dtype", "f32", "--name", "Phi-3 tiny",
                                 "--no-progress"])
    _one_line_refusal(r, "general.name 'Phi-3 tiny' contains 'phi-3'")
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--dtype", "f32", "--name", "tiny",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    _loads(out)


@pytest.mark.parametrize("family,arch", [("gpt2", "gpt2"), ("bloom", "bloom"), ("gpt_neox", "gptneox")])
def test_gguf_split_refused_where_llama_cpp_takes_only_the_fused_tensor(family, arch, tiny, tmp_path):
    g = hf_to_gguf(tiny(family), tmp_path / "m.gguf", dtype="f32", name="tiny")
    _loads(g)
    out = tmp_path / "split.gguf"
    r = CliRunner().invoke(cli, ["qkv", "split", str(g), "-o", str(out), "--no-progress"])
    _one_line_refusal(r, f"llama.cpp's {arch} graph takes only the fused attn_qkv", "nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_gguf_split_loads_where_llama_cpp_takes_separate_qkv(tiny, tmp_path):
    g = hf_to_gguf(tiny("phi3"), tmp_path / "m.gguf", dtype="f32", name="tiny")
    out = tmp_path / "split.gguf"
    r = CliRunner().invoke(cli, ["qkv", "split", str(g), "-o", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "llama.cpp loads blk.N.attn_q / attn_k / attn_v in place of attn_qkv" in r.output
    _loads(out)
