"""fold-bias on every fixture family, real transformers forward passes, the real MiniLM model, CLI."""
from __future__ import annotations

import hashlib
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

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import RefusedError
from ckpt_surgeon.surgery.fold import fold_bias, plan_fold_bias

REPO = Path(__file__).resolve().parent.parent


def digest(path) -> dict:
    path = Path(path)
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def load(path):
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(path)
    cls = transformers.AutoModel if cfg.model_type == "bert" else transformers.AutoModelForCausalLM
    return cls.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()


IDS = torch.tensor([[5, 17, 42, 99, 7, 123, 64, 250, 31, 8, 77, 150, 201, 12, 90, 33, 44, 310, 18, 26]])


def outputs(model):
    with torch.no_grad():
        out = model(IDS)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def greedy(model, n=8):
    if not hasattr(model, "generate") or not model.can_generate():
        return None
    with torch.no_grad():
        return model.generate(IDS[:, :6], max_new_tokens=n, do_sample=False, min_new_tokens=n).tolist()


def assert_same_model(src, out):
    a, b = load(src), load(out)
    x, y = outputs(a), outputs(b)
    scale = float(x.abs().max())
    # fp32 noise: the fold moves additions around (b_v through W_o, a constant shift inside
    # softmax); each float32 op rounds at 6e-8 relative and a 2-layer model chains a few hundred
    # of them, so 1e-5 of the output scale is a generous bound that still catches any real change
    # (a dropped rotated bias moves Qwen2 logits by ~1e-1).
    assert float((x - y).abs().max()) <= 1e-5 * max(1.0, scale)
    assert greedy(a) == greedy(b)


EXACT = [
    ("bert", True, True), ("gpt2", True, True), ("bloom", True, True), ("gpt_neox", True, True),
    ("phi", True, True), ("falcon", False, True), ("falcon_mq", False, True), ("falcon_old", False, True),
    ("llama_bias", False, True), ("starcoder2", False, True), ("qwen3", False, True), ("gemma3", False, True),
    ("olmo2", False, True),
]


@pytest.mark.parametrize("name,k,v", EXACT, ids=[e[0] for e in EXACT])
def test_exact_folds_keep_outputs(tiny, tmp_path, name, k, v):
    src = tiny(name)
    before = digest(src)
    res = fold_bias(src, tmp_path / "out", k=k, v=v)
    assert digest(src) == before
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "out")
    layout = ck.layout()
    # the biases really changed: k part / v part zero, output bias moved
    assert len(layout.layers) == len(res.plan.layers) == 2
    for lt, rec in zip(layout.layers, res.plan.layers):
        if v:
            assert rec.v_folded and not np.array_equal(ck.read(lt.o_bias), ck2.read(lt.o_bias))
        if k:
            assert rec.k_removed > 0
    changed = set(res.plan.changed)
    for t in ck.tensors:
        if t not in changed:
            assert ck.read_raw(t) == ck2.read_raw(t), t
    assert_same_model(src, tmp_path / "out")
    # and the project's own verdict: `verify` (transformers, both models, its default thresholds)
    from ckpt_surgeon.verification import default_prompts, verify
    rep = verify(src, tmp_path / "out", device="cpu", prompts=default_prompts()[:3], max_new_tokens=6)
    assert rep.passed, rep.summary_items()


REFUSED = [
    ("qwen2", dict(k=True), "the key bias is not exactly removable in qwen2"),
    ("qwen2", dict(v=True), "has no bias in qwen2"),
    ("falcon", dict(k=True), "the key bias is not exactly removable in falcon"),
    ("qwen3", dict(k=True), "the key bias is not removable in qwen3 (a norm follows the projection"),
    ("gemma3", dict(k=True), "the key bias is not removable in gemma3"),
    ("olmo2", dict(k=True), "the key bias is not removable in olmo2"),
    ("llama", dict(k=True), "has no key bias in any layer"),
    ("phi3", dict(v=True), "has no value bias in any layer"),
]


