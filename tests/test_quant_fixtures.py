"""The committed quantized fixtures (``fixtures/quant/``) are what they claim to be.

Each folder was written by a real quantizer from ``fixtures/quant/base`` and ships an
``oracle.safetensors``: the producer's own dequantization of every quantized Linear. These
checks prove the oracle is a dequantization *of the base model* (not of something else, not
transposed, not a copy), within the error the scheme's bits and groups allow. They need only
numpy and json: no torch, no quantizer, no project code. How the folders were made:
``fixtures/quant/README.md`` and ``build_quant_fixtures.py``.

Error bounds, per quantized Linear (W = base weight, O = oracle, errors element-wise):

* relative Frobenius error ``||O - W|| / ||W||`` below the scheme's ``rel`` (see SCHEMES).
  Uniform rounding with step D has RMS error D/sqrt(12); for N(0, s) weights a group of
  64-128 spans about +-2.6..2.9 s, so a 4-bit step is ~0.35-0.39 s -> relative RMS ~0.10-0.11,
  an 8-bit step 16x finer -> ~0.006-0.008 (the bf16/fp16 storage of scales adds ~20% at
  8 bits), FP8 e4m3 keeps 3 mantissa bits -> relative rounding <= 2^-4, RMS ~0.027. A wrong
  tensor (another layer, transposed, unrelated) is at ~1.4, so every bound here separates
  "quantized W" from "not W" by 5x or more.
* for plain round-to-nearest schemes, also a per-element bound from each group's own range
  (``elem``): one lost group or a shifted zero point cannot hide in a Frobenius average.
  GPTQ (error feedback moves single weights by more than half a step) and AWQ (clipping)
  have only the Frobenius check.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from fixtures.oracle import oracle_bytes

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "quant"
LAYERS = 2
LINEARS = [
    f"model.layers.{i}.{s}.weight"
    for i in range(LAYERS)
    for s in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
]

# What config.json must say, the tolerance kind, and the relative Frobenius bound.
#   elem: ("int", bits, group, symmetric, m) | ("nf4", block) | ("fp8", (rows, cols)) | None
#   awq_rescale: the folder is AWQ-smoothed (inputs scaled into the preceding norm / up_proj),
#   undone before comparing (see _awq_effective).
#   rel: 4-bit RTN 0.15 (theory 0.10-0.11, +35%); 8-bit 0.015 (theory <= 0.008, x2); FP8 0.04
#   (theory 0.027-0.036); GPTQ / AWQ 0.25: they minimise the layer's OUTPUT error on
#   calibration activations, not ||W - O||, and move weight-space error around (observed
#   1.1-1.9x the RTN figure, at most 0.193); 0.25 is still 5.6x below a wrong tensor.
SCHEMES: dict[str, dict] = {
    "mlx_4bit": dict(key="quantization", cfg={"bits": 4, "group_size": 64, "mode": "affine"},
                     elem=("int", 4, 64, False, 4), rel=0.15,
                     extra=["model.embed_tokens.weight", "lm_head.weight"]),
    "mlx_8bit": dict(key="quantization", cfg={"bits": 8, "group_size": 64, "mode": "affine"},
                     elem=("int", 8, 64, False, 4), rel=0.015,
                     extra=["model.embed_tokens.weight", "lm_head.weight"]),
    "bnb_nf4": dict(cfg={"quant_method": "bitsandbytes", "load_in_4bit": True,
                         "bnb_4bit_quant_type": "nf4"}, elem=("nf4", 64), rel=0.15),
    "bnb_int8": dict(cfg={"quant_method": "bitsandbytes", "load_in_8bit": True},
                     elem=("int", 8, None, True, 0), rel=0.015),
    "autoround_gptq": dict(cfg={"quant_method": "gptq", "bits": 4, "group_size": 128,
                                "sym": True, "provider": "auto-round"},
                           elem=("int", 4, 128, True, 1), rel=0.15),
    "autoround_awq": dict(cfg={"quant_method": "awq", "bits": 4, "group_size": 128,
                               "zero_point": True, "version": "gemm"},
                          elem=("int", 4, 128, False, 1), rel=0.15),
    "autoround_autoround": dict(cfg={"quant_method": "auto-round", "bits": 4,
                                     "group_size": 128, "sym": True},
                                elem=("int", 4, 128, True, 1), rel=0.15),
    "ct_fp8_dynamic": dict(cfg={"quant_method": "compressed-tensors",
                                "format": "float-quantized"},
                           weights={"type": "float", "num_bits": 8, "strategy": "channel"},
                           elem=("fp8", (1, None)), rel=0.04),
    "ct_fp8_block": dict(cfg={"quant_method": "compressed-tensors", "format": "float-quantized"},
                         weights={"type": "float", "num_bits": 8, "strategy": "block",
                                  "block_structure": [128, 128]},
                         elem=("fp8", (128, 128)), rel=0.04),
    "ct_w8a8_int": dict(cfg={"quant_method": "compressed-tensors", "format": "int-quantized"},
                        weights={"type": "int", "num_bits": 8, "strategy": "channel"},
                        elem=("int", 8, None, True, 1), rel=0.015),
    "ct_w4a16_gptq": dict(cfg={"quant_method": "compressed-tensors",
                               "format": "pack-quantized"},
                          weights={"type": "int", "num_bits": 4, "strategy": "group",
                                   "group_size": 128},
                          elem=None, rel=0.25),
    "ct_w4a16_awq": dict(cfg={"quant_method": "compressed-tensors",
                              "format": "pack-quantized"},
                         weights={"type": "int", "num_bits": 4, "strategy": "group",
                                  "group_size": 128, "symmetric": False},
                         elem=None, rel=0.25, awq_rescale=True),
    "fp8_block_deepseek": dict(cfg={"quant_method": "fp8", "fmt": "e4m3",
                                    "weight_block_size": [128, 128]},
                               elem=("fp8", (128, 128)), rel=0.04),
    "gptqmodel_gptq": dict(cfg={"quant_method": "gptq", "bits": 4, "group_size": 128},
                           elem=None, rel=0.25),
    "gptqmodel_awq": dict(cfg={"quant_method": "awq", "bits": 4, "group_size": 128},
                          elem=None, rel=0.25, awq_rescale=True),
    "gptqmodel_fp8_block": dict(cfg={"quant_method": "fp8", "weight_block_size": [128, 128],
                                     "weight_scale_semantics": "inverse"},
                                elem=("fp8", (128, 128)), rel=0.04),
    "autoawq_gemm": dict(cfg={"quant_method": "awq", "bits": 4, "group_size": 128,
                              "zero_point": True, "version": "gemm"},
                         elem=None, rel=0.25, awq_rescale=True),
    # FP4 (E2M1: 1 mantissa bit, 0.5 .. 6 times the block scale, steps up to a third of the value):
    # 4-bit RTN's 0.15 (observed 0.094-0.096 NVFP4 per 16 with an FP8 scale, 0.112-0.113 MXFP4 per 32
    # with a power-of-two scale); MXFP8 / ModelOpt FP8: FP8's 0.04 (observed 0.026-0.027)
    **{n: dict(cfg={"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
               weights={"type": "float", "num_bits": 4, "strategy": "tensor_group", "group_size": 16},
               elem=None, rel=0.15) for n in ("ct_nvfp4a16", "ct_nvfp4")},
    "ct_mxfp4a16": dict(cfg={"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"},
                        weights={"type": "float", "num_bits": 4, "strategy": "group", "group_size": 32},
                        elem=None, rel=0.15),
    "ct_mxfp8a16": dict(cfg={"quant_method": "compressed-tensors", "format": "mxfp8-quantized"},
                        weights={"type": "float", "num_bits": 8, "strategy": "group", "group_size": 32},
                        elem=None, rel=0.04),
    "ct_mixed": dict(cfg={"quant_method": "compressed-tensors", "format": "mixed-precision"}, elem=None, rel=0.15),
    "modelopt_nvfp4": dict(cfg={"quant_method": "modelopt", "quant_algo": "NVFP4"}, elem=None, rel=0.15),
    "modelopt_fp8": dict(cfg={"quant_method": "modelopt", "quant_algo": "FP8"}, elem=None, rel=0.04),
    "modelopt_fp8_pc_pt": dict(cfg={"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, elem=None,
                               rel=0.04),
    "modelopt_mixed": dict(cfg={"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, elem=None, rel=0.15),
}

# --- a numpy-only safetensors reader (numpy has no bfloat16) ---------------------------------

_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
           "I8": np.int8, "U8": np.uint8}


def _read(path: Path, names: list[str] | None = None) -> dict[str, np.ndarray]:
    return _parse(path.read_bytes(), names)


def _parse(raw: bytes, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Float tensors as float32 (BF16 widened by a 16-bit shift); others in their dtype.
    Tensors of dtypes numpy cannot hold (F8_E4M3, U32) are skipped unless named."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        start, end = info["data_offsets"]
        buf = raw[8 + n + start:8 + n + end]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _DTYPES:
            arr = np.frombuffer(buf, _DTYPES[info["dtype"]])
        else:
            continue
        out[name] = arr.reshape(info["shape"]).astype(
            np.float32 if arr.dtype.kind == "f" else arr.dtype)
    return out


def _read_folder(folder: Path, names: list[str] | None = None) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(_read(f, names))
    return out


@pytest.fixture(scope="module")
def base() -> dict[str, np.ndarray]:
    return _read(ROOT / "base" / "model.safetensors")


# --- error bounds ----------------------------------------------------------------------------


def _groups(w: np.ndarray, rows: int, cols: int | None) -> np.ndarray:
    """``w`` [out, in] as [out/rows, rows, in/cols, cols] (cols None: the whole row)."""
    o, i = w.shape
    cols = cols or i
    return w.reshape(o // rows, rows, i // cols, cols)


def _elem_bound(w: np.ndarray, elem: tuple) -> np.ndarray:
    """Largest |O - W| each element may show under round-to-nearest, from W's own groups."""
    kind = elem[0]
    if kind == "int":
        # step = the group's range / (2^bits - 1) (asymmetric) or 2 amax / (2^bits - 1)
        # (symmetric). One step: half a step of rounding, plus up to half a step where the grid
        # misses the group's edge (a symmetric grid [-2^(b-1), 2^(b-1) - 1] stops at 7/8 of
        # amax at 4 bits, error 15/16 step; mlx shifts its grid so one edge is exact). Then
        # each 16-bit rounding (bf16: 2^-9 relative) of a quantity as large as the whole range
        # ((2^b - 1) steps) adds (2^b - 1) / 512 step: ``m`` of them, 1 for a float32
        # dequantization of a 16-bit scale, 0 for bnb's float32 SCB, 4 for mlx (its dequantize
        # stores scale and offset in bf16 and computes scale * q + offset in bf16).
        _, bits, group, sym, m = elem
        g = _groups(w, 1, group)
        levels = 2 ** bits - 1
        if sym:
            step = 2 * np.abs(g).max(axis=(1, 3), keepdims=True) / levels
        else:
            step = (g.max(axis=(1, 3), keepdims=True) - g.min(axis=(1, 3), keepdims=True)) / levels
        bound = step * (1.0 + m * levels / 512)
        return np.broadcast_to(bound, g.shape).reshape(w.shape)
    if kind == "nf4":
        # bitsandbytes nf4: code = nearest of 16 fixed levels of absmax over 64 consecutive
        # elements (row-major). The widest gap between NF4 levels is -1.0 .. -0.6961928 (of
        # absmax, bitsandbytes' NF4 table), so rounding moves an element by at most half of it,
        # 0.1519036 absmax (a weight at that midpoint reaches it: seen 0.9999 of it); then
        # dequantize_4bit rounds the float32 product to the quant state's bf16 (2^-9 relative).
        flat = w.reshape(-1, elem[1])
        absmax = np.abs(flat).max(axis=1, keepdims=True)
        half_gap = (1.0 - 0.6961928009986877) / 2
        bound = half_gap * absmax * (1 + 2.0 ** -20) + 2.0 ** -8 * np.abs(flat)
        return bound.reshape(w.shape)
    if kind == "fp8":
        rows, cols = elem[1]
        g = _groups(w, rows, cols)
        amax = np.abs(g).max(axis=(1, 3), keepdims=True)
        # e4m3 keeps 3 mantissa bits: rounding <= 2^-4 of |W| for normals, subnormal spacing
        # 2^-9 of the scale (amax/448); a 16-bit stored scale shifts codes by <= 2^-8 of |W|
        # and may clip the block max by 2^-8 of amax.
        bound = (2.0 ** -4 + 2.0 ** -7) * np.abs(g) + 2.0 ** -8 * amax + 2.0 ** -9 * amax / 448
        return np.broadcast_to(bound, g.shape).reshape(w.shape)
    raise AssertionError(kind)


