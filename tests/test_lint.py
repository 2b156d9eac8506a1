"""``lint``: one test per documented check (docs/lint.md), each building a checkpoint with exactly
that defect (real safetensors / GGUF files in tmp_path) and asserting the finding; clean
fixtures and the real all-MiniLM-L6-v2 show no error."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.analysis.lint import CHECKS, lint
from ckpt_surgeon.arch.layouts import llama_permute_index, llama_unpermute_index
from ckpt_surgeon.cli import cli
from ckpt_surgeon.tiny import tiny_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_util import rewrite_gguf, write_gguf  # noqa: E402
from hubenv import hub  # noqa: E402,F401  (the local Hub fixture)


def _copy(src: Path, dst: Path, *, config: dict | None = None, tensors: dict | None = None) -> Path:
    """Copy an HF folder; ``config`` entries overwrite config.json keys (None deletes one);
    ``tensors``: name -> fn(array) -> array | None (None drops the tensor)."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        for k, v in config.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        data = load_file(str(dst / "model.safetensors"))
        for name, fn in tensors.items():
            got = fn(data[name])
            if got is None:
                del data[name]
            else:
                data[name] = got
        save_file(data, str(dst / "model.safetensors"))
    return dst


def _find(rep, check: str):
    return [f for f in rep.findings if f.check == check]


def _cfg(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


# ------------------------------------------------------------------ clean inputs


@pytest.mark.parametrize("name", tiny_names())
def test_clean_fixtures_have_no_errors(tiny, name):
    rep = lint(tiny(name), scan=True)
    assert rep.passed, rep.findings
    assert "nonfinite" in rep.checks and rep.scanned
    # Gemma stores norm weights as gamma - 1 (registry norm_weight_offset): zeros there are gamma = 1
    assert not _find(rep, "all-zero"), rep.findings
    # the fixtures give every bias random values, so the non-rotary families' key biases are flagged
    # (a trained model's are ~0: see test_clean_gguf_and_real_minilm); nothing else warns
    assert {f.check for f in rep.findings} <= {"key-bias-nonrotary"}


def test_clean_gguf_and_real_minilm(tiny, tmp_path, minilm_dir):
    rep = lint(write_gguf(tiny("llama"), tmp_path / "l.gguf"))
    assert rep.passed and not _find(rep, "qk-permutation"), rep.findings
    real = lint(minilm_dir)
    assert real.passed and not _find(real, "key-bias-nonrotary"), real.findings


def test_loads_cleanly_catches_a_folder_transformers_loads_with_random_weights(tiny, tmp_path):
    """issue 24: after `qkv fuse`, Qwen2ForCausalLM finds 12 weights missing (initialised at random)
    and 4 tensors it drops; lint said "no problems found".  The key sets and ignore rules are
    transformers' own, and its from_pretrained agrees tensor for tensor."""
    import transformers

    from ckpt_surgeon.surgery.qkv import qkv_fuse, qkv_split
    qkv_fuse(tiny("qwen2"), tmp_path / "q-fused")
    rep = lint(tmp_path / "q-fused")
    found = _find(rep, "loads-cleanly")
    cfg = str(tmp_path / "q-fused" / "config.json")
    assert [(f.severity, f.file, f.tensor, f.message) for f in found] == [
        ("error", cfg, "model.layers.0.self_attn.k_proj.bias",
         "Qwen2ForCausalLM (config.json architectures) has 12 weight(s) this checkpoint does not hold "
         "(model.layers.0.self_attn.k_proj.bias, model.layers.0.self_attn.k_proj.weight, "
         "model.layers.0.self_attn.q_proj.bias, model.layers.0.self_attn.q_proj.weight ... (12 in all)): "
         "transformers initialises them at random when it loads it, with only a warning"),
        ("error", str(tmp_path / "q-fused" / "model.safetensors"), "model.layers.0.self_attn.qkv_proj.bias",
         "4 tensor(s) have no place in Qwen2ForCausalLM (model.layers.0.self_attn.qkv_proj.bias, "
         "model.layers.0.self_attn.qkv_proj.weight, model.layers.1.self_attn.qkv_proj.bias, "
         "model.layers.1.self_attn.qkv_proj.weight): transformers drops them when it loads this checkpoint")]
    _, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q-fused", output_loading_info=True)
    assert len(info["missing_keys"]) == 12 and len(info["unexpected_keys"]) == 4
    res = CliRunner().invoke(cli, ["lint", str(tmp_path / "q-fused")])
    assert res.exit_code == 1 and "no problems found" not in res.output
    qkv_split(tmp_path / "q-fused", tmp_path / "split")
    assert not _find(lint(tmp_path / "split"), "loads-cleanly")
    # transformers' own ignore rules: a GPT-2 checkpoint's saved causal-mask buffers and a tied
    # lm_head absent are not findings (see test_clean_fixtures_have_no_errors for every family)
    assert "loads-cleanly" in lint(tiny("gpt2")).checks and lint(tiny("gpt2")).passed


def test_loads_cleanly_unexpected_and_missing_keys_one_each(tiny, tmp_path):
    """A renamed tensor is both: the model's key missing, the file's name unexpected."""
    from safetensors.numpy import load_file, save_file
    d = shutil.copytree(tiny("llama"), tmp_path / "renamed")
    st = load_file(str(d / "model.safetensors"))
    st["model.layers.1.mlp.up_projection.weight"] = st.pop("model.layers.1.mlp.up_proj.weight")
    save_file(st, str(d / "model.safetensors"))
    found = _find(lint(d), "loads-cleanly")
    assert [(f.tensor, f.message.split(":")[0]) for f in found] == [
        ("model.layers.1.mlp.up_proj.weight",
         "LlamaForCausalLM (config.json architectures) has 1 weight(s) this checkpoint does not hold "
         "(model.layers.1.mlp.up_proj.weight)"),
        ("model.layers.1.mlp.up_projection.weight",
         "1 tensor(s) have no place in LlamaForCausalLM (model.layers.1.mlp.up_projection.weight)")]


def test_every_documented_check_is_in_docs():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "lint.md").read_text()
    for c in CHECKS:
        assert f"`{c.id}`" in doc, c.id


