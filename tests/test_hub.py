"""Hub repos inspected by HTTP range against a real local server (tests/hubserver.py).

No hub is reachable from the test machine: every test starts ``HubServer`` on 127.0.0.1,
points ``HF_ENDPOINT`` at it and a fresh ``CKPT_SURGEON_CACHE`` at ``tmp_path``, and checks
what went over the wire with the server's own counters.
"""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ckpt_surgeon.analysis.inspect import inspect
from ckpt_surgeon.checkpoint import open_checkpoint
from ckpt_surgeon.cli import cli
from ckpt_surgeon.errors import FormatError, HubError, PickleRefusedError
from ckpt_surgeon.formats.hub import ranges as hubmod
from ckpt_surgeon.formats.safetensors import read_header

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubenv import hub  # noqa: E402,F401  (the local Hub fixture)
from hubserver import HubServer  # noqa: E402

TOKEN = "hf_SENTINELtokenNeverPrintMe0123456789"
# Keys that differ by design between a hub inspect and a local one: where it came from and what it cost, and the
# tokenizer section, which inspect reads from a local folder's files but does not fetch from a Hub folder (headers
# only; diff and ckpt_surgeon.tokenizer() read it: test_tokenizer_findings.py).
SOURCE_KEYS = {"source", "format", "bytes_read", "requests", "file_metadata", "tokenizer", "tokenizer_note"}


def _same_report(a: dict, b: dict) -> None:
    a = {k: v for k, v in a.items() if k not in SOURCE_KEYS}
    b = {k: v for k, v in b.items() if k not in SOURCE_KEYS}
    assert a == b


def _bias_names(folder: Path) -> list:
    with open_checkpoint(folder) as ck:
        layout = ck.layout()
        return [n for lt in layout.layers for n in (lt.qkv_bias, lt.q_bias, lt.k_bias, lt.v_bias) if n]


# ------------------------------------------------------------------ the budget and the report


def test_sharded_repo_same_report_as_local_within_byte_budget(hub, tiny):
    folder = tiny("qwen2_sharded")
    sha = hub.add_repo("owner/tiny", folder)
    rep = inspect("owner/tiny")
    local = inspect(str(folder))
    _same_report(rep.to_dict(), local.to_dict())
    assert rep.format == "hub-safetensors" and rep.source == "owner/tiny"
    assert rep.file_metadata == {"hub_repo": "owner/tiny", "hub_revision": "main", "hub_commit": sha}

    # Our counters are the server's counters.
    assert rep.requests == hub.repo_requests
    assert rep.bytes_read == sum(r.sent for r in hub.log if r.for_repo)

    shards = sorted(folder.glob("*.safetensors"))
    header_bytes = sum(8 + read_header(p).header_len for p in shards)
    with open_checkpoint(folder) as ck:
        needed = sum(ck.tensors[n].nbytes for n in _bias_names(folder))
    json_bytes = (folder / "config.json").stat().st_size + (folder / "model.safetensors.index.json").stat().st_size
    api_bytes = sum(r.sent for r in hub.log if r.path.startswith("/api/models/"))
    total = sum(p.stat().st_size for p in shards)
    overhead = rep.bytes_read - (header_bytes + needed + json_bytes + api_bytes)
    # The only slack is the speculative header range (sized from the index's tensor names, see
    # hub._estimate_header): allow 256 bytes per shard.  Measured: 1,076 bytes over 9 shards.
    assert 0 <= overhead <= 256 * len(shards), (overhead, header_bytes, needed)
    assert rep.bytes_read < 0.05 * total        # 9 KB of a 477 KB checkpoint
    # Requests: 1 revision, 1 config, 1 index, 2 per shard for its header (the Hub's redirect + the CDN),
    # then one per coalesced bias range that the header ranges did not already bring, straight to the
    # CDN URL remembered from the redirect.
    first_range = {}
    for r in hub.log:
        if r.path.startswith("/cdn/"):
            first_range.setdefault(r.path.split("/")[-1].split("?")[0], int(r.range.split("-")[1]) + 1)
    with open_checkpoint(folder) as ck:
        per_file = {}
        for n in _bias_names(folder):
            info = ck.tensors[n]
            if info.end > first_range[Path(info.file).name]:
                per_file.setdefault(info.file, []).append((info.start, info.end))
    bias_requests = sum(len(hubmod.coalesce(v)) for v in per_file.values())
    assert bias_requests >= 1
    assert rep.requests == 3 + 2 * len(shards) + bias_requests
    # No request asked for a whole file.
    assert all(r.range for r in hub.log if "/resolve/" in r.path or r.path.startswith("/cdn/"))


