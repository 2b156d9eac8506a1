"""Bias consumers and ``fold-bias --center``: registry facts probed in float64, exactness on every
LayerNorm fixture and the real all-MiniLM-L6-v2, refusals (RMSNorm, head reading the raw stream),
removable shares against a hand computation, the mean-heavy flag, CLI."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.analysis.consumers import locate_stream_tensors, stream_readers
from ckpt_surgeon.analysis.redundancy import analyze
from ckpt_surgeon.arch.families import FAMILIES
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import RefusedError, UnsupportedError
from ckpt_surgeon.surgery.fold import fold_bias
from ckpt_surgeon.surgery.plan import _Evaluator

REPO = Path(__file__).resolve().parent.parent
IDS = torch.tensor([[5, 17, 42, 99, 7, 123, 64, 250, 31, 8, 77, 150, 201, 12, 90, 33]])


def load(path, dtype=torch.float64):
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(path)
    cls = transformers.AutoModel if cfg.model_type == "bert" else transformers.AutoModelForCausalLM
    # eager experts: transformers' default grouped_mm has no float64 kernel (MoE families)
    return cls.from_pretrained(path, attn_implementation="eager", experts_implementation="eager", dtype=dtype).eval()


def run(model, ids=IDS):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def rel(a, b) -> float:
    return float((a - b).abs().max() / a.abs().max())


def with_tensors(model, values: dict):
    """``model`` with some parameters replaced (float64 numpy, the checkpoint's names)."""
    sd = model.state_dict()
    for name, v in values.items():
        assert name in sd, name
        sd[name] = torch.from_numpy(np.asarray(v, dtype=np.float64).reshape(sd[name].shape))
    model.load_state_dict(sd)
    return model


def residual_bias_names(path) -> list[str]:
    ck = open_checkpoint(path)
    return [t.bias for t in locate_stream_tensors(ck, ck.layout()) if t.role in ("o", "mlp_out", "embed_norm") and t.bias]


# -- the registry fact, probed ----------------------------------------------------------------------

PROBE = ["gpt2", "bert", "bloom", "gpt_neox", "falcon", "falcon_old", "phi", "starcoder2", "opt", "llama_bias",
         "olmo2", "phimoe"]


@pytest.mark.parametrize("name", PROBE)
def test_registry_fact_matches_a_float64_probe(tiny, name):
    """Adding c·1 to every residual-writing bias is invisible (<= 1e-12, float64) exactly when the
    registry says every reader of the stream is a centering norm; otherwise it moves the outputs."""
    src = tiny(name)
    ck = open_checkpoint(src)
    layout = ck.layout()
    names = residual_bias_names(src)
    # every layer's attention-output (and, where biased, MLP-output) bias was found
    per_layer = 2 if name not in ("llama_bias", "olmo2", "phimoe") else 1    # no MLP-output bias
    assert len(names) == per_layer * layout.num_layers + (name == "bloom"), names   # + word_embeddings_layernorm
    base = load(src)
    ref = run(base)
    shifted = with_tensors(load(src), {n: ck.read(n).astype(np.float64) + 0.7 for n in names})
    r = rel(ref, run(shifted))
    if stream_readers(layout, ck.config).centering:
        assert r <= 1e-12, r      # float64 rounding of a 2-layer forward pass (measured ~1e-15)
    else:
        assert r > 1e-3, r        # an RMSNorm / unnormalised reader sees the shift at full size


def test_registry_covers_every_family_explicitly():
    assert all(f.residual_readers_centering is not None for f in FAMILIES)


# -- --center is exact --------------------------------------------------------------------------------

CENTER = [("gpt2", True), ("gpt2", False), ("bert", True), ("bloom", True), ("gpt_neox", True), ("gpt_neox", False),
          ("falcon", True), ("phi", True), ("starcoder2", True), ("opt", True), ("opt", False)]


def _float64_plan_outputs(src, plan):
    """The source model in float64 with every planned step applied in float64 (no cast)."""
    ev = _Evaluator(open_checkpoint(src))
    return run(with_tensors(load(src), {s.out: ev.run(s) for s in plan.steps}))


@pytest.mark.parametrize("name,weights", CENTER, ids=[f"{n}-{'weights' if w else 'biases'}" for n, w in CENTER])
def test_center_is_exact(tiny, tmp_path, name, weights):
    src = tiny(name)
    res = fold_bias(src, tmp_path / "out", center=True, center_weights=weights)
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "out")
    changed = set(res.plan.changed)
    biases = set(residual_bias_names(src))
    assert biases <= changed
    if weights:
        assert len(changed) > len(biases)
    for t in ck.tensors:
        if t not in changed:
            assert ck.read_raw(t) == ck2.read_raw(t), t
    for b in biases:     # centred, up to the float32 cast of the stored values
        v = ck2.read(b).astype(np.float64)
        assert abs(v.mean()) <= 1e-6 * max(1.0, float(np.abs(v).max())), b
    # float64: the identity itself
    ref64 = run(load(src))
    assert rel(ref64, _float64_plan_outputs(src, res.plan)) <= 1e-12
    # float32 files: only fp32 rounding (each centered value is rounded once, ~6e-8 relative; a
    # 2-layer model amplifies that by far less than 100x; a non-exact change moves outputs ~1e-2)
    a, b = run(load(src, torch.float32)), run(load(tmp_path / "out", torch.float32))
    assert rel(a, b) <= 1e-5
    hist = json.loads(ck2.metadata["ckpt_surgeon"])
    op = hist["operations"][-1]
    assert op["op"] == "fold-bias" and op["params"]["center"] is True and op["params"]["center_weights"] is weights
    assert any(r.centered for r in res.plan.layers)


