"""llama.cpp's attn_rot (Hadamard of Q/K/V before a quantized cache): does the static prediction follow it?

For each variant of the key-bias fixture (``fixtures/kv_fixture.py``: concentrated, spread, clean) and each
K cache type, llama.cpp (llama-cpp-python, in process) is run with its rotation on (default) and off
(``LLAMA_ATTN_ROT_DISABLE=1``, read when the context is made), mean KLD against the same GGUF's f16-cache
run (``verify --cache-sweep``), next to the static prediction (``analyze --kv-cache``, model-level score:
sum over layers of the predicted K logit error squared) made with the matching ``attn_rot``.  Prints one
line per (variant, type, rotation) and the Spearman rank agreement of prediction and measurement over
all of them, per rotation setting and pooled.  ``--models NAME=HF_DIR,...`` scores other models too (e.g. an
equalized copy; KLD against the first model, which must be the original).

    python benchmarks/bench_kv_rot.py [--ctx 256] [--chunks 8] [--out DIR] [--variants concentrated,spread,clean]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

TYPES = ("q4_0", "q8_0")


@contextlib.contextmanager
def rot_env(on: bool):
    """``LLAMA_ATTN_ROT_DISABLE`` set to 1 while ``on`` is False (llama.cpp reads it per context)."""
    old = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    if on:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    else:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        if old is not None:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = old


def predicted(hf: Path, t: str, on: bool) -> float:
    from ckpt_surgeon.analysis.kv_cache import analyze_kv_cache
    rep = analyze_kv_cache(str(hf), t, attn_rot=on)
    return float(sum(r.k_error ** 2 for r in rep.layers))


def measured(ref: Path, cand: Path, corpus_file: Path, ctx: int, t: str, on: bool) -> float:
    from benchmarks.bench_kv_cache import sweep
    with rot_env(on):
        (_, st, _), = sweep(ref, cand, corpus_file, ctx, (t,))
    return float(st.kl_mean)


def spearman(a, b) -> float:
    import numpy as np
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv=None) -> int:
    from benchmarks.bench_kv_cache import corpus, fixture
    from ckpt_surgeon.conversion import hf_to_gguf
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default="concentrated,spread,clean")
    ap.add_argument("--types", default=",".join(TYPES))
    a = ap.parse_args(argv)
    work = Path(a.out or tempfile.mkdtemp(prefix="bench-kv-rot-"))
    work.mkdir(parents=True, exist_ok=True)
    rows, text = [], None
    for variant in a.variants.split(","):
        hf, _ = fixture(variant, work)
        g = work / f"{variant}.f16.gguf"
        if not g.is_file():
            hf_to_gguf(hf, g, dtype="f16", name=f"kv-{variant}")
        text = text or corpus(work, hf, a.ctx, a.chunks)
        for t in a.types.split(","):
            for on in (True, False):
                p, m = predicted(hf, t, on), measured(g, g, text, a.ctx, t, on)
                rows.append((variant, t, on, p, m))
                print(f"{variant:<13} K {t:<5} attn_rot {'on ' if on else 'off'}  predicted {p:9.4f}  "
                      f"llama.cpp mean KLD {m:.6f}", flush=True)
    for label, sel in (("on", [r for r in rows if r[2]]), ("off", [r for r in rows if not r[2]]), ("pooled", rows)):
        if len(sel) >= 3:
            print(f"Spearman (attn_rot {label}, {len(sel)} runs): {spearman([r[3] for r in sel], [r[4] for r in sel]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