def test_single_file_repo_and_tag_revision(hub, tiny):
    folder = tiny("qwen2")
    hub.add_repo("owner/one", folder, refs=("main", "v1.0"))
    rep = inspect("owner/one", revision="v1.0")
    _same_report(rep.to_dict(), inspect(str(folder)).to_dict())
    assert rep.source == "owner/one@v1.0"
    size = (folder / "model.safetensors").stat().st_size
    assert rep.bytes_read < 0.2 * size         # 64 KB speculative header range + biases of a 529 KB file


def test_coalesce_merges_neighbours_only():
    g = hubmod.MERGE_GAP
    got = hubmod.coalesce([(20 + g, 100 + g), (0, 10), (10, 20), (101 + 2 * g, 200 + 2 * g), (150 + 2 * g, 160 + 2 * g)])
    # touching and a gap of exactly MERGE_GAP merge; a gap of MERGE_GAP + 1 does not; overlaps merge.
    assert got == [(0, 100 + g), (101 + 2 * g, 200 + 2 * g)]
    assert hubmod.coalesce([]) == []


def test_adjacent_tensors_are_fetched_in_one_request(hub, tmp_path):
    """Biases stored next to each other (here q/k/v biases of one layer in a row) cost one request."""
    folder = _synthetic_qwen2(tmp_path / "adj")
    hub.add_repo("owner/adj", folder)
    with open_checkpoint("owner/adj") as ck, open_checkpoint(folder) as local:
        names = [n for n in ck.tensors if n.endswith(".bias")]
        before = ck.requests
        hub.reset_stats()
        ck.prefetch(names)
        assert ck.requests - before == 1
        assert [r.path.startswith("/cdn/") for r in hub.log] == [True]   # straight to the CDN, one ranged GET
        for n in names:
            np.testing.assert_array_equal(ck.read(n), local.read(n))
        assert len(hub.log) == 1                    # reads after the prefetch come from the cache


# ------------------------------------------------------------------ cache and offline


def test_second_run_one_request_full_sha_none_offline_none(hub, tiny, monkeypatch):
    folder = tiny("qwen2_sharded")
    sha = hub.add_repo("owner/tiny", folder, refs=("main", "v1.0"))
    first = inspect("owner/tiny").to_dict()
    hub.reset_stats()
    second = inspect("owner/tiny")
    assert hub.repo_requests == 1 and second.requests == 1      # only the branch -> sha lookup
    assert [r.path for r in hub.log if r.for_repo] == ["/api/models/owner/tiny/revision/main"]
    _same_report(second.to_dict(), first)
    hub.reset_stats()
    by_sha = inspect("owner/tiny", revision=sha)
    assert hub.repo_requests == 0 and by_sha.requests == 0 and by_sha.bytes_read == 0
    _same_report(by_sha.to_dict(), first)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = inspect("owner/tiny")
    assert hub.repo_requests == 0 and offline.requests == 0
    _same_report(offline.to_dict(), first)
    # A revision never resolved online is not in the cache: one clear line.
    with pytest.raises(HubError) as ei:
        inspect("owner/tiny", revision="v1.0")
    cache = os.environ["CKPT_SURGEON_CACHE"]
    # issue 24: both caches read offline are named, not only ours
    assert str(ei.value) == ("owner/tiny@v1.0: this revision is in neither the ckpt-surgeon cache nor the Hugging Face "
                             "cache, and HF_HUB_OFFLINE=1 forbids network access (run once online, or unset "
                             f"HF_HUB_OFFLINE; caches: {cache} (ckpt-surgeon), {os.environ['HF_HUB_CACHE']} "
                             "(Hugging Face))")
    assert hub.repo_requests == 0


def test_offline_with_empty_cache(hub, tiny, monkeypatch):
    hub.add_repo("owner/tiny", tiny("qwen2"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"^owner/tiny@main: this revision is in neither the ckpt-surgeon cache nor "
                                       r"the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids network access"):
        inspect("owner/tiny")
    assert hub.requests == 0


def test_moved_branch_is_fetched_again(hub, tiny):
    hub.add_repo("owner/r", tiny("qwen2"))
    a = inspect("owner/r")
    sha2 = hub.add_repo("owner/r", tiny("qwen2_sharded"))     # main now points at a new commit
    hub.reset_stats()
    b = inspect("owner/r")
    assert b.file_metadata["hub_commit"] == sha2 != a.file_metadata["hub_commit"]
    assert hub.repo_requests > 1
    _same_report(b.to_dict(), inspect(str(tiny("qwen2_sharded"))).to_dict())


def test_cache_layout_is_keyed_by_repo_sha_and_file(hub, tiny, env):
    sha = hub.add_repo("owner/tiny", tiny("qwen2_sharded"))
    inspect("owner/tiny")
    root = env / "cache" / "models--owner--tiny"
    assert (root / "refs" / "main").read_text() == sha
    assert json.loads((root / sha / "files.json").read_text())
    chunks = list((root / sha / "files" / "model-00002-of-00009.safetensors").glob("*.bin"))
    assert chunks and all(re.fullmatch(r"\d+-\d+\.bin", c.name) for c in chunks)


def test_unwritable_cache_still_inspects(hub, tiny, env, monkeypatch):
    (env / "not-a-dir").write_text("x")
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(env / "not-a-dir" / "cache"))   # mkdir fails, even as root
    folder = tiny("qwen2_sharded")
    hub.add_repo("owner/tiny", folder)
    first = inspect("owner/tiny")
    _same_report(first.to_dict(), inspect(str(folder)).to_dict())
    assert inspect("owner/tiny").requests == first.requests       # nothing was cached, nothing broke


