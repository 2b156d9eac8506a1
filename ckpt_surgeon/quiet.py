"""One helper to silence transformers while the library loads or saves a model.

Library code never prints (the CLI owns stderr): transformers' info logs and its
"Loading weights" / "Writing model shards" bars are turned off for the duration
and the previous state is restored, so callers that want them elsewhere keep them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
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
