"""What the distributed ``verify`` tests and the family sweep share (issue 34): the commands (a
torchrun launch and the same ``verify`` in one process, one thread each), the deeper model pairs
they compare, and the comparison with its tolerance.

Imported as ``dist_util`` by ``tests/test_verify_distributed.py`` (pytest puts ``tests/`` on the
path) and as ``tests.dist_util`` by ``benchmarks/sweep_verify_distributed.py``.

Tolerance (``REL_TOL``).  Both modes run the same transformers modules on the same inputs and rank
0 accumulates the statistics over every token in chunk order, as one process does; torchrun gives
each rank one thread, so the one-process runs use one thread too (a different thread count may
pick another BLAS blocking, which moves a float32 dot product by ~u·sqrt(K)).  Measured: the
reports are identical, bit for bit.  The comparison allows 1e-9 relative (float64 sums of a few
hundred float32-rounded terms), far under any difference a wrong mask, layer order, chunk order or
missing chunk makes (>= 1e-3 relative on these models).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CTX = 16
CHUNKS = 7
REL_TOL = 1e-9
GATES = ("--max-mean-kl", "10", "--max-p99-kl", "10", "--min-same-top", "0")
# where a checkpoint's config keeps its number of decoder layers (GPT-2 and BLOOM: n_layer)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer")


def port() -> int:
    """A free TCP port on the loopback for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    """This environment without torchrun's variables, this checkout first on the path, one thread."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return dict(base, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)


def torchrun_cmd(n: int, args, rdv_port: int) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
            "--master-port", str(rdv_port), "-m", "ckpt_surgeon", "verify", *map(str, args)]


def torchrun(n: int, args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``verify ARGS`` under torchrun with ``n`` ranks (gloo on the CPU)."""
    # TMPDIR: torchrun makes a torchelastic_* log folder there and leaves it; removed with this one
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:
        return subprocess.run(torchrun_cmd(n, args, port()), env=env(TMPDIR=tmp), capture_output=True, text=True,
                              timeout=timeout)


def _forkserver():
    try:                            # tests/ on the path (pytest) or the repository root (the sweep)
        import forkserver
    except ImportError:
        from tests import forkserver
    return forkserver


def by_hand(n: int, args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``verify ARGS`` on ``n`` ranks started by hand with torchrun's variables (rank 0 hosts the
    store, as a launch without torchrun's agent does), each forked from the suite's server with torch
    imported (tests/forkserver.py): ~8 s of CPU less per rank than a fresh interpreter.  stdout: every
    rank's, rank 0 first (the others must print nothing); stderr: every rank's; returncode: the first
    rank's that is not 0."""
    forkserver = _forkserver()
    p = port()
    procs = [forkserver.start(["-m", "ckpt_surgeon", "verify", *map(str, args)],
                              env=env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(p)))
             for r in range(n)]
    done = forkserver.wait_all(procs, timeout)
    return subprocess.CompletedProcess([f"{n} ranks by hand"], next((d.returncode for d in done if d.returncode), 0),
                                       "".join(d.stdout for d in done), "".join(d.stderr for d in done))


