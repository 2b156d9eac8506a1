"""The derivation engine: architectures outside the registry, read from transformers itself.

:mod:`.derived` builds a layout for a ``model_type`` the registry lacks (the derived record, its
cache, the towers) from the module tree transformers builds on the meta device (:mod:`.modtree`)
and from float64 probes (:mod:`.probe`) on a shrunken random instance (the smaller config:
:mod:`.shrink`; the seeded float64 model and its trial edits: :mod:`.instance`), fed by :mod:`.feeds`
under the float64 guards of :mod:`.float64`; :mod:`.renames` is transformers' own renaming of checkpoint
keys at load.  torch and transformers are imported only inside functions of these modules, and
only for architectures the registry does not know.
"""
