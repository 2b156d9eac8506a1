"""Surgery: pure tensor ops (:mod:`.ops`), plans and their execution (:mod:`.plan`), planners
for ``fold-bias`` (:mod:`.fold`) and ``qkv fuse|split`` (:mod:`.qkv`).

Heavy modules are not imported here; the API functions import what they need.
"""
from __future__ import annotations

__all__ = ["fold_bias", "qkv_fuse", "qkv_split"]


def fold_bias(source, out, **kw):
    """See :func:`ckpt_surgeon.surgery.fold.fold_bias`."""
    from .fold import fold_bias as _f
    return _f(source, out, **kw)


def qkv_fuse(source, out, **kw):
    """See :func:`ckpt_surgeon.surgery.qkv.qkv_fuse`."""
    from .qkv import qkv_fuse as _f
    return _f(source, out, **kw)


def qkv_split(source, out, **kw):
    """See :func:`ckpt_surgeon.surgery.qkv.qkv_split`."""
    from .qkv import qkv_split as _f
    return _f(source, out, **kw)
