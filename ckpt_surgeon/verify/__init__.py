"""``verify``: run a reference and a candidate model on the same prompts and judge the difference.

``ckpt_surgeon.verify(reference, candidate, **opts) -> VerifyReport``.  This package is itself
callable: ``import ckpt_surgeon.verify`` makes the attribute ``ckpt_surgeon.verify`` this module
(Python's import system sets a parent package's attribute to the submodule), so the module
forwards calls to :func:`ckpt_surgeon.verify.core.verify` and both spellings keep working.

Importing this package is cheap: torch and transformers are imported by ``verify()`` only.
"""
from __future__ import annotations

import sys
import types

from .kinds import KINDS, ModelKind, model_kind
from .prompts import default_prompts, load_prompts
from .report import Metrics, PromptResult, VerifyReport
from .thresholds import DEFAULT_THRESHOLDS, Thresholds, thresholds_for

__all__ = ["verify", "VerifyReport", "PromptResult", "Metrics", "Thresholds", "DEFAULT_THRESHOLDS",
           "thresholds_for", "default_prompts", "load_prompts", "KINDS", "ModelKind", "model_kind"]


def verify(reference, candidate, **opts) -> VerifyReport:
    """See :func:`ckpt_surgeon.verify.core.verify`."""
    from .core import verify as _verify
    return _verify(reference, candidate, **opts)


class _CallableModule(types.ModuleType):
    def __call__(self, reference, candidate, **opts) -> VerifyReport:
        return verify(reference, candidate, **opts)


sys.modules[__name__].__class__ = _CallableModule
