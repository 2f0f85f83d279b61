"""One generate over N local ranks (`--parallel N`): start them, follow what each reports, end them all.

The parent checks the request and the devices, writes it to a folder as
JSON, and starts N processes of this module (`python -m models.parallel.launch
FOLDER RANK`), rendezvousing over torch.distributed on a free local port
(NCCL on GPUs, one each; gloo on CPU). Each rank runs `run_generate` with
its `RankGroup` (`models.parallel.rank`: the DiT on every rank under
diffusers' context parallelism, the text encoder and VAEs on rank 0, which
writes the MP4) and writes its events and memory samples as JSON lines to
`rank-R.jsonl`, its result or its one-line error to a file of its own. The
parent replays the lines as they come, tagged by rank, and watches the
processes: the first rank to die ends the run, the others are stopped
(SIGTERM, then SIGKILL), and the error names the rank, how it ended, its
stage and step, and its last sample. Each rank dies with the parent
(PR_SET_PDEATHSIG), so a killed job leaves none running.

Where the ranks run is a `RankLauncher`'s: `LocalRanks` (the default) starts
them here; another (the Ray backend's, `jobs.backends.ray_ranks`) starts the
same command with the same environment on other machines and copies each
rank's files back into the folder as they grow, so the following, the
failure line and the result above are the same wherever the ranks ran.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from core.errors import DeviceError, DrainboardError
from loader.process import configure_process
from loader.sharded.launch import NCCL_ENV, RankLineFollower
from machine.memory import MemorySample
from machine.offload import OffloadDecision, OffloadSettings

from ..forecast import packed_rows
from ..request.params import GenerateParams, GenerateParamsError, ModelSpec, split_problem, validate_params
from ..run.results import GenerateResult, PipelineEvent

RankEventSink = Callable[[int, PipelineEvent], None]
"""Called in the parent with (rank, event) for every event a rank reported."""
RankSampleSink = Callable[[int, str, MemorySample], None]
"""Called in the parent with (rank, stage, sample) for every memory sample a rank took."""

STOP_GRACE_S = 10.0
"""Seconds the other ranks get to end on SIGTERM before SIGKILL, once one has died or the run is cancelled."""


PARENT_ENV = "DRAINBOARD_RANKS_PARENT"
"""The pid of the process that started the ranks: a rank whose parent is another one by the time it can ask to die
with it (PR_SET_PDEATHSIG) exits at once."""


class ParallelRunError(DrainboardError):
    """A rank of a parallel generate failed or died; the message names it, its stage and its last sample."""


def parallel_problem(device: str, ranks: int) -> str | None:
    """Why `ranks` local ranks cannot run on `device` here, in one line; None when they can."""
    kind = device.split(":")[0]
    if kind == "cuda":
        count = torch.cuda.device_count()
        return None if count >= ranks else f"--parallel {ranks} needs {ranks} CUDA devices; this machine has {count}"
    if kind == "cpu":
        # diffusers 0.42.1's enable_parallelism places rank r on `rank % torch.accelerator.device_count()` of the
        # accelerator's type: with no accelerator that divides by zero, with a GPU its mesh would not be the CPU's.
        if torch.accelerator.current_accelerator() is None and torch.accelerator.device_count() > 0:
            return None
        return (f"--parallel {ranks} on cpu: diffusers' context parallelism (enable_parallelism) needs an"
                " accelerator (it places each rank on one); use --device cuda with a GPU per rank")
    return f"--parallel runs on cuda (one GPU per rank), not {device}"


class RankProcess(Protocol):
    """One running rank as the parent watches it: `subprocess.Popen`'s calls (a remote rank answers them too)."""

    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class RankLauncher(Protocol):
    """Starts a run's ranks: each runs `rank_command` with `rank_environment`; its files end up in `folder`."""

    def start(self, folder: Path, request: dict, world: int) -> Sequence[RankProcess]:
        """Start `world` ranks of `request` (already in `folder/request.json`)."""

    def close(self) -> None:
        """Release what the ranks held, once every one has ended (or was stopped)."""


def rank_command(folder: str | os.PathLike, rank: int) -> list[str]:
    """The command of one rank: this module, its folder and its rank."""
    return [sys.executable, "-m", __name__, str(folder), str(rank)]


def rank_environment(base: Mapping[str, str], *, rank: int, world: int, local_rank: int, local_world: int,
                     master: tuple[str, int], device: str, parent: int) -> dict[str, str]:
    """One rank's environment, torchrun's names: `base` with NVLink multicast off unless it says otherwise, rank 0's
    address and port, RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (the local rank is the rank's GPU among the
    node's visible ones), the parent's pid, and this checkout importable."""
    env = {**NCCL_ENV, **base, "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]), "RANK": str(rank),
           "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world),
           PARENT_ENV: str(parent)}
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // local_world)))
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding `models/`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, *env.get("PYTHONPATH", "").split(os.pathsep)) if p)
    return env


