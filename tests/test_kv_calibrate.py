"""kv-equalize --calibrate: the same exact transform, scales chosen on the measured attention error.

Exactness is judged as in test_kv_equalize (transformers, float64 logits) on two families whose
head_dim holds whole cache blocks (the tiny fixtures' 16 does not): a llama with q/k biases (llama.cpp
stores its Q/K rows permuted, so the cache blocks are not the HF dims: the calibration's cache order
is exercised) and a Qwen3 (one q/k-norm weight shared by every head: one scale per pair per layer).
The calibrated choice must measure no worse than the static one (analysis.kv_measure, the real
kernels) on a Qwen2 with planted key biases.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon import kv_equalize
from ckpt_surgeon.analysis.kv_measure import measure_kv_cache
from ckpt_surgeon.cli import cli as cli_main
from tests.kv_models import build_kv_qwen2
from tests.zoo_util import logits64

REL_TOL = 1e-5          # as test_kv_equalize: float32 rounding of the rescaled weights, ~1e-6 of the logits
FAST = {"max_tokens": 24, "rows": 8}       # bounded: the tests judge exactness and ordering, not the optimum
PROMPTS = ["The attention layer projects every token into a query, a key and a value, and the softmax decides.",
           "def f(x):\n    return [i * x for i in range(10)]\n"]


def _build(tiny, name: str, out, seed: int = 0):
    """``name``'s tiny architecture with head_dim 64 (2 heads over 1 kv head), large random biases."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(tiny(name))
    for k, v in {"hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "head_dim": 64, "initializer_range": 0.2}.items():
        setattr(cfg, k, v)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:2]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(torch.randn(p.shape) * 3.0)
            elif "norm" in n:
                p.copy_(1.0 + torch.rand(p.shape))
    model.save_pretrained(out)
    for f in Path(tiny(name)).iterdir():                 # the tokenizer: calibration runs real prompts
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("name", ["llama_bias", "qwen3"])
def test_calibrated_exact(tiny, tmp_path, name):
    src = _build(tiny, name, tmp_path / "src")
    rep = kv_equalize(str(src), str(tmp_path / "eq"), cache_type_k="q4_0", calibrate=True, prompts=PROMPTS,
                      **FAST)
    assert rep.plan.params["scales"].startswith("calibrated on 2 prompts")
    assert all(r.kl_after <= r.kl_static * (1 + 1e-9) for r in rep.layers), rep.rows()
    assert rep.plan.params["calibration"]["attn_rot"] is True
    assert any(r.alpha_max / r.alpha_min > 1.01 for r in rep.layers), "nothing was rescaled"
    a, b = logits64(src), logits64(tmp_path / "eq")
    d = float((a - b).abs().max())
    assert d / float(a.abs().max()) < REL_TOL, (name, d)


def test_calibrated_beats_static(tiny, tmp_path):
    """Measured by kv_measure (every row, the real kernels) on the calibration prompts: calibrated <= static."""
    src = build_kv_qwen2(tiny, tmp_path / "planted", plant={0: 60.0, 2: 90.0})
    kw = {"cache_type_k": "q4_0", "prompts": PROMPTS}
    # plain post-RoPE blocks throughout (llama.cpp's Hadamard rotation off), and the static choice the descent
    # starts from (no pair turns: --calibrate does not turn; no no-harm guard: the descent starts from the
    # optimizer's choice in every layer)
    st = kv_equalize(str(src), str(tmp_path / "static"), attn_rot=False, turn=False, min_gain=0.0, **kw)
    cal = kv_equalize(str(src), str(tmp_path / "cal"), calibrate=True, max_tokens=32, rows=32, attn_rot=False, **kw)
    assert st.plan.params["scales"] == "from the weights and biases"
    m = {k: measure_kv_cache(str(tmp_path / k), ("q4_0",), prompts=PROMPTS, max_tokens=32, attn_rot=False)
         for k in ("static", "cal")}
    kl = {k: np.array([r.k_row_kl for r in v.layers]) for k, v in m.items()}
    # the descent only accepts moves that lower this same measurement (all 32 rows kept: the same rows);
    # 1e-3 relative slack for the float32 rounding of the written weights
    assert (kl["cal"] <= kl["static"] * (1 + 1e-3)).all(), kl
    assert kl["cal"].sum() < 0.9 * kl["static"].sum(), kl      # and the planted layers gain visibly
    assert [r.kl_after for r in cal.layers] == pytest.approx(list(kl["cal"]), rel=1e-2)


def test_calibrate_cli_and_bad_input(tmp_path, tiny):
    src = build_kv_qwen2(tiny, tmp_path / "m")
    (tmp_path / "p.json").write_text(json.dumps(PROMPTS))
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "o"), "--calibrate", "--prompts",
                                      str(tmp_path / "p.json"), "--max-tokens", "16", "--dry-run"],
                            env={"COLUMNS": "240"})     # wide enough that no header wraps (xdist workers: 80)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())          # the labels may still wrap at the runner's width
    assert "scales chosen calibrated on 2 prompts" in flat and "KL calibrated" in flat, r.output
    assert "attn_rot Hadamard on" in flat
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "x"), "--calibrate",
                                      "--cache-type-k", "fp8", "--max-tokens", "16"])
    assert r.exit_code == 2 and "per-tensor scale" in r.output and r.output.count("\n") == 1, r.output
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(tiny("qwen2")), "-o", str(tmp_path / "y"), "--calibrate",
                                      "--max-tokens", "16"])
    assert r.exit_code == 2 and "head_dim 16" in r.output, r.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_hadamard_is_llamacpp_rotation():
    """Orthogonal, symmetric (llama.cpp assumes k_rot^2 = I), Sylvester order, the size llama.cpp picks."""
    from ckpt_surgeon.surgery.kv_calibrate import hadamard
    h = hadamard(128, ("q4_0",))
    assert h.shape == (128, 128) and np.allclose(h @ h, np.eye(128), atol=1e-6) and np.allclose(h, h.T)
    assert h[0, 0] == h[1, 0] == -h[1, 1] == pytest.approx(128 ** -0.5)
    assert hadamard(192, ("q8_0",)).shape == (64, 64) and hadamard(80, ("q4_0",)) is None
    assert hadamard(128, ("fp8_e4m3",)) is None
