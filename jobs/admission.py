"""Refuse at submit a job whose forecast cannot fit, before any byte of the checkpoint is read.

What a job needs of each wall is defined once, in docs/metrics.md ("A job's
memory"): its process's start-up (what system in use grows by from the job's
start to its first weight, learned from this machine's past jobs:
`models.forecast.process_size`) plus what the stage holds. The memory guard's budget
counts exactly that growth, so "fits" here is "not stopped by the guard" there.
The forecast, the job kind's own (`JobKind.forecast`: a generate's per stage,
`models.forecast_generate`; a load's, `loader.forecast_load`), is checked
against every wall that applies:

- the memory budget: growth of system in use over the job's start (host memory;
  host + device on unified memory, where CUDA allocations count too);
- the MemAvailable floor: what is available now, less the floor, must hold the
  job's growth (with no floor the wall is MemAvailable itself);
- the memory limit, a cgroup limit: it charges file-backed pages too, but those
  are reclaimable, so it is compared with anonymous memory only (the start-up,
  weights, activations and outputs; not a load's mapped checkpoint pages);
- the device's pool on a discrete GPU: its memory less the CUDA context.

A wall's need is the job's largest stage there (`needs`); a refusal names it
once, for the wall over which it is: `refused: needs 690.0 MiB, over the 230.0
MiB budget`; the CLI and the Run page each add their own remedy (`remedy`).
Without history the start-up is unknown: the stages alone are checked, and the
verdict says so rather than "fits". `forced` queues a refused job anyway and the
spec keeps the line. The forecast (and a generate's ETA, from this machine's
history) is stored on the spec so the Job page can show time left, predicted vs
measured, and the limit a retry needs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import sqlite_utils

from jobs.spec import JobSpec
from machine.device import DeviceInfo, probe_device
from core.errors import DrainboardError
from machine.walls import StageNeed, WallCheck, Walls, job_needs, tightest, verdict
from machine.walls import wall_checks as machine_wall_checks
from storage.config import Config

GiB = 2**30


class JobRefused(DrainboardError):
    """The forecast says the job cannot fit; nothing was queued. `admission` has the numbers, for a page to say
    it in its own words (None for a plan that found nothing to fit)."""

    def __init__(self, message: str, admission: "Admission | None" = None):
        super().__init__(message)
        self.admission = admission


@dataclass(frozen=True)
class KindForecast:
    """What a job kind forecasts for the submit check (`JobKind.forecast`)."""

    stages: list[StageNeed]
    """Per stage, in run order."""
    process_host: int = 0
    """Host bytes the job's process holds beyond its learned start-up (CUDA's libraries, a decoded clip)."""
    process_device: int = 0
    """Device bytes the process holds (the CUDA context)."""
    eta: list[dict[str, Any]] = field(default_factory=list)
    """Seconds per stage (`models.forecast.eta.StageEta` dicts), from this machine's history."""
    work: dict[str, float] = field(default_factory=dict)
    """Work per stage (what history records)."""
    not_counted: list[str] = field(default_factory=list)
    """What the forecast cannot know and leaves out, each in one line (a compile's workspace:
    `models.forecast.lever_memory_unknown`)."""


@dataclass(frozen=True)
class Admission:
    """The verdict on one spec."""

    stages: list[StageNeed]
    """Per stage, in run order."""
    startup: int | None
    """What the budget counts of the job's process: its start-up (learned) plus what the forecast adds to the
    process (CUDA's libraries, a clip); None without history (then the walls count only what the forecast adds)."""
    process: dict[str, Any]
    """The learned process (`models.forecast.process_size.ProcessEstimate` dict: ready_bytes, startup_bytes, basis)."""
    process_device: int
    """The CUDA context."""
    refusal: str | None
    """The one line, or None when every stage fits."""
    eta: list[dict[str, Any]]
    """A generate's seconds per stage (`models.forecast.eta.StageEta` dicts); empty for a load."""
    work: dict[str, float]
    """A generate's work per stage (what history records), empty for a load."""
    device: str
    """`models.forecast.eta.device_key` of the device the forecast is for."""
    tightest: WallCheck | None = None
    """The stage and wall nearest each other (the refused one when refused): what the Run page's fit bar draws."""
    needs: dict[str, int] | None = None
    """What the whole job needs of each wall it is checked against, and of `budget` and `limit` whether set or
    not (what a retry's limit is told): its largest stage there."""
    job_peak: int | None = None
    """The whole job's peak as its VmRSS (plus device memory) would show it; None without history."""
    not_counted: list[str] = field(default_factory=list)
    """The forecast's `KindForecast.not_counted`: said beside the verdict, which does not include them."""

    @property
    def need(self) -> int | None:
        """What the job needs of its tightest wall."""
        return self.needs.get(self.tightest.wall) if self.needs and self.tightest else None

    def to_dict(self) -> dict[str, Any]:
        found = {**asdict(self), "peak_bytes": max((s.host + s.device for s in self.stages), default=0)}
        return found | {"tightest": self.tightest.to_dict() if self.tightest is not None else None,
                        "need": self.need}


Probe = Callable[[str], DeviceInfo]


