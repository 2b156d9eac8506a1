"""The mixture rules (ckpt_surgeon/conversion/quant_mix.py) against llama.cpp's own, on model shapes no
tiny fixture has: 80-layer "70B" models, Falcon at k-quant widths, 8-expert models, MLA, odd
widths, every file type.

libllama exports the type selection itself for tools (``llama-ext.h``: ``llama_quant_model_from_metadata``,
``llama_quant_init``, ``llama_quant_compute_types``; C++ symbols, called here through ctypes by
their mangled names) over ``ggml_tensor`` headers made with libggml-base (no data).  It runs
``llama_tensor_get_type`` as ``llama_model_quantize`` does, without an importance matrix (it resets
``has_imatrix``; the imatrix branches are checked on real files in tests/test_quantize.py), over
the tensors in the order given: llama.cpp's loader order, which quant_mix reproduces (and
test_quantize.py checks on real files).  The helper's mock model infers the one model size the
mixture reads (LLM_TYPE_70B) for llama only (llama-quant.cpp ``llama_quant_model_from_metadata``);
the real loader also sets it for 80-layer qwen2 / olmo / deci and 68-layer jais2 models, which
quant_mix follows (``_LAYERS_70B``) and this test cannot check.
"""
from __future__ import annotations

import ctypes

import pytest

from ckpt_surgeon.conversion.quant_mix import FTYPES, MixModel, _weights_order, allows_quantization, tensor_types

import gguf  # noqa: E402
import llama_cpp  # noqa: E402  (the reference; installed by the test extra: a missing runtime is a broken set-up, not a skip)


class _Desc(ctypes.Structure):
    # struct llama_quant_model_desc (src/llama-ext.h)
    _fields_ = [("architecture", ctypes.c_char_p), ("n_embd", ctypes.c_uint32), ("n_ff", ctypes.c_uint32),
                ("n_layer", ctypes.c_uint32), ("n_head", ctypes.c_uint32), ("n_head_kv", ctypes.c_uint32),
                ("n_expert", ctypes.c_uint32), ("n_embd_head_k", ctypes.c_uint32), ("n_embd_head_v", ctypes.c_uint32)]


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _fn(lib, mangled: str, restype, argtypes):
    f = getattr(lib, mangled)
    f.restype, f.argtypes = restype, argtypes
    return f


@pytest.fixture(scope="module")
def llama_types():
    from ckpt_surgeon.formats.quant import ggml_quant
    lib = llama_cpp.llama_cpp._lib
    g = ggml_quant.lib()
    g.ggml_init.restype, g.ggml_init.argtypes = ctypes.c_void_p, [_InitParams]
    g.ggml_free.argtypes = [ctypes.c_void_p]
    g.ggml_new_tensor.restype = ctypes.c_void_p
    g.ggml_new_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    g.ggml_set_name.restype, g.ggml_set_name.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    from_meta = _fn(lib, "_Z31llama_quant_model_from_metadataPK22llama_quant_model_desc", ctypes.c_void_p,
                    [ctypes.POINTER(_Desc)])
    init = _fn(lib, "_Z16llama_quant_initPK11llama_modelPK27llama_model_quantize_params", ctypes.c_void_p,
               [ctypes.c_void_p, ctypes.c_void_p])
    free = _fn(lib, "_Z16llama_quant_freeP19quantize_state_impl", None, [ctypes.c_void_p])
    compute = _fn(lib, "_Z25llama_quant_compute_typesP19quantize_state_impl11llama_ftypePP11ggml_tensorP9ggml_typem",
                  None, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                         ctypes.c_size_t])
    model_free = llama_cpp.llama_cpp._lib.llama_model_free
    model_free.argtypes = [ctypes.c_void_p]

    def run(desc: dict, tensors: list, ftypes) -> dict:
        d = _Desc(desc["arch"].encode(), desc["n_embd"], desc["n_ff"], desc["n_layer"], desc["n_head"],
                  desc["n_head_kv"], desc["n_expert"], desc["head_dim"], desc["head_dim"])
        model = from_meta(ctypes.byref(d))
        params = llama_cpp.llama_model_quantize_default_params()
        qs = init(model, ctypes.addressof(params))
        ctx = g.ggml_init(_InitParams(1 << 24, None, True))
        try:
            ptrs = []
            for name, shape in tensors:
                ne = (ctypes.c_int64 * len(shape))(*reversed(shape))
                t = g.ggml_new_tensor(ctx, 0, len(shape), ne)
                g.ggml_set_name(t, name.encode())
                ptrs.append(t)
            arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
            out = {}
            for ftype in ftypes:
                res = (ctypes.c_int * len(ptrs))()
                compute(qs, int(gguf.LlamaFileType[FTYPES[ftype][0]]), arr, res, len(ptrs))
                out[ftype] = {n: gguf.GGMLQuantizationType(res[i]).name for i, (n, _) in enumerate(tensors)}
            return out
        finally:
            g.ggml_free(ctx)
            free(qs)
            model_free(model)
    return run


