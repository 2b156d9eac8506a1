"""Run ``python -m ckpt_surgeon ...`` as a rank that is slow at a named point of a distributed run.

``CKPT_SURGEON_TEST_DELAY`` = ``after-plan-refusal:SECONDS``: the rank sleeps that long once it has
reached the run's refusal in the plan step (:func:`ckpt_surgeon.verification.dist_run.plan_run`
raised), before it unwinds.  That is the interleaving a loaded machine makes by chance: rank 0,
which hosts the store, is done first while the others are still on their way out.  The delay lives
here, on the test side, as ``tests/pause_at.py``'s pause does.

Usage: python tests/dist_delay.py ARGS...   (the arguments of ``python -m ckpt_surgeon``)
"""
from __future__ import annotations

import os
import runpy
import sys
import time

from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.verification import dist_run


def _delayed(inner, seconds: float):
    def plan_run(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        except CkptError:
            time.sleep(seconds)
            raise
    return plan_run


def main() -> None:
    point, _, seconds = os.environ.get("CKPT_SURGEON_TEST_DELAY", "").partition(":")
    if point != "after-plan-refusal":
        raise SystemExit(f"CKPT_SURGEON_TEST_DELAY: unknown point {point!r}")
    dist_run.plan_run = _delayed(dist_run.plan_run, float(seconds))
    sys.argv = ["ckpt_surgeon", *sys.argv[1:]]
    runpy.run_module("ckpt_surgeon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
