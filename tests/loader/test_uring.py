"""loader.uring: the ctypes io_uring read queue against real files (the kernel here allows io_uring)."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from loader import uring
from loader.uring import ReadQueue, UringUnavailable

_MiB = 1 << 20


@pytest.fixture
def data_file(tmp_path):
    data = os.urandom(6 * _MiB + 123)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _queue(depth: int) -> ReadQueue:
    try:
        return ReadQueue.open(depth)
    except UringUnavailable as exc:  # the ring tests cover the fallback; this kernel must allow it to test the queue
        pytest.fail(f"io_uring is refused on this machine: {exc}")


def test_reads_land_in_place_whatever_order_they_are_waited_for(data_file):
    fd, data = data_file
    buf = ctypes.create_string_buffer(len(data))
    base = ctypes.addressof(buf)
    with _queue(8) as q:
        step = _MiB
        ids = [q.submit(fd, at, base + at, min(step, len(data) - at)) for at in range(0, len(data), step)]
        q.flush()
        got = {i: q.wait(i) for i in reversed(ids)}
    assert sum(got.values()) == len(data)
    assert buf.raw[: len(data)] == data


def test_complete_waits_for_a_whole_batch_so_wait_needs_no_further_syscall(data_file, monkeypatch):
    fd, data = data_file
    buf = ctypes.create_string_buffer(4 * _MiB)
    with _queue(4) as q:
        ids = [q.submit(fd, i * _MiB, ctypes.addressof(buf) + i * _MiB, _MiB) for i in range(4)]
        q.complete(ids)
        monkeypatch.setattr(q, "_enter", lambda wait: pytest.fail("wait entered the kernel again"))
        assert [q.wait(i) for i in ids] == [_MiB] * 4
    assert buf.raw == data[: 4 * _MiB]


def _worker_limits(q: ReadQueue) -> tuple[int, int]:
    """What the kernel holds as the queue's worker limits: zeros change nothing and read the values back."""
    limits = (ctypes.c_uint32 * 2)(0, 0)
    uring._syscall(q._register_number, ctypes.c_uint(q._fd), ctypes.c_uint(uring._REGISTER_IOWQ_MAX_WORKERS), limits,
                   ctypes.c_uint(2))
    return limits[0], limits[1]


def test_limit_workers_caps_the_kernel_threads_and_reads_still_land(data_file):
    fd, data = data_file
    buf = ctypes.create_string_buffer(len(data))
    with _queue(8) as q:
        # the limits belong to the thread's kernel workers and outlive a queue: set two in turn
        assert q.limit_workers(5) and _worker_limits(q) == (5, 5)
        assert q.limit_workers(3) and _worker_limits(q) == (3, 3)
        ids = [q.submit(fd, at, ctypes.addressof(buf) + at, min(_MiB, len(data) - at)) for at in range(0, len(data), _MiB)]
        q.complete(ids)
        assert sum(q.wait(i) for i in ids) == len(data)
    assert buf.raw[: len(data)] == data


def test_a_read_past_the_end_of_file_is_short_not_an_error(data_file):
    fd, data = data_file
    buf = ctypes.create_string_buffer(_MiB)
    with _queue(2) as q:
        n = q.wait(q.submit(fd, len(data) - 100, ctypes.addressof(buf), _MiB, worker=False))
        assert n == 100 and buf.raw[:100] == data[-100:]
        assert q.wait(q.submit(fd, len(data) + 4096, ctypes.addressof(buf), 4096)) == 0


def test_a_failed_read_raises_its_errno_and_the_queue_stays_usable(data_file):
    fd, data = data_file
    buf = ctypes.create_string_buffer(4096)
    with _queue(2) as q:
        bad = q.submit(1 << 20, 0, ctypes.addressof(buf), 4096)  # above any descriptor this process has open
        with pytest.raises(OSError) as info:
            q.wait(bad)
        assert info.value.errno == errno.EBADF
        assert q.wait(q.submit(fd, 0, ctypes.addressof(buf), 4096)) == 4096 and buf.raw == data[:4096]


def test_the_queue_refuses_more_reads_than_its_depth_and_drain_waits_for_all(data_file):
    fd, _ = data_file
    buf = ctypes.create_string_buffer(4 * _MiB)
    q = _queue(3)
    try:
        ids = [q.submit(fd, i * _MiB, ctypes.addressof(buf) + i * _MiB, _MiB) for i in range(3)]
        with pytest.raises(RuntimeError, match="3 reads in flight"):
            q.submit(fd, 0, ctypes.addressof(buf), _MiB)
        q.drain()
        with pytest.raises(KeyError):
            q.wait(ids[0])
        assert q.wait(q.submit(fd, 0, ctypes.addressof(buf), _MiB)) == _MiB
    finally:
        q.close()
        q.close()  # a second close does nothing


def test_an_unknown_architecture_or_a_refused_setup_is_unavailable_not_a_crash(monkeypatch):
    monkeypatch.setattr(uring.platform, "machine", lambda: "sparc64")
    with pytest.raises(UringUnavailable, match="sparc64"):
        ReadQueue.open(4)
    monkeypatch.undo()

    def refuse(number, *args):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(uring, "_syscall", refuse)
    with pytest.raises(UringUnavailable, match="io_uring_setup refused: Operation not permitted"):
        ReadQueue.open(4)
