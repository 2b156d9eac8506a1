"""HF -> GGUF through the project's own streaming GGUF writer is byte-identical to gguf-py.

The reference is built here, from the same plan (:func:`plan_hf_to_gguf`: names, types, shapes,
hyper-parameters, vocabulary), the way llama.cpp's ``convert_hf_to_gguf.py`` writes a file:
gguf-py's ``GGUFWriter`` with its named ``add_*`` calls (``general.architecture`` first, then
name, file type, quantization version, hyper-parameters, vocabulary), whole tensors read,
transformed and encoded with ``gguf.quants.quantize`` (F32 / F16 / BF16 / Q8_0), then
``write_tensor_data``.  Ours must produce the same file, byte for byte, for every family the
converter covers, at every output type, from f32 and bf16 sources, and with tensors cut into
many chunks (so that chunk seams, head-aligned Q/K permutation chunks included, are exercised).

Our Q8_0 quantizer is also compared with ``gguf.quants.quantize`` directly on random data and on
the values where rounding is delicate.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_variants import build_variant, with_dtype  # noqa: E402

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.conversion import gguf_stream
from ckpt_surgeon.conversion import names as N
from ckpt_surgeon.conversion.to_gguf import hf_to_gguf, plan_hf_to_gguf
from ckpt_surgeon.conversion.transforms import forward as _transform_to_gguf
from ckpt_surgeon.formats.quant.quantize import quantize_q8_0

FAMILIES = ("qwen2", "qwen2_long", "qwen2_sharded", "llama", "llama_bias", "mistral", "qwen3", "phi3", "gpt2",
            "gemma3")
GGUF_DTYPES = ("f32", "f16", "bf16", "q8_0")


@pytest.fixture(scope="module")
def family(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("stream-families")
    cache: dict = {}

    def get(name: str, dtype: str = "float32") -> Path:
        if (name, dtype) not in cache:
            base = build_variant(tiny, name, root / name)
            cache[name, dtype] = with_dtype(base, dtype, root / f"{name}-{dtype}")
        return cache[name, dtype]
    return get


def gguf_py_reference(src: Path, dtype: str, out: Path) -> bytes:
    """The file gguf-py's GGUFWriter writes for our plan of ``src`` (see the module doc)."""
    import gguf

    ck = open_checkpoint(src)
    try:
        plan = plan_hf_to_gguf(ck, src, dtype, name="tiny")
        spec, hp = plan.spec, plan.hp
        w = gguf.GGUFWriter(path=None, arch=spec.gguf_arch)
        w.add_name("tiny")
        w.add_file_type(int(gguf.LlamaFileType[N.DTYPES[dtype][0]]))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key in spec.hparams:
            if key in hp:
                full = f"{spec.gguf_arch}.{N.GGUF_HPARAM_KEYS[key]}"
                (w.add_float32 if key in N.HPARAM_FLOATS else w.add_uint32)(full, hp[key])
        arrays = {"str[]": gguf.GGUFValueType.STRING, "i32[]": gguf.GGUFValueType.INT32,
                  "f32[]": gguf.GGUFValueType.FLOAT32}
        for key, value, kind in plan.vocab.key_values():
            if kind in arrays:
                w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=arrays[kind])
            else:
                {"str": w.add_string, "u32": w.add_uint32, "bool": w.add_bool}[kind](key, value)
        for p in plan.tensors:
            w.add_tensor_info(p.dst, p.shape, np.dtype(np.float32), p.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[p.ggml_type])
        w.write_header_to_file(path=out)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in plan.tensors:
            arr = _transform_to_gguf(ck.read(p.src), p.transform, hp)
            w.write_tensor_data(gguf.quants.quantize(np.asarray(arr, dtype=np.float32),
                                                     gguf.GGMLQuantizationType[p.ggml_type]))
        w.close()
    finally:
        ck.close()
    return out.read_bytes()


