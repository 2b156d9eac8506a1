"""The record a conversion returns (and ``convert --format json`` prints)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TensorRecord:
    """One converted tensor: where it came from, where it went, what was done to it."""

    source: str          # name in the input file
    target: str          # name in the output
    transform: str       # none | perm_q | perm_k | conv1d | norm_shift (quantized->dense: dequantize | cast)
    source_dtype: str    # safetensors dtype or GGUF type name
    target_dtype: str
    shape: tuple         # output shape, numpy order

    def to_dict(self) -> dict:
        return dict(asdict(self), shape=list(self.shape))


@dataclass(frozen=True)
class ConvertReport:
    """What ``convert`` wrote: the direction, the engine, every tensor's source, target and transform."""

    direction: str                      # hf->gguf | gguf->hf | gguf->gguf | quantized->dense
    source: str
    output: str
    arch: str                           # GGUF architecture
    model_type: str                     # HF model_type
    dtype: str                          # requested output dtype
    n_tensors: int
    bytes_written: int
    seconds: float
    tied_embeddings: bool
    tokenizer: str | None               # gpt2 | llama (vocabulary kind) or None when absent
    tensors: tuple = ()                 # TensorRecord per tensor
    warnings: tuple = ()
    config: dict = field(default_factory=dict)   # hyper-parameters written (GGUF keys or config.json)
    files: tuple = ()                   # a split GGUF output: every part, in order (output is the first)
    engine: str = "native"              # native (the registry) | "derived: llama.cpp <Class> ..." (conversion/derived)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = [t.to_dict() for t in self.tensors]
        d["warnings"] = list(self.warnings)
        d["files"] = list(self.files)
        return d

    def rows(self) -> list[dict]:
        return [t.to_dict() for t in self.tensors]

    def summary_items(self) -> list[tuple[str, str]]:
        arch = f"{self.arch} (HF {self.model_type})" if self.model_type else str(self.arch)
        items = [("direction", self.direction), ("source", self.source), ("output", self.output),
                 ("architecture", arch), ("conversion", self.engine), ("dtype", self.dtype),
                 ("tensors", str(self.n_tensors)), ("bytes written", f"{self.bytes_written:,}"),
                 ("tied embeddings", "yes" if self.tied_embeddings else "no"),
                 ("tokenizer", self.tokenizer or "-"), ("seconds", f"{self.seconds:.2f}")]
        if len(self.files) > 1:
            items.insert(3, ("split", f"{len(self.files)} parts, {self.files[0]} ... {self.files[-1]}"))
        kinds = {}
        for t in self.tensors:
            kinds[t.target_dtype] = kinds.get(t.target_dtype, 0) + 1
        if len(kinds) > 2 or any(k not in ("F32", "F16", "BF16", "Q8_0") for k in kinds):
            # a quantized file's mixture: which types llama.cpp's rules gave how many tensors
            items.insert(5, ("tensor types", ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))))
        return items

    @property
    def notes(self) -> tuple:
        return ()

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows())
