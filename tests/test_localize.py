"""``verify --localize``: one tensor perturbed in layer k of a tiny model (real transformers
forward passes with hooks) and the report names layer k."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli
from ckpt_surgeon.verification.localize import localize

FEW = ["The capital of France is", "def softmax(x):\n    return x"]


def _perturbed(src: Path, dst: Path, name: str) -> Path:
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    data = load_file(str(dst / "model.safetensors"))
    rng = np.random.default_rng(0)
    w = data[name]
    data[name] = (w + 0.05 * np.abs(w).max() * rng.standard_normal(w.shape)).astype(w.dtype)
    save_file(data, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("name,layer,part", [
    ("model.layers.1.mlp.down_proj.weight", 1, "mlp"),
    ("model.layers.0.self_attn.o_proj.weight", 0, "attention"),
])
def test_perturbed_layer_is_named(tiny, tmp_path, name, layer, part):
    src = tiny("qwen2")
    bad = _perturbed(src, tmp_path / "bad", name)
    rep = localize(src, bad, prompts=FEW)
    assert rep.first_layer == layer and rep.first_point == f"layer {layer} {part}"
    assert {(p.layer, p.part) for p in rep.points} == {(i, q) for i in (0, 1) for q in ("attention", "mlp", "output")}
    # everything before the perturbed module is computed from identical weights on identical
    # inputs: exactly equal on CPU, not merely close
    before = [p for p in rep.points if (p.layer, ("attention", "mlp", "output").index(p.part))
              < (layer, ("attention", "mlp", "output").index(part))]
    assert all(p.max_abs == 0.0 and p.rel == 0.0 for p in before)
    assert all(p.over for p in rep.points if p.layer > layer)
    # sequential mode (reference's per-point outputs saved to disk) gives the same numbers
    seq = localize(src, bad, prompts=FEW, sequential=True)
    assert seq.mode == "sequential" and [p.to_dict() for p in seq.points] == [p.to_dict() for p in rep.points]


def test_identical_models_have_no_divergence(tiny):
    src = tiny("llama")
    rep = localize(src, src, prompts=FEW[:1])
    assert rep.first_layer is None and all(p.rel == 0.0 for p in rep.points)


def test_cli_verify_localize(tiny, tmp_path):
    src = tiny("qwen2")
    bad = _perturbed(src, tmp_path / "bad", "model.layers.1.mlp.up_proj.weight")
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(FEW))
    res = CliRunner().invoke(cli, ["verify", str(src), str(bad), "--localize", "--prompts", str(prompts),
                                   "--max-new-tokens", "2", "--format", "json", "--device", "cpu"])
    assert res.exit_code == 1, res.output
    got = json.loads(res.stdout)
    assert got["localize"]["first_layer"] == 1 and got["localize"]["first_point"] == "layer 1 mlp"
    assert got["passed"] is False
    res = CliRunner().invoke(cli, ["verify", str(src), str(bad), "--localize", "--prompts", str(prompts),
                                   "--max-new-tokens", "0", "--device", "cpu", "--sequential"])
    assert res.exit_code == 1
    assert "first diverging layer" in res.stdout and "layer 1 mlp" in res.stdout