def _first_difference(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"sizes {len(a)} / {len(b)}, first difference at byte {n}"


@pytest.mark.parametrize("dtype", GGUF_DTYPES)
@pytest.mark.parametrize("name", FAMILIES)
def test_same_bytes_as_gguf_py(name, dtype, family, tmp_path):
    src = family(name)
    ours = hf_to_gguf(src, tmp_path / "ours.gguf", dtype=dtype, name="tiny").read_bytes()
    ref = gguf_py_reference(src, dtype, tmp_path / "ref.gguf")
    assert ours == ref, _first_difference(ours, ref)


@pytest.mark.parametrize("name,dtype", [("qwen2", "f16"), ("llama_bias", "q8_0"), ("gpt2", "f16"),
                                        ("phi3", "bf16"), ("llama", "f32")])
def test_same_bytes_from_bf16_source_and_small_chunks(name, dtype, family, tmp_path, monkeypatch):
    """A bf16-stored source (decoded by the workers from the stored bytes), and chunks of 256
    values: every tensor is cut at many row and head boundaries (one head per chunk for Q/K)."""
    src = family(name, "bfloat16")
    ref = gguf_py_reference(src, dtype, tmp_path / "ref.gguf")
    ours = hf_to_gguf(src, tmp_path / "ours.gguf", dtype=dtype, name="tiny").read_bytes()
    assert ours == ref, _first_difference(ours, ref)
    monkeypatch.setattr(gguf_stream, "CHUNK_ELEMS", 256)
    with open_checkpoint(src) as ck:
        plan = plan_hf_to_gguf(ck, src, dtype, name="tiny")
        q = next((p for p in plan.tensors if p.transform == "perm_q" and len(p.shape) == 2), None) or \
            next(p for p in plan.tensors if p.dst == "token_embd.weight")
        n_chunks = len(gguf_stream._row_ranges(q, tuple(ck.tensors[q.src].shape), plan.hp))
    rows, cols = q.shape
    # llama-arch Q rows are permuted within heads: one head (>= 256 values) per chunk; else 256 // cols rows
    assert n_chunks == (plan.hp["n_head"] if q.transform == "perm_q" else -(-rows // (256 // cols))) > 1
    small = hf_to_gguf(src, tmp_path / "small.gguf", dtype=dtype, name="tiny").read_bytes()
    assert small == ref, _first_difference(small, ref)


def _blocks(*rows) -> np.ndarray:
    return np.stack([np.asarray(r, dtype=np.float32) for r in rows])


def _q8_0_cases() -> dict:
    rng = np.random.default_rng(0)
    halves = np.arange(-16, 16, dtype=np.float32) + np.float32(0.5)      # x * (1/d) lands on k + 0.5
    halves[0] = 127.0                                                   # max |x| = 127: d = 1 exactly
    tiny = np.full(32, 1e-30, np.float32) * rng.standard_normal(32).astype(np.float32)
    sub = np.zeros(32, np.float32)
    sub[::3] = np.float32(2.0 ** -149) * np.arange(1, 12, dtype=np.float32)   # subnormal amax: 1/d overflows
    below_half = np.full(32, np.nextafter(np.float32(0.5), np.float32(0)), np.float32)
    below_half[0] = 127.0
    special = np.zeros((3, 32), np.float32)
    special[0, 5], special[1, 7], special[2, 9] = np.inf, -np.inf, np.nan
    mixed = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    mixed[0, 3], mixed[1, 7] = np.nan, np.inf
    return {
        "normal": rng.standard_normal((64, 256)).astype(np.float32),
        "scales": (rng.standard_normal((40, 64)) * np.logspace(-6, 6, 40)[:, None]).astype(np.float32),
        "zeros": np.zeros((4, 64), np.float32),
        "zeros-and-values": _blocks(np.r_[np.zeros(32), rng.standard_normal(32)]),
        "tiny": tiny[None, :],
        "subnormal": sub[None, :],
        "exact-halves": np.stack([halves, -halves]),
        "just-below-half": below_half[None, :],
        "inf-nan": special,
        "huge": (rng.standard_normal((2, 32)) * 1e38).astype(np.float32),   # |x| * (1/d) still finite
        "nan-inf-among-values": mixed,                 # d inf / NaN next to a normal block
        "normal-and-subnormal-d": np.stack([mixed[0] + 1, sub]),
    }


@pytest.mark.parametrize("case", sorted(_q8_0_cases()))
def test_q8_0_bytes_equal_gguf_py(case):
    import gguf
    x = _q8_0_cases()[case]
    with np.errstate(all="ignore"):          # inf / nan / overflow cases: the same warnings on both sides
        ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        ours = quantize_q8_0(x)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype == np.uint8
    assert ours.tobytes() == ref.tobytes()


def test_q8_0_rounding_neighbourhoods_equal_gguf_py():
    """The fast path rounds half away from zero as trunc(v + sign(v) * (0.5 - 2**-25)); that equals
    gguf-py's np_roundf for every float32 |v| <= 128 (checked exhaustively once: 2,248,146,946 values,
    0 mismatches, see formats/quant/quantize.py).  Here the dangerous neighbourhoods: every float32 within
    2048 ulps of k and of k + 1/2 (k = 0..127, both signs, |v| <= 127), fed through blocks whose
    max is 127 so that d = 1 and x * (1/d) = x."""
    import gguf
    vals = []
    for k in range(128):
        for c in (np.float32(k), np.float32(k + 0.5)):
            bits = c.view(np.int32) + np.arange(-2048, 2049, dtype=np.int32)
            vals.append(bits[bits >= 0].view(np.float32))
    v = np.concatenate(vals)
    v = v[np.abs(v) <= 127]
    v = np.concatenate([v, -v])
    v = np.concatenate([v, np.zeros(-len(v) % 31, np.float32)]).reshape(-1, 31)
    x = np.concatenate([np.full((len(v), 1), 127, np.float32), v], axis=1)
    x[1::2, 0] = -127
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    ours = quantize_q8_0(x)
    assert len(x) > 2 * _quantize_mod()._Q8_GROUP          # several groups of the fast path
    assert ours.tobytes() == ref.tobytes()


def test_q8_0_large_mixed_equal_gguf_py():
    """Special blocks (0, subnormal, inf, NaN scales) scattered in a tensor spanning several groups:
    the fast path for the rest, gguf-py's operations for these."""
    import gguf
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40000, 32)) * np.exp(rng.normal(0, 4, (40000, 1)))).astype(np.float32)
    x[rng.integers(0, 40000, 50)] = 0
    x[rng.integers(0, 40000, 50), 3] = np.nan
    x[rng.integers(0, 40000, 50), 5] = -np.inf
    sub = rng.integers(0, 40000, 50)
    x[sub] = np.float32(2.0 ** -140) * rng.standard_normal((50, 32)).astype(np.float32)
    x[rng.integers(0, 40000, 50)] = np.float32(127)
    with np.errstate(all="ignore"):
        ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        ours = quantize_q8_0(x.reshape(1000, 1280))
        exact = _quantize_mod()._quantize_q8_0_exact(x)
    assert ours.tobytes() == ref.tobytes() == exact.tobytes()