def test_any_tensor_reads_like_the_local_file(hub, tiny):
    folder = tiny("qwen2_sharded")
    hub.add_repo("owner/tiny", folder)
    with open_checkpoint("owner/tiny") as ck, open_checkpoint(folder) as local:
        assert ck.tensors.keys() == local.tensors.keys()
        for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
            np.testing.assert_array_equal(ck.read(name), local.read(name))
            assert ck.read_raw(name) == local.read_raw(name)


def test_default_cache_dir_follows_hf_home(monkeypatch, tmp_path):
    monkeypatch.delenv("CKPT_SURGEON_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfh"))
    assert hubmod.cache_root() == tmp_path / "hfh" / "ckpt-surgeon"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hubmod.cache_root() == tmp_path / "xdg" / "huggingface" / "ckpt-surgeon"
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(tmp_path / "own"))
    assert hubmod.cache_root() == tmp_path / "own"


# ------------------------------------------------------------------ errors, one line each


def test_repo_not_found(hub):
    with pytest.raises(HubError) as ei:
        inspect("owner/missing")
    assert str(ei.value) == (f"owner/missing: repository not found on {hub.url} (check the name; a private "
                             "repository also needs a token: set HF_TOKEN or run `hf auth login`)")


def test_private_repo_needs_a_token_and_the_stored_login_is_used(hub, tiny, env, monkeypatch):
    hub.add_repo("owner/private", tiny("qwen2"), private=True, tokens=(TOKEN,))
    with pytest.raises(HubError, match=r"^owner/private: repository not found on "):
        inspect("owner/private")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError) as ei:
        inspect("owner/private")
    assert str(ei.value) == f"owner/private: repository not found on {hub.url}, or your token cannot access it"
    monkeypatch.delenv("HF_TOKEN")
    (env / "hf-home").mkdir()
    (env / "hf-home" / "token").write_text(TOKEN)    # what `hf auth login` stores
    assert inspect("owner/private").layers_with_qkv_bias == 2


def test_gated_repo(hub, tiny, monkeypatch):
    hub.add_repo("owner/gated", tiny("qwen2"), gated=True, tokens=(TOKEN,))
    with pytest.raises(HubError) as ei:
        inspect("owner/gated")
    assert str(ei.value) == (f"owner/gated: is a gated repository and no token was given (accept its conditions at "
                             f"{hub.url}/owner/gated, then set HF_TOKEN or run `hf auth login`)")
    monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
    with pytest.raises(HubError) as ei:
        inspect("owner/gated")
    assert str(ei.value) == ("owner/gated: is a gated repository and your token has not been granted access to it "
                             f"(request access at {hub.url}/owner/gated)")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert inspect("owner/gated").layers_with_qkv_bias == 2


def test_revision_not_found(hub, tiny):
    hub.add_repo("owner/tiny", tiny("qwen2"))
    with pytest.raises(HubError) as ei:
        inspect("owner/tiny", revision="no-such-branch")
    assert str(ei.value) == "owner/tiny: revision 'no-such-branch' not found (give a branch, tag or commit sha that exists)"


def test_file_not_found(hub, tiny):
    folder = tiny("qwen2")
    hub.add_repo("owner/tiny", {"config.json": folder / "config.json", "model.safetensors": folder / "model.safetensors"})
    with pytest.raises(HubError) as ei:
        inspect("owner/tiny", file="model-q4.gguf")
    assert str(ei.value) == ("owner/tiny: file 'model-q4.gguf' not found at revision 'main' "
                             "(files there include: config.json, model.safetensors)")


