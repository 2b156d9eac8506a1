"""Where a quantized K cache's damage comes from: per layer, and Q's rounding vs K's (issue 32).

Stock llama.cpp has one cache type for every layer, so the split is measured in transformers (float32,
eager) with the same kernels: each attention call's post-RoPE key goes through the cache type and its
query through the vec_dot type (``analysis.kv_measure.roundtrip``, ggml's own code, blocks of 32 along the
head dim, as llama.cpp's CPU path does), only in the layers and for the parts (Q, K) asked, and the mean
KLD of the final next-token distributions against the unquantized run is taken over ``--chunks`` windows
of ``--ctx`` tokens of the docs (the corpus of ``bench_kv_cache.py``; the second half of each window
scored, as llama.cpp's perplexity tool scores).

    python benchmarks/bench_kv_share.py --models concentrated=DIR,static=DIR,calibrated=DIR [--type q4_0]

With ``--no-attn-rot`` Q and K are rounded as they are; by default both are first rotated by the
Hadamard matrix llama.cpp applies for a quantized K cache (``attn_rot_k``, head_dim a multiple of 64).

Prints, per model: all layers Q+K (compare with llama.cpp's figure), K only, Q only, and each layer alone.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))


@contextlib.contextmanager
def quantized_attention(layers, parts: str, cache_type: str, attn_rot: bool = True):
    """Round K (``"k" in parts``) and Q (``"q"``) as a ``cache_type`` cache does, in ``layers`` only; ``attn_rot``:
    both first rotated by llama.cpp's Hadamard (``surgery.kv_calibrate.hadamard``), as llama.cpp does."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ckpt_surgeon.analysis.kv_measure import query_type, roundtrip
    from ckpt_surgeon.surgery.kv_calibrate import hadamard
    orig = ALL_ATTENTION_FUNCTIONS.get_interface

    def rt(x, name):
        # rotated (H orthogonal, chunks of n along the head dim): every q.k is unchanged before rounding
        a = x.detach().float().cpu().numpy()
        h = hadamard(a.shape[-1], (cache_type,)) if attn_rot else None
        if h is not None:
            a = (a.reshape(a.shape[:-1] + (-1, h.shape[0])) @ h).reshape(a.shape)
        return torch.from_numpy(a if name == "exact" else roundtrip(a, name)).to(x.dtype)

    def get_interface(impl, default):
        fn = orig(impl, default)

        def wrapped(module, query, key, value, *args, **kwargs):
            if module.layer_idx in layers:
                # both rotated even when only one is rounded (the other exact): logits stay consistent
                query = rt(query, query_type(cache_type) if "q" in parts else "exact")
                key = rt(key, cache_type if "k" in parts else "exact")
            return fn(module, query, key, value, *args, **kwargs)
        return wrapped

    ALL_ATTENTION_FUNCTIONS.get_interface = get_interface
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS.get_interface


def windows(hf: Path, ctx: int, chunks: int):
    import torch
    from transformers import AutoTokenizer
    text = "\n\n".join(p.read_text() for p in sorted((_REPO / "docs").glob("*.md")))
    ids = AutoTokenizer.from_pretrained(hf)(text, add_special_tokens=False)["input_ids"]
    return [torch.tensor([ids[i * ctx:(i + 1) * ctx]]) for i in range(chunks)]


def mean_kld(model, wins, layers, parts, cache_type, ref, attn_rot=True) -> float:
    import torch
    tot = n = 0.0
    with torch.no_grad(), quantized_attention(layers, parts, cache_type, attn_rot):
        for w, lp in zip(wins, ref):
            lq = torch.log_softmax(model(input_ids=w).logits[0].double(), -1)
            h = lp.shape[0] // 2            # the second half of each window, as llama.cpp's perplexity scores
            tot += float((lp[h:].exp() * (lp[h:] - lq[h:])).sum(-1).sum())
            n += lp.shape[0] - h
    return tot / n


def main(argv=None) -> int:
    import torch
    import transformers
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", required=True, help="NAME=HF_DIR,...")
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="only all layers Q+K and layer 0 alone")
    ap.add_argument("--no-attn-rot", dest="attn_rot", action="store_false",
                    help="without llama.cpp's Hadamard rotation of Q and K (LLAMA_ATTN_ROT_DISABLE=1)")
    a = ap.parse_args(argv)
    for item in a.models.split(","):
        name, path = item.split("=", 1)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                                  dtype=torch.float32).eval()
        wins = windows(Path(path), a.ctx, a.chunks)
        with torch.no_grad():
            ref = [torch.log_softmax(model(input_ids=w).logits[0].double(), -1) for w in wins]
        every = set(range(model.config.num_hidden_layers))
        row = {"Q+K": mean_kld(model, wins, every, "qk", a.type, ref, a.attn_rot)}
        if not a.quick:
            row.update({"K only": mean_kld(model, wins, every, "k", a.type, ref, a.attn_rot),
                        "Q only": mean_kld(model, wins, every, "q", a.type, ref, a.attn_rot)})
        row.update({f"layer {i}": mean_kld(model, wins, {i}, "qk", a.type, ref, a.attn_rot)
                    for i in (sorted(every) if not a.quick else [0])})
        print(f"{name:<12} {a.type} " + "  ".join(f"{k} {v:.5f}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