@pytest.mark.parametrize("name,kw,msg", REFUSED, ids=[f"{r[0]}-{'k' if 'k' in r[1] else 'v'}" for r in REFUSED])
def test_refusals(tiny, tmp_path, name, kw, msg):
    with pytest.raises(RefusedError) as ei:
        fold_bias(tiny(name), tmp_path / "out", **kw)
    assert msg in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_qwen2_refusal_message_is_exact(tiny):
    """The refusal names every layer with the analyzer's own numbers (computed independently here)."""
    from ckpt_surgeon.analysis.redundancy import analyze_checkpoint
    src = tiny("qwen2")
    ck = open_checkpoint(src)
    rep = analyze_checkpoint(ck)
    parts = [f"layer {lr.layer}: |b_k| {lr.k_bias_l2:.4g}, near-redundant energy {lr.near_fraction:.1%} (angle < 0.1 rad "
             f"over 256 positions), removing it all could move a logit by up to {lr.bound_all:.3g}" for lr in rep.layers]
    expected = (f"{src}: refused: the key bias is not exactly removable in qwen2: RoPE rotates every dimension after "
                f"the biased projection (k = rope(W_k x + b_k)), so its logit term depends on the distance between "
                f"tokens ({'; '.join(parts)}); pass --approximate --max-logit-change X to remove only the near-redundant "
                f"frequency pairs whose summed bound stays <= X")
    with pytest.raises(RefusedError) as ei:
        plan_fold_bias(ck, k=True)
    assert str(ei.value) == expected


def _attention_inputs(model, ids):
    """Per layer: the attention module's (hidden_states, (cos, sin)) on ``ids`` (forward pre-hooks)."""
    seen = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def pre(mod, args, kwargs, i=i):
            seen[i] = (kwargs["hidden_states"].detach(), tuple(t.detach() for t in kwargs["position_embeddings"]))
        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return seen


