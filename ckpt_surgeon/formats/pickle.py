"""Pickle checkpoints (``pytorch_model.bin``), only behind ``--allow-pickle``.

Even then we load with ``torch.load(weights_only=True)``, which refuses any
pickle opcode that would construct arbitrary objects (PyTorch's restricted
unpickler), and ``mmap=True`` so tensors are paged in lazily.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..records import TensorInfo

_TORCH_TO_ST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


class _PickleReader:
    def __init__(self, state: dict):
        self.state = state
        self.bytes_read = 0

    def read(self, info: TensorInfo) -> np.ndarray:
        t = self.state[info.name]
        self.bytes_read += info.nbytes
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.detach().cpu().numpy()

    def read_bytes(self, info: TensorInfo) -> bytes:
        t = self.state[info.name].contiguous()
        return t.view(-1).view(__import__("torch").uint8).numpy().tobytes()


def open_pickle(path: Path, config, config_path):
    import torch

    from ..checkpoint import Checkpoint
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # the restricted unpickler raises UnpicklingError / RuntimeError
        raise FormatError(f"torch.load(weights_only=True) refused or failed: {str(e).splitlines()[0]}", path=str(path)) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise FormatError(f"holds a {type(state).__name__}, not a state dict of tensors", path=str(path))
    tensors = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            continue
        dt = _TORCH_TO_ST.get(str(t.dtype).replace("torch.", ""), str(t.dtype))
        nbytes = t.numel() * t.element_size()
        tensors[name] = TensorInfo(name, dt, tuple(t.shape), str(path), 0, nbytes)
    reader = _PickleReader(state)
    return Checkpoint(str(path), "pickle", config, config_path, tensors, files=(str(path),),
                      _readers={str(path): reader})
