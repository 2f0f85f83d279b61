"""Peer benchmark (not a test): `stream` against the best other safetensors loaders, side by side, with ceilings.

Same checkpoint, same cache state, each case in a fresh process, every case
ending with every tensor on the device (synchronised), and a fingerprint of
the loaded bytes (per tensor: the sum of its bytes and of every other byte,
folded with its name) so a case that loaded nothing, or the wrong bytes,
cannot look fast: the table marks each case whose fingerprint differs from
the checkpoint's.

Cases (each a fresh process):
  stream, drain                 Drainboard (`stream[key=value,...]` passes stream options)
  stream_unregistered           stream with cuMemHostRegister refused, as a GB10 refuses it: the ring's
                                buffers come from torch's pinned allocator (takes stream's options)
  kvikio                        NVIDIA KvikIO (optional, `kvikio-cu12`/`-cu13`): each shard's data read whole
                                into one device buffer with CuFile.pread, tensors as views of it;
                                `kvikio[threads=16,task_size=16MiB,compat=on,direct=true,bounce=16MiB]`
  instanttensor                 InstantTensor, default backend (O_DIRECT on a disk, mmap on tmpfs)
  instanttensor_buffered        InstantTensor, backend=BackendPolicy.BUFFERED (io_uring buffered reads)
  instanttensor_mmap            InstantTensor, backend=Backend.MMAP (its fastest from the page cache on the H200 host)
  st_prefetch                   safetensors 0.9.0rc1 safe_open(...).prefetch(device=0, threads=16), per file
                                (installed apart: --prefetch-site DIR, put first on sys.path in that child only)
  fastsafetensors               SafeTensorsFileLoader(nogds=True), copy_files_to_device
  runai                         Run:ai SafetensorsStreamer (CPU ring), each tensor .to(device)
  load_file                     safetensors.torch.load_file(device="cuda") per shard
Ceilings (same process rules, same files):
  ceil_h2d                      pinned host->device copy of the checkpoint's size (4 x 256 MiB pinned buffers)
  ceil_read                     16 threads x 8 MiB preadv into pinned buffers (the page cache's rate when warm;
                                8 MiB reads were the fastest size measured there)
  ceil_direct                   the same with O_DIRECT (cold: the disk's parallel rate)
  ceil_direct_seq               one thread, 64 MiB O_DIRECT reads (the disk's sequential rate)

Caches: `warm` (every shard in the page cache, checked with mincore and re-read
if not), `cold` (sync + drop_caches before each case; needs root), `tmpfs`
(the checkpoint copied to /dev/shm first, when it fits).

    python bench/bench_peers.py --make-checkpoint /tmp/pruned        # the 37.56 GiB pruned-r16 DiT shapes
    python bench/bench_peers.py /tmp/pruned --cache warm cold tmpfs --json out.json
    python bench/bench_peers.py /tmp/pruned --cache warm --cases stream instanttensor_buffered --rounds 3

`--rounds N` runs each cache's case list N times over, interleaved (these
hosts drift through a call), and adds a table of each case's median.
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPECS = Path(__file__).resolve().parent / "specs" / "h3_pruned_r16_transformer.json"
"""Names and shapes of the h3-pruned-r16 DiT (639 tensors, 37.56 GiB in bf16), written from the synthetic
profile by `--dump-specs`, so the device host needs no model code to write the checkpoint."""
PEERS = ("instanttensor", "instanttensor_buffered", "instanttensor_mmap", "st_prefetch", "fastsafetensors", "runai",
         "load_file", "kvikio")
CEILINGS = ("ceil_h2d", "ceil_read", "ceil_direct", "ceil_direct_seq")
CASES = ("stream", "stream_unregistered", "drain") + PEERS + CEILINGS
_OPTIONS = {"stream": None, "stream_unregistered": None,
            "kvikio": ("threads", "task_size", "compat", "direct", "bounce")}
"""Cases that take options, and which (None: any stream option, checked by the placement)."""
_MiB = 1 << 20
_ALIGN = 4096


def dump_specs(path: Path = SPECS) -> None:
    """Write the pruned-r16 DiT's headers over holes (`check_forecast_cuda.write_sparse_h3`), read them back in
    data order, and keep the names and shapes."""
    import tempfile

    from check_forecast_cuda import write_sparse_h3
    from loader.safetensors_file import read_shard_header

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "h3-pruned-r16"
        write_sparse_h3(root, "h3-pruned-r16", components=["transformer"])
        tensors = []
        for shard_path in sorted((root / "transformer").glob("*.safetensors")):
            shard, problems = read_shard_header(shard_path)
            if shard is None or problems:
                raise SystemExit(f"{shard_path}: {'; '.join(problems)}")
            tensors += [[t.name, list(t.shape)] for t in sorted(shard.tensors, key=lambda t: t.data_offsets)]
    data = {"profile": "h3-pruned-r16", "component": "transformer", "dtype": "bf16", "tensors": tensors}
    path.write_text(json.dumps(data, separators=(",", ":")))


def make_checkpoint(out: Path, shard_bytes: int = 4 * 2**30, specs_file: Path = SPECS, max_dim: int | None = None) -> Path:
    """Write the pruned-r16 DiT shapes as a bf16 component folder, shards written in parallel.

    `max_dim` clips every dimension (256: the same 639 tensors in 41 MB, for
    measuring per-tensor costs on a small box).

    Values: slices of one 256 MiB pool of random bf16 (never zero), each
    tensor starting at its own offset, so tensors differ and writing runs at
    page-cache speed rather than at random-number speed.
    """
    import torch

    from loader.safetensors_file import TensorSpec, plan_shards, write_safetensors

    data = json.loads(specs_file.read_text())
    clip = (lambda d: min(d, max_dim)) if max_dim else (lambda d: d)
    specs = [TensorSpec(name, tuple(map(clip, shape)), torch.bfloat16) for name, shape in data["tensors"]]
    shards = plan_shards(specs, shard_bytes)
    pool = (torch.randn(128 * _MiB, generator=torch.Generator().manual_seed(0)) + 3).to(torch.bfloat16)

    def chunks(spec):
        at, left = zlib.crc32(spec.name.encode()) % pool.numel(), spec.numel
        while left:
            n = min(left, pool.numel() - at, 32 * _MiB)
            yield pool[at : at + n]
            left -= n
            at = (at + n) % pool.numel()

    out.mkdir(parents=True, exist_ok=True)
    stem = "diffusion_pytorch_model"
    names = [f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    with ThreadPoolExecutor(len(shards)) as ex:
        list(ex.map(lambda a: write_safetensors(out / a[0], a[1], chunks), zip(names, shards)))
    weight_map = {spec.name: name for name, shard in zip(names, shards) for spec in shard}
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
    (out / f"{stem}.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text(json.dumps({"_class_name": "BenchPrunedDiT"}))
    return out


def shard_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def fingerprint(tensors: dict) -> str:
    """Sum of every byte and of every other byte of each tensor, folded with its name, as hex."""
    import torch

    acc = 0
    for name in sorted(tensors):
        b = tensors[name].detach().reshape(-1).contiguous().view(torch.uint8)
        whole = int(b.sum(dtype=torch.int64))
        even = int(b[::2].sum(dtype=torch.int64))
        acc = (acc * 1_000_003 + zlib.crc32(name.encode()) * 7 + whole * 31 + even) % (1 << 61)
    return f"{acc:016x}"


# ---- child: one case in this process -------------------------------------------------------------------

_IMPORTS_DONE: list[float] = []
"""When the case's library finished importing (perf_counter), for `call_seconds`."""


