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
at once, and a build can be killed half-way.  Each build goes into a :class:`publish.Staging`
folder beside the destination (locked while its builder lives, so a killed build's temp is swept
by the next build of the same model) and is renamed into place: a folder at the final path is
always complete.  The loser of a race throws its copy away and uses the winner's (identical)
one, as huggingface_hub's download path writes ``.incomplete`` and then renames.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from .errors import OutputExistsError
from .publish import Staging
from .userdirs import user_cache

ENV_VAR = "CKPT_SURGEON_FIXTURE_CACHE"


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
    """``final`` if it exists, else ``build(tmp)`` into a staging folder beside it, published with
    one rename: a folder at ``final`` is always complete, and the loser of a race between processes
    throws its copy away and uses the winner's (identical) one."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with Staging(final, folder=True) as staged:
        build(staged.path)
        try:
            staged.publish(replace=False)
        except (OutputExistsError, OSError):
            if not final.is_dir():      # another process finished first: use theirs
                raise
    return final
