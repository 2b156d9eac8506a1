"""Surgery: pure tensor ops (:mod:`.ops`), plans and their execution (:mod:`.plan`), planners
for ``fold-bias`` (:mod:`.fold`) and ``qkv fuse|split`` (:mod:`.qkv`).

Heavy modules are not imported here; the API functions import what they need.
"""
from __future__ import annotations

__all__ = ["fold_bias", "qkv_fuse", "qkv_split"]

from .._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(globals(), {"fold_bias": ".fold", "qkv_fuse": ".qkv", "qkv_split": ".qkv"})
