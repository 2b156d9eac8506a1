"""Architectures outside the registry: layout derived from transformers, facts probed in float64.

Every claim is judged by transformers' own float64 forward pass on the written checkpoint.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from ckpt_surgeon import analyze, fold_bias, inspect
from ckpt_surgeon.cli import cli
from zoo_util import EXACT_RTOL, logits64, rel_change, zeroed_k_all

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def derive_cache(tmp_path_factory):
    """Derived facts go to a private cache (never the user's)."""
    old = os.environ.get("CKPT_SURGEON_CACHE_DIR")
    path = tmp_path_factory.mktemp("derive-cache")
    os.environ["CKPT_SURGEON_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("CKPT_SURGEON_CACHE_DIR", None)
    else:
        os.environ["CKPT_SURGEON_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def zoo():
    from fixtures.build_fixtures import zoo_path
    return zoo_path


def _tensor(folder, name):
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), "np") as sf:
            if name in sf.keys():
                return sf.get_tensor(name)
    raise KeyError(name)


def _fold_is_exact(src, out, **kw):
    res = fold_bias(str(src), str(out), **kw)
    assert rel_change(logits64(src), logits64(out)) < EXACT_RTOL
    return res


def test_bart_self_and_cross_attention_key_bias_is_exact(zoo, tmp_path):
    src = zoo("bart")
    rep = inspect(str(src))
    d = rep.to_dict()
    assert d["family"] is None and d["derivation"] is not None
    groups = {g["group"]: g for g in d["derivation"]["groups"]}
    assert {g["kind"] for g in groups.values()} == {"self", "cross"}
    assert any(g.endswith("encoder_attn") for g in groups)
    assert all(g["k_class"] == "exact" and g["v_foldable"] for g in groups.values()), groups
    probed = [f for f in d["facts"] if f["how"] == "probed" and f["name"] == "k_bias_removal"]
    assert len(probed) == len(groups)
    an = analyze(str(src))
    assert an.class_counts() == {"exact": len([b for b in d["derivation"]["blocks"] if b["kind"] != "none"])}
    out = tmp_path / "out"
    _fold_is_exact(src, out, k=True, v=True)
    names = [b["block"] for b in d["derivation"]["blocks"] if b["kind"] == "cross"]
    assert names
    assert not _tensor(out, f"{names[0]}.k_proj.bias").any()          # cross-attention key bias folded too
    assert not _tensor(out, f"{names[0]}.v_proj.bias").any()


@pytest.mark.parametrize("model_type", ["roberta", "electra", "gpt_bigcode", "biogpt"])
def test_textbook_exact_folds(zoo, tmp_path, model_type):
    src = zoo(model_type)
    an = analyze(str(src))
    assert set(an.class_counts()) == {"exact"}, an.class_counts()
    _fold_is_exact(src, tmp_path / "out", k=True, v=True)


def test_gpt_bigcode_mqa_fused_layout_is_probed(zoo):
    d = inspect(str(zoo("gpt_bigcode"))).to_dict()
    assert d["num_kv_heads"] == 1 and d["fused_layout"] == "concat"
    fl = [f for f in d["facts"] if f["name"] == "fused_layout"]
    assert fl and all(f["how"] == "probed" and f["value"] == "concat" for f in fl)


def test_partial_rotary_pass_through_dims(zoo, tmp_path):
    src = zoo("stablelm")                      # partial_rotary_factor 0.25, use_qkv_bias on
    an = analyze(str(src))
    assert set(an.class_counts()) == {"partial"}
    lr = next(lr for lr in an.layers if lr.has_k_bias)
    assert 0 < len(lr.exact_dims) < an.num_kv_heads * an.head_dim
    res = _fold_is_exact(src, tmp_path / "out", k=True)
    assert all(r.k_removed == len(lr.exact_dims) for r in res.plan.layers if r.k_bias)
    # control: the rotated part is not removable, and the forward pass sees it
    assert rel_change(logits64(src), logits64(zeroed_k_all(src, tmp_path / "all"))) > 1e-6


def test_full_rope_is_refused_and_really_matters(zoo, tmp_path):
    src = zoo("qwen2_moe")
    an = analyze(str(src))
    assert set(an.class_counts()) == {"rope"}
    r = CliRunner().invoke(cli, ["fold-bias", str(src), "-o", str(tmp_path / "o"), "--k"])
    assert r.exit_code == 2 and "not exactly removable" in r.output
    assert not (tmp_path / "o").exists()
    assert rel_change(logits64(src), logits64(zeroed_k_all(src, tmp_path / "all"))) > 1e-6


@pytest.mark.parametrize("model_type,attention", [("jamba", True), ("mamba", False)])
def test_hybrid_layers_without_attention(zoo, model_type, attention):
    """Jamba: Mamba layers + one attention layer; Mamba: no attention at all."""
    src = zoo(model_type)
    d = inspect(str(src)).to_dict()
    kinds = [b["kind"] for b in d["derivation"]["blocks"]]
    assert "none" in kinds and ("self" in kinds) == attention, kinds
    an = analyze(str(src)).to_dict()
    assert an["num_layers"] == len(kinds)
    r = CliRunner().invoke(cli, ["inspect", str(src), "--format", "json"])
    assert r.exit_code == 0, r.output


def test_derived_facts_are_cached(zoo, derive_cache):
    from ckpt_surgeon.arch.derive.derived import derive
    cfg = json.loads((zoo("opt") / "config.json").read_text())
    first = derive(cfg)
    again = derive(cfg)
    assert again.cached and again.groups == first.groups
    assert any(p.suffix == ".json" for p in Path(derive_cache).rglob("*"))


def test_registry_families_do_not_import_torch(tiny):
    code = ("import sys; from ckpt_surgeon import inspect; inspect(sys.argv[1]); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code, str(tiny("qwen2"))], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr


def test_gated_query_rows_are_probed(zoo, tmp_path):
    """Qwen3-Next: q_proj holds 2 x heads x head_dim rows, per head the query then its output gate
    (modeling_qwen3_next: ``q_proj(x).view(..., -1, head_dim * 2)`` then ``torch.chunk(.., 2)``)."""
    from ckpt_surgeon.arch.layouts import query_row_index
    src = zoo("qwen3_next")
    d = inspect(str(src)).to_dict()
    gate = [f for f in d["facts"] if f["name"] == "q_gate_layout"]
    assert gate and all(f["how"] == "probed" and f["value"] == "per_head" for f in gate), gate
    attn = [g for g in d["derivation"]["groups"] if g["kind"] == "self"]
    assert [g["q_gate"] for g in attn] == ["per_head"]
    assert attn[0]["k_class"] == "not-removable" and attn[0]["v_foldable"] is False    # q/k-norm; the gate sits before o_proj
    an = analyze(str(src))
    assert set(an.class_counts()) == {"not-removable"}
    assert rel_change(logits64(src), logits64(zeroed_k_all(src, tmp_path / "all"))) > 1e-6
    # the index the analysis uses is transformers' own split, checked on the module itself
    import torch
    from ckpt_surgeon.arch.derive.instance import random_instance
    from transformers import Qwen3NextForCausalLM
    cfg = json.loads((src / "config.json").read_text())
    _, model = random_instance(cfg, Qwen3NextForCausalLM)
    layer = next(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    attn_mod = model.model.layers[layer].self_attn
    h, hd = cfg["num_attention_heads"], cfg["head_dim"]
    x = torch.randn(1, 3, cfg["hidden_size"], dtype=torch.float64)
    query, _ = torch.chunk(attn_mod.q_proj(x).view(1, 3, -1, hd * 2), 2, dim=-1)
    rows = torch.as_tensor(query_row_index("per_head", h, hd))
    assert torch.equal(query.reshape(1, 3, -1), attn_mod.q_proj(x)[..., rows])


def test_vision_tower_blocks_are_probed_through_pixels(zoo, tmp_path):
    """GIT: a token-id forward never runs the CLIP vision tower; its blocks are probed (and the
    folds judged) through the tower on random pixels."""
    import torch
    import transformers

    from ckpt_surgeon.arch.derive.float64 import float64_softmax
    src = zoo("git")
    d = inspect(str(src)).to_dict()
    tower = [g for g in d["derivation"]["groups"] if "image_encoder" in g["group"]]
    assert tower and all(g["k_class"] == "exact" and g["v_foldable"] for g in tower), tower
    assert any(f["name"] == "probe_input" for f in d["facts"])
    out = tmp_path / "out"
    _fold_is_exact(src, out, k=True, v=True)
    name = next(b["block"] for b in d["derivation"]["blocks"] if "image_encoder" in b["block"])
    assert not _tensor(out, f"{name}.k_proj.bias").any()

    def pixels(folder):
        m = transformers.GitForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
        c = m.config.vision_config
        x = torch.randn((1, c.num_channels, c.image_size, c.image_size), generator=torch.Generator().manual_seed(0),
                        dtype=torch.float64)
        with torch.no_grad(), float64_softmax():
            return m.git.image_encoder(pixel_values=x)[0]
    assert rel_change(pixels(src), pixels(out)) < EXACT_RTOL
