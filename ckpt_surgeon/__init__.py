"""ckpt-surgeon: look inside LLM checkpoints and operate on them safely.

The Python API mirrors the CLI; heavy modules (torch, transformers, pandas) are
imported only by the functions that need them, so ``import ckpt_surgeon`` is cheap.
"""
from __future__ import annotations

from .version import __version__

__all__ = ["analyze", "convert", "fold_bias", "gguf_to_hf", "hf_to_gguf", "inspect", "open_checkpoint", "qkv_fuse",
           "qkv_split", "verify", "__version__"]
__all__ += ["diff", "lint", "kv_equalize", "tokenizer"]

from ._lazy import lazy_exports

# Each public function is the implementation itself, imported on first use (heavy modules stay
# unimported until then); the CLI command of the same name is its twin.
__getattr__, __dir__ = lazy_exports(globals(), {
    "inspect": ".analysis.inspect",          # ckpt-surgeon inspect
    "analyze": ".analysis.api",              # ckpt-surgeon analyze (static, and measured with measure=True)
    "open_checkpoint": ".checkpoint",        # any source, headers only
    "verify": ".verification.core",          # ckpt-surgeon verify
    "convert": ".conversion",                # ckpt-surgeon convert (direction from the source)
    "gguf_to_hf": ".conversion.from_gguf",
    "hf_to_gguf": ".conversion.to_gguf",
    "fold_bias": ".surgery.fold",            # ckpt-surgeon fold-bias
    "qkv_fuse": ".surgery.qkv",              # ckpt-surgeon qkv fuse
    "qkv_split": ".surgery.qkv",             # ckpt-surgeon qkv split
    "diff": ".analysis.diff",                # ckpt-surgeon diff
    "lint": ".analysis.lint",                # ckpt-surgeon lint
    "kv_equalize": ".surgery.kv_equalize",   # ckpt-surgeon kv-equalize
    "tokenizer": ".analysis.tokenizer.record",   # inspect's tokenizer section, diff's tokenizer comparison
})
