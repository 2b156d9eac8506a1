"""transformers kept quiet while the library uses it (the CLI owns stderr).

A base-layer module: ``arch`` (derived layouts, probes), ``conversion`` and ``tiny`` build
transformers models too, and must not import :mod:`ckpt_surgeon.runtime` (which sits above them)
for this.  transformers is imported inside the function, so importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers for the duration; the previous state is restored.

    Library code never prints (the CLI owns stderr): transformers' info logs and its
    "Loading weights" / "Writing model shards" bars are turned off, so callers that want them
    elsewhere keep them.
    """
    import transformers
    tlog = transformers.utils.logging
    bars, verbosity = tlog.is_progress_bar_enabled(), tlog.get_verbosity()
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    try:
        yield
    finally:
        tlog.set_verbosity(verbosity)
        if bars:
            tlog.enable_progress_bar()