def test_weight_map_naming_a_missing_shard(hub, tiny, tmp_path):
    folder = tiny("qwen2_sharded")
    files = {p.name: p for p in folder.iterdir()}
    del files["model-00009-of-00009.safetensors"]
    hub.add_repo("owner/broken", files)
    with pytest.raises(FormatError) as ei:
        inspect("owner/broken")
    assert str(ei.value) == ("owner/broken/model.safetensors.index.json: tensor 'model.layers.1.input_layernorm.weight': "
                             "weight_map names shard 'model-00009-of-00009.safetensors', which does not exist at this revision")


def test_server_ignoring_range(hub, tiny):
    folder = tiny("qwen2")
    hub.add_repo("owner/one", folder)
    hub.ignore_range = True
    size = (folder / "model.safetensors").stat().st_size
    with pytest.raises(HubError) as ei:
        inspect("owner/one")
    assert str(ei.value) == (f"owner/one/model.safetensors: the server ignored the HTTP Range request and would send "
                             f"the whole file ({size:,} bytes) (pass --allow-full-download to download it anyway)")
    # Nothing of the refused file was kept.
    assert [p.parent.name for p in Path(os.environ["CKPT_SURGEON_CACHE"]).rglob("full")] == ["config.json"]
    rep = inspect("owner/one", allow_full_download=True)
    _same_report(rep.to_dict(), inspect(str(folder)).to_dict())
    assert rep.bytes_read >= size
    hub.reset_stats()
    assert inspect("owner/one", allow_full_download=True).requests == 1    # the whole file is cached


def test_connection_reset_mid_transfer_is_retried_and_resumed(hub, tiny):
    folder = tiny("qwen2")
    hub.add_repo("owner/one", folder)
    hub.reset_next = 3
    rep = inspect("owner/one")
    _same_report(rep.to_dict(), inspect(str(folder)).to_dict())
    assert hub.reset_next == 0
    # A retry asks only for the bytes still missing: it starts where the reset cut the body.
    data = [r for r in hub.log if r.range and r.status == 206]
    start = lambda r: int(r.range[6:].split("-")[0])  # noqa: E731
    cut = [r for r in data if r.sent < r.length]
    assert len(cut) == 3
    resumed = 0
    for r in cut:   # the retry asks for the rest (the client may have lost the last unread bytes to the RST)
        retry = [q for q in data if start(r) <= start(q) <= start(r) + r.sent and q is not r
                 and start(q) + q.length == start(r) + r.length]
        assert retry, r
        resumed += any(start(q) > start(r) for q in retry)
    assert resumed >= 1
    assert rep.requests == hub.repo_requests


def test_connection_reset_every_time_gives_up_clearly(hub, tiny, monkeypatch):
    hub.add_repo("owner/one", tiny("qwen2"))
    monkeypatch.setenv("CKPT_SURGEON_HUB_RETRIES", "2")
    hub.reset_next = 10_000
    with pytest.raises(HubError) as ei:
        inspect("owner/one")
    assert str(ei.value) == (f"owner/one/config.json: fetching the file from {hub.url} failed 3 time(s): "
                             "the connection was reset or closed mid-transfer (check the network and retry; "
                             "CKPT_SURGEON_HUB_RETRIES sets the number of retries)")


def test_busy_hub_503_is_retried(hub, tiny):
    folder = tiny("qwen2_sharded")
    hub.add_repo("owner/tiny", folder)
    hub.fail_next = 4
    rep = inspect("owner/tiny")
    _same_report(rep.to_dict(), inspect(str(folder)).to_dict())
    assert [r.status for r in hub.log if r.for_repo][:4] == [503] * 4
    assert rep.requests == hub.repo_requests


def test_reset_on_weights_names_the_byte_range(hub, tiny, monkeypatch):
    folder = tiny("qwen2")
    hub.add_repo("owner/one", {"model.safetensors": folder / "model.safetensors"})   # no config: weights first
    monkeypatch.setenv("CKPT_SURGEON_HUB_RETRIES", "1")
    hub.reset_next = 10_000
    with pytest.raises(HubError) as ei:
        open_checkpoint("owner/one")
    assert str(ei.value).startswith(f"owner/one/model.safetensors: fetching bytes 0-65535 from {hub.url} failed "
                                    "2 time(s): the connection was reset or closed mid-transfer")


def test_unreachable_endpoint(env, monkeypatch):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("CKPT_SURGEON_HUB_RETRIES", "1")
    with pytest.raises(HubError) as ei:
        inspect("owner/x")
    # issue 24: nothing ever answered, so no retries (23 s on 6 of them before): offline, or a path typo
    assert str(ei.value) == (f"owner/x@main: resolving the revision from http://127.0.0.1:{port} failed: could not "
                             "connect (offline?); it is not a local file or folder either (check the path, or the "
                             "network; HF_HUB_OFFLINE=1 reads the caches only)")


