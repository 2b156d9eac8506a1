"""The GGUF -> HF probe's maps kept as runs (ckpt_surgeon/conversion/derived/probe_child.py): what the passes
see (an id per element, the flat index in digits of a few bits) comes back as segments that expand to the
exact map, for the shapes llama.cpp's classes make: a copy, a row permutation (Q/K), a stack of experts, a
transpose (a run an element), and indices wider than one digit (the 7B embedding needs two 23-bit digits;
here 3-bit digits make a 300-element tensor need three)."""
from __future__ import annotations

import numpy as np
import pytest

from ckpt_surgeon.conversion.derived.probe_child import by_id, expand, runs, segments


def _maps() -> dict:
    rng = np.random.default_rng(0)
    rows, cols = 20, 15
    grid = np.arange(rows * cols).reshape(rows, cols)
    perm = rng.permutation(rows)
    return {
        "copy": (np.full(rows * cols, 4), np.arange(rows * cols)),
        "row permutation": (np.full(rows * cols, 2), grid[perm].ravel()),
        "stack": (np.repeat([7, 3, 5], rows * cols), np.tile(np.arange(rows * cols), 3)),
        "transpose": (np.full(rows * cols, 1), grid.T.ravel()),
        "interleaved": (np.tile([1, 2], rows * cols // 2), np.repeat(np.arange(rows * cols // 2), 2)),
    }


@pytest.mark.parametrize("kind", list(_maps()))
@pytest.mark.parametrize("bits", (3, 23))
def test_segments_expand_to_the_map_the_passes_saw(kind, bits):
    ids, idx = _maps()[kind]
    n_digits = max(1, -(-int(idx.max()).bit_length() // bits))
    digit_runs = [runs((idx >> (bits * d)) & ((1 << bits) - 1), 1 if d == 0 else 0) for d in range(n_digits)]
    seg = segments(runs(ids, 0), digit_runs, ids.size, bits)
    got_ids, got_idx = expand(seg, ids.size)
    assert np.array_equal(got_ids, ids) and np.array_equal(got_idx, idx)
    if kind in ("copy", "stack"):                    # compact where the map is: one segment a source tensor
        assert len(seg) == len(np.unique(ids)), seg
    if kind == "row permutation":                   # a segment a row at most
        assert len(seg) <= 20


def test_by_id_groups_positions_by_source():
    ids = np.array([3, 1, 3, 2, 1, 3])
    assert {k: list(np.arange(6)[m]) for k, m in by_id(ids)} == {1: [1, 4], 2: [3], 3: [0, 2, 5]}
    assert [(k, m) for k, m in by_id(np.array([5, 5]))] == [(5, slice(None))]


@pytest.mark.parametrize("few", (True, False))
@pytest.mark.parametrize("kind", list(_maps()))
def test_pairs_scatter_as_the_expanded_map(kind, few, monkeypatch):
    """``pairs`` (slices a segment, or index arrays past FEW_SEGMENTS segments) moves every element where the
    expanded map says."""
    import ckpt_surgeon.conversion.derived.probe_child as P
    monkeypatch.setattr(P, "FEW_SEGMENTS", 1 << 30 if few else 0)
    ids, idx = _maps()[kind]
    seg = segments(runs(ids, 0), [runs(idx, 1)], ids.size, 62)
    vals = np.random.default_rng(1).standard_normal(ids.size)
    want, got = {}, {}
    for k in np.unique(ids):
        want[k] = np.full(idx[ids == k].max() + 1, np.nan)
        want[k][idx[ids == k]] = vals[ids == k]
        got[k] = np.full(want[k].size, np.nan)
    for k, at, src in P.pairs(seg, ids.size):
        got[k][src] = vals[at]
    assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in want)


@pytest.mark.parametrize("numel", (1, 7, 8, 9, 100))
def test_index_digits_are_the_flat_index_in_pieces(numel, monkeypatch):
    """The idx passes' probe values (made in float32 a block at a time) are the flat index's digits."""
    import ckpt_surgeon.conversion.derived.probe_child as P
    monkeypatch.setattr(P, "DIGIT_BITS", 3)
    for d in range(3):
        assert np.array_equal(P._values("idx", 1, numel, d), ((np.arange(numel) >> (3 * d)) & 7).astype(np.float32))


def test_a_release_packed_form_and_its_nibbles():
    """conversion/derived/packed.py's pieces: the MXFP4 pack form's parts of a float weight (codes two a byte under
    the weight's name, one exponent byte per 32-value block beside it), none for what it cannot store (a bias, a row
    not a whole number of blocks), and nibbles <-> bytes (low nibble first, as llama.cpp's repack reads them)."""
    from ckpt_surgeon.conversion.derived.packed import FORMS, nibbles, pack, packed_parts
    mxfp4 = FORMS[0]
    assert packed_parts(mxfp4, "layers.0.ffn.experts.3.w1.weight", (8, 64), 32) == {
        "layers.0.ffn.experts.3.w1.weight": ((8, 32), "I8", 32),
        "layers.0.ffn.experts.3.w1.scale": ((8, 2), "F8_E8M0", 2)}
    assert packed_parts(mxfp4, "layers.0.ffn.experts.3.w1.weight", (8, 48), 32) is None
    assert packed_parts(mxfp4, "layers.0.ffn.gate.bias", (64,), 32) is None
    b = np.array([0x21, 0xF0, 0x0F], np.uint8)
    assert nibbles(b).tolist() == [1, 2, 0, 15, 15, 0]
    assert np.array_equal(pack(nibbles(b)), b)
