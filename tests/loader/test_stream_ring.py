"""The CUDA ring of `stream` (whole file ranges through reused buffers), its sizing, and the page-cache drop.

The ring's copy step is device-agnostic, so its chunking, O_DIRECT reads and
drops are checked here on CPU destinations; the `gpu` tests run the real CUDA
path (pinned buffers, side streams) and are run on the GPU host with the benchmarks.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from loader import LoadOptions, load_checkpoint
from loader.checkpoint import discover_checkpoint
from machine.device import DeviceInfo
from core.errors import CheckpointError, PlacementError
from loader.naming import Target
from loader.io.pagecache import drop, files_resident_fraction, resident_fraction
from loader.placement import LoadPlan, PlannedTarget, get_placement
from loader.placement.files import OpenFiles
from loader.placement.chunks import ALIGN, Piece, plan_chunks
from loader.placement.ranges import RangeRing
from loader.placement.ring_sizing import RING_CHUNK_BYTES, STAGING_SHARE, ring_geometry
from loader.placement.stream import drop_by_default
from tests.loader.ring_runs import run_ring

_MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def writer(tmp_path: Path):
    """`write(shards)`: a component folder of safetensors shards plus index, written with the safetensors
    library itself (so the module runs with `--noconftest` on the GPU host, which lacks the pipeline's packages)."""
    from safetensors.torch import save_file

    def write(shards: list[dict[str, torch.Tensor]], name: str = "c") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, folder / file)
            weight_map.update(dict.fromkeys(shard, file))
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        return folder

    return write


def _shards(seed: int = 5) -> list[dict[str, torch.Tensor]]:
    """Two shards of odd-sized tensors (never zeros), so pieces start at unaligned offsets and cross chunks."""
    g = torch.Generator().manual_seed(seed)
    sizes = [[70_001, 3, 130_000, 0, 9_999], [250_000, 17, 40_960]]
    return [
        {f"s{i}.t{j}": (torch.randn(n, generator=g) + 4).to(torch.bfloat16) for j, n in enumerate(shard)}
        for i, shard in enumerate(sizes)
    ]


def _plan(path: Path, keep=lambda name: True) -> tuple[LoadPlan, list]:
    metas = [m for m in discover_checkpoint(path).component().tensors]
    targets = [PlannedTarget(Target(m.name, (m,), m.shape), m.torch_dtype) for m in metas if keep(m.name)]
    return LoadPlan(targets=targets), metas


def _ring_load(
    path: Path, *, direct_io, drop_page_cache=False, keep=lambda name: True, chunk=64 << 10, read=16 << 10, threads=3,
    reader="auto", before_reading=lambda: None,
):
    plan, _ = _plan(path, keep)
    before_reading()
    files = OpenFiles(plan, 0, direct_io=direct_io, drop_page_cache=drop_page_cache)
    outs: dict[str, torch.Tensor] = {}
    done: list[str] = []
    pieces = []
    for p in plan.targets:
        meta = p.sources[0]
        outs[p.name] = torch.full((meta.nbytes,), 0xAB, dtype=torch.uint8)
        pieces.append(Piece(meta, outs[p.name], lambda m=meta: (done.append(m.name), files.done(m))))
    return outs, done, run_ring(files, pieces, chunk=chunk, read=read, threads=threads, reader=reader)


def _cold(path: Path) -> bool:
    """Drop every shard of `path` from the page cache; False where the file system keeps them (tmpfs)."""
    for file in path.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            drop(fd)
            if resident_fraction(fd) > 0.5:
                return False
        finally:
            os.close(fd)
    return True


def _resident(path: Path) -> float:
    return files_resident_fraction(path.glob("*.safetensors"))


def _warm(path: Path) -> None:
    """Read every shard into the page cache, written back first (dirty pages are never dropped)."""
    for file in path.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        file.read_bytes()


@pytest.mark.parametrize("lo,hi,needed", [(0, 64 << 10, 64 << 10), (4096, 50_000, 49_000), (20_000, 20_480, 20_100), (5, 5, 5)])
def test_a_chunk_is_read_in_read_bytes_parts_that_tile_it_on_aligned_boundaries(lo, hi, needed):
    ring = RangeRing(torch.device("cpu"), None, None, buffers=3, chunk_bytes=64 << 10, read_bytes=16 << 10, pin=False)
    parts = ring._split(lo, hi, needed)
    assert [a for a, _, _ in parts[:1]] == ([lo] if hi > lo else [])
    assert all(b == a2 for (_, b, _), (a2, _, _) in zip(parts, parts[1:])), "parts are back to back"
    assert sum(b - a for a, b, _ in parts) == hi - lo
    assert all(b % (16 << 10) == 0 for _, b, _ in parts[:-1]) and all(b - a <= 16 << 10 for a, b, _ in parts)
    assert all(n == min(b, needed) for _, b, n in parts)


