"""llama.cpp's own sources from the llama-cpp-python source distribution, downloaded once per fixture cache.

The sdist of the installed llama-cpp-python version (``pip download --no-binary :all:``) vendors
llama.cpp; the tests need these parts of it:

* ``models/ggml-vocab-*.gguf{,.inp,.out}``: tokenizer test vectors (tests/test_tokenizer_vectors.py);
* ``convert_hf_to_gguf.py`` + its ``conversion/`` package + ``gguf-py/``: the reference HF -> GGUF
  converter (tests/test_llamacpp_converter.py), run with *its own* gguf-py, not the installed one;
* ``src/llama-vocab.cpp``: llama.cpp's pre-tokenizer table (tests/test_tokenizer_table.py);
* ``tools/mtmd/clip.cpp``, ``clip-impl.h`` and ``models/*.cpp``: the mmproj (CLIP-arch GGUF) graphs, whose
  position encodings the registry's ``CLIP_PROJECTORS`` rows are checked against (tests/test_mmproj.py).

The sdist itself is kept in the shared fixture cache (``$CKPT_SURGEON_FIXTURE_CACHE/llamacpp-src/sdist/``), as
the tiny models are, so the 77 MB download happens once per cache: a second run, or a new subset of files
extracted from it, needs no network.  The subset is extracted beside it
(``llamacpp-src/llama-cpp-python-<version>-v3/llama.cpp``), built atomically by :func:`tiny_cache.cached_build`.

The download is made once per test session, before any test runs (``tests/conftest.py``'s
``pytest_sessionstart`` calls :func:`prefetch` when a selected file needs the sources): without network and
with an empty cache the run stops there with one line saying what to run (:func:`missing_line`).

    python tests/llamacpp_src.py        # download the sdist into the fixture cache now (what that line says)
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
if str(_TESTS.parent) not in sys.path:      # run as a script
    sys.path.insert(0, str(_TESTS.parent))

from ckpt_surgeon import tiny_cache  # noqa: E402
from ckpt_surgeon.conversion.derived.source import extract_vendor  # noqa: E402
from fixtures.build_fixtures import fixture_base  # noqa: E402

# Paths under vendor/llama.cpp/ that are extracted (prefixes).
_KEEP = ("models/ggml-vocab-", "convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "src/llama-vocab.cpp",
         "tools/mtmd/clip.cpp", "tools/mtmd/clip-impl.h", "tools/mtmd/models/")


class SourcesMissing(Exception):
    """The sdist is not in the fixture cache and pip could not download it: ``str()`` is the one line to show."""


def _version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def sdist_dir() -> Path:
    return fixture_base() / "llamacpp-src" / "sdist"


def sdist_path(version: str | None = None) -> Path:
    """Where the sdist of ``version`` (default: the installed one) lives in the fixture cache."""
    return sdist_dir() / f"llama_cpp_python-{version or _version()}.tar.gz"


def _pip_download(version: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            f"llama-cpp-python=={version}", "-d", str(dest)]


def missing_line(version: str, why: str) -> str:
    """The one line a run without the sources stops with."""
    return (f"llama.cpp's sources (the llama-cpp-python {version} sdist, 77 MB) are not in the fixture cache "
            f"{sdist_dir()} and pip could not download them ({why}): run `python tests/llamacpp_src.py` on a machine "
            f"with network (or put llama_cpp_python-{version}.tar.gz there)")


def ensure_sdist() -> Path:
    """The cached sdist of the installed version; downloaded with pip first when absent (atomically: into a
    temp folder beside it, renamed into place).  Raises :class:`SourcesMissing` when pip cannot get it."""
    version = _version()
    final = sdist_path(version)
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".download-") as tmp:
        r = subprocess.run(_pip_download(version, Path(tmp)), capture_output=True, text=True)
        got = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if r.returncode != 0 or not got:
            last = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
            why = re.sub(r"\s+", " ", last[-1])[:200] if last else f"pip exited {r.returncode}"
            raise SourcesMissing(missing_line(version, why))
        os.replace(got[0], final)
    return final


def _extract(dest: Path) -> None:
    import pytest
    try:
        sdist = ensure_sdist()
    except SourcesMissing as e:
        pytest.fail(str(e), pytrace=False)
    out = dest / "llama.cpp"
    extract_vendor(sdist, out, _KEEP)
    if not (out / "convert_hf_to_gguf.py").is_file() or not (out / "models").is_dir() \
            or not (out / "src" / "llama-vocab.cpp").is_file() or not (out / "tools" / "mtmd" / "clip.cpp").is_file():
        pytest.fail(f"{sdist.name} has no vendor/llama.cpp/convert_hf_to_gguf.py, models/, src/llama-vocab.cpp or "
                    "tools/mtmd/clip.cpp", pytrace=False)


def llamacpp_source() -> Path:
    """The extracted ``vendor/llama.cpp`` subset of the installed llama-cpp-python's sdist."""
    final = fixture_base() / "llamacpp-src" / f"llama-cpp-python-{_version()}-v3"    # v2: + llama-vocab.cpp, v3: + mtmd
    return tiny_cache.cached_build(final, _extract) / "llama.cpp"


def _users() -> set[str]:
    """The test files that need the sources: those naming :func:`llamacpp_source`, and those importing a helper
    module of tests/ that names it (read from the files, not listed by hand)."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in _TESTS.glob("*.py") if p.name != Path(__file__).name}
    helpers = {n[:-3] for n, t in texts.items() if not n.startswith("test_") and "llamacpp_source" in t}
    return {n for n, t in texts.items() if n.startswith("test_") and (
        "llamacpp_source" in t or any(re.search(rf"\b(from|import) {h}\b", t) for h in helpers))}


def needed_by(args) -> bool:
    """Whether the pytest arguments ``args`` (files, folders, ``file::test`` ids; none = every test) select a
    file that needs the sources."""
    users = _users()
    paths = [a.split("::")[0] for a in args if not a.startswith("-")] or [str(_TESTS)]
    for a in paths:
        p = Path(a)
        if p.is_dir() and p.resolve() in (_TESTS, *_TESTS.parents):
            return bool(users)
        if p.name in users and p.resolve().parent == _TESTS:
            return True
    return False


def prefetch(args) -> str | None:
    """Download the sdist once, before any test runs, when the selected files need it -> None, or the one
    line to stop the run with."""
    if importlib.util.find_spec("llama_cpp") is None or not needed_by(args):
        return None
    try:
        ensure_sdist()
    except SourcesMissing as e:
        return str(e)
    return None


if __name__ == "__main__":
    try:
        print(ensure_sdist())
    except SourcesMissing as e:
        raise SystemExit(f"error: {e}")
