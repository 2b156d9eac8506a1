"""Issue 32's prediction target: does the static per-layer ranking agree with the measured one (Spearman >= 0.8
on the fixture) and name the planted layers first?

For each variant of the key-bias fixture (``fixtures/kv_fixture.py``; planted layers 0 and 5 in ``concentrated``
and ``spread``, none in ``clean``) and each cache type, the static prediction (``analyze --kv-cache``:
:func:`ckpt_surgeon.analysis.kv_cache.analyze_kv_cache`, no torch) is set beside the measurement of
``analyze --kv-cache --measure`` (:func:`ckpt_surgeon.analysis.kv_measure.measure_kv_cache`: a float32
transformers forward pass over the built-in prompts, the real Q/K/V through ggml's own kernels, llama.cpp's
Hadamard rotation where it applies it), and the product's own figures are printed: the Spearman correlation of
predicted K error and measured attention-row KL over the layers (``rank_agreement``), the worst layers each way,
and whether the planted layers come first in both rankings.

    python benchmarks/bench_kv_rank.py [--variants concentrated,spread,clean] [--types q4_0,q8_0] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="concentrated,spread,clean")
    ap.add_argument("--types", default="q4_0,q8_0")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    from ckpt_surgeon.analysis.kv_cache import analyze_kv_cache
    from ckpt_surgeon.analysis.kv_measure import measure_kv_cache
    from fixtures.kv_fixture import PLANTED, kv_fixture_path
    types = tuple(a.types.split(","))
    for variant in a.variants.split(","):
        folder = kv_fixture_path(variant)
        t0 = time.perf_counter()
        rep = analyze_kv_cache(str(folder), ",".join(types))
        rep = replace(rep, measured=measure_kv_cache(str(folder), types, max_tokens=a.max_tokens))
        planted = set(PLANTED) if variant != "clean" else set()
        for t in types:
            pred = np.array([r.k_error for r in rep.layers if r.cache_type == t])
            meas = {r.layer: r.k_row_kl for r in rep.measured.layers if r.cache_type == t}
            meas = np.array([meas[i] for i in range(len(pred))])
            top_p, top_m = list(np.argsort(-pred)[:2]), list(np.argsort(-meas)[:2])
            first = "-" if not planted else ("yes" if set(top_p) == planted == set(top_m) else "NO")
            print(f"{variant:<13} {t:<5} Spearman {rep.rank_agreement(t):.2f}  ranked first: predicted "
                  f"{', '.join(map(str, top_p))}, measured {', '.join(map(str, top_m))}; planted first: {first}  "
                  f"at risk {rep.at_risk(t) or '-'}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
