"""``verify`` launched by torchrun (issue 34): real gloo ranks on the CPU, tiny models.

The runs that end, fail or are killed as a user's would (prompt mode, ``--save-reference``, the
faults, the refusals) are ``python -m torch.distributed.run --nproc-per-node N -m ckpt_surgeon verify
...`` as a user types it (or, where each rank must see a different working directory, the ranks
started by hand with torchrun's variables).  The same-answer comparisons over families and modes
start their ranks by hand too, each forked from the suite's server with torch imported
(``dist_util.by_hand``, tests/forkserver.py: ~8 s of CPU less per rank; the product sees the same
variables and runs the same code), and compare them with the same command run in one process;
``benchmarks/sweep_verify_distributed.py`` runs that comparison under torchrun on every tiny family.  The helpers (the commands, the model pairs, the comparison) are in ``dist_util.py``,
shared with ``benchmarks/sweep_verify_distributed.py``, which runs the same comparison on every
tiny family.

Tolerance (``dist_util.REL_TOL``).  Both modes run the same transformers modules on the same inputs and rank 0
accumulates the statistics over every token in chunk order, as one process does; torchrun gives
each rank one thread, so the one-process runs here use one thread too (a different thread count
may pick another BLAS blocking, which moves a float32 dot product by ~u·sqrt(K)).  Measured: the
reports are identical, bit for bit.  The comparison allows 1e-9 relative (float64 sums of a few
hundred float32-rounded terms), far under any difference a wrong mask, layer order, chunk order
or missing chunk makes (>= 1e-3 relative on these models).
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.verification.dist_env import detect
from ckpt_surgeon.verification.dist_plan import blocks_for
from dist_util import CTX, GATES, pair, write_ids
from dist_util import by_hand as _by_hand
from dist_util import close as _close
from dist_util import deeper as _deeper
from dist_util import env as _env
from dist_util import errors as _errors
from dist_util import port as _port
from dist_util import single as _single
from dist_util import torchrun as _torchrun
from dist_util import torchrun_cmd as _torchrun_cmd


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory) -> Path:
    return write_ids(tmp_path_factory.mktemp("dist") / "ids.json")


def _models(tiny, tmp_path_factory, family: str):
    return pair(tiny(family), tmp_path_factory.getbasetemp() / f"dist-{family}")



# --- unit: detection and the plan ---------------------------------------------------------------

def test_detect_the_torchrun_environment():
    assert detect({}) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}) is None             # torchrun --nproc-per-node 1
    env = detect({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (env.rank, env.world, env.local_rank, env.local_world, env.master_addr, env.master_port,
            env.agent_store) == (1, 4, 1, 2, "node0", 29500, True)
    with pytest.raises(CkptError, match="integers"):
        detect({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(CkptError, match="MASTER_ADDR"):
        detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"})


def test_layer_blocks_are_contiguous_and_balanced():
    assert blocks_for([1] * 8, 2) == ((0, 4), (4, 8))
    assert blocks_for([1] * 7, 3) == ((0, 2), (2, 5), (5, 7))
    # DeepSeek-V3's shape: 3 dense layers (~1/20 of an MoE layer) then 58 MoE layers, 16 ranks
    w = [1] * 3 + [20] * 58
    b = blocks_for(w, 16)
    assert b[0][0] == 0 and b[-1][1] == 61 and all(x[1] == y[0] for x, y in zip(b, b[1:]))
    # no block heavier than its fair share by more than one layer: the boundaries are as close as can be
    assert max(sum(w[b0:b1]) for b0, b1 in b) <= sum(w) / 16 + max(w)
    assert b[0] == (0, 6)           # the 3 light dense layers go with 3 MoE layers
    with pytest.raises(CkptError, match="it would use 2 ranks"):
        blocks_for([1, 1], 3)


# --- same answer ----------------------------------------------------------------------------------

# (family, mode, ranks): dense, MoE (mixtral, deepseek_v2), sliding window (gemma2), MLA (deepseek_v2)
CASES = [("qwen2", "data", 2), ("qwen2", "pipeline", 3), ("mixtral", "pipeline", 2), ("mixtral", "data", 3),
         ("gemma2", "pipeline", 3), ("gemma2", "data", 2), ("deepseek_v2", "pipeline", 2),
         ("deepseek_v2", "data", 3)]


_ONE_PROCESS: dict = {}


@pytest.mark.parametrize("family,mode,ranks", CASES, ids=[f"{f}-{m}-{n}" for f, m, n in CASES])
def test_corpus_statistics_equal_one_process(tiny, tmp_path_factory, ids_file, family, mode, ranks):
    ref, cand = _models(tiny, tmp_path_factory, family)
    args = [ref, cand, "--corpus-ids", ids_file, "--ctx", CTX, "--device", "cpu", "--format", "json", *GATES]
    dist = _by_hand(ranks, [*args, "--dist-mode", mode])
    assert dist.returncode == 0, dist.stderr[-3000:]
    key = tuple(map(str, args))     # both modes of a family compare with the same one-process run: made once
    one = _ONE_PROCESS[key] if key in _ONE_PROCESS else _ONE_PROCESS.setdefault(key, _single(args))
    assert one.returncode == 0, one.stderr[-2000:]
    a, b = json.loads(one.stdout), json.loads(dist.stdout)
    assert a["corpus"]["kl"]["mean"] > 1e-6          # the candidate differs: the statistics are not all 0
    _close(a["corpus"], b["corpus"])
    assert a["passed"] == b["passed"]
    note = next(n for n in b["notes"] if n.startswith("distributed over"))
    assert f"over {ranks} ranks (gloo): " + ("data-parallel" if mode == "data" else "pipeline") in note
    assert mode != "data" or f"chunks dealt round-robin over the {ranks} ranks (rank r ran chunks r, r + {ranks}," in note
    assert a["notes"] == [n for n in b["notes"] if n != note]


def test_prompt_mode_pipeline_localizes_like_the_streamed_run(tiny, tmp_path_factory, ids_file):
    """Prompt mode over a pipeline: the streamed report (per-layer divergence, no greedy
    generation), the perturbed layer named."""
    ref, cand = _models(tiny, tmp_path_factory, "qwen2")
    args = [ref, cand, "--token-ids", ids_file, "--device", "cpu", "--format", "json", "--localize"]
    dist = _torchrun(2, [*args, "--dist-mode", "pipeline"])
    one = _single([*args, "--stream"])
    assert dist.returncode == one.returncode == 1, dist.stderr[-3000:]
    a, b = json.loads(one.stdout), json.loads(dist.stdout)
    assert b["mode"] == "stream" and b["localize"]["first_layer"] == 1
    for k in ("metrics", "localize", "prompts", "failures"):
        _close(a[k], b[k], k)
    assert a["notes"] == [n for n in b["notes"] if not n.startswith("distributed over 2 ranks (gloo): pipeline")]
    assert len(_errors(dist.stderr)) == 1 and "mismatch" in _errors(dist.stderr)[0]


def test_save_reference_then_reference(tiny, tmp_path_factory, tmp_path, ids_file):
    """--save-reference over 2 data-parallel ranks writes the file one process writes (rank 0
    alone); --reference FILE then scores the candidate over a 2-rank pipeline."""
    ref, cand = _models(tiny, tmp_path_factory, "qwen2_moe")
    common = ["--corpus-ids", ids_file, "--ctx", CTX, "--device", "cpu", "--format", "json", *GATES]
    saved = _torchrun(2, [ref, cand, *common, "--save-reference", tmp_path / "ref.safetensors",
                          "--dist-mode", "data"])
    assert saved.returncode == 0, saved.stderr[-3000:]
    one = _single([ref, cand, *common, "--save-reference", tmp_path / "one.safetensors"])
    assert one.returncode == 0, one.stderr[-2000:]
    from ckpt_surgeon.verification.reference_file import ReferenceReader
    ra, rb = ReferenceReader(tmp_path / "one.safetensors"), ReferenceReader(tmp_path / "ref.safetensors")
    try:
        for i in range(ra.info.tokens.shape[0]):
            np.testing.assert_allclose(rb.chunk(i)[1], ra.chunk(i)[1], rtol=0, atol=0)
    finally:
        ra.close()
        rb.close()
    scored = _torchrun(2, ["--reference", tmp_path / "ref.safetensors", cand, *common, "--dist-mode", "pipeline"])
    assert scored.returncode == 0, scored.stderr[-3000:]
    a, b = json.loads(one.stdout)["corpus"], json.loads(scored.stdout)["corpus"]
    assert (a.pop("reference_file")["saved"], b.pop("reference_file")["saved"]) == (True, False)
    _close(a, b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.safetensors", "ref.safetensors"]


# --- faults and bad input -------------------------------------------------------------------------

def _ranks(proc) -> dict:
    """torchrun's worker processes by rank."""
    import psutil
    out = {}
    for c in psutil.Process(proc.pid).children(recursive=True):
        try:
            env = c.environ()
        except psutil.Error:
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = (c, env)
    return out