def _imported() -> None:
    """Each case calls this once its library is imported, right before its first call into it."""
    _IMPORTS_DONE.append(time.perf_counter())


def _case_stream(path: Path, options: dict, device: str) -> tuple[object, dict]:
    from loader import LoadOptions, load_checkpoint
    from loader.placement import get_placement

    _imported()
    placement = get_placement("stream", **options)
    module, report = load_checkpoint(path, LoadOptions(mode=placement, device=device))
    extra = {"load_seconds": report.load_seconds, "report_footprint": report.footprint_ratio}
    if placement.last_ring is not None:
        extra["ring"] = vars(placement.last_ring)
        extra["geometry"] = vars(placement.last_geometry)
    return module, extra


def _case_stream_unregistered(path: Path, options: dict, device: str) -> tuple[object, dict]:
    """stream where the driver refuses to register host memory (forced here; a GB10 refuses for real)."""
    from loader.io.pinned import POOL, PinFailed

    def refuse(size, context):
        raise PinFailed(f"page-locking {size} bytes of host memory failed: refused by the benchmark (as on a GB10)")

    POOL._register = refuse
    module, extra = _case_stream(path, options, device)
    return module, extra


def _case_kvikio(path: Path, options: dict) -> tuple[dict, dict]:
    """KvikIO: every shard's data area read with one CuFile.pread into a device buffer (KvikIO splits it
    into `task_size` tasks on its thread pool, through its pinned bounce buffers in compat mode), tensors
    as views. Settings go in through its environment variables, read at import, and, where this KvikIO
    has it, `kvikio.defaults.set`."""
    env = {"threads": "KVIKIO_NTHREADS", "task_size": "KVIKIO_TASK_SIZE", "compat": "KVIKIO_COMPAT_MODE",
           "bounce": "KVIKIO_BOUNCE_BUFFER_SIZE"}
    for key, name in env.items():
        if key in options:
            os.environ[name] = str(options[key])
    import kvikio
    import kvikio.defaults  # a submodule kvikio's __init__ does not import (26.10)
    import torch

    from loader.dtypes import SAFETENSORS_DTYPES

    settings = {}
    if options.get("direct") is not None:
        kvikio.defaults.set("auto_direct_io_read", bool(options["direct"]))  # O_DIRECT where aligned (KvikIO >= 25.08)
    for name in ("num_threads", "task_size", "compat_mode", "auto_direct_io_read", "bounce_buffer_size"):
        try:
            settings[name] = str(kvikio.defaults.get(name))
        except (AttributeError, KeyError, ValueError, RuntimeError):
            pass
    _imported()
    tensors, reads = {}, []
    for file in shard_files(path):
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        size = max((v["data_offsets"][1] for v in header.values()), default=0)
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        handle = kvikio.CuFile(str(file), "r")
        reads.append((handle, handle.pread(buf, size, 8 + n)))
        for name, v in header.items():
            lo, hi = v["data_offsets"]
            tensors[name] = buf[lo:hi].view(SAFETENSORS_DTYPES[v["dtype"]]).reshape(v["shape"])
    for handle, future in reads:
        future.get()
        handle.close()
    return tensors, {"kvikio": kvikio.__version__, "kvikio_settings": settings}


