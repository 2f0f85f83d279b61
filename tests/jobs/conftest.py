import os
import time

import pytest

from jobs.queue import submit
from jobs.supervisor import Supervisor
from storage.config import load_config
from storage.schema import open_database
from storage.queries import get_job
from storage.schema import FINAL_STATUSES


TINY_SAFETENSORS = (lambda header: len(header).to_bytes(8, "little") + header + bytes(4))(
    b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
)
"""A sound one-tensor checkpoint: `jobs submit` refuses, as the Run page does, what the loader would."""


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Config of a fresh data folder whose model root holds `dummy.safetensors`; test kinds enabled."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "dummy.safetensors").write_bytes(TINY_SAFETENSORS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRAINBOARD_DATA", str(data))
    monkeypatch.delenv("DRAINBOARD_MODEL_ROOTS", raising=False)
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    monkeypatch.setenv("DRAINBOARD_PLUGINS", "tests.jobs.kinds_for_tests")
    return load_config()


@pytest.fixture
def db(config):
    db = open_database(config.db_path)
    yield db
    db.conn.close()


@pytest.fixture
def supervisor(config):
    """A started in-process supervisor (children are real processes); stopped after the test."""
    sup = Supervisor(config, grace=1.0)
    sup.start()
    yield sup
    sup.stop()


@pytest.fixture
def queue_job(db, config):
    """Queues a job of `kind` on the dummy model; returns its id."""

    def queue(kind: str = "steps", **fields) -> int:
        return submit(db, {"kind": kind, "model": str(config.model_roots[0] / "dummy.safetensors"), **fields}, config)

    return queue


@pytest.fixture
def tick_until(supervisor):
    """Ticks the supervisor until `condition()` holds (fails after `timeout` seconds)."""

    def tick(condition, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while not condition():
            if time.time() > deadline:
                raise AssertionError("condition not reached in time")
            supervisor.tick()
            time.sleep(0.02)

    return tick


@pytest.fixture
def run_to_end(db, tick_until):
    """Ticks the supervisor until job `job_id` is final; returns the job row."""

    def run(job_id: int, timeout: float = 60.0) -> dict:
        tick_until(lambda: get_job(db, job_id)["status"] in FINAL_STATUSES, timeout)
        return get_job(db, job_id)

    return run


@pytest.fixture
def tiny_model(config):
    """The `tiny` random-weight MiniMax H3 checkpoint (the release's layout) at data/models/tiny."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    path = config.model_roots[0] / "tiny"
    synth_h3(path, get_profile("tiny"), seed=0)
    return path


@pytest.fixture
def launched_workers(monkeypatch):
    """`jobs submit` without --wait starts a detached worker when none is alive; a test module that submits in
    process records the request instead (`pytestmark = pytest.mark.usefixtures("launched_workers")`; a test
    that wants the real worker runs the CLI in a subprocess). Returns the configs asked for."""
    import jobs.presence

    asked = []

    def record(config, **kwargs):
        asked.append(config)
        return {"alive": True, "id": "test", "pid": os.getpid(), "heartbeat_age": 0.0, "current_job": None}

    monkeypatch.setattr(jobs.presence, "ensure_supervisor", record)
    return asked