def _logit_spread(attn_ref, attn_cand, x, cos, sin):
    """max over query rows of (max - min over its keys) of the change in attention logits when the
    candidate's projections replace the reference's, on the same input (float64, causal rows)."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb
    d = attn_ref.head_dim
    x = x.double()

    def logits(attn):
        q = torch.nn.functional.linear(x, attn.q_proj.weight.double(), attn.q_proj.bias.double())
        k = torch.nn.functional.linear(x, attn.k_proj.weight.double(), attn.k_proj.bias.double())
        q = q.view(1, -1, q.shape[-1] // d, d).transpose(1, 2)
        k = k.view(1, -1, k.shape[-1] // d, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return (q @ k.transpose(-1, -2)) * attn.scaling

    with torch.no_grad():
        delta = logits(attn_cand) - logits(attn_ref)
    n = delta.shape[-1]
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    hi = delta.masked_fill(~causal, -float("inf")).amax(-1)
    lo = delta.masked_fill(~causal, float("inf")).amin(-1)
    return float((hi - lo).max())


@pytest.mark.parametrize("name,budget,pairs", [("qwen2", 0.05, "near"), ("qwen2", 1.0, "any"), ("qwen2_long", 0.05, "any")])
def test_approximate_stays_within_the_requested_bound(tiny, tmp_path, name, budget, pairs):
    src = tiny(name)
    res = fold_bias(src, tmp_path / "out", k=True, approximate=True, max_logit_change=budget, pairs=pairs)
    assert res.plan.params["max_logit_change"] == budget
    removed = sum(r.k_removed for r in res.plan.layers)
    assert removed > 0                                  # the test measures a real removal
    ref, cand = load(src), load(tmp_path / "out")
    ids = torch.randint(3, 400, (1, 256), generator=torch.Generator().manual_seed(0))   # the whole context (L = 256 positions) ...
    if name == "qwen2_long":
        ids = ids[:, :256]                                                                  # ... a window of it for the long model
    inputs = _attention_inputs(ref, ids)
    for i, rec in enumerate(res.plan.layers):
        x, (cos, sin) = inputs[i]
        spread = _logit_spread(ref.model.layers[i].self_attn, cand.model.layers[i].self_attn, x, cos, sin)
        assert rec.k_bound is not None and rec.k_bound <= budget
        # measured <= the analyzer's bound for what was removed (<= the budget); float64, so no slack needed
        # beyond 1e-9 for summation order
        assert spread <= rec.k_bound + 1e-9, (i, spread, rec.k_bound)
    # and the check is not vacuous: removing the whole key bias moves the logits far beyond the budget
    if budget < 1:
        whole = load(src)
        for layer in whole.model.layers:
            layer.self_attn.k_proj.bias.data.zero_()
        x, (cos, sin) = inputs[0]
        assert _logit_spread(ref.model.layers[0].self_attn, whole.model.layers[0].self_attn, x, cos, sin) > 10 * budget


def test_minilm_fold_k_v_keeps_embeddings(minilm_dir, tmp_path):
    """Real all-MiniLM-L6-v2: fold --k --v, sentence embeddings equal within 1e-5 (relative)."""
    import transformers
    before = digest(minilm_dir)
    res = fold_bias(minilm_dir, tmp_path / "out", k=True, v=True)
    assert digest(minilm_dir) == before
    assert (tmp_path / "out" / "1_Pooling" / "config.json").is_file()     # sentence-transformers side files kept
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    texts = ["The key bias is redundant without rotary embeddings.", "注意力机制把每个词映射为查询、键和值。",
             "def f(x):\n    return x + 1", "A much longer sentence " * 10]
    enc = tok(texts, padding=True, truncation=True, return_tensors="pt")

    def embed(path):
        m = transformers.AutoModel.from_pretrained(path).eval()
        with torch.no_grad():
            h = m(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        e = (h * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(e, dim=-1)

    a, b = embed(minilm_dir), embed(tmp_path / "out")
    rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
    assert rel <= 1e-5, rel
    assert all(r.k_removed == r.k_total for r in res.plan.layers)


def test_bf16_fold_casts_once(tiny, tmp_path):
    """A bf16 checkpoint: b_o' = RNE_bf16(b_o + W_o·b_v) computed in float64 from the stored values."""
    import transformers
    src = tmp_path / "bf16"
    m = transformers.AutoModelForCausalLM.from_pretrained(tiny("gpt2"), dtype=torch.bfloat16)
    m.save_pretrained(src)
    shutil.copy(tiny("gpt2") / "tokenizer.json", src / "tokenizer.json")
    fold_bias(src, tmp_path / "out", k=True, v=True)
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "out")
    assert ck2.tensors["transformer.h.0.attn.c_proj.bias"].dtype == "BF16"
    w = ck.read("transformer.h.0.attn.c_proj.weight").astype(np.float64)      # Conv1D [in, out]
    qkv_b = ck.read("transformer.h.0.attn.c_attn.bias").astype(np.float64)
    b_o = ck.read("transformer.h.0.attn.c_proj.bias").astype(np.float64)
    expected = b_o + qkv_b[128:192] @ w
    from tests.test_writer import _bf16_rne
    got = np.frombuffer(ck2.read_raw("transformer.h.0.attn.c_proj.bias"), dtype="<u2").tolist()
    assert got == [_bf16_rne(float(x)) for x in expected]
    assert (ck2.read("transformer.h.0.attn.c_attn.bias")[64:] == 0).all()
    assert ck2.read_raw("transformer.h.0.attn.c_attn.weight") == ck.read_raw("transformer.h.0.attn.c_attn.weight")


def _falcon_alibi(tmp_path, zero_rest: bool):
    import transformers
    cfg = transformers.FalconConfig(vocab_size=448, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    alibi=True, bias=True, new_decoder_architecture=False, multi_query=False,
                                    parallel_attn=False, ffn_hidden_size=128)
    torch.manual_seed(0)
    m = transformers.FalconForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    for name, p in m.named_parameters():
        if name.endswith(".bias"):
            p.data = torch.randn(p.shape, generator=g) * 0.5
            if zero_rest and "query_key_value" not in name:
                p.data.zero_()
    for layer in m.transformer.h:       # only the key rows of the fused bias stay non-zero
        b = layer.self_attention.query_key_value.bias.data.view(4, 3, 16)
        if zero_rest:
            b[:, 0] = 0
            b[:, 2] = 0
    d = tmp_path / ("falcon_alibi" + ("_k_only" if zero_rest else ""))
    m.save_pretrained(d)
    return d


def test_delete_where_the_switch_controls_only_zero_biases(tmp_path):
    src = _falcon_alibi(tmp_path, zero_rest=True)
    res = fold_bias(src, tmp_path / "out", k=True, delete=True)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["bias"] is False and res.plan.config_changes == (("bias", True, False),)
    assert not [t for t in open_checkpoint(tmp_path / "out").tensors if t.endswith(".bias") and "ln" not in t
                and "layernorm" not in t]
    assert_same_model(src, tmp_path / "out")


