"""`python -m jobs.daemon ARGS...`: start `python -m jobs ARGS...` detached, print its pid, and exit.

The dashboard and `submit --wait` start a worker that must outlive them, and
must never become their zombie when it exits: this launcher forks, the
grandchild takes its own session and becomes the worker, and the launcher
exits at once, so its caller reaps it right away and the worker's parent is
init (or the nearest subreaper), which reaps the worker in turn. The worker's
pid is the one line on stdout; the worker's own output goes to stderr.
The callers pass `--exit-when-idle`, so such a worker ends when nobody is
left to use it (`jobs.supervisor`).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        os._exit(0)
    os.setsid()
    os.dup2(2, 1)  # the worker writes to the log its caller gave as stderr, never to the pid pipe
    os.execv(sys.executable, [sys.executable, "-m", "jobs", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