def _case_drain(path: Path, device: str) -> tuple[object, dict]:
    from loader import LoadOptions, load_checkpoint

    _imported()
    module, report = load_checkpoint(path, LoadOptions(mode="drain", device=device))
    return module, {"load_seconds": report.load_seconds}


def _case_instanttensor(path: Path, backend: str | None) -> tuple[dict, dict]:
    """InstantTensor with `backend`: None (its default), "BUFFERED" (the policy) or a Backend name."""
    import instanttensor
    from instanttensor import safe_open

    _imported()
    files = [str(f) for f in shard_files(path)]

    def load(choice) -> dict:
        with safe_open(files, framework="pt", device=0, backend=choice) as f:
            return dict(f.tensors())

    choice = None
    if backend == "BUFFERED":
        choice = instanttensor.BackendPolicy.BUFFERED
    elif backend is not None:
        choice = getattr(instanttensor.Backend, backend)
    try:
        return load(choice), {}
    except RuntimeError as exc:  # io_uring refused by this kernel/VM: the library's next backend, and the table says so
        if "uring" not in str(exc).lower() or backend == "MMAP":
            raise
        fallback = instanttensor.Backend.AIO_BUFFERED if backend else instanttensor.Backend.AIO
        return load(fallback), {"backend": str(fallback), "fallback_because": str(exc)[:120]}


