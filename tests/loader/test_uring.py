"""loader.io.uring: the ctypes io_uring read queue against real files (the kernel here allows io_uring)."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from loader.io import uring
from loader.io.uring import ReadQueue, ReadsUnsettled, UringUnavailable

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


@pytest.fixture
def pipe():
    """A pipe whose read end holds a read in flight until the test writes to it."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def _cq_state(q: ReadQueue) -> tuple[int, int]:
    return uring._U32.unpack_from(q._cq, q._cq_head)[0], uring._U32.unpack_from(q._cq, q._cq_tail)[0]


@pytest.fixture
def quiet_alarm():
    """SIGALRM with a handler that returns (as any process with its own handler has), restored afterwards."""
    import signal

    seen = []
    old = signal.signal(signal.SIGALRM, lambda *a: seen.append(1))
    yield seen
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def test_a_signal_after_one_completion_consumes_only_what_was_posted(data_file, pipe, quiet_alarm):
    """The issue's reproduction: one read completes, the other waits on a pipe, SIGALRM cuts the wait
    short. The old queue consumed two entries (one a stale slot) and moved its head past the tail."""
    import signal
    import threading

    fd, data = data_file
    r, w = pipe
    buf = ctypes.create_string_buffer(8192)
    with _queue(4) as q:
        on_pipe = q.submit(r, 0, ctypes.addressof(buf), 4096, worker=False)
        from_file = q.submit(fd, 0, ctypes.addressof(buf) + 4096, 4096)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        writer = threading.Timer(0.6, os.write, (w, b"p" * 4096))
        writer.start()
        q.complete([on_pipe, from_file])
        writer.join()
        assert quiet_alarm, "the alarm never fired during the wait"
        head, tail = _cq_state(q)
        assert head == tail and q.in_flight == 0
        assert q.wait(from_file) == 4096 and q.wait(on_pipe) == 4096
        assert buf.raw == b"p" * 4096 + data[:4096]
        assert q._done == {}


def test_every_byte_lands_while_a_timer_signals_every_millisecond(data_file, quiet_alarm):
    """Many small reads, waited for one at a time and in batches, under a 1 ms interval timer."""
    import signal

    fd, data = data_file
    buf = ctypes.create_string_buffer(len(data))
    base, step = ctypes.addressof(buf), 64 << 10
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    with _queue(16) as q:
        for rounds in range(20):
            ctypes.memset(buf, 0, len(data))
            starts = list(range(0, len(data), step))
            for at in range(0, len(starts), 16):
                ids = [q.submit(fd, s, base + s, min(step, len(data) - s)) for s in starts[at : at + 16]]
                if rounds % 2:
                    q.complete(ids)
                assert sum(q.wait(i) for i in ids) == sum(min(step, len(data) - s) for s in starts[at : at + 16])
            assert buf.raw[: len(data)] == data, f"round {rounds}"
    signal.setitimer(signal.ITIMER_REAL, 0)
    assert len(quiet_alarm) > 5


def test_waiting_for_an_id_not_in_flight_is_an_error_not_a_hang(data_file):
    fd, _ = data_file
    buf = ctypes.create_string_buffer(4096)
    with _queue(2) as q:
        with pytest.raises(KeyError, match="no read 99 in flight"):
            q.complete([99])
        done = q.submit(fd, 0, ctypes.addressof(buf), 4096)
        with pytest.raises(KeyError, match="no read 98 in flight"):
            q.complete([done, 98])
        assert q.wait(done) == 4096
        with pytest.raises(KeyError, match=f"no read {done} in flight"):
            q.wait(done)  # waited for once already


def test_close_cancels_a_read_that_would_never_finish(pipe):
    r, _ = pipe
    buf = ctypes.create_string_buffer(4096)
    q = _queue(2)
    for worker in (False, True):  # armed on the pipe's poll, and blocked in a kernel worker
        q.submit(r, 0, ctypes.addressof(buf), 4096, worker=worker)
    q.flush()
    q.close()  # without the cancel this waits forever
    assert q.in_flight == 0 and q._fd == -1


