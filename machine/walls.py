"""A run's predicted stages against the memory walls that stop it, and the one-line fit verdict.

The one home of how "will it fit?" is checked and said: `jobs submit`'s
refusal, the Run page's fit bar and every `--plan fastest` (a job's, and
`models generate` / `models forecast` outside the queue) read these checks and
this wording. What a job needs of each wall is defined in docs/metrics.md ("A
job's memory"): its process's start-up plus what the stage holds. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.sizes import format_size


@dataclass(frozen=True)
class StageNeed:
    """What one stage of the job is predicted to hold, above the process."""

    stage: str
    """Stage name (`text_encoder`, `decode.video`, `load.transformer`)."""
    host: int
    """Host bytes."""
    device: int
    """Device bytes (0 on CPU; on unified memory the same pool as the host)."""
    file_backed: int
    """Of `host`, checkpoint pages mapped from files (reclaimable: a cgroup limit does not hold them)."""


@dataclass(frozen=True)
class WallCheck:
    """One stage's predicted peak against one wall, as the refusal line and the Run page's fit bar say it."""

    stage: str
    """The stage (`decode.video`)."""
    wall: str
    """`budget`, `available` (MemAvailable, less the floor when one is set), `limit` or `device`."""
    peak: int
    """What the wall counts of the stage, in bytes."""
    allowance: int
    """What the wall allows, in bytes (may be <= 0: already hit)."""
    label: str
    """How the line names the wall: `the 64.0 GiB budget`."""
    floor: int = 0
    """For `available`: the floor taken off MemAvailable (0 with none)."""

    @property
    def share(self) -> float:
        """peak / allowance; inf when the wall is already hit."""
        return self.peak / self.allowance if self.allowance > 0 else float("inf")

    @property
    def over(self) -> bool:
        return self.peak > self.allowance

    @property
    def line(self) -> str:
        """`decode.video would peak at 71.2 GiB, over the 64.0 GiB budget` (`under` when it fits)."""
        return f"{self.stage} would peak at {format_size(self.peak)}, {'over' if self.over else 'under'} {self.label}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line}


@dataclass(frozen=True)
class Walls:
    """The walls one run is checked against."""

    available: int
    """MemAvailable now, in bytes."""
    floor: int = 0
    """What must stay available (0: none)."""
    budget: int | None = None
    """The memory budget: growth of system in use over the job's start (None: not set)."""
    limit: int | None = None
    """A cgroup memory limit (None: not set)."""
    shared: bool = True
    """Whether host and device share one pool (a CPU, unified memory): device bytes then count on the host walls."""
    device_total: int | None = None
    """A discrete GPU's memory (None: no device wall)."""
    device_name: str = ""
    """How the device wall names the GPU."""


def wall_checks(needs: list[StageNeed], walls: Walls, startup: int, process_device: int) -> list[WallCheck]:
    """Every stage against every wall that applies, in run order: each host wall counts the job's `startup` and
    the stage, as the guard counts growth over the job's start (docs/metrics.md, "A job's memory")."""
    checks = []
    for need in needs:
        pooled = need.host + (need.device if walls.shared else 0)
        if walls.budget is not None:
            checks.append(WallCheck(need.stage, "budget", startup + pooled, walls.budget,
                                    f"the {format_size(walls.budget)} budget"))
        checks.append(WallCheck(need.stage, "available", startup + pooled, walls.available - walls.floor,
                                f"the {format_size(walls.available)} MemAvailable less the "
                                f"{format_size(walls.floor)} floor" if walls.floor
                                else f"the {format_size(walls.available)} MemAvailable", walls.floor))
        if walls.limit is not None:
            checks.append(WallCheck(need.stage, "limit", startup + need.host - need.file_backed, walls.limit,
                                    f"the {format_size(walls.limit)} memory limit (anonymous memory; file-backed "
                                    f"pages are reclaimable)"))
        if not walls.shared and walls.device_total:
            checks.append(WallCheck(need.stage, "device", need.device, walls.device_total - process_device,
                                    f"{walls.device_name}'s {format_size(walls.device_total)} less the "
                                    f"{format_size(process_device)} CUDA context"))
    return checks


def tightest(checks: list[WallCheck]) -> WallCheck | None:
    """The check nearest its wall (the first refused, when any is over)."""
    over = [c for c in checks if c.over]
    return over[0] if over else max(checks, key=lambda c: c.share, default=None)


def job_needs(checks: list[WallCheck], walls: tuple[str, ...] | None = None) -> dict[str, int]:
    """What the whole job needs of each wall in `checks` (of `walls` only, when given): its largest stage there,
    the least setting of a budget or limit under which every stage fits."""
    found: dict[str, int] = {}
    for c in checks:
        if walls is None or c.wall in walls:
            found[c.wall] = max(found.get(c.wall, 0), c.peak)
    return found


def verdict(check: WallCheck, need: int) -> str:
    """The refusal, once, for the whole job: `refused: needs 690.0 MiB, over the 230.0 MiB budget`."""
    return f"refused: needs {format_size(need)}, over {check.label}"
