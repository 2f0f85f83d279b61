"""Job kinds the job tests register through DRAINBOARD_KIND_MODULES (so the job child finds them too).

They take their knobs from the environment the supervisor passes on:
DRAINBOARD_TEST_STEPS (default 5) and DRAINBOARD_TEST_DELAY seconds per step (default 0).
"""

import os
import time

from jobs.kinds import job_kind


@job_kind("steps")
def run_steps(spec, ctx):
    """Record one sample per step, like a load records one per tensor; returns the step count."""
    total = int(os.environ.get("DRAINBOARD_TEST_STEPS", "5"))
    delay = float(os.environ.get("DRAINBOARD_TEST_DELAY", "0"))
    with ctx.stage("load"):
        for step in range(1, total + 1):
            ctx.progress(step, total)
            ctx.record(tensors_placed=step, bytes_placed=step * 1024, tensor_name=f"blocks.{step}.weight")
            time.sleep(delay)
    return {"steps": total}


@job_kind("fail")
def run_fail(spec, ctx):
    """Raise the way a bad checkpoint does."""
    with ctx.stage("load"):
        ctx.record(tensors_placed=0)
        raise ValueError("blocks.3.weight: expected shape (4, 4), got (4, 5)")