def _store(env: dict):
    """A client of the store the ranks share (torchrun's agent hosts it)."""
    import datetime

    import torch.distributed as dist
    return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), None, False,
                         timeout=datetime.timedelta(seconds=30))


def _long_run(tiny, tmp_path_factory, tmp_path, mode: str, *save) -> tuple:
    """The kill tests' run: qwen2's pair over 3,000 chunks (long enough to kill a rank mid-run), the
    report (and, with ``save`` = option and file name, a saved reference) into an empty ``out``
    folder -> (verify's arguments, out, a free port)."""
    ref, cand = _models(tiny, tmp_path_factory, "qwen2")
    ids = write_ids(tmp_path / "long.json", chunks=3000, seed=1)
    out = tmp_path / "out"
    out.mkdir()
    args = [ref, cand, "--corpus-ids", ids, "--ctx", CTX, "--device", "cpu", "--format", "json", *GATES,
            "--dist-mode", mode, "-o", out / "report.json", *([save[0], out / save[1]] if save else [])]
    return args, out, _port()


def test_a_killed_rank_ends_every_rank_with_one_line(tiny, tmp_path_factory, tmp_path):
    """SIGKILL rank 1 mid-run (as the out-of-memory killer does): rank 0 ends within 60 s with one
    line naming rank 1, and neither the report nor the saved reference exists."""
    args, out, port = _long_run(tiny, tmp_path_factory, tmp_path, "data", "--save-reference", "ref.safetensors")
    # TMPDIR: the killed rank's scratch folder (it cannot remove it) stays under the test's folder, not in /tmp
    proc = subprocess.Popen(_torchrun_cmd(2, args, port), env=_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while 1 not in _ranks(proc):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        victim, env = _ranks(proc)[1]
        store = _store(env)
        while not store.check(["ckpt-surgeon-verify/chunks/1"]):     # rank 1 has sent a chunk: mid-run
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 60, took
    errors = _errors(err)
    assert len(errors) == 1 and errors[0].startswith("error: rank 1: stopped without a word"), err[-3000:]
    assert proc.returncode != 0
    assert list(out.iterdir()) == []             # nothing written, no temporary file left


def test_ranks_that_see_different_files_are_refused(tiny, tmp_path, ids_file):
    """Two ranks started by hand (no torchrun: rank 0 hosts the store), each in its own working
    directory where the same relative path names different candidates: one line, exit 2."""
    src = tiny("qwen2")
    port = _port()
    procs = []
    for rank in (0, 1):
        cwd = tmp_path / f"rank{rank}"
        cwd.mkdir()
        _deeper(src, cwd / "cand", layers=2 + rank)
        env = _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "ckpt_surgeon", "verify", str(src), "cand",
                                       "--corpus-ids", str(ids_file), "--ctx", str(CTX), "--device", "cpu"],
                                      cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    assert len(_errors(outs[0][1])) == 1 and "rank 1 sees different files: cand/" in outs[0][1], outs[0][1]
    assert outs[1][1] == "" and outs[0][0] == outs[1][0] == ""        # rank 1 quiet


