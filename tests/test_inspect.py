"""``inspect`` on every fixture family and the real all-MiniLM-L6-v2, API and CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ckpt_surgeon import inspect
from ckpt_surgeon.arch import families as F
from ckpt_surgeon.cli import cli
from ckpt_surgeon.tiny import tiny_names

FAMILY_OF = {"qwen2_long": "qwen2", "qwen2_sharded": "qwen2", "llama_bias": "llama", "falcon_mq": "falcon",
             "falcon_old": "falcon"}


def _state(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _reference_qkv_bias(name: str, folder: Path, state: dict, layer: int):
    """q/k/v bias of one layer, split by transformers' own code where the bias is fused.

    Independent of our layout tables: Falcon and BLOOM use their attention modules'
    split functions on the bias vector (a zero input makes the projection output
    exactly its bias); GPT-NeoX and GPT-2 repeat the two lines of their forward.
    """
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    keys = [k for k in state if f".{layer}." in k and k.endswith(".bias")]
    fused = [k for k in keys if "query_key_value" in k or "c_attn" in k or "qkv_proj" in k]
    if not fused:
        pick = lambda *subs: next((state[k] for k in keys if any(s in k for s in subs)), None)  # noqa: E731
        return pick("q_proj", "query."), pick("k_proj", "key."), pick("v_proj", "value.")
    b = state[fused[0]].reshape(1, 1, -1)
    mt = cfg.model_type
    hd = cfg.hidden_size // cfg.num_attention_heads
    if mt == "falcon":
        attn = transformers.models.falcon.modeling_falcon.FalconAttention(cfg, layer_idx=0)
        q, k, v = attn._split_heads(b)
        if cfg.new_decoder_architecture:  # k/v come back broadcast to every query head of the group
            g = cfg.num_attention_heads // cfg.num_kv_heads
            k, v = (x.reshape(cfg.num_kv_heads, g, hd)[:, 0] for x in (k, v))
    elif mt == "bloom":
        attn = transformers.models.bloom.modeling_bloom.BloomAttention(cfg, layer_idx=0)
        q, k, v = attn._reshape(b)
    elif mt == "gpt_neox":  # modeling_gpt_neox.GPTNeoXAttention.forward
        q, k, v = b.view(1, 1, -1, 3 * hd).transpose(1, 2).chunk(3, dim=-1)
    elif mt == "gpt2":  # modeling_gpt2.GPT2Attention.forward: c_attn(x).split(split_size, dim=2)
        q, k, v = b.split(cfg.hidden_size, dim=2)
    else:
        raise AssertionError(f"no reference split for {mt}")
    return q.reshape(-1), k.reshape(-1), v.reshape(-1)


@pytest.mark.parametrize("name", tiny_names())
def test_inspect_matches_config_and_tensors(tiny, name):
    folder = tiny(name)
    cfg = json.loads((folder / "config.json").read_text())
    rep = inspect(folder)
    assert rep.family == FAMILY_OF.get(name, name if name != "gemma3" else "gemma3")
    assert rep.num_layers == 2 and len(rep.layers) == 2
    if F.by_name(rep.family).latent_attention:
        # MLA: the layout is derived from transformers, whose attention has no q/k/v heads to count
        assert rep.num_heads is None and rep.head_dim is None and rep.layers_with_qkv_bias == 0
    else:
        assert rep.num_heads == 4 and rep.head_dim == 16
    state = _state(folder)
    assert rep.parameter_count == sum(t.numel() for t in state.values() if t.is_floating_point())
    for lr in rep.layers:
        q, k, v = _reference_qkv_bias(name, folder, state, lr.layer)
        for role, ref in (("q", q), ("k", k), ("v", v)):
            got = getattr(lr, f"{role}_bias")
            if ref is None:
                assert got is None
                continue
            ref = ref.double()
            heads = rep.num_heads if role == "q" else rep.num_kv_heads
            # float64 sums of the same float32 values: equal up to summation order (~1e-15 relative)
            assert got.l2 == pytest.approx(float(ref.norm()), rel=1e-12)
            assert got.max_abs == pytest.approx(float(ref.abs().max()), rel=1e-12)
            assert np.allclose(got.per_head_l2, ref.view(heads, -1).norm(dim=1).numpy(), rtol=1e-12)
    if "attention_bias" in cfg and not cfg["attention_bias"]:
        assert rep.layers_with_qkv_bias == 0


def test_kv_heads_and_layouts(tiny):
    assert inspect(tiny("falcon_mq")).num_kv_heads == 1            # multi_query: one shared k/v head
    assert inspect(tiny("falcon")).fused_layout == "grouped"
    assert inspect(tiny("falcon_old")).fused_layout == "per_head"
    assert inspect(tiny("gpt2")).fused_layout == "concat"
    gn = inspect(tiny("gpt_neox"))
    assert gn.position_encoding.rotary_dim == 4 and gn.fused_layout == "per_head"   # rotary_pct 0.25 of 16
    q2 = inspect(tiny("qwen2_long"))
    assert q2.position_encoding.theta == 1e6 and q2.max_positions == 32768
    assert inspect(tiny("bloom")).position_encoding.type == "alibi"
    assert inspect(tiny("bert")).norm_placement == "post"
    for n in ("qwen3", "gemma3", "olmo2"):
        assert inspect(tiny(n)).qk_norm


def test_top_level_rope_spelling_is_read(tiny, tmp_path):
    """Hub-era configs keep rope_theta / rotary_pct at top level (transformers >= 5 nests them)."""
    d = tmp_path / "neox"
    shutil.copytree(tiny("gpt_neox"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(rotary_pct=0.5, rotary_emb_base=5000)
    (d / "config.json").write_text(json.dumps(cfg))
    pe = inspect(d).position_encoding
    assert (pe.rotary_dim, pe.theta) == (8, 5000.0)


def test_sharded_equals_single(tiny):
    a, b = inspect(tiny("qwen2")), inspect(tiny("qwen2_sharded"))
    strip = lambda lr: {k: ({kk: vv for kk, vv in v.items() if kk != "tensor"} if isinstance(v, dict) else v)  # noqa: E731
                        for k, v in lr.to_dict().items()}
    assert [strip(x) for x in a.layers] == [strip(y) for y in b.layers]
    assert a.parameter_count == b.parameter_count


def test_real_minilm(minilm_dir):
    rep = inspect(minilm_dir)
    assert (rep.architecture, rep.num_layers, rep.num_heads, rep.head_dim) == ("bert", 6, 12, 32)
    assert rep.layers_with_qkv_bias == 6 and len(rep.layers) == 6
    for lr in rep.layers:
        assert lr.q_bias and lr.k_bias and lr.v_bias
        # A key bias gets no gradient under softmax, so it stays at its init scale while the
        # query bias trains: measured ratios are > 100x on this model; 20x leaves room.
        assert lr.k_bias.l2 * 20 < lr.q_bias.l2
    assert rep.position_encoding.type == "absolute"


def test_json_contract(tiny):
    d = inspect(tiny("qwen2")).to_dict()
    for key in ("architecture", "num_layers", "num_heads", "num_kv_heads", "head_dim", "position_encoding",
                "qk_norm", "norm_placement", "layers"):
        assert key in d
    assert d["position_encoding"] == {"type": "rope", "rotary_dim": 16, "theta": 10000.0, "axes": 1}
    lay = d["layers"][0]
    assert {"layer", "q_bias", "k_bias", "v_bias", "fused_qkv"} <= set(lay)
    assert set(lay["k_bias"]) >= {"l2", "max_abs", "per_head_l2"}
    assert len(lay["q_bias"]["per_head_l2"]) == 4 and len(lay["k_bias"]["per_head_l2"]) == 2
    json.dumps(d, allow_nan=False)
    df = inspect(tiny("qwen2")).to_frame()
    assert list(df["layer"]) == [0, 1] and (df["k_bias_l2"] > 0).all()


def test_latent_attention_family_is_read_like_before_its_registry_row(tiny, tmp_path):
    """DeepSeek-V2 (MLA) is a registry family for conversion, but its attention layout for analysis is
    derived from transformers (``latent_attention``): inspect / analyze say what they said before
    the registry row (no q/k/v heads, RoPE, no key bias) and name the family; its GGUF (head_count_kv
    1, key_length kv_lora + rope: no heads x head_dim rule for q or o) is read too; fold-bias refuses."""
    from ckpt_surgeon.analysis.redundancy import analyze
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf
    folder = tiny("deepseek_v2")
    assert F.by_name("deepseek_v2").latent_attention
    for src in (folder, hf_to_gguf(folder, tmp_path / "m.gguf", dtype="f32", name="tiny")):
        rep = inspect(src)
        assert rep.family == "deepseek_v2" and rep.num_layers == 2 and rep.layers_with_qkv_bias == 0
        assert rep.position_encoding.type == "rope"
        assert any("no key bias" in n for n in rep.notes)
        a = analyze(src)
        assert all(lay.k_bias_tensor is None and lay.bound_note == "no key bias" for lay in a.layers), a.layers
        res = CliRunner().invoke(cli, ["analyze", str(src), "--format", "json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["family"] == "deepseek_v2"
        assert out["bias_consumers"]["residual_readers"]["consumer"] == "rmsnorm"
        res = CliRunner().invoke(cli, ["fold-bias", str(src), "-o", str(tmp_path / f"f{src.suffix}"), "--k"])
        assert res.exit_code == 2 and not (tmp_path / f"f{src.suffix}").exists(), res.output
    hf, gg = inspect(folder), inspect(tmp_path / "m.gguf")
    assert hf.num_heads is None and "latent attention" in hf.notes[0]
    assert (gg.num_heads, gg.num_kv_heads, gg.head_dim) == (4, 1, 24)   # llama.cpp's MQA view of MLA
    assert gg.position_encoding.rotary_dim == 8 and gg.position_encoding.pair_layout == "interleaved"


def test_unknown_architecture_is_reported_by_name(tiny, tmp_path):
    d = tmp_path / "mystery"
    shutil.copytree(tiny("qwen2"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "mystery"
    cfg["architectures"] = ["MysteryForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    rep = inspect(d)
    assert rep.family is None and rep.architecture == "mystery"
    assert rep.layers_with_qkv_bias == 2 and rep.layers[0].k_bias is not None
    assert any("not in the registry" in n for n in rep.notes)


def test_gpt2_mask_buffers_are_not_biases(tiny, tmp_path):
    d = tmp_path / "gpt2"
    shutil.copytree(tiny("gpt2"), d)
    st = load_file(str(d / "model.safetensors"))
    st["transformer.h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
    st["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(st, str(d / "model.safetensors"))
    rep = inspect(d)
    assert rep.skipped == () and rep.bias_parameters == inspect(tiny("gpt2")).bias_parameters


def test_nan_in_bias_is_reported_not_fatal(tiny, tmp_path):
    d = tmp_path / "nan"
    shutil.copytree(tiny("qwen2"), d)
    st = load_file(str(d / "model.safetensors"))
    st["model.layers.1.self_attn.k_proj.bias"][3] = float("nan")
    save_file(st, str(d / "model.safetensors"))
    res = CliRunner().invoke(cli, ["inspect", str(d), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["layers"][1]["k_bias"]["nonfinite"] == 1 and out["layers"][1]["k_bias"]["l2"] is None
    assert "layer 1: k bias (model.layers.1.self_attn.k_proj.bias) has 1 NaN/Inf value(s)" in out["warnings"]
    # issue 24: the key is always written (0: none), and the table tells NaN from absent
    assert out["layers"][0]["k_bias"]["nonfinite"] == 0 and out["layers"][1]["q_bias"]["nonfinite"] == 0
    table = CliRunner().invoke(cli, ["inspect", str(d)]).stdout
    row = next(line for line in table.splitlines() if line.startswith("│") and line.split("│")[1].strip() == "1")
    cells = [c.strip() for c in row.split("│")[1:-1]]
    header = next(line for line in table.splitlines() if "k_bias_l2" in line)
    cols = [c.strip() for c in header.split("┃")[1:-1]]
    assert cells[cols.index("k_bias_l2")] == "NaN" and cells[cols.index("q_bias_l2")] != "NaN"
    rows = inspect(tiny("llama")).rows()          # llama: no q/k/v biases at all
    assert rows[0]["k_bias_l2"] is None and "NaN" not in CliRunner().invoke(cli, ["inspect", str(tiny("llama"))]).stdout


def test_config_contradicting_shapes(tiny, tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(tiny("qwen2"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(cli, ["inspect", str(d)])
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"error: {d / 'config.json'}: tensor 'model.layers.0.self_attn.k_proj.weight': config says "
                                  "4 kv heads x head_dim 16 = 64 k rows, but the tensor has shape [32, 64]")


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_formats_and_atomic_output(tiny, tmp_path, fmt):
    out = tmp_path / f"report.{fmt}"
    res = CliRunner().invoke(cli, ["inspect", str(tiny("phi")), "--format", fmt, "--output", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    if fmt == "json":
        assert json.loads(text)["architecture"] == "phi"
    elif fmt == "csv":
        assert text.splitlines()[0].startswith("layer,") and len(text.splitlines()) == 3
    elif fmt == "markdown":
        assert "| layer |" in text
    else:
        assert "phi" in text and "k_bias_l2" in text
    assert [p.name for p in tmp_path.iterdir()] == [out.name]   # no temp file left behind


def test_cli_subprocess_exit_codes_and_no_torch_import(tiny, tmp_path):
    code = ("import sys, runpy; sys.argv=['ckpt-surgeon','inspect',sys.argv[1],'--format','json'];\n"
            "from ckpt_surgeon.cli import cli\n"
            "try:\n    cli(prog_name='ckpt-surgeon')\nexcept SystemExit as e:\n"
            "    assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import on inspect path'\n"
            "    raise\n")
    ok = subprocess.run([sys.executable, "-c", code, str(tiny("qwen2"))], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_layers"] == 2
    bad = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == f"error: {tmp_path / 'missing'}: no such file or folder (and not a Hub repo id of the form owner/name)\n"
    trunc = tmp_path / "t.safetensors"
    trunc.write_bytes((tiny("qwen2") / "model.safetensors").read_bytes()[:-100])
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", str(trunc)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "file is truncated" in r.stderr and "100 bytes missing" in r.stderr
    dbg = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "--debug", "inspect", str(trunc)], capture_output=True, text=True)
    assert dbg.returncode != 0 and "Traceback" in dbg.stderr


def test_memory_figures(tiny, tmp_path):
    """Weight bytes per dtype and KV cache per 1,000 tokens, counted by hand from the config."""
    rep = inspect(str(tiny("qwen2")))
    m = rep.to_dict()["memory"]
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(tiny("qwen2")) as ck:
        assert m["weight_bytes"] == {"F32": sum(i.nbytes for i in ck.tensors.values())}
    cfg = json.loads((tiny("qwen2") / "config.json").read_text())
    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    elems = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * d * 1000
    assert m["kv_cache_elements"] == elems
    assert m["kv_cache_bytes"] == {"f16": 2 * elems, "q8_0": round(elems * 34 / 32)}
    assert any(k == "KV cache / 1,000 tokens" for k, _ in rep.summary_items())
    # Gemma 3: the sliding layer (window 8) keeps 8 tokens, the full layer 1,000
    g = inspect(str(tiny("gemma3"))).to_dict()["memory"]
    gcfg = json.loads((tiny("gemma3") / "config.json").read_text())
    per_token = 2 * gcfg["num_key_value_heads"] * gcfg["head_dim"]
    assert gcfg["layer_types"] == ["sliding_attention", "full_attention"] and gcfg["sliding_window"] == 8
    assert g["kv_cache_elements"] == per_token * (8 + 1000)
    assert g["kv_cache_note"] == "1 sliding-window layer(s) keep at most 8 tokens"
    # GGUF: quantization types counted as stored
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gguf_util import write_gguf
    q = inspect(str(write_gguf(tiny("qwen2"), tmp_path / "q.gguf", qtype="Q8_0"))).to_dict()["memory"]
    assert set(q["weight_bytes"]) == {"Q8_0", "F32"} and q["kv_cache_elements"] == elems
