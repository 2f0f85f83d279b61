"""Benchmark (not a test): `stream`'s CUDA ring in several variants, round-robin in one process, medians.

These hosts drift by a third from one fresh process to the next, so variants
compared one sample each can mislead. Here every variant loads the same warm
checkpoint `--reps` times, interleaved, freeing the model (and torch's cached
device blocks) between loads, and the medians are compared. A variant is
`stream` options, plus module constants of `loader.placement.ranges` or
`.stream` in upper case:

    python bench/bench_ring_variants.py /tmp/pruned-r16 "" "COPY_QUEUE=1" "staging_buffers=12" --reps 5

`engine` is the seconds the copy stream was busy (timing events around each
chunk's copies): near the load's time, the copies are the limit and run at
`engine GB/s`; well under it, the copy engine waited for the loader. Where
it waited: `lead` (from the call to the first copy: set-up, discovery, the
first reads), `gaps` (between two chunks' copies, summed; `gaps_n` of them
over 0.1 ms, before chunks of `gap_parts` tensor pieces on average against
`parts` over all chunks) and `tail` (from the last copy to the call's return).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_variant(text: str) -> tuple[dict, dict]:
    """("stream options", "module constants") of `COPY_QUEUE=1,staging_buffers=12`."""
    from bench_load import parse_stream_option

    options, constants = {}, {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.isupper():
            constants[key] = int(value)
        else:
            options.update([parse_stream_option(item)])
    return options, constants


def _timed_retire(marks: list):
    """RangeRing._retire that brackets each chunk's copies with timing events on its copy stream."""
    import torch

    from loader.placement.ranges import RangeRing

    plain = RangeRing._retire

    def retire(ring) -> None:
        chunk, k, _ = ring._flight[0]
        stream = ring._streams[k % len(ring._streams)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        plain(ring)
        end.record(stream)
        marks.append((start, end, len(chunk.parts)))

    return plain, retire


def load_once(path: str, options: dict, constants: dict) -> dict:
    import torch

    from loader import LoadOptions, load_checkpoint
    from loader.placement import get_placement, ranges, stream

    saved = {}
    for key, value in constants.items():
        module = ranges if hasattr(ranges, key) else stream
        if not hasattr(module, key):
            raise SystemExit(f"no constant {key} in loader.placement.ranges or .stream")
        saved[key] = (module, getattr(module, key))
        setattr(module, key, value)
    marks: list = []
    plain, ranges.RangeRing._retire = _timed_retire(marks)
    try:
        placement = get_placement("stream", **options)
        torch.cuda.synchronize()
        origin = torch.cuda.Event(enable_timing=True)
        origin.record()
        start = time.perf_counter()
        model, report = load_checkpoint(path, LoadOptions(mode=placement, device="cuda"))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        ranges.RangeRing._retire = plain
        for key, (module, value) in saved.items():
            setattr(module, key, value)
    engine = sum(a.elapsed_time(b) for a, b, _ in marks) / 1e3
    gaps = [(end.elapsed_time(nxt) / 1e3, parts) for (_, end, _), (nxt, _, parts) in zip(marks, marks[1:])]
    long_gaps = [parts for g, parts in gaps if g > 1e-4]
    row = {"seconds": seconds, "gbps": report.bytes_read / seconds / 1e9, "load_seconds": report.load_seconds,
           "engine": engine, "engine_gbps": report.bytes_read / engine / 1e9,
           "lead": origin.elapsed_time(marks[0][0]) / 1e3, "gaps": sum(g for g, _ in gaps), "gaps_n": float(len(long_gaps)),
           "parts": statistics.mean(p for *_, p in marks), "gap_parts": statistics.mean(long_gaps) if long_gaps else 0.0,
           "tail": seconds - origin.elapsed_time(marks[-1][1]) / 1e3}
    row.update({k: v for k, v in vars(placement.last_ring).items() if isinstance(v, float)})
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("variants", nargs="+", help='"" is the default; else options and CONSTANTS, comma-separated')
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    import torch

    torch.empty(0, device="cuda")
    parsed = [parse_variant(v) for v in args.variants]
    load_once(args.path, *parsed[0])  # the first load of a process pays CUDA's lazy set-up
    rows: dict[int, list[dict]] = {i: [] for i in range(len(parsed))}
    for _ in range(args.reps):
        for i, variant in enumerate(parsed):
            rows[i].append(load_once(args.path, *variant))
    stats = [k for k in rows[0][0] if k not in ("seconds", "gbps", "load_seconds", "engine", "engine_gbps")]
    print("| variant | median GB/s | min-max GB/s | load s | engine s | engine GB/s | " + " | ".join(stats) + " |")
    print("|---" * (6 + len(stats)) + "|")
    for i, text in enumerate(args.variants):
        r = rows[i]
        med = {k: statistics.median(x[k] for x in r) for k in r[0]}
        rates = [x["gbps"] for x in r]
        print(
            f"| {text or 'default'} | {med['gbps']:.1f} | {min(rates):.1f}-{max(rates):.1f} | {med['load_seconds']:.3f} | "
            f"{med['engine']:.3f} | {med['engine_gbps']:.1f} | " + " | ".join(f"{med[k]:.3f}" for k in stats) + " |",
            flush=True,
        )


if __name__ == "__main__":
    main()
