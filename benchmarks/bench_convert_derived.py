"""Derived-path speed and memory: ``convert`` on an architecture outside the native registry against
llama.cpp's own ``convert_hf_to_gguf.py`` on the same folder, measured in the same run, each as a fresh
process (python start, imports, conversion, write), f16 and q8_0; the outputs are compared byte for byte
(streamed sha-256: a 7B output is not read into memory).  Per side: wall time, CPU time and the peak RSS of
the whole process tree (ours: the CLI plus the child running llama.cpp's class).

    python benchmarks/bench_convert_derived.py [--hidden 768] [--layers 6] [--vocab 8192]
    python benchmarks/bench_convert_derived.py --from-shape .bench/qwen2.5-7b-shape [--outtypes f16]

Default: a random OLMo (transformers' OlmoConfig at the given width) with the tiny llama fixture's
tokenizer; llama.cpp pads the vocabulary to the config's size as it does for real models.
``--from-shape DIR``: the 7B-scale case.  DIR is a Qwen2.5-shaped folder from
``benchmarks/make_qwen25_shape.py`` (15.2 GB bf16 at ``--shape 7b``); its shards are hard-linked (no copy)
into a Seed-OSS folder (``SeedOssForCausalLM``: the same tensor names, q/k/v biases and no o bias, and a
llama.cpp class outside our registry), so the derived path converts 7B-sized tensors.  The issue's targets
printed beside the figures: derived <= 1.0x llama.cpp's time, and peak RSS <= the largest tensor's f32
size + 300 MB.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import sys
import tempfile
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


def from_shape(shape_dir: Path, dest: Path) -> Path:
    """A Seed-OSS folder over the Qwen2.5-shaped shards of ``shape_dir`` (hard links), tokenizer of the tiny llama."""
    import json
    from fixtures.build_fixtures import fixture_path
    dest.mkdir(parents=True)
    for f in shape_dir.iterdir():
        if f.name.endswith(".safetensors") or f.name == "model.safetensors.index.json":
            os.link(f, dest / f.name)
    cfg = json.loads((shape_dir / "config.json").read_text())
    cfg.update(model_type="seed_oss", architectures=["SeedOssForCausalLM"], attention_bias=True,
               attention_out_bias=False, mlp_bias=False,
               head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    tok = fixture_path("llama")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, dest / f)
    return dest


def largest_f32(folder: Path) -> int:
    from ckpt_surgeon.checkpoint import open_stored
    with open_stored(folder) as ck:
        return max(int(math.prod(i.shape)) for i in ck.stored_tensors.values()) * 4


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    from benchmarks._proc import tree_measured
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--from-shape", type=Path, default=None, help="a make_qwen25_shape.py folder (7B scale)")
    ap.add_argument("--outtypes", default="f16,q8_0")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    a = ap.parse_args()
    from llamacpp_src import llamacpp_source
    root = llamacpp_source()
    work = Path(tempfile.mkdtemp(prefix="bench-derived-", dir=a.work))
    try:
        if a.from_shape is not None:
            src = from_shape(a.from_shape.resolve(), work / "seed_oss")
            what = f"Seed-OSS over {a.from_shape.name}"
        else:
            src = build(work / "olmo", a.hidden, a.layers, a.vocab)
            what = f"OLMo hidden {a.hidden} x {a.layers} layers, vocab {a.vocab}"
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        big = largest_f32(src)
        ref_env = dict(os.environ, PYTHONPATH=str(root / "gguf-py"), NO_LOCAL_GGUF="1")
        our_env = dict(os.environ, PYTHONPATH=str(ROOT), CKPT_SURGEON_LLAMACPP_SRC=str(root))
        print(f"{what}: {size / 1e9:.2f} GB bf16 safetensors; largest tensor {big / 2**20:,.0f} MiB as f32 "
              f"(memory target {(big + 300 * 2**20) / 2**20:,.0f} MiB)", flush=True)
        for outtype in a.outtypes.split(","):
            (work / "ref").mkdir(exist_ok=True)
            ref_out = work / "ref" / f"{outtype}.gguf"
            os.sync()
            t_ref = tree_measured([sys.executable, str(ROOT / "tests" / "llamacpp_ref_convert.py"), str(root),
                                   str(src), str(work / "ref"), "gpt-2", outtype], ref_env)
            ref_sha = sha(ref_out)
            ref_out.unlink()
            ours = work / f"ours.{outtype}.gguf"
            os.sync()
            t_ours = tree_measured([sys.executable, "-m", "ckpt_surgeon", "convert", str(src), "-o", str(ours),
                                    "--dtype", outtype, "--force", "--no-progress"], our_env)
            same = sha(ours) == ref_sha
            ours.unlink()
            print(f"{outtype:5s} llama.cpp {t_ref['wall']:7.1f} s wall {t_ref['cpu']:7.1f} s CPU "
                  f"{t_ref['rss'] / 2**20:7,.0f} MiB   derived {t_ours['wall']:7.1f} s wall {t_ours['cpu']:7.1f} s CPU "
                  f"{t_ours['rss'] / 2**20:7,.0f} MiB   ratio {t_ours['wall'] / t_ref['wall']:.2f}x wall "
                  f"{t_ours['cpu'] / t_ref['cpu']:.2f}x CPU   memory {'within' if t_ours['rss'] <= big + 300 * 2**20 else 'ABOVE'}"
                  f" target   {'identical' if same else 'DIFFERENT'}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
