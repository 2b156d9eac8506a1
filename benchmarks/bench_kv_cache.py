"""What a quantized K cache costs in llama.cpp, and how much ``kv-equalize`` gives back (issue 32).

For each variant of the Qwen2.5-7B key-bias fixture (``fixtures/kv_fixture.py``: Qwen2, head_dim 128,
‖b_k‖ 605 at the first layer and 921 at the last, ~22 elsewhere; ``concentrated`` = the boundary
layers' bias in 4 low-frequency rotary pairs, ``spread`` = the same norms over every dimension,
``clean`` = ~22 everywhere), the model is converted to a GGUF f16 by the project's converter and run
in llama.cpp (llama-cpp-python) over the shipped corpus (``--corpus builtin``) with a q4_0 and a q8_0 K cache
(V f16), each scored against the same GGUF with the f16 cache (``verify --cache-sweep``:
``verification.cache_sweep.verify_cache_sweep``).  When ``ckpt_surgeon.kv_equalize`` is importable,
the equalized model (one per K type, ``cache_type_k=T``) is converted and scored the same way
against the *original* model's f16-cache run, and the ratio before / after is printed, with how far
the equalized concentrated model stays from the clean one.

    python benchmarks/bench_kv_cache.py [--ctx 256] [--chunks 16] [--out DIR] [--variants concentrated,spread,clean]
                                        [--calibrate] [--scales pow2,continuous] [--min-gain F]

``--min-gain F`` passes kv-equalize's no-harm guard threshold (0: every layer as the optimizer chose, the
behaviour before the guard); each equalized model's line says how many tensors changed and which layers the
guard kept.  ``--calibrate`` also scores ``kv_equalize(..., calibrate=True)`` (scales chosen on the measured attention
error of the built-in prompts) next to the static choice.

If ``fixtures/kv_fixture.py`` is not in this checkout, an equivalent model is built inline (same
shape and bias profile; said in the output).  Prints one line per (variant, model, K type): mean KLD
± SE, same top ± SE, PPL ratio, seconds.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

TYPES = ("q4_0", "q8_0")


def fixture(variant: str, work: Path) -> tuple[Path, str]:
    """(HF folder, where it came from): the kvstatic fixture when present, else the inline twin."""
    try:
        from fixtures.kv_fixture import kv_fixture_path
        return kv_fixture_path(variant), "fixtures.kv_fixture"
    except ImportError:
        out = work / f"inline-{variant}"
        if not (out / "config.json").is_file():
            _inline_fixture(out, variant)
        return out, "inline twin of fixtures.kv_fixture (not in this checkout)"


def _inline_fixture(out: Path, variant: str, seed: int = 0) -> None:
    """Qwen2, hidden 512, 4 heads over 2 kv heads of 128, 6 layers; ‖b_k‖ 605 / 921 at the first /
    last layer (concentrated: in rotary pairs 60..63 of each kv head), 24, 16, 28, 20 between; the
    clean variant 22 at the boundary layers."""
    import numpy as np
    import torch
    import transformers

    from fixtures import fixture_path
    tok = fixture_path("qwen2")
    base = transformers.AutoConfig.from_pretrained(tok)
    cfg = transformers.Qwen2Config(vocab_size=base.vocab_size, hidden_size=512, intermediate_size=512,
                                   num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                                   tie_word_embeddings=False, max_position_embeddings=4096)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    rng = np.random.default_rng(seed)
    norms = [605.0, 24.0, 16.0, 28.0, 20.0, 921.0] if variant != "clean" else [22.0, 24.0, 16.0, 28.0, 20.0, 22.0]
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            at = layer.self_attn
            for proj in (at.q_proj, at.k_proj, at.v_proj):
                proj.weight.copy_(torch.from_numpy(rng.standard_normal(proj.weight.shape) * 1.5 / 512 ** 0.5))
            b = np.zeros((2, 128))
            if variant == "concentrated" and i in (0, 5):
                phi = rng.uniform(0, 2 * np.pi, (2, 4))
                b[:, 60:64], b[:, 124:128] = np.cos(phi), np.sin(phi)
            else:
                b = rng.standard_normal((2, 128))
            b = b.reshape(-1) * (norms[i] / np.linalg.norm(b))
            at.k_proj.bias.copy_(torch.from_numpy(b))
    model.save_pretrained(out)
    for f in Path(tok).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (out / f.name).write_bytes(f.read_bytes())


def sweep(reference: Path, candidate: Path, ctx: int, chunks: int, types) -> list:
    """``verify --cache-sweep`` over the first ``chunks`` chunks of the shipped corpus (``--corpus builtin``:
    ckpt_surgeon/data/corpus.txt, frozen, so the figures do not move when the docs change; its first 8 x 256
    tokens are those of the docs/*.md cut this benchmark used before)."""
    from ckpt_surgeon.verification.cache_sweep import verify_cache_sweep
    t0 = time.perf_counter()
    rep = verify_cache_sweep(reference, candidate, cache_sweep=",".join(f"{t}/f16" for t in types),
                             corpus="builtin", ctx=ctx, chunks=chunks, device="cpu")
    dt = (time.perf_counter() - t0) / len(types)
    return [(r.cache.k, r.stats, dt) for r in rep.rows_]


def line(variant: str, model: str, k: str, st, dt: float) -> str:
    return (f"{variant:<13} {model:<10} K {k:<5} mean KLD {st.kl_mean:.6f} ± {st.kl_se:.6f}  same top "
            f"{100 * st.same_top:6.2f} ± {100 * st.same_top_se:4.2f} %  PPL ratio {st.ratio:.4f} ± {st.ratio_se:.4f}"
            f"  ({dt:.1f} s)")


def equalized(hf: Path, work: Path, variant: str, k: str, calibrate: bool = False,
              scales: str | None = None, min_gain: float | None = None) -> Path | None:
    import ckpt_surgeon
    kv_equalize = getattr(ckpt_surgeon, "kv_equalize", None)
    if kv_equalize is None:
        return None
    mg = "" if min_gain is None else f"-mg{min_gain:g}"
    out = work / f"{variant}-{'cal' if calibrate else 'eq'}{'-' + scales if scales else ''}{mg}-{k}"
    if not (out / "config.json").is_file():
        t0 = time.perf_counter()
        kw = {"scales": scales} if scales else {}
        kw.update({"min_gain": min_gain} if min_gain is not None and not calibrate else {})
        rep = kv_equalize(hf, out, cache_type_k=k, calibrate=calibrate, **kw)
        kept = [n for n in rep.plan.notes if n.startswith("layers left as they are")]
        print(f"# kv-equalize {variant} {k}: scales chosen {rep.plan.params.get('scales')}, "
              f"{rep.plan.params.get('scale_values', 'continuous')}, min_gain {rep.plan.params.get('min_gain')}; "
              f"{len(rep.plan.changed)} tensors changed; {kept[0] if kept else 'no layer kept by the guard'} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--variants", default="concentrated,spread,clean")
    ap.add_argument("--calibrate", action="store_true",
                    help="also score kv-equalize --calibrate (scales chosen on the built-in prompts)")
    ap.add_argument("--scales", default=None,
                    help="static choice with these scale kinds, a comma list (pow2,continuous); the first is the "
                         "'static' row of the summary (default: kv-equalize's own default)")
    ap.add_argument("--min-gain", type=float, default=None,
                    help="kv-equalize's no-harm guard (default: its own, 0.10); 0 rewrites every layer as the "
                         "optimizer chose (the runs before the guard existed)")
    a = ap.parse_args(argv)
    from ckpt_surgeon.conversion import hf_to_gguf
    work = Path(a.out or tempfile.mkdtemp(prefix="bench-kv-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    base: dict = {}
    for variant in a.variants.split(","):
        hf, origin = fixture(variant, work)
        print(f"# {variant}: {hf} ({origin})", flush=True)
        g = work / f"{variant}.f16.gguf"
        if not g.is_file():
            hf_to_gguf(hf, g, dtype="f16", name=f"kv-{variant}")
        for k, st, dt in sweep(g, g, a.ctx, a.chunks, TYPES):
            base[variant, k] = st
            print(line(variant, "original", k, st, dt), flush=True)
        scales = a.scales.split(",") if a.scales else [None]
        kinds = [("eq" if i == 0 else f"eq-{sc}", sc) for i, sc in enumerate(scales)]
        kinds += [("cal", None)] if a.calibrate else []
        for k in TYPES:
            for kind, sc in kinds:
                eq = equalized(hf, work, variant, k, calibrate=kind == "cal", scales=sc, min_gain=a.min_gain)
                if eq is None:
                    print(f"{variant:<13} equalized  (ckpt_surgeon.kv_equalize not importable: skipped)")
                    break
                ge = work / f"{eq.name}.f16.gguf"
                if not ge.is_file():
                    hf_to_gguf(eq, ge, dtype="f16", name=f"kv-{variant}-{kind}")
                (_, st, dt), = sweep(g, ge, a.ctx, a.chunks, (k,))
                base[variant, kind, k] = st
                label = "calibrated" if kind == "cal" else ("static" + (f" {sc}" if sc else ""))
                print(line(variant, label, k, st, dt) +
                      f"  -> {base[variant, k].kl_mean / st.kl_mean:.2f}x lower mean KLD", flush=True)
    _summary(base)
    return 0


def _summary(base: dict) -> None:
    for k in TYPES:
        clean = base.get(("clean", k))
        for v in ("concentrated", "spread"):
            eq, cal, orig = base.get((v, "eq", k)), base.get((v, "cal", k)), base.get((v, k))
            if clean is not None and orig is not None:
                tail = f"; static choice {eq.kl_mean / clean.kl_mean:.2f}x" if eq is not None else ""
                tail += f"; calibrated {cal.kl_mean / clean.kl_mean:.2f}x" if cal is not None else ""
                print(f"K {k}: {v} original {orig.kl_mean / clean.kl_mean:.2f}x the clean model's mean KLD{tail}")


if __name__ == "__main__":
    sys.exit(main())