def test_center_with_v_fold_is_one_exact_step(tiny, tmp_path):
    src = tiny("gpt2")
    res = fold_bias(src, tmp_path / "out", k=True, v=True, center_weights=True)
    steps = [s for s in res.plan.steps if s.out.endswith("attn.c_proj.bias")]
    assert len(steps) == 2 and all(s.op == "fold_v_bias" and s.param("center") for s in steps)
    assert rel(run(load(src)), _float64_plan_outputs(src, res.plan)) <= 1e-12


def test_gguf_center_keeps_llama_cpp_logits(tiny, tmp_path):
    """GGUF -> GGUF: --center-weights on an F32 GPT-2 GGUF keeps llama.cpp's logits at fp32 rounding;
    a Q8_0 file gets its biases centered (--center) and refuses to re-quantize weights."""
    import llama_cpp
    from tests.gguf_util import write_gguf

    def logits(path, toks=(5, 17, 42, 99, 7, 123, 64, 250, 31, 8)):
        m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1,
                            type_k=0, type_v=0)     # F32 KV cache: only the model's own arithmetic differs
        m.eval(list(toks))
        out = np.array(m.scores[:len(toks)])
        m.close()
        return out

    src = write_gguf(tiny("gpt2"), tmp_path / "g.gguf", qtype="F32")
    res = fold_bias(src, tmp_path / "c.gguf", center_weights=True)
    changed = set(res.plan.changed)
    assert {f"blk.{L}.{t}.{k}" for L in range(2) for t in ("attn_output", "ffn_down") for k in ("weight", "bias")} <= changed
    assert "position_embd.weight" in changed
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "c.gguf")
    assert all(ck.read_raw(n) == ck2.read_raw(n) for n in ck.tensors if n not in changed)
    assert abs(float(ck2.read("blk.0.ffn_down.weight").astype(np.float64).mean(axis=0).max())) <= 1e-6
    a, b = logits(src), logits(tmp_path / "c.gguf")
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max())     # fp32 rounding (see test_center_is_exact)
    q = write_gguf(tiny("gpt2"), tmp_path / "q.gguf", qtype="Q8_0")
    with pytest.raises(UnsupportedError, match="Q8_0 is a block-quantized type"):
        fold_bias(q, tmp_path / "qc.gguf", center_weights=True)
    assert not (tmp_path / "qc.gguf").exists()
    res = fold_bias(q, tmp_path / "qc.gguf", center=True)
    assert sorted(res.plan.changed) == sorted(f"blk.{L}.{t}.bias" for L in range(2) for t in ("attn_output", "ffn_down"))


def test_minilm_center_weights(minilm_dir, tmp_path):
    """The real all-MiniLM-L6-v2 (post-LN BERT): centering is exact in float64 and keeps the
    sentence embeddings at fp32 rounding."""
    import transformers
    res = fold_bias(minilm_dir, tmp_path / "out", center_weights=True)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(["LayerNorm removes the mean over features.", "注意力机制把每个词映射为查询、键和值。"],
              padding=True, return_tensors="pt")

    def hidden(model):
        with torch.no_grad():
            return model(**enc).last_hidden_state

    ev = _Evaluator(open_checkpoint(minilm_dir))
    m64 = transformers.AutoModel.from_pretrained(minilm_dir, dtype=torch.float64).eval()
    ref = hidden(m64)
    new = hidden(with_tensors(m64, {s.out: ev.run(s) for s in res.plan.steps}))
    assert rel(ref, new) <= 1e-12
    a = hidden(transformers.AutoModel.from_pretrained(minilm_dir).eval())
    b = hidden(transformers.AutoModel.from_pretrained(tmp_path / "out").eval())
    assert rel(a, b) <= 1e-5      # fp32 rounding of the stored, centered tensors (see test_center_is_exact)
    # word, position and token-type tables and 6 x (attention output, MLP output) weights + biases
    assert len(res.plan.changed) == 3 + 6 * 4