def _case_st_prefetch(path: Path) -> tuple[dict, dict]:
    import safetensors
    from safetensors import safe_open

    _imported()
    tensors = {}
    for file in shard_files(path):
        with safe_open(str(file), framework="pt", device=0) as handle:
            with handle.prefetch(device=0, threads=16) as loader:
                for name, tensor in loader:
                    tensors[name] = tensor
    return tensors, {"safetensors": safetensors.__version__}


def _case_fastsafetensors(path: Path, keep: list) -> tuple[dict, dict]:
    from fastsafetensors import SafeTensorsFileLoader

    _imported()
    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True)
    loader.add_filenames({0: [str(f) for f in shard_files(path)]})
    buffers = loader.copy_files_to_device()
    keep += [loader, buffers]
    return {name: buffers.get_tensor(name) for name in loader.get_keys()}, {}


def _case_runai(path: Path) -> tuple[dict, dict]:
    from runai_model_streamer import SafetensorsStreamer

    _imported()
    tensors = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(f) for f in shard_files(path)], owned=False)
        for name, tensor in streamer.get_tensors():
            tensors[name] = tensor.to("cuda")
    return tensors, {}


def _case_load_file(path: Path, device: str) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    _imported()
    tensors = {}
    for file in shard_files(path):
        tensors.update(load_file(str(file), device=device))
    return tensors, {}


def _pieces(path: Path, size: int) -> list[tuple[Path, int, int]]:
    out = []
    for file in shard_files(path):
        total = file.stat().st_size
        out += [(file, at, min(size, total - at)) for at in range(0, total, size)]
    return out