def test_chunks_cover_contiguous_pieces_start_aligned_and_split_at_gaps_and_files(writer):
    path = writer(_shards())
    plan, metas = _plan(path, keep=lambda name: name != "s0.t2")
    pieces = [Piece(p.sources[0], torch.empty(0, dtype=torch.uint8), lambda: None) for p in plan.targets]
    chunks = list(plan_chunks(pieces, 64 << 10))
    assert all(c.start % ALIGN == 0 and 0 <= c.lo - (c.lo % ALIGN) and c.end <= 64 << 10 for c in chunks)
    # every piece's bytes appear once, in order, and only planned bytes are covered
    covered: dict[str, int] = {}
    for c in chunks:
        at = c.lo
        for piece, offset, into, n, _ in c.parts:
            assert offset == at and c.start + offset == piece.meta.offset + into
            covered[piece.meta.name] = covered.get(piece.meta.name, 0) + n
            at += n
        assert at == c.end
    assert covered == {p.name: p.sources[0].nbytes for p in plan.targets}
    # the dropped tensor's bytes start a new chunk after it, and each file starts its own
    by_file = [c.file.name for c in chunks]
    assert by_file == sorted(by_file)
    after_gap = next(m for m in metas if m.name == "s0.t3")
    assert any(c.start + c.lo == after_gap.offset for c in chunks)


@pytest.mark.parametrize("reader", ["threads", "io_uring"])
@pytest.mark.parametrize("direct_io", [False, True])
def test_ring_fills_every_destination_byte_exactly_with_and_without_o_direct(writer, direct_io, reader):
    shards = _shards()
    path = writer(shards)
    began = time.perf_counter()
    outs, done, stats = _ring_load(path, direct_io=direct_io, keep=lambda name: name != "s0.t2", reader=reader)
    wall = time.perf_counter() - began
    assert stats.reader == reader
    source = {k: v for s in shards for k, v in s.items()}
    assert sorted(outs) == sorted(k for k in source if k != "s0.t2")
    for name, out in outs.items():
        assert torch.equal(out, source[name].view(-1).view(torch.uint8)), name
    assert done == [k for s in shards for k in s if k != "s0.t2"], "sources finish in plan order"
    assert stats.bytes == sum(o.numel() for o in outs.values())
    phases = (stats.setup, stats.plan, stats.submit, stats.read_wait, stats.copy_issue, stats.place, stats.allocate)
    assert all(x > 0 for x in phases), phases
    assert sum(phases) + stats.copy_wait + stats.final_sync <= wall, "each moment is counted once"
    if direct_io:
        assert stats.direct_chunks > 0 or pytest.skip("this file system refuses O_DIRECT")
    else:
        assert stats.direct_chunks == 0


def test_the_ring_cycles_the_buffers_it_has_instead_of_waiting_for_the_pinning_helper(writer):
    """Stands in for CUDA's background pinning (the ring pins only for a CUDA target): buffer 0 is
    ready, the helper never finishes buffers 1 and 2, and the load must still complete, through buffer 0."""
    from concurrent.futures import Future

    shards = _shards()
    plan, _ = _plan(writer(shards))
    files = OpenFiles(plan, 0, direct_io=False)
    outs = {p.name: torch.zeros(p.sources[0].nbytes, dtype=torch.uint8) for p in plan.targets}
    pieces = [Piece(p.sources[0], outs[p.name], lambda m=p.sources[0]: files.done(m)) for p in plan.targets]
    ring = RangeRing(torch.device("cpu"), None, files, buffers=3, chunk_bytes=64 << 10, read_bytes=16 << 10, pin=False)
    ready, never, later = Future(), Future(), Future()
    ready.set_result(torch.empty((64 << 10) + ALIGN, dtype=torch.uint8))
    ring._pinning = [ready, never, later]
    worker = threading.Thread(target=lambda: (ring.run(pieces), ring.finish()))
    worker.start()
    worker.join(30)
    stuck = worker.is_alive()
    if stuck:  # free the ring to fail rather than hang the suite
        never.set_exception(RuntimeError("the ring waited for the pinning"))
        later.set_exception(RuntimeError("the ring waited for the pinning"))
        worker.join()
    ring.release()
    files.close_all()
    assert not stuck, "the ring waited for a buffer the helper had not pinned"
    source = {k: v for s in shards for k, v in s.items()}
    assert all(torch.equal(out, source[name].view(-1).view(torch.uint8)) for name, out in outs.items())
    assert ring.stats.chunks > 3 and ring.allocated_bytes == (64 << 10) + ALIGN  # one buffer did all the work
    assert never.cancelled() and later.cancelled()


