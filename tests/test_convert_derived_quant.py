"""Quantized HF sources on the derived path (issue 33 item 2): DeepSeek-V3 as released (FP8 blocks,
``weight_scale_inv`` per 128x128) and gpt-oss as released (MXFP4 experts), each converted in one
pass by llama.cpp's own class reading the stored codes through our reader
(ckpt_surgeon/checkpoint.py ``open_stored``), against ``convert_hf_to_gguf.py`` on the same folder.

* DeepSeek-V3 FP8: llama.cpp's class dequantizes the blocks itself (``ModelBase.dequant_model``:
  ``fp8 x scale_inv`` in float32): the f16 file is llama.cpp's byte for byte; q4_k_m split by
  ``--split-max-tensors`` equals llama.cpp's converter at f32 split the same way followed by
  ``llama-quantize --keep-split``, part by part (the issue's scale-shape route, here at 4 layers;
  benchmarks/bench_convert_dsv3_shape.py runs it at 61 layers x 256 experts).
* gpt-oss MXFP4: llama.cpp keeps the experts MXFP4 (``GptOssModel.repack_mxfp4``): the files at f16,
  q8_0 and f32 are llama.cpp's byte for byte, the experts typed MXFP4; a k-quant, which would
  quantize MXFP4 again (llama-quantize refuses: "requantizing from type mxfp4 is disabled"), is
  refused in one line, exit 2, nothing written.
"""
from __future__ import annotations

import ctypes
import shutil
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from derived_util import converter_src  # noqa: F401 -- the module's autouse fixture
from mxfp4_source import mxfp4_gpt_oss
from test_split_output import _reference

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.conversion import convert
from fixtures.build_fixtures import fixture_path, zoo_path
from fixtures.dsv3_fp8 import write_dsv3_fp8

# 256 wide, so the q4_k_m mixture uses real k-quants on the rows that are (experts' gate / up, attention)
WIDTHS = {"hidden": 256}


@pytest.fixture(scope="module")
def dsv3(tmp_path_factory) -> Path:
    # 3 dense + 1 MoE layer + the MTP layer (skipped by llama.cpp's class), 16 routed experts in 8 groups
    # (llama.cpp asserts fewer groups than experts)
    return write_dsv3_fp8(tmp_path_factory.mktemp("dsv3") / "dsv3-fp8", layers=4, experts=16, dense=3, mtp=1,
                          widths=WIDTHS, tokenizer_from=fixture_path("llama"))


def test_fp8_block_deepseek_v3_is_llama_cpp_converters_file(dsv3, tmp_path):
    ref = _reference(dsv3, "f16", ())
    rep = convert(dsv3, tmp_path / "m.gguf", "f16")
    assert rep.engine.startswith("derived: llama.cpp DeepseekV2Model"), rep.engine
    assert (tmp_path / "m.gguf").read_bytes() == ref[0].read_bytes()
    by_target = {t.target: t for t in rep.tensors}
    assert by_target["blk.3.ffn_gate_exps.weight"].source_dtype == "F8_E4M3"      # read as stored, one pass
    assert not any(".weight_scale_inv" in t.source for t in rep.tensors)
    assert not any(n.startswith("blk.4.") for n in by_target)                      # the MTP layer


def _keep_split_quantize(parts: list[Path], out_prefix: Path, ftype: int) -> list[Path]:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.keep_split = True
    assert llama_cpp.llama_model_quantize(str(parts[0]).encode(), str(out_prefix).encode(), ctypes.byref(params)) == 0
    return [out_prefix.with_name(f"{out_prefix.name}-{i + 1:05d}-of-{len(parts):05d}.gguf") for i in range(len(parts))]