class LocalRanks:
    """Every rank a process of this machine, one GPU each (or the CPU), rendezvousing on a free local port."""

    def start(self, folder: Path, request: dict, world: int) -> list[subprocess.Popen]:
        """Raises DeviceError, starting none, when this machine cannot run them (`parallel_problem`)."""
        problem = parallel_problem(request["device"], world)
        if problem is not None:
            raise DeviceError(problem)
        master = ("127.0.0.1", free_port("127.0.0.1"))
        return [subprocess.Popen(rank_command(folder, rank), stdout=2, env=rank_environment(
                    os.environ, rank=rank, world=world, local_rank=rank, local_world=world, master=master,
                    device=request["device"], parent=os.getpid()))
                for rank in range(world)]

    def close(self) -> None:
        pass


@dataclass
class _RankWatch:
    """What the parent last heard from one rank."""

    stage: str = "start-up"
    step: str = ""
    sample: MemorySample | None = None
    stage_peaks: dict[str, int] = field(default_factory=dict)


def run_parallel_generate(
    model_dir: str | os.PathLike,
    params: GenerateParams,
    out_path: str | os.PathLike,
    *,
    device: str = "cuda",
    dtype: torch.dtype | None = None,
    mode: str = "stream",
    offload: OffloadSettings = OffloadSettings(),
    decided: list[OffloadDecision] | None = None,
    sequential_components: bool | None = None,
    on_event: RankEventSink | None = None,
    on_sample: RankSampleSink | None = None,
    sample_interval: float = 0.1,
    roots: list[str | os.PathLike] | None = None,
    video_extra: Mapping[str, Any] | None = None,
    poll_seconds: float = 0.1,
    launcher: RankLauncher | None = None,
) -> GenerateResult:
    """Run `params` (its `parallel` ranks) as `models.run_generate` would, over ranks that `launcher` starts (this
    machine's, `LocalRanks`, by default); rank 0 writes `out_path`.

    Raises GenerateParamsError for parameters the model cannot take (a packed sequence the ranks cannot split evenly
    among them), the launcher's DeviceError before starting any rank when they cannot run where it puts them, and
    ParallelRunError naming the first rank that failed or died.
    """
    world = params.parallel
    launcher = launcher or LocalRanks()
    validate_params(params, ModelSpec.read(model_dir))
    rows = split_problem(packed_rows(model_dir, params), world)
    if rows is not None:
        raise GenerateParamsError({"parallel": rows})
    request = {
        "model_dir": str(model_dir), "params": params.to_dict(), "out_path": str(out_path),
        "device": device.split(":")[0], "dtype": str(dtype or torch.bfloat16).removeprefix("torch."), "mode": mode,
        "offload": offload.to_dict(), "decided": None if decided is None else [d.to_dict() for d in decided],
        "sequential": sequential_components, "sample_interval": sample_interval,
        "roots": None if roots is None else [str(r) for r in roots], "video_extra": dict(video_extra or {}),
    }
    with tempfile.TemporaryDirectory(prefix="drainboard-parallel-") as tmp:
        folder = Path(tmp)
        (folder / "request.json").write_text(json.dumps(request))
        watches = [_RankWatch() for _ in range(world)]
        follower = RankLineFollower([folder / f"rank-{r}.jsonl" for r in range(world)],
                                    _replay(watches, on_event, on_sample))
        try:
            procs = launcher.start(folder, request, world)
            try:
                failed = _watch(procs, follower, poll_seconds)
            finally:
                _stop_all(procs)
        finally:
            launcher.close()
        follower.poll()
        if failed is not None:
            raise ParallelRunError(_failure(folder, failed, procs[failed].returncode, watches[failed], world))
        return _result(folder, world, watches)


def _replay(watches: list[_RankWatch], on_event: RankEventSink | None, on_sample: RankSampleSink | None):
    def replay(rank: int, line: dict) -> None:
        watch = watches[rank]
        if "sample" in line:
            watch.sample = MemorySample(**line["sample"])
            if on_sample is not None:
                on_sample(rank, line["stage"], watch.sample)
            return
        event = PipelineEvent(**line["event"])
        if event.kind == "stage_start":
            watch.stage, watch.step = event.stage, ""
        elif event.kind == "step":
            watch.step = f", step {event.data.get('step')} of {event.data.get('steps')}"
        if on_event is not None:
            on_event(rank, event)

    return replay


