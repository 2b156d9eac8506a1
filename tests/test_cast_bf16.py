"""The writer's float64 -> bfloat16 cast, done in chunks with the bits taken from the exact float32, equals
the one-array version through ml_dtypes (the previous implementation, kept here as the oracle), specials
and chunk edges included."""
import ml_dtypes
import numpy as np

from ckpt_surgeon.formats.write import cast


def _oracle(a: np.ndarray) -> np.ndarray:
    u = a.view(np.uint64)
    keep = (u >> np.uint64(45)) & np.uint64(1)
    r = ((u + np.uint64((1 << 44) - 1) + keep) & ~np.uint64((1 << 45) - 1)).view(np.float64)
    r = np.where(~np.isfinite(a) | (np.abs(a) < 2.0 ** -126), a, r)
    with np.errstate(over="ignore"):
        return r.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_chunked_bf16_cast_equals_oracle():
    rng = np.random.default_rng(0)
    n = 2 * cast._CHUNK + 123
    x = rng.standard_normal(n) * np.exp(rng.uniform(-100, 100, n))        # wide exponent range
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 3.3895313892515355e38, 3.4e38, -3.5e38, 2.0 ** -126,
                -(2.0 ** -127), 2.0 ** -149, 5e-324, 1 + 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 3 * 2.0 ** -8]
    for at in (0, cast._CHUNK - len(specials) // 2, n - len(specials)):     # across a chunk edge, at both ends
        x[at:at + len(specials)] = specials
    got = cast._f64_to_bf16_bits(x.reshape(-1, 1))
    assert got.shape == (n, 1) and got.dtype == np.uint16
    assert np.array_equal(got.reshape(-1), _oracle(x))
