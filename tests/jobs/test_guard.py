"""The memory guard: limits crossed on fake readings, then on a real child that allocates."""

import re
import signal
import time

import pytest

from jobs.guard import GuardLimits, Meminfo, MemoryGuard, default_floor, job_limits
from jobs.supervisor import Supervisor
from storage.config import ConfigError, load_config
from storage.queries import events, get_job, last_sample

GiB, MiB = 2**30, 2**20


class FakeMeminfo:
    """A /proc/meminfo whose MemAvailable a test sets (`available`), on a box of `total` bytes."""

    def __init__(self, total: int, available: int):
        self.total, self.available, self.reads = total, available, 0

    def __call__(self) -> Meminfo:
        self.reads += 1
        return Meminfo(self.total, self.available)


def test_the_budget_counts_from_the_jobs_start_and_the_floor_from_the_beginning():
    meminfo = FakeMeminfo(100 * GiB, 90 * GiB)
    guard = MemoryGuard(GuardLimits(budget=400 * MiB, floor=8 * GiB), lambda sig: None, read=meminfo,
                        now=lambda: 12.5, snapshot=lambda: {"stage": "load"})
    assert guard.check(Meminfo(100 * GiB, 80 * GiB)) is None  # imports before the start do not count
    guard.begin()
    assert guard.check(Meminfo(100 * GiB, 90 * GiB - 400 * MiB)) is None  # exactly the budget is allowed
    trip = guard.check(Meminfo(100 * GiB, 90 * GiB - 412 * MiB))
    assert trip.reason == "budget" and trip.at == 12.5 and trip.sample == {"stage": "load"}
    assert trip.message == "system in use grew 412.0 MiB over the job's start, budget 400.0 MiB"
    floor = guard.check(Meminfo(100 * GiB, 7 * GiB))
    assert floor.reason == "budget"  # both crossed: the budget, the user's own limit, is named
    no_budget = MemoryGuard(GuardLimits(floor=8 * GiB), lambda sig: None, read=meminfo)
    floor = no_budget.check(Meminfo(100 * GiB, 7 * GiB))
    assert floor.reason == "floor"
    assert floor.message == "MemAvailable fell to 7.00 GiB, floor 8.00 GiB (system in use grew 83.00 GiB over the job's start)"


def test_each_reading_within_limits_sends_nothing_and_the_first_crossing_sends_sigterm_once_at_its_time():
    meminfo, clock, sent = FakeMeminfo(100 * GiB, 90 * GiB), [40.0], []
    guard = MemoryGuard(GuardLimits(budget=GiB), sent.append, read=meminfo, now=lambda: clock[0])
    guard.begin()
    for _ in range(5):
        clock[0] += 0.05
        assert guard.poll() is None and guard.trip is None
    assert meminfo.reads == 1 + 1 + 5 and sent == []  # construction, begin, then one read per poll
    meminfo.available = 89 * GiB  # exactly the budget: still allowed
    assert guard.poll() is None and sent == []
    meminfo.available = 88 * GiB
    clock[0] = 41.5
    trip = guard.poll()
    assert trip is guard.trip and trip.reason == "budget" and trip.at == 41.5
    assert trip.reading == Meminfo(100 * GiB, 88 * GiB) and sent == [signal.SIGTERM]


def test_the_thread_sends_sigkill_after_the_grace_unless_the_child_ends_first():
    sent, meminfo = [], FakeMeminfo(100 * GiB, 90 * GiB)
    guard = MemoryGuard(GuardLimits(budget=GiB), sent.append, read=meminfo, interval=0.01, grace=0.2)
    guard.begin()
    meminfo.available = 88 * GiB
    guard.start()
    _wait_until(lambda: len(sent) >= 2)
    guard.stop()
    assert sent == [signal.SIGTERM, signal.SIGKILL]

    sent.clear()
    meminfo = FakeMeminfo(100 * GiB, 90 * GiB)
    stopped = MemoryGuard(GuardLimits(budget=GiB), sent.append, read=meminfo, interval=0.01, grace=60)
    stopped.begin()
    meminfo.available = 80 * GiB
    stopped.start()
    _wait_until(lambda: sent)
    stopped.stop()  # the child exited on SIGTERM: no SIGKILL follows
    assert sent == [signal.SIGTERM]


