"""Positioned reads through Linux io_uring, from Python, with no compiled code.

Why: `stream`'s CUDA ring must read from the page cache as fast as the
host-to-device copy runs (see docs/benchmarks.md, Loader peers on one H200). Sixteen Python
threads calling `preadv` read fast enough on their own, but every read they
finish takes the GIL back, and the loader's single Python thread, which
queues the copies, spends its time waiting for it. With io_uring the
kernel's own workers do the reads (`IOSQE_ASYNC`), so no Python thread but
the caller runs during a load.

The binding is the smallest that does that: `io_uring_setup` and
`io_uring_enter` through libc's `syscall`, the rings mapped with `mmap`,
submission entries written with `struct`. After every `io_uring_enter` the
queue reads the completion ring's tail and consumes exactly the entries
posted up to it: a wait that a signal cuts short returns with fewer than it
asked for (or none), and the queue then simply waits again. How many entries
were handed over is read from the kernel's own submission head, not counted
on our side, so an exception raised by a signal handler between two
statements cannot leave the count wrong.

Python cannot issue memory barriers. On x86 loads are not reordered with
other loads, so reading the tail before the entries it covers is enough. On
arm64 it is not (liburing reads the tail with an acquire load), so
`auto_refusal` keeps the ring's default reader on threads there
(docs/architecture.md, "io_uring on arm64").

Where io_uring is missing or refused (old kernels, `kernel.io_uring_disabled`,
container seccomp profiles), `ReadQueue.open` raises `UringUnavailable` and
the caller reads with threads instead.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
import time

_SYSCALLS = {"x86_64": (425, 426, 427), "aarch64": (425, 426, 427)}
"""(io_uring_setup, io_uring_enter, io_uring_register): the same numbers on both, from the generic syscall table."""
_REGISTER_IOWQ_MAX_WORKERS = 19
_OP_READ = 22
_OP_ASYNC_CANCEL = 14
_CANCEL_ID = 0
"""user_data of the queue's cancel requests (read ids start at 1); their own completions are dropped."""
_SQE_ASYNC = 1 << 4
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_SQE = struct.Struct("<BBHiQQIIQHHiQQ")
"""struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len, rw_flags, user_data, buf_index,
personality, splice_fd_in, addr3, pad (64 bytes)."""
_CQE = struct.Struct("<QiI")
"""struct io_uring_cqe: user_data, res, flags (16 bytes)."""
_U32 = struct.Struct("<I")
SETTLE_PATIENCE_S = 60.0
"""How long `close` waits for cancelled reads before it gives up and keeps the ring (and so the caller's
buffers): a read of a regular file a kernel worker has begun runs to its end, which takes well under this
even on a slow disk, and a read that never ends (a pipe, a hung device) must not hang the load."""
_RECANCEL_S = 0.05
"""A cancel that reaches the kernel while a worker is between taking a read and starting it can miss it:
`close` asks again this often."""


class _SQOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array", "resv1")] + [
        ("user_addr", ctypes.c_uint64)
    ]


class _CQOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags", "resv1")] + [
        ("user_addr", ctypes.c_uint64)
    ]