def _awq_effective(name: str, o: np.ndarray, folder: dict, base: dict,
                   up_scale: dict) -> np.ndarray:
    """Undo AWQ's smoothing, which rescales a Linear's input channels and folds the inverse
    into the op before it (AutoAWQ's ``apply_scale``): for q/k/v (after input_layernorm) and
    gate/up (after post_attention_layernorm), W' = W diag(s) with norm' = norm / s, so
    W = W' diag(norm' / norm); for down_proj the preceding op is up_proj (up' = diag(1/s) up,
    down' = down diag(s)), s not stored: fitted per row of up_proj by least squares and then
    used, independently, to undo down_proj. Biases are untouched by both transforms."""
    layer = name.split(".mlp.")[0].split(".self_attn.")[0]
    if any(p in name for p in ("q_proj", "k_proj", "v_proj")):
        norm = layer + ".input_layernorm.weight"
        return o * (folder[norm] / base[norm])[None, :]
    if any(p in name for p in ("gate_proj", "up_proj")):
        norm = layer + ".post_attention_layernorm.weight"
        eff = o * (folder[norm] / base[norm])[None, :]
        if "up_proj" in name:
            w = base[name]
            s = (eff * w).sum(axis=1) / (eff * eff).sum(axis=1)
            up_scale[layer] = s
            eff = eff * s[:, None]
        return eff
    if "down_proj" in name:
        return o / up_scale[layer][None, :]
    return o  # o_proj: v_proj's output (128) cannot be rescaled into o_proj's input (256)