def _ceil_read(path: Path, threads: int, direct: bool, size: int) -> dict:
    """Every shard's bytes read by `threads` threads in `size` preadv calls into pinned buffers."""
    import torch

    pin = torch.cuda.is_available()
    local = threading.local()
    flag = os.O_DIRECT if direct else 0
    fds = {f: os.open(f, os.O_RDONLY | flag) for f in shard_files(path)}

    def read(piece):
        file, at, n = piece
        if not hasattr(local, "view"):
            raw = torch.empty(size + _ALIGN, dtype=torch.uint8, pin_memory=pin)
            skip = -raw.data_ptr() % _ALIGN
            local.raw, local.view = raw, memoryview(raw.numpy())[skip : skip + size]
        length = -(-n // _ALIGN) * _ALIGN if direct else n
        got = 0
        while got < n:
            k = os.preadv(fds[file], [local.view[got:length]], at + got)
            if k == 0:
                break
            got += k
        return min(got, n)

    try:
        pieces = _pieces(path, size)
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            total = sum(ex.map(read, pieces))
        seconds = time.perf_counter() - start
    finally:
        for fd in fds.values():
            os.close(fd)
    return {"bytes": total, "seconds": seconds, "threads": threads, "direct": direct}


def _ceil_h2d(path: Path) -> dict:
    import torch

    total = sum(f.stat().st_size for f in shard_files(path))
    size = 256 * _MiB
    host = [torch.randint(1, 255, (size,), dtype=torch.uint8).pin_memory() for _ in range(4)]
    dest = [torch.empty(min(size, total - at), dtype=torch.uint8, device="cuda") for at in range(0, total, size)]
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.stream(stream):
        for i, d in enumerate(dest):
            d.copy_(host[i % 4][: d.numel()], non_blocking=True)
    stream.synchronize()
    seconds = time.perf_counter() - start
    return {"bytes": total, "seconds": seconds}


def run_child(case: str, path: Path, options: dict, device: str = "cuda") -> dict:
    """One case, timed to every tensor on the device, with peak memory and a fingerprint.

    `seconds` counts from the case's start, its library's import included (these are fresh processes,
    torch imported); `call_seconds` from its first call into the library, after that import, as in a
    process that loads more than once or, for Drainboard, a job child forked from the fork server.

    `device` other than cuda (a dry run of the harness on a CPU box) works for stream, drain, load_file
    and ceil_read only.
    """
    import torch

    from machine.memory import MemoryProbe, PeriodicSampler

    cuda = device.startswith("cuda")
    if cuda:
        torch.empty(0, device=device)
    # Every case alike: torch's import-time objects are frozen, as in a job child forked by the fork server,
    # so whichever case happens to trigger the interpreter's first full collection does not pay for
    # walking them (65 ms of a 639-tensor load's set-up on the 2-core box).
    gc.collect()
    gc.freeze()
    if case == "ceil_h2d":
        return _ceil_h2d(path)
    if case in ("ceil_read", "ceil_direct", "ceil_direct_seq"):
        if case == "ceil_read":
            return _ceil_read(path, 16, False, 8 * _MiB)
        return _ceil_read(path, 1 if case == "ceil_direct_seq" else 16, True, 64 * _MiB)
    keep: list = []
    run = {
        "stream": lambda: _case_stream(path, options, device),
        "stream_unregistered": lambda: _case_stream_unregistered(path, options, device),
        "kvikio": lambda: _case_kvikio(path, options),
        "drain": lambda: _case_drain(path, device),
        "instanttensor": lambda: _case_instanttensor(path, None),
        "instanttensor_buffered": lambda: _case_instanttensor(path, "BUFFERED"),
        "instanttensor_mmap": lambda: _case_instanttensor(path, "MMAP"),
        "st_prefetch": lambda: _case_st_prefetch(path),
        "fastsafetensors": lambda: _case_fastsafetensors(path, keep),
        "runai": lambda: _case_runai(path),
        "load_file": lambda: _case_load_file(path, device),
    }[case]
    samples = []
    free_before = torch.cuda.mem_get_info()[0] if cuda else 0
    with MemoryProbe(device) as probe:
        base = probe.sample()
        with PeriodicSampler(probe, 0.005, samples.append):
            start = time.perf_counter()
            tensors, extra = run()
            if cuda:
                torch.cuda.synchronize()
            end = time.perf_counter()
        samples.append(probe.sample())
    if isinstance(tensors, torch.nn.Module):  # Drainboard hands back the model; its state dict is not part of the load
        tensors = dict(tensors.state_dict())
    free_after = torch.cuda.mem_get_info()[0] if cuda else 0
    placed = sum(t.numel() * t.element_size() for t in tensors.values())
    host = max(s.vm_rss for s in samples) - base.vm_rss
    return {
        "bytes": placed,
        "tensors": len(tensors),
        "seconds": end - start,
        "call_seconds": end - _IMPORTS_DONE[0],
        "footprint_ratio": max((s.vm_rss - base.vm_rss) + (s.device_allocated - base.device_allocated) for s in samples) / placed,
        "host_peak_ratio": host / placed,
        "device_used_ratio": (free_before - free_after) / placed,
        "fingerprint": fingerprint(tensors),
        **extra,
    }


# ---- parent: cache states, fresh processes, the table ---------------------------------------------------

def _warm(path: Path) -> None:
    from loader.io.pagecache import files_resident_fraction

    if files_resident_fraction(shard_files(path)) < 0.99:
        fds = {f: os.open(f, os.O_RDONLY) for f in shard_files(path)}
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda p: len(os.pread(fds[p[0]], p[2], p[1])), _pieces(path, 64 * _MiB)))
        for fd in fds.values():
            os.close(fd)


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def parse_case(text: str) -> tuple[str, dict]:
    """`stream[threads=8,staging_bytes=64MiB,direct_io=false]` -> ("stream", {...}); `kvikio[threads=16,...]`
    likewise (sizes and flags read the same way); other cases take no options."""
    from bench_load import parse_stream_option

    name, _, rest = text.partition("[")
    if name not in CASES:
        raise argparse.ArgumentTypeError(f"unknown case {name!r}; known: {', '.join(CASES)}")
    items = [item for item in rest.rstrip("]").split(",") if item]
    if items and name not in _OPTIONS:
        raise argparse.ArgumentTypeError(f"case {text!r}: only {', '.join(_OPTIONS)} take options")
    options = {}
    for item in items:
        key = item.partition("=")[0]
        if _OPTIONS[name] is not None and key not in _OPTIONS[name]:
            raise argparse.ArgumentTypeError(f"case {text!r}: {name} takes {', '.join(_OPTIONS[name])}, not {key!r}")
        options.update([_kvikio_option(item) if name == "kvikio" else parse_stream_option(item)])
    return name, options