def test_path_typo_with_a_slash_is_no_such_file_at_once(hub, tiny, tmp_path, monkeypatch):
    """issue 24: `inspect play/qwen2-64x` beside a folder `play` was taken for a Hub id."""
    from ckpt_surgeon.errors import SourceNotFoundError
    monkeypatch.chdir(tmp_path)
    (tmp_path / "play").mkdir()
    hub.add_repo("play/qwen2-64x", tiny("qwen2"))        # even a real repo of that name is not asked
    with pytest.raises(SourceNotFoundError) as ei:
        inspect("play/qwen2-64x")
    assert str(ei.value) == ("play/qwen2-64x: no such file or folder (play/ exists here, so this is read as a local "
                             "path, not a Hub repo id)")
    for given in ("./play/qwen2-64x", str(tmp_path / "nope" / "x")):
        with pytest.raises(SourceNotFoundError, match="no such file or folder"):
            inspect(given)
    assert hub.requests == 0
    res = CliRunner().invoke(cli, ["verify", "play/qwen2-64x", "play/qwen2-64x"])
    assert res.exit_code == 2 and "(play/ exists here, so this is read as a local path" in res.stderr


def _raw_safetensors(header: dict, data: bytes) -> bytes:
    hb = json.dumps(header).encode()
    return struct.pack("<Q", len(hb)) + hb + data


@pytest.mark.parametrize("header, data", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]}}, bytes(24)),        # gap
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "Q9", "shape": [3], "data_offsets": [8, 20]}}, bytes(20)),          # unknown dtype
    ({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}, bytes(8)),        # size mismatch
])
def test_header_validation_messages_match_local_files(hub, tmp_path, header, data):
    raw = _raw_safetensors(header, data)
    local = tmp_path / "bad"
    local.mkdir()
    (local / "model.safetensors").write_bytes(raw)
    with pytest.raises(FormatError) as want:
        open_checkpoint(local)
    hub.add_repo("owner/bad", {"model.safetensors": raw})
    with pytest.raises(FormatError) as got:
        open_checkpoint("owner/bad")
    assert str(got.value) == str(want.value).replace(str(local / "model.safetensors"), "owner/bad/model.safetensors")


