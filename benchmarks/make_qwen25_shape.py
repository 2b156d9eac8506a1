"""Generate a Qwen2.5-7B-shaped sharded safetensors checkpoint (random values) once.

28 layers, hidden 3584, 28 query / 4 kv heads (head_dim 128), intermediate 18944,
vocab 152064, bf16, 4 shards (~15.2 GB), with config.json and
model.safetensors.index.json as the Hub has them.  Values are random but shaped
like the real model where it matters to us: q/k/v biases exist in every layer
and the key-bias norms are large in the first and last layers (public reports
put layer 0 at ~600 and layer 27 at ~900 in L2).

Written in streaming fashion with a reused random block (bounded RAM).  With
``--sparse`` the big weights are left as file holes (fast to make, but ``cp`` and
the kernel then skip them, which flatters copy baselines); the default writes
real bytes so copy/read benchmarks measure real I/O.

Usage: python benchmarks/make_qwen25_shape.py [--dir .bench/qwen2.5-7b-shape] [--sparse]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

H, L, NH, NKV, HD, FF, V = 3584, 28, 28, 4, 128, 18944, 152064
NUM_SHARDS = 4


def tensor_specs() -> list[tuple[str, tuple[int, ...]]]:
    specs = [("model.embed_tokens.weight", (V, H))]
    for i in range(L):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (NH * HD, H)), (p + "self_attn.q_proj.bias", (NH * HD,)),
            (p + "self_attn.k_proj.weight", (NKV * HD, H)), (p + "self_attn.k_proj.bias", (NKV * HD,)),
            (p + "self_attn.v_proj.weight", (NKV * HD, H)), (p + "self_attn.v_proj.bias", (NKV * HD,)),
            (p + "self_attn.o_proj.weight", (H, NH * HD)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "mlp.gate_proj.weight", (FF, H)), (p + "mlp.up_proj.weight", (FF, H)),
            (p + "mlp.down_proj.weight", (H, FF)),
        ]
    specs += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return specs


def config() -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": H,
        "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
        "num_key_value_heads": NKV, "max_position_embeddings": 131072, "max_window_layers": 28,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": V, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151643, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "rope_scaling": None, "transformers_version": "4.43.1",
    }


def _bf16(a: np.ndarray) -> bytes:
    u = a.astype(np.float32).view(np.uint32)
    # round to nearest even, as torch does when casting float32 -> bfloat16
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def _fill_value(name: str, shape, rng: np.random.Generator) -> bytes | None:
    """Small tensors get meaningful random values; big ones use the shared block (None)."""
    n = int(np.prod(shape))
    if name.endswith(".bias"):
        layer = int(name.split(".")[2])
        scale = 1.0
        if "k_proj" in name:
            # large in the first and last layers, median ~22 (in L2 over 512 values)
            scale = {0: 600.0, L - 1: 900.0}.get(layer, 22.0) / np.sqrt(n)
        return _bf16(rng.standard_normal(n) * scale)
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return _bf16(1.0 + 0.1 * rng.standard_normal(n))
    return None


def make_qwen25_shape(out_dir: str | os.PathLike = ".bench/qwen2.5-7b-shape", *, sparse: bool = False,
                      quiet: bool = False) -> Path:
    out = Path(out_dir)
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    block = _bf16(rng.standard_normal(1 << 24) * 0.02)  # 32 MB of bf16 reused for big tensors
    specs = tensor_specs()
    total = sum(int(np.prod(s)) * 2 for _, s in specs)
    target = total / NUM_SHARDS
    shards, cur, size = [], [], 0
    for name, shape in specs:
        nb = int(np.prod(shape)) * 2
        if cur and size + nb > target and len(shards) < NUM_SHARDS - 1:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nb
    shards.append(cur)
    weight_map = {}
    for si, shard in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            nb = int(np.prod(shape)) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        tmp = out / (fname + ".tmp")
        with open(tmp, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            base = f.tell()
            for name, shape in shard:
                nb = int(np.prod(shape)) * 2
                val = _fill_value(name, shape, rng)
                if val is not None:
                    f.write(val)
                elif sparse:
                    f.seek(nb, os.SEEK_CUR)
                else:
                    left = nb
                    while left:
                        k = min(left, len(block))
                        f.write(block[:k])
                        left -= k
            f.truncate(base + off)
        os.replace(tmp, out / fname)
        if not quiet:
            print(f"wrote {fname} ({(base + off) / 1e9:.2f} GB)", file=sys.stderr)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(config(), indent=2))
    done.write_text("ok\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--sparse", action="store_true", help="leave big weights as file holes")
    a = ap.parse_args()
    print(make_qwen25_shape(a.dir, sparse=a.sparse))
