"""Dequantization: element-exact against gguf-py's ``gguf.quants.dequantize`` (the reference).

"Element-exact" means: the same NaN positions, and bit-identical float32 everywhere else
(so even -0.0 vs 0.0 would fail).  Random bytes exercise every bit pattern, including f16
scales that are NaN/Inf/subnormal; a second strategy uses finite scales as real files have.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf
from gguf import GGMLQuantizationType as Q

from ckpt_surgeon.formats.quant import dequant as dq
from ckpt_surgeon.formats.quant import ggml_types as GT
from ckpt_surgeon.errors import UnsupportedError
from ckpt_surgeon.formats.gguf import GGUFFile

from gguf_util import write_gguf

# Every type gguf-py can dequantize (its quantization classes plus the two plain floats).
REFERENCE_TYPES = sorted({"F32", "F16"} | {t.name for t in gguf.quants._type_traits})

# Byte offsets of float16 scale fields per block (ggml-common.h), to build realistic blocks.
F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "TQ1_0": (52,), "TQ2_0": (64,), "IQ4_NL": (0,), "IQ4_XS": (0,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
}


def assert_same_floats(ours: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    ours = np.asarray(ours)
    ref = np.asarray(ref, dtype=np.float32)
    assert ours.dtype == np.float32, what
    assert ours.shape == ref.shape, what
    a, b = ours.reshape(-1), ref.reshape(-1)
    na, nb = np.isnan(a), np.isnan(b)
    assert np.array_equal(na, nb), f"{what}: NaN positions differ"
    diff = np.flatnonzero(a[~na].view(np.uint32) != b[~nb].view(np.uint32))
    assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {diff[0]}: {a[~na][diff[0]]!r} vs {b[~nb][diff[0]]!r}"


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's dequantization of a flat byte array, as float32 rows of blocks."""
    t = GT.TYPES_BY_NAME[name]
    rows = raw.reshape(-1, t.type_size)
    with np.errstate(all="ignore"):
        if name == "F32":
            return rows.view(np.float32).reshape(-1)
        if name == "F16":
            return rows.view(np.float16).astype(np.float32).reshape(-1)
        return np.asarray(gguf.quants.dequantize(rows, Q[name]), dtype=np.float32).reshape(-1)


def test_type_table_matches_ggml():
    # ids, block sizes and byte sizes agree with gguf-py's mirror of ggml's type_traits ...
    for qt in Q:
        t = GT.GGML_TYPES[int(qt)]
        assert t.name == qt.name
        assert (t.block_size, t.type_size) == tuple(gguf.GGML_QUANT_SIZES[qt])
    assert len(GT.GGML_TYPES) == len(Q)
    # ... and with ggml.c's type_traits for a few types, written out (the table is not empty or shifted)
    facts = {0: ("F32", 1, 4), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 30: ("BF16", 1, 2)}
    for tid, (name, block, size) in facts.items():
        t = GT.ggml_type(tid)
        assert (t.name, t.block_size, t.type_size, t.quantized) == (name, block, size, block > 1)
        assert GT.ggml_type(name) is t and GT.nbytes(name, (3, 2 * block)) == 6 * size
    assert not GT.known(4) and not GT.known("Q4_2")


def test_type_table_matches_the_ggml_library():
    """Every type the installed libggml has: its own traits (block size, bytes, quantized) are the table's."""
    pytest.importorskip("llama_cpp")
    from ckpt_surgeon.formats.quant import ggml_quant
    g, seen, differ = ggml_quant.lib(), 0, {}
    for t in GT.GGML_TYPES.values():
        try:
            tr = g.ggml_get_type_traits(ggml_quant.type_id(t.name)).contents
        except UnsupportedError:            # a type newer than this library
            continue
        seen += 1
        if (tr.blck_size, tr.type_size, tr.is_quantized) != (t.block_size, t.type_size, t.quantized):
            differ[t.name] = (int(tr.type_size), t.type_size)
        assert ggml_quant.is_quantized(t.name) == t.quantized
    assert seen >= 30
    # The one known difference: gguf-py lists Q8_1 blocks as 40 bytes (two float32), ggml's block_q8_1
    # is 36 (a ggml_half2 and 32 int8).  Q8_1 is a dot-product intermediate that no quantizer writes to
    # a file; the table keeps gguf-py's figure, as the reader always has.
    assert differ == {"Q8_1": (36, 40)}


