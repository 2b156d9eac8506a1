"""``verify`` launched by torchrun: rank 0 runs the command, the other ranks serve it quietly.

``torchrun --nproc-per-node N -m ckpt_surgeon verify REF CAND --corpus FILE ...``: every rank
parses the same command line; :func:`distributed` (called first thing by ``verify``) joins the
group, checks that every rank sees the same files, plans the split (``--dist-mode``), then on
rank 0 runs the ordinary command with the distributed sources active and on the other ranks
serves rank 0's jobs with stdout and stderr silenced.  Rank 0 alone prints and writes; a fault on
any rank ends every rank with one line (``error: rank R: cause``) and exit code 2.
"""
from __future__ import annotations

import os
import sys

import click

_MODE: dict = {}
# options that run in one process only
_SINGLE_ONLY = (("runtime", "--runtime llama.cpp"), ("cache_sweep", "--cache-sweep"),
                ("cache_type_k", "--cache-type-k"), ("cache_type_v", "--cache-type-v"), ("device_map", "--device-map"))


def _remember(ctx, param, value):
    _MODE["value"] = value
    return value


dist_mode_option = click.option(
    "--dist-mode", type=click.Choice(["auto", "data", "pipeline"]), default=None, expose_value=False,
    callback=_remember,
    help="Under torchrun: data (both models on every rank; corpus chunks, or prompts, dealt over the ranks) or "
         "pipeline (layers spread); auto: data when both fit (also CKPT_SURGEON_DIST_MODE).")


def distributed(callback, params: dict, parse_size) -> bool:
    """Run ``callback(**params)`` (the verify command) as a distributed run when launched by
    torchrun; returns False for an ordinary run (or inside rank 0's own call)."""
    from ..verification.dist_env import detect
    from ..verification.dist_hook import active
    env = detect()
    if env is None or active() is not None:
        return False
    if env.rank != 0:               # quiet: rank 0 alone prints (fds too: torch's C++ side logs to fd 2 itself)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.close(quiet)
        sys.stdout = sys.stderr = open(os.devnull, "w")
    for key, flag in _SINGLE_ONLY:
        if params.get(key) and params.get(key) not in ("transformers", "auto"):
            raise click.UsageError(f"{flag} runs in one process; launch verify without torchrun for it")
    if params.get("runtime") == "auto":        # the ranks share transformers' work; llama.cpp runs in one process
        params = {**params, "runtime": "transformers"}
    from ..runtime import resolve_device
    dev = resolve_device(params.get("device") or "auto")
    mode = _MODE.get("value") or os.environ.get("CKPT_SURGEON_DIST_MODE") or "auto"
    from ..verification.dist_env import start
    sess = start(env, device=dev)
    try:
        code = _serve(sess, env, callback, params, dev, mode, parse_size)
    except BaseException:
        sess.close(ok=False)
        raise
    sess.close(ok=True)
    if env.rank != 0:               # rank 0's exit code is the run's; the others end cleanly
        raise click.exceptions.Exit(0 if code in (0, 1) else code)
    return True


def _serve(sess, env, callback, params, dev, mode, parse_size) -> int:
    import tempfile

    from ..verification.dist_run import Driver
    plan = _plan(sess, params, dev, mode, parse_size)
    with tempfile.TemporaryDirectory(prefix=f"ckpt-surgeon-rank{env.rank}-", dir=params.get("tmp_dir")) as work:
        if env.rank != 0:
            return _worker(sess, work)
        driver = Driver(sess, plan, work)
        if plan.mode == "pipeline":
            params = {**params, "stream": True}
        return _driver(sess, driver, callback, params)


def _plan(sess, params: dict, dev: str, mode: str, parse_size):
    """Every rank: the same files (one line and exit 2 otherwise), then the same plan."""
    from ..verification.dist_run import plan_run
    budget = params.get("memory_budget")
    models = [p for p in (params.get("reference"), params.get("candidate")) if p]
    if params.get("reference_file") and len(models) == 2:
        models = models[1:]
    return plan_run(sess, inputs=[params.get(k) for k in ("reference", "candidate", "corpus", "corpus_ids",
                                                           "reference_file")],
                    models=models, dtype=params.get("dtype") or "float32", ctx=int(params.get("ctx") or 512),
                    memory_budget=parse_size(budget, "--memory-budget") if budget else None, device=dev, mode=mode,
                    one_at_a_time=bool(params.get("save_reference") or params.get("reference_file")))


def _driver(sess, driver, callback, params) -> int:
    from ..errors import CkptError, VerificationFailed
    from ..verification.dist_env import DistributedFault
    from ..verification.dist_hook import driving
    try:
        with driving(driver):
            callback(**params)
    except VerificationFailed:
        driver.finish(1)
        raise
    except DistributedFault:
        raise
    except CkptError as e:
        if driver.jobs == 0 and not sess.fault_seen.is_set():
            driver.finish(2)             # nothing is running elsewhere: the others just end
        else:
            sess.post_fault(f"rank 0: {e}")
        raise
    except (click.exceptions.ClickException, click.exceptions.Exit):
        driver.finish(2)
        raise
    except BaseException as e:         # a peer went away, the watch interrupted us, SIGTERM, a bug of ours
        raise DistributedFault(sess.fault_line(e)) from None
    driver.finish(0)
    return 0


def _worker(sess, work: str) -> int:
    from ..runtime import first_line
    from ..verification.dist_env import looks_remote
    from ..verification.dist_run import worker_loop
    try:
        return worker_loop(sess, work)
    except BaseException as e:        # noqa: BLE001 - one line for rank 0; this rank is quiet
        if not sess.fault_seen.is_set():
            if looks_remote(e):
                sess.fault_line(e)
            else:
                sess.post_fault(f"rank {sess.rank}: {first_line(e)}")
        return 2
