"""Write GGUF test files from the tiny HF fixtures with gguf-py's ``GGUFWriter`` (the reference
writer), and locate the byte offsets of a GGUF's sections with gguf-py's ``GGUFReader`` (so the
damaged-file tests never depend on the parser they test).

What the writer does, mirroring llama.cpp's ``convert_hf_to_gguf.py`` where it matters:

* names: gguf-py ``TensorNameMap`` (HF name -> ``blk.N.attn_q.weight`` ...);
* llama-arch Q/K rows (weights and biases) permuted to interleaved rotary pairs
  (``LlamaModel.permute``: ``reshape(n_head, 2, hd/2, ...).swapaxes(1, 2)``), K with the kv heads;
* GPT-2 ``Conv1D`` weights transposed to ``[out, in]`` (``GPT2Model.modify_tensors``);
* fused QKV always written in concat ``[Q; K; V]`` order (``attn_qkv``): per-head ``[h, 3, d]``
  (GPT-NeoX, BLOOM) and grouped ``[kv, g + 2, d]`` (Falcon new decoder) are reordered, concat
  (Phi-3 ``qkv_proj``, GPT-2 ``c_attn``) is kept;
* hyper-parameters under ``{arch}.*`` keys; a BPE (``gpt2``) or WordPiece (``bert``) vocabulary.

Reused by the convert / surgery tests: ``write_gguf(tiny("qwen2"), tmp_path / "q.gguf")``.

llama.cpp (llama-cpp-python) loads the qwen2, llama, llama_bias, mistral, gpt2, phi and
starcoder2 files and matches transformers' logits (``test_written_gguf_runs_in_llama_cpp_like_transformers``);
for the other families it wants more arch-specific metadata or special tokens than the tiny
fixtures provide, so use those files with our reader / gguf-py only.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# HF model_type -> GGUF general.architecture (llama.cpp writes Mistral as "llama").
GGUF_ARCH = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
    "gemma3": "gemma3", "phi3": "phi3", "phi": "phi2", "gpt2": "gpt2", "gpt_neox": "gptneox", "bloom": "bloom",
    "falcon": "falcon", "bert": "bert", "starcoder2": "starcoder2", "olmo2": "olmo2",
}
_CONV1D_MODULES = (".c_attn.", ".c_proj.", ".c_fc.")
_EPS_KEYS = ("layer_norm_epsilon", "layer_norm_eps", "norm_epsilon")


def _vocab(folder: Path, vocab_size: int) -> dict:
    """tokens / token types / merges from tokenizer.json, padded to the model's vocab_size."""
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tj["model"]
    by_id = {i: t for t, i in model["vocab"].items()}
    special = set()
    for at in tj.get("added_tokens", []):
        by_id[at["id"]] = at["content"]
        if at.get("special"):
            special.add(at["id"])
    n = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    # llama.cpp token types: 1 normal, 3 control, 5 unused
    types = [3 if i in special else (1 if i in by_id else 5) for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"model": "bert" if model["type"] == "WordPiece" else "gpt2", "tokens": tokens, "types": types,
            "merges": merges}