@pytest.mark.parametrize("reader", ["threads", "io_uring"])
def test_a_shard_truncated_under_the_ring_fails_naming_its_file_and_tensor(writer, reader):
    path = writer(_shards())
    shard = sorted(path.glob("*.safetensors"))[1]
    with pytest.raises(CheckpointError, match=rf"{shard.name}: tensor 's1\.t\d'.* file ended after \d+ of \d+ bytes"):
        _ring_load(path, direct_io=False, reader=reader, before_reading=lambda: os.truncate(shard, shard.stat().st_size - 5000))


def test_the_ring_caps_io_urings_workers_at_its_readers_and_says_where_the_kernel_cannot(writer, monkeypatch):
    from loader.io import uring

    caps = []
    monkeypatch.setattr(uring.ReadQueue, "limit_workers", lambda self, n: caps.append(n) or False)
    shards = _shards()
    outs, _, stats = _ring_load(writer(shards), direct_io=False, reader="io_uring", threads=3)
    assert caps == [3] and stats.reader == "io_uring"
    assert "could not be capped at 3" in stats.reader_note
    assert torch.equal(outs["s1.t0"], shards[1]["s1.t0"].view(-1).view(torch.uint8))


def test_the_ring_reads_with_threads_where_io_uring_is_refused_and_says_why(writer, monkeypatch):
    from loader.io import uring

    def refuse(depth):
        raise uring.UringUnavailable(1, "io_uring_setup refused: Operation not permitted")

    monkeypatch.setattr(uring.ReadQueue, "open", staticmethod(refuse))
    shards = _shards()
    path = writer(shards)
    outs, _, stats = _ring_load(path, direct_io=False)
    assert stats.reader == "threads" and "Operation not permitted" in stats.reader_note
    assert torch.equal(outs["s1.t0"], shards[1]["s1.t0"].view(-1).view(torch.uint8))
    with pytest.raises(uring.UringUnavailable, match="not permitted"):
        _ring_load(path, direct_io=False, reader="io_uring")


def test_a_ring_load_on_io_uring_lands_every_byte_under_a_timer_signalling_every_millisecond(writer):
    """A process with its own signal handler (the job child has one for SIGTERM): every wait the timer cuts
    short must consume only the completions posted, or a read counts as done while it is still in flight."""
    import signal

    shards = _shards(seed=11)
    path = writer(shards)
    source = {k: v.view(-1).view(torch.uint8) for s in shards for k, v in s.items()}
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    try:
        for _ in range(30):
            outs, _, stats = _ring_load(path, direct_io=False, reader="io_uring", chunk=16 << 10, read=4 << 10)
            assert stats.reader == "io_uring"
            assert all(torch.equal(out, source[name]) for name, out in outs.items())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(fired) > 10


def test_a_cleanup_that_raises_does_not_skip_the_others(writer, monkeypatch):
    """`place` cleans up through an ExitStack: the staging failing to release still leaves the files
    closed and the readers stopped, and its error is the one raised."""
    from loader.placement import staging as staging_module
    from loader.placement import stream as stream_module

    closed, stopped = [], []
    real_close, real_shutdown = OpenFiles.close_all, ThreadPoolExecutor.shutdown

    def refuse(self):
        raise RuntimeError("staging release failed")

    monkeypatch.setattr(staging_module.Staging, "release", refuse)
    monkeypatch.setattr(OpenFiles, "close_all", lambda self: (closed.append(1), real_close(self)))
    monkeypatch.setattr(stream_module.ThreadPoolExecutor, "shutdown",
                        lambda self, wait=True: (stopped.append(1), real_shutdown(self, wait=wait)))
    with pytest.raises(RuntimeError, match="staging release failed"):
        load_checkpoint(
            writer(_shards()),
            LoadOptions(mode=get_placement("stream", threads=2), device="cpu", dtype="fp32"),
        )
    assert closed == [1] and stopped == [1]


