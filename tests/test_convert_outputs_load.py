"""convert's HF outputs load in transformers as the class their config names (issue 36 item 5's
class: no output its consumer rejects while we exit 0).  GGUF -> HF checks its tensors against the
model ``AutoModelForCausalLM`` builds from the written config; this cross-checks that folder with
``lint``'s ``loads-cleanly`` (the class config.json names, transformers' own key rules) and with
``from_pretrained`` itself, on families that take each distinct path (Conv1D, fused and grouped
QKV, MoE experts, MLA, Gemma's norm shift)."""
from __future__ import annotations

import pytest
from convert_variants import build_variant

from ckpt_surgeon import lint
from ckpt_surgeon.conversion import gguf_to_hf, hf_to_gguf

FAMILIES = ("qwen2", "gpt2", "phi3", "falcon_mq_nobias", "bloom", "mixtral", "deepseek_v2", "gemma2")


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_to_hf_output_loads_cleanly(family, tiny, tmp_path):
    from transformers import AutoModelForCausalLM
    src = build_variant(tiny, family, tmp_path / "src")
    out = gguf_to_hf(hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny"), tmp_path / "hf")
    rep = lint(out)
    assert "loads-cleanly" in rep.checks and not rep.errors, [f.to_dict() for f in rep.errors]
    _, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
