"""What every verify run shares around its models, whatever it compares (prompts, a corpus):
a scratch folder removed at the end, no autograd, quiet transformers logging, IEEE float32
matmuls; and the environment line of its report."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from ..errors import SourceNotFoundError
from ..runtime import quiet_transformers


@contextlib.contextmanager
def scratch(tmp_dir, prefix: str):
    """``(work folder, torch)`` for the run: a temporary folder in ``tmp_dir`` (an existing folder;
    default: the system temp dir) removed at the end, under ``torch.no_grad``, quiet transformers
    logging and :func:`ieee_float32`."""
    check_tmp_dir(tmp_dir)
    import torch
    with tempfile.TemporaryDirectory(prefix=prefix, dir=tmp_dir) as work_s, \
            torch.no_grad(), quiet_transformers(), ieee_float32(torch), idle_core_threads(torch):
        yield Path(work_s), torch


@contextlib.contextmanager
def idle_core_threads(torch):
    """torch's intra-op threads cut to the idle cores for the run (``default_threads``: ``CKPT_SURGEON_THREADS``,
    else the usable CPUs minus the load), restored afterwards; a caller's ``OMP_NUM_THREADS`` is kept.
    Why: torch's OpenMP workers spin while they wait for each other, so on a busy machine every op with a thread
    more than the free cores waits out a scheduler slice (measured on the 2-core machine at load 4-6: the tour's
    GGUF pair 264 s with 2 threads, 84 s with 1; issue 50 item 7)."""
    from ..formats.quant.dequant import default_threads
    before = torch.get_num_threads()
    n = before if os.environ.get("OMP_NUM_THREADS") else min(before, default_threads())
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_tmp_dir(tmp_dir) -> None:
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise SourceNotFoundError("--tmp-dir is not an existing directory", path=str(tmp_dir))


@contextlib.contextmanager
def ieee_float32(torch):
    """float32 matmuls in full float32 for the run, restored afterwards.  A process that enabled
    TF32 (``torch.set_float32_matmul_precision("high")``, common in training scripts) would make
    CUDA float32 logits ~1e-3 relative noisy (TF32 keeps 10 mantissa bits) and fail the float32
    thresholds for no fault of the candidate."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def environment(dev: str, torch) -> dict:
    import transformers
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
           "threads": torch.get_num_threads()}
    if dev == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    return env