def _kvikio_option(item: str) -> tuple[str, object]:
    """compat=on|off|auto (KVIKIO_COMPAT_MODE), direct=true|false, sizes and counts as stream's options."""
    from bench_load import parse_stream_option

    key, _, value = item.partition("=")
    if key == "compat":
        if value.upper() not in ("ON", "OFF", "AUTO"):
            raise argparse.ArgumentTypeError(f"kvikio option compat={value!r}: expected on, off or auto")
        return key, value.upper()
    if key == "direct":
        if value.lower() not in ("true", "false", "1", "0"):
            raise argparse.ArgumentTypeError(f"kvikio option direct={value!r}: expected true or false")
        return key, value.lower() in ("true", "1")
    return parse_stream_option(item)


def _spawn(case: str, path: Path, options: dict, args: argparse.Namespace, timeout: float) -> dict:
    cmd = [sys.executable, __file__, str(path), "--child", case, "--options", json.dumps(options), "--device", args.device]
    env = dict(os.environ)
    if case == "st_prefetch" and args.prefetch_site:
        env["PYTHONPATH"] = os.pathsep.join([str(args.prefetch_site), env.get("PYTHONPATH", "")])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        lines = [l for l in done.stderr.strip().splitlines() if l.strip()] or [f"exit {done.returncode}"]
        return {"error": lines[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shmem_huge_bytes() -> int:
    """Bytes of tmpfs and shared memory held in transparent huge pages (/proc/meminfo ShmemHugePages)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("ShmemHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def _tmpfs_copy(path: Path, where: Path) -> Path | None:
    need = sum(f.stat().st_size for f in path.iterdir())
    if shutil.disk_usage(where).free < need * 1.05:
        return None
    dest = where / "drainboard-peers"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    with ThreadPoolExecutor(10) as ex:
        list(ex.map(lambda f: shutil.copyfile(f, dest / f.name), list(path.iterdir())))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", nargs="?", type=Path)
    parser.add_argument("--make-checkpoint", type=Path, metavar="OUT", help="write the pruned-r16 DiT shapes to OUT and exit")
    parser.add_argument("--dump-specs", action="store_true", help=f"rewrite {SPECS.name} from the synthetic profile and exit")
    parser.add_argument("--specs", type=Path, default=SPECS, help="names and shapes for --make-checkpoint (a small one for a dry run)")
    parser.add_argument("--max-dim", type=int, help="--make-checkpoint clips every dimension to this (a small checkpoint, the same tensors)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run of the harness (stream, drain, load_file, ceil_read)")
    parser.add_argument("--cases", nargs="+", type=parse_case, default=[parse_case(c) for c in CASES])
    parser.add_argument("--cache", nargs="+", default=["warm", "cold", "tmpfs"], choices=["warm", "cold", "tmpfs"])
    parser.add_argument("--cold-cases", nargs="+", type=parse_case, help="cases for the cold cache (default: --cases)")
    parser.add_argument("--tmpfs-cases", nargs="+", type=parse_case, help="cases for tmpfs (default: --cases)")
    parser.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--prefetch-site", type=Path, help="--target folder holding safetensors 0.9.0rc1 for st_prefetch")
    parser.add_argument("--deadline", type=float, default=1e9, help="seconds from start after which cases are skipped")
    parser.add_argument("--case-timeout", type=float, default=120)
    parser.add_argument("--rounds", type=int, default=1, help="run each cache's cases this many times over, interleaved")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--goals-from", type=Path, nargs="+", metavar="JSON",
                        help="print the medians and the goals' ratios over the rows of these --json files and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump_specs:
        dump_specs()
        return 0
    if args.make_checkpoint:
        t = time.perf_counter()
        make_checkpoint(args.make_checkpoint, specs_file=args.specs, max_dim=args.max_dim)
        print(f"wrote {args.make_checkpoint} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        return 0
    if args.child:
        print(json.dumps(run_child(args.child, args.path, json.loads(args.options), args.device)))
        return 0
    if args.goals_from:
        rows = [r for f in args.goals_from for r in json.loads(f.read_text())["rows"]]
        print(format_medians(rows))
        print()
        print(format_goals(rows))
        return 0
    if args.path is None:
        parser.error("give a checkpoint PATH (or --make-checkpoint OUT)")
    # The children import the loader from bytecode, as they import the peers (pip compiles what it installs):
    # compiling its source in each fresh process took 32 ms of the timed region on the 2-core box.
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "loader", quiet=1)
    began = time.perf_counter()
    rows: list[dict] = []
    plan = {"warm": args.cases, "cold": args.cold_cases or args.cases, "tmpfs": args.tmpfs_cases or args.cases}
    for cache in args.cache:
        path = args.path
        if cache == "cold" and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
            rows += [{"case": n, "options": o, "cache": cache, "error": "cannot drop caches (not root)"} for n, o in plan[cache]]
            continue
        if cache == "tmpfs":
            path = _tmpfs_copy(args.path, args.tmpfs)
            if path is None:
                rows += [{"case": n, "options": o, "cache": cache, "error": f"{args.tmpfs} too small"} for n, o in plan[cache]]
                continue
            _drop_caches()  # the disk copy's pages go; the tmpfs copy is memory itself
        for name, options in plan[cache] * max(args.rounds, 1):
            row = {"case": name, "options": options, "cache": cache}
            left = args.deadline - (time.perf_counter() - began)
            if left < 20:
                rows.append({**row, "error": "skipped: out of time"})
                continue
            if cache == "warm":
                _warm(path)
            elif cache == "cold":
                _drop_caches()
            else:  # tmpfs reads ran from 22 to 44 GB/s across hosts: huge or 4 KiB pages may be why
                row["shmem_huge_gib"] = _shmem_huge_bytes() / 2**30
            t = time.perf_counter()
            result = _spawn(name, path, options, args, min(args.case_timeout, left))
            row.update(result, wall=time.perf_counter() - t)
            if "seconds" in result:
                row["gbps"] = result["bytes"] / result["seconds"] / 1e9
            if "call_seconds" in result:
                row["call_gbps"] = result["bytes"] / result["call_seconds"] / 1e9
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        if cache == "tmpfs":
            shutil.rmtree(path, ignore_errors=True)
    table = format_table(rows)
    print(table)
    if args.rounds > 1:
        print()
        print(format_medians(rows))
    if args.json:
        args.json.write_text(json.dumps({"path": str(args.path), "rows": rows}, indent=2))
    return 0


def _label(row: dict) -> str:
    opts = ",".join(f"{k}={v}" for k, v in row["options"].items())
    note = f" ({row['backend']} after io_uring failed)" if "backend" in row else ""
    return row["case"] + (f"[{opts}]" if opts else "") + note


def format_table(rows: list[dict]) -> str:
    """One line per case and cache: GB/s, its ratio to the matching ceiling, footprint, fingerprint check."""
    fingerprints = [r["fingerprint"] for r in rows if "fingerprint" in r]
    reference = max(set(fingerprints), key=fingerprints.count) if fingerprints else None
    ceiling = {}
    for r in rows:
        if "gbps" in r and r["case"] in CEILINGS:
            key = "h2d" if r["case"] == "ceil_h2d" else r["cache"]
            ceiling[key] = max(ceiling.get(key, 0), r["gbps"])
    out = ["| case | cache | GB/s | / h2d ceiling | / read ceiling | call GB/s | footprint | host peak | device used | fingerprint |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {_label(r)} | {r['cache']} | {r['error']} | | | | | | | |")
            continue
        g = r["gbps"]
        h2d = f"{g / ceiling['h2d']:.2f}" if ceiling.get("h2d") and r["case"] not in CEILINGS else ""
        read = f"{g / ceiling[r['cache']]:.2f}" if ceiling.get(r["cache"]) and r["case"] not in CEILINGS else ""
        cells = [f"{g:.2f}", h2d, read, f"{r['call_gbps']:.2f}" if "call_gbps" in r else ""]
        if "footprint_ratio" in r:
            ok = "same" if r["fingerprint"] == reference else f"DIFFERS {r['fingerprint']}"
            cells += [f"{r['footprint_ratio']:.3f}", f"{r['host_peak_ratio']:.3f}", f"{r['device_used_ratio']:.3f}", ok]
        else:
            cells += ["", "", "", ""]
        out.append(f"| {_label(r)} | {r['cache']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_medians(rows: list[dict]) -> str:
    """One line per case and cache over its runs: median and range of GB/s (and of call GB/s), in first-run order."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if "gbps" in r:
            runs.setdefault((_label(r), r["cache"]), []).append(r)
    out = ["| case | cache | runs | median GB/s | min-max GB/s | median call GB/s |", "|---|---|---|---|---|---|"]
    for (label, cache), group in runs.items():
        rates = [r["gbps"] for r in group]
        calls = [r["call_gbps"] for r in group if "call_gbps" in r]
        call = f"{statistics.median(calls):.2f}" if calls else ""
        out.append(f"| {label} | {cache} | {len(rates)} | {statistics.median(rates):.2f} | {min(rates):.2f}-{max(rates):.2f} | {call} |")
    return "\n".join(out)


def format_goals(rows: list[dict]) -> str:
    """The loader's goals on the GPU host (docs/benchmarks.md), each as a ratio of medians over the rows'
    rounds, its target, and whether it is met; KvikIO's variants against `stream` in the same cache."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if "gbps" in r:
            runs.setdefault((_label(r), r["cache"]), []).append(r)

    def median(label: str, cache: str, key: str = "gbps") -> float | None:
        values = [r[key] for r in runs.get((label, cache), []) if key in r]
        return statistics.median(values) if values else None

    out = ["| goal | measured | target | met |", "|---|---|---|---|"]

    def goal(name: str, value: float | None, target: float, *, at_most: bool = False) -> None:
        if value is None:
            out.append(f"| {name} | not measured | {'<=' if at_most else '>='} {target:.2f} | |")
            return
        met = value <= target if at_most else value >= target
        out.append(f"| {name} | {value:.3f} | {'<=' if at_most else '>='} {target:.2f} | {'yes' if met else 'NO'} |")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    stream_warm = median("stream", "warm")
    goal("warm: stream / pinned h2d ceiling", ratio(stream_warm, median("ceil_h2d", "warm")), 0.88)
    ours = [r["gbps"] for r in runs.get(("stream", "warm"), [])]
    theirs = [r["gbps"] for r in runs.get(("instanttensor_buffered", "warm"), [])]
    if ours and theirs:
        ahead = sum(a > b for a, b in zip(ours, theirs))
        goal(f"warm: rounds stream ahead of instanttensor_buffered ({ahead} of {min(len(ours), len(theirs))})",
             ahead / min(len(ours), len(theirs)), 1.0)
    stream_tmpfs = median("stream", "tmpfs")
    goal("tmpfs: stream / instanttensor default (mmap)", ratio(stream_tmpfs, median("instanttensor", "tmpfs")), 1.0)
    goal("tmpfs: stream / instanttensor_mmap", ratio(stream_tmpfs, median("instanttensor_mmap", "tmpfs")), 1.0)
    goal("tmpfs: stream footprint", median("stream", "tmpfs", "footprint_ratio"), 1.02, at_most=True)
    direct = [x for x in (median("ceil_direct", "cold"), median("ceil_direct_seq", "cold")) if x is not None]
    goal("cold: stream / best raw O_DIRECT read", ratio(median("stream", "cold"), max(direct) if direct else None), 0.98)
    goal("warm: registration refused / registered", ratio(median("stream_unregistered", "warm"), stream_warm), 0.85)
    for (label, cache) in runs:
        if label.startswith("kvikio"):
            value = ratio(median(label, cache), median("stream", cache))
            out.append(f"| {cache}: {label} / stream | {value:.3f} | (peer) | |" if value is not None
                       else f"| {cache}: {label} / stream | no stream row | (peer) | |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
