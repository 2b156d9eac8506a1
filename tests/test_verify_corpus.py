"""Fidelity mode (issue 22): ``verify --corpus``, its statistics, saved references, llama.cpp.

The statistics are checked against an independent float64 computation written plainly below
(numpy on the full-vocabulary logits of each chunk, computed by transformers in this file), on
a tiny model against a copy whose weights carry a small perturbation.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from convert_variants import LONG_TEXT, MULTILINGUAL, spm_llama

from ckpt_surgeon.cli import cli
from ckpt_surgeon.verification.corpus import verify_corpus
from ckpt_surgeon.verification.fidelity import FidelityAccumulator
from ckpt_surgeon.verification.reference_file import (ReferenceReader, decode_llamacpp, encode_llamacpp,
                                                      llamacpp_nv)

CTX = 32
TEXT = (LONG_TEXT + " " + MULTILINGUAL) * 2
LLAMA_PERPLEXITY = Path(os.environ.get("LLAMA_PERPLEXITY", "/work/llama-build/bin/llama-perplexity"))


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    """(reference folder, candidate folder: every weight × (1 + 0.1·N(0, 1)), corpus file)."""
    from safetensors.numpy import load_file, save_file
    root = tmp_path_factory.mktemp("corpus")
    # A tiny llama with a Llama-2 style SentencePiece tokenizer: it adds BOS (so BOS replaces each
    # chunk's first token) and its vocab_size is padded beyond the tokenizer (rows never produced).
    ref = spm_llama(tiny, root / "ref")
    tj = json.loads((ref / "tokenizer.json").read_text())
    tj["post_processor"] = {       # Llama-2's own: BOS before every sequence
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    (ref / "tokenizer.json").write_text(json.dumps(tj))
    cfg = json.loads((ref / "tokenizer_config.json").read_text())
    (ref / "tokenizer_config.json").write_text(json.dumps(dict(cfg, add_bos_token=True)))
    cand = root / "cand"
    shutil.copytree(ref, cand)
    st = cand / "model.safetensors"
    tensors = load_file(st)
    rng = np.random.default_rng(0)
    for k, v in tensors.items():
        if v.dtype == np.float32:
            tensors[k] = (v * (1 + 0.1 * rng.standard_normal(v.shape))).astype(np.float32)
    save_file(tensors, st, metadata={"format": "pt"})
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    return ref, cand, corpus


def _hf_logits(folder: Path, seqs) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0].numpy() for s in seqs]


def _independent(ref_folder, cand_folder, corpus: Path, ctx: int, first: int):
    """The statistics from scratch: chunks, BOS, per-token float64 quantities, then the aggregates."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ref_folder)
    assert tok.bos_token_id is not None and tok("a")["input_ids"][0] == tok.bos_token_id
    ids = [tok.bos_token_id] + tok(corpus.read_text(), add_special_tokens=False)["input_ids"]
    n = len(ids) // ctx
    chunks = [ids[i * ctx:(i + 1) * ctx] for i in range(n)]
    seqs = [[tok.bos_token_id] + c[1:] for c in chunks]
    R, C = _hf_logits(ref_folder, seqs), _hf_logits(cand_folder, seqs)
    kl, nr, nc, dp, same = [], [], [], [], []
    for c, r, q in zip(chunks, R, C):
        for t in range(first, ctx - 1):
            lr = r[t].astype(np.float64) - np.log(np.sum(np.exp(r[t].astype(np.float64))))
            lq = q[t].astype(np.float64) - np.log(np.sum(np.exp(q[t].astype(np.float64))))
            y = c[t + 1]
            kl.append(np.sum(np.exp(lr) * (lr - lq)))
            nr.append(-lr[y])
            nc.append(-lq[y])
            dp.append(np.exp(lq[y]) - np.exp(lr[y]))
            same.append(np.argmax(r[t]) == np.argmax(q[t]))
    kl, nr, nc, dp, same = map(np.asarray, (kl, nr, nc, dp, same))
    N = len(kl)

    def se(x):      # SE = sqrt(var / (N - 1)), var the population variance (llama.cpp's)
        return np.sqrt(np.mean((x - x.mean()) ** 2) / (N - 1))

    cov = np.mean((nc - nc.mean()) * (nr - nr.mean())) / (N - 1)
    f32 = lambda q: 100 * float(np.float32(q))       # llama.cpp's percentiles are float32 literals
    return {"n": N, "chunks": n, "tokens": len(ids),
            "ppl_ref": np.exp(nr.mean()), "ppl_cand": np.exp(nc.mean()),
            "ln_ratio": nc.mean() - nr.mean(), "ln_ratio_se": np.sqrt(se(nc) ** 2 + se(nr) ** 2 - 2 * cov),
            "cor": cov / (se(nc) * se(nr)),
            "kl_mean": kl.mean(), "kl_se": se(kl), "kl_max": kl.max(), "kl_min": kl.min(),
            "kl_p99": np.percentile(kl, f32(0.99)), "kl_p90": np.percentile(kl, f32(0.9)),
            "kl_median": np.median(kl), "kl_p1": np.percentile(kl, f32(0.01)),
            "dp_mean": dp.mean(), "dp_se": se(dp), "dp_p95": np.percentile(dp, f32(0.95)),
            "dp_p25": np.percentile(dp, f32(0.25)),
            "rms": np.sqrt(np.mean(dp ** 2)), "rms_se": 0.5 / np.sqrt(np.mean(dp ** 2)) * se(dp ** 2),
            "same": same.mean(), "same_se": np.sqrt(same.mean() * (1 - same.mean()) / (N - 1)),
            "kl_argmax": int(np.argmax(kl))}