def _quantize_mod():
    import ckpt_surgeon.formats.quant.quantize as q
    return q


def test_q8_0_halves_round_away_from_zero():
    """The exact-halves block really holds ties (else the case above would prove nothing)."""
    x = _q8_0_cases()["exact-halves"]
    q = quantize_q8_0(x).reshape(2, 34)
    assert np.frombuffer(q[0, :2].tobytes(), np.float16)[0] == 1.0        # d = 127 / 127
    got = q[0, 3:].view(np.int8)                                          # qs after the 127
    want = np.where(x[0, 1:] > 0, np.floor(x[0, 1:]) + 1, np.ceil(x[0, 1:]) - 1)
    assert np.array_equal(got, want.astype(np.int8))


def test_f16_bytes_equal_numpy():
    """to_f16 (torch's vectorised cast for large arrays) rounds exactly as numpy's astype:
    ties, subnormals, overflow to inf, signed zeros, NaNs with payloads."""
    from ckpt_surgeon.formats.quant.quantize import to_f16
    rng = np.random.default_rng(1)
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    finite = f16[np.isfinite(f16)]
    mid = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)   # exact halfway points
    parts = [f16, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
             rng.standard_normal(1 << 17).astype(np.float32) * np.float32(1e-6),
             np.array([65519.99, 65520.0, 1e5, -1e30, 0.0, -0.0, 2.0 ** -25, 2.0 ** -24, 3 * 2.0 ** -26], np.float32),
             np.array([0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0x7F802000], np.uint32).view(np.float32)]
    x = np.concatenate(parts)
    assert x.size > 1 << 16           # large enough for the vectorised path
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    assert to_f16(x).view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_bf16_bits_to_f16_equal_numpy():
    """Every one of the 65536 bfloat16 bit patterns converts to numpy's float16 of its value."""
    from ckpt_surgeon.formats.quant.quantize import bf16_bits_to_f16
    u = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(all="ignore"):
        want = (u.astype(np.uint32) << 16).view(np.float32).astype(np.float16)
    assert bf16_bits_to_f16(u).view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_reread_check_catches_a_changed_byte_and_a_wrong_range(family, tmp_path, monkeypatch):
    """The converter's own check (verify_chunks) on a real written file: intact passes; one byte
    changed on disk, or a tensor whose chunks do not cover its data range, is a FormatError."""
    import os

    import gguf

    from ckpt_surgeon.errors import FormatError
    from ckpt_surgeon.formats.write import gguf as gw
    from ckpt_surgeon.formats.gguf import GGUFFile
    from ckpt_surgeon.formats.write.shard_io import pwrite_all

    monkeypatch.setattr(gguf_stream, "CHUNK_ELEMS", 512)        # several chunks per weight
    src = family("llama_bias")
    out = tmp_path / "m.gguf"
    with open_checkpoint(src) as ck:
        plan = plan_hf_to_gguf(ck, src, "q8_0")
        slots = [gw.Slot(p.dst, p.shape, int(gguf.GGMLQuantizationType[p.ggml_type]), p.nbytes) for p in plan.tensors]
        lay = gw.layout(gw.encode_kvs(plan.kvs), len(plan.kvs), slots)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            pwrite_all(fd, lay.head, 0)
            chunks = gguf_stream.write_tensor_data(fd, ck, plan.tensors, lay.offsets, plan.hp, _transform_to_gguf,
                                                   labels=(str(src), str(out)))
            gw.write_padding(fd, lay, [p.nbytes for p in plan.tensors])
        finally:
            os.close(fd)
    assert len(chunks) > len(plan.tensors)
    with GGUFFile(out) as g:
        tensors = dict(g.tensors)
    gguf_stream.verify_chunks(out, chunks, tensors, label=str(out))
    with pytest.raises(FormatError, match="data range differs"):
        gguf_stream.verify_chunks(out, chunks[1:], tensors, label=str(out))        # first tensor's head missing
    last = plan.tensors[-1].dst
    with pytest.raises(FormatError, match="data range differs"):
        gguf_stream.verify_chunks(out, [c for c in chunks if c.tensor != last], tensors, label=str(out))
    victim = chunks[len(chunks) // 2]
    data = bytearray(out.read_bytes())
    data[victim.start + 3] ^= 0x40
    out.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="bytes read back differ") as e:
        gguf_stream.verify_chunks(out, chunks, tensors, label=str(out))
    assert e.value.tensor == victim.tensor


