"""What a job child does to itself before the job runs, however it was started (exec'd or forked).

It joins its memory cgroup, dies with its parent (PR_SET_PDEATHSIG), and
raises its own oom_score_adj so the kernel's OOM killer picks the job before
the supervisor or the dashboard.
"""

from __future__ import annotations

import os

from machine.lifetime import die_with_parent

CHILD_OOM_SCORE_BONUS = 500
"""Added to the child's oom_score_adj so the kernel picks the job before the supervisor or dashboard."""


def prepare_child(cgroup_procs: str | None) -> None:
    """Join the cgroup whose `cgroup.procs` file is `cgroup_procs` (if any), die with the parent, be the OOM victim.

    Safe between fork and exec: no import, no allocation beyond a few small objects.
    """
    if cgroup_procs:
        with open(cgroup_procs, "w") as f:
            f.write(str(os.getpid()))
    die_with_parent()
    try:
        with open("/proc/self/oom_score_adj", "r+") as f:
            current = int(f.read())
            f.seek(0)
            f.write(str(min(1000, current + CHILD_OOM_SCORE_BONUS)))
    except OSError:
        pass
