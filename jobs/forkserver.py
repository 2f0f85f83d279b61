"""The fork server: one process that has imported what every job child imports, and forks each child.

A fresh `python -m jobs.child` pays for importing torch, the loader and the
models package on every job (seconds on a busy 2-core box). The fork server
pays once: it imports exactly what a child imports before its first sample
(`PRELOAD`), allocates nothing else, opens no database, starts no thread, and
forks each job's child on request. It then freezes what the imports left
(`gc.freeze`), so no child's garbage collector walks those objects: a full
collection of them took 153-163 ms in every child on the 2-core box. The
child is still a process of its own (its own memory baseline, an OOM kill
takes only it), and its baseline is the same as a fresh child's at its first
sample, since that child imports the same modules.

Protocol, over a SOCK_SEQPACKET socket (one JSON message each, file descriptors
passed with SCM_RIGHTS):
- supervisor -> server: `{"job_id", "env", "cgroup_procs"}` with fds [log, sample pipe];
- server -> supervisor: `{"pid"}` with fds [pidfd of the child] (a pidfd never
  names a later process that reuses the pid), later `{"exited": pid, "code": c}`
  (`code` as Popen's returncode: negative for a signal).
The server dies with its supervisor (PR_SET_PDEATHSIG), and each child with the server.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

PRELOAD = ("jobs.child", "jobs.kinds.load", "jobs.kinds.generate", "loader.api", "machine.device", "machine.offload")
"""What a job child imports before its first sample (torch, the loader, the models package)."""

ENV_SOCKET_FD = "DRAINBOARD_FORKSERVER_FD"
_MAX_MESSAGE = 1 << 20


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the supervisor closes its end."""
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.02)
        if ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
            except OSError:
                return
            if not data:
                return
            pid = _fork_child(json.loads(data), fds, sock)
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
            os.close(pidfd)
            children.add(pid)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _fork_child(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from jobs.child import main as run_child  # imported already: PRELOAD
        from jobs.samples import ENV_SAMPLE_FD
        from jobs.child_start import prepare_child

        sock.close()
        log_fd, sample_fd = fds
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[ENV_SAMPLE_FD] = str(sample_fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        prepare_child(request.get("cgroup_procs"))
        code = run_child(int(request["job_id"]))
    except BaseException:  # noqa: BLE001 - whatever happens, this process must end here, not serve
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkServerError(RuntimeError):
    """The fork server did not start or stopped answering."""


class ForkServer:
    """The supervisor's end: starts the server process (it imports in the background) and asks it for children."""

    def __init__(self, python: str, env: dict[str, str], cwd: str):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [python, "-m", "jobs.forkserver"], cwd=cwd, env={**env, ENV_SOCKET_FD: str(theirs.fileno())},
            stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._sock = ours
        self._ready = False
        self._exits: dict[int, int] = {}

    def _receive(self, timeout: float | None) -> tuple[dict, list[int]] | None:
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return None
        data, fds, _, _ = socket.recv_fds(self._sock, _MAX_MESSAGE, 1)
        if not data:
            raise ForkServerError(f"the fork server (pid {self.process.pid}) stopped")
        message = json.loads(data)
        if "exited" in message:
            self._exits[message["exited"]] = message["code"]
        elif "ready" in message:
            self._ready = True
        return message, fds

    def alive(self) -> bool:
        return self.process.poll() is None

    def stopped(self) -> str | None:
        """How the server ended (`SIGTERM`, `exit code 1`), None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"

    def spawn(self, job_id: int, env: dict[str, str], log_fd: int, sample_fd: int, cgroup_procs: str | None,
              *, timeout: float = 300.0) -> "ForkedChild":
        """Fork the child of `job_id`; waits for the server's imports the first time."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self._receive(max(0.0, deadline - time.monotonic())) is None:
                raise ForkServerError(f"the fork server did not get ready in {timeout:.0f} s")
        request = {"job_id": job_id, "env": env, "cgroup_procs": cgroup_procs}
        socket.send_fds(self._sock, [json.dumps(request).encode()], [log_fd, sample_fd])
        while True:
            received = self._receive(max(0.0, deadline - time.monotonic()))
            if received is None:
                raise ForkServerError("the fork server did not answer a fork request")
            message, fds = received
            if "pid" in message:
                return ForkedChild(self, message["pid"], fds[0])

    def exit_code(self, pid: int) -> int | None:
        """The child's exit code once the server reported it (drains what has arrived, never waits)."""
        while pid not in self._exits and self._receive(0) is not None:
            pass
        return self._exits.pop(pid, None)

    def close(self) -> None:
        self._sock.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedChild:
    """A job child forked by the server, with the part of `subprocess.Popen` the supervisor uses."""

    def __init__(self, server: ForkServer, pid: int, pidfd: int):
        self._server = server
        self.pid = pid
        self._pidfd = pidfd
        self._lock = threading.Lock()  # the memory guard signals from its own thread
        self.returncode: int | None = None
        self.server_stopped: str | None = None
        """How the fork server ended (`SIGTERM`), when the child died with it (SIGKILL, PR_SET_PDEATHSIG)."""

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                code = self._server.exit_code(self.pid)
            except (ForkServerError, OSError):
                code = None
            if code is None and not self._server.alive():  # it died with the server
                code, self.server_stopped = -signal.SIGKILL, self._server.stopped()
            if code is not None:
                with self._lock:
                    self.returncode = code
                    os.close(self._pidfd)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the child through its pidfd (never a later process with the same pid); a no-op once it ended."""
        with self._lock:
            if self.returncode is None:
                try:
                    signal.pidfd_send_signal(self._pidfd, sig)
                except ProcessLookupError:
                    pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        from machine.lifetime import wait_polling

        return wait_polling(self.poll, timeout, "job child", 0.01)


def main() -> None:
    import importlib

    from machine.lifetime import die_with_parent
    from loader.process import configure_process

    die_with_parent()  # and each child dies with this server
    configure_process()  # before the imports; each forked child inherits it
    sock = socket.socket(fileno=int(os.environ.pop(ENV_SOCKET_FD)))
    for module in PRELOAD:
        importlib.import_module(module)
    gc.collect()  # what the imports left as garbage is freed, not frozen
    gc.freeze()
    sock.send(json.dumps({"ready": True}).encode())
    serve(sock)


if __name__ == "__main__":
    main()
