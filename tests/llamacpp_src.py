"""llama.cpp's own sources from the llama-cpp-python source distribution, fetched once.

The sdist of the installed llama-cpp-python version (``pip download --no-binary :all:``) vendors
llama.cpp; the tests need three parts of it:

* ``models/ggml-vocab-*.gguf{,.inp,.out}``: tokenizer test vectors (tests/test_tokenizer_vectors.py);
* ``convert_hf_to_gguf.py`` + its ``conversion/`` package + ``gguf-py/``: the reference HF -> GGUF
  converter (tests/test_llamacpp_converter.py), run with *its own* gguf-py, not the installed one;
* ``src/llama-vocab.cpp``: llama.cpp's pre-tokenizer table (tests/test_tokenizer_table.py);
* ``tools/mtmd/clip.cpp``, ``clip-impl.h`` and ``models/*.cpp``: the mmproj (CLIP-arch GGUF) graphs, whose
  position encodings the registry's ``CLIP_PROJECTORS`` rows are checked against (tests/test_mmproj.py).

They are extracted into the shared fixture cache (``$CKPT_SURGEON_FIXTURE_CACHE/llamacpp-src/
llama-cpp-python-<version>/llama.cpp``), built atomically by :func:`tiny_cache.cached_build`, so
the 77 MB download happens once per machine and version.
"""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_surgeon import tiny_cache
from ckpt_surgeon.conversion.derived.source import extract_vendor
from fixtures.build_fixtures import fixture_base

# Paths under vendor/llama.cpp/ that are extracted (prefixes).
_KEEP = ("models/ggml-vocab-", "convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "src/llama-vocab.cpp",
         "tools/mtmd/clip.cpp", "tools/mtmd/clip-impl.h", "tools/mtmd/models/")


def _extract(dest: Path) -> None:
    version = importlib.metadata.version("llama-cpp-python")
    sdist_dir = dest / "sdist"
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={version}", "-d", str(sdist_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sdists = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if r.returncode != 0 or not sdists:
        pytest.fail(f"cannot download llama.cpp's sources (the llama-cpp-python sdist): `{' '.join(cmd)}` failed "
                    f"(rc {r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")
    out = dest / "llama.cpp"
    extract_vendor(sdists[0], out, _KEEP)
    for sd in sdists:
        sd.unlink()
    sdist_dir.rmdir()
    if not (out / "convert_hf_to_gguf.py").is_file() or not (out / "models").is_dir() \
            or not (out / "src" / "llama-vocab.cpp").is_file() or not (out / "tools" / "mtmd" / "clip.cpp").is_file():
        pytest.fail(f"{sdists[0].name} has no vendor/llama.cpp/convert_hf_to_gguf.py, models/, src/llama-vocab.cpp or "
                    "tools/mtmd/clip.cpp")


def llamacpp_source() -> Path:
    """The extracted ``vendor/llama.cpp`` subset of the installed llama-cpp-python's sdist."""
    version = importlib.metadata.version("llama-cpp-python")
    final = fixture_base() / "llamacpp-src" / f"llama-cpp-python-{version}-v3"    # v2: + llama-vocab.cpp, v3: + mtmd
    return tiny_cache.cached_build(final, _extract) / "llama.cpp"