def test_on_aarch64_the_ring_reads_with_threads_unless_io_uring_is_asked_for(writer, monkeypatch):
    """No arm64 host was at hand: the platform is faked. The queue's plain read of the completion tail is
    ordered only on x86, so "auto" must not pick io_uring elsewhere."""
    from loader.io import uring

    monkeypatch.setattr(uring.platform, "machine", lambda: "aarch64")
    shards = _shards()
    path = writer(shards)
    source = {k: v.view(-1).view(torch.uint8) for s in shards for k, v in s.items()}
    outs, _, stats = _ring_load(path, direct_io=False, reader="auto")
    assert stats.reader == "threads" and "not the default reader on aarch64" in stats.reader_note
    assert all(torch.equal(out, source[name]) for name, out in outs.items())
    outs, _, stats = _ring_load(path, direct_io=False, reader="io_uring")
    assert stats.reader == "io_uring" and stats.reader_note == ""
    monkeypatch.setattr(uring.platform, "machine", lambda: "x86_64")
    assert _ring_load(path, direct_io=False, reader="auto")[2].reader == "io_uring"


@pytest.mark.parametrize("reader", ["threads", "io_uring"])
def test_ring_reads_cold_files_with_o_direct_by_default_and_leaves_them_out_of_the_cache(writer, reader):
    path = writer(_shards())
    if not _cold(path):
        pytest.skip("this file system keeps pages resident after POSIX_FADV_DONTNEED (tmpfs?)")
    _, _, stats = _ring_load(path, direct_io=None, reader=reader)
    if stats.direct_chunks == 0:
        pytest.skip("this file system refuses O_DIRECT")
    assert stats.direct_chunks == stats.chunks
    assert _resident(path) < 0.05
    _warm(path)
    _, _, warm = _ring_load(path, direct_io=None)
    assert warm.direct_chunks == 0, "files in the page cache are read from it"


def test_drop_page_cache_leaves_no_checkpoint_page_cached_and_a_plain_load_keeps_the_cache(writer):
    path = writer(_shards())
    _warm(path)
    if _resident(path) < 0.99:
        pytest.skip("the page cache does not hold a file just read here")
    _, report = load_checkpoint(path, LoadOptions(mode="stream"))
    assert _resident(path) > 0.99, "a plain load leaves the cache as it was"
    assert report.page_cache_dropped is False and report.mem_free_before > 0 and report.mem_free_after > 0
    _ring_load(path, direct_io=False, drop_page_cache=True)
    if _resident(path) > 0.5:
        pytest.skip("this file system keeps pages resident after POSIX_FADV_DONTNEED (tmpfs?)")
    assert _resident(path) == 0.0
    _warm(path)
    for dtype in (None, "fp32"):  # the direct path and the per-tensor staging path
        module, report = load_checkpoint(
            path,
            LoadOptions(mode=get_placement("stream", drop_page_cache=True), dtype=dtype),
        )
        assert _resident(path) == 0.0, dtype
        assert report.page_cache_dropped is True
        _warm(path)
    assert torch.equal(module.state_dict()["s1.t0"], _shards()[1]["s1.t0"].float())