def assess(spec: JobSpec, config: Config, db: sqlite_utils.Database | None = None, *, probe: Probe = probe_device,
           available: int | None = None, total: int | None = None) -> Admission | None:
    """The forecast of `spec` against its walls; None for a kind without a forecast or a checkpoint it
    cannot read (build_spec lets those through for the job to name the file). `available` and
    `total` (MemAvailable, MemTotal) default to a reading now."""
    from jobs.guard import read_meminfo
    from models.forecast.eta import device_key

    info = probe(spec.device)
    try:
        forecast = spec.job_kind.forecast(spec, info, db)
    except (DrainboardError, ValueError, OSError):
        return None  # a checkpoint the forecast cannot read: the job itself reports it, naming the file
    if forecast is None:
        return None
    needs, extra_host, process_device = forecast.stages, forecast.process_host, forecast.process_device
    device = device_key(info.kind, info.name)
    process = learned_process(spec.kind, device, db)
    # Without history, what the forecast adds still counts; a parallel generate is its child and N ranks, each a
    # process that starts as the child does.
    counted = (process.startup_bytes or 0) * processes(spec) + extra_host
    startup = counted if process.known else None
    if available is None or total is None:
        reading = read_meminfo()
        available = reading.available if available is None else available
        total = reading.total if total is None else total
    checks = wall_checks(spec, config, info, needs, counted, process_device, available, total)
    nearest = tightest(checks)
    wall_needs = job_needs(checks) | job_needs(wall_checks(replace(spec, memory_budget=MAX_WALL,
                                                                   memory_limit=MAX_WALL),
                                                           config, info, needs, counted, process_device,
                                                           available, total), ("budget", "limit"))
    refusal = verdict(nearest, wall_needs[nearest.wall]) if nearest is not None and nearest.over else None
    peak = max((n.host + n.device for n in needs), default=0)
    whole = None if process.ready_bytes is None else process.ready_bytes + extra_host + process_device + peak
    return Admission(needs, startup, process.to_dict(), process_device, refusal, forecast.eta, forecast.work, device,
                     nearest, wall_needs, whole, list(forecast.not_counted))


def learned_process(kind: str, device: str, db: sqlite_utils.Database | None):
    """The process of a `kind` job on `device`, from this machine's past jobs (`models.forecast.process_size`)."""
    from jobs.history import process_records
    from models.forecast.process_size import estimate_process

    return estimate_process(process_records(db, kind) if db is not None else [], kind, device)


MAX_WALL = 2**62
"""A wall no job reaches: what `assess` sets to learn what a budget or limit the user left unset would count."""


REMEDIES = {
    "budget": ("set the budget to at least that", "pass --memory-budget {need} or more"),
    "limit": ("set the limit to at least that", "pass --memory-limit {need} or more"),
    "available": ("free memory first (the System page lists what holds it)", "free memory first"),
    "device": ("offload more of it to the host, or quantize the transformer", "offload more of it (--offload), or "
               "--quantize"),
}
"""Per wall, what to do about a refusal: in the Run page's words, then the CLI's."""


def remedy(wall: str, need: int, *, cli: bool) -> str:
    """What a refused job's user can do, in the Run page's words or the CLI's (`needs ...: <this>`)."""
    page, command = REMEDIES[wall]
    if cli:
        return command.format(need=f"{-(-need // 2**20)}MiB") + ", or --force"
    return page + ", or tick *Queue anyway*"


def admit(spec: JobSpec, config: Config, db: sqlite_utils.Database | None = None, **kwargs) -> JobSpec:
    """`spec` with its forecast attached, or JobRefused (one line) when it cannot fit and is not forced. The kind
    prepares the spec first (`JobKind.prepare`: a generate with `plan` runs as its plan chooses, and one whose
    plan finds nothing that fits is refused with the plan's line)."""
    spec = spec.job_kind.prepare(spec, config, db, **kwargs)
    admission = assess(spec, config, db, **kwargs)
    if admission is None:
        return spec
    if admission.refusal is not None and not spec.forced:
        raise JobRefused(f"{admission.refusal}: {remedy(admission.tightest.wall, admission.need, cli=True)}",
                         admission)
    return replace(spec, forecast=admission.to_dict())


def processes(spec: JobSpec) -> int:
    """The processes a job runs on its fullest host: its child, and its ranks too when it runs several
    (`JobKind.ranks`: a parallel generate's; `JobKind.ranks_per_host` of them when they are spread, one per node)."""
    if spec.job_kind.ranks(spec) < 2:
        return 1
    return 1 + spec.job_kind.ranks_per_host(spec)


def wall_checks(spec: JobSpec, config: Config, info: DeviceInfo, needs: list[StageNeed], startup: int,
                process_device: int, available: int, total: int) -> list[WallCheck]:
    """Every stage of `spec` against every wall that applies to it (`machine.walls.wall_checks`): its budget and
    floor (the configured floor when it sets none), its memory limit, MemAvailable and a discrete GPU's memory."""
    from jobs.guard import job_limits

    limits = job_limits(spec.memory_budget, spec.memory_floor, config, unified=info.unified_memory, total=total)
    walls = Walls(available, limits.floor or 0, limits.budget, spec.memory_limit,
                  info.kind == "cpu" or info.unified_memory, info.total_memory, info.name)
    return machine_wall_checks(needs, walls, startup, process_device)


def _first_refusal(spec: JobSpec, config: Config, info: DeviceInfo, needs: list[StageNeed], startup: int,
                   process_device: int, available: int, total: int) -> str | None:
    checks = wall_checks(spec, config, info, needs, startup, process_device, available, total)
    over = next((c for c in checks if c.over), None)
    return None if over is None else verdict(over, job_needs(checks)[over.wall])


