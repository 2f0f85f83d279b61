"""A real one-machine Ray cluster for the Ray backend's tests: `ray start --head --block` in its own
session, in a temporary folder, on free ports, with the smallest object store Ray takes.

`ray` missing skips the tests with a reason, unless DRAINBOARD_REQUIRE_RAY=1 (CI), where it fails them.
The cluster's processes are one process group (their own session), stopped by that group's id.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

OBJECT_STORE_BYTES = 80 * 2**20
"""Ray's object store is unused by Drainboard's jobs: the least Ray accepts keeps the box's memory."""


def require_ray() -> None:
    """Skip (or, with DRAINBOARD_REQUIRE_RAY=1, fail) when ray is not installed."""
    if importlib.util.find_spec("ray") is not None:
        return
    reason = "ray is not installed (pip install -r requirements-ray.txt)"
    if os.environ.get("DRAINBOARD_REQUIRE_RAY") == "1":
        pytest.fail(f"DRAINBOARD_REQUIRE_RAY=1 but {reason}")
    pytest.skip(reason)


_MARK = "DRAINBOARD_TEST_RAY_CLUSTER"
"""Set in the cluster's environment, so the processes it started are found by it, job drivers in
sessions of their own included."""


def _started_by(folder: Path) -> list[int]:
    """Pids of live processes whose environment carries this cluster's mark."""
    mark = f"{_MARK}={folder}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """One head node with `cpus` CPUs, and a second raylet with `worker_cpus` CPUs when set (two "nodes" of one
    machine); `address` is its dashboard's (the Jobs API). `env` is added to the environment of its processes.
    `gpus`: one CUDA device per raylet (head first), each raylet seeing only its own; none by default."""

    def __init__(self, cpus: int = 2, *, worker_cpus: int | None = None, env: dict[str, str] | None = None,
                 gpus: tuple[str, ...] = ()):
        self.folder = Path(tempfile.mkdtemp(prefix="dbray-"))  # short: Ray's socket paths must fit 107 bytes
        self.cpus, self.worker_cpus, self.env, self.gpus = cpus, worker_cpus, env or {}, gpus
        self.worker: subprocess.Popen | None = None
        self.ports = {name: _free_port() for name in ("port", "dashboard-port", "ray-client-server-port",
                                                       "node-manager-port", "object-manager-port",
                                                       "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                       "runtime-env-agent-port", "metrics-export-port")}
        self.address = f"http://127.0.0.1:{self.ports['dashboard-port']}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        command = [ray, "start", "--head", "--block", f"--num-cpus={self.cpus}", f"--num-gpus={len(self.gpus[:1])}",
                   f"--temp-dir={self.folder / 't'}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                   "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1",
                   "--disable-usage-stats", *(f"--{name}={port}" for name, port in self.ports.items())]
        env = {**os.environ, "RAY_memory_monitor_refresh_ms": "0", "RAY_USAGE_STATS_ENABLED": "0",
               _MARK: str(self.folder), **self.env}
        self.log = open(self.folder / "ray-start.log", "ab")
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=self._sees(env, 0), start_new_session=True)
        self._wait(self._answers, timeout)
        if self.worker_cpus is not None:  # once the head is up: a raylet started before its GCS answers gives up
            worker_ports = {name: _free_port() for name in ("node-manager-port", "object-manager-port",
                                                            "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                            "runtime-env-agent-port", "metrics-export-port")}
            self.worker = subprocess.Popen(
                [ray, "start", "--block", f"--address=127.0.0.1:{self.ports['port']}", f"--num-cpus={self.worker_cpus}",
                 f"--num-gpus={len(self.gpus[1:2])}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                 "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                 *(f"--{name}={port}" for name, port in worker_ports.items())],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=self._sees(env, 1),
                start_new_session=True)
            self._wait(self._two_nodes, timeout)

    def _sees(self, env: dict[str, str], node: int) -> dict[str, str]:
        """`env` for raylet `node`: only its own GPU visible, when the cluster has GPUs."""
        return {**env, "CUDA_VISIBLE_DEVICES": self.gpus[node]} if self.gpus else env

    def _wait(self, ready, timeout: float) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if any(p is not None and p.poll() is not None for p in (self.process, self.worker)) \
                    or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"the Ray cluster did not come up: {(self.folder / 'ray-start.log').read_text()[-2000:]}")
            time.sleep(0.5)

    def _answers(self) -> bool:
        from ray.job_submission import JobSubmissionClient

        JobSubmissionClient(self.address).list_jobs()
        return True

    def _two_nodes(self) -> bool:
        """Whether the second raylet has joined."""
        from ray.util.state import list_nodes

        alive = [n for n in list_nodes(address=self.address, timeout=5) if str(n.state) == "ALIVE"]
        return len(alive) == 2

    def stop(self) -> None:
        """SIGKILL the cluster's process group and every process carrying its mark (a host that is gone)."""
        if self.process is None:
            return
        for process in (self.process, self.worker):
            if process is None:
                continue
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        self.worker = None
        for pid in _started_by(self.folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
        self.log.close()

    def processes(self) -> list[int]:
        """Pids of the live processes this cluster started (its raylets, workers and what they started)."""
        return _started_by(self.folder)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def running(cluster: LocalCluster):
    """`cluster` started (Ray required), closed after."""
    require_ray()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@contextmanager
def supervising(config, cluster: LocalCluster):
    """A started supervisor (so the conftest's tick_until and run_to_end) whose jobs run on `cluster`."""
    import dataclasses

    from jobs.supervisor import Supervisor

    sup = Supervisor(dataclasses.replace(config, ray_address=cluster.address), grace=1.0)
    sup.start()
    try:
        yield sup
    finally:
        sup.stop()
