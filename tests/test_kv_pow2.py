"""kv-equalize's power-of-two scales (``--scales pow2``, the default of the static choice).

A scale 2^k moves a float's exponent and nothing else, so the rescaled weights are the exact products in their
own dtype, and in float64 every logit is the same bits (q_i 2^k * k_i 2^-k = q_i k_i exactly, RoPE mixes only
the two dims of a pair, which share the scale; W_o's columns / 2^k undo V's rows x 2^k product by product).
The checks: the bit kernel against the float64 product cast once; whole models equalized without turns give
logits equal to the original's to the last bit (a continuous choice of the same model does not); the
continuous option stays available and exact to float32 rounding; out-of-range products are not taken by the
bit kernel.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon import kv_equalize, open_checkpoint
from ckpt_surgeon.cli import cli as cli_main
from ckpt_surgeon.formats.write.cast import cast_to_dtype
from ckpt_surgeon.surgery.ops import scale_pow2_bits
from tests.zoo_util import logits64

_NP = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}
_EMIN = {"BF16": -126, "F16": -14, "F32": -126}     # smallest normal exponent
_EMAX = {"BF16": 127, "F16": 15, "F32": 127}


@pytest.mark.parametrize("dtype", sorted(_NP))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_bits_equal_the_rounded_product(dtype, axis):
    rng = np.random.default_rng(0)
    # magnitudes 2^-8 .. 1 (F16's normal range starts at 2^-14: every product stays normal, so none is refused)
    x = (rng.choice([-1.0, 1.0], (37, 53)) * np.exp2(rng.uniform(-8, 0, (37, 53)))).astype(_NP[dtype])
    x[3, 4], x[5, 6] = 0.0, -0.0
    k = rng.integers(-6, 7, x.shape[axis])
    shape = [1, 1]
    shape[axis] = k.size
    want = cast_to_dtype(x.astype(np.float64) * np.exp2(k).reshape(shape), dtype)
    assert scale_pow2_bits(x.tobytes(), dtype, x.shape, k, axis) == want


@pytest.mark.parametrize("dtype", sorted(_NP))
def test_bits_refuse_out_of_range(dtype):
    """Under/overflow, subnormal, inf and NaN inputs: None (the caller rounds the float64 product instead);
    one step short of each edge still goes through."""
    def run(value, k1):
        x = np.full((4, 3), value).astype(_NP[dtype])
        return scale_pow2_bits(x.tobytes(), dtype, x.shape, np.array([0, k1, 0, 0]), 0)

    small, big = 2.0 ** (_EMIN[dtype] + 2), 1.5 * 2.0 ** (_EMAX[dtype] - 2)
    assert run(small, -3) is None and run(small, -2) is not None
    assert run(big, 3) is None and run(big, 2) is not None
    assert run(2.0 ** (_EMIN[dtype] - 1), 0) is None               # a subnormal input
    assert run(np.inf, 0) is None and run(np.nan, 0) is None


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "phi", "falcon"])
def test_pow2_logits_bit_identical(tiny, tmp_path, name):
    """No turns, power-of-two scales on q/k (projections, q/k-norm weights, a fused QKV) and v/o: float64
    logits equal to the last bit; the continuous choice of the same model is only within rounding."""
    src = tiny(name)
    kw = dict(cache_type_k="q4_0", cache_type_v="q8_0", turn=False)
    rep = kv_equalize(str(src), str(tmp_path / "p2"), **kw)
    assert rep.plan.params["scale_values"] == "pow2" and rep.plan.changed
    scales = [x for s in rep.plan.steps for x in s.param("scale")]
    assert any(x != 1.0 for x in scales) and all(np.log2(x) == np.round(np.log2(x)) for x in scales)
    ref = logits64(src)
    assert float((logits64(tmp_path / "p2") - ref).abs().max()) == 0.0
    kv_equalize(str(src), str(tmp_path / "ct"), scales="continuous", **kw)
    d = float((logits64(tmp_path / "ct") - ref).abs().max())
    assert 0.0 < d < 1e-5 * float(ref.abs().max()), d     # float32 rounding of the rescaled weights


def test_pow2_weights_are_exact_products(tiny, tmp_path):
    """Every changed weight is the source's times a power of two, element by element."""
    src = tiny("qwen2")
    rep = kv_equalize(str(src), str(tmp_path / "eq"), cache_type_k="q4_0", cache_type_v="q4_0", turn=False)
    with open_checkpoint(str(src)) as a, open_checkpoint(str(tmp_path / "eq")) as b:
        for s in rep.plan.steps:
            x, y = np.asarray(a.read(s.out), np.float64), np.asarray(b.read(s.out), np.float64)
            shape = [1] * x.ndim
            shape[int(s.param("axis")) % x.ndim] = -1
            assert np.array_equal(y, x * np.asarray(s.param("scale")).reshape(shape)), s.out