def test_delete_refusals(tiny, tmp_path):
    with pytest.raises(RefusedError, match="has no config switch that removes its attention biases"):
        fold_bias(tiny("gpt2"), tmp_path / "o1", k=True, delete=True)
    with pytest.raises(RefusedError, match=r"tensor 'model.layers.0.self_attn.q_proj.bias': refused: --delete needs every bias"):
        fold_bias(tiny("llama_bias"), tmp_path / "o2", v=True, delete=True)
    src = _falcon_alibi(tmp_path, zero_rest=False)
    with pytest.raises(RefusedError, match="the query bias multiplies the keys and is never removable"):
        fold_bias(src, tmp_path / "o3", k=True, v=True, delete=True)
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_sharded_source_keeps_its_shards(tiny, tmp_path):
    src = tiny("qwen2_sharded")
    res = fold_bias(src, tmp_path / "out", k=True, approximate=True, max_logit_change=0.05)
    assert sorted(p.name for p in src.glob("*.safetensors")) == sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    idx_in = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    idx_out = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())["weight_map"]
    assert idx_in == idx_out
    assert {s.mode for s in res.write.shards} == {"patch"}
    meta = json.loads(open_checkpoint(tmp_path / "out").metadata["ckpt_surgeon"])
    op = meta["operations"][-1]
    assert op["op"] == "fold-bias" and op["params"]["approximate"] is True and op["params"]["max_logit_change"] == 0.05


