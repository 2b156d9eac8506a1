"""HF -> GGUF memory is bounded by the largest tensor, not by the model (issue 33 item 4).

Non-timing: the same geometry at 8 and at 120 layers (the second ~15x the first's bytes, ~230 MB
more output) converts in a fresh process each, and the growth of its resident memory during the
conversion (peak ``VmHWM`` minus the RSS just before, after the imports) is compared.  A
converter holding the model, its output or a model-sized buffer would grow by at least the 112
extra layers' output bytes; ours holds at most ``2 x workers`` chunks in flight, each at most one
tensor here (the largest, ``ffn``, 1 MiB as float32), with their decode / encode temporaries
(~3x), so its growth may differ between the two sizes only by allocator noise.  The bound
asserted: growth(120 layers) - growth(8 layers) < 2 x workers x 3 x the largest tensor's float32
size + 16 MiB of allocator slack (glibc's per-thread arenas), below the 210 MiB of extra source
(420 MiB as float32) a model-sized hold would add.  Measured on the 2-core machine (VmHWM):
f16 +3.1 MiB, q8_0 +11 MiB, q4_k_m (split in 20 MB parts) +13 MiB, against a 28 MiB bound.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HIDDEN, FFN, HEADS, KV_HEADS = 256, 1024, 4, 2
LARGEST_F32 = FFN * HIDDEN * 4

_PROBE = r"""
import json, os, sys
from ckpt_surgeon.conversion import convert
import ckpt_surgeon.conversion.to_gguf, ckpt_surgeon.conversion.gguf_stream, ckpt_surgeon.formats.quant.quantize  # imports first
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = rss()
rep = convert(sys.argv[1], sys.argv[2], dtype=sys.argv[3], isolate=True, name="x", split_max_size=sys.argv[4] or None)
# VmHWM: this process's own peak.  Not ru_maxrss: Linux carries the parent's peak across fork +
# exec into it (the pytest process's ~250 MB would hide everything measured here)
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"before": before, "peak": peak, "bytes": rep.bytes_written}))
"""


def _deep_model(tiny, folder: Path, layers: int) -> Path:
    """A Qwen2 folder of ``layers`` layers (random F16 weights), the tiny model's tokenizer."""
    from safetensors.numpy import save_file
    base = tiny("qwen2")
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(base / f, folder / f)
    cfg = json.loads((base / "config.json").read_text())
    cfg.update(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
               num_hidden_layers=layers, layer_types=["full_attention"] * layers, max_window_layers=layers,
               dtype="float16")
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    block = rng.standard_normal(FFN * HIDDEN).astype(np.float16) * np.float16(0.02)
    kvd = HIDDEN // HEADS * KV_HEADS

    def t(*shape):
        return block[:int(np.prod(shape))].reshape(shape).copy()
    tensors = {"model.embed_tokens.weight": t(cfg["vocab_size"], HIDDEN), "model.norm.weight": t(HIDDEN),
               "lm_head.weight": t(cfg["vocab_size"], HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": t(HIDDEN), p + "post_attention_layernorm.weight": t(HIDDEN),
                        p + "self_attn.q_proj.weight": t(HIDDEN, HIDDEN), p + "self_attn.q_proj.bias": t(HIDDEN),
                        p + "self_attn.k_proj.weight": t(kvd, HIDDEN), p + "self_attn.k_proj.bias": t(kvd),
                        p + "self_attn.v_proj.weight": t(kvd, HIDDEN), p + "self_attn.v_proj.bias": t(kvd),
                        p + "self_attn.o_proj.weight": t(HIDDEN, HIDDEN), p + "mlp.gate_proj.weight": t(FFN, HIDDEN),
                        p + "mlp.up_proj.weight": t(FFN, HIDDEN), p + "mlp.down_proj.weight": t(HIDDEN, FFN)})
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _growth(src: Path, out: Path, dtype: str, split: str) -> tuple[int, int]:
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", _PROBE, str(src), str(out), dtype, split], capture_output=True, text=True,
                       cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["peak"] - d["before"], d["bytes"]


@pytest.fixture(scope="module")
def deep(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("deep")
    return {n: _deep_model(tiny, root / f"l{n}", n) for n in (8, 120)}


# f16 and q8_0 (our own encoders, 4 workers), q4_k_m (llama.cpp's kernels, one worker per core)
# written as a split set of 20 MB parts (one part open at a time)
@pytest.mark.parametrize("dtype,split", [("f16", ""), ("q8_0", ""), ("q4_k_m", "20M")])
def test_rss_growth_does_not_follow_model_size(deep, tmp_path, dtype, split):
    small, small_out = _growth(deep[8], tmp_path / "s.gguf", dtype, split)
    big, big_out = _growth(deep[120], tmp_path / "b.gguf", dtype, split)
    more = (deep[120] / "model.safetensors").stat().st_size - (deep[8] / "model.safetensors").stat().st_size
    # in flight: at most 2 chunks per worker (gguf_stream: 4 workers for our encoders, one per core up
    # to 16 for llama.cpp's kernels), each at most one tensor here, ~3x with its decode / encode
    # temporaries; plus 16 MiB of allocator slack (glibc's per-thread arenas)
    workers = min(16 if dtype.startswith("q4") else 4, os.cpu_count() or 1)
    bound = 2 * workers * 3 * LARGEST_F32 + (16 << 20)
    assert more > max(bound, 200 << 20)        # the model really grew: holding it (or its values) would show
    print(f"{dtype}: RSS growth {small / 2**20:.1f} MiB at 8 layers, {big / 2**20:.1f} MiB at 120 layers "
          f"(+{more / 2**20:.0f} MiB of source, +{(big_out - small_out) / 2**20:.0f} MiB of output; bound "
          f"{bound / 2**20:.0f} MiB)")
    assert big - small < bound, f"{dtype}: RSS growth {small / 2**20:.1f} MiB at 8 layers, {big / 2**20:.1f} at 120"