@pytest.mark.parametrize("score, first", [("half", CTX // 2), ("all", 0)])
def test_statistics_match_an_independent_float64_computation(pair, score, first):
    ref, cand, corpus = pair
    want = _independent(ref, cand, corpus, CTX, first)
    rep = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, score=score, device="cpu",
                        max_mean_kl=1.0, max_p99_kl=1.0, min_same_top=0.0)
    c = rep.to_dict()["corpus"]
    assert (c["tokens"], c["chunks"], c["ctx"], c["scored"]) == (want["tokens"], want["chunks"], CTX, want["n"])
    assert c["convention"] == ("llama.cpp" if score == "half" else "all")
    assert want["n"] == want["chunks"] * (CTX - 1 - first)
    # The perturbation is real (KL well above float noise) and small (most tops agree).
    assert 1e-5 < want["kl_mean"] < 1e-1 and 0.3 < want["same"] < 1
    # Both sides are the same float64 arithmetic on the same float32 logits, summed in another
    # order: agreement to ~1e-12 relative; 1e-9 leaves room and still catches any formula slip
    # (a wrong N − 1, a missing covariance term, float32 percentile fractions are all > 1e-6).
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)
    close(c["ppl"]["ref"], want["ppl_ref"])
    close(c["ppl"]["cand"], want["ppl_cand"])
    close(c["ppl"]["ratio"], np.exp(want["ln_ratio"]))
    close(c["ppl"]["ln_ratio"]["mean"], want["ln_ratio"])
    close(c["ppl"]["ln_ratio"]["se"], want["ln_ratio_se"])
    close(c["ppl"]["cor"], want["cor"])
    for k in ("mean", "se", "max", "min", "p99", "p90", "median", "p1"):
        close(c["kl"][k], want[f"kl_{k}"])
    assert c["kl"]["max_at"] == {"chunk": want["kl_argmax"] // (CTX - 1 - first),
                                 "position": first + want["kl_argmax"] % (CTX - 1 - first)}
    for k in ("mean", "se", "p95", "p25"):
        close(c["dp"][k], want[f"dp_{k}"])
    close(c["dp"]["rms"], want["rms"])
    close(c["dp"]["rms_se"], want["rms_se"])
    close(c["same_top"]["p"], want["same"])
    close(c["same_top"]["se"], want["same_se"])
    assert rep.passed


def test_identical_models_score_zero(pair):
    ref, _, corpus = pair
    c = verify_corpus(ref, ref, corpus=corpus, ctx=CTX, device="cpu").to_dict()["corpus"]
    assert c["kl"]["max"] == 0.0 and c["dp"]["rms"] == 0.0 and c["same_top"]["p"] == 1.0
    assert c["ppl"]["ln_ratio"]["mean"] == 0.0 and c["ppl"]["ref"] == c["ppl"]["cand"]


def test_accumulator_blocks_and_chunks_do_not_change_the_result():
    """Adding rows in pieces (and in internal row blocks) gives the sums of adding them at once."""
    import ckpt_surgeon.verification.fidelity as fid
    rng = np.random.default_rng(1)
    r = rng.standard_normal((300, 50)).astype(np.float32) * 3
    c = r + rng.standard_normal(r.shape).astype(np.float32) * 0.1
    y = rng.integers(0, 50, 300)
    one = FidelityAccumulator()
    one.add(r, c, y)
    old = fid._BLOCK_ELEMENTS
    fid._BLOCK_ELEMENTS = 7 * 50     # 7-row blocks
    try:
        many = FidelityAccumulator()
        for a in range(0, 300, 100):
            many.add(r[a:a + 100], c[a:a + 100], y[a:a + 100], chunk=a // 100)
    finally:
        fid._BLOCK_ELEMENTS = old
    a, b = one.result(), many.result()
    np.testing.assert_allclose([a.kl_mean, a.kl_se, a.ln_ratio, a.ln_ratio_se, a.rms_dp, a.same_top],
                               [b.kl_mean, b.kl_se, b.ln_ratio, b.ln_ratio_se, b.rms_dp, b.same_top], rtol=1e-12)
    assert a.kl["p99"] == b.kl["p99"] and a.dp["median"] == b.dp["median"]


# --- saved references ------------------------------------------------------------------------------

def test_save_and_reuse_the_reference_gives_identical_statistics(pair, tmp_path):
    ref, cand, corpus = pair
    live = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu")
    saved = tmp_path / "ref.safetensors"
    first = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", save_reference=saved)
    again = verify_corpus(None, cand, corpus=corpus, ctx=CTX, device="cpu", reference_file=saved)
    # Raw float32 logits are stored: the float64 statistics see the very same numbers.
    assert first.to_dict()["corpus"]["kl"] == live.to_dict()["corpus"]["kl"]
    for k in ("ppl", "kl", "dp", "same_top", "scored", "tokens"):
        assert again.to_dict()["corpus"][k] == live.to_dict()["corpus"][k], k
    assert again.runtimes == ("file", "transformers")
    info = ReferenceReader(saved).info
    assert (info.format, info.ctx, info.score, info.dtype) == ("ckpt-surgeon", CTX, "half", "float32")
    # It is a safetensors file any reader opens.
    from safetensors.numpy import load_file
    t = load_file(saved)
    assert t["tokens"].shape == (live.corpus.tokens.shape[0], CTX) and t["logits"].shape[0] == info.n_chunks * info.rows


def test_llamacpp_format_round_trip_within_its_precision(pair, tmp_path):
    ref, cand, corpus = pair
    exact = tmp_path / "ref.safetensors"
    live = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", save_reference=exact).stats
    saved = tmp_path / "ref.kld"
    verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", save_reference=saved, reference_format="llama.cpp")
    assert saved.read_bytes()[:8] == b"_logits_"
    back = verify_corpus(None, cand, corpus=corpus, ctx=CTX, device="cpu", reference_file=saved).stats
    # Each stored log-prob is within scale/2 <= 16/65535/2 = 1.2e-4 nats of the float32 value, so
    # NLL_ref moves by at most that, and KL by at most ~that (Σ p·δ with |δ| <= 1.2e-4).  (Only
    # because the tiny model's logits span less than 16 nats: a target below max − 16 would be
    # clamped up to it, which is llama.cpp's format, not rounding.)
    assert abs(back.ln_ratio - live.ln_ratio) <= 1.3e-4
    assert abs(back.kl_mean - live.kl_mean) <= 1.3e-4
    # The stored arg-max can only move where the reference's top two logits are within one step
    # (range/65535 <= 2.4e-4) of each other; the tiny random model's near-uniform logits have some.
    reader = ReferenceReader(exact)
    logits = np.concatenate([reader.chunk(i)[1] for i in range(reader.info.n_chunks)])
    top2 = np.sort(logits, axis=1)[:, -2:]
    near_ties = int(np.sum(top2[:, 1] - top2[:, 0] <= 16 / 65535))
    assert abs(back.same_top - live.same_top) * live.n <= near_ties


def test_llamacpp_file_layout_as_perplexity_cpp_reads_it(tmp_path):
    """Bytes written as perplexity.cpp's kl_divergence() reads them: magic, int32 n_ctx, n_vocab,
    n_chunk, int32 tokens, then per chunk n_ctx - 1 - n_ctx/2 rows of nv uint16 (float32 scale and
    min_log_prob, then one uint16 per token)."""
    from ckpt_surgeon.verification.reference_file import ReferenceWriter
    ctx, v, n = 8, 7, 2
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, v, (n, ctx))
    logits = [rng.standard_normal((ctx - 1 - ctx // 2, v)).astype(np.float32) * 6 for _ in range(n)]
    logits[0][0, 3] = -100.0               # far below max - 16: stored as 0 (the clamp)
    w = ReferenceWriter(tmp_path / "b.kld", fmt="llama.cpp", tokens=tokens, score="half", bos=None,
                        corpus_sha256=None, reference=None, runtime="transformers", replace=False)
    for x in logits:
        w.write_chunk(x)
    w.close()
    raw = (tmp_path / "b.kld").read_bytes()
    assert raw[:8] == b"_logits_"
    assert struct.unpack("<iii", raw[8:20]) == (ctx, v, n)
    assert np.array_equal(np.frombuffer(raw[20:20 + 4 * n * ctx], "<i4").reshape(n, ctx), tokens)
    nv = llamacpp_nv(v)
    assert nv == 12
    body = np.frombuffer(raw[20 + 4 * n * ctx:], "<u2").reshape(n * (ctx - 1 - ctx // 2), nv)
    for row, x in zip(body, np.concatenate(logits)):
        scale, mn = np.frombuffer(row[:4].tobytes(), "<f4")
        lp = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum())
        ok = x > x.max() - 16
        assert scale == pytest.approx((x.max() - max(x.min(), x.max() - 16)) / 65535, rel=1e-6)
        # scale·u + min_log_prob recovers log p to within scale/2 (+ float32 rounding of the terms)
        got = scale * row[4:4 + v].astype(np.float64) + mn
        assert np.all(np.abs(got[ok] - lp[ok]) <= scale / 2 + 1e-5)
        assert np.all(row[4:4 + v][~ok] == 0) and np.all(row[4 + v:] == 0)
    # and our reader decodes what we wrote the same way
    np.testing.assert_array_equal(decode_llamacpp(body[:3], v), decode_llamacpp(encode_llamacpp(logits[0]), v))


# --- llama.cpp as the runtime ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def ggufs(pair, tmp_path_factory):
    from ckpt_surgeon.conversion import hf_to_gguf
    ref, cand, _ = pair
    root = tmp_path_factory.mktemp("corpus-gguf")
    return {"ref_f32": hf_to_gguf(ref, root / "ref.f32.gguf", dtype="f32", name="tiny"),
            "cand_f32": hf_to_gguf(cand, root / "cand.f32.gguf", dtype="f32", name="tiny")}


def test_runtime_llamacpp_judges_the_converted_gguf_in_llama_cpp(pair, ggufs):
    ref, cand, corpus = pair
    same32 = verify_corpus(ref, ggufs["ref_f32"], corpus=corpus, ctx=CTX, device="cpu", runtime="llama.cpp",
                           kv_cache="f32")
    same16 = verify_corpus(ref, ggufs["ref_f32"], corpus=corpus, ctx=CTX, device="cpu", runtime="llama.cpp",
                           kv_cache="f16", max_mean_kl=1.0, max_p99_kl=1.0)
    other = verify_corpus(ref, ggufs["cand_f32"], corpus=corpus, ctx=CTX, device="cpu", runtime="llama.cpp",
                          kv_cache="f32", max_mean_kl=1.0, max_p99_kl=1.0, min_same_top=0.0)
    hf_other = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", max_mean_kl=1.0, max_p99_kl=1.0,
                             min_same_top=0.0)
    assert same32.runtimes == ("transformers", "llama.cpp") and same32.kv_cache == "f32"
    # f32 file, F32 cache: llama.cpp runs our file like transformers to float32 kernel noise
    # (test_llamacpp: logits within 3.6e-6 relative), KL of order that squared; the float32 row's
    # 1e-6 bound is met with room.
    assert same32.passed and same32.stats.kl["max"] < 1e-6, same32.stats.kl
    # the default F16 cache rounds K and V: larger, but still far below the perturbation
    assert same16.stats.kl_mean > same32.stats.kl_mean
    assert same16.stats.kl_mean < 1e-2 * other.stats.kl_mean
    # the perturbed candidate judged in llama.cpp scores what transformers scores for it
    np.testing.assert_allclose(other.stats.kl_mean, hf_other.stats.kl_mean, rtol=1e-3)
    assert any("KV cache" in n for n in same16.notes)


def test_runtime_llamacpp_reference_side(pair, ggufs):
    """A GGUF reference runs in llama.cpp and tokenizes with llama.cpp's own tokenizer."""
    ref, cand, corpus = pair
    rep = verify_corpus(ggufs["ref_f32"], ref, corpus=corpus, ctx=CTX, device="cpu", runtime="llama.cpp",
                        kv_cache="f32")
    assert rep.runtimes == ("llama.cpp", "transformers") and rep.passed
    assert any("(llama.cpp)" in n for n in rep.notes)


@pytest.mark.skipif(not LLAMA_PERPLEXITY.is_file(), reason="llama-perplexity not built (see docs/verify.md); "
                    "the file format is tested above as perplexity.cpp reads it")
def test_llama_perplexity_reads_our_file_and_we_read_its_file(pair, ggufs, tmp_path):
    """llama.cpp's own binary: the base file it writes, read by us; ours, read by it; the
    printed statistics against ours on the same base file."""
    ref, cand, corpus = pair
    ctx = 128      # llama-perplexity prints its statistics from 100 scored tokens on
    base = tmp_path / "base.kld"
    def run(*a):
        # llama.cpp's common log writes from a worker thread, and a process that ends right after
        # the last LOG() sometimes exits (rc 0) before the final block is flushed (seen 2 runs
        # in 5 on this machine, with its own base file as with ours): run again until it is there.
        for _ in range(5):
            res = subprocess.run([str(LLAMA_PERPLEXITY), "-t", "2", "-c", str(ctx), "-b", str(ctx),
                                  "-f", str(corpus), *a], capture_output=True, text=True, check=True)
            if "--kl-divergence" not in a or "Same top p:" in res.stdout + res.stderr:
                return res
        raise AssertionError("llama-perplexity never printed its statistics:\n" + (res.stdout + res.stderr)[-2000:])
    run("-m", str(ggufs["ref_f32"]), "--kl-divergence-base", str(base))
    mine = verify_corpus(None, ggufs["cand_f32"], corpus=corpus, ctx=ctx, device="cpu", runtime="llama.cpp",
                         reference_file=base, max_mean_kl=1.0, max_p99_kl=1.0, min_same_top=0.0)
    res = run("-m", str(ggufs["cand_f32"]), "--kl-divergence-base", str(base), "--kl-divergence")
    out = res.stdout + res.stderr       # LOG() and LOG_INF() go to different streams
    printed = {}
    for line in (out).splitlines():
        if ":" in line and ("KLD" in line or "Same top" in line or "PPL" in line):
            k, v = line.split(":", 1)
            printed[k.strip()] = float(v.split("±")[0].strip().rstrip("%"))
    assert printed, out
    # Same base file, same candidate in llama.cpp (F16 cache both): the candidate's logits come
    # from llama-cpp-python instead of the binary's batch, and we sum in float64 over the
    # candidate where llama.cpp uses float32: 1e-3 relative on the mean KL.
    np.testing.assert_allclose(mine.stats.kl_mean, printed["Mean    KLD"], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(100 * mine.stats.same_top, printed["Same top p"], atol=0.01)
    np.testing.assert_allclose(mine.stats.ppl_cand, printed["Mean PPL(Q)"], rtol=1e-4)
    # Our llama.cpp-format file of the same reference (run in llama.cpp by us), read by the binary:
    # the same statistics as from its own file, and the same stored log-probs to within one step
    # of the uint16 grid plus the two runs' float32 kernel differences.
    ours = tmp_path / "ours.kld"
    verify_corpus(ggufs["ref_f32"], ggufs["ref_f32"], corpus=corpus, ctx=ctx, device="cpu", runtime="llama.cpp",
                  save_reference=ours, reference_format="llama.cpp")
    a, b = ReferenceReader(base), ReferenceReader(ours)
    assert (a.info.ctx, a.info.n_vocab, a.info.n_chunks) == (b.info.ctx, b.info.n_vocab, b.info.n_chunks)
    assert np.array_equal(a.info.tokens, b.info.tokens)
    for i in range(a.info.n_chunks):
        np.testing.assert_allclose(a.chunk(i)[1], b.chunk(i)[1], atol=1e-3)
    res2 = run("-m", str(ggufs["cand_f32"]), "--kl-divergence-base", str(ours), "--kl-divergence")
    theirs = {}
    for line in (res2.stdout + res2.stderr).splitlines():
        if ":" in line and ("KLD" in line or "Same top" in line or "PPL" in line):
            k, v = line.split(":", 1)
            theirs[k.strip()] = float(v.split("±")[0].strip().rstrip("%"))
    assert "Mean    KLD" in theirs, (res2.stdout + res2.stderr)[-3000:]
    np.testing.assert_allclose(theirs["Mean    KLD"], printed["Mean    KLD"], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(theirs["Mean PPL(base)"], printed["Mean PPL(base)"], rtol=1e-4)


# --- bad input: one line, exit 2, nothing written --------------------------------------------------

def _cli(*args):
    return CliRunner().invoke(cli, ["verify", *map(str, args)])


def _one_line(res, want: str):
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], res.stderr


def test_corpus_shorter_than_two_chunks(pair, tmp_path):
    ref, cand, corpus = pair
    short = tmp_path / "short.txt"
    short.write_text("Hello world, a short text.")
    out = tmp_path / "r.safetensors"
    res = _cli(ref, cand, "--corpus", short, "--ctx", CTX, "--save-reference", out)
    _one_line(res, f"{short}: corpus has ")
    assert f"tokens; --ctx {CTX} needs at least {2 * CTX} (2 × ctx, as llama-perplexity)" in res.stderr
    assert not out.exists() and not list(tmp_path.glob(".r.safetensors*"))


def test_tokenizer_mismatch(pair, tiny, tmp_path):
    ref, cand, corpus = pair
    other = tmp_path / "other"
    shutil.copytree(cand, other)
    for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        (other / f).unlink(missing_ok=True)
        if (Path(tiny("qwen2")) / f).is_file():
            shutil.copy(Path(tiny("qwen2")) / f, other / f)
    res = _cli(ref, other, "--corpus", corpus, "--ctx", CTX)
    _one_line(res, f"{other}: tokenizer encodes the corpus differently from {ref} (token 0: candidate id ")


@pytest.mark.parametrize("change, want", [
    (("--ctx", CTX * 2), f"saved reference was made with --ctx {CTX}; this run uses {CTX * 2}"),
    (("--score", "all"), "saved reference scores positions ctx/2 … ctx−2; this run asks for --score all"),
    ("corpus", "saved reference was made from another corpus (sha256 "),
    ("tokenizer", "saved reference was made with another tokenizer: its tokens differ (token 0: saved id "),
])
def test_saved_reference_from_another_run(pair, tiny, tmp_path, change, want):
    ref, cand, corpus = pair
    saved = tmp_path / "ref.safetensors"
    assert _cli(ref, cand, "--corpus", corpus, "--ctx", CTX, "--save-reference", saved,
                "--max-mean-kl", 1, "--max-p99-kl", 1, "--min-same-top", 0).exit_code == 0
    args = ["--corpus", corpus, "--ctx", CTX]
    if change == "corpus":
        other = tmp_path / "other.txt"
        other.write_text(TEXT + " and more")
        args = ["--corpus", other, "--ctx", CTX]
    elif change == "tokenizer":
        # the candidate now ships another tokenizer, and with --reference it tokenizes the corpus
        cand = tmp_path / "other"
        shutil.copytree(pair[1], cand)
        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
            (cand / f).unlink(missing_ok=True)
            if (Path(tiny("qwen2")) / f).is_file():
                shutil.copy(Path(tiny("qwen2")) / f, cand / f)
    else:
        args = ["--corpus", corpus, "--ctx", CTX, *change]
        if change[0] == "--ctx":
            args = ["--corpus", corpus, *change]
    out = tmp_path / "report.json"
    res = _cli("--reference", saved, cand, *args, "-o", out)
    _one_line(res, f"{saved}: {want}")
    assert not out.exists()


def test_gguf_with_another_vocabulary(pair, tiny, tmp_path):
    from ckpt_surgeon.conversion import hf_to_gguf
    ref, _, corpus = pair
    g = hf_to_gguf(tiny("qwen2"), tmp_path / "qwen2.gguf", dtype="f32", name="tiny")
    res = _cli(ref, g, "--corpus", corpus, "--ctx", CTX, "--runtime", "llama.cpp")
    _one_line(res, f"{g}: GGUF vocabulary has ")
    assert "the logits would not be comparable" in res.stderr


def test_markdown_and_json_cli(pair, tmp_path):
    ref, cand, corpus = pair
    res = _cli(ref, cand, "--corpus", corpus, "--ctx", CTX, "--format", "markdown", "--max-mean-kl", 1,
               "--max-p99-kl", 1, "--min-same-top", 0)
    assert res.exit_code == 0, res.output
    for label in ("Mean PPL(Q)", "Mean ln(PPL(Q)/PPL(base))", "Mean    KLD", "99.0%   KLD", "RMS Δp", "Same top p"):
        assert f"| {label} |" in res.output, label
    out = tmp_path / "r.json"
    res = _cli(ref, cand, "--corpus", corpus, "--ctx", CTX, "--format", "json", "-o", out, "--max-mean-kl", 1e-9)
    assert res.exit_code == 1
    d = json.loads(out.read_text())
    assert set(d["corpus"]) >= {"tokens", "chunks", "ctx", "scored", "convention", "ppl", "kl", "dp", "same_top"}
    assert set(d["corpus"]["ppl"]) >= {"ref", "cand", "ratio", "cor", "ln_ratio"}
    assert set(d["corpus"]["kl"]) >= {"mean", "se", "max", "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1",
                                      "p0_1", "min"}
    assert set(d["corpus"]["dp"]) >= {"mean", "se", "rms", "rms_se", "max", "p99_9", "median", "p0_1", "min"}
    assert d["failures"][0].startswith("mean KL(ref‖cand) = ")


def test_ln_ppl_ratio_gate_is_one_sided(pair):
    ref, cand, corpus = pair
    fwd = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1,
                        min_same_top=0, max_ln_ppl_ratio=0.0)
    back = verify_corpus(cand, ref, corpus=corpus, ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1,
                         min_same_top=0, max_ln_ppl_ratio=0.0)
    # one direction is worse than the other: exactly one of them fails the gate
    worse = fwd if fwd.stats.ln_ratio > 0 else back
    better = back if worse is fwd else fwd
    assert better.stats.ln_ratio < 0 and better.passed
    assert not worse.passed and "the candidate is worse" in worse.failures[0]


def test_corpus_ids_score_like_the_text(pair, tmp_path):
    """--corpus-ids with the ids the text tokenizes to (BOS included) gives the same statistics."""
    ref, cand, corpus = pair
    text_rep = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1,
                             min_same_top=0)
    ids = tmp_path / "ids.json"
    full = [int(t) for t in text_rep.corpus.tokens.reshape(-1)]
    ids.write_text(json.dumps(full))
    ids_rep = verify_corpus(ref, cand, corpus_ids=ids, ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1,
                            min_same_top=0)
    assert ids_rep.to_dict()["corpus"]["kl"] == text_rep.to_dict()["corpus"]["kl"]
    assert ids_rep.corpus.bos == text_rep.corpus.bos is not None


def test_chunks_scores_the_first_n_chunks_as_llama_perplexity(pair, tmp_path):
    """Issue 50 item 4: --chunks N (llama-perplexity's: n_chunk = min(N, n_tokens / ctx), the first ones) gives the
    statistics of a corpus that holds only those chunks; the report says how many of how many."""
    ref, cand, corpus = pair
    loose = dict(ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1, min_same_top=0)
    full = verify_corpus(ref, cand, corpus=corpus, **loose)
    three = verify_corpus(ref, cand, corpus=corpus, chunks=3, **loose)
    assert full.corpus.tokens.shape[0] > 3 and np.array_equal(three.corpus.tokens, full.corpus.tokens[:3])
    assert f"--chunks 3: the first 3 of {full.corpus.tokens.shape[0]} chunks scored (llama-perplexity's --chunks)" \
        in three.notes
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([int(t) for t in full.corpus.tokens[:3].reshape(-1)]))
    alone = verify_corpus(ref, cand, corpus_ids=ids, **loose)
    assert alone.to_dict()["corpus"]["kl"] == three.to_dict()["corpus"]["kl"] and three.stats.n == alone.stats.n
    more = verify_corpus(ref, cand, corpus=corpus, chunks=10 ** 6, **loose)     # more than there are: all
    assert more.to_dict()["corpus"]["kl"] == full.to_dict()["corpus"]["kl"]
    # the corpus shipped for offline use: --corpus builtin
    from ckpt_surgeon.data import CORPUS
    shipped = verify_corpus(ref, cand, corpus="builtin", chunks=2, **loose)
    assert shipped.corpus.path == str(CORPUS) and shipped.corpus.tokens.shape[0] == 2
    assert shipped.corpus.total_tokens > 100 * CTX         # 128 KB of text: room for the recipe's chunks
    res = CliRunner().invoke(cli, ["verify", str(ref), str(cand), "--chunks", "2"])
    assert res.exit_code == 2 and "--chunks and the cache options need --corpus FILE" in res.output
    res = CliRunner().invoke(cli, ["verify", str(ref), str(cand), "--corpus", str(corpus), "--chunks", "0"])
    assert res.exit_code == 2 and "--chunks" in res.output


def test_json_keys_are_the_documented_contract(pair):
    from ckpt_surgeon.verification.corpus import JSON_KEYS
    ref, cand, corpus = pair
    d = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", max_mean_kl=1, max_p99_kl=1,
                      min_same_top=0).to_dict()
    for key in JSON_KEYS:
        node = d
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, key
            node = node[part]
    documented = {k.split(".")[0] for k in JSON_KEYS}
    assert set(d) == documented
    assert set(d["corpus"]) == {k.split(".")[1] for k in JSON_KEYS if k.startswith("corpus.")}
    doc = (Path(__file__).resolve().parent.parent / "docs" / "verify.md").read_text()
    for key in JSON_KEYS:
        assert f"| `{key}` |" in doc, key


def _same_stats(a, b):
    """Streamed and in-memory runs of the same pair: transformers' own layer classes on the same
    weights, so the per-token values agree to float32 summation-order noise (test_verify_stream:
    bit-identical on the CPU in practice); 1e-9 absolute on KL values of ~1e-2 and relative 1e-6
    on PPL is far below any difference a wrong streamed layer would make (the perturbation moves
    mean KL by orders of magnitude more)."""
    x, y = a.to_dict()["corpus"], b.to_dict()["corpus"]
    np.testing.assert_allclose(x["kl"]["mean"], y["kl"]["mean"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(x["kl"]["p99"], y["kl"]["p99"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(x["ppl"]["ref"], y["ppl"]["ref"], rtol=1e-6)
    np.testing.assert_allclose(x["ppl"]["cand"], y["ppl"]["cand"], rtol=1e-6)
    assert x["same_top"] == y["same_top"] and x["scored"] == y["scored"]


def test_stream_gives_the_in_memory_statistics(pair, ggufs, tmp_path):
    """--corpus --stream: both models one decoder layer at a time (verification.stream), the same
    numbers as both models in memory; a GGUF candidate streamed from the file (no temp folder);
    a saved reference made streamed reused by an in-memory run."""
    ref, cand, corpus = pair
    gates = dict(max_mean_kl=1.0, max_p99_kl=1.0, min_same_top=0.0)
    mem = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", stream=False, **gates)
    streamed = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", stream=True, **gates)
    _same_stats(mem, streamed)
    assert mem.stats.kl_mean > 1e-4       # the pair really differs
    gguf = verify_corpus(ref, ggufs["cand_f32"], corpus=corpus, ctx=CTX, device="cpu", stream=True, **gates)
    _same_stats(mem, gguf)
    assert not any("temporary HF folder" in n for n in gguf.notes)
    saved = tmp_path / "ref.safetensors"
    verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", stream=True, save_reference=saved, **gates)
    _same_stats(mem, verify_corpus(None, cand, corpus=corpus, ctx=CTX, device="cpu", reference_file=saved,
                                   stream=False, **gates))


def test_stream_is_chosen_when_the_pair_does_not_fit(pair):
    """The memory plan of verify decides corpus mode too: a budget that holds one layer but not both
    the run layer-streamed (said in the notes) instead of loading both; a large one keeps it in
    memory."""
    ref, cand, corpus = pair
    gates = dict(max_mean_kl=1.0, max_p99_kl=1.0, min_same_top=0.0)
    small = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", memory_budget=300 << 20, **gates)
    assert any(n.startswith("layer-streamed") for n in small.notes), small.notes
    big = verify_corpus(ref, cand, corpus=corpus, ctx=CTX, device="cpu", memory_budget=1 << 34, **gates)
    assert not any(n.startswith("layer-streamed") for n in big.notes)
    _same_stats(small, big)
    res = _cli(ref, cand, "--corpus", str(corpus), "--ctx", str(CTX), "--device", "cpu",
               "--stream", "--max-mean-kl", "1", "--max-p99-kl", "1", "--min-same-top", "0", "--format", "json")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(json.loads(res.output)["corpus"]["kl"]["mean"], big.stats.kl_mean, rtol=1e-6)
