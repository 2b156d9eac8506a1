"""``verify`` launched by torchrun: the environment, the process group and the fault watch.

torchrun (``python -m torch.distributed.run``) starts one process per rank with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set;
:func:`detect` reads them (a world of one is an ordinary single-process run).  :func:`start`
joins the group: NCCL when the run computes on CUDA, gloo on CPUs, every collective bounded by a
timeout.

Faults.  Every rank runs a watch thread on its own connection to the rendezvous store (torchrun's
agent hosts it; without torchrun rank 0 does).  It writes a heartbeat counter every
:data:`HEARTBEAT_S` and reads the others'.  A rank that fails posts one line, ``rank R: cause``,
under the ``fault`` key (the first post wins); a rank whose counter stops moving for
:data:`SILENT_S` without having finished or been stopped is posted as killed (SIGKILL, the kernel's
out-of-memory killer).  Once a fault is posted every rank's main thread is interrupted (it unwinds
through its ``finally`` blocks: temporary files removed, an output being written discarded) and,
should it not come back within :data:`GRACE_S`, the process ends there.  Rank 0 prints the line.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from ..errors import CkptError

HEARTBEAT_S = 0.5
# A rank whose heartbeat has not moved for this long is taken for dead (generous: a loaded machine can
# starve a thread for seconds; a killed rank is still named within a quarter of a minute).
SILENT_S = 10.0
GRACE_S = 20.0
# Every collective and point-to-point message waits at most this long (a rank that hangs without
# dying ends the run then); a layer of a 671B model on one rank takes seconds, not minutes.
DEFAULT_TIMEOUT_S = 600.0
_PREFIX = "ckpt-surgeon-verify"      # PrefixStore adds the "/"


class DistributedFault(CkptError):
    """A rank of a distributed run failed; the message names the rank and the cause."""


@dataclass(frozen=True)
class DistEnv:
    """What torchrun told this process."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    agent_store: bool          # torchrun's agent hosts the store (else rank 0 does)

    def to_dict(self) -> dict:
        return dict(rank=self.rank, world=self.world, local_rank=self.local_rank, local_world=self.local_world,
                    master_addr=self.master_addr, master_port=self.master_port, agent_store=self.agent_store)


