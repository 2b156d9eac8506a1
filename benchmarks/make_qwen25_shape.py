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

``--shape`` picks the geometry: ``7b`` (the default, above), ``0.5b`` (Qwen2.5-0.5B: hidden 896,
24 layers, 14 / 2 heads of 64, intermediate 4864, vocab 151936, tied embeddings, one shard,
~0.99 GB) or ``small`` (the 0.5b geometry with 8 layers, ~0.51 GB: for smoke runs of the
benchmarks on a shared machine) or ``7b4`` (the 7b geometry with 4 layers, ~4 GB).

``--kbias`` picks the key-bias profile: ``random`` (the default, above: the boundary norms spread over every
dimension) or ``concentrated``: ``|b_k|`` 605 at the first layer and 921 at the last (the public Qwen2.5-7B
figures), each kv head's share in its last 4 (lowest-frequency) rotary pairs ``(j, j + head_dim/2)`` at random
phases, as ``fixtures/kv_fixture.py``'s concentrated variant; ~22 spread elsewhere.  That is the profile
``kv-equalize`` rewrites (its no-harm guard keeps layers whose bias is spread as it is).

Usage: python benchmarks/make_qwen25_shape.py [--dir .bench/qwen2.5-7b-shape] [--shape 7b] [--sparse]
                                              [--kbias random|concentrated]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    shards: int
    tied: bool
    max_pos: int


SHAPES = {
    "7b": Shape(3584, 28, 28, 4, 128, 18944, 152064, 4, False, 131072),
    "0.5b": Shape(896, 24, 14, 2, 64, 4864, 151936, 1, True, 32768),
    "small": Shape(896, 8, 14, 2, 64, 4864, 151936, 1, True, 32768),
    # the 7b geometry with 4 layers (~4 GB): kv-equalize's per-layer choices at the 7B shape, quickly
    "7b4": Shape(3584, 4, 28, 4, 128, 18944, 152064, 1, False, 131072),
    # many narrow layers (bench_convert_memory.py): the model is ~5x its largest tensor (the
    # 151936 x 512 embedding / head), and "deep8" is the same geometry with 8 layers
    "deep": Shape(512, 64, 8, 2, 64, 2048, 151936, 2, False, 32768),
    "deep8": Shape(512, 8, 8, 2, 64, 2048, 151936, 1, False, 32768),
}


def tensor_specs(shape: Shape = SHAPES["7b"]) -> list[tuple[str, tuple[int, ...]]]:
    H, L, NH, NKV, HD, FF, V = (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn,
                                shape.vocab)
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
    specs += [("model.norm.weight", (H,))]
    if not shape.tied:
        specs += [("lm_head.weight", (V, H))]
    return specs


def config(shape: Shape = SHAPES["7b"]) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "max_position_embeddings": shape.max_pos,
        "max_window_layers": shape.layers, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "sliding_window": shape.max_pos, "tie_word_embeddings": shape.tied,
        "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": shape.vocab, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151643, "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "rope_scaling": None, "transformers_version": "4.43.1",
    }


def _bf16(a: np.ndarray) -> bytes:
    u = a.astype(np.float32).view(np.uint32)
    # round to nearest even, as torch does when casting float32 -> bfloat16
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


KBIAS = ("random", "concentrated")
_CONCENTRATED = {0: 605.0, -1: 921.0}  # the public Qwen2.5-7B boundary key-bias norms (L2)


def _concentrated_k_bias(rng: np.random.Generator, n: int, head_dim: int, norm: float) -> bytes:
    """Each kv head's key bias in its last 4 rotary pairs (dims j, j + head_dim/2), random phases, L2 = norm."""
    half = head_dim // 2
    b = np.zeros((n // head_dim, head_dim))
    for g in range(b.shape[0]):
        for j in range(half - 4, half):
            phi = rng.uniform(0, 2 * np.pi)
            b[g, j], b[g, j + half] = np.cos(phi), np.sin(phi)
    b = b.reshape(-1)
    return _bf16(b * (norm / np.linalg.norm(b)))


def _fill_value(name: str, shape, rng: np.random.Generator, n_layers: int, kbias: str = "random",
                head_dim: int = 128) -> bytes | None:
    """Small tensors get meaningful random values; big ones use the shared block (None)."""
    n = int(np.prod(shape))
    if name.endswith(".bias"):
        layer = int(name.split(".")[2])
        scale = 1.0
        if kbias == "concentrated" and "k_proj" in name and layer in (0, n_layers - 1):
            return _concentrated_k_bias(rng, n, head_dim, _CONCENTRATED[0 if layer == 0 else -1])
        if "k_proj" in name:
            # large in the first and last layers, median ~22 (in L2 over 512 values)
            scale = {0: 600.0, n_layers - 1: 900.0}.get(layer, 22.0) / np.sqrt(n)
        return _bf16(rng.standard_normal(n) * scale)
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return _bf16(1.0 + 0.1 * rng.standard_normal(n))
    return None


def make_qwen25_shape(out_dir: str | os.PathLike = ".bench/qwen2.5-7b-shape", *, sparse: bool = False,
                      quiet: bool = False, shape: str = "7b", kbias: str = "random") -> Path:
    if kbias not in KBIAS:
        raise ValueError(f"unknown key-bias profile {kbias!r}; known: {', '.join(KBIAS)}")
    out = Path(out_dir)
    done, mark = out / ".complete", "ok\n" if kbias == "random" else f"ok {kbias}\n"
    if done.exists():
        if done.read_text() != mark:
            raise ValueError(f"{out} holds another key-bias profile ({done.read_text().strip()!r}); use another --dir")
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    block = _bf16(rng.standard_normal(1 << 24) * 0.02)  # 32 MB of bf16 reused for big tensors
    geo = SHAPES[shape]
    specs = tensor_specs(geo)
    total = sum(int(np.prod(s)) * 2 for _, s in specs)
    target = total / geo.shards
    shards, cur, size = [], [], 0
    for name, dims in specs:
        nb = int(np.prod(dims)) * 2
        if cur and size + nb > target and len(shards) < geo.shards - 1:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, dims))
        size += nb
    shards.append(cur)
    weight_map = {}
    for si, shard in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dims in shard:
            nb = int(np.prod(dims)) * 2
            header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        tmp = out / (fname + ".tmp")
        with open(tmp, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            base = f.tell()
            for name, dims in shard:
                nb = int(np.prod(dims)) * 2
                val = _fill_value(name, dims, rng, geo.layers, kbias, geo.head_dim)
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
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(config(geo), indent=2))
    done.write_text(mark)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".bench/qwen2.5-7b-shape")
    ap.add_argument("--sparse", action="store_true", help="leave big weights as file holes")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b", help="geometry (see the module doc)")
    ap.add_argument("--kbias", choices=KBIAS, default="random", help="key-bias profile (see the module doc)")
    a = ap.parse_args()
    print(make_qwen25_shape(a.dir, sparse=a.sparse, shape=a.shape, kbias=a.kbias))