def test_header_longer_than_the_speculative_range_takes_a_second_request(hub, tmp_path):
    n = 3000                                       # ~150 KB of header, more than the 64 KB first range
    header = {f"t{i:05d}.bias": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
    raw = _raw_safetensors(header, np.arange(n, dtype=np.float32).tobytes())
    hub.add_repo("owner/long", {"model.safetensors": raw})
    with open_checkpoint("owner/long") as ck:
        assert len(ck.tensors) == n
        assert float(ck.read("t02999.bias")[0]) == 2999.0
    ranges = [r.range for r in hub.log if r.path.startswith("/cdn/")]
    hlen = struct.unpack("<Q", raw[:8])[0]
    assert ranges[:2] == ["bytes=0-65535", f"bytes=65536-{8 + hlen - 1}"]


def test_repo_with_several_ggufs_asks_for_file(hub):
    hub.add_repo("owner/ggufs", {"a-Q4_K_M.gguf": b"GGUF" + bytes(60), "a-Q8_0.gguf": b"GGUF" + bytes(60)})
    with pytest.raises(HubError) as ei:
        inspect("owner/ggufs")
    assert str(ei.value) == ("owner/ggufs@main: repository holds 2 GGUF files (a-Q4_K_M.gguf, a-Q8_0.gguf) "
                             "(pick one with --file)")


def test_pickle_only_repo_is_refused(hub):
    hub.add_repo("owner/pkl", {"config.json": b"{}", "pytorch_model.bin": b"PK\x03\x04" + bytes(60)})
    with pytest.raises(PickleRefusedError) as ei:
        inspect("owner/pkl")
    assert str(ei.value).startswith("owner/pkl@main: holds only pickle weights (pytorch_model.bin)")
    assert hub.repo_requests == 1        # decided from the file list: nothing of the pickle was fetched


# ------------------------------------------------------------------ GGUF repos


def _same_gguf_report(hub_rep, local_rep) -> None:
    _same_report(hub_rep.to_dict(), local_rep.to_dict())
    fm = dict(hub_rep.file_metadata)
    hub_keys = {k: fm.pop(k) for k in ("hub_repo", "hub_revision", "hub_commit")}
    assert hub_keys["hub_revision"] == "main" and re.fullmatch(r"[0-9a-f]{40}", hub_keys["hub_commit"])
    assert fm == local_rep.file_metadata          # the GGUF summary (name, file type, vocab ...) as for the file


def test_gguf_repo_real_model_header_only(hub, smollm_gguf):
    """SmolLM2-135M Q4_1 (98 MB, 1.8 MB header with a 49k-token vocabulary, no q/k/v biases)."""
    hub.add_repo("owner/smol-gguf", {smollm_gguf.name: smollm_gguf, "README.md": b"# SmolLM2 GGUF"})
    rep = inspect("owner/smol-gguf")
    _same_gguf_report(rep, inspect(str(smollm_gguf)))
    assert rep.format == "hub-gguf"
    api = sum(r.sent for r in hub.log if r.path.startswith("/api/models/"))
    # One header range (the first, 2 MiB, holds the whole 1.8 MB header), nothing else.
    assert rep.bytes_read - api == hubmod.GGUF_FIRST_RANGE
    assert rep.requests == 3                      # revision, resolve -> CDN redirect, CDN
    hub.reset_stats()
    assert inspect("owner/smol-gguf").requests == 1 == hub.repo_requests


def test_gguf_header_grows_by_doubling_ranges(hub, smollm_gguf, monkeypatch):
    from ckpt_surgeon.formats.gguf import read_header
    monkeypatch.setattr(hubmod, "GGUF_FIRST_RANGE", 64 * 1024)
    hub.add_repo("owner/smol-gguf", {smollm_gguf.name: smollm_gguf})
    with open_checkpoint("owner/smol-gguf") as ck:
        header_end = read_header(smollm_gguf).header_end
        assert len(ck.tensors) == 272
    spans = [tuple(int(x) for x in r.range[6:].split("-")) for r in hub.log if r.path.startswith("/cdn/")]
    assert spans[0] == (0, 64 * 1024 - 1)
    for (a0, b0), (a1, b1) in zip(spans, spans[1:]):
        assert a1 == b0 + 1                         # only new bytes are asked for
        assert b1 + 1 >= 2 * (b0 + 1)               # and at least twice as many in total: few round trips
    assert header_end <= spans[-1][1] + 1 < 2 * header_end
    assert len(spans) == 6                          # 64 KB .. 2 MB for a 1.8 MB header


def test_gguf_repo_with_biases_fetches_only_the_bias_ranges(hub, tiny, tmp_path, monkeypatch):
    gguf_path = _qwen2_gguf(tiny("qwen2"), tmp_path / "qwen2-tiny-f32.gguf")
    monkeypatch.setattr(hubmod, "GGUF_FIRST_RANGE", 4096)     # the tiny header is ~2.5 KB
    hub.add_repo("owner/q-gguf", {gguf_path.name: gguf_path, "other.txt": b"x"})
    rep = inspect("owner/q-gguf")
    local = inspect(str(gguf_path))
    _same_gguf_report(rep, local)
    assert rep.layers_with_qkv_bias == 2
    with open_checkpoint(gguf_path) as ck:
        bias_bytes = sum(i.nbytes for n, i in ck.tensors.items() if n.endswith(".bias"))
    api = sum(r.sent for r in hub.log if r.path.startswith("/api/models/"))
    assert rep.bytes_read - api <= 4096 + bias_bytes           # 1 header range + the biases, nothing else
    assert rep.bytes_read < 0.02 * gguf_path.stat().st_size


def test_gguf_file_option_picks_one_of_several(hub, tiny, tmp_path):
    g = _qwen2_gguf(tiny("qwen2"), tmp_path / "m-f32.gguf")
    hub.add_repo("owner/many", {"a-f32.gguf": g, "b-f32.gguf": g, "sub/c-f32.gguf": g})
    with pytest.raises(HubError, match=r"repository holds 2 GGUF files \(a-f32.gguf, b-f32.gguf\)"):
        inspect("owner/many")
    rep = inspect("owner/many", file="sub/c-f32.gguf")
    _same_gguf_report(rep, inspect(str(g)))
    assert rep.source == "owner/many"


# ------------------------------------------------------------------ tokens


def test_token_is_sent_to_the_hub_not_to_a_foreign_cdn_and_never_shown(env, tiny, monkeypatch, caplog):
    import logging
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with HubServer(cdn_host="localhost", idle_timeout=120) as srv:      # CDN on another origin, as on the Hub
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        srv.add_repo("owner/gated", tiny("qwen2_sharded"), gated=True, tokens=(TOKEN,))
        rep = inspect("owner/gated")
        assert rep.layers_with_qkv_bias == 2
        hub_side = [r for r in srv.log if r.path.startswith("/api/models/") or "/resolve/" in r.path]
        cdn_side = [r for r in srv.log if r.path.startswith("/cdn/")]
        assert hub_side and all(r.authorized for r in hub_side)
        assert cdn_side and not any(r.authorized for r in cdn_side)
        assert all(r.user_agent.startswith("ckpt-surgeon/") for r in srv.log if r.for_repo)
    assert TOKEN not in caplog.text
    for p in (env / "cache").rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


def test_token_never_in_cli_output(hub, tiny, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.add_repo("owner/gated", tiny("qwen2"), gated=True, tokens=("someone-else",))
    hub.add_repo("owner/one", tiny("qwen2"))
    runner = CliRunner()
    outs = []
    for args in (["inspect", "owner/gated"], ["--debug", "inspect", "owner/gated"], ["inspect", "owner/missing"],
                 ["inspect", "owner/one"], ["inspect", "owner/one", "--format", "json"],
                 ["inspect", "owner/one", "--revision", "nope"]):
        res = runner.invoke(cli, args)
        outs.append(res.output + (res.stderr or "") + "".join(
            __import__("traceback").format_exception(res.exception) if res.exception else []))
    assert all(TOKEN not in o for o in outs)
    assert "gated repository and your token has not been granted" in outs[0]
    assert any(r.authorized for r in hub.log)            # the token was used, just never shown


# ------------------------------------------------------------------ CLI


def test_cli_json_matches_library_and_exit_codes(hub, tiny):
    folder = tiny("qwen2_sharded")
    hub.add_repo("owner/tiny", folder)
    res = CliRunner().invoke(cli, ["inspect", "owner/tiny", "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    _same_report(got, inspect(str(folder)).to_dict())
    assert got["format"] == "hub-safetensors" and got["requests"] > 0 and got["bytes_read"] > 0
    table = CliRunner().invoke(cli, ["inspect", "owner/tiny"])
    assert table.exit_code == 0 and "bytes read" in table.stdout and "in 1 request(s)" in table.stdout
    bad = CliRunner().invoke(cli, ["inspect", "owner/tiny", "--revision", "nope"])
    assert bad.exit_code == 2
    assert bad.stderr == "error: owner/tiny: revision 'nope' not found (give a branch, tag or commit sha that exists)\n"


def _subprocess_env(hub: HubServer, env: Path, **extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "CKPT_SURGEON"))}
    e.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(env / "hf-home-sub"), "CKPT_SURGEON_CACHE": str(env / "cache"),
              "CKPT_SURGEON_HUB_BACKOFF": "0.01", **extra})
    return e


