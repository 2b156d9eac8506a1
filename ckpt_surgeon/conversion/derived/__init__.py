"""HF -> GGUF for architectures outside the native registry, derived from llama.cpp's converter.

- :func:`derived_hf_to_gguf_report` ``(src, out, dtype, force, name=..., imatrix=...)``: llama.cpp's
  own converter class for the folder's architecture plans the file (names, transforms, types,
  key-values); our reader, quantizer and writer do the work (:mod:`.child`, :mod:`.run`).
- :func:`architecture_table`: every HF architecture name, native / derived / unsupported.
- :func:`engine_for`: which path ``convert`` takes for a folder.

The converter comes from the installed llama-cpp-python's sdist, fetched and cached on first use
(:mod:`.source`).  docs/architecture.md ("convert derived architectures") gives the reasoning.
"""
from __future__ import annotations

from ..._lazy import lazy_exports

__all__ = ["derived_hf_to_gguf_report", "architecture_table", "engine_for", "ENGINES"]

__getattr__, __dir__ = lazy_exports(globals(), {"derived_hf_to_gguf_report": ".run", "architecture_table": ".listing",
                                                "engine_for": ".listing", "ENGINES": ".listing"})
