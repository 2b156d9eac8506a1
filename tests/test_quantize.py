"""Quantized GGUF (``convert --dtype q4_k_m`` ...) against llama.cpp's own quantizer.

The reference is ``llama_model_quantize`` (llama-cpp-python's binding of what ``llama-quantize``
runs) applied to the F32 GGUF of the same model (ours, byte-identical to llama.cpp's converter's:
tests/test_llamacpp_converter.py).  Ours converts the HF folder straight to the quantized type in
one pass, and quantizes that F32 GGUF (GGUF -> GGUF).  Every tensor of the reference must be in
ours with the same name, ggml type, shape and bytes, for every file type, on dense, fused-QKV,
Falcon, MLA and MoE families, the tiny fixtures (64-wide rows: the fallback types) and variants
whose rows are whole 256-value super-blocks, with and without an importance matrix.

The importance matrices are written here in llama-imatrix's two file formats (GGUF and the legacy
.dat) from random sums and counts; the reference gets the weights computed here independently
(sums / counts, as llama-quantize's ``load_imatrix`` normalises them), so a reading error shows.
llama.cpp's own imatrix collection is not reachable through the bindings (it is the llama-imatrix
tool, not a library function).
"""
from __future__ import annotations

import ctypes
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convert_variants import build_variant

from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.conversion import convert, hf_to_gguf

import gguf  # noqa: E402
import llama_cpp  # noqa: E402  (the reference; installed by the test extra: a missing runtime is a broken set-up, not a skip)

# file types llama.cpp makes without an importance matrix, and those it refuses to make without one
NO_IMATRIX = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
              "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs", "iq3_s", "iq3_m")
NEEDS_IMATRIX = ("q2_k_s", "iq3_xs", "iq3_xxs", "iq2_s", "iq2_m", "iq2_xs", "iq2_xxs", "iq1_s", "iq1_m")

# tiny fixtures (64-wide rows: k-quants fall back) across the converter's layouts: llama Q/K
# permutation, fused QKV (gpt2 Conv1D, phi3, bloom, falcon: its own mixture branches), MLA
# (deepseek_v2_lite: the 27-layer form llama.cpp loads without q_lora_rank), MoE (olmoe, qwen2_moe:
# stacked experts), gemma2
TINY = ("qwen2", "llama", "gpt2_hub", "phi3_bpe", "falcon_nobias", "bloom", "starcoder2", "deepseek_v2_lite", "olmoe",
        "qwen2_moe", "gemma2_spm")
# whole 256-value super-blocks: the mixture itself (tests/convert_variants.py)
WIDE = ("qwen2_q256", "llama_q256", "mixtral_q256", "qwen2_moe_q256")


def _ftype_id(ftype: str) -> int:
    from ckpt_surgeon.conversion.quant_mix import FTYPES
    return int(gguf.LlamaFileType[FTYPES[ftype][0]])


