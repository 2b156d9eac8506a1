"""The Hub's settings, read from the environment on every call.

huggingface_hub's module constants are read once, at import, so ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, ``HF_HOME`` and ``HF_HUB_DOWNLOAD_TIMEOUT`` are read here instead, each time a
repo is opened; ``CKPT_SURGEON_CACHE``, ``CKPT_SURGEON_HUB_RETRIES`` and
``CKPT_SURGEON_HUB_BACKOFF`` are ours.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ...progress import progress_enabled
from . import hf_cache

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def _is_true(v: str | None) -> bool:
    return (v or "").strip().upper() in {"1", "ON", "YES", "TRUE"}   # huggingface_hub.constants._is_true


def cache_root() -> Path:
    """Where fetched ranges are kept: ``$CKPT_SURGEON_CACHE``, else ``$HF_HOME/ckpt-surgeon``.

    ``HF_HOME`` is resolved as huggingface_hub does (:func:`hf_cache.hf_home`).  We do not write
    inside ``HF_HUB_CACHE`` itself: ``hf cache scan`` reports every folder there that is
    not a complete-file repo cache as corrupted, and ours holds partial files.
    """
    own = os.environ.get("CKPT_SURGEON_CACHE")
    if own:
        return Path(os.path.expandvars(os.path.expanduser(own)))
    return hf_cache.hf_home() / "ckpt-surgeon"


@dataclass(frozen=True)
class HubSettings:
    """Environment read at call time (huggingface_hub reads its constants once, at import)."""

    endpoint: str
    offline: bool
    cache: Path
    retries: int
    backoff: float
    timeout: float
    progress: bool

    @classmethod
    def from_env(cls, progress: bool | None = None) -> "HubSettings":
        from huggingface_hub import constants
        endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        # The environment now, or huggingface_hub's import-time flag (its session refuses requests then).
        offline = (_is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
                   or bool(constants.HF_HUB_OFFLINE))
        return cls(endpoint=endpoint, offline=offline, cache=cache_root(),
                   retries=int(os.environ.get("CKPT_SURGEON_HUB_RETRIES", "5")),
                   backoff=float(os.environ.get("CKPT_SURGEON_HUB_BACKOFF", "1.0")),
                   timeout=float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10),
                   progress=progress_enabled(progress))

    @property
    def endpoint_shown(self) -> str:
        """The endpoint without any ``user:password@`` part, for messages."""
        u = urlsplit(self.endpoint)
        host = u.hostname or ""
        if u.port:
            host = f"{host}:{u.port}"
        return f"{u.scheme}://{host}{u.path}" if u.scheme else self.endpoint
