"""verify's options as composed records (issue 35 item 4): the Python API takes the record or the
keyword arguments it always took, builds the same record from them, and composes --localize
itself (the CLI no longer does)."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

from ckpt_surgeon.verification.options import (Criteria, CorpusOptions, Feed, GateLimits, LlamaOptions, Placement,
                                               SavedReference, VerifyOptions, flat_names)


def test_keyword_names_land_in_one_part_each():
    for cls in (VerifyOptions, CorpusOptions):
        names = flat_names(cls)
        assert len(names) == len(set(names)), cls
    o = VerifyOptions.build(max_kl=1e-5, device="cpu", prompts=["a"], localize=True, sequential=True)
    assert o == VerifyOptions(Feed(prompts=["a"]), Placement(device="cpu"), Criteria(max_kl=1e-5), sequential=True,
                              localize=True)
    c = CorpusOptions.build(corpus="c.txt", max_mean_kl=0.1, kv_cache="q8_0", replace=True, stream=False)
    assert c == CorpusOptions(corpus="c.txt", placement=Placement(stream=False), gates=GateLimits(max_mean_kl=0.1),
                              llama=LlamaOptions(kv_cache="q8_0"), saved=SavedReference(replace=True))
    # a record given whole, keywords on top of it; a part given whole by its own name
    assert VerifyOptions.build(o, device="cuda").placement == Placement(device="cuda")
    assert VerifyOptions.build(o, device="cuda").criteria == o.criteria
    assert VerifyOptions.build(criteria=Criteria(min_top1=0.5)).criteria.min_top1 == 0.5


def test_unknown_keyword_is_a_type_error():
    from ckpt_surgeon import verify
    from ckpt_surgeon.verification.cache_sweep import verify_cache_sweep
    from ckpt_surgeon.verification.corpus import verify_corpus
    with pytest.raises(TypeError, match="verify\\(\\) got an unexpected keyword argument 'max_mean_kl'"):
        verify("a", "b", max_mean_kl=1.0)              # a fidelity gate is not an exactness criterion
    with pytest.raises(TypeError, match="verify_corpus\\(\\) got an unexpected keyword argument 'prompts'"):
        verify_corpus("a", "b", prompts=["x"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'save_reference'"):
        verify_cache_sweep("a.gguf", cache_sweep="q8_0", save_reference="x")


def test_bad_values_fail_before_anything_is_opened(tmp_path):
    """The records are checked where they always were: the missing inputs are never reached."""
    from ckpt_surgeon import verify
    from ckpt_surgeon.errors import CkptError
    missing = str(tmp_path / "missing")
    with pytest.raises(CkptError, match="max_kl|max-kl"):
        verify(missing, missing, VerifyOptions(criteria=Criteria(max_kl=-1.0)), device="cpu")
    with pytest.raises(CkptError, match="unknown dtype"):
        verify(missing, missing, dtype="int8")


def test_record_and_keywords_give_the_same_run_and_localize_is_composed_by_the_library(tiny, tmp_path):
    from ckpt_surgeon import verify
    from ckpt_surgeon.verification.localize import LocalizedVerify
    ref = tiny("qwen2")
    cand = tmp_path / "cand"
    shutil.copytree(ref, cand)
    prompts = ["The capital of France is"]
    by_kw = verify(ref, cand, prompts=prompts, max_new_tokens=1, device="cpu")
    by_record = verify(ref, cand, VerifyOptions(Feed(prompts=prompts, max_new_tokens=1), Placement(device="cpu")))
    strip = ("elapsed_s", "environment", "notes")            # the notes say the free memory, which moves

    def same(d: dict) -> dict:                                # the tokenizer section's own wall time too
        return {k: ({**v, "elapsed_s": None} if k == "tokenizer" else v) for k, v in d.items() if k not in strip}
    assert same(by_kw.to_dict()) == same(by_record.to_dict())
    assert [n.split(" (")[0] for n in by_kw.notes] == [n.split(" (")[0] for n in by_record.notes]
    assert by_kw.passed and by_kw.localize is None
    # --localize from the Python API: the library runs the second pass and returns one report
    loc = verify(ref, cand, prompts=prompts, max_new_tokens=0, device="cpu", localize=True, localize_threshold=1e-3)
    assert isinstance(loc, LocalizedVerify) and loc.passed
    assert loc.localize.threshold == 1e-3 and loc.localize.first_layer is None
    assert loc.localize.points and all(p.rel == 0.0 for p in loc.localize.points)     # identical copies
    assert loc.to_dict()["localize"]["mode"] == "parallel"
    # a streamed run measured every layer: the threshold re-judges it, no second pass
    st = verify(ref, cand, prompts=prompts, device="cpu", stream=True, localize=True, localize_threshold=0.5)
    assert not isinstance(st, LocalizedVerify) and st.localize.mode == "stream" and st.localize.threshold == 0.5
    assert dataclasses.is_dataclass(st)


def test_common_width_is_shared_by_prompts_and_corpus():
    """One rule for logits of different widths (a padded vocabulary kept by one side only), with
    each mode's own first words."""
    import numpy as np

    from ckpt_surgeon.errors import ConfigError
    from ckpt_surgeon.verification.metrics import common_width

    class Tok:                      # all common_width asks of a tokenizer: how many tokens it has
        def __len__(self):
            return 6

    r, c = np.arange(16.0).reshape(2, 8), np.arange(12.0).reshape(2, 6)
    notes: list = []
    a, b = common_width(r, c, Tok(), notes)
    assert a.shape == b.shape == (2, 6) and np.array_equal(a, r[:, :6])
    assert notes == ["vocabulary widths differ (8 vs 6); compared the first 6 logits (the tokenizer has 6 tokens)"]
    assert common_width(r, r, None, notes)[0] is r                      # same width: untouched
    with pytest.raises(ConfigError, match=r"^output widths differ: reference 8, candidate 6 \(no tokenizer"):
        common_width(r, c, None, [])
    with pytest.raises(ConfigError,
                       match=r"^vocabulary widths differ: reference 8, candidate 5 \(tokenizer has 6 tokens\); the"):
        common_width(r, c[:, :5], Tok(), [], what="vocabulary")     # a real token would be cut off
    with pytest.raises(ConfigError, match="output widths differ"):
        common_width(r, c, Tok(), [], distribution=False)             # hidden states are never trimmed