def detect(environ=None) -> DistEnv | None:
    """The torchrun environment of this process, or None for an ordinary run (no ``RANK`` /
    ``WORLD_SIZE``, or a world of one)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        if world < 2:
            return None
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        port = int(env.get("MASTER_PORT", ""))
    except ValueError:
        raise CkptError("RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers (launch with torchrun)") \
            from None
    if not 0 <= rank < world or not env.get("MASTER_ADDR"):
        raise CkptError(f"RANK {rank} / WORLD_SIZE {world} / MASTER_ADDR {env.get('MASTER_ADDR')!r} do not describe "
                        "a distributed run (launch with torchrun)")
    return DistEnv(rank, world, local_rank, local_world, env["MASTER_ADDR"], port,
                   env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


class _Interrupted(BaseException):
    """Raised in the main thread when the watch saw a fault elsewhere, or on SIGTERM."""


class Session:
    """This rank's membership of the group: rank, world, backend, the store and the fault watch."""

    def __init__(self, env: DistEnv, *, device: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        import datetime

        import torch
        import torch.distributed as dist

        self.env, self.rank, self.world = env, env.rank, env.world
        self.device = device
        self.backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(env.local_rank)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.store = self._store(is_master=env.rank == 0 and not env.agent_store)
        dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self.store), rank=env.rank,
                                world_size=env.world, timeout=self.timeout)
        self.fault_seen = threading.Event()
        self._stop = threading.Event()
        self._ending = threading.Lock()   # the watch's last word and the main thread's close exclude each other
        self._main = threading.main_thread()
        self._finished = False
        self._own_fault = False
        self._watch = threading.Thread(target=self._run_watch, name="ckpt-surgeon-fault-watch", daemon=True)
        self._watch.start()
        self._old_term = signal.signal(signal.SIGTERM, self._on_sigterm) \
            if threading.current_thread() is self._main else None

    # -- the store --------------------------------------------------------------------------
    def _store(self, *, is_master: bool):
        import torch.distributed as dist
        raw = dist.TCPStore(self.env.master_addr, self.env.master_port, self.env.world if is_master else None,
                            is_master, timeout=self.timeout, wait_for_workers=False)
        return dist.PrefixStore(_PREFIX, raw)

    def post_fault(self, line: str) -> str:
        """Post ``line`` as the run's fault unless one is posted already; returns the posted one."""
        if threading.current_thread() is self._main:
            self._own_fault = True
        try:
            got = self.store.compare_set("fault", "", line)
            return got.decode() if isinstance(got, bytes) else str(got)
        except Exception:            # noqa: BLE001 - the store itself is gone: our own line is all we know
            return line

    def posted_fault(self) -> str | None:
        try:
            if self.store.check(["fault"]):
                v = self.store.get("fault")
                return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:            # noqa: BLE001
            return None
        return None

    def mark(self, key: str, value: str = "1") -> None:
        """Set ``key/rank`` in the store (done, stopped, chunks: what the others and a watcher see)."""
        try:
            self.store.set(f"{key}/{self.rank}", value)
        except Exception:            # noqa: BLE001
            pass

    # -- the watch --------------------------------------------------------------------------
    def _run_watch(self) -> None:
        store = self._store(is_master=False)
        beat, seen, since = 0, {}, {}
        while not self._stop.wait(HEARTBEAT_S):
            try:
                beat += 1
                store.set(f"hb/{self.rank}", str(beat))
                if store.check(["fault"]):
                    self._on_fault()
                    continue
                now = time.monotonic()
                for r in range(self.world):
                    if r == self.rank:
                        continue
                    v = store.get(f"hb/{r}") if store.check([f"hb/{r}"]) else b"0"
                    if v != seen.get(r):
                        seen[r], since[r] = v, now
                    elif now - since[r] > SILENT_S and seen[r] != b"0" and \
                            not store.check([f"done/{r}"]) and not store.check([f"stopped/{r}"]):
                        self.post_fault(_killed(r, now - since[r]))
            except Exception:        # noqa: BLE001 - the store is unreachable: its host is gone
                if self._stop.is_set():
                    return
                self.post_fault(f"rank {0 if not self.env.agent_store else '?'}: the rendezvous store at "
                                f"{self.env.master_addr}:{self.env.master_port} stopped answering")
                self._on_fault()

    def settle(self) -> None:
        """This rank knows how the run ends (a refusal every rank reached, or rank 0's end message): from
        here on, nothing another rank does (rank 0 leaving first, its store going with it) may interrupt the
        main thread and turn its exit code into another one.  Should the main thread not come back within
        :data:`GRACE_S` after a fault is seen, the watch still ends the process (exit 2)."""
        self._own_fault = True

    def _on_fault(self) -> None:
        if self.fault_seen.is_set() or self._finished:
            return
        self.fault_seen.set()
        if not self._own_fault:      # this rank's main thread is unwinding its own error, or is settled
            import _thread
            _thread.interrupt_main()
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if self._finished:
                return
            time.sleep(0.1)
        with self._ending:           # not while the main thread closes (it then says the line itself)
            if self._finished:
                return
            if self.rank == 0:       # the main thread did not come back: say why, end here
                import sys
                print(f"error: {self.posted_fault() or 'a rank failed'}", file=sys.__stderr__, flush=True)
            os._exit(2)

    def _on_sigterm(self, signum, frame):
        self.mark("stopped")
        if not self._own_fault:      # once the main thread handles a fault it is left to finish
            raise _Interrupted("stopped by SIGTERM (the launcher ended the run)")

    def fault_line(self, exc: BaseException | None) -> str:
        """The one line for a run that ended with ``exc`` here: the posted fault (waiting a little
        for a silent rank to be noticed) or this rank's own cause."""
        self._own_fault = True           # neither the watch nor SIGTERM interrupts this any more
        line = self.posted_fault()
        deadline = time.monotonic() + SILENT_S + 2.0
        while line is None and time.monotonic() < deadline and looks_remote(exc):
            time.sleep(HEARTBEAT_S)
            line = self.posted_fault()
        if line is None:
            from ..runtime import first_line
            line = self.post_fault(f"rank {self.rank}: {first_line(exc) if exc is not None else 'failed'}")
        return line

    def ended(self, wait_s: float = GRACE_S) -> None:
        """This rank's process is about to end.  Rank 0 says so on the store once its line is printed; the
        other ranks wait for that (at most ``wait_s``, or until the store, which rank 0 hosts, is gone): a
        launcher that sees a rank end with an error stops the rest, and rank 0, slower to reach the same
        refusal (a rank that failed first), must not be stopped before it has said why.

        Without torchrun's agent, rank 0 hosts the store, and its exit takes the store away: a rank still on
        its way out would see "the store stopped answering" and end with another code than the run's.  So
        rank 0 then waits (at most ``wait_s``) until every other rank has said it is leaving, except one the
        posted fault names (killed: it will never say so)."""
        if self.rank == 0:
            self.mark("ended")
            if not self.env.agent_store:
                self._wait_for_others("left", wait_s)
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                if self.store.check(["ended/0"]):
                    break
            except Exception:        # noqa: BLE001 - rank 0 and its store are gone: nothing to wait for
                return
            time.sleep(0.05)
        self.mark("left")

    def _wait_for_others(self, key: str, wait_s: float) -> None:
        import re
        fault = self.posted_fault() or ""
        gone = {int(m.group(1))} if (m := re.match(r"rank (\d+): stopped without a word", fault)) else set()
        waiting = [f"{key}/{r}" for r in range(1, self.world) if r not in gone]
        deadline = time.monotonic() + wait_s
        while waiting and time.monotonic() < deadline:
            try:
                waiting = [k for k in waiting if not self.store.check([k])]
            except Exception:        # noqa: BLE001 - our own store: nothing more to learn from it
                return
            time.sleep(0.05)

    def close(self, *, ok: bool) -> None:
        """Leave the group (after a clean run the others are told this rank is done)."""
        import torch.distributed as dist
        with self._ending:           # from here the main thread says the run's line: the watch never does
            self._finished = True
        self.mark("done" if ok else "stopped")
        self._stop.set()
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
        try:
            if ok:
                dist.destroy_process_group()
        except Exception:            # noqa: BLE001
            pass