def free_port(host: str) -> int:
    """A port free on `host` now: a rendezvous for the ranks (rank 0's; "" binds every interface of its node)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _watch(procs: Sequence[RankProcess], follower: RankLineFollower, poll_seconds: float) -> int | None:
    """Follow the ranks until all end well (None) or one ends badly: that rank (one killed by a signal first, as the
    others then fail on its broken connections; else the lowest)."""
    while True:
        follower.poll()
        codes = [p.poll() for p in procs]
        bad = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if bad:
            return min(bad, key=lambda r: (codes[r] >= 0, r))
        if all(code == 0 for code in codes):
            return None
        time.sleep(poll_seconds)


def _stop_all(procs: Sequence[RankProcess]) -> None:
    """SIGTERM every rank still running, then SIGKILL what is left after the grace: none outlives the run."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in running:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _failure(folder: Path, rank: int, code: int, watch: _RankWatch, world: int) -> str:
    """One line: which rank, how it ended, where it was, its last sample (and its own error, when it wrote one)."""
    error_file = folder / f"rank-{rank}.error.json"
    if error_file.exists():
        how = f"failed: {json.loads(error_file.read_text())['error']}"
    elif code < 0:
        how = f"was killed ({signal.Signals(-code).name})"
    else:
        how = f"exited with status {code}"
    where = f"in stage {watch.stage}{watch.step}"
    last = "no sample yet" if watch.sample is None else (
        f"its last sample: RSS {watch.sample.vm_rss / 2**20:.0f} MiB, device"
        f" {watch.sample.device_allocated / 2**20:.0f} MiB allocated")
    return f"rank {rank} of {world} {how} ({where}; {last}); the other ranks were stopped"


def _result(folder: Path, world: int, watches: list[_RankWatch]) -> GenerateResult:
    """Rank 0's result, with every rank's stage seconds and peaks beside it."""
    results = [json.loads((folder / f"rank-{r}.result.json").read_text()) for r in range(world)]
    result = GenerateResult(**results[0])
    result.ranks = [{"rank": r, "stage_seconds": d["stage_seconds"], "stage_peaks": d["stage_peaks"],
                     "peak": max(d["stage_peaks"].values(), default=0)} for r, d in enumerate(results)]
    return result


class _Lines:
    """A rank's `rank-R.jsonl`: one JSON object a line, written whole (the sampler's thread and the run's share it)."""

    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, obj: dict) -> None:
        line = json.dumps(obj) + "\n"
        with self._lock:
            self._file.write(line)

    def close(self) -> None:
        self._file.close()


def rank_main(folder: Path, rank: int) -> int:
    """One rank: join the group, run the request with this rank's `RankGroup`, write the result or the error."""
    from machine.lifetime import die_with_parent

    die_with_parent()
    if os.getppid() != int(os.environ[PARENT_ENV]):
        return 1  # the parent died while this rank imported torch, before it could ask to follow it
    import torch.distributed as dist

    from .rank import RankGroup
    from ..run.pipeline import run_generate

    request = json.loads((folder / "request.json").read_text())
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])  # its GPU among this node's visible ones
    device = torch.device("cuda", local) if request["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    configure_process(str(device))  # a rank is a process's start: its settings before anything runs
    group = RankGroup(rank, world, device)
    lines = _Lines(folder / f"rank-{rank}.jsonl")
    try:
        dist.init_process_group(group.backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
        result = run_generate(
            request["model_dir"], GenerateParams(**request["params"]),
            folder / request["out_path"] if rank == 0 else folder / f"rank-{rank}.unused.mp4",
            device=str(device), dtype=getattr(torch, request["dtype"]), mode=request["mode"],
            offload=OffloadSettings.from_dict(request["offload"]),
            decided=None if request["decided"] is None else [OffloadDecision(**d) for d in request["decided"]],
            sequential_components=request["sequential"],
            on_event=lambda e: lines.write({"event": {"kind": e.kind, "stage": e.stage, "message": e.message,
                                                      "data": e.data}}),
            on_sample=lambda stage, s: lines.write({"stage": stage, "sample": s.to_dict()}),
            sample_interval=request["sample_interval"], roots=request["roots"],
            video_extra=request["video_extra"] or None, group=group)
        (folder / f"rank-{rank}.result.json").write_text(json.dumps(result.to_dict()))
        return 0
    except Exception as e:
        message = str(e) if isinstance(e, DrainboardError) else f"{type(e).__name__}: {e}"
        (folder / f"rank-{rank}.error.json").write_text(json.dumps({"error": (message.splitlines() or [""])[0][:2000]}))
        raise
    finally:
        lines.close()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    from machine.lifetime import exit_rank

    exit_rank(lambda: rank_main(Path(sys.argv[1]), int(sys.argv[2])))
