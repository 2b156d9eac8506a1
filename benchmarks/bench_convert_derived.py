"""Derived-path speed: ``convert`` on an architecture outside the native registry (OLMo) against
llama.cpp's own ``convert_hf_to_gguf.py`` on the same folder, measured in the same run, each as a fresh
process (python start, imports, conversion, write), f16 and q8_0; the outputs are compared byte for byte.

    python benchmarks/bench_convert_derived.py [--hidden 768] [--layers 6] [--vocab 8192]

The model is random (transformers' OlmoConfig at the given width) with the tiny llama fixture's
tokenizer; llama.cpp pads the vocabulary to the config's size as it does for real models.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def build(dest: Path, hidden: int, layers: int, vocab: int) -> Path:
    import torch
    import transformers
    from fixtures.build_fixtures import fixture_path
    cfg = transformers.OlmoConfig(hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                                  num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                  num_key_value_heads=hidden // 64, vocab_size=vocab, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.OlmoForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(dest)
    tok = fixture_path("llama")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, dest / f)
    return dest


def timed(cmd, env) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children): on a shared machine the CPU time
    is the steadier figure."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {r.stderr[-800:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    from llamacpp_src import llamacpp_source
    root = llamacpp_source()
    work = Path(tempfile.mkdtemp(prefix="bench-derived-"))
    src = build(work / "olmo", a.hidden, a.layers, a.vocab)
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    ref_env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
    our_env = dict(os.environ, PYTHONPATH=str(ROOT), CKPT_SURGEON_LLAMACPP_SRC=str(root))
    print(f"OLMo hidden {a.hidden} x {a.layers} layers, vocab {a.vocab}: {size / 1e6:.0f} MB bf16 safetensors")
    for outtype in ("f16", "q8_0"):
        (work / "ref").mkdir(exist_ok=True)
        t_ref = timed([sys.executable, str(ROOT / "tests" / "llamacpp_ref_convert.py"), str(root), str(src),
                       str(work / "ref"), "gpt-2", outtype], ref_env)
        ours = work / f"ours.{outtype}.gguf"
        t_ours = timed([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(ours), "--dtype", outtype,
                        "--force"], our_env)
        same = ours.read_bytes() == (work / "ref" / f"{outtype}.gguf").read_bytes()
        print(f"{outtype:5s} llama.cpp {t_ref[0]:6.1f} s wall {t_ref[1]:6.1f} s CPU   derived {t_ours[0]:6.1f} s wall "
              f"{t_ours[1]:6.1f} s CPU   ratio {t_ours[0] / t_ref[0]:.2f}x wall {t_ours[1] / t_ref[1]:.2f}x CPU   "
              f"{'identical' if same else 'DIFFERENT'}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
