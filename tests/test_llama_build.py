"""The llama.cpp build check (issue 36 item 1): a build that would crash on this CPU is named in one
line before any decode, from llama.cpp's own feature list and the CPU's flags."""
from __future__ import annotations

import pytest

from ckpt_surgeon.errors import UnsupportedError
from ckpt_surgeon.verification import llama_build as B

# llama_print_system_info of the portable build the README installs, and of a native build on an AMX CPU
PORTABLE = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
NATIVE_AMX = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
              "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | ")
EPYC = "processor\t: 0\nflags\t\t: fpu sse2 pni ssse3 fma avx f16c avx2 bmi2\n"
SAPPHIRE = EPYC.replace("bmi2", "bmi2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16 amx_int8")


def test_portable_build_is_accepted_on_an_avx2_cpu():
    assert B.build_problem(PORTABLE, EPYC) is None


def test_a_build_for_instructions_the_cpu_lacks_is_named(monkeypatch):
    monkeypatch.setenv("CKPT_SURGEON_ALLOW_AMX", "1")
    msg = B.build_problem(NATIVE_AMX, EPYC)
    assert msg is not None and "AVX512" in msg and "AMX_INT8" in msg and "which this CPU lacks" in msg
    assert B.PORTABLE_CMAKE_ARGS in msg and "\n" not in msg


def test_amx_build_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv("CKPT_SURGEON_ALLOW_AMX", raising=False)
    msg = B.build_problem(NATIVE_AMX, SAPPHIRE)
    assert msg is not None and "AMX" in msg and "CKPT_SURGEON_ALLOW_AMX=1" in msg
    monkeypatch.setenv("CKPT_SURGEON_ALLOW_AMX", "1")
    assert B.build_problem(NATIVE_AMX, SAPPHIRE) is None


def test_no_matmul_needs_no_amx_check(monkeypatch):
    """A vocabulary-only model (verify's tokenizer section) never reaches the AMX matmul kernels; an
    instruction the CPU lacks is still refused."""
    monkeypatch.delenv("CKPT_SURGEON_ALLOW_AMX", raising=False)
    assert B.build_problem(NATIVE_AMX, SAPPHIRE, matmul=False) is None
    assert "which this CPU lacks" in B.build_problem(NATIVE_AMX, EPYC, matmul=False)


def test_no_cpuinfo_checks_amx_only(monkeypatch):
    monkeypatch.delenv("CKPT_SURGEON_ALLOW_AMX", raising=False)
    assert B.build_problem(PORTABLE, "") is None
    assert "AMX" in B.build_problem(NATIVE_AMX, "")


def test_the_installed_build_is_safe_here():
    """The suite's own llama.cpp: the README's install command builds it portable."""
    assert B.build_problem() is None


def test_open_llama_refuses_a_crashing_build_before_loading(monkeypatch, tmp_path):
    from ckpt_surgeon.verification import corpus
    monkeypatch.setattr(B, "build_problem", lambda: "llama.cpp was compiled with ggml's AMX kernels")
    with pytest.raises(UnsupportedError, match="AMX kernels"):
        corpus.open_llama(str(tmp_path / "absent.gguf"), ctx=8, kv_cache="f16")


def test_the_readme_and_ci_run_the_same_install_command():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    ci = (root / ".ci" / "run").read_text()
    readme = (root / "README.md").read_text()
    cmd = next(line for line in ci.splitlines() if line.startswith("pip install torch=="))
    assert cmd in readme.splitlines()
    assert B.PORTABLE_CMAKE_ARGS in cmd
