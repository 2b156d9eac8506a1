"""HF -> GGUF of a model transformers has no class for, checked as the class that computes it.

InternLM2's checkpoints run only with ``trust_remote_code`` (``modeling_internlm2``); llama.cpp's
internlm2 graph, and this tool's GGUF -> HF direction, run them as ``LlamaForCausalLM``.  The
registry says so (``Conversion.hf_equivalent``: the model type and the config keys renamed), and
the converter then asks transformers about that model instead: its config (defaults filled in),
its tokenizer (from the folder's ``tokenizer.model``) and its tensors, which are mapped to the
checkpoint's own names through the GGUF architecture's two conversions (the equivalent's HF names
-> GGUF names -> this layout's HF names; the parts of a split tensor join into one shape).  Nothing
here runs remote code.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from . import names as N
from .splits import joined_shape

__all__ = ["equivalent_folder", "equivalent_shapes"]

# Files of the tokenizer carried into the equivalent's folder (tokenizer_config.json rewritten).
_TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "special_tokens_map.json", "added_tokens.json")
# Keys that name the remote code: dropped, so that transformers picks its own class for model_type.
_REMOTE_KEYS = ("auto_map", "architectures", "tokenizer_class")


def equivalent_config(raw: dict, spec: N.ArchSpec) -> dict:
    """``raw`` (config.json as written) as the equivalent model type's config."""
    model_type, renames = spec.hf_equivalent
    cfg = {k: v for k, v in raw.items() if k not in _REMOTE_KEYS and k not in renames}
    for src, dst in renames.items():
        if src in raw:
            cfg[dst] = raw[src]
    cfg["model_type"] = model_type
    return cfg


@contextmanager
def equivalent_folder(folder: Path, raw: dict, spec: N.ArchSpec):
    """A temporary folder holding the equivalent's config.json and the tokenizer files (nothing
    of ``folder`` is modified; the weights are not needed to answer the questions)."""
    with tempfile.TemporaryDirectory(prefix="ckpt-surgeon-equivalent-") as tmp:
        tmp = Path(tmp)
        (tmp / "config.json").write_text(json.dumps(equivalent_config(raw, spec)))
        for name in _TOKENIZER_FILES:
            if (folder / name).is_file():
                try:
                    os.symlink(os.path.abspath(folder / name), tmp / name)
                except OSError:
                    shutil.copy(folder / name, tmp / name)
        tc = folder / "tokenizer_config.json"
        if tc.is_file():
            try:
                data = json.loads(tc.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict):
                (tmp / "tokenizer_config.json").write_text(
                    json.dumps({k: v for k, v in data.items() if k not in _REMOTE_KEYS}))
        yield tmp


def equivalent_shapes(shapes: dict, spec: N.ArchSpec) -> dict:
    """The equivalent model's tensor shapes, named as ``spec``'s HF checkpoint names them."""
    fwd = N.hf_to_gguf_names(N.by_gguf_arch(spec.gguf_arch))
    back = N.gguf_to_hf_names(spec)
    out: dict = {}
    parts: dict = {}
    for name, shape in shapes.items():
        hit = fwd.match(name)
        own = back.match(hit[0]) if hit is not None else None
        if own is None:          # no counterpart: kept as is, so the check names it as missing
            out[name] = tuple(shape)
            continue
        hname, rule = own
        if rule.split:
            parts.setdefault(hname, (rule, {}))[1][back.part(hit[0])] = tuple(shape)
        else:
            out[hname] = tuple(shape)
    for hname, (rule, got) in parts.items():
        if len(got) == len(rule.parts):
            out[hname] = joined_shape(rule.split, [got[i] for i in range(len(rule.parts))])
        else:                    # a part missing from the equivalent: not this layout
            out.update({f"{hname} (part {i})": s for i, s in got.items()})
    return out