def test_subprocess_exit_codes_and_progress(hub, tiny, env):
    hub.add_repo("owner/tiny", tiny("qwen2_sharded"))
    run = lambda *a, **kw: subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", *a],  # noqa: E731
                                          capture_output=True, text=True, env=_subprocess_env(hub, env, **kw),
                                          timeout=120)
    missing = run("owner/missing", HF_TOKEN=TOKEN)
    assert missing.returncode == 2
    assert missing.stderr == f"error: owner/missing: repository not found on {hub.url}, or your token cannot access it\n"
    assert TOKEN not in missing.stdout + missing.stderr
    ok = run("owner/tiny", "--format", "json")
    assert ok.returncode == 0 and ok.stderr == ""            # not a terminal: no progress bar
    assert json.loads(ok.stdout)["layers_with_qkv_bias"] == 2
    shown = run("owner/tiny", "--revision", json.loads(ok.stdout)["file_metadata"]["hub_commit"],
                CKPT_SURGEON_PROGRESS="1", CKPT_SURGEON_CACHE=str(env / "cache2"))
    assert shown.returncode == 0 and "owner/tiny headers" in shown.stderr    # asked for: tqdm on stderr
    offline = run("owner/tiny", HF_HUB_OFFLINE="1", CKPT_SURGEON_CACHE=str(env / "empty"))
    assert offline.returncode == 2 and offline.stderr.count("\n") == 1
    assert offline.stderr.startswith("error: owner/tiny@main: this revision is in neither the ckpt-surgeon cache")