def test_more_pipeline_ranks_than_layers(tiny, ids_file):
    res = _torchrun(3, [tiny("qwen2"), tiny("qwen2"), "--corpus-ids", ids_file, "--ctx", CTX, "--device", "cpu",
                        "--dist-mode", "pipeline"])
    errors = _errors(res.stderr)
    assert res.returncode != 0 and len(errors) == 1, res.stderr[-3000:]
    assert "2 decoder layers" in errors[0] and "it would use 2 ranks" in errors[0]


@pytest.mark.skipif("not __import__('torch').cuda.is_available() or __import__('torch').cuda.device_count() < 2",
                    reason="needs two CUDA GPUs (nccl)")
def test_nccl_pipeline_on_two_gpus(tiny, tmp_path_factory, ids_file):
    ref, cand = _models(tiny, tmp_path_factory, "qwen2")
    args = [ref, cand, "--corpus-ids", ids_file, "--ctx", CTX, "--device", "cuda", "--format", "json", *GATES]
    dist = _torchrun(2, [*args, "--dist-mode", "pipeline"])
    one = _single(args)
    assert dist.returncode == one.returncode == 0, dist.stderr[-3000:]
    a, b = json.loads(one.stdout)["corpus"], json.loads(dist.stdout)["corpus"]
    assert abs(a["kl"]["mean"] - b["kl"]["mean"]) <= 1e-3 * a["kl"]["mean"]     # GPU kernels: not bitwise