def test_close_asks_again_when_a_cancel_misses_the_read(pipe, monkeypatch):
    """A cancel that reaches the kernel while a worker is between taking the read and starting it finds
    nothing: close asks again instead of waiting forever (faked by dropping the first cancel)."""
    r, _ = pipe
    buf = ctypes.create_string_buffer(4096)
    q = _queue(2)
    q.submit(r, 0, ctypes.addressof(buf), 4096, worker=False)
    q.flush()
    real_cancel, cancels = q.cancel_all, []

    def first_one_missed():
        cancels.append(1)
        if len(cancels) > 1:
            real_cancel()

    monkeypatch.setattr(q, "cancel_all", first_one_missed)
    q.close()
    assert len(cancels) >= 2 and q.in_flight == 0 and q._fd == -1


def test_a_read_that_no_cancel_ends_gives_up_and_keeps_the_ring(pipe, monkeypatch):
    """A read the kernel never ends must not hang the load: close gives up after its patience with an error
    that says so, and keeps the ring open (the kernel may still write the buffer)."""
    r, w = pipe
    buf = ctypes.create_string_buffer(4096)
    q = _queue(2)
    q.submit(r, 0, ctypes.addressof(buf), 4096, worker=False)
    q.flush()
    monkeypatch.setattr(q, "cancel_all", lambda: None)  # every cancel missed
    q.settle_patience = 0.2
    with pytest.raises(ReadsUnsettled, match=r"1 read\(s\) still in flight 0.2 s after they were cancelled"):
        q.close()
    assert q.in_flight == 1 and q._fd >= 0
    os.write(w, b"y" * 10)  # the read was live all along
    q.close()
    assert q._fd == -1 and buf.raw[:10] == b"y" * 10


def test_close_after_a_failed_drain_cancels_and_waits_before_the_rings_go(pipe, monkeypatch):
    """A signal handler raising in the middle of a drain (a job's SIGTERM): close must still settle every
    read before it unmaps, and the error goes on."""
    r, w = pipe
    buf = ctypes.create_string_buffer(4096)
    q = _queue(2)
    q.submit(r, 0, ctypes.addressof(buf), 4096, worker=False)
    q.flush()
    real_enter, calls = q._enter, []

    def interrupted(wait):
        calls.append(wait)
        if len(calls) <= 2:  # the drain, then close's first cancel
            raise KeyboardInterrupt("a handler raised during the wait")
        real_enter(wait)

    monkeypatch.setattr(q, "_enter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        q.drain()
    assert q.in_flight == 1
    with pytest.raises(KeyboardInterrupt):
        q.close()  # interrupted once more, then cancels and waits
    assert q.in_flight == 0 and q._fd == -1
    os.write(w, b"x" * 10)  # the cancelled read took nothing
    assert buf.raw == b"\0" * 4096 and os.read(r, 10) == b"x" * 10


def test_close_that_cannot_settle_keeps_the_ring_open(pipe, monkeypatch):
    r, _ = pipe
    buf = ctypes.create_string_buffer(4096)
    q = _queue(2)
    q.submit(r, 0, ctypes.addressof(buf), 4096, worker=False)
    q.flush()
    real_enter = q._enter

    def refuse(wait):
        raise KeyboardInterrupt("every wait interrupted")

    monkeypatch.setattr(q, "_enter", refuse)
    with pytest.raises(KeyboardInterrupt):
        q.close()
    assert q.in_flight == 1 and q._fd >= 0  # the read may still write: nothing was unmapped
    monkeypatch.setattr(q, "_enter", real_enter)
    q.close()
    assert q._fd == -1


def test_a_completion_for_a_read_not_in_flight_is_an_error(data_file):
    fd, _ = data_file
    buf = ctypes.create_string_buffer(4096)
    with _queue(2) as q:
        known = q.submit(fd, 0, ctypes.addressof(buf), 4096)
        q._queue_entry(uring._OP_READ, 0, fd, 0, ctypes.addressof(buf), 4096, 77)  # bypasses the bookkeeping
        with pytest.raises(RuntimeError, match="read 77, which is not in flight"):
            q.complete([known])