# ------------------------------------------------------------------ one test per check


def test_config_shapes(tiny, tmp_path):
    src = tiny("qwen2")
    kv = _cfg(src)["num_key_value_heads"]
    bad = _copy(src, tmp_path / "kv", config={"num_key_value_heads": kv + 1})
    f = _find(lint(bad), "config-shapes")
    assert f and f[0].severity == "error" and f[0].tensor == "model.layers.0.self_attn.k_proj.weight"
    assert f[0].file == str(bad / "config.json") and "kv heads" in f[0].message
    n = _cfg(src)["num_hidden_layers"]
    more = _copy(src, tmp_path / "layers", config={"num_hidden_layers": n + 1})
    f = _find(lint(more), "config-shapes")
    assert f and f[0].message == (f"the config declares {n + 1} layers but layer(s) [{n}] hold no attention weights")


def test_head_dim(tiny, tmp_path):
    src = tiny("qwen3")
    hd = _cfg(src)["head_dim"]
    bad = _copy(src, tmp_path / "hd", config={"head_dim": hd // 2})
    rep = lint(bad)
    f = _find(rep, "head-dim")
    assert f and f[0].severity == "error" and f[0].fix == f"set head_dim = {hd}"
    assert not _find(rep, "config-shapes")         # diagnosed as head_dim, and the other checks still ran
    # GGUF: attention.key_length says another head size than the tensors
    g = write_gguf(src, tmp_path / "q3.gguf")
    gb = rewrite_gguf(g, tmp_path / "q3-bad.gguf", set_kv={"qwen3.attention.key_length": hd // 2})
    f = _find(lint(gb), "head-dim")
    assert f and f[0].fix == f"set qwen3.attention.key_length = {hd}"


def test_qkv_bias(tiny, tmp_path):
    g = write_gguf(tiny("qwen2"), tmp_path / "q.gguf")
    dropped = rewrite_gguf(g, tmp_path / "dropped.gguf",
                            tensors=lambda n, a: None if n == "blk.1.attn_q.bias" else a)
    f = _find(lint(dropped), "qkv-bias")
    assert [x.message for x in f] == ["the q bias exists in layer(s) [0] but not in [1]: a conversion dropped "
                                      "some of them"]
    flag_lost = _copy(tiny("llama_bias"), tmp_path / "nf", config={"attention_bias": False})
    f = _find(lint(flag_lost), "qkv-bias")
    assert f and f[0].tensor == "model.layers.0.self_attn.q_proj.bias"
    assert f[0].fix == "set attention_bias: true in config.json"
    flag_only = _copy(tiny("llama"), tmp_path / "fo", config={"attention_bias": True})
    f = _find(lint(flag_only), "qkv-bias")
    assert f and "no q/k/v bias tensors exist" in f[0].message


def test_rope_freq_base(tiny, tmp_path):
    g = write_gguf(tiny("qwen2"), tmp_path / "q.gguf")
    bad = rewrite_gguf(g, tmp_path / "nofreq.gguf", drop=("qwen2.rope.freq_base",))
    rep = lint(bad)
    f = _find(rep, "rope-freq-base")
    assert f and f[0].severity == "warning" and f[0].file == str(bad)
    assert rep.passed          # a warning: exit 0
    assert not _find(lint(g), "rope-freq-base")


def _pair_structured_llama(tiny, tmp_path) -> Path:
    """Tiny llama whose Q/K rows have the norm structure of a trained RoPE model: row norms grow
    with the rotary frequency index (both rows of a rotate_half pair (j, j + d/2) alike, 1x .. 8x)."""
    src = tiny("llama")
    cfg = _cfg(src)
    h = cfg["num_attention_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // h
    scale = np.tile(np.geomspace(1, 8, d // 2), 2)            # pair j: rows j and j + d/2

    def shape_rows(w):
        return (w.reshape(-1, d, w.shape[-1]) * scale[None, :, None]).reshape(w.shape).astype(w.dtype)
    names = {f"model.layers.{i}.self_attn.{p}_proj.weight": shape_rows
             for i in range(cfg["num_hidden_layers"]) for p in ("q", "k")}
    return _copy(src, tmp_path / "structured", tensors=names)


def test_qk_permutation(tiny, tmp_path):
    hf = _pair_structured_llama(tiny, tmp_path)
    assert not _find(lint(hf), "qk-permutation")
    g = write_gguf(hf, tmp_path / "ok.gguf")                   # the reference writer permutes Q/K
    assert not _find(lint(g), "qk-permutation")
    cfg = _cfg(hf)
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // h

    def unpermute(n, a):
        if n.endswith("attn_q.weight"):
            return a[llama_unpermute_index(h, d)]
        return a[llama_unpermute_index(kv, d)] if n.endswith("attn_k.weight") else a
    # a converter that forgot the permutation: Q/K rows in HF order inside a llama GGUF
    unperm = rewrite_gguf(g, tmp_path / "unpermuted.gguf", tensors=unpermute)
    f = _find(lint(unperm), "qk-permutation")
    assert f and f[0].severity == "error" and f[0].tensor == "blk.0.attn_q.weight"
    assert "Q/K rows pair up as rotate_half" in f[0].message and "expects interleaved" in f[0].message
    # and an HF folder holding GGUF-ordered (interleaved) rows
    q0 = "model.layers.0.self_attn.q_proj.weight"
    permuted = _copy(hf, tmp_path / "permuted-hf", tensors={
        f"model.layers.{i}.self_attn.{p}_proj.weight": (lambda w, n=n: w[llama_permute_index(n, d)])
        for i in range(cfg["num_hidden_layers"]) for p, n in (("q", h), ("k", kv))})
    f = _find(lint(permuted), "qk-permutation")
    assert f and f[0].tensor == q0 and "pair up as interleaved" in f[0].message


def test_qk_permutation_real_model(smollm_gguf, tmp_path):
    """SmolLM2-135M (trained, llama-arch, Q4_1): its permuted Q/K pass; the same file with the
    Q/K rows put back in HF order (a converter that skipped LlamaModel.permute) is caught."""
    assert not _find(lint(smollm_gguf), "qk-permutation")
    import gguf
    md = gguf.GGUFReader(str(smollm_gguf)).fields
    h = int(md["llama.attention.head_count"].contents())
    kv = int(md["llama.attention.head_count_kv"].contents())
    d = int(md["llama.embedding_length"].contents()) // h

    def unpermute(name, a):       # quantized rows are whole blocks: moving rows moves their bytes
        if name.endswith("attn_q.weight"):
            return a[llama_unpermute_index(h, d)]
        if name.endswith("attn_k.weight"):
            return a[llama_unpermute_index(kv, d)]
        return a
    bad = rewrite_gguf(smollm_gguf, tmp_path / "smol-unpermuted.gguf", tensors=unpermute)
    f = _find(lint(bad), "qk-permutation")
    assert f and f[0].severity == "error" and "pair up as rotate_half" in f[0].message


def test_tied_embeddings(tiny, tmp_path):
    src = tiny("llama")
    with_head = _cfg(src).get("tie_word_embeddings") is False
    assert with_head, "the tiny llama keeps its own lm_head"
    tied_cfg = _copy(src, tmp_path / "tie", config={"tie_word_embeddings": True})
    f = _find(lint(tied_cfg), "tied-embeddings")
    assert f and f[0].tensor == "lm_head.weight" and "silently discards" in f[0].message
    no_head = _copy(src, tmp_path / "nohead", tensors={"lm_head.weight": lambda w: None})
    f = _find(lint(no_head), "tied-embeddings")
    assert f and "initialises the output layer at random" in f[0].message


def test_vocab_size(tiny, tmp_path):
    src = tiny("qwen2")
    v = _cfg(src)["vocab_size"]
    f = _find(lint(_copy(src, tmp_path / "v", config={"vocab_size": v + 8})), "vocab-size")
    assert f and f[0].message == f"config vocab_size is {v + 8} but the embedding has {v} rows"
    assert f[0].tensor == "model.embed_tokens.weight"
    g = write_gguf(src, tmp_path / "q.gguf")
    import gguf
    toks = list(gguf.GGUFReader(str(g)).fields["tokenizer.ggml.tokens"].contents())
    more = rewrite_gguf(g, tmp_path / "more.gguf", set_kv={"tokenizer.ggml.tokens": toks + ["extra0", "extra1"]},
                         drop=("tokenizer.ggml.token_type", "tokenizer.ggml.scores", "tokenizer.ggml.merges"))
    f = _find(lint(more), "vocab-size")
    assert f and f[0].severity == "error" and f"{len(toks) + 2} tokens" in f[0].message


def test_special_tokens(tiny, tmp_path):
    src = tiny("qwen2")
    v = _cfg(src)["vocab_size"]
    f = _find(lint(_copy(src, tmp_path / "s", config={"eos_token_id": [1, v + 3]})), "special-tokens")
    assert [x.message for x in f] == [f"eos_token_id={v + 3} in config.json is outside the vocabulary (0..{v - 1})"]
    g = write_gguf(src, tmp_path / "q.gguf")
    import gguf
    bad = rewrite_gguf(g, tmp_path / "bos.gguf", drop=("tokenizer.ggml.bos_token_id",),
                        set_kv={"tokenizer.ggml.bos_token_id": (v, gguf.GGUFValueType.UINT32)})
    f = _find(lint(bad), "special-tokens")
    assert f and f[0].message.startswith(f"tokenizer.ggml.bos_token_id={v} in the GGUF metadata")


def test_dtype_mix(tiny, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    rep = lint(_copy(tiny("qwen2"), tmp_path / "m", tensors={name: lambda w: w.astype(np.float16)}))
    f = _find(rep, "dtype-mix")
    assert f and f[0].severity == "warning" and f[0].tensor == name and rep.passed


def test_key_bias_nonrotary(minilm_dir, tmp_path):
    q, k = "encoder.layer.3.attention.self.query.bias", "encoder.layer.3.attention.self.key.bias"
    from safetensors.numpy import load_file
    qb = load_file(str(minilm_dir / "model.safetensors"))[q]
    bad = _copy(minilm_dir, tmp_path / "m", tensors={k: lambda b: qb.copy()})   # q bias written as k bias
    f = _find(lint(bad), "key-bias-nonrotary")
    assert [x.tensor for x in f] == [k] and "layer 3" in f[0].message and f[0].severity == "warning"


def test_scan_nonfinite_and_all_zero(tiny, tmp_path):
    def nan(w):
        w = w.copy()
        w[1, 2] = np.nan
        w[0, 0] = np.inf
        return w
    bad = _copy(tiny("qwen2"), tmp_path / "n", tensors={"model.layers.1.mlp.down_proj.weight": nan,
                                                         "model.layers.0.mlp.up_proj.weight": np.zeros_like,
                                                         "model.layers.0.self_attn.v_proj.bias": np.zeros_like})
    assert not _find(lint(bad), "nonfinite")                   # only with --scan
    import ckpt_surgeon.analysis.lint as L
    old = L.SCAN_CHUNK_BYTES
    L.SCAN_CHUNK_BYTES = 256        # many chunks per tensor
    seen = []
    try:
        rep = lint(bad, scan=True, progress=seen.append)
    finally:
        L.SCAN_CHUNK_BYTES = old
    assert [(x.tensor, x.message) for x in _find(rep, "nonfinite")] == [("model.layers.1.mlp.down_proj.weight",
                                                                        "2 NaN/Inf value(s)")]
    zero = {x.tensor: x.severity for x in _find(rep, "all-zero")}
    assert zero == {"model.layers.0.mlp.up_proj.weight": "warning", "model.layers.0.self_attn.v_proj.bias": "info"}
    from ckpt_surgeon.checkpoint import open_checkpoint
    with open_checkpoint(bad) as ck:
        assert sum(seen) == sum(i.nbytes for i in ck.tensors.values())


def test_cli_exit_codes_and_json(tiny, tmp_path):
    src = tiny("qwen2")
    r = CliRunner()
    ok = r.invoke(cli, ["lint", str(src)])
    assert ok.exit_code == 0 and "no problems found" in ok.stdout
    bad = _copy(src, tmp_path / "v", config={"vocab_size": 5})
    res = r.invoke(cli, ["lint", str(bad), "--format", "json"])
    assert res.exit_code == 1
    got = json.loads(res.stdout)
    assert got["passed"] is False and got["findings"][0]["check"] == "vocab-size"
    assert set(got["findings"][0]) == {"check", "severity", "file", "tensor", "message", "fix"}
    p = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "lint", str(src), "--scan", "--progress"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "B/s" in p.stderr and "no problems found" in p.stdout
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x05" * 64)
    p = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "lint", str(junk)], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith(f"error: {junk}")
    assert p.stdout == ""


def test_hub_source_reads_headers_and_small_tensors_only(hub, tiny, tmp_path):
    """A Hub repo is linted by HTTP range: the checks that would read weights (Q/K of four layers,
    lm_head vs embedding) are reported as skipped, and little of the file is fetched."""
    src = tiny("qwen2")
    bad = _copy(src, tmp_path / "v", config={"vocab_size": 5})
    hub.add_repo("owner/bad", bad)
    rep = lint("owner/bad")
    assert [f.check for f in rep.errors] == ["vocab-size"]
    assert "qk-permutation" in {c for c, _ in rep.skipped} and "qk-permutation" not in rep.checks
    assert rep.bytes_read == sum(r.sent for r in hub.log if r.for_repo)
    assert rep.bytes_read < 0.2 * (src / "model.safetensors").stat().st_size
    res = CliRunner().invoke(cli, ["lint", "owner/bad", "--format", "json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["skipped"][0]["check"] == "qk-permutation"


def test_folder_without_config_json_says_so_and_guesses_nothing(minilm_dir, tmp_path):
    """issue 24: without config.json lint blamed "q/k parts split or named wrongly" on a healthy
    model (an unknown position encoding taken for "no RoPE"), inspect / analyze showed
    None / None / None heads and an "unknown architecture"."""
    from ckpt_surgeon.analysis.inspect import inspect
    from ckpt_surgeon.analysis.redundancy import analyze_checkpoint
    from ckpt_surgeon.checkpoint import open_checkpoint
    d = tmp_path / "no-config"
    d.mkdir()
    shutil.copy(minilm_dir / "model.safetensors", d / "model.safetensors")
    rep = lint(d)
    assert [(f.check, f.severity, f.file, f.tensor, f.message) for f in rep.findings] == [
        ("config-missing", "error", str(d / "config.json"), None,
         "config.json is missing: transformers cannot load this folder, and the architecture, heads / kv heads / "
         "head_dim and position encoding (rotary or not) cannot be known without it")]
    assert {c for c, _ in rep.skipped} == {"key-bias-nonrotary", "qk-permutation", "loads-cleanly"}
    warning = (f"config.json is missing ({d / 'config.json'}): without it the architecture, the heads / kv heads / "
               "head_dim, the position encoding (rotary or not) and so every key-bias class cannot be known, and "
               "transformers cannot load the folder; only tensor names, shapes and bias norms are shown")
    ins = inspect(d)
    assert ins.warnings[0] == warning and not any("not in the registry" in n for n in ins.notes)
    assert dict(ins.summary_items())["heads / kv heads / head_dim"] == "unknown: config.json is missing"
    assert ins.to_dict()["missing_config"] == str(d / "config.json")
    with open_checkpoint(d) as ck:
        an = analyze_checkpoint(ck)
    assert an.warnings[0] == warning and dict(an.summary_items())["architecture"] == "unknown: config.json is missing"
    assert {lr.k_class for lr in an.layers if lr.has_k_bias} <= {"unknown"}        # never guessed
    lone = lint(d / "model.safetensors")          # a lone file: a warning, the same sentence
    assert [(f.check, f.severity) for f in lone.findings] == [("config-missing", "warning")]
