"""GGUF tensor names, derived from gguf-py's own tables (never typed by hand).

gguf-py (llama.cpp's ``gguf-py/gguf``) holds the names llama.cpp reads: ``constants.py``
``MODEL_ARCH`` / ``MODEL_TENSORS`` (which tensors each architecture has) / ``TENSOR_NAMES``
(``blk.{bid}.attn_q`` ...), and ``tensor_mapping.py`` ``TensorNameMap`` (the HF spellings each
GGUF tensor is converted from, per architecture).  The registry
(:mod:`ckpt_surgeon.arch.families`) states HF module names; this module turns them into GGUF
names.

Only gguf-py's two table modules are read (:func:`_tables`), and only when a GGUF name is
needed: ``import gguf`` runs its package ``__init__`` (writer, quantizers, reader, yaml metadata:
about 100 ms beyond numpy), which reading a GGUF header here never needs.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types

from . import families as F

_TABLES_PACKAGE = "ckpt_surgeon._gguf_py_tables"


@functools.lru_cache(maxsize=None)
def _tables():
    """gguf-py's ``constants`` and ``tensor_mapping`` modules.

    If gguf is imported already, its own modules.  Otherwise the two files (pure Python: enums,
    dicts and the TensorNameMap class; ``constants.py`` imports only ``enum``/``typing`` and
    ``tensor_mapping.py`` only ``.constants``) are loaded from the installed gguf package under
    a private package name, so that its ``__init__`` does not run."""
    if "gguf" in sys.modules:
        return importlib.import_module("gguf.constants"), importlib.import_module("gguf.tensor_mapping")
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("gguf (gguf-py) is not installed; it names the GGUF tensors")
    pkg = sys.modules.get(_TABLES_PACKAGE)
    if pkg is None:
        pkg = types.ModuleType(_TABLES_PACKAGE)
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules[_TABLES_PACKAGE] = pkg
    return (importlib.import_module(_TABLES_PACKAGE + ".constants"),
            importlib.import_module(_TABLES_PACKAGE + ".tensor_mapping"))

# Role -> gguf-py MODEL_TENSOR member: one naming for every architecture.
GGUF_ROLE_TENSORS = {"q": "ATTN_Q", "k": "ATTN_K", "v": "ATTN_V", "qkv": "ATTN_QKV", "o": "ATTN_OUT",
                     "q_norm": "ATTN_Q_NORM", "k_norm": "ATTN_K_NORM", "sinks": "ATTN_SINKS",
                     "attn_norm": "ATTN_NORM"}
GGUF_LAYER = F.GGUF_LAYER

# Where HF checkpoints put the layer stack (GPT-2/BLOOM/Falcon "transformer.", Llama-style "model.",
# GPT-NeoX "gpt_neox.", BertModel "encoder."), tried in order when asking TensorNameMap for a
# registry module (the registry's role paths are relative to the layer prefix).
HF_PREFIXES = ("model.", "transformer.", "gpt_neox.", "encoder.", "bert.encoder.", "")


@functools.lru_cache(maxsize=None)
def gguf_roles() -> dict:
    """Role -> GGUF module name under :data:`GGUF_LAYER` (``"k"`` -> ``"attn_k"``), from ``TENSOR_NAMES``."""
    c, _ = _tables()
    out = {}
    block = GGUF_LAYER.replace("{L}", "{bid}")
    for role, member in GGUF_ROLE_TENSORS.items():
        name = c.TENSOR_NAMES[c.MODEL_TENSOR[member]]
        if not name.startswith(block):   # a gguf-py that moved its block names would break every reader
            raise RuntimeError(f"gguf-py names {member} {name!r}, outside {block!r}")
        out[role] = name[len(block):]
    return out


@functools.lru_cache(maxsize=None)
def gguf_attention_archs() -> tuple:
    """gguf-py ``MODEL_ARCH`` names whose tensors include attn_q + attn_k + attn_v or attn_qkv:
    the architectures whose GGUF files :func:`ckpt_surgeon.arch.resolve.resolve` places by role."""
    c, _ = _tables()
    sep = {c.MODEL_TENSOR.ATTN_Q, c.MODEL_TENSOR.ATTN_K, c.MODEL_TENSOR.ATTN_V}
    out = []
    for arch, name in c.MODEL_ARCH_NAMES.items():
        tensors = set(c.MODEL_TENSORS.get(arch, ()))
        if sep <= tensors or c.MODEL_TENSOR.ATTN_QKV in tensors:
            out.append(name)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _name_map(gguf_arch: str):
    """gguf-py's TensorNameMap for ``gguf_arch`` (2 blocks), or None for an arch gguf-py lacks."""
    c, tm = _tables()
    arch = next((k for k, v in c.MODEL_ARCH_NAMES.items() if v == gguf_arch), None)
    return None if arch is None else tm.get_tensor_name_map(arch, 2)