def llama_quantize(src: Path, out: Path, ftype: str, *, imatrix: dict | None = None,
                   allow_requantize: bool = False) -> None:
    """llama.cpp's quantizer (llama_model_quantize, default parameters) on ``src``."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _ftype_id(ftype)
    params.nthread = 2
    params.allow_requantize = allow_requantize
    keep = []
    if imatrix is not None:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            v = np.ascontiguousarray(values, np.float32)
            keep.append(v)
            arr[i].name = name.encode()
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        arr[len(imatrix)].name = None
        keep.append(arr)
        params.imatrix = ctypes.cast(arr, type(params.imatrix))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed on {src.name} -> {ftype}"


def tensors(path: Path) -> dict:
    with open_checkpoint(path) as ck:
        return {n: (i.dtype, tuple(i.shape), ck.read_raw(n)) for n, i in ck.tensors.items()}


def _outer_ones_dropped(shape: tuple) -> tuple:
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def assert_same_tensors(ours: Path, ref: Path, what: str, *, converter_q8_0: bool = False) -> dict:
    """Same tensor names, and each with the same ggml type, shape and bytes.  Returns the types.
    ``converter_q8_0``: ours is the converter's q8_0 (llama.cpp's converter's file, which keeps
    Qwen2-MoE's [1, n_embd] ffn_gate_inp_shexp 2-D where llama-quantize writes ggml_n_dims
    dimensions): shapes compared with size-1 outer dimensions dropped."""
    a, b = tensors(ours), tensors(ref)
    assert sorted(a) == sorted(b), (what, sorted(set(a) ^ set(b)))
    for name in b:
        sa = _outer_ones_dropped(a[name][1]) if converter_q8_0 else a[name][1]
        assert (a[name][0], sa) == b[name][:2], (what, name, a[name][:2], b[name][:2])
        assert a[name][2] == b[name][2], (what, name, b[name][0], "bytes differ")
    return {n: v[0] for n, v in b.items()}


@pytest.fixture(scope="module")
def family_src(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant-families")
    return lambda name: build_variant(tiny, name, root / name)


@pytest.fixture(scope="module")
def f32_gguf(family_src, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant-f32")
    made = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = hf_to_gguf(family_src(name), root / f"{name}.f32.gguf", dtype="f32", name="tiny")
        return made[name]
    return get


@pytest.fixture(scope="module")
def quantized_ref(tmp_path_factory):
    """llama-quantize's file (default parameters, no importance matrix) for an F32 GGUF of :func:`f32_gguf`
    and a type, made once per module: the HF and the GGUF source tests compare with the same reference."""
    root = tmp_path_factory.mktemp("quant-refs")
    made = {}

    def get(f32: Path, ftype: str) -> Path:
        if (f32, ftype) not in made:
            made[f32, ftype] = out = root / f"{f32.stem}.{ftype}.gguf"
            llama_quantize(f32, out, ftype)
        return made[f32, ftype]
    return get


@pytest.mark.parametrize("family", TINY + WIDE)
def test_hf_to_quantized_gguf_is_llama_quantize(family, family_src, f32_gguf, quantized_ref, tmp_path):
    src, f32 = family_src(family), f32_gguf(family)
    seen = set()
    for ftype in NO_IMATRIX:
        ref = quantized_ref(f32, ftype)
        ours = hf_to_gguf(src, tmp_path / f"ours.{ftype}.gguf", dtype=ftype, name="tiny")
        seen |= set(assert_same_tensors(ours, ref, f"{family} {ftype}", converter_q8_0=ftype == "q8_0").values())
        from ckpt_surgeon.formats.gguf import read_header
        assert read_header(ours).metadata["general.file_type"] == read_header(ref).metadata["general.file_type"]
        ours.unlink()
    if family in WIDE:   # the mixture really used the super-block types, not only their fallbacks
        assert {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S"} <= seen, sorted(seen)
    else:
        assert {"Q5_0", "Q5_1", "IQ4_NL"} <= seen, sorted(seen)   # 64-wide rows: Q4_K / Q5_K / IQ* fall back


@pytest.mark.parametrize("family", ("qwen2", "mixtral_q256", "qwen2_q256", "phi3_bpe"))
def test_gguf_to_quantized_gguf_is_llama_quantize(family, f32_gguf, quantized_ref, tmp_path):
    f32 = f32_gguf(family)
    for ftype in NO_IMATRIX:
        ref = quantized_ref(f32, ftype)
        ours = tmp_path / f"ours.{ftype}.gguf"
        convert(f32, ours, dtype=ftype)
        assert_same_tensors(ours, ref, f"{family} {ftype} gguf->gguf")


def test_f16_source_and_requantize(f32_gguf, tmp_path):
    """An F16 GGUF quantizes like llama.cpp (widened exactly); an already-quantized tensor that
    would change type is refused without allow_requantize, and with it matches llama.cpp's."""
    from ckpt_surgeon.errors import UnsupportedError
    f32 = f32_gguf("qwen2_q256")
    f16 = tmp_path / "f16.gguf"
    llama_quantize(f32, f16, "q8_0")          # a quantized source (Q8_0 weights, F32 norms)
    q4 = tmp_path / "q4.gguf"
    with pytest.raises(UnsupportedError, match="already Q8_0.*--allow-requantize"):
        convert(f16, q4, dtype="q4_k_m")
    assert not q4.exists()
    ref = tmp_path / "ref.gguf"
    llama_quantize(f16, ref, "q4_k_m", allow_requantize=True)
    convert(f16, q4, dtype="q4_k_m", allow_requantize=True)
    assert_same_tensors(q4, ref, "q8_0 -> q4_k_m requantized")



