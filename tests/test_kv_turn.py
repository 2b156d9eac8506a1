"""kv-equalize's pair turn (q and k rotary pair j both turned by phi_j) is exact, and is chosen where it pays.

Exactness is judged as test_kv_equalize judges the pair scales: float64 transformers logits of the
original and the transformed checkpoint, on tiny families without a per-head q/k norm (separate and fused
QKV, partial rotary, GQA, MoE) and on GGUF files of both pair layouts, with random angles and scales in
every pair of every layer.  Turning q alone must fail the same check.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.analysis.kv_cache import kv_geometry, kv_layer_stats
from ckpt_surgeon.errors import UnsupportedError
from ckpt_surgeon.surgery.kv_equalize import layer_steps
from ckpt_surgeon.surgery.kv_turn import choose_turn, dominant_pairs
from ckpt_surgeon.surgery.plan import Plan, execute
from tests.test_kv_equalize import REL_TOL, _max_delta
from tests.zoo_util import logits64

# families with RoPE and q/k biases and no per-head q/k norm (a turn does not commute with a per-dim norm weight)
FAMILIES = ["qwen2", "llama_bias", "phi", "gpt_neox", "falcon", "starcoder2", "qwen2_moe", "stablelm"]


def _random_turns(src, out, *, q_only: bool = False):
    rng = np.random.default_rng(1)
    with open_checkpoint(str(src)) as ck:
        lay = ck.layout()
        geom = kv_geometry(ck, lay)
        steps = []
        for lt in lay.layers:
            alpha = np.ones((lay.num_kv_heads, lay.head_dim))
            for g in geom.groups():
                alpha[:, g] = np.exp(rng.uniform(-1, 1, (lay.num_kv_heads, 1)))
            phi = rng.uniform(0, 2 * np.pi, (lay.num_kv_heads, len(geom.pairs)))
            steps += layer_steps(ck, lay, lt, alpha, None, phi, geom.pairs)
        if q_only:        # the turn on q rows without the same turn on k rows: logits must move
            steps = [replace(s, params=tuple(p for p in s.params if not p[0].startswith("turn")))
                     if ("k_proj" in s.out or "attn_k" in s.out) else s for s in steps]
        execute(ck, Plan("kv-equalize", str(src), {}, tuple(steps)), out)
    return geom


@pytest.mark.parametrize("name", FAMILIES)
def test_turn_exact(tiny, tmp_path, name):
    src = tiny(name)
    geom = _random_turns(src, tmp_path / "t")
    assert len(geom.pairs), name
    d, rel = _max_delta(logits64(src), logits64(tmp_path / "t"))
    assert rel < REL_TOL, (name, d, rel)


@pytest.mark.parametrize("name,layout", [("llama_bias", "interleaved"), ("qwen2", "rotate_half")])
def test_turn_exact_gguf(tiny, tmp_path, name, layout):
    from ckpt_surgeon.conversion.from_gguf import gguf_to_hf
    from ckpt_surgeon.conversion.to_gguf import hf_to_gguf
    g = hf_to_gguf(tiny(name), tmp_path / "m.gguf", dtype="f32")
    geom = _random_turns(g, tmp_path / "t.gguf")
    assert geom.pair_layout == layout
    gguf_to_hf(g, tmp_path / "a")
    gguf_to_hf(tmp_path / "t.gguf", tmp_path / "b")
    d, rel = _max_delta(logits64(tmp_path / "a"), logits64(tmp_path / "b"))
    assert rel < REL_TOL, (d, rel)


def test_turn_on_q_alone_fails(tiny, tmp_path):
    src = tiny("qwen2")
    _random_turns(src, tmp_path / "bad", q_only=True)
    d, rel = _max_delta(logits64(src), logits64(tmp_path / "bad"))
    assert rel > 100 * REL_TOL, (d, rel)


def test_turn_refused_with_qk_norm(tiny):
    with open_checkpoint(str(tiny("qwen3"))) as ck:
        lay = ck.layout()
        geom = kv_geometry(ck, lay)
        phi = np.full((lay.num_kv_heads, len(geom.pairs)), 0.3)
        with pytest.raises(UnsupportedError, match="q/k-norm"):
            layer_steps(ck, lay, lay.layers[0], np.ones((lay.num_kv_heads, lay.head_dim)), None, phi, geom.pairs)


def test_turn_chosen_only_where_a_bias_dominates():
    """The concentrated fixture's planted layers get turns and a lower prediction; the clean one none."""
    from fixtures.kv_fixture import kv_fixture_path
    for variant, planted in (("concentrated", {0, 5}), ("clean", set())):
        with open_checkpoint(str(kv_fixture_path(variant))) as ck:
            lay = ck.layout()
            geom = kv_geometry(ck, lay, attn_rot=True)
            for lt in lay.layers:
                st = kv_layer_stats(ck, lay, lt, values=False, sample_q=False)
                assert bool(dominant_pairs(st, geom)) == (lt.layer in planted), (variant, lt.layer)
                if lt.layer in planted:
                    alpha, phi = choose_turn(st, geom, ("q4_0",), np.ones((lay.num_kv_heads, lay.head_dim)))
                    assert np.any(phi)


@pytest.mark.parametrize("attn_rot,types", [(True, ("q4_0",)), (False, ("q5_0", "q8_0"))])
def test_head_errors_same_bits_as_the_batch(attn_rot, types):
    """Scoring each distinct (kv head, scales) row once gives the batched evaluation's figures bit for bit, so
    kv-equalize chooses exactly as before; rows gathered out of C order did not (a reduction's bits follow
    the memory layout: 2.2e-16 off on this fixture, q5_0 without the rotation)."""
    from fixtures.kv_fixture import kv_fixture_path
    from ckpt_surgeon.analysis import kv_cache as KC
    from ckpt_surgeon.surgery.kv_turn import batched_errors, head_errors
    rng = np.random.default_rng(3)
    with open_checkpoint(str(kv_fixture_path("concentrated"))) as ck:
        lay = ck.layout()
        geom = kv_geometry(ck, lay, attn_rot=attn_rot)
        cts = [KC.CACHE_TYPES[t] for t in types]
        for lt in lay.layers[:3]:
            st = kv_layer_stats(ck, lay, lt, values=False, sample_q=False)
            rot = (KC.rotate(st.k_mean, st.k_var, geom), KC.rotate(st.q_mean, st.q_var, geom))
            kv, d = st.k_mean.shape
            # powers of two with repeats across candidates (what the rounding leaves), and all-ones
            cands = [np.ones((kv, d))] + [np.exp2(rng.integers(-2, 3, size=(kv, d // 2)).repeat(2, -1))
                                          for _ in range(6)]
            cands += [cands[1].copy(), np.where(np.arange(kv)[:, None] == 0, cands[2], 1.0)]
            new, old = head_errors(st, geom, cts, rot, cands), batched_errors(st, geom, cts, rot, cands)
            assert new is not None
            for a, b in zip(new, old):
                assert a.shape == (len(cands), kv) and np.array_equal(a, b), lt.layer
