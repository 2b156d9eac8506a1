"""Where llama.cpp's own converter lives on this machine: the llama-cpp-python sdist, cached.

The derived path (:mod:`ckpt_surgeon.conversion.derived`) runs llama.cpp's converter classes
(``convert_hf_to_gguf.py``'s ``conversion/`` package with its own ``gguf-py``) of the *installed*
llama-cpp-python version, so what it derives is what that llama.cpp loads.  Those sources ship
in the sdist on PyPI (``vendor/llama.cpp/``), not in the wheel: the first use downloads it once
with pip (``pip download --no-binary :all: --no-deps llama-cpp-python==<version>``, ~77 MB) and
keeps only the converter (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/gguf/``) under
``$CKPT_SURGEON_LLAMACPP_SRC`` (a folder holding ``convert_hf_to_gguf.py`` is used as it is), else
``<xdg cache>/ckpt-surgeon/llamacpp-src/llama-cpp-python-<version>/llama.cpp``.  Without network
the error is one line saying what to run.
"""
from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ...errors import UnsupportedError

__all__ = ["ENV", "llamacpp_version", "converter_root", "architecture_maps", "extract_vendor"]

ENV = "CKPT_SURGEON_LLAMACPP_SRC"
_VENDOR = "/vendor/llama.cpp/"
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")


def llamacpp_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedError("this architecture converts through llama.cpp's own converter classes, which come "
                               "with llama-cpp-python: pip install 'ckpt-surgeon[llama]'") from None


def _complete(root: Path) -> bool:
    return (root / "convert_hf_to_gguf.py").is_file() and (root / "conversion" / "__init__.py").is_file() \
        and (root / "gguf-py" / "gguf" / "__init__.py").is_file()


def _cache_root(version: str) -> Path:
    from ...userdirs import xdg_cache
    return xdg_cache() / "ckpt-surgeon" / "llamacpp-src" / f"llama-cpp-python-{version}" / "llama.cpp"


def _fetch_cmd(version: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
            f"llama-cpp-python=={version}", "-d", str(dest)]


def extract_vendor(sdist: Path, out: Path, keep: tuple = _KEEP) -> None:
    """The files of the sdist's ``vendor/llama.cpp/`` whose relative path starts with one of ``keep``,
    written under ``out`` (nothing outside it: a ``..`` part is skipped)."""
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            if not m.isfile() or _VENDOR not in m.name:
                continue
            rel = m.name.split(_VENDOR, 1)[1]
            if rel.startswith(keep) and ".." not in rel.split("/"):
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tf.extractfile(m).read())


def _fetch(version: str, final: Path) -> Path:
    """Download the sdist and extract the converter beside ``final``, renamed into place at the end."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        cmd = _fetch_cmd(version, Path(tmp) / "sdist")
        r = subprocess.run(cmd, capture_output=True, text=True)
        sdists = sorted((Path(tmp) / "sdist").glob("llama_cpp_python-*.tar.gz"))
        if r.returncode != 0 or not sdists:
            raise UnsupportedError(
                f"this architecture converts through llama.cpp's own converter (llama-cpp-python {version}'s "
                f"source distribution), which could not be downloaded; on a machine with network run "
                f"`pip download --no-binary :all: --no-deps llama-cpp-python=={version}`, extract it and set "
                f"{ENV} to its vendor/llama.cpp folder")
        staged = Path(tmp) / "llama.cpp"
        extract_vendor(sdists[0], staged)
        if not _complete(staged):
            raise UnsupportedError(f"{sdists[0].name} has no vendor/llama.cpp/convert_hf_to_gguf.py with its "
                                   "conversion/ and gguf-py/ folders")
        try:
            os.replace(staged, final)
        except OSError:          # another process finished first: keep its copy
            if not _complete(final):
                raise
            shutil.rmtree(staged, ignore_errors=True)
    return final


def converter_root(fetch: bool = True) -> Path:
    """The folder holding llama.cpp's ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/``
    (fetched on first use when ``fetch``; None-free: raises with the one-line hint instead)."""
    own = os.environ.get(ENV)
    if own:
        root = Path(own)
        if not _complete(root):
            raise UnsupportedError(f"{ENV}={own} holds no convert_hf_to_gguf.py with its conversion/ and gguf-py/ "
                                   "folders (the vendor/llama.cpp folder of the llama-cpp-python sdist)")
        return root
    version = llamacpp_version()
    root = _cache_root(version)
    if _complete(root):
        return root
    if not fetch:
        raise UnsupportedError(f"llama.cpp's converter for llama-cpp-python {version} is not cached yet "
                               f"(the first conversion that needs it downloads it, or set {ENV})")
    return _fetch(version, root)


def _literal_dict(tree: ast.Module, name: str) -> dict:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return ast.literal_eval(node.value)
    return {}


def architecture_maps(root: Path) -> tuple[dict, dict]:
    """(HF architecture name -> module, for text models; the same for mmproj files), read from
    llama.cpp's ``conversion/__init__.py`` without executing it (the registry is two literal dicts)."""
    tree = ast.parse((root / "conversion" / "__init__.py").read_text(encoding="utf-8"))
    return _literal_dict(tree, "TEXT_MODEL_MAP"), _literal_dict(tree, "MMPROJ_MODEL_MAP")