def test_requantized_source_is_said_by_convert_and_verify(f32_gguf, tmp_path):
    """Issue 36 item 19: a Q4_1 file requantized to q4_k_m (llama-quantize's bytes, as above) carries both
    roundings.  convert's report says so; verify of the Q4_1 file against it names the requantized source in
    a note and points the verdict at it; a float reference, or the same type mix, gets no such note."""
    from ckpt_surgeon import verify
    from ckpt_surgeon.verification.requantized import requantized_note
    f32 = f32_gguf("llama_q256")
    q41, out = tmp_path / "q4_1.gguf", tmp_path / "q4_k_m.gguf"
    llama_quantize(f32, q41, "q4_1")
    rep = convert(q41, out, dtype="q4_k_m", allow_requantize=True)
    said = [w for w in rep.warnings if w.startswith("requantized source:")]
    assert len(said) == 1 and "Q4_1 -> Q4_K" in said[0] and "same bytes" in said[0], rep.warnings
    ref = tmp_path / "ref.gguf"
    llama_quantize(q41, ref, "q4_k_m", allow_requantize=True)
    assert_same_tensors(out, ref, "q4_1 -> q4_k_m")          # the loss is llama.cpp's own, not ours
    assert requantized_note(f32, out) is None and requantized_note(q41, q41) is None
    vr = verify(str(q41), str(out), max_new_tokens=0)
    notes = [n for n in vr.notes if n.startswith("requantized:")]
    assert len(notes) == 1 and "Q4_1" in notes[0] and "--max-kl" in notes[0], vr.notes
    verdict = dict(vr.summary_items())["verdict"]
    assert vr.passed or "itself quantized" in verdict, verdict


# --- importance matrices ----------------------------------------------------------------------

def _imatrix_entries(f32: Path, seed: int = 0) -> dict:
    """name -> (sums, counts) for every 2-D / 3-D weight a quantizer would use an imatrix for."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (dtype, shape, _) in tensors(f32).items():
        if len(shape) < 2 or not name.endswith(".weight") or "norm" in name or name == "token_embd.weight":
            continue
        n_exp = shape[0] if len(shape) == 3 else 1
        counts = rng.integers(1, 50, n_exp).astype(np.float32)
        sums = (rng.random((n_exp, shape[-1]), dtype=np.float32) * 4 + 0.01) * counts[:, None]
        out[name] = (sums.reshape(-1), counts)
    return out


def write_imatrix_gguf(path: Path, entries: dict) -> None:
    w = gguf.GGUFWriter(str(path), arch="imatrix")     # llama-imatrix's layout: in_sum2 / counts
    w.add_array("imatrix.datasets", ["test.txt"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(f"{name}.in_sum2", sums.reshape(counts.size, -1))
        w.add_tensor(f"{name}.counts", counts.reshape(counts.size, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_imatrix_dat(path: Path, entries: dict) -> None:
    """llama-imatrix's legacy format: values stored as sum / count * ncall with ncall the count."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, (sums, counts) in entries.items():
            assert counts.size == 1
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", int(counts[0]), sums.size))
            f.write(np.ascontiguousarray(sums, np.float32).tobytes())
        f.write(struct.pack("<i", 10) + struct.pack("<i", 8) + b"test.txt")


def _weights(entries: dict) -> dict:
    """What llama-quantize's load_imatrix makes of them: sums / count per expert (float32)."""
    return {n: (s.reshape(c.size, -1) / c[:, None].astype(np.float32)).reshape(-1).astype(np.float32)
            for n, (s, c) in entries.items()}


@pytest.mark.parametrize("family,form", [("qwen2_q256", "gguf"), ("qwen2_q256", "dat"), ("mixtral_q256", "gguf"),
                                         ("qwen2", "dat")])
