"""Quantized checkpoints (``fixtures/quant/<scheme>``, written by the real quantizers) converted to
GGUF: every logical weight dequantized to the outtype.  Where llama.cpp's ``convert_hf_to_gguf.py``
dequantizes the scheme itself (``dequant_model``: fp8 block, gptq, compressed-tensors float / int /
pack-quantized) our file is byte-identical to its output (same runner and comparison as
tests/test_llamacpp_converter.py); where it refuses (AWQ, auto-round's own format, bitsandbytes,
MLX) the f32 tensors equal the producer's own dequantization (``oracle.safetensors``); on
gptqmodel's reciprocal FP8 scales, where llama.cpp writes inf, ours equal the oracle."""
from __future__ import annotations

import numpy as np
import pytest
from test_llamacpp_converter import OUTTYPES, _reference, _run_reference, assert_matches_reference
from test_quant_read import BASE, QUANT, SCHEMES, _oracle
from test_quantize import assert_same_tensors, llama_quantize

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.conversion import hf_to_gguf

assert BASE.is_dir(), f"{BASE}: the quantized fixtures are committed test data (fixtures/quant/README.md)"

# What llama.cpp's converter does with each fixture: "same" (it dequantizes it as the producer
# does), "inf" (it multiplies gptqmodel's 448/amax scales: wrong), or the error it stops with.
LLAMACPP = {
    "gptqmodel_gptq": "same", "autoround_gptq": "same", "fp8_block_deepseek": "same",
    "ct_fp8_block": "same", "ct_fp8_dynamic": "same", "ct_w8a8_int": "same", "ct_w4a16_gptq": "same",
    "ct_w4a16_awq": "same",
    "gptqmodel_fp8_block": "inf",
    "autoawq_gemm": "Quant method is not yet supported: 'awq'", "gptqmodel_awq": "Quant method is not yet supported: 'awq'",
    "autoround_awq": "Quant method is not yet supported: 'awq'",
    "autoround_autoround": "Quant method is not yet supported: 'auto-round'",
    "bnb_nf4": "Quant method is not yet supported: 'bitsandbytes'",
    "bnb_int8": "Quant method is not yet supported: 'bitsandbytes'",
    "mlx_4bit": "Can not map tensor", "mlx_8bit": "Can not map tensor",
    # issue 49: NVFP4 kept NVFP4 (blocks moved, .scale / .input_scale beside), ModelOpt FP8 dequantized
    "ct_nvfp4a16": "same", "ct_nvfp4": "same", "modelopt_nvfp4": "same", "modelopt_fp8": "same",
    "modelopt_mixed": "same", "modelopt_fp8_pc_pt": "same",
    "ct_mxfp4a16": "Quant format 'mxfp4-pack-quantized' for method 'compressed-tensors' is not yet supported",
    "ct_mxfp8a16": "Quant format 'mxfp8-quantized' for method 'compressed-tensors' is not yet supported",
    "ct_mixed": "Can't handle multiple config groups for compressed-tensors yet",
}


def test_every_fixture_has_an_expectation():
    assert set(SCHEMES) <= set(LLAMACPP), sorted(set(SCHEMES) - set(LLAMACPP))


def _gguf_name(hf: str) -> str:
    layer, rest = hf.removeprefix("model.layers.").split(".", 1)
    part = {"self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
            "self_attn.o_proj.weight": "attn_output", "mlp.gate_proj.weight": "ffn_gate",
            "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}[rest]
    return f"blk.{layer}.{part}.weight"


def _logical_gguf(hf: str) -> str:
    return {"lm_head.weight": "output.weight", "model.embed_tokens.weight": "token_embd.weight"}.get(hf) or _gguf_name(hf)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if LLAMACPP.get(s) == "same"])
def test_convert_byte_identical_to_llama_cpp(scheme, tmp_path):
    src = QUANT / scheme
    ref_dir = _reference(src, scheme)
    for outtype in OUTTYPES:
        ours = hf_to_gguf(src, tmp_path / f"{outtype}.gguf", dtype=outtype, name="tiny")
        assert_matches_reference(ours, ref_dir / f"{outtype}.gguf", scheme, outtype)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if LLAMACPP.get(s) != "same"])
def test_convert_equals_producer_where_llama_cpp_cannot(scheme, tmp_path):
    """f32: each quantized weight as the producer dequantizes it; llama.cpp refuses the scheme (or,
    for gptqmodel's FP8, writes inf)."""
    ours = hf_to_gguf(QUANT / scheme, tmp_path / "f32.gguf", dtype="f32", name="tiny")
    with open_checkpoint(ours) as g:
        for name, want in _oracle(scheme).items():
            gname = _logical_gguf(name)
            sname = gname.replace(".weight", ".scale")
            if sname in g.tensors:
                # an NVFP4 weight kept NVFP4 (blocks bit for bit: tests/test_quant_fp4.py), its per-tensor scale
                # beside it: within compressed-tensors' bfloat16 rounding (half an ulp, <= 2^-8 relative)
                np.testing.assert_allclose(g.read(gname) * g.read(sname)[0], want, rtol=2.0 ** -8 + 2.0 ** -21,
                                           atol=0, err_msg=name)
            else:
                np.testing.assert_array_equal(g.read(gname), want, err_msg=name)
    expect = LLAMACPP[scheme]
    (tmp_path / "ref").mkdir()
    r = _run_reference(QUANT / scheme, tmp_path / "ref", ("f32", "f16") if expect == "inf" else ("f32",))
    if expect == "inf":
        # llama.cpp multiplies by 448/amax where the producer divides: values (448/amax)^2 too large,
        # past the float16 range (inf) in f16
        assert r.returncode == 0, r.stderr[-1500:]
        oracle = {n: w for n, w in _oracle(scheme).items() if n.startswith("model.layers.")}
        with open_checkpoint(tmp_path / "ref" / "f32.gguf") as ref:
            for n, w in oracle.items():
                assert np.abs(ref.read(_gguf_name(n))).max() > 100 * np.abs(w).max(), n
        with open_checkpoint(tmp_path / "ref" / "f16.gguf") as ref:
            assert sum(int(np.count_nonzero(np.isinf(ref.read(_gguf_name(n))))) for n in oracle) > 0
    else:
        assert r.returncode != 0 and expect in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("scheme", ["mlx_4bit", "gptqmodel_gptq", "ct_fp8_block", "gptqmodel_fp8_block", "bnb_nf4",
                                    "autoawq_gemm"])
def test_quantized_source_to_q4_k_m_is_llama_quantize(scheme, tmp_path):
    """``convert --dtype q4_k_m`` from a quantized checkpoint takes the same one-pass path as a dense
    one (issue 26): every tensor equals llama.cpp's own quantizer (``llama_model_quantize``) run
    on our F32 GGUF of the same checkpoint (byte-identical to llama.cpp's converter where it reads
    the scheme, the producer's dequantization where it cannot: the tests above).  Every Linear
    here is a multiple of 256 wide, so the mixture uses the real k-quant types."""
    src = QUANT / scheme
    f32 = hf_to_gguf(src, tmp_path / "f32.gguf", dtype="f32", name="tiny")
    ref = tmp_path / "ref.q4_k_m.gguf"
    llama_quantize(f32, ref, "q4_k_m")
    ours = hf_to_gguf(src, tmp_path / "ours.q4_k_m.gguf", dtype="q4_k_m", name="tiny")
    types = assert_same_tensors(ours, ref, f"{scheme} q4_k_m")
    assert {"Q4_K", "Q6_K"} <= set(types.values()), sorted(set(types.values()))