def test_scales_option(tiny, tmp_path):
    src = tiny("qwen2")
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "x"), "--scales", "continuous",
                                      "--dry-run", "--format", "json"])
    assert r.exit_code == 0 and '"scale_values": "continuous"' in r.output, r.output
    r = CliRunner().invoke(cli_main, ["kv-equalize", str(src), "-o", str(tmp_path / "y"), "--scales", "pow2",
                                      "--calibrate"])
    assert r.exit_code == 2 and "--calibrate searches continuous scales" in r.output, r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "y").exists()


@pytest.mark.parametrize("dtype", sorted(_NP))
def test_turned_rows_on_bits_equal_the_float64_path(dtype, tmp_path, monkeypatch):
    """A turned step with power-of-two scales: the rows no turn touches are the exact products on the stored bits,
    the turned rows go through ``ops.scale_axis`` alone (4 of 12 rows here), and the bytes written equal the
    float64 path over the whole tensor (``scale_axis`` then the writer's one rounding), signed zeros included
    (``(x + 0) * s`` makes -0 into +0 there)."""
    from safetensors.numpy import save_file

    from ckpt_surgeon.surgery import ops
    from ckpt_surgeon.surgery.plan import Plan, TensorStep, execute, step_params

    rng = np.random.default_rng(1)
    x = {"w": (rng.choice([-1.0, 1.0], (12, 7)) * np.exp2(rng.uniform(-6, 0, (12, 7)))).astype(_NP[dtype]),
         "b": (rng.choice([-1.0, 1.0], 12) * np.exp2(rng.uniform(-6, 0, 12))).astype(_NP[dtype])}
    x["w"][1, 2], x["w"][0, 3], x["b"][5], x["b"][7] = -0.0, -0.0, -0.0, -0.0    # in a turned row and not
    src = tmp_path / "src.safetensors"
    save_file(x, str(src))
    scale = np.exp2(rng.integers(-3, 4, 12)).astype(np.float64)
    turn = dict(turn_a=[1, 2], turn_b=[5, 9], turn_angle=[0.7, -2.1])
    steps = [TensorStep("scale_axis", n, (n,), step_params(scale=[float(s) for s in scale], axis=0, **turn), like=n)
             for n in ("w", "b")]
    seen = []
    real = ops.scale_axis
    monkeypatch.setattr(ops, "scale_axis", lambda v, *a, **k: (seen.append(np.shape(v)[0]), real(v, *a, **k))[1])
    with open_checkpoint(str(src)) as ck:
        execute(ck, Plan("kv-equalize", str(src), {}, tuple(steps)), tmp_path / "out.safetensors")
    assert seen == [4, 4]                          # only the turned rows left the bit kernel
    with open_checkpoint(str(tmp_path / "out.safetensors")) as ck:
        for n in ("w", "b"):
            want = cast_to_dtype(real(x[n].astype(np.float64), scale, 0, 0.0,
                                      (turn["turn_a"], turn["turn_b"], turn["turn_angle"])), dtype)
            assert bytes(ck.read_raw(n)) == want, n