def write_gguf(src: str | Path, out: str | Path, *, qtype: str = "F32", name: str | None = None) -> Path:
    """Write the HF folder ``src`` (a tiny fixture) as a GGUF file at ``out``.

    ``qtype``: type for 2-D weights whose rows are whole blocks ("F32", "F16", "BF16", "Q8_0",
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4": what gguf-py can quantize);
    1-D tensors (biases, norms) stay F32, as llama.cpp keeps them.
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    from ckpt_surgeon.arch import families as F
    from ckpt_surgeon.arch.layouts import llama_permute_index, qkv_row_index
    from ckpt_surgeon.checkpoint import open_checkpoint

    src, out = Path(src), Path(out)
    with open_checkpoint(src) as ck:
        cfg = dict(ck.config)
        lay = ck.layout()
        state = {n: ck.read(n) for n in ck.tensors}
    arch = GGUF_ARCH[cfg["model_type"]]
    fam = F.by_model_type(cfg["model_type"])
    h, kv, hd = lay.num_heads, lay.num_kv_heads, lay.head_dim
    n_layers = lay.num_layers
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    tmap = gguf.get_tensor_name_map(arch_enum, n_layers)
    qkv_modules = {m for r, m in fam.roles.items() if r == "qkv"} if fam else set()

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name or f"tiny-{cfg['model_type']}")
    w.add_block_count(n_layers)
    w.add_context_length(int(lay.max_positions or 2048))
    w.add_embedding_length(int(lay.hidden_size))
    ff = cfg.get("intermediate_size") or cfg.get("n_inner") or cfg.get("ffn_hidden_size") or 4 * lay.hidden_size
    w.add_feed_forward_length(int(ff))
    w.add_head_count(int(h))
    w.add_head_count_kv(int(kv))
    if hd * h != lay.hidden_size or cfg.get("head_dim"):
        w.add_key_length(int(hd))
        w.add_value_length(int(hd))
    if lay.position.type == "rope":
        w.add_rope_freq_base(float(lay.position.theta))
        w.add_rope_dimension_count(int(lay.position.rotary_dim))
    if "rms_norm_eps" in cfg:
        w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    else:
        eps = next((cfg[k] for k in _EPS_KEYS if k in cfg), 1e-5)
        w.add_layer_norm_eps(float(eps))
    if cfg.get("sliding_window"):
        w.add_sliding_window(int(cfg["sliding_window"]))
    w.add_file_type({"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9,
                     "TQ1_0": 36, "TQ2_0": 37, "MXFP4": 38}[qtype])
    voc = _vocab(src, int(cfg["vocab_size"]))
    w.add_tokenizer_model(voc["model"])
    w.add_token_list(voc["tokens"])
    w.add_token_types(voc["types"])
    if voc["merges"]:
        w.add_token_merges(voc["merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if isinstance(cfg.get(key), int):
            add(cfg[key])

    qt = Q[qtype]
    for hf_name, arr in state.items():
        gname = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            continue   # e.g. BERT's pooler, which llama.cpp does not convert either
        arr = np.asarray(arr, dtype=np.float32)
        kind = "weight" if hf_name.endswith(".weight") else "bias"
        if fam and fam.conv1d and kind == "weight" and arr.ndim == 2 and any(m in hf_name for m in _CONV1D_MODULES):
            arr = arr.T   # HF Conv1D stores [in, out]
        layout = lay.fused_layout
        if any(hf_name.endswith(f"{m}.{kind}") for m in qkv_modules) and layout in ("per_head", "grouped"):
            iq, ik, iv = qkv_row_index(layout, h, kv, hd)
            arr = np.concatenate([arr[iq], arr[ik], arr[iv]])
        if fam and fam.gguf_qk_permuted:
            if gname.endswith((".attn_q.weight", ".attn_q.bias")):
                arr = arr[llama_permute_index(h, hd)]
            elif gname.endswith((".attn_k.weight", ".attn_k.bias")):
                arr = arr[llama_permute_index(kv, hd)]
        arr = np.ascontiguousarray(arr)
        block = gguf.GGML_QUANT_SIZES[qt][0]
        if qt != Q.F32 and arr.ndim == 2 and arr.shape[-1] % block == 0:
            if qt == Q.F16:
                w.add_tensor(gname, arr.astype(np.float16))
            else:
                w.add_tensor(gname, gguf.quants.quantize(arr, qt), raw_dtype=qt)
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def section_offsets(path: str | Path) -> dict:
    """Byte offsets of a GGUF's parts, found with gguf-py's GGUFReader (the reference parser).

    Keys: ``kv`` (key -> offset of the pair), ``kv_value`` (key -> offset of the value, after the
    type), ``tensor_info`` (name -> offset of its entry), ``tensor_type`` / ``tensor_offset``
    (name -> offset of the u32 type / u64 data offset field), ``tensor_data`` (name -> absolute
    [start, end)), ``header_end`` (end of the tensor table), ``data_start``.
    """
    import gguf

    r = gguf.GGUFReader(str(path))
    kv, kv_value = {}, {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        kv[k] = f.offset
        kv_value[k] = f.offset + 8 + len(k.encode()) + 4
    info, ttype, toff, data = {}, {}, {}, {}
    header_end = 0
    for t in r.tensors:
        o = t.field.offset
        n_dims = len(t.shape)
        base = o + 8 + len(t.name.encode()) + 4 + 8 * n_dims
        info[t.name], ttype[t.name], toff[t.name] = o, base, base + 4
        data[t.name] = (t.data_offset, t.data_offset + int(t.n_bytes))
        header_end = max(header_end, base + 12)
    return {"kv": kv, "kv_value": kv_value, "tensor_info": info, "tensor_type": ttype, "tensor_offset": toff,
            "tensor_data": data, "header_end": header_end, "data_start": int(r.data_offset)}


def write_synthetic_llama(path: str | Path, *, hidden: int = 256, ffn: int = 512, vocab: int = 512, layers: int = 1,
                          seed: int = 0) -> Path:
    """A random llama-arch F32 GGUF whose rows are whole 256-element blocks, so that llama.cpp's
    quantizer can produce every K-quant from it (the tiny fixtures' 64-wide rows cannot)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic-llama")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(hidden // 64)
    w.add_head_count_kv(hidden // 128)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)

    def rnd(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    kv = hidden // 128 * 64
    w.add_tensor("token_embd.weight", rnd(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", rnd(vocab, hidden))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "attn_q.weight", rnd(hidden, hidden))
        w.add_tensor(p + "attn_k.weight", rnd(kv, hidden))
        w.add_tensor(p + "attn_v.weight", rnd(kv, hidden))
        w.add_tensor(p + "attn_output.weight", rnd(hidden, hidden))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(ffn, hidden))
        w.add_tensor(p + "ffn_up.weight", rnd(ffn, hidden))
        w.add_tensor(p + "ffn_down.weight", rnd(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def llama_quantize(src: str | Path, dst: str | Path, ftype: str) -> Path:
    """Quantize ``src`` with llama.cpp itself (llama-cpp-python's ``llama_model_quantize``).

    ``ftype`` is a llama_ftype suffix: "Q4_K_M", "Q6_K", "IQ4_XS" ...  Raises RuntimeError if
    llama.cpp refuses (IQ1/IQ2 types need an importance matrix).
    """
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype} (rc {rc})")
    return Path(dst)


def rewrite_gguf(src: Path, dst: Path, *, drop=(), set_kv: dict | None = None, tensors=None,
                 add: dict | None = None) -> Path:
    """Copy a GGUF with gguf-py (the reference reader/writer), dropping or changing metadata keys
    and tensors (``tensors(name, array) -> array | None``), adding the tensors ``add`` (name ->
    float32 array) after the others."""
    import gguf
    src, dst = Path(src), Path(dst)
    set_kv = dict(set_kv or {})
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = set_kv.pop(key) if key in set_kv else f.contents()
        if isinstance(value, tuple):     # (value, type), as for a key the file lacks: the file's type kept
            value = value[0]
        w.add_key_value(key, value, vtype, sub_type=sub)
    for key, (val, vtype) in set_kv.items():
        w.add_key_value(key, val, vtype)
    for t in r.tensors:
        data = np.array(t.data)
        if tensors is not None:
            data = tensors(t.name, data)
        if data is not None:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)   # quantized rows stay raw bytes
    for name, data in (add or {}).items():
        w.add_tensor(name, np.asarray(data, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def vocab_gguf(src: Path, dst: Path, *, drop=(), set_kv: dict | None = None) -> Path:
    """The metadata of a GGUF alone, no tensor (as llama.cpp's ``models/ggml-vocab-*.gguf``), keys
    dropped or set (``key -> value``, the file's own type kept; a new key: ``(value, GGUFValueType)``).
    Read with our header reader, which keeps each key's type: gguf-py's reader takes seconds to
    parse a 49k-token vocabulary in Python."""
    import gguf
    from ckpt_surgeon.formats.gguf import read_header
    h = read_header(src)
    set_kv = dict(set_kv or {})
    w = gguf.GGUFWriter(str(dst), h.metadata["general.architecture"])
    for key, value in h.metadata.items():
        if key == "general.architecture" or key in drop:
            continue
        f = h.fields[key]
        value = set_kv.pop(key) if key in set_kv else value
        sub = gguf.GGUFValueType[f.item_type] if f.item_type else None
        value = list(value) if sub is not None else value
        w.add_key_value(key, value, gguf.GGUFValueType[f.type], sub_type=sub)
    for key, (val, vtype) in set_kv.items():
        w.add_key_value(key, val, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