def test_readback_as_written_catches_a_changed_write(family, tmp_path, monkeypatch):
    """The converter's default check: each chunk is read back right after it is written.  A write
    that stores other bytes than the chunk's (injected here by a pwrite that flips one bit of the
    fourth chunk) is a FormatError naming that chunk's tensor, and no file is published."""
    from ckpt_surgeon.conversion import to_gguf
    from ckpt_surgeon.errors import FormatError

    monkeypatch.setattr(gguf_stream, "CHUNK_ELEMS", 512)        # several chunks per weight
    real, calls, hit = gguf_stream.pwrite_all, [], []

    def flip_fourth(fd, data, at):
        calls.append(at)
        if len(calls) == 4:
            b = bytearray(memoryview(data).cast("B"))
            b[len(b) // 2] ^= 0x01
            hit.append(at)
            data = bytes(b)
        real(fd, data, at)

    monkeypatch.setattr(gguf_stream, "pwrite_all", flip_fourth)
    src = family("llama_bias")
    out = tmp_path / "m.gguf"
    with pytest.raises(FormatError, match="bytes read back differ") as e:
        to_gguf.hf_to_gguf_report(src, out, dtype="q8_0")
    assert hit and e.value.tensor
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_overlapping_written_ranges_are_refused(tmp_path):
    """Each tensor's chunks may cover its parsed range exactly and still overlap another tensor's:
    the arithmetic check refuses it (a later write would have landed on checked bytes)."""
    from types import SimpleNamespace

    from ckpt_surgeon.errors import FormatError

    f = tmp_path / "x.bin"
    f.write_bytes(bytes(200))
    zero = zlib.crc32(bytes(100))
    chunks = [gguf_stream.Chunk("a", 0, 100, zero), gguf_stream.Chunk("b", 60, 160, zero)]
    tensors = {"a": SimpleNamespace(start=0, end=100), "b": SimpleNamespace(start=60, end=160)}
    for reread in (True, False):
        with pytest.raises(FormatError, match=r"written ranges overlap \(a ends at 100, this one starts at 60\)"):
            gguf_stream.verify_chunks(f, chunks, tensors, label=str(f), reread=reread)
    disjoint = {"a": SimpleNamespace(start=0, end=100), "b": SimpleNamespace(start=100, end=200)}
    gguf_stream.verify_chunks(f, [chunks[0], gguf_stream.Chunk("b", 100, 200, zero)], disjoint, label=str(f))
