"""The standard Hugging Face cache layout (issue 11): ``snapshots/<commit>/`` whose files are
symlinks into ``../../blobs/``, as ``hf download`` without ``--local-dir`` and
``snapshot_download()`` store every model.  Every command reads it; outputs hold real files.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from ckpt_surgeon import open_checkpoint
from ckpt_surgeon.cli import cli

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def to_hf_cache(src: Path, cache: Path, repo_id: str = "org/tiny", *, shards: int = 0) -> Path:
    """Lay ``src`` out as huggingface_hub's cache does and return the snapshot folder.

    Every file becomes ``blobs/<sha256>`` and ``snapshots/<commit>/<name>`` is a *relative*
    symlink to it (huggingface_hub ``file_download._create_symlink``); ``refs/main`` names the
    commit.  ``shards=N`` first re-splits a single ``model.safetensors`` into N shards + index.
    """
    files = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    if shards:
        tensors = load_file(str(src / "model.safetensors"))
        del files["model.safetensors"]
        names = sorted(tensors)
        weight_map, tmp = {}, cache / "_tmp"
        tmp.mkdir(parents=True)
        for i in range(shards):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::shards]}
            save_file(part, str(tmp / fn), metadata={"format": "pt"})
            files[fn] = (tmp / fn).read_bytes()
            weight_map.update({n: fn for n in part})
        files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
        shutil.rmtree(tmp)
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        os.symlink(f"../../blobs/{sha}", snap / name)
    return snap


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def gpt2_cache(tiny, tmp_path_factory) -> Path:
    return to_hf_cache(tiny("gpt2"), tmp_path_factory.mktemp("hfcache"), shards=3)


@pytest.fixture(scope="module")
def qwen2_cache(tiny, tmp_path_factory) -> Path:
    return to_hf_cache(tiny("qwen2_sharded"), tmp_path_factory.mktemp("hfcache"))


def test_layout_is_the_real_one(qwen2_cache):
    shards = sorted(qwen2_cache.glob("*.safetensors"))
    assert len(shards) > 1 and all(p.is_symlink() for p in shards)
    # every link climbs out of the snapshot folder into blobs/: what the old check refused
    assert all(os.readlink(p).startswith("../../blobs/") for p in shards)


@pytest.mark.parametrize("fixture", ["gpt2_cache", "qwen2_cache"])
def test_inspect_and_analyze(fixture, request, tiny):
    snap = request.getfixturevalue(fixture)
    src = tiny("gpt2" if fixture == "gpt2_cache" else "qwen2_sharded")
    ck, ref = open_checkpoint(snap), open_checkpoint(src)
    assert set(ck.tensors) == set(ref.tensors)
    for name in ck.tensors:
        np.testing.assert_array_equal(ck.read(name), ref.read(name))
    for cmd in ("inspect", "analyze"):
        r = run(cmd, snap, "--format", "json")
        assert r.exit_code == 0, r.output
        rep = json.loads(r.stdout)
        want = json.loads(run(cmd, src, "--format", "json").stdout)
        assert rep["layers"] == want["layers"] and len(rep["layers"]) == 2


def test_fold_bias_writes_real_files_and_verify_passes(gpt2_cache, tmp_path):
    out = tmp_path / "folded"
    r = run("fold-bias", gpt2_cache, "-o", out, "--k", "--v")
    assert r.exit_code == 0, r.output
    written = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in written and "config.json" in written
    assert not any(p.is_symlink() for p in out.iterdir())   # the output owns its bytes
    ck, src = open_checkpoint(out), open_checkpoint(gpt2_cache)
    n = ck.config["n_embd"]
    biases = sorted(t for t in ck.tensors if t.endswith("attn.c_attn.bias"))
    assert len(biases) == 2
    for name in biases:   # GPT-2 c_attn bias is [q; k; v]: k and v parts folded to exact zeros
        before, after = src.read(name), ck.read(name)
        assert np.abs(before[n:]).min() > 0 and not after[n:].any()
        np.testing.assert_array_equal(after[:n], before[:n])
    # the cache is untouched: links still point into blobs/
    assert all(p.is_symlink() for p in gpt2_cache.glob("*.safetensors"))
    v = run("verify", gpt2_cache, out, "--max-new-tokens", "4")
    assert v.exit_code == 0, v.output


def test_convert_and_verify_sharded_qwen2(qwen2_cache, tiny, tmp_path):
    gguf = tmp_path / "q.gguf"
    r = run("convert", qwen2_cache, "-o", gguf)
    assert r.exit_code == 0, r.output
    ref = tmp_path / "ref.gguf"
    # same general.name as the snapshot gets from its repo folder (models--org--tiny), not its sha
    assert run("convert", tiny("qwen2_sharded"), "-o", ref, "--name", "tiny").exit_code == 0
    assert gguf.read_bytes() == ref.read_bytes()
    v = run("verify", tiny("qwen2_sharded"), qwen2_cache, "--max-new-tokens", "4")
    assert v.exit_code == 0, v.output


# --- a Hub id whose files are in the local cache is read from there, as transformers does ------

@pytest.fixture
def hub_env(tmp_path, monkeypatch, gpt2_cache):
    """HF_HUB_CACHE = the cache holding ``org/tiny`` at COMMIT; a private ckpt-surgeon cache."""
    from huggingface_hub import constants
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(gpt2_cache.parents[2]))
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(tmp_path / "own-cache"))
    monkeypatch.setenv("CKPT_SURGEON_HUB_BACKOFF", "0.01")
    return gpt2_cache


def test_hub_id_offline_reads_the_hf_cache_without_a_request(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens: a request would fail
    ck = open_checkpoint("org/tiny")
    assert ck.source == str(hub_env) and ck.requests == 0 and ck.format == "safetensors"
    assert any("read from the local Hugging Face cache" in w for w in ck.warnings)
    r = run("inspect", "org/tiny", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["layers"] == json.loads(run("inspect", hub_env, "--format", "json").stdout)["layers"]


def test_hub_id_online_one_request_then_local_bytes(hub_env, monkeypatch):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hubserver import HubServer
    with HubServer(idle_timeout=60) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        srv.add_repo("org/tiny", {p.name: p.read_bytes() for p in hub_env.iterdir()}, sha=COMMIT)
        ck = open_checkpoint("org/tiny")
        # one request resolves the revision (main may have moved); the bytes come from disk
        assert srv.repo_requests == 1 and ck.source == str(hub_env)
        assert not any(r.path.startswith("/cdn/") for r in srv.log)
        # a newer commit on the Hub is not in the local cache: read remotely, by ranges
        files = {p.name: p.read_bytes() for p in hub_env.iterdir()}
        newer = srv.add_repo("org/tiny", files, sha="f" * 40)
        srv.reset_stats()
        ck2 = open_checkpoint("org/tiny")
        assert newer != COMMIT and ck2.format == "hub-safetensors" and ck2.requests > 0
        assert any(r.path.startswith("/cdn/") for r in srv.log)


def test_incomplete_snapshot_is_not_used(hub_env, monkeypatch, tmp_path):
    # a filtered or interrupted download (one shard missing) falls through to the remote path,
    # which, offline, says so in one line
    cache = tmp_path / "partial"
    shutil.copytree(hub_env.parents[2], cache, symlinks=True)
    snap = cache / hub_env.relative_to(hub_env.parents[2])
    next(snap.glob("model-00002-*.safetensors")).unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = run("inspect", "org/tiny")
    assert r.exit_code == 2 and "HF_HUB_OFFLINE=1" in r.output and len(r.output.strip().splitlines()) == 1
