"""HF -> GGUF files run in llama.cpp (llama-cpp-python) like the source runs in transformers.

Teacher-forced: the same token ids go through both; llama.cpp's ``scores`` (``logits_all=True``)
are compared with transformers' logits position by position.  "rel" below is
max |llama.cpp - transformers| / max |transformers| over all positions and vocabulary entries.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from convert_variants import LLAMACPP_FAMILIES, LONG_TEXT, MULTILINGUAL, build_variant, smollm_hf, spm_llama

from ckpt_surgeon.conversion import gguf_to_hf, hf_to_gguf

import llama_cpp  # noqa: E402  (installed by the test extra; a missing runtime is a broken set-up, not a skip)


def _llama(path: Path, n_ctx: int = 512):
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, verbose=False, n_threads=2)


def _llama_logits(path: Path, ids: list[int], n_vocab: int) -> np.ndarray:
    llm = _llama(path)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)[:, :n_vocab]
    finally:
        llm.close()


def _hf_logits(folder: Path, ids: list[int], patch=None) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    if patch is not None:
        patch(model)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _as_llamacpp_phimoe(model) -> None:
    """Make a transformers Phimoe model compute what llama.cpp's phimoe graph computes
    (src/models/phi3.cpp, shared with phi3): every nn.LayerNorm becomes ``build_norm(...,
    LLM_NORM_RMS)`` with the norm's bias added (``x / rms(x) * w + b``, no mean subtracted), and
    the router ``build_moe_ffn(..., norm_w=true, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)``: softmax
    over all experts, top-k, weights renormalised to sum 1 -- instead of modeling_phimoe's
    sparsemixer (each of the 2 weights a softmax over the experts within 2 * router_jitter_noise
    of that pick)."""
    import torch
    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.forward = lambda x, m=mod: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight + m.bias
        elif type(mod).__name__ == "PhimoeTopKRouter":
            def route(h, m=mod):
                logits = torch.nn.functional.linear(h, m.weight)
                w, idx = logits.softmax(-1).topk(m.top_k, -1)
                return logits, w / w.sum(-1, keepdim=True), idx
            mod.forward = route


# Families whose llama.cpp graph is not the transformers model (tested against transformers
# patched to compute what llama.cpp's graph does; test_phimoe_llama_cpp_is_not_transformers
# measures how far that is from transformers itself).
LLAMACPP_GRAPH = {"phimoe": _as_llamacpp_phimoe, "phimoe_longrope": _as_llamacpp_phimoe}


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


# Bounds on rel per GGUF dtype for the tiny random models.  f32: mostly llama.cpp's default F16
# KV cache, which rounds K and V (with an F32 cache the scaled-RoPE variants match transformers'
# float64 to 1.6e-6: test_rope_scaling_is_what_llama_cpp_applies), besides its kernels' summation
# order and vectorised exp / silu: observed <= 2.5e-4, bound 1e-3 (the issue's).  The others add one rounding of every weight: f16 keeps 11 significant bits (observed
# <= 6e-4), bf16 8 (rounding 2^-9 ~ 2e-3 per weight, observed <= 5e-3), q8_0 ~7 plus a per-32 scale
# (observed <= 1.6e-2); the bounds leave 2-3x room.  Gemma 3 (6 layers, embeddings scaled by
# sqrt(hidden), norms 1 + w with w ~ N(0, 0.3)) sees every error amplified, and ggml's CPU GELU
# reads its input through an fp16 lookup table (ggml-cpu GGML_GELU_FP16), which shows up even in
# f32 (observed 1.4e-3 from position 0 on, where attention is trivial): its own bounds.
BOUNDS = {"f32": 1e-3, "f16": 2e-3, "bf16": 1.5e-2, "q8_0": 4e-2}
GEMMA3_BOUNDS = {"f32": 3e-3, "f16": 6e-3, "bf16": 4e-2, "q8_0": 1.5e-1}
# Gemma 2 with caps that bend every value (convert_variants "gemma2_softcap": weights drawn twice
# as wide so attention scores reach the cap): f32 stays within the issue's 1e-3 (observed 7.0e-4);
# the rounded types see the wider weights (observed f16 1.6e-3, bf16 1.3e-2, q8_0 4.5e-2).  Without
# llama.cpp applying them the logits would move by 0.17 (final cap) and 6.0e-3 (attention cap alone),
# measured in transformers on the same weights.
SOFTCAP_BOUNDS = {"f32": 1e-3, "f16": 4e-3, "bf16": 3e-2, "q8_0": 1e-1}
# Scaled RoPE variants (llama3 / yarn / linear): weights drawn 5x as wide as the fixtures'
# (initializer_range 0.1) so that the scaling moves the logits far past the f32 bound (see
# test_rope_scaling_is_what_llama_cpp_applies); f32 stays within 1e-3 (observed <= 8.0e-4, phi3
# longrope), the rounded types see the wider weights (observed f16 <= 1.6e-3, bf16 <= 1.6e-2,
# q8_0 <= 4.4e-2).
ROPE_BOUNDS = SOFTCAP_BOUNDS
# qwen3_yarn at f32: 1.06e-3.  That is llama.cpp's default F16 KV cache: with an F32 cache the
# same file matches transformers in float64 to 1.6e-6 (test_rope_scaling_is_what_llama_cpp_applies),
# and yarn's attention factor (logits x 1.30 here) on Qwen3's q/k-normed heads sharpens attention,
# which amplifies the cache's rounding (the same model without yarn: 5.5e-4).
QWEN3_YARN_BOUNDS = dict(ROPE_BOUNDS, f32=2e-3)
# MoE: a token whose top-k expert scores nearly tie picks another expert once the weights are
# rounded, and that expert's whole output replaces the other's: one position jumps while the
# rest keep the dense bounds.  Measured on qwen3_moe: bf16 0.031 at 1 of 192 positions (median
# 0.0024), and transformers itself, on the same bf16-rounded weights, jumps 0.025 at that position;
# q8_0 0.046 at 1 position (transformers on the q8_0 weights: 0.040).  So for the rounded types
# BOUNDS hold at all but MOE_JUMPS positions, and those stay within MOE_MAX.
MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "phimoe", "deepseek_v2_lite", "phimoe_longrope")
MOE_JUMPS = 2
# phimoe_longrope: the rope factors are F32 tensors at every --dtype, so f32 / f16 show the RoPE
# (observed 3.4e-4 / 1.1e-3, against transformers run as llama.cpp's phi3 graph); rounded types are phimoe's own test.  With its 5x wide weights,
# llama.cpp's bf16 / q8_0 files flip a top-2 expert choice (measured: bf16 0.17 at 1 of 192
# positions, q8_0 0.22) that transformers on the same bf16-rounded weights does not (0.003):
# llama.cpp's phi3 graph routes from its own slightly different activations, not a RoPE effect.
PHIMOE_LONGROPE_BOUNDS = {"f32": ROPE_BOUNDS["f32"], "f16": ROPE_BOUNDS["f16"]}
MOE_MAX = {"bf16": 6e-2, "q8_0": 1e-1}


@pytest.fixture(scope="module")
def family_src(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("lc-families")
    return lambda name: build_variant(tiny, name, root / name)


@pytest.mark.parametrize("family", LLAMACPP_FAMILIES)
def test_gguf_runs_in_llama_cpp_like_transformers(family, family_src, tmp_path):
    from transformers import AutoTokenizer
    src = family_src(family)
    ids = AutoTokenizer.from_pretrained(src).encode(MULTILINGUAL)
    ref = _hf_logits(src, ids, LLAMACPP_GRAPH.get(family))
    bounds = {"gemma3": GEMMA3_BOUNDS, "gemma3_linear": GEMMA3_BOUNDS, "gemma2_softcap": SOFTCAP_BOUNDS, "llama3_rope": ROPE_BOUNDS,
              "qwen2_yarn": ROPE_BOUNDS, "qwen3_yarn": QWEN3_YARN_BOUNDS, "llama_linear": ROPE_BOUNDS,
              "phi3_longrope": ROPE_BOUNDS, "phimoe_longrope": PHIMOE_LONGROPE_BOUNDS,
              "phi4mini_longrope": ROPE_BOUNDS}.get(family, BOUNDS)
    for dtype, bound in bounds.items():
        g = hf_to_gguf(src, tmp_path / f"m.{dtype}.gguf", dtype=dtype, name="tiny")
        if dtype == "f32":
            vocab_only = llama_cpp.Llama(model_path=str(g), vocab_only=True, verbose=False)
            # the GGUF's own tokenizer (tokenizer.ggml.*) splits the multilingual text as transformers does
            assert vocab_only.tokenize(MULTILINGUAL.encode(), add_bos=False, special=True) == ids
            vocab_only.close()
        got = _llama_logits(g, ids, ref.shape[1])
        if family in MOE_FAMILIES and dtype in MOE_MAX:
            per_pos = np.abs(got - ref).max(-1) / np.abs(ref).max()
            assert int(np.sum(per_pos > bound)) <= MOE_JUMPS and per_pos.max() <= MOE_MAX[dtype], \
                (dtype, np.sort(per_pos)[-4:])
            continue
        assert _rel(got, ref) <= bound, (dtype, _rel(got, ref))


def test_phimoe_llama_cpp_is_not_transformers(family_src, tmp_path):
    """llama.cpp runs a Phi-3.5-MoE GGUF (ours, byte-identical to its own converter's) as its phi3
    graph does: RMS norms plus the LayerNorm biases, softmax top-2 routing.  Its f32 logits follow
    transformers patched to do the same (observed 2.1e-4 rel) and are far from transformers' own
    (observed 4.8e-2 rel, top-1 token equal at 95% of 192 positions on the tiny model): the
    difference is the graph, not the conversion.  Each substitution alone already moves
    transformers' logits far past the f32 bound (observed: the norms 4.6e-2, the routing 2.1e-2)."""
    from transformers import AutoTokenizer
    src = family_src("phimoe")
    ids = AutoTokenizer.from_pretrained(src).encode(MULTILINGUAL)
    ref, like = _hf_logits(src, ids), _hf_logits(src, ids, _as_llamacpp_phimoe)
    got = _llama_logits(hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny"), ids, ref.shape[1])
    assert _rel(got, like) <= BOUNDS["f32"], _rel(got, like)
    assert _rel(got, ref) > 20 * BOUNDS["f32"], _rel(got, ref)
    assert _rel(like, ref) > 20 * BOUNDS["f32"], _rel(like, ref)


@pytest.mark.parametrize("drop", ["attn_logit_softcapping", "final_logit_softcapping"])
def test_gemma2_soft_capping_is_applied_by_llama_cpp(drop, family_src, tmp_path):
    """llama.cpp's f32 logits follow the capped model, not the same weights with one cap removed
    (which transformers puts further away than the f32 bound: soft-capping is not a no-op here)."""
    import json
    import shutil

    from transformers import AutoTokenizer
    src = family_src("gemma2_softcap")
    ids = AutoTokenizer.from_pretrained(src).encode(MULTILINGUAL)
    uncapped = tmp_path / "uncapped"
    shutil.copytree(src, uncapped)
    cfg = json.loads((uncapped / "config.json").read_text())
    cfg[drop] = None
    (uncapped / "config.json").write_text(json.dumps(cfg))
    ref, other = _hf_logits(src, ids), _hf_logits(uncapped, ids)
    got = _llama_logits(hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny"), ids, ref.shape[1])
    assert _rel(got, ref) <= BOUNDS["f32"] < _rel(other, ref) / 5 and _rel(got, other) > 4 * BOUNDS["f32"], \
        (_rel(got, ref), _rel(other, ref), _rel(got, other))


@pytest.fixture(scope="module")
def smol(smollm_gguf, tmp_path_factory):
    """SmolLM2-135M (trained weights: logits have real margins, unlike the tiny random models whose
    top-1 is decided by noise) as an HF folder in float32 (shared with test_convert_smollm.py)."""
    return smollm_hf(smollm_gguf, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def smol_bf16(smollm_gguf, tmp_path_factory):
    """The same model saved in bfloat16, the dtype HF checkpoints usually ship in."""
    return gguf_to_hf(smollm_gguf, tmp_path_factory.mktemp("smol-bf16") / "hf", dtype="bfloat16")


def _ids(src: Path) -> list[int]:
    """The 128 teacher-forced token ids (LONG_TEXT's English prose) in ``src``'s tokenizer."""
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(src).encode(LONG_TEXT)[:128]
    assert len(ids) == 128
    return ids


def _teacher_forced(src: Path, gguf: Path) -> tuple[np.ndarray, np.ndarray]:
    ids = _ids(src)
    ref = _hf_logits(src, ids)
    return _llama_logits(gguf, ids, ref.shape[1]), ref


def test_real_model_f32_gguf_runs_like_transformers(smol, tmp_path):
    from transformers import AutoTokenizer
    g = hf_to_gguf(smol, tmp_path / "smol.f32.gguf", dtype="f32")
    vocab_only = llama_cpp.Llama(model_path=str(g), vocab_only=True, verbose=False)
    for text in (LONG_TEXT, "<|im_start|>user\n2 + 2 = ?<|im_end|>"):   # pre "smollm": digits one by one
        assert vocab_only.tokenize(text.encode(), add_bos=False, special=True) == \
            AutoTokenizer.from_pretrained(smol).encode(text)
    vocab_only.close()
    got, ref = _teacher_forced(smol, g)
    assert _rel(got, ref) <= 1e-3            # observed 7.9e-4 over 30 layers
    assert float(np.mean(got.argmax(-1) == ref.argmax(-1))) >= 0.99


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_real_model_f16_bf16_gguf_top1_agreement(dtype, smol_bf16, tmp_path):
    """bf16 source -> f16 / bf16 GGUF: llama.cpp's top-1 agrees with transformers (on the
    source, computed in float32) at >= 99% of 128 teacher-forced positions for f16 (observed 100%).

    bf16: the weights are the source's own bf16 values (the f32 GGUF of the same source is within
    0.04 of transformers), but llama.cpp also rounds the *activations* to bf16 inside its matmuls
    (8 significant bits, 2^-9 relative per rounding, over 30 layers). How much that moves the
    logits depends on the CPU's kernel: max |delta logit| 0.24 on one machine, 0.40 on an
    AVX512-BF16 one (llama.cpp 0.3.36, both), i.e. 3-6% of the logits' spread (std 7.2), with a
    mean |delta| of 0.036 (0.5% of it); one or two flipped positions of 128, each a near-tie
    (reference top-2 margins 0.026-0.031, median margin 1.01).  So bf16 asserts what that rounding
    allows, scaled by the logits' spread rather than tied to one machine's figure: mean |delta|
    within 2% of std (a mis-laid weight moves logits by a sizeable fraction of std), max within
    15%, >= 126/128 agreement, and every flip a near-tie (reference margin < 0.05), i.e. no flip
    where the model was decided."""
    got, ref = _teacher_forced(smol_bf16, hf_to_gguf(smol_bf16, tmp_path / f"smol.{dtype}.gguf", dtype=dtype))
    agree = got.argmax(-1) == ref.argmax(-1)
    if dtype == "f16":
        assert float(np.mean(agree)) >= 0.99
        return
    r = ref.reshape(-1, ref.shape[-1])
    top2 = np.sort(r, axis=-1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0])[~agree.reshape(-1)]
    assert int((~agree).sum()) <= 2, margins
    delta, spread = np.abs(got - ref), float(ref.std())
    assert float(delta.mean()) <= 0.02 * spread, (float(delta.mean()), spread)
    assert float(delta.max()) <= 0.15 * spread, (float(delta.max()), spread)
    assert np.all(margins < 0.05), margins


def test_real_model_q8_0_gguf_is_llama_cpp_own_quantization(smol_bf16, tmp_path):
    """q8_0: our file is byte-for-byte what llama.cpp's own quantizer makes from the f32 file of
    the same weights, so whatever llama.cpp then computes is llama.cpp's q8_0, not a converter
    artefact.

    Top-1 agreement with transformers on the source is bounded by q8_0 itself on this 135M model:
    transformers running the q8_0-rounded weights (our GGUF converted back to float32) agrees with
    the source at 125 of these 128 positions (97.7%), and llama.cpp also rounds the activations to
    8 bits inside its q8_0 matmuls (it agrees with transformers on the identical q8_0 weights at
    98.4%); observed llama.cpp vs source: 123/128 (96.1%) with an AVX-512 build of llama.cpp, and
    120/128 (93.8%) with the AVX2-baseline build .ci/run makes (its q8_0 dot products round the
    activations through another kernel; the file's bytes are the same, asserted above).  So the
    issue's 99% is not reachable for q8_0 on this model by any converter.  What is asserted:
    llama.cpp on our file loses at most 6 positions more than the q8_0 rounding itself (the
    activation rounding above costs 2 to 5 here, by build), and a floor of 92% (a broken
    conversion lands near 0%).
    """
    from gguf_util import llama_quantize
    import gguf
    ours = hf_to_gguf(smol_bf16, tmp_path / "smol.q8_0.gguf", dtype="q8_0")
    f32 = hf_to_gguf(smol_bf16, tmp_path / "smol.f32.gguf", dtype="f32")
    ref_q = llama_quantize(f32, tmp_path / "smol.lc-q8_0.gguf", "Q8_0")
    a = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    b = {t.name: t for t in gguf.GGUFReader(ref_q).tensors}
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tensor_type == b[name].tensor_type, name
        assert np.array_equal(np.asarray(a[name].data), np.asarray(b[name].data)), name
    got, ref = _teacher_forced(smol_bf16, ours)
    rounded = _hf_logits(gguf_to_hf(ours, tmp_path / "q8-weights-f32", dtype="float32"), _ids(smol_bf16))
    ceiling = int(np.sum(rounded.argmax(-1) == ref.argmax(-1)))
    agree = int(np.sum(got.argmax(-1) == ref.argmax(-1)))
    assert agree >= ceiling - 6, (agree, ceiling)
    assert agree / len(ref) >= 0.92, agree


def test_sentencepiece_vocab_tokenizes_like_transformers(tiny, tmp_path_factory, tmp_path):
    """A SentencePiece-BPE tokenizer.json becomes a GGUF 'llama' vocabulary that llama.cpp's SPM
    tokenizer splits like transformers; and the tokenizer rebuilt from that GGUF splits like
    llama.cpp, including text that starts with spaces (where llama.cpp always prepends '▁')."""
    from transformers import AutoTokenizer
    src = spm_llama(tiny, tmp_path_factory.mktemp("spm") / "model")
    g = hf_to_gguf(src, tmp_path / "spm.gguf", dtype="f32", name="tiny")
    hf = AutoTokenizer.from_pretrained(src)
    llm = llama_cpp.Llama(model_path=str(g), vocab_only=True, verbose=False)
    texts = (MULTILINGUAL, "The quick brown fox jumps over the lazy dog. 今天天气很好 ☕😀", "x=1 2 3 ∑ tab\there")
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == hf.encode(text, add_special_tokens=False)
    back = AutoTokenizer.from_pretrained(gguf_to_hf(g, tmp_path / "hf"))
    for text in texts + ("  two leading spaces\n\nand newlines", " one"):
        assert back.encode(text, add_special_tokens=False) == llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.close()



def _without_rope_freqs(g: Path, out: Path) -> Path:
    from gguf_util import rewrite_gguf
    return rewrite_gguf(g, out, tensors=lambda n, d: None if n == "rope_freqs.weight" else d)


def _without_scaling_keys(g: Path, out: Path) -> Path:
    from gguf_util import rewrite_gguf

    from ckpt_surgeon.formats.gguf import read_header
    arch = read_header(g).metadata["general.architecture"]
    return rewrite_gguf(g, out, drop=tuple(f"{arch}.rope.scaling.{k}" for k in ("type", "factor",
                                                                              "original_context_length")))


def _without_longrope(g: Path, out: Path) -> Path:
    from gguf_util import rewrite_gguf
    return rewrite_gguf(g, out, drop=("phi3.rope.scaling.attn_factor",),
                        tensors=lambda n, d: None if n.startswith("rope_factors_") else d)


def _run_f32_cache(path: Path, ids: list[int], n_vocab: int, n_ctx: int = 512) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, verbose=False, n_threads=2,
                          type_k=0, type_v=0)     # GGML_TYPE_F32 cache
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float64)[:, :n_vocab]
    finally:
        llm.close()


# Exactness of each scaled RoPE: with an F32 KV cache (llama.cpp's default F16 cache rounds K and
# V, which is most of the f32 bounds above) llama.cpp runs our f32 file like transformers in
# float64 to within 1e-5 (observed <= 3.6e-6; float32 kernels), and without what carries the
# scaling it runs plain RoPE, off by far more (measured: llama3 0.19, yarn 0.60, linear 0.61,
# longrope 0.46 short / 0.77 long, Phi-4-mini's partial-rotary longrope 0.86, DeepSeek yarn 0.82).  Longrope both ways: the 192-token text with
# n_ctx = original (512) runs the short factors in both; the 752-token LONG_TEXT with n_ctx 1024 the
# long ones.  DeepSeek-V2-Lite's yarn (mscale = mscale_all_dim: llama.cpp scales kq by
# (1 + 0.1 * 0.707 * ln 40)^2 = 1.59) is checked here only: with the default F16 cache its 27 wide
# layers amplify the cache's rounding to 6.5e-2 at f32 (F32 cache: 3.1e-6), and its rounded
# dtypes are deepseek_v2_lite's (the yarn keys are metadata, the same at every dtype).
@pytest.mark.parametrize("family, strip, text, n_ctx, bound", [
    ("llama3_rope", _without_rope_freqs, MULTILINGUAL, 512, 1e-5),
    ("qwen2_yarn", _without_scaling_keys, MULTILINGUAL, 512, 1e-5),
    ("qwen3_yarn", _without_scaling_keys, MULTILINGUAL, 512, 1e-5),
    ("llama_linear", _without_scaling_keys, MULTILINGUAL, 512, 1e-5),
    ("phi3_longrope", _without_longrope, MULTILINGUAL, 512, 1e-5),
    ("phi3_longrope", _without_longrope, LONG_TEXT, 1024, 1e-5),
    ("phi4mini_longrope", _without_longrope, LONG_TEXT, 1024, 1e-5),
    ("deepseek_v2_lite_yarn", _without_scaling_keys, MULTILINGUAL, 512, 1e-5),
    # Gemma 3's GELU goes through ggml's fp16 lookup table even in f32 (see BOUNDS): observed
    # 6.3e-4 with the F32 cache, 0.24 without the linear scaling of its full-attention layer
    ("gemma3_linear", _without_scaling_keys, MULTILINGUAL, 512, 1e-3)])
def test_rope_scaling_is_what_llama_cpp_applies(family, strip, text, n_ctx, bound, family_src, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = family_src(family)
    ids = AutoTokenizer.from_pretrained(src).encode(text)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64, attn_implementation="eager",
                                                 experts_implementation="eager").eval()   # grouped_mm has no float64
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    plain = strip(g, tmp_path / "plain.gguf")
    assert _rel(_run_f32_cache(g, ids, ref.shape[1], n_ctx), ref) <= bound
    assert _rel(_run_f32_cache(plain, ids, ref.shape[1], n_ctx), ref) > 0.05


@pytest.mark.parametrize("key, value", [("yarn_beta_fast", 4.0), ("yarn_beta_slow", 8.0), ("yarn_attn_factor", 3.0)])
def test_llama_cpp_ignores_the_yarn_keys(key, value, family_src, tmp_path):
    """llama.cpp's converter writes yarn_beta_fast / yarn_beta_slow / yarn_attn_factor from the
    config, but its qwen2 graph loads none of them (only grok and mistral3 do): a file with any of
    them changed to a value far from the default gives bit-identical logits.  So the converters
    refuse configs and files whose values differ from what llama.cpp runs (tests/test_convert.py)."""
    import gguf
    from gguf_util import rewrite_gguf
    from transformers import AutoTokenizer
    src = family_src("qwen2_yarn")
    ids = AutoTokenizer.from_pretrained(src).encode(MULTILINGUAL)
    g = hf_to_gguf(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    other = rewrite_gguf(g, tmp_path / "o.gguf", set_kv={f"qwen2.rope.scaling.{key}": (value, gguf.GGUFValueType.FLOAT32)})
    a, b = _llama_logits(g, ids, 448), _llama_logits(other, ids, 448)
    assert np.array_equal(a, b)


def test_phimoe_long_mscale_is_not_applied_by_llama_cpp(family_src, tmp_path):
    """With n_ctx past the original context llama.cpp runs the long factors with the one attention
    factor its converter writes (the short one); transformers' Phimoe runs the short factors at
    every length (its rotary embedding recomputes them without the sequence length) with
    long_mscale past the original context.  On the 752-token text our file runs like transformers
    given short_factor = long_factor and long_mscale = short_mscale (observed 1.8e-6; both as
    llama.cpp's phi3 graph) and unlike it with the config as it is (observed 0.67).  The
    conversion warns about both."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf_report
    src = family_src("phimoe_longrope")
    ids = AutoTokenizer.from_pretrained(src).encode(LONG_TEXT)
    same = tmp_path / "same"
    shutil.copytree(src, same)
    cfg = json.loads((same / "config.json").read_text())
    cfg["rope_parameters"]["long_mscale"] = cfg["rope_parameters"]["short_mscale"]
    cfg["rope_parameters"]["short_factor"] = cfg["rope_parameters"]["long_factor"]
    (same / "config.json").write_text(json.dumps(cfg))
    ref, like = _hf_logits(src, ids, _as_llamacpp_phimoe), _hf_logits(same, ids, _as_llamacpp_phimoe)
    rep = hf_to_gguf_report(src, tmp_path / "m.gguf", dtype="f32", name="tiny")
    assert [w for w in rep.warnings if "long_mscale = 1.3 past 512 tokens" in w], rep.warnings
    assert [w for w in rep.warnings if "Phimoe runs the short ones at every length" in w], rep.warnings
    got = _run_f32_cache(Path(rep.output), ids, ref.shape[1], 1024)
    assert _rel(got, like) <= 1e-5, _rel(got, like)     # F32 cache: float32 kernels only
    assert _rel(got, ref) > 20 * BOUNDS["f32"], _rel(got, ref)
