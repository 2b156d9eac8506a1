"""Tiny checkpoints (:mod:`ckpt_surgeon.tiny`) built once and cached on disk, from the installed package.

``tiny_path("qwen2_long")`` returns a ready folder, building it on first use.  Layout::

    <base>/<transformers version>/<name>-<spec hash>/

``base``: the argument, else ``$CKPT_SURGEON_FIXTURE_CACHE``, else
``$XDG_CACHE_HOME/ckpt-surgeon/tiny`` (``~/.cache/ckpt-surgeon/tiny``).  The test suite's
``fixtures/`` package uses the same code with ``<repo>/.fixture-cache`` as its default base;
the notebook and any user of a pip-installed ckpt-surgeon use the one here.

Why keyed this way: the bytes a build writes depend on the spec row, the seed and the builder
(all in :func:`ckpt_surgeon.tiny.spec_fingerprint`) *and* on transformers' own init and
serialization, so a transformers upgrade gets fresh folders instead of silently reusing old
ones.

Why atomic: several processes (pytest workers, a notebook kernel) may ask for the same model
at once, and a build can be killed half-way.  Each build goes into a private temp dir beside
the destination and is moved into place with one ``os.replace``: a folder at the final path is
always complete.  The loser of a race throws its copy away and uses the winner's (identical)
one, as huggingface_hub's download path writes ``.incomplete`` and then renames.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import time
from pathlib import Path

from .userdirs import user_cache

ENV_VAR = "CKPT_SURGEON_FIXTURE_CACHE"
# Temp build dirs older than this are from killed builds and are swept on the next build.
_STALE_TMP_S = 3600.0


def default_base() -> Path:
    return user_cache("tiny", ENV_VAR)


def cache_root(base: str | os.PathLike | None = None) -> Path:
    """Root of the cache for the installed transformers version."""
    return Path(base if base is not None else default_base()) / importlib.metadata.version("transformers")


def tiny_path(name: str, *, seed: int = 0, base: str | os.PathLike | None = None) -> Path:
    """Folder of the tiny model ``name``, built on first use and cached on disk.

    Safe to call concurrently from several processes; never returns a half-written folder.
    """
    from .tiny import build_tiny, spec_fingerprint

    final = cache_root(base) / f"{name}-{spec_fingerprint(name, seed=seed)}"
    return cached_build(final, lambda tmp: build_tiny(name, tmp, seed=seed))


def cached_build(final: Path, build) -> Path:
    """``final`` if it exists, else ``build(tmp)`` into a private temp dir beside it, moved into
    place with one ``os.replace``: a folder at ``final`` is always complete, and the loser of a
    race between processes throws its copy away and uses the winner's (identical) one."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_tmp(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache is shared, keep it readable
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished first (replacing a non-empty dir fails): use theirs.
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _sweep_stale_tmp(parent: Path) -> None:
    now = time.time()
    for entry in parent.glob(".tmp-*"):
        try:
            if now - entry.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass  # swept by a concurrent process
