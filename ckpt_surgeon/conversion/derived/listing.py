"""Which path ``convert`` takes for an HF folder, and the table of every architecture name.

* **native**: the folder's ``model_type`` is in the registry (:mod:`ckpt_surgeon.conversion.names`):
  our own plan, both directions, faster than llama.cpp's converter (docs/convert.md).
* **derived**: llama.cpp's converter registers the folder's ``architectures[0]`` as a text model:
  its class plans, we execute (:mod:`.run`); HF -> GGUF only.
* **unsupported**: neither (a class transformers knows that llama.cpp's converter has not, or one
  llama.cpp registers only for its ``--mmproj`` projector files).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ENGINES", "engine_for", "engine_of_config", "architecture_table", "ArchitectureRow"]

ENGINES = ("auto", "native", "llama.cpp")


def engine_for(folder: Path, engine: str = "auto") -> str:
    """``native`` or ``derived`` for the HF folder (``engine``: ``auto`` picks native when the
    registry has the model_type; ``native`` / ``llama.cpp`` force one)."""
    from ...formats.safe_input import read_json
    if engine == "llama.cpp":
        return "derived"
    if engine == "native":
        return "native"
    cfg = folder / "config.json"
    if not cfg.is_file():
        return "native"               # the native path says what is missing
    return engine_of_config(read_json(cfg))


def engine_of_config(cfg: dict) -> str:
    """``native`` when the registry has the config's ``model_type``, else ``derived`` (llama.cpp's class decides)."""
    from ..names import by_model_type
    return "native" if by_model_type(cfg.get("model_type")) is not None else "derived"


@dataclass(frozen=True)
class ArchitectureRow:
    architecture: str        # HF class name (config.json "architectures")
    model_type: str          # transformers' model_type for it ("" when transformers has no such class)
    engine: str              # native | derived | unsupported
    llamacpp_module: str     # llama.cpp's conversion/<module>.py ("" when none)
    note: str

    def to_dict(self) -> dict:
        return asdict(self)


def _transformers_classes() -> dict[str, str]:
    """HF class name -> model_type for transformers' causal-LM and base-model classes."""
    from transformers.models.auto import modeling_auto as ma
    out: dict[str, str] = {}
    for table in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                  ma.MODEL_MAPPING_NAMES):
        for model_type, cls in table.items():
            for c in (cls if isinstance(cls, (list, tuple)) else (cls,)):
                out.setdefault(c, model_type)
    return out


def _row(arch: str, model_type: str, text: dict, mmproj: dict) -> ArchitectureRow:
    from ..names import by_model_type
    module = text.get(arch) or mmproj.get(arch, "")
    if model_type and by_model_type(model_type) is not None:
        return ArchitectureRow(arch, model_type, "native", module, "registry; both directions")
    if arch in text:
        return ArchitectureRow(arch, model_type, "derived", module, "llama.cpp's class plans; HF -> GGUF")
    if arch in mmproj:
        return ArchitectureRow(arch, model_type, "unsupported", module, "llama.cpp converts only its mmproj file")
    return ArchitectureRow(arch, model_type, "unsupported", "", "llama.cpp's converter has no class")


def architecture_table(*, causal_only: bool = True) -> list[ArchitectureRow]:
    """Every architecture name llama.cpp's converter registers, plus transformers' causal-LM
    classes it does not (``causal_only``: of transformers' classes, only ``*ForCausalLM`` ones)."""
    from .source import architecture_maps, converter_root
    text, mmproj = architecture_maps(converter_root())
    known = _transformers_classes()
    names = set(text) | set(mmproj)
    names |= {c for c in known if not causal_only or c.endswith("ForCausalLM")}
    rows = [_row(a, known.get(a, ""), text, mmproj) for a in sorted(names)]
    order = {"native": 0, "derived": 1, "unsupported": 2}
    return sorted(rows, key=lambda r: (order[r.engine], r.architecture))
