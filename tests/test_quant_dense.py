"""``convert QUANTIZED_FOLDER -o OUT_FOLDER``: the dense HF folder of a quantized checkpoint (issue 36
item 18), on every committed fixture (``fixtures/quant/<scheme>``, written by the real quantizers).

Each quantized weight equals the producer's own dequantization (``oracle.safetensors.xz``) exactly in
float32, and that value rounded once (torch's round-to-nearest-even) in bfloat16 / float16; every
other tensor is the stored one; config.json has no quantization keys; the tokenizer files are
copied byte for byte; transformers loads the folder as the plain model with no missing or
unexpected key, holding those weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_quant_read import QUANT, SCHEMES, _oracle

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli

SIDE = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _convert(src, out, *extra):
    return CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--no-progress", *extra])


def _read_all(folder) -> dict:
    with open_checkpoint(folder) as ck:
        return {n: ck.read(n) for n in ck.tensors}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dense_folder_equals_the_producer_and_loads(scheme, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    src, out = QUANT / scheme, tmp_path / "dense"
    r = _convert(src, out)
    assert r.exit_code == 0, r.output
    assert "quantized->dense" in r.output
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and "quantization" not in cfg and cfg["dtype"] == "float32"
    for f in SIDE:
        if (src / f).is_file():
            assert (out / f).read_bytes() == (src / f).read_bytes(), f
    assert not (out / "hf_quant_config.json").exists()      # ModelOpt's: it would declare the quantization again
    got = _read_all(out)
    oracle = _oracle(scheme)
    with open_checkpoint(src) as ck:
        assert set(got) == set(ck.tensors)
        for n, v in got.items():
            assert v.dtype == np.float32, n
            want = oracle[n] if n in oracle else ck.read(n).astype(np.float32)   # others: stored value, widened
            np.testing.assert_array_equal(v, want, err_msg=n)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    for n, want in oracle.items():
        assert torch.equal(state[n], torch.from_numpy(want)), n


@pytest.mark.parametrize("scheme,dtype", [("gptqmodel_gptq", "bfloat16"), ("ct_fp8_block", "float16"),
                                          ("mlx_4bit", "bf16")])
def test_dense_dtype_rounds_once(scheme, dtype, tmp_path):
    import torch
    out = tmp_path / "dense"
    r = _convert(QUANT / scheme, out, "--dtype", dtype)
    assert r.exit_code == 0, r.output
    tdtype = torch.bfloat16 if dtype.startswith("bf") else torch.float16
    with open_checkpoint(out) as ck:
        assert {i.dtype for i in ck.tensors.values()} == {"BF16" if dtype.startswith("bf") else "F16"}
        for n, want in _oracle(scheme).items():
            expect = torch.from_numpy(want).to(tdtype).float().numpy()
            np.testing.assert_array_equal(ck.read(n).astype(np.float32), expect, err_msg=n)
    assert json.loads((out / "config.json").read_text())["dtype"] == ("bfloat16" if tdtype == torch.bfloat16
                                                                     else "float16")


def test_dense_refusals(tmp_path):
    base, src = QUANT / "base", QUANT / "gptqmodel_gptq"
    r = _convert(base, tmp_path / "out")
    assert r.exit_code == 2 and "give a path ending in .gguf" in r.output and "quantized source" in r.output
    r = _convert(src, tmp_path / "out", "--dtype", "q8_0")
    assert r.exit_code == 2 and "--dtype 'q8_0' cannot be written to an HF folder" in r.output, r.output
    (tmp_path / "exists").mkdir()
    r = _convert(src, tmp_path / "exists")
    assert r.exit_code == 2, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"] and not any((tmp_path / "exists").iterdir())
    assert _convert(src, tmp_path / "exists", "--force").exit_code == 0
    assert (tmp_path / "exists" / "model.safetensors").is_file()