def test_imatrix_is_applied_as_llama_quantize(family, form, family_src, f32_gguf, quantized_ref, tmp_path):
    f32 = f32_gguf(family)
    entries = _imatrix_entries(f32)
    if form == "dat":
        assert all(c.size == 1 for _, c in entries.values())
        path = tmp_path / "imatrix.dat"
        write_imatrix_dat(path, entries)
    else:
        path = tmp_path / "imatrix.gguf"
        write_imatrix_gguf(path, entries)
    weights = _weights(entries)
    ftypes = ("q4_0", "q4_k_m", "iq4_xs") + NEEDS_IMATRIX
    if form == "dat" and family != "qwen2":
        # The legacy form differs from the GGUF form only in how the file is read: the matrix we read from
        # it is the GGUF form's (checked here, every value, so each type the GGUF case compares with
        # llama-quantize would get the same input), and two types still run end to end.
        from ckpt_surgeon.conversion.imatrix import read_imatrix
        write_imatrix_gguf(tmp_path / "same.gguf", entries)
        got, want = read_imatrix(path), read_imatrix(tmp_path / "same.gguf")
        assert got.keys() == want.keys() and all(np.array_equal(got[n], want[n]) for n in want)
        ftypes = ("q4_k_m", "iq2_xxs")
    elif family == "mixtral_q256":
        # What the MoE case adds is the per-expert matrix (one row of sums per expert, sliced per expert
        # slab); that slicing is the same code for every type, so one type of each kernel family runs here
        # (legacy, k-quant, IQ4, IQ3, IQ2, IQ1) and the slow grid searches (iq1_s, iq2_s, iq3_xxs: ~8 s each
        # on 2 cores, in both tools) run on qwen2_q256 only.
        ftypes = ("q4_0", "q4_k_m", "q2_k_s", "iq4_xs", "iq3_xs", "iq2_m", "iq1_m")
    for ftype in ftypes:
        ref = tmp_path / f"ref.{ftype}.gguf"
        llama_quantize(f32, ref, ftype, imatrix=weights)
        ours = hf_to_gguf(family_src(family), tmp_path / f"ours.{ftype}.gguf", dtype=ftype, name="tiny", imatrix=path)
        assert_same_tensors(ours, ref, f"{family} {ftype} imatrix {form}")
        if ftype == "q4_k_m":      # the matrix changed bytes (else this test could not fail)
            plain = quantized_ref(f32, ftype)
            assert tensors(plain)["blk.1.attn_q.weight"][2] != tensors(ours)["blk.1.attn_q.weight"][2]
        ours.unlink()
        ref.unlink()


# --- bad input: one line, exit 2, nothing written ---------------------------------------------

def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckpt_surgeon", *map(str, args)], capture_output=True, text=True)


def test_unknown_type_lists_the_known_ones(f32_gguf, tmp_path):
    out = tmp_path / "x.gguf"
    r = _cli("convert", f32_gguf("qwen2"), "-o", out, "--dtype", "q4_k_x")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "q4_k_x" in r.stderr and "q4_k_m" in r.stderr and "iq4_xs" in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob(".*tmp"))


