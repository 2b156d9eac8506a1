"""Issue 27, GGUF side: mmproj files (``general.architecture`` ``clip``, the vision / audio projector files
llama.cpp and Ollama ship beside a VLM) read and their encoders reported as towers.

The files are written by llama.cpp's own ``convert_hf_to_gguf.py --mmproj`` from tiny VLMs built from
transformers configs (tests/mmproj_util.py); every GGUF tower row is compared with the HF folder's tower
row of the same model.  The registry's projector rows (families.CLIP_PROJECTORS) are checked against
llama.cpp's clip.cpp / models/*.cpp from the same sdist.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cli_util import _one_line_exit_2, _run
from mmproj_util import SPECS, mmproj_pair, rewrite_gguf

# a bias of 0.5-std noise: the same float32 values on both sides (the fixture is saved in float32 and the
# converter keeps 1-D tensors F32), summed in float64; 1e-12 leaves room for numpy's pairwise summation
# over a contiguous tensor and over a strided slice of a fused one
SAME = 1e-12


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_SURGEON_CACHE_DIR", str(tmp_path / "derive-cache"))


def _mtmd():
    from llamacpp_src import llamacpp_source
    return llamacpp_source() / "tools" / "mtmd"


def _graph_bodies(root) -> dict:
    """clip_graph_X -> the text of its ``build()`` (models/*.cpp)."""
    out = {}
    for f in (root / "models").glob("*.cpp"):
        text = f.read_text()
        for m in re.finditer(r"ggml_cgraph \* (clip_graph_\w+)::build\(\)", text):
            rest = text[m.end():]
            nxt = re.search(r"\n\S[^\n]*clip_graph_\w+::\w+\(", rest)
            out[m.group(1)] = rest[:nxt.start()] if nxt else rest
    return out


def test_clip_projector_rows_agree_with_llamacpp_graphs():
    """Every registry row: clip-impl.h maps its projector type to an enum, clip.cpp's clip_get_graph_builder
    maps that to the row's graph class, and the graph's build() rotates q / k (mentions rope) exactly when
    the row says rope; an absolute row's graph adds its position table."""
    from ckpt_surgeon.arch import families as F
    root = _mtmd()
    enum = {name: e for e, name in re.findall(r'\{\s*(PROJECTOR_TYPE_\w+)\s*,\s*"([^"]+)"\s*\}',
                                              (root / "clip-impl.h").read_text())}
    src = (root / "clip.cpp").read_text()
    switch = src[src.index("clip_get_graph_builder("):]
    builder, pending = {}, []
    for m in re.finditer(r"case (PROJECTOR_TYPE_\w+):|make_unique<(clip_graph_\w+)>", switch):
        if m.group(1):
            pending.append(m.group(1))
        else:
            builder.update({p: m.group(2) for p in pending if p not in builder})
            pending = []
    bodies = _graph_bodies(root)
    assert len(F.CLIP_PROJECTORS) >= 8
    for row in F.CLIP_PROJECTORS:
        for ptype in row.types:
            assert builder[enum[ptype]] == row.graph, (ptype, builder.get(enum.get(ptype)))
            body = bodies[row.graph]
            assert ("rope" in body) == (row.position == "rope"), (ptype, row.graph)
            if row.position == "absolute":
                assert "position_embeddings" in body, row.graph


def test_clip_names_come_from_gguf_py():
    """The encoders' layer prefixes, roles and keys are gguf-py's (TENSOR_NAMES / Keys), not ours."""
    import gguf

    from ckpt_surgeon.arch import gguf_clip as GC
    assert GC.clip_arch() == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]
    enc = {e.kind: e for e in GC.clip_encoders()}
    T, M = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    assert enc["vision"].layer + enc["vision"].roles["k"] == T[M.V_ENC_ATTN_K].replace("{bid}", "{L}")
    assert enc["audio"].layer + enc["audio"].roles["q"] == T[M.A_ENC_ATTN_Q].replace("{bid}", "{L}")
    assert enc["vision"].keys["num_attention_heads"] == gguf.Keys.ClipVision.Attention.HEAD_COUNT
    assert enc["audio"].keys["num_hidden_layers"] == gguf.Keys.ClipAudio.BLOCK_COUNT
    assert GC.is_attention_bias(T[M.V_RESMPL_ATTN_K] + ".bias") and not GC.is_attention_bias("v.blk.0.attn_out.bias")


def _rows(tower) -> list:
    return tower["layers"]


def _hf_tower(rep: dict, kind: str) -> dict:
    hits = [t for t in rep["towers"] if t["kind"] == kind]
    assert len(hits) == 1, [(t["name"], t["kind"]) for t in rep["towers"]]
    return hits[0]


@pytest.mark.parametrize("key", sorted(SPECS))
def test_mmproj_tower_rows_equal_the_hf_towers(key):
    """inspect on the converter's mmproj: one tower per encoder, with the HF folder's tower rows (layers,
    heads, q / k / v bias norms per layer and per head), every attention bias placed, the position encoding
    and key-bias class of its projector's llama.cpp graph."""
    from ckpt_surgeon import analyze, inspect, lint
    from ckpt_surgeon.arch import families as F
    hf, path = mmproj_pair(key)
    g = inspect(str(path)).to_dict()
    h = inspect(str(hf)).to_dict()
    assert g["architecture"] == "clip" and g["warnings"] == [] and g["skipped"] == []
    kinds = [t["kind"] for t in g["towers"]]
    assert kinds in (["vision"], ["audio"])
    gt, ht = g["towers"][0], _hf_tower(h, kinds[0])
    assert g["layers"] == gt["layers"] and gt["name"] == kinds[0]
    for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
        assert gt[k] == ht[k], (k, gt[k], ht[k])
    depth = next(v for sub in SPECS[key].values() if isinstance(sub, dict) for k, v in sub.items()
                 if k in ("depth", "num_hidden_layers", "encoder_layers"))
    assert gt["num_layers"] == depth
    for gl, hl in zip(_rows(gt), _rows(ht)):
        for role in ("q_bias", "k_bias", "v_bias"):
            a, b = gl[role], hl[role]
            assert (a is None) == (b is None), (key, gl["layer"], role)
            if a is None:
                continue
            assert a["l2"] == pytest.approx(b["l2"], rel=SAME) and a["max_abs"] == pytest.approx(b["max_abs"], rel=SAME)
            assert a["per_head_l2"] == pytest.approx(b["per_head_l2"], rel=SAME)
    # every attention projection bias of the file is in a row (counted by name, not by the matcher)
    from ckpt_surgeon import open_checkpoint
    with open_checkpoint(str(path)) as ck:
        biases = {n for n in ck.tensors if re.search(r"\.attn_(q|k|v|qkv)\.bias$", n)}
    placed = {s["tensor"] for lr in gt["layers"] for s in (lr["q_bias"], lr["k_bias"], lr["v_bias"]) if s}
    assert biases and biases == placed
    # position and key-bias class: the projector's graph (registry), and what the HF tower's probe says
    proj = F.clip_projector(re.search(r"projector type '([^']+)'", gt["how"]).group(1))
    assert proj is not None, gt["how"]
    assert gt["position_encoding"]["type"] == proj.position
    want = "exact" if proj.position == "absolute" else "rope"
    classes = {lr["k_bias_redundancy"]["class"] for lr in gt["layers"] if lr["k_bias"]}
    assert classes <= {want}
    hf_classes = {lr["k_bias_redundancy"]["class"] for lr in ht["layers"] if lr["k_bias"]}
    assert hf_classes <= {want, "unknown"}, hf_classes     # where the HF probe could run the tower, it agrees
    a = analyze(str(path))
    assert {lr.k_class for lr in a.layers if lr.has_k_bias} == classes
    if want == "exact":
        assert all(lr.bound == 0.0 for lr in a.layers if lr.has_k_bias)
    else:       # 2-D rope: no removable share and no bound claimed
        assert all(lr.bound is None and lr.exact_fraction is None for lr in a.layers if lr.has_k_bias)
    rep = lint(str(path))
    assert not rep.errors, [f.message for f in rep.errors]


def _gguf_tensors(path) -> dict:
    import gguf
    r = gguf.GGUFReader(path)
    return {t.name: np.asarray(t.data).copy() for t in r.tensors}


def _weight(path, name) -> np.ndarray:
    import gguf
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)


def _gguf_fields(path) -> dict:
    import gguf
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_fold_k_and_v_on_an_mmproj_is_exact_and_leaves_the_rest(outtype, tmp_path):
    """fold-bias --k --v --tower vision on Gemma 3's mmproj (SigLIP: absolute positions): the key biases are
    zeroed (softmax ignores q.b_k, constant over the keys), each output bias takes W_o b_v (attention rows
    sum to 1), every other tensor (Q8_0 weights too) and every metadata key is as the converter wrote it."""
    hf, path = mmproj_pair("gemma3", outtype)
    out = tmp_path / "folded.gguf"
    res = _run("fold-bias", path, "-o", out, "--k", "--v", "--tower", "vision")
    assert res.exit_code == 0, res.output
    src, got = _gguf_tensors(path), _gguf_tensors(out)
    assert set(src) == set(got)
    n = 3
    changed = {f"v.blk.{i}.attn_{r}.bias" for i in range(n) for r in ("k", "v", "out")}
    for name in src:
        if name in changed:
            continue
        assert got[name].tobytes() == src[name].tobytes() and got[name].dtype == src[name].dtype, name
    for i in range(n):
        assert not got[f"v.blk.{i}.attn_k.bias"].any() and not got[f"v.blk.{i}.attn_v.bias"].any()
        w_o = _weight(path, f"v.blk.{i}.attn_out.weight")        # numpy [out, in], dequantized by gguf-py
        want = src[f"v.blk.{i}.attn_out.bias"].astype(np.float64) + w_o @ src[f"v.blk.{i}.attn_v.bias"].astype(np.float64)
        # computed in float64, stored F32 once: float32 rounding (2^-24 relative) of values of scale ~1-10
        assert np.allclose(got[f"v.blk.{i}.attn_out.bias"], want, rtol=1e-6, atol=1e-6)
    fs, fg = _gguf_fields(path), _gguf_fields(out)
    from ckpt_surgeon.formats.write.writer import GGUF_HISTORY_KEY
    assert {k: v for k, v in fg.items() if k != GGUF_HISTORY_KEY} == fs


def test_fold_k_on_a_2d_rope_tower_is_refused_in_one_line(tmp_path):
    _, path = mmproj_pair("qwen2_vl@mm")
    out = tmp_path / "x.gguf"
    _one_line_exit_2(_run("fold-bias", path, "-o", out, "--k", "--tower", "vision"), "2-D RoPE",
                     "not exactly removable")
    _one_line_exit_2(_run("fold-bias", path, "-o", out, "--k", "--approximate", "--max-logit-change", "0.1"),
                     "rotary geometry", "2-D rope")
    _one_line_exit_2(_run("fold-bias", path, "-o", out, "--k", "--tower", "audio"), "no such attention stack",
                     "'vision'")
    assert not out.exists()


def test_fold_k_on_whisper_audio_says_nothing_to_fold(tmp_path):
    """Whisper's encoder has no key bias by design (clip.cpp asserts it): --k is refused, not a no-op."""
    _, path = mmproj_pair("qwen2_audio@mm")
    _one_line_exit_2(_run("fold-bias", path, "-o", tmp_path / "x.gguf", "--k"), "no key bias")


def test_mmproj_bad_metadata_is_one_line_exit_2(tmp_path):
    import gguf
    _, path = mmproj_pair("idefics3@mm")
    K = gguf.Keys.ClipVision
    missing = rewrite_gguf(path, tmp_path / "nohead.gguf", drop=(K.Attention.HEAD_COUNT,))
    for cmd in ("inspect", "analyze"):
        _one_line_exit_2(_run(cmd, missing), K.Attention.HEAD_COUNT, "missing")
    no_width = rewrite_gguf(path, tmp_path / "nowidth.gguf", drop=(K.EMBEDDING_LENGTH,))
    _one_line_exit_2(_run("inspect", no_width), K.EMBEDDING_LENGTH, "missing")
    # 3 heads of 32 // 3 = 10: 30 rows, the tensors have 32
    wrong = rewrite_gguf(path, tmp_path / "heads3.gguf",
                         values={K.Attention.HEAD_COUNT: (3, gguf.GGUFValueType.UINT32)})
    _one_line_exit_2(_run("inspect", wrong), "v.blk.0.attn_q", "3 heads")
    # a wider embedding_length: 2 heads of 24 = 48 rows
    wide = rewrite_gguf(path, tmp_path / "wide.gguf", values={K.EMBEDDING_LENGTH: (48, gguf.GGUFValueType.UINT32)})
    _one_line_exit_2(_run("inspect", wide), "48", "shape")
    bad_type = rewrite_gguf(path, tmp_path / "strheads.gguf",
                            values={K.Attention.HEAD_COUNT: ("two", gguf.GGUFValueType.STRING)})
    _one_line_exit_2(_run("inspect", bad_type), K.Attention.HEAD_COUNT)


def test_unplaced_projector_attention_bias_is_warned_and_a_lint_error(tmp_path):
    """A resampler's attention (gguf-py V_RESMPL_ATTN_K, MiniCPM-V's) is not an encoder row: named in the
    warning, and an unplaced-bias lint error."""
    import gguf

    from ckpt_surgeon import inspect, lint
    _, path = mmproj_pair("idefics3@mm")
    name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_RESMPL_ATTN_K] + ".bias"
    f = rewrite_gguf(path, tmp_path / "resampler.gguf", tensors={name: np.ones(32)})
    rep = inspect(str(f))
    assert rep.skipped == (name,) and any("could not be placed" in w and name in w for w in rep.warnings)
    assert [x.check for x in lint(str(f)).errors] == ["unplaced-bias"]


def test_unknown_projector_type_claims_nothing(tmp_path):
    import gguf

    from ckpt_surgeon import inspect
    _, path = mmproj_pair("idefics3@mm")
    f = rewrite_gguf(path, tmp_path / "unknown.gguf",
                     values={gguf.Keys.Clip.PROJECTOR_TYPE: ("some_future_projector", gguf.GGUFValueType.STRING)})
    rep = inspect(str(f))
    assert rep.position.type == "unknown" and rep.layers_with_qkv_bias == 3
    assert {lr.extra["k_bias_redundancy"]["class"] for lr in rep.layers} == {"unknown"}
    _one_line_exit_2(_run("fold-bias", f, "-o", tmp_path / "x.gguf", "--k"), "some_future_projector",
                     "nothing was folded")


def test_vision_and_audio_encoders_in_one_file(tmp_path):
    """A file with both encoders (Qwen2.5-Omni, Gemma 3n, Voxtral-style): the vision one is the main stack and
    the audio one a tower, each with its own keys and projector type (clip.vision.projector_type /
    clip.audio.projector_type).  Made from the two converter files with gguf-py's writer."""
    import gguf

    from ckpt_surgeon import inspect
    _, vis = mmproj_pair("idefics3@mm")
    _, aud = mmproj_pair("qwen2_audio@mm")
    r = gguf.GGUFReader(aud)
    V = gguf.GGUFValueType
    values = {k: (f.contents(), f.types[0]) for k, f in r.fields.items() if k.startswith("clip.audio.")}
    values[gguf.Keys.ClipAudio.PROJECTOR_TYPE] = ("qwen2a", V.STRING)
    values[gguf.Keys.ClipVision.PROJECTOR_TYPE] = ("idefics3", V.STRING)
    tensors = {t.name: np.asarray(t.data) for t in r.tensors if t.name.startswith("a.")}
    f = rewrite_gguf(vis, tmp_path / "both.gguf", values=values, tensors=tensors)
    d = inspect(str(f)).to_dict()
    assert [(t["name"], t["kind"], t["num_layers"]) for t in d["towers"]] == [("vision", "vision", 3),
                                                                             ("audio", "audio", 3)]
    assert d["towers"][1]["position_encoding"]["type"] == "absolute" and d["skipped"] == []
    assert all(lr["k_bias"] is None and lr["q_bias"] and lr["v_bias"] for lr in d["towers"][1]["layers"])
    res = _run("fold-bias", f, "-o", tmp_path / "out.gguf", "--k")
    assert res.exit_code == 0, res.output
    assert "audio" in res.output and "biases kept" in res.output


# --- llama.cpp's own runtime: the encoder's output embeddings (libmtmd, through llama-cpp-python) ------------

def _text_gguf(tiny, tmp_path, n_embd: int):
    """A text model GGUF of width ``n_embd`` (mtmd checks the mmproj's output width against it and tokenizes the
    image's marker text with its vocabulary; its weights play no part in the encoder's output): a tiny
    transformers Llama with the llama fixture's tokenizer, written by tests/gguf_util.py."""
    import shutil

    import transformers

    from gguf_util import write_gguf
    tok = tiny("llama")
    cfg = transformers.LlamaConfig(hidden_size=n_embd, intermediate_size=2 * n_embd, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2,
                                   vocab_size=json.loads((tok / "config.json").read_text())["vocab_size"])
    folder = tmp_path / f"text{n_embd}"
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, folder / f)
    return write_gguf(folder, tmp_path / f"text{n_embd}.gguf")


def _encode(mmproj, text_gguf, side: int) -> np.ndarray:
    """llama.cpp's encoder output (tokens x n_embd, float32) for one fixed random side x side RGB image, flash
    attention off (its F16 accumulation would blur the comparison to ~1e-4)."""
    import ctypes

    import llama_cpp
    from llama_cpp import mtmd_cpp as M
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(text_gguf).encode(), llama_cpp.llama_model_default_params())
    assert model
    p = M.mtmd_context_params_default()
    p.use_gpu, p.n_threads, p.warmup, p.print_timings, p.flash_attn_type = False, 2, False, False, 0
    ctx = M.mtmd_init_from_file(str(mmproj).encode(), model, p)
    assert ctx, f"llama.cpp could not load {mmproj}"
    img = np.random.default_rng(0).integers(0, 256, size=side * side * 3, dtype=np.uint8)
    bmp = M.mtmd_bitmap_init(side, side, (ctypes.c_uint8 * img.size).from_buffer_copy(img.tobytes()))
    chunks = M.mtmd_input_chunks_init()
    part = M.mtmd_input_part(text=None, bitmap=bmp)
    assert M.mtmd_tokenize_from_parts(ctx, chunks, (ctypes.POINTER(M.mtmd_input_part) * 1)(ctypes.pointer(part)),
                                      1, False) == 0
    n_embd = llama_cpp.llama_model_n_embd(model)
    out = []
    for i in range(M.mtmd_input_chunks_size(chunks)):
        ch = M.mtmd_input_chunks_get(chunks, i)
        if M.mtmd_input_chunk_get_type(ch) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            continue
        n = M.mtmd_input_chunk_get_n_tokens(ch)
        assert M.mtmd_encode_chunk(ctx, ch) == 0
        out.append(np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n * n_embd,)).reshape(n, n_embd).copy())
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bmp)
    M.mtmd_free(ctx)
    llama_cpp.llama_model_free(model)
    assert len(out) == 1
    return out[0]


def _scaled(path, out, suffix: str, factor: float):
    """A copy of ``path`` with every ``*<suffix>`` tensor multiplied by ``factor`` (gguf-py's writer)."""
    import gguf
    r = gguf.GGUFReader(path)
    return rewrite_gguf(path, out, tensors={t.name: np.asarray(t.data) * np.float32(factor) for t in r.tensors
                                            if t.name.endswith(suffix)}, replace=True)


def test_llamacpp_runs_the_folded_mmproj_to_the_same_embeddings(tiny, tmp_path):
    """llama.cpp itself (libmtmd) encodes an image with Gemma 3's mmproj before and after fold-bias --k --v:
    the same output embeddings (to 1e-6 of their scale: float32 softmax of logits shifted by a constant per
    row, and W_o b_v added before instead of after the attention average).  Controls that the comparison can
    fail: zeroing the query biases moves the output; on Qwen2-VL's 2-D rotary tower, which fold-bias refuses,
    zeroing the key biases moves it too."""
    _, g3 = mmproj_pair("gemma3")
    out = tmp_path / "folded.gguf"
    assert _run("fold-bias", g3, "-o", out, "--k", "--v").exit_code == 0
    text64 = _text_gguf(tiny, tmp_path, 64)
    base = _encode(g3, text64, 128)
    scale = float(np.abs(base).max())
    assert base.shape == (4, 64) and scale > 0.1
    assert np.abs(_encode(out, text64, 128) - base).max() <= 1e-6 * scale
    q0 = _scaled(g3, tmp_path / "q0.gguf", "attn_q.bias", 0.0)
    assert np.abs(_encode(q0, text64, 128) - base).max() > 1e-3 * scale
    _, qv = mmproj_pair("qwen2_vl@mm")
    import gguf
    width = next(t for t in gguf.GGUFReader(qv).tensors if t.name == "mm.2.bias").data.shape[0]
    text = _text_gguf(tiny, tmp_path, width)
    rope = _encode(qv, text, 56)           # resized to 84 px by llama.cpp: 6 x 6 patches, merged to 3 x 3 tokens
    k0 = _scaled(qv, tmp_path / "k0.gguf", "attn_k.bias", 0.0)
    # measured 6.6e-5 of the output's scale (the merger's LayerNorm and the tiny random tower damp it): 65 times
    # the tolerance the exact fold is held to above, which it meets with 0.0
    assert np.abs(_encode(k0, text, 56) - rope).max() > 1e-5 * float(np.abs(rope).max())
