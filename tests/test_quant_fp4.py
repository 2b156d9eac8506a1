"""The quantized formats of 2026 (issue 49): compressed-tensors NVFP4 / MXFP4 / MXFP8, several config groups
(``format: mixed-precision``), ModelOpt NVFP4 / FP8 / per-layer algorithms.  The fixtures were written by the
real producers on this CPU (llmcompressor 0.14 + compressed-tensors 0.19, nvidia-modelopt 0.47:
``fixtures/quant/README.md``); the generic checks (element-exact against the producer, inspect, lint, analyze,
diff, fold-bias, qkv, dense conversion) run on them through the parametrized tests of test_quant_read.py and
test_quant_dense.py.  Here: what only these formats have."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from test_quant_read import QUANT, _lint, _one_line_exit_2, _oracle, _rewrite

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli


def _inspect_json(folder) -> dict:
    res = CliRunner().invoke(cli, ["inspect", str(folder), "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["quantization"]


def test_inspect_names_the_scheme_per_group():
    """Each config group (compressed-tensors) or per-layer algorithm (ModelOpt) with the modules it quantizes."""
    q = _inspect_json(QUANT / "ct_mixed")
    groups = {g["scheme"]: g for g in q["groups"]}
    assert {s: (g["format"], g["bits"], g["group_size"], g["weights"]) for s, g in groups.items()} == {
        "ct-float": ("float-quantized", 8, 0, 8), "ct-nvfp4": ("nvfp4-pack-quantized", 4, 16, 4),
        "ct-pack": ("pack-quantized", 4, 128, 2)}
    assert groups["ct-nvfp4"]["example"] == "model.layers.0.mlp.gate_proj"
    q = _inspect_json(QUANT / "modelopt_mixed")
    assert {g["name"]: (g["scheme"], g["weights"]) for g in q["groups"]} == {
        "FP8": ("modelopt-fp8", 8), "W4A16_NVFP4": ("modelopt-nvfp4", 6)}
    assert q["producer"] == "modelopt 0.47.0"
    table = CliRunner().invoke(cli, ["inspect", str(QUANT / "ct_mixed")]).output
    assert "quantization groups" in table and "ct-nvfp4" in table and "ct-pack" in table


def test_two_groups_claiming_a_module_refused(tmp_path):
    cfg = json.loads((QUANT / "ct_mixed" / "config.json").read_text())
    qc = cfg["quantization_config"]
    qc["config_groups"]["group_1"]["targets"].append("model.layers.0.mlp.down_proj")
    bad = _rewrite(QUANT / "ct_mixed", tmp_path / "two", config={"quantization_config": qc})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "'group_1', 'group_2'" in line and "model.layers.0.mlp.down_proj" in line and "ambiguous" in line


def test_untargeted_quantized_module_refused(tmp_path):
    cfg = json.loads((QUANT / "ct_mixed" / "config.json").read_text())
    qc = cfg["quantization_config"]
    del qc["config_groups"]["group_2"]
    bad = _rewrite(QUANT / "ct_mixed", tmp_path / "none", config={"quantization_config": qc})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "down_proj.weight_packed" in line and "no config group targets it" in line


@pytest.mark.parametrize("scheme, role", [("ct_nvfp4a16", "weight_global_scale"), ("modelopt_nvfp4", "weight_scale_2"),
                                          ("ct_nvfp4", "input_global_scale")])
@pytest.mark.parametrize("value", [0.0, float("inf"), float("nan")])
def test_lint_catches_a_zero_or_nonfinite_global_scale(scheme, role, value, tmp_path):
    name = f"model.layers.1.mlp.up_proj.{role}"
    bad = _rewrite(QUANT / scheme, tmp_path / "g", patch={name: lambda a: np.full_like(a, value)})
    findings = [f for f in _lint(bad) if f["check"] == "quantization"]
    assert [f["tensor"] for f in findings] == [name], findings
    assert ("zero" if value == 0 else "NaN/Inf") in findings[0]["message"]


@pytest.mark.parametrize("scheme, scale", [("ct_nvfp4a16", "weight_scale"), ("ct_mxfp4a16", "weight_scale"),
                                           ("modelopt_nvfp4", "weight_scale")])
def test_fp4_scale_of_the_wrong_shape_refused(scheme, scale, tmp_path):
    """A block scale that does not give one scale per 16 (NVFP4) / 32 (MXFP4) values of each row: one
    line naming the tensor, exit 2, from inspect, lint and convert alike."""
    name = f"model.layers.0.self_attn.q_proj.{scale}"
    bad = tmp_path / "s"
    shutil.copytree(QUANT / scheme, bad)
    from ckpt_surgeon.formats import safetensors as st
    f = bad / "model.safetensors"
    h = st.read_header(f)
    raw = f.read_bytes()
    hdr = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    i = h.tensors[name]
    hdr[name]["shape"] = [i.shape[0] // 2, i.shape[1] * 2]      # same bytes, wrong shape
    j = json.dumps(hdr).encode()
    j += b" " * (-len(j) % 8)
    f.write_bytes(len(j).to_bytes(8, "little") + j + raw[8 + int.from_bytes(raw[:8], "little"):])
    for cmd in (["inspect", str(bad)], ["lint", str(bad)], ["convert", str(bad), "-o", str(tmp_path / "o")]):
        line = _one_line_exit_2(cmd)
        assert "FP4 scale shape wrong" in line and name in line, line
    assert not (tmp_path / "o").exists()


def test_modelopt_hf_quant_config_only(tmp_path):
    """A ModelOpt release whose config.json names no quantization: hf_quant_config.json says it (as
    llama.cpp's converter reads it); read the same, element-exact."""
    src = tmp_path / "mo"
    shutil.copytree(QUANT / "modelopt_nvfp4", src)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["quantization_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    with open_checkpoint(src) as ck:
        q = ck.quantization
        assert (q.method, q.format, q.producer) == ("modelopt", "NVFP4", "modelopt 0.47.0")
        assert "model.embed_tokens" in q.unquantized
        for n, w in _oracle("modelopt_nvfp4").items():
            np.testing.assert_array_equal(ck.read(n), w, err_msg=n)


def test_modelopt_unsupported_algorithm_refused(tmp_path):
    cfg = json.loads((QUANT / "modelopt_fp8" / "config.json").read_text())
    qc = {**cfg["quantization_config"], "quant_algo": "W4A8_AWQ"}
    bad = _rewrite(QUANT / "modelopt_fp8", tmp_path / "a", config={"quantization_config": qc})
    line = _one_line_exit_2(["inspect", str(bad)])
    assert "'W4A8_AWQ' is not read" in line and "(modelopt)" in line
