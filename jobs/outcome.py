"""How a job ended, in words: the last sample, a kill's likely cause, a memory guard stop.

Only a job's parent can tell why it died (an OOM-killed process reports
nothing), so these lines are the whole report a user gets: they quote the last
sample the job recorded, which the sample pipe keeps within one tensor of where
the job was.
"""

from __future__ import annotations

from jobs.guard import GuardTrip
from core.echo import echo_name
from core.sizes import format_size


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def describe_sample(sample: dict | None, total: int | None) -> str:
    """One line quoting the last recorded sample: stage, tensor k of N, memory."""
    if sample is None:
        return "no sample was recorded"
    parts = [f"stage {sample['stage'] or 'unknown'}"]
    if sample.get("tensors_placed") is not None:
        of = f" of {total}" if total else ""
        name = f" ({echo_name(sample['tensor_name'])})" if sample.get("tensor_name") else ""
        parts.append(f"tensor {sample['tensors_placed']}{of}{name}")
    parts.append(f"VmRSS {_gib(sample['vm_rss'])}")
    parts.append(f"MemAvailable {_gib(sample['mem_available'])}")
    if sample.get("device_allocated"):
        parts.append(f"device allocated {_gib(sample['device_allocated'])}")
    if sample.get("cgroup_usage") is not None:
        parts.append(f"cgroup usage {_gib(sample['cgroup_usage'])}")
    return f"last sample at {sample['t']:.1f} s: " + ", ".join(parts)


def where(sample: dict | None, total: int | None) -> str:
    """Where the job was, short: "at tensor 31 of 48 (`blocks.7.weight`, stage load)"."""
    if sample is None:
        return "before its first sample"
    stage = f"stage {sample['stage'] or 'unknown'}"
    if sample.get("tensors_placed") is None:
        return f"in {stage}, {sample['t']:.1f} s in"
    of = f" of {total}" if total else ""
    name = f"`{echo_name(sample['tensor_name'])}`, " if sample.get("tensor_name") else ""
    return f"at tensor {sample['tensors_placed']}{of} ({name}{stage})"


def guard_error(trip: GuardTrip, total: int | None) -> str:
    """The error of a job the memory guard stopped."""
    return f"memory guard: {trip.message}, {where(trip.sample, total)}"


OUTSIDE_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""Signals that end a job only when someone sends them: a job's own stops (a cancel, the memory guard)
are told apart before a kill reason is asked for."""


def kill_reason(signal_name: str, *, limit: int | None, oom_kills: int | None) -> str:
    """Why a child died of `signal_name`, as far as its parent can tell.

    SIGKILL with the job's cgroup counting an OOM kill is the kernel; with a
    cgroup counting none it came from outside the job (a user, another tool);
    without a cgroup the kernel's OOM killer is the likely sender, not a certain one.
    SIGBUS in a job is a read of a memory-mapped file past its end: the file was truncated (or replaced
    by a shorter one) after it was mapped. SIGTERM and the like, when the job was neither cancelled nor
    stopped by its guard, came from outside the job.
    """
    if signal_name == "SIGBUS":
        return ("killed by SIGBUS: most likely a checkpoint file changed or shrank while it was being read "
                "(a mapped page past the file's new end); check that nothing rewrites the files, and load again")
    if signal_name in OUTSIDE_SIGNALS:
        return f"terminated by a signal from outside the job ({signal_name})"
    if signal_name != "SIGKILL":
        return f"killed by {signal_name}"
    if limit is not None and oom_kills:
        return (f"killed (SIGKILL) by the kernel OOM killer in the job's memory cgroup: limit {format_size(limit)} "
                f"reached (cgroup oom_kill count {oom_kills})")
    if limit is not None and oom_kills == 0:
        return f"killed by SIGKILL from outside the job (its memory cgroup, limit {format_size(limit)}, counted no OOM kill)"
    return "killed (SIGKILL), most likely by the kernel OOM killer"