class _Params(ctypes.Structure):
    _fields_ = [
        ("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32), ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3), ("sq_off", _SQOffsets), ("cq_off", _CQOffsets),
    ]


ORDERED_LOADS = ("x86_64",)
"""CPUs whose loads are not reordered with other loads, so the queue's plain read of the completion tail
orders the entries after it (x86's TSO). Elsewhere the ring's "auto" reader is threads (`auto_refusal`)."""


def auto_refusal(machine: str | None = None) -> str | None:
    """Why the ring should not pick io_uring by default on this CPU (`machine`: platform.machine()), or None.

    On arm64 the completion entries can be read before the tail that covers
    them without an acquire load, which Python cannot issue; no arm64 run has
    checked it either. io_uring asked for explicitly still opens there.
    """
    machine = machine or platform.machine()
    if machine in ORDERED_LOADS:
        return None
    return (f"io_uring is not the default reader on {machine}: this queue reads the completion ring without the "
            "acquire ordering that CPU needs, so the ring reads with threads")


class ReadsUnsettled(RuntimeError):
    """Reads still in flight after `close` cancelled them for `SETTLE_PATIENCE_S`: the ring stays open and
    the buffers they read into must be kept."""


class UringUnavailable(OSError):
    """io_uring cannot be used here (the message says why); read another way."""


_libc = ctypes.CDLL(None, use_errno=True)  # the C library is already in the process: no ldconfig run to find it
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


class ReadQueue:
    """One io_uring for positioned reads into caller-owned memory, `depth` at most in flight.

    `submit` queues a read, `flush` hands the queued ones to the kernel, and
    `wait(id)` returns that read's byte count (or raises its error). Every buffer given to
    `submit` must stay alive until its read is waited for or `drain` returns.
    """

    def __init__(self, fd: int, numbers: tuple[int, int, int], params: _Params, rings: list[mmap.mmap], depth: int):
        self._fd = fd
        self._enter_number, self._register_number = numbers[1], numbers[2]
        self._rings = rings
        self._sq, self._sqes = rings[0], rings[-1]
        self._cq = rings[1] if len(rings) == 3 else rings[0]
        sq, cq = params.sq_off, params.cq_off
        self._sq_head, self._sq_tail, self._sq_array = sq.head, sq.tail, sq.array
        self._sq_mask = _U32.unpack_from(self._sq, sq.ring_mask)[0]
        self._cq_head, self._cq_tail, self._cqes = cq.head, cq.tail, cq.cqes
        self._cq_mask = _U32.unpack_from(self._cq, cq.ring_mask)[0]
        self.depth = depth
        self.settle_patience = SETTLE_PATIENCE_S
        self._next_id = 1
        self._in_flight: set[int] = set()
        self._done: dict[int, int] = {}
        """Completed reads not yet waited for: id -> result (bytes, or -errno)."""

    @classmethod
    def open(cls, depth: int) -> "ReadQueue":
        """A queue for `depth` reads in flight; UringUnavailable where the kernel refuses io_uring."""
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None:
            raise UringUnavailable(errno.ENOSYS, f"no io_uring syscall numbers known for {platform.machine()}")
        entries = 1 << max(depth - 1, 1).bit_length()
        params = _Params()
        try:
            fd = _syscall(numbers[0], ctypes.c_uint(entries), ctypes.byref(params))
        except OSError as exc:
            raise UringUnavailable(exc.errno, f"io_uring_setup refused: {exc.strerror}") from None
        try:
            rings = cls._map(fd, params)
        except OSError as exc:
            os.close(fd)
            raise UringUnavailable(exc.errno, f"io_uring rings could not be mapped: {exc.strerror}") from None
        return cls(fd, numbers, params, rings, depth)

    @staticmethod
    def _map(fd: int, p: _Params) -> list[mmap.mmap]:
        flags, prot = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ | mmap.PROT_WRITE
        sq_size = p.sq_off.array + p.sq_entries * 4
        cq_size = p.cq_off.cqes + p.cq_entries * _CQE.size
        rings = []
        if p.features & _FEAT_SINGLE_MMAP:
            rings.append(mmap.mmap(fd, max(sq_size, cq_size), flags, prot, offset=_OFF_SQ_RING))
        else:
            rings.append(mmap.mmap(fd, sq_size, flags, prot, offset=_OFF_SQ_RING))
            rings.append(mmap.mmap(fd, cq_size, flags, prot, offset=_OFF_CQ_RING))
        rings.append(mmap.mmap(fd, p.sq_entries * _SQE.size, flags, prot, offset=_OFF_SQES))
        return rings

    def submit(self, fd: int, offset: int, address: int, length: int, *, worker: bool = True) -> int:
        """Queue a read of `length` bytes at `offset` of `fd` into memory at `address`; its id.

        The kernel sees it at the next `flush` or `wait`.

        `worker` (the default) hands the read to the kernel's worker threads
        (`IOSQE_ASYNC`): a read served from the page cache would otherwise be
        copied inline, by the submitting thread. O_DIRECT reads pass False:
        the block layer runs them asynchronously by itself.
        """
        if len(self._in_flight) >= self.depth:
            raise RuntimeError(f"io_uring queue full: {self.depth} reads in flight")
        read_id = self._next_id
        self._next_id += 1
        self._queue_entry(_OP_READ, _SQE_ASYNC if worker else 0, fd, offset, address, length, read_id)
        self._in_flight.add(read_id)
        return read_id

    def _queue_entry(self, opcode: int, flags: int, fd: int, offset: int, address: int, length: int, user_data: int) -> None:
        """Write one submission entry and publish it at the tail (the kernel takes it at the next enter)."""
        tail = _U32.unpack_from(self._sq, self._sq_tail)[0]
        index = tail & self._sq_mask
        _SQE.pack_into(self._sqes, index * _SQE.size, opcode, flags, 0, fd, offset, address, length, 0, user_data,
                       0, 0, 0, 0, 0)
        _U32.pack_into(self._sq, self._sq_array + index * 4, index)
        _U32.pack_into(self._sq, self._sq_tail, (tail + 1) & 0xFFFFFFFF)

    def limit_workers(self, workers: int) -> bool:
        """Let at most `workers` kernel worker threads run this queue's reads; False where the kernel
        (before 5.15) cannot. Its default allows up to one per queue entry, more than there are cores. The
        workers belong to the calling thread, so the limit holds for its later queues too."""
        limits = (ctypes.c_uint32 * 2)(workers, workers)
        try:
            _syscall(self._register_number, ctypes.c_uint(self._fd), ctypes.c_uint(_REGISTER_IOWQ_MAX_WORKERS), limits,
                     ctypes.c_uint(2))
        except OSError:
            return False
        return True

    def flush(self) -> None:
        """Hand every queued read to the kernel (one syscall), without waiting."""
        if self._unsubmitted():
            self._enter(0)

    def wait(self, read_id: int) -> int:
        """Block until read `read_id` completes; its byte count (short at end of file). OSError on failure,
        KeyError for an id that is neither in flight nor completed and not yet waited for."""
        self._check_known([read_id])
        while read_id not in self._done:
            self._enter(1)
        result = self._done.pop(read_id)
        if result < 0:
            raise OSError(-result, os.strerror(-result))
        return result

    def complete(self, read_ids) -> None:
        """Block until every read of `read_ids` has completed, asking the kernel for all of them at once
        (their results are then returned by `wait` without another syscall)."""
        read_ids = list(read_ids)
        self._check_known(read_ids)
        missing = [i for i in read_ids if i not in self._done]
        while missing:
            self._enter(len(missing))
            missing = [i for i in missing if i not in self._done]

    def drain(self) -> None:
        """Wait for every read in flight (their buffers may be freed after this), dropping the results."""
        while self._in_flight:
            self._enter(len(self._in_flight))
        self._done.clear()

    def cancel_all(self) -> None:
        """Ask the kernel to cancel every read in flight (IORING_OP_ASYNC_CANCEL); `drain` then waits for them.

        A read a kernel worker has already started may still run to its end:
        cancelling never frees a buffer early, only waiting does.
        """
        pending = sorted(self._in_flight)
        while pending:
            room = self._sq_mask + 1 - self._unsubmitted()
            for read_id in pending[:room]:
                self._queue_entry(_OP_ASYNC_CANCEL, 0, -1, 0, read_id, 0, _CANCEL_ID)
            pending = pending[room:]
            self._enter(0)

    @property
    def in_flight(self) -> int:
        """Reads handed to `submit` whose completion has not been seen yet."""
        return len(self._in_flight)

    def close(self) -> None:
        """Cancel and wait for every read still in flight, then unmap the rings and close the ring's
        descriptor (once).

        If that is cut short (a signal handler raised, the kernel refused the
        wait), it is done once more before the error goes on. Should even that
        fail, the ring stays open and `in_flight` stays above 0: the caller
        must then keep its buffers, which the kernel may still write.
        """
        if self._fd < 0:
            return
        try:
            self._settle()
        except BaseException:
            self._settle()
            raise
        finally:
            if not self._in_flight:
                for ring in self._rings:
                    ring.close()
                os.close(self._fd)
                self._fd = -1

    def _settle(self) -> None:
        """Cancel what is in flight and wait for all of it (a read already finished is not disturbed),
        asking again every `_RECANCEL_S` and giving up with `ReadsUnsettled` after `settle_patience` s."""
        deadline = time.monotonic() + self.settle_patience
        while self._in_flight:
            self.cancel_all()
            recancel_at = time.monotonic() + _RECANCEL_S
            while self._in_flight and time.monotonic() < recancel_at:
                self._enter(0)  # runs the kernel's pending completions and reaps them, without blocking
                if self._in_flight:
                    time.sleep(0.001)
            if self._in_flight and time.monotonic() >= deadline:
                raise ReadsUnsettled(f"io_uring: {len(self._in_flight)} read(s) still in flight "
                                     f"{self.settle_patience:g} s after they were cancelled (a file that never "
                                     f"returns data, or a hung device); the ring and its buffers are kept")
        self._done.clear()

    def _check_known(self, read_ids: list[int]) -> None:
        for read_id in read_ids:
            if read_id not in self._done and read_id not in self._in_flight:
                raise KeyError(f"no read {read_id} in flight")

    def _unsubmitted(self) -> int:
        """Entries written but not yet taken by the kernel (its head, read after the syscall that moved it)."""
        return (_U32.unpack_from(self._sq, self._sq_tail)[0] - _U32.unpack_from(self._sq, self._sq_head)[0]) & 0xFFFFFFFF

    def _enter(self, wait: int) -> None:
        """Hand queued entries to the kernel and, with `wait`, block until that many completions are posted
        or a signal arrives; then consume every completion posted so far (the caller loops until its reads
        are done). EINTR is such a signal; the kernel submitting none of the queued entries is an error."""
        queued = self._unsubmitted()
        try:
            submitted = _syscall(self._enter_number, ctypes.c_uint(self._fd), ctypes.c_uint(queued), ctypes.c_uint(wait),
                                 ctypes.c_uint(_ENTER_GETEVENTS if wait else 0), None, ctypes.c_size_t(0))
        except OSError as exc:
            if exc.errno != errno.EINTR:
                raise
            submitted = None
        self._reap()
        if queued and submitted == 0:
            raise OSError(errno.EAGAIN, f"io_uring_enter took none of {queued} queued entries")

    def _reap(self) -> None:
        """Consume the completion entries between the ring's head and its tail, moving the head per entry
        (an exception between two entries leaves none consumed twice)."""
        head = _U32.unpack_from(self._cq, self._cq_head)[0]
        tail = _U32.unpack_from(self._cq, self._cq_tail)[0]
        while head != tail:
            read_id, result, _flags = _CQE.unpack_from(self._cq, self._cqes + (head & self._cq_mask) * _CQE.size)
            head = (head + 1) & 0xFFFFFFFF
            if read_id != _CANCEL_ID and read_id not in self._in_flight:
                _U32.pack_into(self._cq, self._cq_head, head)
                raise RuntimeError(f"io_uring posted a completion for read {read_id}, which is not in flight")
            if read_id != _CANCEL_ID:
                self._done[read_id] = result
                self._in_flight.discard(read_id)
            _U32.pack_into(self._cq, self._cq_head, head)

    def __enter__(self) -> "ReadQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