def test_the_plan_picks_data_then_pipeline_then_refuses(tiny, tmp_path_factory):
    """From the headers: both models fit a rank -> data; only a rank's block of layers does ->
    pipeline (blocks named); not even that -> one line with what it would need."""
    from ckpt_surgeon.verification.dist_plan import plan_distributed
    ref, cand = _models(tiny, tmp_path_factory, "qwen2")

    def plan(available, **kw):
        return plan_distributed([str(ref), str(cand)], dtype="float32", world=2, available=available, positions=CTX,
                                hidden_rows=CTX, **kw)
    big = plan(1 << 40)
    assert big.mode == "data" and "fit one rank" in big.why
    need = big.per_rank
    assert need["pipeline"] < need["data"]
    mid = plan((need["pipeline"] + need["data"]) // 2)
    assert mid.mode == "pipeline" and mid.blocks == ((0, 2), (2, 4))
    with pytest.raises(CkptError, match="not enough memory per rank"):
        plan(need["pipeline"] - 1)
    assert plan(1 << 40, forced="pipeline").mode == "pipeline"
    assert plan(1, forced="data").mode == "data"
    one = plan(1 << 40, one_at_a_time=True).per_rank["data"]
    assert one < need["data"]            # --save-reference / --reference: one model per rank


# (ranks, victim): rank 1 in the middle of a 3-rank pipeline (rank 2 waits in recv on it, rank 0 on
# rank 2), and the last rank of 2 (rank 0 waits in recv for its logits)
PIPE_KILLS = [(3, 1), (2, 1)]


@pytest.mark.parametrize("ranks,victim", PIPE_KILLS, ids=[f"{n}ranks-kill{v}" for n, v in PIPE_KILLS])
def test_a_killed_pipeline_rank_ends_every_rank_with_one_line(tiny, tmp_path_factory, tmp_path, ranks, victim):
    """SIGKILL a pipeline rank while hidden states are in flight, the ranks started by hand (no
    torchrun, so no launcher ends the others for us): every other rank, blocked in a receive from
    the dead one or from a rank that waits on it, ends within 60 s; rank 0 prints one line naming
    the victim, the others nothing; no report on disk."""
    args, out, port = _long_run(tiny, tmp_path_factory, tmp_path, "pipeline")
    procs = [subprocess.Popen([sys.executable, "-m", "ckpt_surgeon", "verify", *map(str, args)],
                              env=_env(RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TMPDIR=str(tmp_path)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    try:
        deadline = time.monotonic() + 240
        store = None
        while store is None:
            try:
                store = _store({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            except Exception:        # noqa: BLE001 - rank 0 has not opened the store yet
                assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
                time.sleep(0.5)
        # the victim has passed on a few chunks: hidden states are in flight on both sides of it
        while not store.check([f"ckpt-surgeon-verify/chunks/{victim}"]) or \
                int(store.get(f"ckpt-surgeon-verify/chunks/{victim}").decode().split(":")[1]) < 3:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                [p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        outs = {r: p.communicate(timeout=90) for r, p in enumerate(procs) if r != victim}
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert took < 60, took
    errors = _errors(outs[0][1])
    assert len(errors) == 1 and errors[0].startswith(f"error: rank {victim}: stopped without a word"), outs[0][1]
    assert procs[0].returncode == 2
    assert all(outs[r] == ("", "") for r in outs if r != 0)         # the others quiet
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("ranks", [2, 3])
def test_prompt_mode_data_deals_the_prompts_over_the_ranks(tiny, tmp_path_factory, tmp_path, ranks):
    """Issue 50 item 12: prompt mode with --dist-mode data deals the prompts over the ranks as corpus mode deals
    chunks (rank r runs prompts r, r + N, ...: both models loaded on each, greedy generation included), rank 0
    compares them in prompt order: the report is the one-process report (metrics, every prompt's numbers and
    continuations, the verdict), plus one note saying how the prompts were dealt.  5 prompts: 3 ranks get 2, 2, 1."""
    ref, cand = _models(tiny, tmp_path_factory, "qwen2")
    rng = np.random.default_rng(1)
    ids = tmp_path / "prompts.json"
    ids.write_text(json.dumps([[int(x) for x in rng.integers(3, 400, size=n)] for n in (9, 5, 12, 7, 3)]))
    args = [ref, cand, "--token-ids", ids, "--max-new-tokens", "6", "--device", "cpu", "--format", "json"]
    dist = _by_hand(ranks, [*args, "--dist-mode", "data"])
    one = _single(args)
    assert dist.returncode == one.returncode == 1, dist.stderr[-3000:]
    a, b = json.loads(one.stdout), json.loads(dist.stdout)
    assert b["mode"] == a["mode"] != "stream" and len(b["prompts"]) == 5
    assert all(p["reference_continuation"] for p in b["prompts"])    # greedy generation compared, as one process
    for k in ("metrics", "prompts", "failures", "passed", "thresholds"):
        _close(a[k], b[k], k)
    dealt = [n for n in b["notes"] if n.startswith(f"distributed over {ranks} ranks (gloo), data mode: prompts dealt "
                                                   f"round-robin over the {ranks} ranks (rank r ran prompts r, r + "
                                                   f"{ranks}, ...)")]

    def free(notes):                 # the plan's note names the free memory of the moment
        return [re.sub(r"[0-9.]+ GiB free", "_ GiB free", n) for n in notes]
    assert len(dealt) == 1 and free(a["notes"]) == free(n for n in b["notes"] if n not in dealt)
    assert not [n for n in b["notes"] if "rank 0 alone" in n]


def test_layer_blocks_count_the_head_on_the_last_rank():
    """The last rank holds the head whole (rank 0 reads only its chunk's embedding rows): the blocks
    balance layers + head, and when the head alone is over an even share the last rank gets one
    layer (the bound is then the head plus that layer)."""
    from ckpt_surgeon.verification.dist_plan import rank_weights
    # Qwen2.5-0.5B, both models: 24 layers of 2 x 14.9 M, two tied heads of 136 M
    per, head = [2 * 14_912_384] * 24, 2 * 136_134_656
    b = blocks_for(per, 2, last=head)
    assert b == ((0, 17), (17, 24))
    w = rank_weights(per, b, last=head)
    total = sum(per) + head
    assert all(abs(x / total - 0.5) < 0.03 for x in w), w       # within half a layer of even
    # the head alone is more than half: one layer on the last rank, the rest on rank 0
    assert blocks_for([10] * 8, 2, last=200) == ((0, 7), (7, 8))
    # 3 ranks, head worth 2 layers (10 in all): ranks hold 3, 4, 1 + 2 (no split keeps every rank
    # under 4; of those at 4 this one's boundaries, 3 and 7, lie nearest the even shares 3.3 and 6.7)
    assert blocks_for([1] * 8, 3, last=2) == ((0, 3), (3, 7), (7, 8))
    # the heaviest rank is as light as any contiguous split can make it (checked by brute force)
    import itertools
    rng = np.random.default_rng(3)
    for _ in range(20):
        per = [int(x) for x in rng.integers(1, 50, size=7)]
        head = int(rng.integers(0, 120))
        best = min(max(rank_weights(per, tuple(zip((0, *cut), (*cut, 7))), last=head))
                   for cut in itertools.combinations(range(1, 7), 2))
        assert max(rank_weights(per, blocks_for(per, 3, last=head), last=head)) == best


def test_the_plan_finds_the_head_by_shape(tiny, tmp_path_factory):
    """layer_sizes: the head the last rank holds is one vocabulary x hidden matrix per model (the
    embedding, for a tied model); every such matrix is left out of what every rank holds."""
    from ckpt_surgeon.verification.dist_plan import layer_sizes
    ref, _ = _models(tiny, tmp_path_factory, "qwen2")
    cfg = json.loads((ref / "config.json").read_text())
    one = layer_sizes([str(ref)])
    rows = cfg["vocab_size"] * cfg["hidden_size"]
    assert one.head == rows
    assert one.by_rows == rows * (1 if cfg.get("tie_word_embeddings") else 2)
    two = layer_sizes([str(ref), str(ref)])
    assert (two.head, two.by_rows, two.rest) == (2 * one.head, 2 * one.by_rows, 2 * one.rest)


def test_a_file_of_the_same_size_with_other_header_bytes_is_refused(tmp_path):
    """The fingerprint compares the first 64 KiB too, not only the sizes: a config edited in place
    to the same length is a difference, named in one line."""
    from ckpt_surgeon.verification.dist_plan import compare_fingerprints, fingerprint
    d = tmp_path / "cand"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 64}')
    (d / "model.safetensors").write_bytes(b"x" * 100)
    before = fingerprint([d])
    (d / "config.json").write_text('{"hidden_size": 32}')
    assert compare_fingerprints([before, before]) is None
    line = compare_fingerprints([before, fingerprint([d])])
    assert line == (f"rank 1 sees different files: {d / 'config.json'} has other header bytes than on rank 0; "
                    "every rank must read the same inputs")


def test_more_pipeline_ranks_than_layers_exit_2_on_every_rank(tiny, ids_file):
    """The same refusal with the ranks started by hand: every rank exits 2 (torchrun reports 1 for
    any failed rank), rank 0 prints the one line, the others nothing."""
    port = _port()
    procs = [subprocess.Popen([sys.executable, "-m", "ckpt_surgeon", "verify", str(tiny("qwen2")), str(tiny("qwen2")),
                               "--corpus-ids", str(ids_file), "--ctx", str(CTX), "--device", "cpu",
                               "--dist-mode", "pipeline"],
                              env=_env(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [2, 2, 2], outs
    errors = _errors(outs[0][1])
    assert len(errors) == 1 and "it would use 2 ranks" in errors[0], outs[0][1]
    assert outs[0][0] == "" and all(o == ("", "") for o in outs[1:])


def test_a_refusal_exits_2_on_every_rank_however_late_the_others_leave(tiny, ids_file):
    """The race a loaded machine made by chance (ranks 1 and 2 exited 1, silently): rank 0, which hosts the
    store, reached the refusal and left while the others were still on their way out; their fault watch saw
    the store gone and interrupted them.  Here ranks 1 and 2 are made late on purpose (5 s after reaching the
    refusal, tests/dist_delay.py, several heartbeats and the watch's store timeout): every rank still exits 2,
    because the decision is gathered and settled before anyone unwinds, and rank 0 waits for the others."""
    port = _port()
    args = ["verify", str(tiny("qwen2")), str(tiny("qwen2")), "--corpus-ids", str(ids_file), "--ctx", str(CTX),
            "--device", "cpu", "--dist-mode", "pipeline"]
    delay = str(Path(__file__).with_name("dist_delay.py"))
    procs = [subprocess.Popen([sys.executable, *(["-m", "ckpt_surgeon"] if r == 0 else [delay]), *args],
                              env=_env(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), CKPT_SURGEON_TEST_DELAY="after-plan-refusal:5"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [2, 2, 2], outs
    errors = _errors(outs[0][1])
    assert len(errors) == 1 and "it would use 2 ranks" in errors[0], outs[0][1]
    assert all(o == ("", "") for o in outs[1:])


# --- bfloat16 -------------------------------------------------------------------------------------

BF16_CASES = [("qwen2", "pipeline"), ("deepseek_v2", "pipeline"), ("qwen2", "data")]


@pytest.mark.parametrize("family,mode", BF16_CASES, ids=[f"{f}-{m}" for f, m in BF16_CASES])
def test_bf16_corpus_statistics_equal_one_process(tiny, tmp_path_factory, ids_file, family, mode):
    """``--dtype bfloat16`` over 2 gloo ranks: the pipeline (bf16 layers, bf16 hidden states sent
    between ranks, the head in float32) equals one process streaming in bf16 (``--stream``); data
    mode equals one process with both bf16 models in memory.  Same tolerance as above: the same
    modules on the same bf16 inputs (the hidden states cross ranks as bf16, bit for bit), the head
    applied in the same row blocks, the statistics summed in the same order (deepseek_v2: MLA, MoE
    and a router kept in float32)."""
    ref, cand = _models(tiny, tmp_path_factory, family)
    args = [ref, cand, "--corpus-ids", ids_file, "--ctx", CTX, "--device", "cpu", "--format", "json",
            "--dtype", "bfloat16", *GATES]
    dist = _by_hand(2, [*args, "--dist-mode", mode])
    assert dist.returncode == 0, dist.stderr[-3000:]
    one = _single([*args, "--stream"] if mode == "pipeline" else args)
    assert one.returncode == 0, one.stderr[-2000:]
    a, b = json.loads(one.stdout), json.loads(dist.stdout)
    assert a["dtype"] == b["dtype"] == "bfloat16"
    assert a["corpus"]["kl"]["mean"] > 1e-6
    _close(a["corpus"], b["corpus"])
    note = next(n for n in b["notes"] if n.startswith("distributed over"))
    assert ("pipeline over decoder layers" if mode == "pipeline" else "data-parallel") in note