# --- the tests -------------------------------------------------------------------------------


def test_every_fixture_folder_is_listed():
    on_disk = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "base"}
    assert on_disk == set(SCHEMES)


def test_base_has_known_nonzero_qkv_biases(base):
    for i in range(LAYERS):
        for p in ("q_proj", "k_proj", "v_proj"):
            b = base[f"model.layers.{i}.self_attn.{p}.bias"]
            # ckpt_surgeon.tiny's fill: N(0, 0.5), so the biases matter to attention.
            assert 0.3 < float(np.std(b)) < 0.7, (i, p, np.std(b))


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_config_names_the_scheme(scheme):
    spec = SCHEMES[scheme]
    cfg = json.loads((ROOT / scheme / "config.json").read_text())
    q = cfg[spec.get("key", "quantization_config")]
    for k, v in spec["cfg"].items():
        assert q.get(k) == v, (scheme, k, q.get(k), v)
    if "weights" in spec:
        (group,) = q["config_groups"].values()
        for k, v in spec["weights"].items():
            assert group["weights"][k] == v, (scheme, k, group["weights"][k], v)
        assert "lm_head" in q["ignore"]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_producer_record(scheme):
    rec = json.loads((ROOT / scheme / "PRODUCER.json").read_text())
    for k in ("library", "versions", "call", "date", "oracle"):
        assert rec.get(k), (scheme, k)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_biases_are_the_base_biases(scheme, base):
    """Quantizers leave q/k/v biases alone (some store them as fp16: bf16 -> fp16 is exact in
    range), so every bias-surgery test starts from the known base biases."""
    folder = _read_folder(ROOT / scheme)
    for name in base:
        if name.endswith(".bias"):
            np.testing.assert_array_equal(folder[name], base[name], err_msg=f"{scheme} {name}")


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_oracle_is_a_dequantization_of_the_base(scheme, base):
    spec = SCHEMES[scheme]
    oracle = _parse(oracle_bytes(ROOT / scheme))
    expected = LINEARS + spec.get("extra", [])
    assert sorted(oracle) == sorted(expected)
    folder = _read_folder(ROOT / scheme) if spec.get("awq_rescale") else {}
    up_scale: dict = {}
    for name in expected:
        o, w = oracle[name], base[name]
        assert o.dtype == np.float32 and o.shape == w.shape, (name, o.dtype, o.shape, w.shape)
        if spec.get("awq_rescale"):
            o = _awq_effective(name, o, folder, base, up_scale)
        rel = float(np.linalg.norm(o - w) / np.linalg.norm(w))
        # > 0: the producer really quantized (an unquantized copy would pass any upper bound).
        assert 1e-4 < rel < spec["rel"], (scheme, name, rel)
        if spec["elem"] is not None:
            excess = np.abs(o - w) - _elem_bound(w, spec["elem"])
            assert excess.max() <= 0, (scheme, name, float(excess.max()))


def test_bounds_reject_a_wrong_tensor(base):
    """The bounds above are tight enough to tell W from a neighbouring tensor: the oracle of
    k_proj against v_proj's base weight (same shape) fails both checks."""
    oracle = _parse(oracle_bytes(ROOT / "mlx_8bit"))
    o = oracle["model.layers.0.self_attn.k_proj.weight"]
    w = base["model.layers.0.self_attn.v_proj.weight"]
    assert np.linalg.norm(o - w) / np.linalg.norm(w) > 1.0
    assert (np.abs(o - w) > _elem_bound(w, SCHEMES["mlx_8bit"]["elem"])).mean() > 0.5