def test_cli_load_drop_page_cache_flag_reaches_the_report(writer, capsys):
    from loader.cli import main

    path = writer(_shards())
    assert main(["load", str(path), "--drop-page-cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["page_cache_dropped"] is True
    assert main(["load", str(path), "--no-drop-page-cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["page_cache_dropped"] is False


def test_load_checkpoint_passes_drop_page_cache_to_stream_and_other_modes_refuse_it(writer):
    path = writer(_shards())
    _, report = load_checkpoint(path, LoadOptions(drop_page_cache=True))
    assert report.page_cache_dropped is True
    with pytest.raises(PlacementError, match="'drain' does not take option.*drop_page_cache"):
        load_checkpoint(path, LoadOptions(mode="drain", drop_page_cache=True))


def _info(kind: str, unified: bool, total: int | None) -> DeviceInfo:
    return DeviceInfo(
        spec=kind, kind=kind, index=0 if kind == "cuda" else None, name="fake", unified_memory=unified,
        total_memory=total, source="test", reason="a fake for the sizing logic",
    )


GB10 = _info("cuda", True, 128 * 10**9)
"""A DGX Spark's GB10 as the probe reports it: integrated, one 128 GB pool shared with the host."""
H200 = _info("cuda", False, 141 * 10**9)


def test_ring_on_a_discrete_gpu_keeps_a_read_per_reader_in_flight_within_a_sixty_fourth_of_the_model():
    model = int(37.56 * GiB)
    g = ring_geometry(model, H200, threads=16, chunk_bytes=RING_CHUNK_BYTES, buffers=None, available=100 * GiB)
    # the defaults: 16 readers x 4 MiB reads fill four 16 MiB buffers; four more are copied out or wait
    assert (g.buffers, g.chunk_bytes, g.read_bytes) == (8, 16 * _MiB, 4 * _MiB)
    assert g.buffers * g.chunk_bytes <= model / STAGING_SHARE
    wide = ring_geometry(model, H200, threads=16, chunk_bytes=8 * _MiB, buffers=None, available=100 * GiB, read_bytes=8 * _MiB)
    assert (wide.buffers, wide.read_bytes) == (20, 8 * _MiB)
    small = ring_geometry(1 * GiB, H200, threads=16, chunk_bytes=32 * _MiB, buffers=None, available=100 * GiB)
    assert small.buffers * small.chunk_bytes <= max(1 * GiB / STAGING_SHARE, 3 * 4 * _MiB)


def test_ring_reading_the_disk_holds_every_buffer_the_budget_allows():
    model = int(37.56 * GiB)
    cached = ring_geometry(model, H200, threads=14, chunk_bytes=RING_CHUNK_BYTES, buffers=None, available=100 * GiB)
    disk = ring_geometry(model, H200, threads=14, chunk_bytes=RING_CHUNK_BYTES, buffers=None, available=100 * GiB, disk=True)
    assert disk.disk and not cached.disk
    assert (disk.chunk_bytes, disk.read_bytes) == (cached.chunk_bytes, cached.read_bytes)
    assert disk.buffers == disk.budget // disk.chunk_bytes == 37 > cached.buffers  # 592 MiB in flight, not 128
    assert disk.buffers * disk.chunk_bytes <= model / STAGING_SHARE
    spark = ring_geometry(model, GB10, threads=14, chunk_bytes=RING_CHUNK_BYTES, buffers=None, available=42 * GiB, disk=True)
    assert spark.buffers * spark.chunk_bytes <= 42 * GiB / 256 and spark.buffers >= 3
    fixed = ring_geometry(model, H200, threads=14, chunk_bytes=RING_CHUNK_BYTES, buffers=5, available=100 * GiB, disk=True)
    assert fixed.buffers == 5


def test_the_ring_reads_the_disk_when_direct_io_is_forced_or_most_of_its_files_are_uncached(writer, tmp_path):
    path = writer(_shards())
    files = sorted(path.glob("*.safetensors"))
    _warm(path)
    default, forced, never = (get_placement("stream", **o) for o in ({}, {"direct_io": True}, {"direct_io": False}))
    assert not default.ring_reads_disk(files) and forced.ring_reads_disk(files) and not never.ring_reads_disk(files)
    assert not default.ring_reads_disk([tmp_path / "gone.safetensors"])  # unreadable: counts as cached
    if not _cold(path):
        pytest.skip("this file system keeps pages resident after POSIX_FADV_DONTNEED (tmpfs?)")
    assert default.ring_reads_disk(files) and forced.ring_reads_disk(files) and not never.ring_reads_disk(files)
    small, large = files  # 0.42 and 0.58 of the bytes
    large.read_bytes()
    assert not default.ring_reads_disk(files)  # most of the bytes are cached
    _cold(path)
    small.read_bytes()
    assert default.ring_reads_disk(files)


def test_a_file_the_placement_already_sampled_is_not_sampled_again_to_decide_o_direct(writer, monkeypatch):
    import loader.io.pagecache as pagecache

    path = writer(_shards())
    plan, _ = _plan(path)
    file = sorted(path.glob("*.safetensors"))[0]
    calls = []
    real = pagecache.sampled_resident_fraction
    monkeypatch.setattr(pagecache, "sampled_resident_fraction", lambda fd: calls.append(fd) or real(fd))
    files = OpenFiles(plan, 0, direct_io=None, residency={file: (0.0, 1)})  # sampled: none of it cached
    try:
        _, direct = files.fd_for(file)
    finally:
        files.close_all()
    assert calls == []
    if not direct:  # only where the file system refuses O_DIRECT
        with pytest.raises(OSError):
            os.close(os.open(file, os.O_RDONLY | os.O_DIRECT))


def test_ring_on_unified_memory_is_sized_by_the_pool_and_keeps_the_footprint_under_1_02():
    model = int(37.56 * GiB)
    roomy = ring_geometry(model, GB10, threads=16, chunk_bytes=32 * _MiB, buffers=None, available=110 * GiB)
    tight = ring_geometry(model, GB10, threads=16, chunk_bytes=32 * _MiB, buffers=None, available=42 * GiB)
    for g in (roomy, tight):
        staging = g.buffers * g.chunk_bytes
        assert g.unified and (model + staging) / model <= 1.02
    assert tight.buffers * tight.chunk_bytes <= 42 * GiB / 256 < roomy.budget
    assert tight.chunk_bytes % ALIGN == 0 and tight.buffers >= 3
    fixed = ring_geometry(model, GB10, threads=16, chunk_bytes=16 * _MiB, buffers=5, available=42 * GiB)
    assert (fixed.buffers, fixed.chunk_bytes) == (5, 16 * _MiB)


@pytest.mark.parametrize("cpus, cuda_readers, cpu_readers", [(16, 14, 8), (32, 16, 8), (4, 2, 4), (2, 2, 2)])
def test_readers_default_to_the_cores_less_two_on_cuda_up_to_16_and_the_threads_option_wins(
    monkeypatch, cpus, cuda_readers, cpu_readers
):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert get_placement("stream").reader_threads(cuda=True) == cuda_readers
    assert get_placement("stream").reader_threads(cuda=False) == cpu_readers
    assert get_placement("stream", threads=5).reader_threads(cuda=True) == 5


def test_drop_page_cache_defaults_on_for_unified_cuda_only():
    assert drop_by_default(GB10) is True
    assert drop_by_default(H200) is False
    assert drop_by_default(None) is False


@pytest.mark.parametrize("conf", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_no_reservation_where_the_allocator_keeps_large_blocks_whole(monkeypatch, conf):
    from loader.placement.base import _allocator_splits_cached_blocks

    monkeypatch.setenv(conf, "expandable_segments:False,max_split_size_mb:512")
    assert not _allocator_splits_cached_blocks()
    monkeypatch.delenv(conf)
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    assert not _allocator_splits_cached_blocks()


def test_stream_rejects_bad_new_options_naming_them():
    with pytest.raises(PlacementError, match="drop_page_cache must be true or false, got 'yes'"):
        get_placement("stream", drop_page_cache="yes")
    with pytest.raises(PlacementError, match="copy_streams must be a positive integer, got 0"):
        get_placement("stream", copy_streams=0)


def _cuda_checkpoint(writer) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(9)
    shards = [
        {f"b{i}.w{j}": (torch.randn(1537, 1021, generator=g) + 3).to(torch.bfloat16) for j in range(3)} for i in range(2)
    ]
    shards[1]["norm"] = torch.randn(5, generator=g) + 1
    return writer(shards), {k: v for s in shards for k, v in s.items()}


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("options", [
    {},
    {"staging_bytes": 1 << 20, "staging_buffers": 3, "threads": 4},
    {"staging_bytes": 1 << 20, "copy_streams": 2, "direct_io": True},
    {"pin": False, "staging_bytes": 1 << 20},
    {"io_uring": False, "staging_bytes": 1 << 20},
    {"io_uring": True, "staging_bytes": 1 << 20, "direct_io": True},
    {"ranges": False, "staging_bytes": 1 << 20},
    {"driver_copies": False, "reserve": False, "staging_bytes": 1 << 20},
])
def test_cuda_ring_places_every_tensor_bit_for_bit(writer, options):
    path, source = _cuda_checkpoint(writer)
    placement = get_placement("stream", **options)
    module, report = load_checkpoint(path, LoadOptions(mode=placement, device="cuda"))
    state = module.state_dict()
    for name, tensor in source.items():
        assert state[name].device.type == "cuda"
        assert torch.equal(state[name].cpu().view(torch.uint8), tensor.view(torch.uint8)), name
    assert report.bytes_read == sum(t.nbytes for t in source.values())
    if options.get("ranges", True):
        assert placement.last_ring is not None and placement.last_ring.chunks > 0
        assert report.ring_reader == ("threads" if options.get("io_uring") is False else "io_uring")
        assert report.ring_copier == ("torch" if options.get("driver_copies") is False else "driver")
        assert report.ring_staging == ("pageable" if options.get("pin") is False else "registered")
        assert report.to_dict()["ring_staging"] == report.ring_staging
    else:
        assert placement.last_ring is None


@pytest.mark.gpu
@gpu
def test_a_rings_registered_buffers_go_back_to_the_system_and_the_next_load_registers_anew(writer):
    """What sequential residency calls after each load: the ring's page-locked buffers leave the process (the
    driver unregisters them, the mappings go), and a later load still places every byte."""
    from loader import release_cached_host_memory
    from loader.io.pinned import POOL

    path, source = _cuda_checkpoint(writer)
    _, report = load_checkpoint(path, LoadOptions(mode=get_placement("stream", staging_bytes=1 << 20), device="cuda"))
    assert report.ring_staging == "registered"
    assert release_cached_host_memory() >= 1 << 20
    assert not any(POOL._free.values()) and release_cached_host_memory() == 0
    module, _ = load_checkpoint(path, LoadOptions(mode=get_placement("stream", staging_bytes=1 << 20), device="cuda"))
    for name, tensor in source.items():
        assert torch.equal(module.state_dict()[name].cpu().view(torch.uint8), tensor.view(torch.uint8)), name
    assert release_cached_host_memory() >= 1 << 20


@pytest.mark.gpu
@gpu
def test_cuda_ring_converts_through_staging_and_drops_the_cache_when_asked(writer):
    path, source = _cuda_checkpoint(writer)
    module, report = load_checkpoint(
        path,
        LoadOptions(mode=get_placement("stream", drop_page_cache=True), device="cuda", dtype="fp32"),
    )
    for name, tensor in source.items():
        assert torch.equal(module.state_dict()[name].cpu(), tensor.float()), name
    assert report.page_cache_dropped
    if _cold(path):  # a file system that drops pages at all
        _warm(path)
        load_checkpoint(path, LoadOptions(mode=get_placement("stream", drop_page_cache=True), device="cuda"))
        assert _resident(path) == 0.0


@pytest.mark.gpu
@gpu
def test_memory_probe_reads_the_allocators_own_allocated_and_reserved_bytes():
    from machine.memory import MemoryProbe

    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    with MemoryProbe("cuda") as probe:
        sample = probe.sample()
    assert sample.device_allocated == torch.cuda.memory_allocated() >= keep.numel()
    assert sample.device_reserved == torch.cuda.memory_reserved() >= sample.device_allocated


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("reserve", [True, False])
def test_cuda_ring_carves_its_destinations_from_one_reserved_block(writer, reserve):
    # Above 10 MiB each: torch's allocator gives such a request its own segment when nothing is reserved.
    g = torch.Generator().manual_seed(4)
    source = {f"w{j}": torch.randn(3100, 2048, generator=g).to(torch.bfloat16) for j in range(4)}
    source["norm"] = torch.randn(7, generator=g)
    path, large = writer([source]), 4
    torch.cuda.empty_cache()
    before = torch.cuda.memory_stats()
    module, _ = load_checkpoint(path, LoadOptions(mode=get_placement("stream", reserve=reserve), device="cuda"))
    after = torch.cuda.memory_stats()
    assert after["segment.large_pool.allocated"] - before["segment.large_pool.allocated"] == (1 if reserve else large)
    held = sum(t.nbytes for t in module.state_dict().values() if t.nbytes > 1 << 20)
    grown = after["reserved_bytes.large_pool.current"] - before["reserved_bytes.large_pool.current"]
    assert held <= grown < held + (2 << 20 if reserve else large * (2 << 20))


@pytest.mark.gpu
@gpu
def test_the_reserve_runs_on_a_helper_beside_the_rings_set_up_and_a_failed_load_waits_for_it(writer, monkeypatch):
    """Behaviour, not timing: the ring opens while the reserve is still running (the speed-up is a benchmark's)."""
    from loader.placement import base

    g = torch.Generator().manual_seed(6)
    source = {f"w{j}": torch.randn(3100, 2048, generator=g).to(torch.bfloat16) for j in range(2)}
    path = writer([source])
    plain_reserve, plain_open, reserved, ring_open = base.PlacementContext.reserve, RangeRing.open, [], threading.Event()

    def reserve_after_the_ring_opens(ctx, targets):
        # Only a reserve running beside the ring's set-up sees the ring open; one run first would wait in vain.
        reserved.append((threading.current_thread().name, ring_open.wait(timeout=60)))
        return plain_reserve(ctx, targets)

    def open_and_say(ring):
        try:
            plain_open(ring)
        finally:
            ring_open.set()

    monkeypatch.setattr(base.PlacementContext, "reserve", reserve_after_the_ring_opens)
    monkeypatch.setattr(RangeRing, "open", open_and_say)
    module, report = load_checkpoint(path, LoadOptions(device="cuda"))
    assert len(reserved) == 1
    name, saw_the_ring_open = reserved[0]
    assert name.startswith("drainboard-reserve") and saw_the_ring_open
    assert all(torch.equal(getattr(module, k).cpu(), v) for k, v in source.items())

    def slow_reserve(ctx, targets):
        time.sleep(0.3)  # still running when the ring's open fails
        reserved.append((threading.current_thread().name, True))
        return plain_reserve(ctx, targets)

    def refuse(ring):
        raise RuntimeError("no reader")

    monkeypatch.setattr(base.PlacementContext, "reserve", slow_reserve)
    monkeypatch.setattr(RangeRing, "open", refuse)
    with pytest.raises(RuntimeError, match="no reader"):
        load_checkpoint(path, LoadOptions(device="cuda"))
    assert len(reserved) == 2  # the second load's reserve had finished before the load raised


@pytest.mark.gpu
@gpu
def test_the_ring_pins_by_registering_with_the_driver_and_a_second_load_reuses_those_buffers(writer):
    from loader.io.pinned import POOL

    shards = _shards(seed=8)
    path = writer(shards)
    mode = {"staging_bytes": 37 * ALIGN, "staging_buffers": 3}  # a buffer size no other test's ring uses
    before = len(POOL._registered)
    first, _ = load_checkpoint(path, LoadOptions(mode=get_placement("stream", **mode), device="cuda"))
    registered = len(POOL._registered) - before
    second, _ = load_checkpoint(path, LoadOptions(mode=get_placement("stream", **mode), device="cuda"))
    assert registered > 0 and len(POOL._registered) - before == registered
    source = {k: v for s in shards for k, v in s.items()}
    for module in (first, second):
        assert all(torch.equal(t.cpu(), source[k]) for k, t in module.state_dict().items())


@pytest.mark.gpu
@gpu
def test_a_refused_registration_pins_with_torch_and_the_report_says_so(writer, monkeypatch):
    """As on a GB10, where cuMemHostRegister is not supported: the ring must not fall to pageable memory."""
    from loader.io.pinned import POOL, PinFailed

    def refuse(size, context):
        raise PinFailed(f"page-locking {size} bytes of host memory failed: CUDA driver error 801")

    monkeypatch.setattr(POOL, "_register", refuse)
    path, source = _cuda_checkpoint(writer)
    placement = get_placement("stream", staging_bytes=41 * ALIGN, staging_buffers=3)  # no buffer kept from another test
    module, report = load_checkpoint(path, LoadOptions(mode=placement, device="cuda"))
    state = module.state_dict()
    assert all(torch.equal(state[k].cpu().view(torch.uint8), t.view(torch.uint8)) for k, t in source.items())
    assert report.ring_staging == "torch-pinned" and "CUDA driver error 801" in report.ring_staging_note


@pytest.mark.gpu
@gpu
def test_the_rings_copy_streams_come_from_the_driver_are_kept_and_follow_the_current_stream():
    from loader.io.cuda_copy import copy_streams_for

    device = torch.device("cuda", torch.cuda.current_device())
    first = copy_streams_for(device, 2)
    again = copy_streams_for(device, 1)
    assert all(isinstance(s, torch.cuda.ExternalStream) for s in first)
    assert len({s.cuda_stream for s in first}) == 2 and again[0].cuda_stream == first[0].cuda_stream
    # Work queued on the current stream before the streams are handed out runs before what they queue.
    source = torch.ones(1 << 26, device=device)
    source.mul_(3)
    out = torch.empty_like(source)
    (stream,) = copy_streams_for(device, 1)
    with torch.cuda.stream(stream):
        out.copy_(source)
    stream.synchronize()
    assert bool((out == 3).all())


def test_comparison_options_live_in_one_stream_tuning_and_keywords_still_reach_it(writer):
    from loader.placement.tuning import StreamTuning

    by_keyword = get_placement("stream", staging_bytes=1 << 20, io_uring=False, threads=3)
    assert by_keyword.tuning == StreamTuning(staging_bytes=1 << 20, io_uring=False) and by_keyword.threads == 3
    assert get_placement("stream").tuning == StreamTuning()
    tuned = get_placement("stream", tuning=StreamTuning(ranges=False), drop_page_cache=False)
    assert tuned.tuning.ranges is False and tuned.drop_page_cache is False
    with pytest.raises(PlacementError, match=r"give pin in tuning=StreamTuning\(\.\.\.\), not beside it"):
        get_placement("stream", tuning=StreamTuning(), pin=False)
    shards = _shards()
    module, report = load_checkpoint(writer(shards), LoadOptions(mode=tuned, device="cpu"))
    source = {k: v for s in shards for k, v in s.items()}
    assert all(torch.equal(t, source[k]) for k, t in module.state_dict().items())