def test_imatrix_of_another_model_is_refused(f32_gguf, family_src, tmp_path):
    other = _imatrix_entries(f32_gguf("qwen2"))            # 64-wide rows
    path = tmp_path / "other.gguf"
    write_imatrix_gguf(path, other)
    out = tmp_path / "x.gguf"
    r = _cli("convert", family_src("qwen2_q256"), "-o", out, "--dtype", "q4_k_m", "--imatrix", path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "importance matrix size" in r.stderr and "another model" in r.stderr, r.stderr
    stray = dict(_imatrix_entries(f32_gguf("qwen2_q256")))
    stray["blk.99.attn_q.weight"] = stray["blk.0.attn_q.weight"]
    write_imatrix_dat(tmp_path / "stray.dat", stray)
    r = _cli("convert", f32_gguf("qwen2_q256"), "-o", out, "--dtype", "q4_k_m", "--imatrix", tmp_path / "stray.dat")
    assert r.returncode == 2 and "blk.99.attn_q.weight" in r.stderr and "another model" in r.stderr, r.stderr
    assert not out.exists()


def test_requantize_refused_and_imatrix_required_from_the_cli(f32_gguf, tmp_path):
    q = tmp_path / "q.gguf"
    llama_quantize(f32_gguf("qwen2_q256"), q, "q4_k_m")
    out = tmp_path / "x.gguf"
    r = _cli("convert", q, "-o", out, "--dtype", "q4_0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--allow-requantize" in r.stderr, r.stderr
    r = _cli("convert", f32_gguf("qwen2_q256"), "-o", out, "--dtype", "iq2_xs")
    assert r.returncode == 2 and "importance matrix" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_without_llama_cpp_python_one_line_says_how_to_install(family_src, tmp_path):
    # a llama_cpp module without the shipped libraries stands for "not installed"; q8_0 (our own
    # kernel) still converts
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "llama_cpp.py").write_text("")
    env = dict(__import__("os").environ)
    env["PYTHONPATH"] = f"{shadow}:{env.get('PYTHONPATH', '')}"
    out = tmp_path / "x.gguf"
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(family_src("qwen2")), "-o", str(out),
                        "--dtype", "q4_k_m"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install 'ckpt-surgeon[llama]'" in r.stderr and not out.exists(), r.stderr
    r = subprocess.run([sys.executable, "-m", "ckpt_surgeon", "convert", str(family_src("qwen2")), "-o", str(out),
                        "--dtype", "q8_0"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and out.exists(), r.stderr


# --- llama.cpp runs them ----------------------------------------------------------------------

# use_extra_bufts off: a llama-cpp-python built natively on a CPU with AMX_INT8 crashes (SIGSEGV in
# ggml_backend_amx_mul_mat, an extra buffer type) on quantized files, llama_model_quantize's own as
# well as ours.  .ci/run builds for the AVX2 baseline, where the extra buffers are only the repack
# ones; keeping them off makes this test independent of how llama-cpp-python was built
_LOGITS = """
import sys, numpy as np, llama_cpp, llama_cpp.llama_cpp as low
_default = low.llama_model_default_params
def _params():
    p = _default()
    p.use_extra_bufts = False
    return p
low.llama_model_default_params = _params      # what llama_cpp.Llama calls
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, logits_all=True, verbose=False, n_threads=1)
toks = m.tokenize(b"The attention layer projects every token", add_bos=False)
m.eval(toks)
np.save(sys.argv[2], np.array(m.scores[: len(toks)], dtype=np.float32))
"""


@pytest.mark.parametrize("ftype", ("q4_k_m", "q2_k", "iq4_xs", "q5_0"))
def test_llama_cpp_runs_it_with_the_reference_logits(ftype, family_src, f32_gguf, quantized_ref, tmp_path):
    """Identical bytes, tensor order aside: llama.cpp's logits on ours equal those on llama-quantize's
    output exactly (same graph, same kernels, one thread), and are finite and not the F32 file's."""
    f32 = f32_gguf("qwen2_q256")
    ref = quantized_ref(f32, ftype)
    ours = hf_to_gguf(family_src("qwen2_q256"), tmp_path / "ours.gguf", dtype=ftype, name="tiny")
    got = {}
    for label, path in (("ours", ours), ("ref", ref), ("f32", f32)):
        r = subprocess.run([sys.executable, "-c", _LOGITS, str(path), str(tmp_path / f"{label}.npy")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-1500:]
        got[label] = np.load(tmp_path / f"{label}.npy")
    assert np.isfinite(got["ours"]).all() and got["ours"].shape[0] >= 4
    np.testing.assert_array_equal(got["ours"], got["ref"])
    assert not np.array_equal(got["ours"], got["f32"])


def test_imatrix_reader_edges(tmp_path):
    """llama-quantize's normalisation in its corner cases: a legacy entry with ncall 0 keeps its
    values, a GGUF expert with count 0 gets weights 1, counts are rounded (lround) first; a GGUF
    without the imatrix.* keys or with sums but no counts is refused."""
    from ckpt_surgeon.conversion.imatrix import read_imatrix
    from ckpt_surgeon.errors import FormatError
    vals = np.arange(1, 5, dtype=np.float32)
    with open(tmp_path / "a.dat", "wb") as f:
        f.write(struct.pack("<i", 2))
        for name, ncall in (("x.weight", 0), ("y.weight", 4)):
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, 4) + vals.tobytes())
    got = read_imatrix(tmp_path / "a.dat")
    np.testing.assert_array_equal(got["x.weight"], vals)
    np.testing.assert_array_equal(got["y.weight"], vals / np.float32(4))
    entries = {"z.weight": (np.concatenate([vals, vals]), np.array([0.0, 2.4], np.float32))}
    write_imatrix_gguf(tmp_path / "b.gguf", entries)
    np.testing.assert_array_equal(read_imatrix(tmp_path / "b.gguf")["z.weight"],
                                  np.concatenate([np.ones(4, np.float32), vals / np.float32(2)]))
    w = gguf.GGUFWriter(str(tmp_path / "c.gguf"), arch="imatrix")
    w.add_tensor("z.weight.in_sum2", vals)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FormatError, match="missing imatrix metadata"):
        read_imatrix(tmp_path / "c.gguf")