def _killed(rank: int, silent: float) -> str:
    return (f"rank {rank}: stopped without a word (no heartbeat for {silent:.0f} s: killed, e.g. SIGKILL by the "
            "kernel's out-of-memory killer, or its machine went away)")


def looks_remote(exc) -> bool:
    """An error that says a peer went away (gloo / NCCL / the store), or our interruption."""
    if exc is None or isinstance(exc, _Interrupted) or isinstance(exc, KeyboardInterrupt):
        return True
    name = type(exc).__name__
    return "DistBackendError" in name or "DistNetworkError" in name or "DistError" in name or (
        isinstance(exc, RuntimeError) and any(w in str(exc) for w in ("Connection", "connection", "peer", "Gloo",
                                                                        "gloo", "NCCL", "Timed out", "timed out")))


_STARTED: list = []


def start(env: DistEnv, *, device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Session:
    sess = Session(env, device=device, timeout_s=timeout_s)
    _STARTED.append(sess)
    return sess


def end_process(code) -> None:
    """After a distributed run, end this rank's process with ``code`` (``SystemExit.code``) without the
    interpreter's finalization: the process group, the store and the watch's store client are native objects
    whose destructors, run at exit while the peers disconnect, can abort the process (seen once under load in
    CI: a rank that had printed its one line and was exiting 2 ended with SIGABRT).  Everything the run writes
    is closed and published by then; stdout and stderr are flushed here.  Does nothing in an ordinary run."""
    if not _STARTED:
        return
    import sys
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:            # noqa: BLE001 - a closed or replaced stream
            pass
    _STARTED[-1].ended()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


# --------------------------------------------------------------------------- messages

_DTYPES = ("float32", "float64", "int64", "float16", "bfloat16")


def send_arrays(sess: Session, dst: int, arrays, pending: list, *, limit: int = 8) -> None:
    """Send numpy arrays / tensors (up to 3-D) to ``dst`` without waiting for it to take them; at
    most ``limit`` messages stay outstanding (``pending`` holds them and their buffers)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    dev = "cuda" if sess.backend == "nccl" else "cpu"
    for a in arrays:
        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
        t = t.detach().contiguous()
        shape = list(t.shape) + [1] * (3 - t.dim())
        head = torch.tensor([t.dim(), *shape, _DTYPES.index(str(t.dtype).replace("torch.", ""))],
                            dtype=torch.int64, device=dev)
        t = t.to(dev)
        pending.append((dist.isend(head, dst), head))
        pending.append((dist.isend(t, dst), t))
    while len(pending) > 2 * limit:
        work, _ = pending.pop(0)
        work.wait()


def drain(pending: list) -> None:
    while pending:
        work, _ = pending.pop(0)
        work.wait()


def recv_arrays(sess: Session, src: int, count: int, *, tensors: bool = False) -> list:
    """``count`` arrays sent by :func:`send_arrays` from ``src``: CPU numpy arrays, or (``tensors``)
    torch tensors where they arrived (the GPU under NCCL)."""
    import torch
    import torch.distributed as dist
    dev = "cuda" if sess.backend == "nccl" else "cpu"
    out = []
    for _ in range(count):
        head = torch.empty(5, dtype=torch.int64, device=dev)
        dist.recv(head, src)
        ndim, *shape, code = [int(x) for x in head.cpu().tolist()]
        t = torch.empty(shape[:ndim], dtype=getattr(torch, _DTYPES[code]), device=dev)
        dist.recv(t, src)
        # numpy has no bfloat16: such an array arrives widened to float32 (exact)
        out.append(t if tensors else (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy())
    return out


def broadcast(obj=None):
    """Rank 0's ``obj`` on every rank."""
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj) -> list:
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