def _wait_until(condition, timeout: float = 30.0) -> None:
    """Wait for the guard's thread without assuming how fast a loaded box runs it."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the guard's thread did not get there in time"
        time.sleep(0.01)


def test_the_default_floor_applies_on_unified_memory_only_and_the_config_can_set_or_turn_it_off(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    monkeypatch.delenv("DRAINBOARD_MEMORY_FLOOR", raising=False)
    config = load_config()
    assert default_floor(24 * GiB) == 4 * GiB and default_floor(121 * GiB) == int(121 * GiB * 0.05)
    assert job_limits(None, None, config, unified=True, total=121 * GiB).floor == int(121 * GiB * 0.05)
    assert job_limits(None, None, config, unified=False, total=121 * GiB).floor is None
    assert job_limits(None, 2 * GiB, config, unified=False, total=121 * GiB).floor == 2 * GiB  # the spec wins
    (tmp_path / "drainboard.toml").write_text('memory_floor = "16GiB"\n')
    assert job_limits(None, None, load_config(), unified=False, total=121 * GiB).floor == 16 * GiB
    monkeypatch.setenv("DRAINBOARD_MEMORY_FLOOR", "off")  # the environment wins over the file
    assert job_limits(300, None, load_config(), unified=True, total=121 * GiB) == GuardLimits(budget=300)
    monkeypatch.setenv("DRAINBOARD_MEMORY_FLOOR", "lots")
    with pytest.raises(ConfigError, match="memory_floor .*'lots' is not a size"):
        job_limits(None, None, load_config(), unified=True, total=121 * GiB)


def test_a_job_over_its_memory_budget_is_stopped_by_the_guard_naming_its_last_tensor(
    db, queue_job, run_to_end, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "200")
    monkeypatch.setenv("DRAINBOARD_TEST_MIB", "8")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.03")
    job = run_to_end(queue_job("allocate", memory_budget="96MiB"), timeout=90)
    assert job["status"] == "killed", job["error"]
    last = last_sample(db, job["id"])
    assert job["error"].startswith("memory guard: system in use grew ")
    quoted = int(re.search(r", budget 96\.0 MiB, at tensor (\d+) of 200 \(`blocks\.\1\.weight`, stage load\)$",
                           job["error"]).group(1))
    assert 0 <= last["tensors_placed"] - quoted <= 2  # the sample at the trip; SIGTERM lands a step or two later
    assert last["tensors_placed"] < 200  # stopped well before the end
    guard = [e for e in events(db, job["id"]) if e["kind"] == "memory_guard"]
    assert len(guard) == 1 and guard[0]["data"]["reason"] == "budget" and guard[0]["data"]["budget"] == 96 * MiB
    assert guard[0]["data"]["growth"] > 96 * MiB and guard[0]["t"] >= last["t"] - 0.5
    assert job["metrics"]["memory_guard"]["growth"] == guard[0]["data"]["growth"]


@pytest.mark.slow
def test_on_unified_memory_the_default_floor_stops_a_job_and_elsewhere_it_does_not(
    config, db, queue_job, monkeypatch
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "60")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.05")
    meminfo = FakeMeminfo(100 * GiB, 30 * GiB)  # the default floor here is 5 GiB

    def run(job_id: int, supervisor: Supervisor) -> dict:
        deadline = time.time() + 60
        while get_job(db, job_id)["status"] not in ("succeeded", "killed", "failed"):
            assert time.time() < deadline
            sample = last_sample(db, job_id)
            if sample and sample["tensors_placed"] and sample["tensors_placed"] >= 10:
                meminfo.available = 3 * GiB  # something else fills the machine while the job runs
            supervisor.tick()
            time.sleep(0.02)
        return get_job(db, job_id)

    for unified, expected in (("1", "killed"), ("0", "succeeded")):
        monkeypatch.setenv("DRAINBOARD_UNIFIED_MEMORY", unified)
        meminfo.available = 30 * GiB
        supervisor = Supervisor(config, grace=1.0, read_meminfo=meminfo)
        supervisor.start()
        try:
            job = run(queue_job("steps"), supervisor)
        finally:
            supervisor.stop()
        assert job["status"] == expected, job["error"]
        if expected == "killed":
            assert job["error"].startswith("memory guard: MemAvailable fell to 3.00 GiB, floor 5.00 GiB")
            assert job["exit_code"] != 0