def test_cached_second_run_is_one_request_at_the_server_telemetry_on(hub, tiny, env):
    """Counted at the server, all requests (not only the repo's): a user's default set-up, with
    huggingface_hub's telemetry on, whose user-agent code asks ENDPOINT/api/agent-harnesses when
    its day-old registry copy has expired.  A cached inspect must still cost exactly the one
    revision lookup, and offline nothing."""
    hub.add_repo("owner/tiny", tiny("qwen2_sharded"))
    base = _subprocess_env(hub, env)
    base.pop("HF_HUB_DISABLE_TELEMETRY", None)
    run = lambda **kw: subprocess.run([sys.executable, "-m", "ckpt_surgeon", "inspect", "owner/tiny",  # noqa: E731
                                       "--format", "json"], capture_output=True, text=True, env={**base, **kw},
                                      timeout=120)
    first = run()
    assert first.returncode == 0, first.stderr
    registry = Path(base["HF_HOME"]) / ".agent_harnesses.json"
    if registry.exists():                  # expire huggingface_hub's copy, as a day later
        os.utime(registry, (0, 0))
    hub.reset_stats()
    second = run()
    assert second.returncode == 0, second.stderr
    assert [r.path for r in hub.log] == ["/api/models/owner/tiny/revision/main"]
    assert json.loads(second.stdout)["requests"] == 1
    _same_report(json.loads(second.stdout), json.loads(first.stdout))
    hub.reset_stats()
    offline = run(HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert hub.requests == 0 and json.loads(offline.stdout)["requests"] == 0


# ------------------------------------------------------------------ helpers

_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
_GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _qwen2_gguf(folder: Path, out: Path) -> Path:
    """The tiny Qwen2 as an F32 GGUF written by gguf-py's GGUFWriter (llama.cpp's tensor names;
    qwen2 GGUFs keep Q/K unpermuted, so values are copied as they are)."""
    import gguf
    cfg = json.loads((folder / "config.json").read_text())
    w = gguf.GGUFWriter(str(out), "qwen2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    with open_checkpoint(folder) as ck:
        for n in ck.tensors:
            parts = n.split(".")
            name = _GGUF_GLOBAL.get(n) or f"blk.{parts[2]}.{_GGUF_LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"
            w.add_tensor(name, ck.read(n).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out



def _synthetic_qwen2(folder: Path) -> Path:
    """A 1-layer Qwen2-shaped checkpoint whose q/k/v biases are stored next to each other."""
    folder.mkdir(parents=True)
    h, nh, kv, d = 32, 2, 1, 16
    rng = np.random.default_rng(0)
    # embed_tokens first (512 KB) so that the biases lie beyond the speculative header range.
    tensors = [("model.embed_tokens.weight", (4096, h)), ("model.layers.0.self_attn.q_proj.bias", (nh * d,)), ("model.layers.0.self_attn.k_proj.bias", (kv * d,)),
               ("model.layers.0.self_attn.v_proj.bias", (kv * d,)), ("model.layers.0.self_attn.q_proj.weight", (nh * d, h)),
               ("model.layers.0.self_attn.k_proj.weight", (kv * d, h)), ("model.layers.0.self_attn.v_proj.weight", (kv * d, h)),
               ("model.layers.0.self_attn.o_proj.weight", (h, nh * d))]
    header, blobs, off = {}, [], 0
    for name, shape in tensors:
        a = rng.standard_normal(shape).astype(np.float32)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    (folder / "model.safetensors").write_bytes(_raw_safetensors(header, b"".join(blobs)))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": h, "num_hidden_layers": 1,
        "num_attention_heads": nh, "num_key_value_heads": kv, "intermediate_size": 64, "vocab_size": 4096,
        "max_position_embeddings": 128, "rope_theta": 10000.0}))
    return folder


def test_hub_readers_are_tensor_sources_sharing_one_byte_source(hub, tiny):
    """A sharded Hub repo opens to one ShardSet of safetensors readers over one HubRanges: its
    counters are the server's, counted once however many shards; read_rows_into fetches only the
    rows' bytes, the same bytes as the local file holds."""
    from ckpt_surgeon.formats.safetensors import SafetensorsFile
    from ckpt_surgeon.formats.source import ShardSet, TensorSource

    folder = tiny("qwen2_sharded")
    hub.add_repo("owner/tiny", folder)
    with open_checkpoint("owner/tiny") as ck, open_checkpoint(folder) as local:
        assert isinstance(ck.reader, TensorSource) and isinstance(ck.reader, ShardSet)
        parts = ck.reader.parts
        assert len(parts) == len(list(folder.glob("*.safetensors"))) > 1
        assert all(isinstance(p, SafetensorsFile) for p in parts) and len({id(p.data) for p in parts}) == 1
        assert ck.bytes_read == parts[0].data.bytes_read == sum(r.sent for r in hub.log if r.for_repo)
        assert ck.requests == hub.repo_requests
        name = "model.embed_tokens.weight"
        info = ck.tensors[name]
        per_row = info.nbytes // info.shape[0]
        hub.reset_stats()
        buf = bytearray(per_row * 2)
        view = ck.read_rows_into(name, 3, 5, buf)
        assert bytes(view) == local.read_rows(name, 3, 5, raw=True)
        # exactly those rows' bytes (the header ranges end well before row 3: see the byte budget test)
        assert sum(r.sent for r in hub.log if r.for_repo and r.range) == 2 * per_row
