"""Lazy public names for package ``__init__`` modules (PEP 562).

``import ckpt_surgeon`` must stay cheap (no torch, transformers, pandas), yet ``ckpt_surgeon.verify``
should *be* :func:`ckpt_surgeon.verification.core.verify`, with its real signature and docstring,
not a wrapper restating it.  A package lists ``name -> submodule`` and gets a module
``__getattr__`` that imports the submodule on first access and caches the object in the
package's namespace (later accesses are plain attribute reads).
"""
from __future__ import annotations

import importlib


def lazy_exports(module_globals: dict, table: dict[str, str]):
    """-> ``(__getattr__, __dir__)`` for the package whose globals are ``module_globals``.

    ``table`` maps each public name to the module (relative to the package, e.g. ``".core"``)
    that defines an object of the same name."""
    package = module_globals["__name__"]

    def __getattr__(name: str):
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        obj = getattr(importlib.import_module(where, package), name)
        module_globals[name] = obj
        return obj

    def __dir__():
        return sorted(set(module_globals) | set(table))

    return __getattr__, __dir__
