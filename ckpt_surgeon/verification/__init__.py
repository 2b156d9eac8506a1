"""Verification: run a reference and a candidate model on the same prompts and judge the difference.

The entry point is ``ckpt_surgeon.verify(reference, candidate, options=None, **opts) -> VerifyReport``
(its options one :class:`VerifyOptions` record, or keyword arguments that build it; also
:func:`ckpt_surgeon.verification.verify`, :func:`ckpt_surgeon.verification.core.verify`).  The
package is named ``verification`` rather than ``verify`` so that importing it never rebinds the
top-level function ``ckpt_surgeon.verify`` (Python sets a parent package's attribute to a
submodule of the same name when the submodule is imported).

Importing this package is cheap: torch and transformers are imported by ``verify()`` only.
"""
from __future__ import annotations

from .kinds import KINDS, ModelKind, model_kind
from .options import CorpusOptions, Criteria, Feed, GateLimits, LlamaOptions, Placement, SavedReference, VerifyOptions
from .prompts import default_prompts, load_prompts
from .report import Metrics, PromptResult, VerifyReport
from .thresholds import DEFAULT_THRESHOLDS, Thresholds, thresholds_for

__all__ = ["verify", "VerifyReport", "PromptResult", "Metrics", "Thresholds", "DEFAULT_THRESHOLDS",
           "thresholds_for", "default_prompts", "load_prompts", "KINDS", "ModelKind", "model_kind",
           "VerifyOptions", "CorpusOptions", "Feed", "Placement", "Criteria", "GateLimits", "LlamaOptions",
           "SavedReference"]

from .._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(globals(), {"verify": ".core"})
