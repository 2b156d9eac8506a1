"""Pickle checkpoints (``pytorch_model.bin``), only behind ``--allow-pickle``.

Even then we load with ``torch.load(weights_only=True)``, which refuses any
pickle opcode that would construct arbitrary objects (PyTorch's restricted
unpickler), and ``mmap=True`` so tensors are paged in lazily.

:class:`TorchTensors` reads any name -> ``torch.Tensor`` mapping through the reader protocol:
the state dict a pickle holds, or the parameters of a loaded model (measured ``analyze``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..records import TensorInfo
from .safetensors import TORCH_TO_ST
from .source import SourceBase



class TorchTensors(SourceBase):
    """Tensors held by torch (imported by whoever made them), listed under the one file label
    ``path``.  ``read`` gives each tensor in its own dtype (BF16 widened to float32), or every
    one in float64 with ``float64=True``."""

    def __init__(self, state: dict, path: str, *, float64: bool = False):
        import torch

        self.state = state
        self.path = path
        self.float64 = float64
        self.bytes_read = 0
        self.tensors = {}
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                continue
            dt = TORCH_TO_ST.get(str(t.dtype).replace("torch.", ""), str(t.dtype))
            self.tensors[name] = TensorInfo(name, dt, tuple(t.shape), path, 0, t.numel() * t.element_size())

    @property
    def files(self) -> tuple[str, ...]:
        return (self.path,)

    def _tensor(self, info: TensorInfo):
        """The tensor ``info`` names, or the part of it ``info``'s byte range covers (whole rows,
        from :meth:`Checkpoint.read_rows`)."""
        t = self.state[info.name].detach()
        whole = self.tensors[info.name]
        if (info.start, info.end) == (whole.start, whole.end):
            return t
        size = t.element_size()
        return t.reshape(-1)[(info.start - whole.start) // size:(info.end - whole.start) // size].reshape(info.shape)

    def read(self, info: TensorInfo) -> np.ndarray:
        t = self._tensor(info)
        self.bytes_read += info.nbytes
        if self.float64:
            import torch
            return t.to("cpu", torch.float64).numpy()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.cpu().numpy()

    def read_bytes(self, info: TensorInfo) -> bytes:
        import torch
        return self._tensor(info).contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()


def open_pickle(path: Path) -> TorchTensors:
    """The state dict of a pickle checkpoint (``torch.load(weights_only=True)``)."""
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # the restricted unpickler raises UnpicklingError / RuntimeError
        raise FormatError(f"torch.load(weights_only=True) refused or failed: {str(e).splitlines()[0]}", path=str(path)) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise FormatError(f"holds a {type(state).__name__}, not a state dict of tensors", path=str(path))
    return TorchTensors(state, str(path))
