"""Where ckpt-surgeon keeps per-user caches (derived architecture facts, tiny models).

``$XDG_CACHE_HOME`` else ``~/.cache``, as huggingface_hub and most Linux tools resolve it;
each cache also has its own environment override, read at call time.
"""
from __future__ import annotations

import os
from pathlib import Path


def xdg_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))


def user_cache(sub: str, env_var: str) -> Path:
    """``$env_var`` when set, else ``<xdg cache>/ckpt-surgeon/<sub>``."""
    own = os.environ.get(env_var)
    return Path(own) if own else xdg_cache() / "ckpt-surgeon" / sub