def test_cli_fold_bias(tiny, tmp_path):
    runner = CliRunner()
    src = str(tiny("gpt2"))
    r = runner.invoke(cli, ["fold-bias", src, "-o", str(tmp_path / "out"), "--k", "--v", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["operation"] == "fold-bias" and d["params"]["k"] and d["params"]["v"]
    assert d["write"]["source_hash"].startswith("sha256:") and d["write"]["hash_scope"] == "full"
    assert [row["k_removed"] for row in d["layers"]] == [64, 64]
    r = runner.invoke(cli, ["fold-bias", src, "-o", str(tmp_path / "out"), "--k"])
    assert r.exit_code == 2 and r.stderr == f"error: {tmp_path / 'out'}: already exists; pass --force to replace it\n"
    r = runner.invoke(cli, ["fold-bias", src, "-o", str(tmp_path / "dry"), "--k", "--dry-run"])
    assert r.exit_code == 0 and not (tmp_path / "dry").exists()
    r = runner.invoke(cli, ["fold-bias", src, "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "nothing to do: pass --k" in r.stderr
    r = runner.invoke(cli, ["fold-bias", "--help"])
    assert r.exit_code == 0 and "--max-logit-change" in r.output and "--delete" in r.output


def test_cli_subprocess_exit_codes(tiny, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = lambda *a: subprocess.run([sys.executable, "-m", "ckpt_surgeon", *a], env=env, capture_output=True, text=True)
    p = run("fold-bias", str(tiny("qwen2")), "-o", str(tmp_path / "o"), "--k")
    assert p.returncode == 2 and p.stderr.startswith(f"error: {tiny('qwen2')}: refused: the key bias is not exactly removable")
    assert p.stderr.count("\n") == 1 and not (tmp_path / "o").exists()
    p = run("fold-bias", str(tiny("qwen2")), "-o", str(tmp_path / "o"), "--k", "--approximate", "--max-logit-change", "0.05")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o" / "model.safetensors").is_file()


# -- GGUF -> GGUF ---------------------------------------------------------------------------------

def _llama_logits(path, toks=(5, 17, 42, 99, 7, 123, 64, 250, 31, 8)):
    """llama.cpp's logits for every position; F32 KV cache so that only the model's own arithmetic
    differs (the default F16 cache rounds k and v, which the fold legitimately changes)."""
    import llama_cpp
    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1,
                        type_k=0, type_v=0)
    m.eval(list(toks))
    out = np.array(m.scores[:len(toks)])
    m.close()
    return out


def test_gguf_fold_keeps_llama_cpp_logits_and_every_untouched_byte(tiny, tmp_path):
    from ckpt_surgeon.formats import gguf as gg
    from tests.gguf_util import write_gguf
    src = write_gguf(tiny("gpt2"), tmp_path / "g.gguf", qtype="F32")
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    res = fold_bias(src, tmp_path / "folded.gguf", k=True, v=True)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    ha, hb = gg.read_header(src), gg.read_header(tmp_path / "folded.gguf")
    # every metadata key with its type and value, plus the history key
    assert set(hb.fields) == set(ha.fields) | {"ckpt_surgeon.history"}
    for key, f in ha.fields.items():
        assert hb.fields[key].type == f.type and hb.metadata[key] == ha.metadata[key], key
    hist = json.loads(hb.metadata["ckpt_surgeon.history"])
    assert hist["operations"][0]["op"] == "fold-bias" and hist["source"]["hash_scope"] == "full"
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "folded.gguf")
    assert list(ck.tensors) == list(ck2.tensors)
    for name, info in ck.tensors.items():
        assert ck2.tensors[name].dtype == info.dtype and ck2.tensors[name].shape == info.shape
        if name not in res.plan.changed:
            assert ck2.read_raw(name) == ck.read_raw(name)
    assert sorted(res.plan.changed) == ["blk.0.attn_output.bias", "blk.0.attn_qkv.bias", "blk.1.attn_output.bias",
                                        "blk.1.attn_qkv.bias"]
    a, b = _llama_logits(src), _llama_logits(tmp_path / "folded.gguf")
    # fp32 noise in llama.cpp's CPU kernels (see assert_same_model for the budget)
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max())


def test_gguf_quantized_weights_keep_type_and_bytes(tiny, tmp_path):
    from tests.gguf_util import write_gguf
    src = write_gguf(tiny("gpt2"), tmp_path / "q.gguf", qtype="Q8_0")
    res = fold_bias(src, tmp_path / "out.gguf", k=True, v=True)
    ck, ck2 = open_checkpoint(src), open_checkpoint(tmp_path / "out.gguf")
    quant = [n for n, i in ck.tensors.items() if i.dtype == "Q8_0"]
    assert quant and all(ck2.tensors[n].dtype == "Q8_0" and ck2.read_raw(n) == ck.read_raw(n) for n in quant)
    assert all(ck2.tensors[n].dtype == "F32" for n in res.plan.changed)          # biases are F32 in GGUF
    a, b = _llama_logits(src), _llama_logits(tmp_path / "out.gguf")
    f32 = _llama_logits(write_gguf(tiny("gpt2"), tmp_path / "f.gguf", qtype="F32"))
    # Q8_0 matmuls quantize their *input activations* to 8 bits per block, and the fold changes
    # those inputs (b_v no longer flows through W_o), so logits move by quantization noise.  That
    # noise is measured here as the Q8_0 model's distance from the F32 one: the fold may move
    # logits by at most twice it (measured: 0.005 vs 0.006; a wrong fold moves them by ~0.5).
    assert np.abs(a - b).max() <= 2 * np.abs(a - f32).max()


def test_gguf_refusals_and_approximate(tiny, tmp_path, smollm_gguf):
    from tests.gguf_util import write_gguf
    with pytest.raises(RefusedError, match="has no key bias in any layer"):
        fold_bias(smollm_gguf, tmp_path / "s.gguf", k=True)
    src = write_gguf(tiny("qwen2"), tmp_path / "qw.gguf", qtype="F32")
    with pytest.raises(RefusedError, match="the key bias is not exactly removable in qwen2"):
        fold_bias(src, tmp_path / "o.gguf", k=True)
    with pytest.raises(RefusedError, match="--delete is not supported for GGUF"):
        fold_bias(src, tmp_path / "o.gguf", k=True, approximate=True, max_logit_change=0.05, delete=True)
    res = fold_bias(src, tmp_path / "o.gguf", k=True, approximate=True, max_logit_change=0.05)
    assert sum(r.k_removed for r in res.plan.layers) > 0
    a, b = _llama_logits(src), _llama_logits(tmp_path / "o.gguf")
    assert 0 < np.abs(a - b).max() < 0.05        # a real but small change (attention-logit budget 0.05 per layer)


def test_single_safetensors_file_source(tiny, tmp_path):
    """A bare .safetensors file: OUT may be a file (tensors only) or a folder (config.json from beside the source)."""
    src = tiny("bert") / "model.safetensors"
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    res = fold_bias(src, tmp_path / "o.safetensors", k=True, v=True)
    assert (tmp_path / "o.safetensors").is_file() and res.write.shards[0].mode == "patch"
    fold_bias(src, tmp_path / "folder", k=True, v=True)
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["config.json", "model.safetensors"]
    a, b = open_checkpoint(tmp_path / "o.safetensors"), open_checkpoint(tmp_path / "folder")
    assert all(a.read_raw(n) == b.read_raw(n) for n in a.tensors)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    shutil.copy(tiny("bert") / "tokenizer.json", tmp_path / "folder")
    assert_same_model(tiny("bert"), tmp_path / "folder")


def test_dry_run_says_nothing_written_in_the_present_tense(tiny, tmp_path):
    """issue 24: --dry-run printed the past-tense notes of a real run and no "nothing written"."""
    out = tmp_path / "never"
    res = CliRunner().invoke(cli, ["fold-bias", str(tiny("gpt2")), "-o", str(out), "--k", "--v", "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = [line.rstrip() for line in res.stdout.splitlines()]
    assert lines[0] == "ckpt-surgeon fold-bias (dry run: nothing written)"
    assert "dry run                     nothing written" in lines
    assert "tensors a run would change  4" in lines
    assert [line for line in lines if line.startswith("note: ")] == [
        "note: key bias: no rotary (absolute positions), so q·b_k is constant over the keys and softmax ignores it: "
        "it is removed exactly",
        "note: the value bias is folded into the output bias (b_o' = b_o + W_o·b_v): exact, attention rows sum to 1",
        "note: folded biases are zeroed, not deleted (stock loaders expect the tensors); --delete drops them where "
        "the architecture has a switch for it"]
    assert not out.exists()
    js = CliRunner().invoke(cli, ["fold-bias", str(tiny("gpt2")), "-o", str(out), "--k", "--dry-run",
                                  "--format", "json"])
    assert js.exit_code == 0 and js.stderr == "dry run: nothing written\n" and not out.exists()
    assert json.loads(js.stdout)["outcome"] is None


def test_approximate_that_removes_nothing_says_so_and_why(tiny, tmp_path):
    """issue 24: following the refusal's advice without --context on a long-context model exited 0
    with "removed the near-redundant rotary pairs ... largest bound used: 0" and 0 tensors changed."""
    d = shutil.copytree(tiny("qwen2"), tmp_path / "long")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 1_000_000       # at such a window no rotary pair turns < 0.1 rad
    (d / "config.json").write_text(json.dumps(cfg))
    why = ("nothing removed: no rotary pair turns less than epsilon 0.1 rad over 1000000 positions (config max "
           "positions), so no pair qualifies as near-redundant; pass --context L with the window you run (e.g. "
           "--context 4096), a larger --epsilon, or --pairs any")
    res = CliRunner().invoke(cli, ["fold-bias", str(d), "-o", str(tmp_path / "o"), "--k", "--approximate",
                                   "--max-logit-change", "0.05"])
    assert res.exit_code == 0, res.output
    summary = {line[:30].strip(): line[30:].strip() for line in res.stdout.splitlines()[1:12]}
    assert summary["result"] == why and summary["tensors changed"] == "0"
    assert "removed the" not in res.stdout and "largest bound used" not in res.stdout
    assert "zeroed, not deleted" not in res.stdout
    # with --context the same command removes pairs
    ok = fold_bias(d, tmp_path / "o2", k=True, approximate=True, max_logit_change=0.05, context=64)
    assert ok.plan.outcome is None and ok.plan.changed
    assert any(n.startswith("--approximate: ") and " are removed " in n for n in ok.plan.notes)
    # a budget below every pair's cost: the other reason, with the cheapest pair's bound
    plan = plan_fold_bias(open_checkpoint(tiny("qwen2")), k=True, approximate=True, max_logit_change=0.0)
    assert plan.outcome.startswith("nothing removed: no rotary pair fits the budget --max-logit-change 0 (the "
                                   "cheapest single pair needs ") and not plan.changed