def _model(arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_expert=0, *, tied=False, fused=False, mla=False,
           shexp=False, vocab=1000):
    """GGUF tensor names and shapes (numpy order) of a model of that geometry."""
    hd = n_embd // n_head
    t = [("token_embd.weight", (vocab, n_embd)), ("output_norm.weight", (n_embd,))]
    if not tied:
        t.append(("output.weight", (vocab, n_embd)))
    for i in range(n_layer):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", (n_embd,)))
        if fused:
            t.append((b + "attn_qkv.weight", ((n_head + 2 * n_head_kv) * hd, n_embd)))
        elif mla:
            t += [(b + "attn_q.weight", (n_head * hd, n_embd)), (b + "attn_kv_a_mqa.weight", (96, n_embd)),
                  (b + "attn_kv_a_norm.weight", (64,)), (b + "attn_kv_b.weight", (n_head * 2 * hd, 64))]
        else:
            t += [(b + "attn_q.weight", (n_head * hd, n_embd)), (b + "attn_k.weight", (n_head_kv * hd, n_embd)),
                  (b + "attn_v.weight", (n_head_kv * hd, n_embd))]
        t.append((b + "attn_output.weight", (n_embd, n_head * hd)))
        if n_expert:
            t += [(b + "ffn_gate_inp.weight", (n_expert, n_embd)),
                  (b + "ffn_gate_exps.weight", (n_expert, n_ff, n_embd)),
                  (b + "ffn_up_exps.weight", (n_expert, n_ff, n_embd)),
                  (b + "ffn_down_exps.weight", (n_expert, n_embd, n_ff))]
            if shexp:
                t += [(b + "ffn_gate_inp_shexp.weight", (1, n_embd)), (b + "ffn_gate_shexp.weight", (n_ff, n_embd)),
                      (b + "ffn_up_shexp.weight", (n_ff, n_embd)), (b + "ffn_down_shexp.weight", (n_embd, n_ff))]
        else:
            t += [(b + "ffn_gate.weight", (n_ff, n_embd)), (b + "ffn_up.weight", (n_ff, n_embd)),
                  (b + "ffn_down.weight", (n_embd, n_ff))]
    return t


CASES = {
    # name: (arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_expert, options)
    "llama-70b": ("llama", 80, 512, 1024, 8, 1, 0, {}),             # LLM_TYPE_70B: attn_v Q3/Q4_K -> Q5_K
    "llama-65b": ("llama", 80, 512, 1024, 8, 8, 0, {}),             # 80 layers, no GQA: not 70B
    "llama-gqa4-tied": ("llama", 16, 512, 1536, 8, 2, 0, {"tied": True}),
    "falcon": ("falcon", 32, 512, 2048, 8, 1, 0, {"fused": True}),
    "phi3-fused": ("phi3", 12, 256, 768, 4, 4, 0, {"fused": True}),
    "mixtral-8": ("llama", 8, 256, 512, 4, 1, 8, {}),               # n_expert == 8 branches
    "qwen2moe-4": ("qwen2moe", 6, 256, 256, 4, 4, 4, {"shexp": True}),
    "deepseek2-mla": ("deepseek2", 5, 256, 256, 4, 4, 0, {"mla": True}),
    "odd-896": ("qwen2", 8, 896, 4864, 14, 2, 0, {"tied": True}),   # fallback types
    "odd-100": ("llama", 4, 100, 320, 4, 4, 0, {}),                 # not whole 32-blocks: F16
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixture_is_llama_cpps(case, llama_types):
    arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_expert, opts = CASES[case]
    tensors = _model(arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_expert, **opts)
    quantizable = sorted(((n, s) for n, s in tensors if allows_quantization(n, s)), key=lambda t: _weights_order(t[0]))
    desc = dict(arch=arch, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
                n_expert=n_expert, head_dim=n_embd // n_head)
    theirs = llama_types(desc, quantizable, FTYPES)
    model = MixModel(arch, n_layer, n_head, n_head_kv, n_expert)
    kinds = set()
    for ftype in FTYPES:
        ours = tensor_types([(n, s, "F32") for n, s in tensors], ftype, model)
        for name, _ in quantizable:
            assert ours[name].ggml_type == theirs[ftype][name], (case, ftype, name, ours[name].ggml_type,
                                                                  theirs[ftype][name])
            kinds.add(ours[name].ggml_type)
    assert len(kinds) >= 5, kinds          # the file types really spread over the types
