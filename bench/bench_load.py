"""Loader benchmark (not a test): the three placement modes against the usual baselines, warm and cold.

Each case runs in a fresh subprocess so every load starts from the same
memory baseline. Cases: `stream`, `drain`, `retain` (load_checkpoint),
`load_file` (safetensors.torch.load_file per shard + load_state_dict into a
module materialised with to_empty) and `assign` (load_file +
load_state_dict(assign=True) into the meta module). `raw` reads the same
files sequentially into one reused buffer in the same cache state, giving
raw_read_gbps and read_efficiency = throughput_gbps / raw_read_gbps.
Cold runs drop the page cache (`/proc/sys/vm/drop_caches`, needs root).

    python bench/bench_load.py CHECKPOINT [--device cuda] [--cache warm cold]
    python bench/bench_load.py --make-checkpoint 16GiB --out /tmp/bench_ckpt --device cuda

With `--repeat N` every case (and its raw read) runs N times, interleaved,
and the table shows each column's median: on a VM the same case can vary
by 2x between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.command_line import size_type  # noqa: E402 (after the path line)
from core.sizes import parse_size  # noqa: E402

CASES = ("stream", "drain", "retain", "load_file", "assign")


def make_checkpoint(out: Path, size: int, shard_size: int) -> Path:
    """Write a bf16 component folder of about `size` bytes: 7168 x 5376 tensors (H3 attention shape),
    deterministic, never zeros, in shards of about `shard_size`, with an index and a config.json."""
    import torch

    from loader.safetensors_file import TensorSpec, plan_shards, write_component

    shape = (7168, 5376)
    count = max(1, size // (shape[0] * shape[1] * 2))
    specs = [TensorSpec(f"transformer_blocks.{i // 4}.attn.to_{'qkvo'[i % 4]}.weight", shape, torch.bfloat16) for i in range(count)]
    base = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) + 3.0).to(torch.bfloat16)
    scale = {spec.name: 1 + i / 64 for i, spec in enumerate(specs)}
    folder = write_component(
        out, plan_shards(specs, shard_size), lambda spec: iter([(base * scale[spec.name]).view(-1)]),
        stem="diffusion_pytorch_model",
    )
    (folder / "config.json").write_text(json.dumps({"_class_name": "BenchSynthetic"}))
    return folder


def _files(path: Path) -> list[Path]:
    from loader import discover_checkpoint

    return [s.path for s in discover_checkpoint(path).component().shards]


def _raw_read(path: Path) -> dict:
    import torch

    buf = torch.empty(64 << 20, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    total, start = 0, time.perf_counter()
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            while n := os.readv(fd, [view]):
                total += n
        finally:
            os.close(fd)
    seconds = time.perf_counter() - start
    return {"bytes_read": total, "load_seconds": seconds, "raw_read_gbps": total / seconds / 1e9}


def _baseline_load(path: Path, device: str, assign: bool) -> dict:
    """load_file per shard into one dict, then load_state_dict; sampled every 5 ms for the peak."""
    import torch
    from safetensors.torch import load_file

    from machine import MemoryProbe
    from loader import discover_checkpoint, resolve_device
    from machine.memory import PeriodicSampler
    from loader.skeleton import build_skeleton

    dev = resolve_device(device)
    component = discover_checkpoint(path).component()
    module = build_skeleton((t.name, t.shape, t.torch_dtype) for t in component.tensors)
    if dev.type == "cuda":
        torch.empty(0, device=dev)
    samples = []
    with MemoryProbe(str(dev)) as probe:
        base = probe.sample()
        with PeriodicSampler(probe, 0.005, samples.append):
            start = time.perf_counter()
            if not assign:
                module.to_empty(device=dev)
            state = {}
            for shard in component.shards:
                state.update(load_file(shard.path, device=str(dev)))
            module.load_state_dict(state, assign=assign)
            del state
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            seconds = time.perf_counter() - start
        samples.append(probe.sample())
    placed = sum(p.nbytes for p in module.state_dict().values())
    read = component.total_bytes
    return {
        "bytes_placed": placed,
        "bytes_read": read,
        "load_seconds": seconds,
        "throughput_gbps": read / seconds / 1e9,
        "footprint_ratio": max((s.vm_rss - base.vm_rss) + (s.device_allocated - base.device_allocated) for s in samples) / placed,
        "host_peak_ratio": (max(s.vm_rss for s in samples) - base.vm_rss) / placed,
        "memavailable_cost_ratio": (base.mem_available - min(s.mem_available for s in samples)) / placed,
    }


_FLAGS = ("pin", "direct_io", "drop_page_cache", "ranges", "io_uring", "driver_copies", "reserve")
"""Stream options that are true / false (direct_io, drop_page_cache and io_uring also none: the default's choice)."""


def parse_stream_option(text: str) -> tuple[str, int | bool | None]:
    """`KEY=VALUE` for the stream placement: sizes (`staging_bytes=32MiB`) and counts become ints, flags bools."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"stream option {text!r} is not KEY=VALUE")
    if key in _FLAGS:
        flags = {"1": True, "true": True, "0": False, "false": False, "none": None}
        if value.lower() not in flags:
            raise argparse.ArgumentTypeError(f"stream option {key}={value!r}: expected true, false or none")
        return key, flags[value.lower()]
    try:
        return key, parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"stream option {key}: {exc}") from None


def option_text(value: int | bool | None) -> str:
    """A parsed stream option value as `parse_stream_option` reads it back."""
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)


def run_child(case: str, path: Path, device: str, dtype: str | None, stream_options: dict | None = None) -> dict:
    if case == "raw":
        return _raw_read(path)
    if case in ("load_file", "assign"):
        return _baseline_load(path, device, assign=case == "assign")
    from loader import LoadOptions, load_checkpoint
    from loader.placement import get_placement

    mode = get_placement(case, **stream_options) if case == "stream" and stream_options else case
    _, report = load_checkpoint(path, LoadOptions(mode=mode, device=device, dtype=dtype))
    return {k: v for k, v in report.to_dict().items() if not isinstance(v, list)}


def _prepare_cache(path: Path, cache: str) -> None:
    if cache == "cold":
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    else:
        _raw_read(path)


def _spawn(case: str, path: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, str(path), "--child", case, "--device", args.device]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    for key, value in args.stream_option:
        cmd += ["--stream-option", f"{key}={option_text(value)}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]}
    return json.loads(result.stdout)


def medians(rows: list[dict]) -> list[dict]:
    """One row per (case, cache), in first-seen order: each column's median over the repeats (errors kept)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["case"], row["cache"]), []).append(row)
    table = []
    for (case, cache), group in groups.items():
        ok = [r for r in group if "error" not in r]
        if not ok:
            table.append(group[0])
            continue
        table.append({"case": case, "cache": cache, **{c: statistics.median(r[c] for r in ok) for c in COLUMNS if c in ok[0]}})
    return table


def _cell(row: dict, column: str, device: str) -> str:
    if "error" in row:
        return row["error"] if column == COLUMNS[0] else ""
    if row["case"] == "assign" and device == "cpu" and column in ("throughput_gbps", "read_efficiency"):
        return "(lazy)"  # assign=True installs the mmap views; nothing is read during the load
    return f"{row[column]:.3f}" if column in row else ""


COLUMNS = ("footprint_ratio", "host_peak_ratio", "memavailable_cost_ratio", "throughput_gbps", "raw_read_gbps", "read_efficiency", "load_seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", nargs="?", type=Path, help="checkpoint (component folder, file or model folder)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="target dtype for the loader modes")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--cache", nargs="+", default=["warm", "cold"], choices=["warm", "cold"])
    parser.add_argument("--make-checkpoint", type=size_type(), metavar="SIZE", help="first write a synthetic bf16 checkpoint of SIZE (e.g. 16GiB)")
    parser.add_argument("--shard-size", type=size_type(), default=parse_size("4GiB"), help="shard size for --make-checkpoint")
    parser.add_argument("--out", type=Path, help="where --make-checkpoint writes (default: PATH)")
    parser.add_argument("--repeat", type=int, default=1, help="run every case N times; the table shows medians")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--stream-option", type=parse_stream_option, action="append", default=[], metavar="KEY=VALUE",
        help="option for the stream placement, repeatable (threads=2, staging_buffers=4, staging_bytes=32MiB, readahead_bytes=0)",
    )
    parser.add_argument("--label", help="name for this run's settings in the table and JSON (default: the stream options)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.path, args.device, args.dtype, dict(args.stream_option))))
        return 0
    if args.stream_option:
        from core.errors import PlacementError
        from loader.placement import get_placement

        try:
            get_placement("stream", **dict(args.stream_option))
        except PlacementError as exc:
            parser.error(str(exc))
    path = args.path or args.out
    if path is None:
        parser.error("give a checkpoint PATH, or --make-checkpoint SIZE with --out")
    if args.make_checkpoint:
        if not (path / "config.json").exists():
            print(f"writing {args.make_checkpoint / 2**30:.1f} GiB to {path} ...", file=sys.stderr)
            make_checkpoint(path, args.make_checkpoint, args.shard_size)
    if "cold" in args.cache and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        print("cannot drop caches here (not root?); running warm only", file=sys.stderr)
        args.cache = [c for c in args.cache if c != "cold"]
    size = sum(f.stat().st_size for f in _files(path))
    print(f"checkpoint {path}: {size / 2**30:.2f} GiB in {len(_files(path))} shard(s); device {args.device}", file=sys.stderr)
    rows = []
    for repeat in range(args.repeat):
        for cache in args.cache:
            _prepare_cache(path, cache)
            raw = _spawn("raw", path, args)
            for case in args.cases:
                _prepare_cache(path, cache)
                result = _spawn(case, path, args)
                if "throughput_gbps" in result:
                    result["raw_read_gbps"] = raw["raw_read_gbps"]
                    result["read_efficiency"] = result["throughput_gbps"] / raw["raw_read_gbps"]
                rows.append({"case": case, "cache": cache, "repeat": repeat, **result})
                print(f"  {cache} {case}: " + json.dumps({k: result.get(k) for k in COLUMNS if k in result} or result), file=sys.stderr)
    table = medians(rows)
    label = args.label or " ".join(f"{k}={option_text(v)}" for k, v in args.stream_option) or "default"
    print(f"stream settings: {label}")
    if args.repeat > 1:
        print(f"medians of {args.repeat} runs")
    print("| case | cache | " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * (len(COLUMNS) + 2))
    for row in table:
        cells = [_cell(row, c, args.device) for c in COLUMNS]
        print(f"| {row['case']} | {row['cache']} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"path": str(path), "device": args.device, "bytes": size, "repeat": args.repeat, "label": label, "stream_options": dict(args.stream_option), "medians": table, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
