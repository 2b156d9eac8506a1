"""Is the installed llama.cpp (llama-cpp-python) build safe to run on this CPU?

llama-cpp-python compiles llama.cpp at install, by default for the build machine's own CPU
(``-march=native``).  Two ways that goes wrong were met here, and both crash the process
(SIGILL / SIGSEGV) rather than raise, so they are checked before the first decode:

* a build compiled for instructions this CPU lacks (a wheel built on another machine, or reused
  from pip's wheel cache after a move to an older CPU);
* a build with ggml's AMX matmul (``ggml_backend_amx_mul_mat``), compiled in when the build CPU
  advertises AMX, which segfaulted on every quantized decode on this workplace's virtual machines
  (seen 2026-11-26).  ``CKPT_SURGEON_ALLOW_AMX=1`` accepts such a build where it is known to work.

The compiled features are what ``llama_print_system_info`` lists: ggml's CPU backend reports each
``ggml_cpu_has_*`` flag, and those are compile-time tests (``ggml-cpu/ggml-cpu.c``).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["PORTABLE_CMAKE_ARGS", "build_problem", "compiled_features", "cpu_flags"]

# The portable x86-64 build the README's install command uses (AVX2 baseline, no AMX).
PORTABLE_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON "
                       "-DGGML_F16C=ON -DGGML_BMI2=ON")
_REBUILD = (f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --no-cache-dir --force-reinstall '
            "--no-deps llama-cpp-python")

# llama.cpp's feature name -> the flag Linux lists in /proc/cpuinfo for the same instructions.
_X86_FLAGS = {"SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma",
              "BMI2": "bmi2", "AVX_VNNI": "avx_vnni", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
              "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8"}


def compiled_features(system_info: str) -> set[str]:
    """The features a ``llama_print_system_info`` string says the build was compiled with."""
    return {name for name, value in re.findall(r"([A-Z0-9_]+) = (\S+)", system_info) if value != "0"}


def cpu_flags(cpuinfo: str) -> set[str] | None:
    """The x86 flags of ``/proc/cpuinfo``'s first ``flags`` line, or None where there is none."""
    m = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return set(m.group(1).split()) if m else None


def build_problem(system_info: str | None = None, cpuinfo: str | None = None, *, matmul: bool = True) -> str | None:
    """One line saying why this llama.cpp build would crash here, or None when it is safe.

    Both inputs default to this machine's (llama-cpp-python's system info, ``/proc/cpuinfo``);
    passing them checks another machine's description.  ``matmul=False``: for a caller that runs
    no matrix multiplication (a vocabulary-only model), where the AMX kernels are never reached."""
    if system_info is None:
        import llama_cpp
        system_info = llama_cpp.llama_print_system_info().decode(errors="replace")
    if cpuinfo is None:
        p = Path("/proc/cpuinfo")
        cpuinfo = p.read_text(errors="replace") if p.is_file() else ""
    built = compiled_features(system_info)
    flags = cpu_flags(cpuinfo)
    if flags is not None:
        lacking = sorted(f for f in built if f in _X86_FLAGS and _X86_FLAGS[f] not in flags)
        if lacking:
            return (f"llama.cpp (llama-cpp-python) was compiled for {', '.join(lacking)}, which this CPU lacks, "
                    f"and would crash; rebuild it for this machine: {_REBUILD}")
    if matmul and "AMX_INT8" in built and os.environ.get("CKPT_SURGEON_ALLOW_AMX", "") not in ("1", "true", "yes"):
        return ("llama.cpp (llama-cpp-python) was compiled with ggml's AMX kernels, which segfault in "
                f"ggml_backend_amx_mul_mat on some machines; rebuild it portable: {_REBUILD} "
                "(or set CKPT_SURGEON_ALLOW_AMX=1 where AMX is known to work)")
    return None
