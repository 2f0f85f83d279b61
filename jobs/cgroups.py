"""Per-job memory limits through a memory cgroup, so a user can see what a smaller box would do.

cgroup v1: a child group under this process's own memory group, with
`memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap is
accounted); an OOM kill shows in `memory.oom_control`'s `oom_kill` count.
cgroup v2: a child group with `memory.max` (and `memory.swap.max` 0); the kill
shows in `memory.events`' `oom_kill`. Where neither can be created, the option
is refused with the reason.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from core.errors import DrainboardError

CGROUP_ROOT = Path("/sys/fs/cgroup")
JOB_GROUP = re.compile(r"drainboard-job-(\d+)-(\d+)")
"""Name of a job's group: `drainboard-job-<job id>-<supervisor pid>`."""


def job_cgroup_name(job_id: int, supervisor_pid: int) -> str:
    return f"drainboard-job-{job_id}-{supervisor_pid}"


class CgroupError(DrainboardError):
    """A memory cgroup could not be created or configured."""


@dataclass(frozen=True)
class JobCgroup:
    """A memory cgroup holding one job's process."""

    path: Path
    """The group's folder."""
    version: int
    """1 or 2."""
    limit: int
    """Memory limit in bytes."""

    @property
    def usage_file(self) -> Path:
        """Current usage, for `MemoryProbe(cgroup_file=...)`."""
        return self.path / ("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    @property
    def procs_file(self) -> Path:
        """Write a pid here to move that process into the group."""
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer killed in this group (None where not reported)."""
        file = self.path / ("memory.oom_control" if self.version == 1 else "memory.events")
        try:
            for line in file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            return None
        return None

    def remove(self, attempts: int = 50) -> None:
        """Delete the group once its processes are gone (retries while the kernel lets go of it)."""
        _remove_group(self.path, attempts)


def _remove_group(path: Path, attempts: int = 50) -> bool:
    for _ in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


def _group_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def sweep_job_cgroups(
    recovered: Iterable[int] = (), *, supervisor_alive: Callable[[int], bool], parent: Path | None = None
) -> list[Path]:
    """Remove the job groups left behind under this process's memory group; returns those removed.

    The groups of `recovered` jobs go with whatever still runs in them (SIGKILL:
    those processes belong to a job that has ended). Any other job group goes
    when its supervisor is dead (`supervisor_alive(pid)` false) and no process
    is left in it. A group whose supervisor lives is that supervisor's to remove.
    """
    if parent is None:
        found = own_memory_group()
        if found is None:
            return []
        parent = found[1]
    recovered = set(recovered)
    removed = []
    try:
        children = [p for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return []
    for group in children:
        match = JOB_GROUP.fullmatch(group.name)
        if match is None:
            continue
        job_id, supervisor_pid = int(match.group(1)), int(match.group(2))
        if job_id in recovered:
            for pid in _group_pids(group):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        elif supervisor_alive(supervisor_pid) or _group_pids(group):
            continue
        if _remove_group(group):
            removed.append(group)
    return removed


def own_memory_group(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROUP_ROOT) -> tuple[int, Path] | None:
    """This process's memory cgroup folder and the cgroup version, or None without one."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = root / "memory" / path.lstrip("/")
            if folder.is_dir():
                return 1, folder
        if controllers == "":
            unified = path
    if unified is not None:
        base = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root
        folder = base / unified.lstrip("/")
        try:
            if "memory" in (base / "cgroup.controllers").read_text().split():
                return 2, folder
        except OSError:
            return None
    return None


def create_job_cgroup(name: str, limit: int) -> JobCgroup:
    """Create a limited memory cgroup named `name` under this process's own group.

    Raises `CgroupError` saying why when that is not possible.
    """
    found = own_memory_group()
    if found is None:
        raise CgroupError("no memory cgroup controller is mounted for this process")
    version, parent = found
    path = parent / name
    try:
        path.mkdir()
    except FileExistsError:
        pass
    except OSError as e:
        raise CgroupError(f"cannot create a memory cgroup under {parent}: {e.strerror}") from None
    group = JobCgroup(path, version, limit)
    try:
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        else:
            if not (path / "memory.max").exists():
                raise CgroupError(f"{parent} does not delegate the memory controller to its children")
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
    except OSError as e:
        group.remove()
        raise CgroupError(f"cannot set a memory limit in {path}: {e.strerror}") from None
    except CgroupError:
        group.remove()
        raise
    return group


def memory_limit_support() -> str | None:
    """None when per-job memory limits work here, otherwise the reason they do not.

    Tries for real: creates a small limited group and removes it again.
    """
    try:
        create_job_cgroup(f"drainboard-probe-{os.getpid()}", 1 << 30).remove()
    except CgroupError as e:
        return str(e)
    return None