def test_minilm_shares_match_the_issue(minilm_dir):
    """Trained MiniLM: the mean holds ~0.6% at most of every residual-writing bias (measured max
    0.617%, layer 5 output.dense; the others <= 0.08%); the MLP input biases, which feed GELU, hold
    3-28% of theirs (measured 3.1%..28.4%) and are reported as not removable.  No flag."""
    from ckpt_surgeon.analysis.consumers import mean_share
    rep = analyze(minilm_dir)
    rows = [b for b in rep.consumers.biases if b.role in ("o", "mlp_out")]
    assert len(rows) == 12 and all(b.consumer == "layernorm" for b in rows)
    assert max(b.removable_share for b in rows) <= 0.0065
    mlp_in = [b for b in rep.consumers.biases if b.role == "mlp_in"]
    ck = open_checkpoint(minilm_dir)
    shares = [mean_share(ck.read(b.tensor)) for b in mlp_in]
    assert len(shares) == 6 and 0.03 <= min(shares) and max(shares) <= 0.29
    assert all(b.consumer == "activation" and b.removable_share == 0.0 for b in mlp_in)
    assert rep.consumers.flags == ()
    assert all(b.removable_share == 1.0 for b in rep.consumers.biases if b.role == "k")


# -- refusals -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2", "llama_bias"])
def test_rmsnorm_models_are_refused(tiny, tmp_path, name):
    with pytest.raises(RefusedError) as ei:
        fold_bias(tiny(name), tmp_path / "out", center=True)
    assert "RMSNorm reads the residual stream" in str(ei.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key,value,reason", [
    ("_remove_final_layer_norm", True, "the output head reads the residual stream without a final LayerNorm"),
    ("do_layer_norm_before", False, "post-norm OPT: the first attention reads the summed embeddings without a norm")])
def test_opt_variants_whose_stream_is_read_unnormalised_are_refused(tiny, tmp_path, key, value, reason):
    """The same c·1 shift of every residual-writing bias and additive embedding that the tiny OPT's
    LayerNorms hide (<= 1e-12, control) moves the logits of each variant: ``_remove_final_layer_norm``
    (modeling_opt: no final_layer_norm, lm_head reads the raw stream) and ``do_layer_norm_before=False``
    (the first attention reads embeddings + positions unnormalised).  The registry's rules refuse both."""
    import transformers
    src = tiny("opt")
    ck = open_checkpoint(src)
    writers = [t for t in locate_stream_tensors(ck, ck.layout()) if t.role in ("o", "mlp_out", "embed_add")]
    names = [t.bias or t.weight for t in writers]
    assert len(names) == 2 * 2 + 1, names        # out_proj + fc2 per layer, embed_positions
    variant = tmp_path / "variant"
    cfg = transformers.AutoConfig.from_pretrained(src)
    setattr(cfg, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float64).eval()
    model.load_state_dict(load(src).state_dict(), strict=False)
    model.save_pretrained(variant)
    for path, visible in ((src, False), (variant, True)):
        m = load(path)
        ref = run(m)
        sd = m.state_dict()
        shifted = with_tensors(load(path), {n: sd[n].numpy() + 0.7 for n in names})
        r = rel(ref, run(shifted))
        assert (r > 1e-3) if visible else (r <= 1e-12), (path, r)
    with pytest.raises(RefusedError) as ei:
        fold_bias(variant, tmp_path / "o", center=True)
    assert f"opt: {reason}" in str(ei.value)
    assert not (tmp_path / "o").exists()