def test_fp8_q4_k_m_split_is_llama_cpp_f32_split_then_llama_quantize_keep_split(dsv3, tmp_path):
    import llama_cpp
    options = ("--split-max-tensors", "12")
    theirs = _keep_split_quantize(_reference(dsv3, "f32", options), tmp_path / "lq",
                                  llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    rep = convert(dsv3, tmp_path / "m.gguf", "q4_k_m", split_max_tensors=12)
    assert len(rep.files) == len(theirs) > 2
    kinds = set()
    for ours, lc in zip(rep.files, theirs):
        with open_checkpoint(ours) as a, open_checkpoint(lc) as b:
            part_a = [n for n, i in a.tensors.items() if i.file == ours]
            part_b = [n for n, i in b.tensors.items() if i.file == str(lc)]
            assert part_a == part_b, ours
            for n in part_a:
                assert (a.tensors[n].dtype, a.read_raw(n)) == (b.tensors[n].dtype, b.read_raw(n)), n
                kinds.add(a.tensors[n].dtype)
    assert {"Q4_K", "Q6_K", "F32"} <= kinds, kinds


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> Path:
    return mxfp4_gpt_oss(zoo_path("gpt_oss"), tmp_path_factory.mktemp("gptoss") / "gpt-oss-mxfp4",
                         fixture_path("llama"))


@pytest.mark.parametrize("outtype", ("f16", "q8_0"))
def test_mxfp4_gpt_oss_is_llama_cpp_converters_file_experts_kept_mxfp4(gpt_oss, outtype, tmp_path):
    ref = _reference(gpt_oss, outtype, ())
    rep = convert(gpt_oss, tmp_path / "m.gguf", outtype)
    assert (tmp_path / "m.gguf").read_bytes() == ref[0].read_bytes()
    types = {t.target: t.target_dtype for t in rep.tensors}
    assert {types[f"blk.{i}.ffn_{w}_exps.weight"] for i in (0, 1) for w in ("gate", "up", "down")} == {"MXFP4"}


def test_mxfp4_to_a_k_quant_is_refused_one_line_exit_2(gpt_oss, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    r = CliRunner().invoke(cli, ["convert", str(gpt_oss), "-o", str(out / "m.gguf"), "--dtype", "q4_k_m"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "keeps this tensor MXFP4" in r.stderr and "requantizing from type mxfp4 is disabled" in r.stderr
    assert os.listdir(out) == []


def test_mxfp4_read_natively_as_transformers_dequantizes_it(gpt_oss, tmp_path):
    """The MXFP4 release read as its logical model (formats/quant, scheme ``mxfp4``): each stacked expert weight
    equals transformers' own dequantization (``from_pretrained`` on the CPU: ``convert_moe_packed_tensors``) bit for
    bit; inspect / analyze / lint name it; the dense folder ``convert`` writes gives transformers' logits exactly."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(gpt_oss, dtype=torch.float32)
    want = model.state_dict()
    with open_checkpoint(gpt_oss) as ck:
        assert ck.quantization.method == "mxfp4"
        experts = [n for n in ck.tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        assert len(experts) == 4 and not any(n.endswith(("_blocks", "_scales")) for n in ck.tensors)
        for n in experts:
            assert np.array_equal(ck.read(n), want[n].numpy()), n
    for cmd in ("inspect", "analyze", "lint"):
        r = CliRunner().invoke(cli, [cmd, str(gpt_oss)])
        assert r.exit_code == 0, (cmd, r.output)
    assert "mxfp4" in CliRunner().invoke(cli, ["inspect", str(gpt_oss)]).output
    convert(gpt_oss, tmp_path / "dense")
    dense = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 22, 7, 3]])
    with torch.no_grad():
        assert torch.equal(dense(ids).logits, model(ids).logits)


def test_mxfp4_scales_missing_one_line_exit_2(gpt_oss, tmp_path):
    from safetensors.torch import load_file, save_file
    bad = tmp_path / "bad"
    shutil.copytree(gpt_oss, bad)
    t = load_file(str(bad / "model.safetensors"))
    del t["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    r = CliRunner().invoke(cli, ["inspect", str(bad)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "model.layers.1.mlp.experts.down_proj_blocks" in r.stderr and "scales missing" in r.stderr