def single(args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``verify ARGS`` in one process (forked from the suite's server, as the ranks of :func:`by_hand`)."""
    return _forkserver().run(["-m", "ckpt_surgeon", "verify", *map(str, args)], env=env(), timeout=timeout)


def errors(stderr: str) -> list:
    """The ``error: ...`` lines of a run's stderr."""
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


def close(a, b, where="") -> None:
    """Every number of ``a`` within REL_TOL of ``b`` (see the module docstring), the rest equal."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-30), (where, a, b)
    else:
        assert a == b, (where, a, b)


def rel_diffs(a, b, where=""):
    """What :func:`close` checks, as values instead of an assertion: yields ``(where, rel)`` for
    every float pair (``rel`` = |a - b| / max(|a|, |b|)) and ``(where, None)`` for anything else
    that differs (keys, lengths, a non-float value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            yield where, None
        for k in sorted(set(a) & set(b)):
            yield from rel_diffs(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield where, None
        for i, (x, y) in enumerate(zip(a, b)):
            yield from rel_diffs(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        yield where, abs(a - b) / max(abs(a), abs(b), 1e-30)
    elif a != b:
        yield where, None


def write_ids(path: Path, chunks: int = CHUNKS, seed: int = 0) -> Path:
    """A corpus of ``chunks`` x CTX random token ids (3..399: inside every tiny vocabulary)."""
    path.write_text(json.dumps([int(x) for x in np.random.default_rng(seed).integers(3, 400, size=CTX * chunks)]))
    return path


def _layer_of(name: str):
    from ckpt_surgeon.verification.memory import LAYER_KEY
    m = LAYER_KEY.search(name)
    return (int(m.group(1)), m.start(1), m.end(1)) if m else None


def _load_all(src: Path) -> dict:
    from safetensors.numpy import load_file
    out: dict = {}
    for f in sorted(src.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _save(out: dict, folder: Path, sharded: bool) -> None:
    """``model.safetensors``, or (``sharded``) one shard per decoder layer and one for the rest with
    the index transformers and our readers read."""
    from safetensors.numpy import save_file
    if not sharded:
        save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    groups: dict = {}
    for k in sorted(out):
        groups.setdefault((_layer_of(k) or (-1,))[0], []).append(k)
    weight_map = {}
    for i, g in enumerate(sorted(groups), start=1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: out[k] for k in groups[g]}, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in groups[g]})
    total = int(sum(v.nbytes for v in out.values()))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def deeper(src: Path, dst: Path, layers: int = 4, perturb: bool = False) -> Path:
    """``src`` with ``layers`` decoder layers (layer i a copy of layer min(i, n - 1)), in one
    ``model.safetensors`` (sharded by layer if ``src`` is sharded); ``perturb``: every tensor of layer 1 times (1 + 0.1·N(0, 1)) (a
    candidate that differs from layer 1 on).  Decoder layers are found as the readers find them
    (``LAYER_KEY``: ``layers.N.``, ``h.N.``, ``layer.N.`` ...), the layer count under either key of
    :data:`LAYER_COUNT_KEYS`, and a config list with one entry per layer is extended likewise."""
    if dst.exists():
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    cfg = json.loads((src / "config.json").read_text())
    count = next(k for k in LAYER_COUNT_KEYS if k in cfg)
    n = cfg[count]
    t = _load_all(src)
    out = {k: v for k, v in t.items() if _layer_of(k) is None}
    for i in range(layers):         # the extra layers repeat the last (DeepSeek: dense first, MoE after)
        j = min(i, n - 1)
        for k, v in t.items():
            at = _layer_of(k)
            if at and at[0] == j:
                out[k[:at[1]] + str(i) + k[at[2]:]] = v.copy()
    if perturb:
        rng = np.random.default_rng(0)
        for k in sorted(out):
            if (_layer_of(k) or (None,))[0] == 1:
                out[k] = (out[k] * (1 + 0.1 * rng.standard_normal(out[k].shape))).astype(out[k].dtype)
    _save(out, tmp, sharded=(src / "model.safetensors.index.json").exists())
    for k, v in list(cfg.items()):
        if isinstance(v, list) and len(v) == n:
            cfg[k] = [v[i % n] for i in range(layers)]
    cfg[count] = layers
    (tmp / "config.json").write_text(json.dumps(cfg))
    tmp.rename(dst)
    return dst


def pair(src: Path, root: Path) -> tuple:
    """The reference and the perturbed candidate of a tiny model ``src``, 4 layers each, under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return deeper(src, root / "ref"), deeper(src, root / "cand", perturb=True)


def corpus_args(ref: Path, cand: Path, ids: Path) -> list:
    """``verify`` in corpus mode on the CPU, JSON, gates that pass (the statistics are compared, not judged)."""
    return [ref, cand, "--corpus-ids", ids, "--ctx", CTX, "--device", "cpu", "--format", "json", *GATES]


def dist_note(notes, ranks: int, mode: str):
    """The note a distributed run adds (``None`` when absent), and whether it names ``ranks`` and ``mode``."""
    note = next((n for n in notes if n.startswith("distributed over")), None)
    want = f"over {ranks} ranks (gloo): " + ("data-parallel" if mode == "data" else "pipeline")
    return note, note is not None and want in note
