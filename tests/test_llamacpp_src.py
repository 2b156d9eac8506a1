"""Issue 50 item 2: llama.cpp's sources (the llama-cpp-python sdist the tests read llamacpp_source() from) are kept
in the fixture cache, so a second run needs no network; offline with an empty cache the run stops before any test
with one line saying what to run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import llamacpp_src

REPO = Path(__file__).resolve().parent.parent


_OFFLINE = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None}


def _offline(env: dict, cache: Path, links: Path) -> dict:
    """pip with no index and an empty find-links folder: nothing can be downloaded."""
    env = dict(env, CKPT_SURGEON_FIXTURE_CACHE=str(cache), PIP_FIND_LINKS=str(links))
    for k, v in _OFFLINE.items():
        env.pop(k, None) if v is None else env.__setitem__(k, v)
    return env


def test_the_cached_sdist_extracts_without_network(tmp_path, monkeypatch):
    real = llamacpp_src.sdist_path()
    assert real.is_file()          # this session's prefetch kept it in the fixture cache
    llamacpp_src.llamacpp_source()
    for k, v in _offline({}, tmp_path / "cache", tmp_path).items():
        monkeypatch.setenv(k, v)
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(k, raising=False)
    cached = llamacpp_src.sdist_path()
    cached.parent.mkdir(parents=True)
    cached.symlink_to(real)        # a second run's cache: the sdist, nothing extracted yet
    root = llamacpp_src.llamacpp_source()      # no pip call can succeed here
    assert root.is_relative_to(tmp_path / "cache")
    assert (root / "convert_hf_to_gguf.py").is_file() and (root / "src" / "llama-vocab.cpp").is_file()
    assert llamacpp_src.ensure_sdist() == cached


def test_offline_with_an_empty_cache_stops_the_run_with_one_line(tmp_path):
    env = _offline(dict(os.environ, PYTHONPATH=str(REPO)), tmp_path / "cache", tmp_path)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",     # two workers, as CI
                        str(REPO / "tests" / "test_tokenizer_vectors.py")], capture_output=True, text=True, env=env,
                       cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    version = llamacpp_src._version()
    lines = [ln for ln in out.splitlines() if "llama.cpp's sources" in ln]
    assert len(lines) == 1, out
    assert f"the llama-cpp-python {version} sdist, 77 MB) are not in the fixture cache {tmp_path / 'cache'}" in lines[0]
    assert "run `python tests/llamacpp_src.py` on a machine with network" in lines[0]
    assert " passed" not in out and " failed" not in out and "[gw" not in out     # stopped before any worker
    assert not list((tmp_path / "cache").rglob("*.tar.gz"))
    # the script that line names says the same, in one line, exit 1
    s = subprocess.run([sys.executable, str(REPO / "tests" / "llamacpp_src.py")], capture_output=True, text=True,
                       env=env)
    assert s.returncode == 1 and s.stderr.count("\n") == 1 and "llama.cpp's sources" in s.stderr, s.stderr