def test_we_dequantize_every_type_gguf_py_does():
    missing = [n for n in REFERENCE_TYPES if n not in dq.supported_types()]
    assert missing == []


@pytest.mark.parametrize("name", REFERENCE_TYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_blocks_match_gguf_py(name, data):
    t = GT.TYPES_BY_NAME[name]
    n_blocks = data.draw(st.integers(1, 24), label="blocks")
    raw = np.frombuffer(data.draw(st.binary(min_size=n_blocks * t.type_size, max_size=n_blocks * t.type_size)),
                        dtype=np.uint8)
    assert_same_floats(dq.dequantize(raw, name), reference(raw, name), name)


@pytest.mark.parametrize("name", sorted(F16_FIELDS))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_blocks_with_finite_scales_match_gguf_py(name, data):
    t = GT.TYPES_BY_NAME[name]
    n_blocks = data.draw(st.integers(1, 16), label="blocks")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, t.type_size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        scale = rng.uniform(-0.1, 0.1, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    raw = raw.reshape(-1)
    out = dq.dequantize(raw, name)
    assert np.isfinite(out).all()
    assert_same_floats(out, reference(raw, name), name)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "Q5_K", "Q3_K", "IQ2_XS", "MXFP4"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunked_and_threaded_paths_are_exact(monkeypatch, name, threads):
    # Small chunks force many chunks (and a ragged last one) through the thread pool.
    monkeypatch.setattr(dq, "CHUNK_ELEMENTS", 3 * 256)
    t = GT.TYPES_BY_NAME[name]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=37 * t.type_size, dtype=np.uint8)
    assert_same_floats(dq.dequantize(raw, name, threads=threads), reference(raw, name), name)


def test_shape_and_errors():
    t = GT.TYPES_BY_NAME["Q4_K"]
    raw = np.zeros(2 * t.type_size, np.uint8)
    assert dq.dequantize(raw, "Q4_K", (2, 256)).shape == (2, 256)
    assert dq.dequantize(bytes(raw), 12).shape == (512,)   # by id, from bytes
    with pytest.raises(ValueError, match="143 bytes is not a whole number of Q4_K blocks"):
        dq.dequantize(raw[:143], "Q4_K")
    with pytest.raises(ValueError, match=r"shape \(3, 256\) needs 768"):
        dq.dequantize(raw, "Q4_K", (3, 256))
    with pytest.raises(NotImplementedError, match="dequantizing ggml type Q8_K is not supported"):
        dq.dequantize(np.zeros(292, np.uint8), "Q8_K")
    with pytest.raises(KeyError):
        dq.ggml_type(99)


def test_native_types_keep_their_dtype():
    a = np.arange(-5, 5, dtype=np.int32)
    out = dq.dequantize(a.view(np.uint8), "I32", (10,))
    assert out.dtype == np.int32 and out.tolist() == a.tolist()


def test_torch_wrapper_float32_and_bfloat16():
    import torch

    rng = np.random.default_rng(3)
    t = GT.TYPES_BY_NAME["Q6_K"]
    raw = rng.integers(0, 256, size=(4, t.type_size), dtype=np.uint8)
    raw[:, 208:210] = rng.uniform(-0.1, 0.1, size=4).astype(np.float16).view(np.uint8).reshape(4, 2)
    ref = reference(raw.reshape(-1), "Q6_K")
    f32 = dq.dequantize_torch(raw, "Q6_K", (4, 256))
    assert f32.dtype == torch.float32 and f32.shape == (4, 256)
    assert_same_floats(f32.numpy(), ref.reshape(4, 256))
    bf16 = dq.dequantize_torch(raw, "Q6_K", (4, 256), dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16, torch.from_numpy(ref.reshape(4, 256)).to(torch.bfloat16))
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'bfloat16'"):
        dq.dequantize_torch(raw, "Q6_K", dtype="float16")


def test_real_smollm_tensors_match_gguf_py(smollm_gguf):
    """Every tensor of the shipped SmolLM2 Q4_1 file (Q4_1, Q8_0 token embedding, F32 norms)."""
    reader = gguf.GGUFReader(str(smollm_gguf))
    seen = set()
    with GGUFFile(smollm_gguf) as g:
        for t in reader.tensors:
            if t.tensor_type.name in seen and not t.name.startswith("token_embd"):
                continue   # one tensor per type is enough for speed; token_embd always
            seen.add(t.tensor_type.name)
            assert_same_floats(g.read(g.tensors[t.name]), gguf.quants.dequantize(t.data, t.tensor_type), t.name)
    assert seen == {"Q4_1", "Q8_0", "F32"}


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"])
def test_written_quantized_files_read_exactly(tiny, tmp_path, qtype):
    """Real quantized tensors: the tiny qwen2 model quantized by gguf-py, read back by our reader."""
    path = write_gguf(tiny("qwen2"), tmp_path / f"qwen2-{qtype}.gguf", qtype=qtype)
    reader = gguf.GGUFReader(str(path))
    types = set()
    with GGUFFile(path) as g:
        for t in reader.tensors:
            types.add(t.tensor_type.name)
            data = t.data
            ref = (data.astype(np.float32) if t.tensor_type.name in ("F32", "F16")
                   else gguf.quants.dequantize(data, t.tensor_type))
            assert_same_floats(g.read(g.tensors[t.name]), ref, t.name)
    assert qtype in types


@pytest.fixture(scope="module")
def synthetic_f32(tmp_path_factory):
    from gguf_util import write_synthetic_llama

    return write_synthetic_llama(tmp_path_factory.mktemp("kquant") / "synthetic-f32.gguf")


# llama_ftype -> ggml types llama.cpp's quantizer writes for this model (checked, so the test
# cannot silently cover fewer types).  IQ1/IQ2/IQ3_XXS need an importance matrix: random blocks only.
LLAMA_FTYPES = {
    "Q4_K_M": {"Q4_K", "Q6_K"}, "Q3_K_M": {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"},
    "Q2_K": {"Q2_K", "Q3_K", "Q6_K"}, "Q6_K": {"Q6_K"}, "IQ4_XS": {"IQ4_XS", "Q6_K"}, "IQ4_NL": {"IQ4_NL", "Q6_K"},
    "IQ3_M": {"IQ3_S", "Q4_K", "Q6_K"}, "TQ1_0": {"TQ1_0", "Q4_K", "Q6_K"}, "TQ2_0": {"TQ2_0", "Q4_K", "Q6_K"},
    "Q5_0": {"Q5_0", "Q6_K"}, "Q5_1": {"Q5_1", "Q6_K"}, "Q4_0": {"Q4_0", "Q6_K"}, "BF16": {"BF16"},
}


@pytest.mark.parametrize("ftype", sorted(LLAMA_FTYPES))
def test_llama_cpp_quantized_tensors_match_gguf_py(synthetic_f32, tmp_path, ftype):
    """Real K-quant / IQ / ternary tensors made by llama.cpp's own quantizer, read by our reader."""
    import llama_cpp  # noqa: F401  (test extra)
    from gguf_util import llama_quantize

    path = llama_quantize(synthetic_f32, tmp_path / f"synthetic-{ftype}.gguf", ftype)
    reader = gguf.GGUFReader(str(path))
    types = set()
    with GGUFFile(path) as g:
        for t in reader.tensors:
            types.add(t.tensor_type.name)
            ref = t.data if t.tensor_type.name == "F32" else gguf.quants.dequantize(t.data, t.tensor_type)
            out = g.read(g.tensors[t.name])
            assert np.isfinite(out).all(), t.name
            assert_same_floats(out, ref, f"{ftype} {t.name}")
    assert types - {"F32"} == LLAMA_FTYPES[ftype]