def gguf_tensor_name(gguf_arch: str, hf_template: str) -> str | None:
    """The GGUF name template gguf-py's ``TensorNameMap`` gives an HF tensor template of
    ``gguf_arch`` (``model.layers.{L}.self_attn.q_proj.weight`` -> ``blk.{L}.attn_q.weight``),
    or None when gguf-py does not know the name.  An expert template (``...experts.{E}.up_proj``)
    is named as the stacked tensor llama.cpp's converter maps (``...experts.up_proj``).  A name
    gguf-py lists only without its ``transformer.`` prefix is found too (llama.cpp's
    ``BloomModel.modify_tensors`` strips it: ``word_embeddings_layernorm``)."""
    c, _ = _tables()
    hf_template = hf_template.replace(".{E}", "")
    tmap = _name_map(gguf_arch)
    if tmap is None:
        return None
    # Block 1 of a 2-block map: a name with the layer index in it maps through the block table.
    hit = None
    for cand in (hf_template, hf_template.removeprefix("transformer.")):
        hit = hit or tmap.get_type_and_name(cand.replace("{L}", "1"), try_suffixes=(".weight", ".bias"))
    if hit is None:
        return None
    ttype, name = hit
    base = c.TENSOR_NAMES[ttype]
    concrete = base.format(bid=1)
    if not name.startswith(concrete):
        return None
    return base.replace("{bid}", "{L}") + name[len(concrete):]


def module_gguf_name(gguf_arch: str, layer: str, module: str) -> str | None:
    """GGUF module name (under ``blk.{L}.``) of a registry module path, or None if gguf-py has none."""
    for prefix in HF_PREFIXES:
        got = gguf_tensor_name(gguf_arch, f"{prefix}{layer}{module}.weight")
        if got is not None and got.startswith(GGUF_LAYER) and got.endswith(".weight"):
            return got[len(GGUF_LAYER):-len(".weight")]
    return None


def family_gguf_roles(fam: F.Family | None) -> dict:
    """Role -> GGUF module name(s) for a family's GGUF files.

    What gguf-py's TensorNameMap calls the family's own modules, alternatives kept in the
    family's order of preference (Falcon-40B's attention input ``ln_attn`` is ``attn_norm_2``;
    its ``attn_norm`` is ``ln_mlp``); roles gguf-py has no name for (and the `qkv split` / `qkv
    fuse` outputs) keep the generic name of :func:`gguf_roles`."""
    if fam is None or not fam.gguf_archs:
        return dict(gguf_roles())
    return dict(_family_gguf_roles(fam.name))


@functools.lru_cache(maxsize=None)
def _family_gguf_roles(name: str) -> tuple:
    fam = F.by_name(name)
    generic = gguf_roles()
    arch = fam.gguf_archs[0]
    out = {}
    for role, gname in generic.items():
        mods = fam.roles.get(role)
        if mods is None or role in fam.surgery_roles:
            out[role] = gname
            continue
        names = [module_gguf_name(arch, fam.layer, m) for m in ((mods,) if isinstance(mods, str) else mods)]
        names = tuple(dict.fromkeys(n for n in names if n))
        out[role] = gname if not names else names[0] if len(names) == 1 else names
    return tuple(out.items())


# Tensors llama.cpp's converter always stores F32, whatever --outtype (conversion/base.py
# ``ModelBase.prepare_tensors``: "Some tensor types are always in float32", matching
# ``llama_model_quantize_internal``): MoE routers, learned positions, token types.
F32_TENSORS = ("FFN_GATE_INP", "FFN_GATE_INP_SHEXP", "POS_EMBD", "TOKEN_TYPES")


@functools.lru_cache(maxsize=None)
def f32_tensor_templates() -> tuple:
    """GGUF name templates (``{L}`` for the layer) of :data:`F32_TENSORS`, from ``TENSOR_NAMES``."""
    c, _ = _tables()
    return tuple(c.TENSOR_NAMES[c.MODEL_TENSOR[m]].replace("{bid}", "{L}") + ".weight" for m in F32_TENSORS)