def test_cli_refusal_is_one_line_exit_2(tiny, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "fold-bias", str(tiny("qwen2")), "-o",
                        str(tmp_path / "o"), "--center"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "refused: --center is exact only when every reader of the residual stream" in p.stderr
    assert "qwen2: RMSNorm reads the residual stream" in p.stderr and not (tmp_path / "o").exists()


# -- shares by hand, flags, CLI -----------------------------------------------------------------------

def test_shares_equal_a_hand_computation(tiny):
    src = tiny("gpt2")
    sd = {k: v.astype(np.float64) for k, v in load_file(src / "model.safetensors").items()}
    rep = analyze(src)
    got = {(b.tensor, b.role): b for b in rep.consumers.biases}
    for L in range(2):
        for mod, role in (("attn.c_proj", "o"), ("mlp.c_proj", "mlp_out")):
            b = sd[f"h.{L}.{mod}.bias"] if f"h.{L}.{mod}.bias" in sd else sd[f"transformer.h.{L}.{mod}.bias"]
            name = next(t for t, r in got if r == role and t.endswith(f"h.{L}.{mod}.bias"))
            hand = len(b) * b.mean() ** 2 / (b ** 2).sum()
            assert got[(name, role)].consumer == "layernorm"
            assert abs(got[(name, role)].removable_share - hand) <= 1e-12 * max(hand, 1e-300)
        fc = next(v for (t, r), v in got.items() if r == "mlp_in" and f"h.{L}.mlp.c_fc" in t)
        assert fc.consumer == "activation" and fc.removable_share == 0.0
        roles = {r: v for (t, r), v in got.items() if v.layer == L}
        assert roles["k"].removable_share == 1.0 and roles["q"].removable_share == 0.0   # absolute positions
        assert roles["v"].consumer == "attention-average"
    wpe = next(v for k, v in sd.items() if k.endswith("wpe.weight"))
    hand = wpe.shape[1] * (wpe.mean(axis=1) ** 2).sum() / (wpe ** 2).sum()
    pos = next(v for (t, r), v in got.items() if r == "embed_add")
    assert abs(pos.removable_share - hand) <= 1e-12 * hand
    wte = next(v for (t, r), v in got.items() if r == "embed_token")
    assert wte.consumer == "head" and wte.removable_share == 0.0        # tied to lm_head
    # Phi-2: key bias share = energy in the pass-through dims (8..15 of each 16-dim head)
    src = tiny("phi")
    sdp = load_file(src / "model.safetensors")
    rep = analyze(src)
    for L in range(2):
        bk = next(v for k, v in sdp.items() if k.endswith(f"layers.{L}.self_attn.k_proj.bias")).astype(np.float64)
        hand = (bk.reshape(-1, 16)[:, 8:] ** 2).sum() / (bk ** 2).sum()
        row = next(b for b in rep.consumers.biases if b.role == "k" and b.layer == L)
        assert abs(row.removable_share - hand) <= 1e-12
    # RMSNorm: the o bias is read by RMSNorm, nothing removable
    rep = analyze(tiny("llama_bias"))
    o = [b for b in rep.consumers.biases if b.role == "o"]
    assert len(o) == 2 and all(b.consumer == "rmsnorm" and b.removable_share == 0.0 for b in o)


def test_mean_heavy_residual_bias_is_flagged(tiny, tmp_path):
    src = tiny("gpt2")
    dst = tmp_path / "shifted"
    shutil.copytree(src, dst)
    sd = load_file(dst / "model.safetensors")
    key = next(k for k in sd if k.endswith("h.1.mlp.c_proj.bias"))
    sd[key] = sd[key] + np.float32(0.5)          # a shifted tensor, as a bad merge would leave it
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    assert analyze(src).consumers.flags == ()
    flags = analyze(dst).consumers.flags
    assert len(flags) == 1 and flags[0].startswith(f"mean-heavy-residual-bias: layer 1 {key}")


def test_cli_analyze_by_bias_and_fold_center(tiny, tmp_path):
    runner = CliRunner()
    src = str(tiny("bloom"))
    r = runner.invoke(cli, ["analyze", src, "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["bias_consumers"]["residual_readers"]["centering"] is True
    assert {b["consumer"] for b in d["bias_consumers"]["biases"]} >= {"softmax", "layernorm", "activation"}
    r = runner.invoke(cli, ["analyze", src, "--by-bias", "--format", "csv"])
    assert r.exit_code == 0 and r.stdout.splitlines()[0].startswith("layer,role,consumer,l2,mean,removable")
    r = runner.invoke(cli, ["fold-bias", src, "-o", str(tmp_path / "dry"), "--center-weights", "--dry-run",
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["params"]["center_weights"] is True and not (tmp_path / "dry").exists()
    r = runner.invoke(cli, ["fold-bias", "--help"])
    assert "--center" in r.output and "--center-weights" in r.output
