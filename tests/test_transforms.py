"""The per-tensor transform records (conversion/transforms.py): every registry transform has one,
each inverse undoes its forward, shapes follow, and the stream's chunking facts match what the
forward does (a transform said to act on runs of rows gives the same bytes chunk by chunk)."""
from __future__ import annotations

import numpy as np
import pytest

from ckpt_surgeon.arch import families as F
from ckpt_surgeon.conversion import transforms as T
from ckpt_surgeon.errors import ConfigError

HP = {"n_head": 4, "n_head_kv": 2}
ROWS = {"perm_q": 4 * 6, "perm_k": 2 * 6, "qkv_per_head": None, "qkv_grouped": (4 + 2 * 2) * 3}


def _array(name: str, rng) -> np.ndarray:
    if name == "qkv_per_head":
        return rng.standard_normal((3 * 4 * 3, 5)).astype(np.float32)     # [h, 3, d] needs n_kv == n_head
    rows = ROWS.get(name) or 8
    return rng.standard_normal((rows, 5)).astype(np.float32)


def test_every_registry_transform_has_a_record():
    assert set(F.TRANSFORMS) <= set(T.RECORDS)
    assert all(r.chunking in T.CHUNKINGS for r in T.RECORDS.values())
    with pytest.raises(KeyError, match="unknown tensor transform"):
        T.lookup("perm_x")


@pytest.mark.parametrize("name", F.TRANSFORMS)
def test_inverse_undoes_forward(name):
    rng = np.random.default_rng(0)
    hp = dict(HP, n_head_kv=4) if name == "qkv_per_head" else HP
    x = _array(name, rng)
    g = T.forward(x, name, hp)
    assert g.shape == T.lookup(name).gguf_shape(x.shape)
    back = T.inverse(g, name, hp)
    assert back.shape == x.shape
    if T.lookup(name).exact:
        assert np.array_equal(back, x)
    else:       # norm_shift: 1 + w rounded to float32 once (half an ulp in [1, 4): 2**-22)
        assert np.abs(back - x).max() <= 2.0 ** -22 and not np.array_equal(g, x)
    if name.startswith(("perm_", "qkv_")):      # the rows really move (the test can fail)
        assert not np.array_equal(g, x) and np.array_equal(np.sort(g, axis=0), np.sort(x, axis=0))


def test_shapes_and_row_readback():
    assert T.lookup("conv1d").gguf_shape((3, 5)) == (5, 3) == T.lookup("conv1d").hf_shape((3, 5))
    assert T.lookup("row").hf_shape((7,)) == (1, 7) and T.lookup("row").gguf_shape((1, 7)) == (1, 7)
    assert T.inverse(np.arange(7.0), "row", HP).shape == (1, 7)
    assert T.lookup("none").hf_shape((7,)) == (7,)


@pytest.mark.parametrize("name", [n for n, r in T.RECORDS.items() if r.chunking != "whole" and n != "raw"])
def test_chunking_matches_forward(name):
    """``rows``: any run of rows alone; ``heads``: runs of whole heads with the head count of the run."""
    rec, x = T.lookup(name), _array(name, np.random.default_rng(1))
    whole = T.forward(x, name, HP)
    if rec.chunking == "rows":
        parts = [T.forward(x[a:a + 3], name, HP) for a in range(0, x.shape[0], 3)]
    else:
        hd = x.shape[0] // HP[rec.needs[0]]
        one = dict(HP, n_head=1, n_head_kv=1)
        parts = [T.forward(x[a:a + hd], name, one) for a in range(0, x.shape[0], hd)]
    assert np.array_equal(np.concatenate(parts), whole)


def test_permutation_refuses_odd_heads():
    with pytest.raises(ConfigError, match="do not split into 4 heads"):
        T.forward(np.zeros((10, 2), np.float32), "perm_q", HP, path="m", tensor="q")


def test_split_part_forward_only():
    rec = T.lookup("mla_kv_b:1")
    assert rec.chunking == "whole" and not rec.moves_only
    with pytest.raises(ValueError, match="joined"):
        rec.inverse(np.zeros(2), HP)
