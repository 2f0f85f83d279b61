"""MiniMax H3 t2va at real size, Drainboard's generate against diffusers' own pipeline, stage by stage (not a test).

On one H200 (diffusers and av carried as wheels in .whl/; see bench/device_generate.sh, which runs exactly this):

    python bench/bench_h3_generate.py --work .h3gen --shm /dev/shm/h3gen --device cuda --budget 540 --out "$OUT"
    python bench/bench_h3_generate.py ... --budget 510 --resume   # call 2: the runs call 1 did not reach
    # (on a fresh machine, where WORK/results is gone, name them: --runs ours-resident@g2,diffusers-resident@g2,...)

A dry run of the whole harness on a CPU (both sides, frames compared):

    python bench/bench_h3_generate.py --profile tiny --work /tmp/h3gen --shm /tmp/h3gen-shm --geometry2 64x96 --budget 300

`--workflow fl2va` / `ref2va` runs ours only, from inputs it writes (`write_inputs`: fl2va's first and last
frame at the run's canvas; ref2va's reference image at the canvas and a 5 s reference clip with a soundtrack,
and the checkpoint gains `transformer_ref`), for the forecast's conditioning terms at real size
(`bench/check_forecast_cuda.py` forecasts such runs too).

1. Checkpoint: the profile's random-weight checkpoint in the release layout. The DiT is written to `--work`
   (disk) when it fits there, the rest to `--shm` (tmpfs), by two writer processes at once; the root in `--shm` links the
   DiT folder in. Without room on disk for the whole DiT, it is written to tmpfs and as many of its shards
   as fit are moved to disk and linked back. A complete checkpoint found there is reused (nothing written).
2. Runs, each in a fresh process, in this order (`--runs` picks and orders them; `@g2` is `--geometry2`):
   ours-resident, diffusers-resident, ours-sequential, ours-offload, diffusers-offload, then the same at g2.
   ours: `models.run.pipeline.run_generate` with what `python -m models generate ROOT --device D` passes for
   `--no-offload` (resident), `--no-offload --sequential-components` (sequential) and the default flags
   (offload). diffusers: `ModularPipeline.from_pretrained(ROOT, workflow="t2va")`, `load_components` one
   component at a time (`dtype=torch.bfloat16`; resident with `device_map=D`, straight onto the device),
   offload as `ComponentsManager.enable_auto_cpu_offload(device=D)` (the modular pipeline's model offload).
   A run the arithmetic says cannot fit (weights against the device's memory, or host RAM beside the
   tmpfs files) is skipped with the numbers; so is one the remaining `--budget` would not finish.
3. Measured per stage (load.<component>, text_encoder, denoise.denoise, decode.video, decode.audio):
   seconds; peak VmRSS and RssAnon (sampled every 20 ms); peak CUDA allocated and reserved (the allocator's
   exact maxima, reset at each stage); and the peak of VmRSS + reserved (what a unified-memory box pays).
   The compute stages are timed identically on both sides: the classes' forward / decode methods are
   wrapped (a synchronize before and after), so a DiT call is one step. Frames: SHA-256 of the float32
   video and of the uint8 frames, and the largest uint8 difference on a subsample against diffusers'.
Prints a table per geometry and writes one JSON summary (`--out`/generate_h3.json). Each run's result is
also kept in `--work`/results, so `--resume` skips runs already measured there.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_forecast_cuda import with_reference_dit, write_sparse_h3  # noqa: E402  (bench/ is not a package)
from loader.process import configure_process  # noqa: E402

configure_process()  # an entry point: the hub offline, the mmap threshold fixed, as a job child

GiB = 2**30
PROMPT = "a red fox running through fresh snow at dawn"
WEIGHTS = ("text_encoder", "transformer", "vae", "audio_vae")
AUX = ("tokenizer", "processor", "scheduler", "audio_scheduler")
TIMED = {"text_encoder": ("transformers", "Qwen3VLModel", "forward"),
         "denoise.denoise": ("diffusers", "MiniMaxH3Transformer3DModel", "forward"),
         "decode.video": ("diffusers", "AutoencoderKLMiniMaxH3", "decode"),
         "decode.audio": ("diffusers", "AutoencoderKLMiniMaxH3Audio", "decode")}
"""Compute stage -> the method timed on both sides (text_encoder: the Qwen3-VL body the encode block calls)."""
ORDER = ("ours-resident", "diffusers-resident", "ours-sequential", "ours-offload", "diffusers-offload")
STAGES = tuple(f"load.{c}" for c in WEIGHTS) + tuple(TIMED)
_T0 = time.monotonic()


def log(message: str) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
    print(f"[{now} +{time.monotonic() - _T0:6.1f}s] {message}", flush=True)


# ---------------------------------------------------------------- measuring (both children)


def _status() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in bytes."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:")):
                key, kb = line.split()[:2]
                values[key] = int(kb) * 1024
    return values.get("VmRSS:", 0), values.get("RssAnon:", 0)


class Tracker:
    """Per stage: seconds, peak host RSS / anon, exact CUDA allocated / reserved maxima, and the sampled
    peak of VmRSS + reserved. `enter` starts a stage (the previous one ends there)."""

    def __init__(self, device: str, interval: float = 0.02):
        import torch

        self.torch, self.cuda = torch, device.startswith("cuda")
        self.device = torch.device(device)
        self.stage: str | None = None
        self.started = 0.0
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, dict[str, int]] = {}
        self.calls: dict[str, list[float]] = {}
        self.depth = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def sample(self) -> None:
        rss, anon = _status()
        alloc = reserved = 0
        if self.cuda:
            alloc = self.torch.cuda.memory_allocated(self.device)
            reserved = self.torch.cuda.memory_reserved(self.device)
        with self._lock:
            if self.stage is None:
                return
            p = self.peaks.setdefault(self.stage, {"host_rss": 0, "host_anon": 0, "device_allocated": 0,
                                                   "device_reserved": 0, "sum": 0})
            for key, value in (("host_rss", rss), ("host_anon", anon), ("device_allocated", alloc),
                               ("device_reserved", reserved), ("sum", rss + reserved)):
                p[key] = max(p[key], value)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def enter(self, stage: str | None) -> None:
        self.sync()
        self.sample()
        with self._lock:
            now = time.monotonic()
            if self.stage is not None:
                self.seconds[self.stage] = self.seconds.get(self.stage, 0.0) + now - self.started
                if self.cuda:
                    p = self.peaks.setdefault(self.stage, {"host_rss": 0, "host_anon": 0, "device_allocated": 0,
                                                           "device_reserved": 0, "sum": 0})
                    p["device_allocated"] = max(p["device_allocated"],
                                                self.torch.cuda.max_memory_allocated(self.device))
                    p["device_reserved"] = max(p["device_reserved"], self.torch.cuda.max_memory_reserved(self.device))
            if self.cuda:
                self.torch.cuda.reset_peak_memory_stats(self.device)
            self.stage, self.started = stage, now
        self.sample()

    def close(self) -> None:
        self.enter(None)
        self._stop.set()
        self._thread.join()

    def time_methods(self, set_stage: bool) -> None:
        """Wrap TIMED's methods on their classes: each outermost call synchronizes, is timed, and (with
        `set_stage`, for a pipeline that reports no stages of its own) enters its stage."""
        import importlib

        for stage, (library, cls_name, method) in TIMED.items():
            cls = getattr(importlib.import_module(library), cls_name)
            setattr(cls, method, self._timed(getattr(cls, method), stage, set_stage))

    def _timed(self, fn, stage: str, set_stage: bool):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            if set_stage and self.stage != stage:
                self.enter(stage)
            self.sync()
            start = time.monotonic()
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                self.sync()
                self.calls.setdefault(stage, []).append(time.monotonic() - start)
        return wrapper


def _frames_record(frames, work: Path, run: str) -> dict:
    """The uint8 frames' SHA-256 and a subsample of them saved for the comparison."""
    import numpy as np

    sub = work / "frames" / f"{run}.npy"
    sub.parent.mkdir(parents=True, exist_ok=True)
    np.save(sub, frames[::4, ::4, ::4])
    return {"frames_sha256": hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest(),
            "frames_shape": list(frames.shape), "subsample": str(sub)}


def child_ours(args, tracker: Tracker) -> dict:
    import torch

    import models.run.pipeline as pipeline
    from loader.io import host_blocks
    from machine.offload import OffloadSettings
    from models.request.params import GenerateParams

    offload = args.placement in ("offload", "offloadseq")
    settings = OffloadSettings(dit_layerwise_offload=offload, dit_cpu_offload=offload, text_encoder_cpu_offload=offload,
                               image_encoder_cpu_offload=offload, vae_cpu_offload=offload, pin_cpu_memory=True)
    captured = {}
    write_mp4 = pipeline.write_mp4

    def capture(out_path, frames, *rest):  # the uint8 frames the encoder gets, as ours computed them
        captured["frames"] = frames
        return write_mp4(out_path, frames, *rest)

    pipeline.write_mp4 = capture

    def on_event(event) -> None:
        if event.kind == "stage_start":
            tracker.enter(event.stage)
            if args.device == "cuda":  # which stage first holds pinned memory, and whether registration serves it
                held = torch.cuda.host_memory_stats()
                log(f"  [{event.stage}] pinned blocks held {held.get('num_host_alloc', 0) - held.get('num_host_free', 0)}"
                    f", registration {host_blocks._register_mode}")
        elif event.kind in ("load", "release", "offload_decision"):
            log(f"  [{event.stage}] {event.message}")

    clip = Path(args.work) / "clips" / f"{args.run}.mp4"
    clip.parent.mkdir(parents=True, exist_ok=True)
    inputs = write_inputs(Path(args.work) / "inputs" / args.run, args.workflow, args.width, args.height)
    params = GenerateParams(prompt=PROMPT, frames=args.frames, height=args.height, width=args.width,
                            steps=args.steps, seed=args.seed, quantize=args.quantize, **inputs)
    start = time.monotonic()
    configure_process(args.device)  # the device's settings, before anything pins
    result = pipeline.run_generate(
        args.root, params, clip, device=args.device, offload=settings,
        sequential_components=True if args.placement in ("sequential", "offloadseq") else (None if offload else False),
        on_event=on_event, roots=args.roots)
    job = time.monotonic() - start - result.stage_seconds.get("encode", 0.0)
    record = _frames_record(captured["frames"], Path(args.work), args.run)
    if record["frames_sha256"] != result.frames_sha256:
        raise RuntimeError("the frames captured at the encoder are not the ones GenerateResult digested")
    record["video_sha256"] = result.video_sha256
    return {"job_seconds": job, "stage_seconds": result.stage_seconds, "placements": result.placements,
            "decisions": result.decisions, "sequential_components": result.sequential_components,
            "loads": {c: {k: r.get(k) for k in ("bytes_placed", "bytes_held", "load_seconds", "throughput_gbps",
                                                        "host_pinned_bytes", "host_pinned_note")}
                      for c, r in result.loads.items()}, "host_registration": host_blocks._register_mode,
            "workflow": result.workflow, "inputs": sorted(inputs), **record}


INPUT_IMAGES = {"t2va": (), "fl2va": ("image", "last_image"), "ref2va": ("ref_image",)}
"""The image inputs each workflow is run with here (ref2va also gets a clip)."""


def write_inputs(folder: Path, workflow: str, width: int, height: int) -> dict[str, str]:
    """`workflow`'s input files in `folder`, the same for the same arguments: each image `width` x `height` of
    seeded noise; ref2va's clip 5 s of 320x180 at 30 fps with a 32 kHz stereo soundtrack (normalized by the
    setup onto 24 fps and the canvas of its 16:9 aspect)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for seed, name in enumerate(INPUT_IMAGES[workflow]):
        pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{name}.png")
        files[name] = str(folder / f"{name}.png")
    if workflow == "ref2va":
        from models.video.encode import write_mp4

        rng = np.random.default_rng(7)
        clip = folder / "ref_video.mp4"
        write_mp4(clip, rng.integers(0, 256, (150, 180, 320, 3), dtype=np.uint8), 30,
                  (rng.random((2, 5 * 32000), dtype=np.float32) - 0.5) * 0.2, 32000)
        files["ref_video"] = str(clip)
    return files


def child_diffusers(args, tracker: Tracker) -> dict:
    import numpy as np
    import torch
    from diffusers import ComponentsManager, ModularPipeline

    offload = args.placement == "offload"
    start = time.monotonic()
    tracker.enter("prepare")
    manager = ComponentsManager() if offload else None
    pipe = ModularPipeline.from_pretrained(args.root, workflow="t2va", components_manager=manager)
    pipe.load_components(names=list(AUX))
    notes = []
    if pipe.processor is None:  # Qwen3VLProcessor's video half needs torchvision (the GPU host has it)
        from models.checkpoint.components import load_aux

        pipe.update_components(processor=load_aux(Path(args.root), "processor"))
        notes.append("processor built by models.checkpoint.components.load_aux: transformers could not (no torchvision)")
    for name in WEIGHTS:
        tracker.enter(f"load.{name}")
        pipe.load_components(names=[name], dtype=torch.bfloat16,
                             **({} if offload else {"device_map": args.device}))
    if offload:
        tracker.enter("offload.enable")
        manager.enable_auto_cpu_offload(device=args.device)
    pipe.set_progress_bar_config(disable=True)
    tracker.enter("pipeline")
    state = pipe(prompt=PROMPT, num_frames=args.frames, height=args.height, width=args.width,
                 num_inference_steps=args.steps, generator=torch.Generator("cpu").manual_seed(args.seed),
                 output_type="np")
    tracker.sync()
    job = time.monotonic() - start
    tracker.enter("frames")
    video = np.ascontiguousarray(np.asarray(state.get("videos"))[0], dtype=np.float32)  # as run_generate digests it
    frames = (video * 255.0).round().clip(0, 255).astype(np.uint8)
    return {"job_seconds": job, "notes": notes, "video_sha256": hashlib.sha256(video.tobytes()).hexdigest(),
            **_frames_record(frames, Path(args.work), args.run)}


def child_synth(args) -> int:
    """Write the components `args.roots` of `args.profile` into `args.root`, logging every 16 GB."""
    import torch

    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    torch.set_num_threads(1)  # 8 generator threads per writer, two writers: no intra-op teams on top
    step = [16 * 10**9]

    def progress(done: int, total: int) -> None:
        if done >= step[0]:
            step[0] += 16 * 10**9
            log(f"  writing {', '.join(args.roots)}: {done / 1e9:.0f} of {total / 1e9:.0f} GB")

    sparse = [n for n in args.roots if n in (args.sparse or ())]
    dense = [n for n in args.roots if n not in sparse]
    if dense:
        synth_h3(args.root, with_reference_dit(get_profile(args.profile)), components=dense, workers=8,
                 on_bytes=progress)
    if sparse:  # headers only, data left as holes: the forecast's trick, here to keep tmpfs out of host RAM
        index = _index(Path(args.root))
        write_sparse_h3(Path(args.root), args.profile, components=sparse)
        merged = {**index, **_index(Path(args.root))}
        (Path(args.root) / "modular_model_index.json").write_text(json.dumps(dict(sorted(merged.items())), indent=2))
        log(f"  wrote {', '.join(sparse)} as sparse files (headers only; the weights read as zeros)")
    return 0


def child_main(args) -> int:
    tracker = Tracker(args.device)
    tracker.time_methods(set_stage=args.side == "diffusers")
    out = {"run": args.run, "side": args.side, "placement": args.placement, "height": args.height,
           "width": args.width, "frames": args.frames, "steps": args.steps, "ok": False}
    try:
        out.update((child_ours if args.side == "ours" else child_diffusers)(args, tracker))
        out["ok"] = True
    except Exception as e:  # recorded (a CUDA OOM is a result), then the exit status says so
        import traceback

        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    finally:
        tracker.close()
    out["vm_hwm"] = _hwm()
    out["measured_seconds"], out["peaks"], out["calls"] = tracker.seconds, tracker.peaks, tracker.calls
    Path(args.result).write_text(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- the checkpoint (parent)


def _index(root: Path) -> dict:
    try:
        return json.loads((root / "modular_model_index.json").read_text())
    except (OSError, ValueError):
        return {}


def _has(root: Path, names) -> bool:
    index = _index(root)
    return all(n in index for n in names)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def ensure_checkpoint(profile_name: str, work: Path, shm: Path, margin: int, dit: str = "auto",
                      sparse: tuple[str, ...] = (), reference_dit: bool = False) -> tuple[Path, list[str], dict]:
    """The model root (in `shm`), the folders weight files live under, and what was written where.
    `dit`: `auto` (to disk when it fits there, else spilled), `spill` (the fallback, forced). `sparse`:
    components written as holes (they cost no RAM in tmpfs and read as zeros). `reference_dit`: ref2va's
    `transformer_ref` too (to tmpfs, with the rest)."""
    from models.synth.writer import synth_h3
    from models.synth.profiles import get_profile

    profile = with_reference_dit(get_profile(profile_name))
    names = [n for n in profile.components if n != "transformer_ref"] + (["transformer_ref"] if reference_dit else [])
    root, dit_root = shm / "ckpt", work / "ckpt-dit"
    roots = [str(root), str(dit_root)]
    plan = {c.name: c.bytes for c in synth_h3(root, profile, components=names, dry_run=True).components}
    info = {"root": str(root), "bytes": plan, "sparse": list(sparse)}
    if _has(root, names):
        log(f"checkpoint complete in {root}: reusing it, nothing written")
        return root, roots, {**info, "reused": True}
    root.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    disk_free = shutil.disk_usage(work).free
    dit_done = _has(dit_root, ["transformer"])
    dit_on_disk = dit != "spill" and (dit_done or disk_free >= plan["transformer"] + margin)
    log(f"disk {work}: {_gib(disk_free)} free; tmpfs {shm}: {_gib(shutil.disk_usage(shm).free)} free; "
        f"DiT {_gib(plan['transformer'])}, the rest {_gib(sum(plan.values()) - plan['transformer'])}")
    rest = [n for n in names if n != "transformer"]
    start = time.monotonic()
    written: dict[str, dict] = {}
    errors: list[str] = []

    def write(where: Path, parts: list[str]) -> None:
        # A process per writer: synth sets the process-wide default dtype while it builds each empty module,
        # so two writers in one process would race on it (and on the GIL).
        cmd = [sys.executable, __file__, "--child", "synth", "--profile", profile_name, "--root", str(where),
               "--roots", *parts, *(["--sparse", *sparse] if sparse else [])]
        t = time.monotonic()
        done = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).resolve().parents[1])
        seconds = time.monotonic() - t
        if done.returncode != 0:
            errors.append(f"{', '.join(parts)}: exit {done.returncode}")
            return
        size = sum(plan[n] for n in parts if n in plan)
        written[",".join(parts)] = {"where": str(where), "bytes": size, "seconds": round(seconds, 1)}
        log(f"wrote {', '.join(parts)} to {where}: {_gib(size)} in {seconds:.1f} s ({size / seconds / 1e9:.2f} GB/s)")

    link = root / "transformer"
    if dit_on_disk:  # the DiT to disk and the rest to tmpfs at once
        jobs = [(root, rest)] if not _has(root, rest) else []
        jobs += [] if dit_done else [(dit_root, ["transformer"])]
        threads = [threading.Thread(target=write, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(dit_root / "transformer", target_is_directory=True)
        dit_index = _index(dit_root)
    else:  # the DiT to tmpfs first, its shards spilled to disk while they fit, then the rest
        write(root, ["transformer"])
        dit_index = _index(root)
        if not errors:
            info["dit_shards_on_disk"] = _spill_shards(link, dit_root / "transformer", disk_free - margin)
            write(root, rest)
    if errors:
        raise SystemExit("checkpoint not written: " + "; ".join(errors))
    merged = {**dit_index, **_index(root)}
    if not all(n in merged for n in names):
        raise SystemExit(f"checkpoint incomplete in {root}: the index lacks {[n for n in names if n not in merged]}")
    (root / "modular_model_index.json").write_text(json.dumps(dict(sorted(merged.items())), indent=2) + "\n")
    info.update(written=written, write_seconds=round(time.monotonic() - start, 1), dit_on_disk=dit_on_disk)
    log(f"checkpoint ready in {info['write_seconds']} s")
    return root, roots, info


def _spill_shards(folder: Path, disk: Path, room: int) -> int:
    """Move the DiT's last shards from tmpfs to disk while they fit, linking each back; returns how many."""
    disk.mkdir(parents=True, exist_ok=True)
    moved = 0
    for shard in sorted(folder.glob("*.safetensors"), reverse=True):
        size = shard.stat().st_size
        if shard.is_symlink() or size > room:
            continue
        shutil.copyfile(shard, disk / shard.name)
        shard.unlink()
        shard.symlink_to(disk / shard.name)
        room -= size
        moved += 1
    log(f"disk too small for the whole DiT: moved {moved} of its shards to {disk}")
    return moved


# ---------------------------------------------------------------- planning and running (parent)


def te_read_bytes(root: Path) -> int:
    """Bytes of the text encoder that ours reads for t2va (layers 0..50 of the language model, no head or visual)."""
    from safetensors import safe_open

    from models.synth.profiles import HIDDEN_STATE_LAYER

    total = 0
    for shard in sorted((root / "text_encoder").glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                if key.startswith("lm_head") or ".visual." in f".{key}":
                    continue
                parts = key.split(".")
                if "layers" in parts and int(parts[parts.index("layers") + 1]) > HIDDEN_STATE_LAYER:
                    continue
                s = f.get_slice(key)
                total += _numel(s.get_shape()) * _itemsize(s.get_dtype())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "F64": 8}.get(dtype, 4)


def device_memory(device: str) -> int:
    """Total memory of the CUDA device from nvidia-smi (no CUDA context in this process); 0 if unknown."""
    if not device.startswith("cuda"):
        return 0
    index = device.partition(":")[2] or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return 0


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def parse_run(run: str) -> tuple[str, str, str | None]:
    """`ours-sequential+int8@g2` -> ("ours", "sequential", "int8"): side, placement, DiT quantization."""
    side, placement = run.split("@")[0].split("-")
    placement, _, quantize = placement.partition("+")
    return side, placement, quantize or None


def fits(run: str, sizes: dict, device_total: int, host_ram: int, tmpfs_used: int, margin: int) -> str | None:
    """Why `run` cannot fit, by arithmetic on the weights (bf16 as computed), or None."""
    side, placement, _ = parse_run(run)
    te = sizes["te_read"] if side == "ours" else sizes["text_encoder"]
    others = sizes["transformer"] + sizes["vae"] + sizes["audio_vae"]
    if placement == "offload" and side == "diffusers" and not device_total:
        return "enable_auto_cpu_offload needs a device that reports its free memory (CUDA)"
    # ours group-offloads the DiT from a host copy the loader placed in pinned power-of-two blocks
    dit = sizes["transformer_pinned"] if side == "ours" else sizes["transformer"]
    if placement == "offloadseq":  # one component at a time, offloaded to the host
        host = max(te, dit, sizes["vae"] + sizes["audio_vae"])
        room = host_ram - tmpfs_used - margin
        return None if host <= room else f"host would hold {_gib(host)} of weights, over {_gib(room)} free"
    if placement == "offload":
        host = te + dit + sizes["vae"] + sizes["audio_vae"]
        room = host_ram - tmpfs_used - margin
        if host > room:
            return (f"host would hold {_gib(host)} of weights beside {_gib(tmpfs_used)} of tmpfs files, over "
                    f"{_gib(host_ram)} of RAM less a {_gib(margin)} margin")
        return None
    if not device_total:
        return None
    device = max(te, sizes["transformer"], sizes["vae"] + sizes["audio_vae"]) if placement == "sequential" \
        else te + others
    if device > device_total - margin:
        return f"device would hold {_gib(device)} of weights, over {_gib(device_total)} less a {_gib(margin)} margin"
    return None


def compute_sizes(root: Path, info: dict, roots: list[str]) -> dict:
    """Bytes each component places in bf16 (the VAEs are stored in float32), and the DiT as the loader pins it,
    packed into power-of-two blocks (its shards may be links into `roots`)."""
    from loader.roots import ModelRoots
    from models.forecast import pinned_component_bytes

    b = info["bytes"]
    pinned = pinned_component_bytes(root / "transformer", (), 2, roots=ModelRoots(roots))
    return {"text_encoder": b["text_encoder"], "te_read": te_read_bytes(root), "transformer": b["transformer"],
            "transformer_pinned": pinned,
            "vae": b["vae"] // 2, "audio_vae": b["audio_vae"] // 2}


def run_child(args, run: str, geometry: tuple[int, int], timeout: float, roots: list[str]) -> dict:
    side, placement, quantize = parse_run(run)
    result = Path(args.work) / "results" / f"{run}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", side, "--placement", placement, "--run", run, "--root", str(args.root),
           "--work", str(args.work), "--device", args.device, "--frames", str(args.frames), "--steps", str(args.steps),
           "--seed", str(args.seed), "--height", str(geometry[0]), "--width", str(geometry[1]),
           "--result", str(result), "--roots", *roots, *(["--quantize", quantize] if quantize else []),
           "--workflow", args.workflow]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).resolve().parents[1])
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = "killed at the budget"
    wall = time.monotonic() - start
    try:
        out = json.loads(result.read_text())
    except (OSError, ValueError):
        out = {"run": run, "ok": False, "error": f"no result (exit {code})"}
    out["process_seconds"] = wall
    out["exit"] = code
    result.write_text(json.dumps(out, indent=1))
    return out


def disk_cached(root: Path, shm: Path) -> float | None:
    """Share of the weight files on disk (not under `shm`) now in the page cache, by mincore; None if none.
    Ours reads cold files with O_DIRECT and diffusers through mmap, so this moves from run to run."""
    from loader.io.pagecache import resident_pages

    resident = pages = 0
    for file in root.glob("*/*.safetensors"):
        real = file.resolve()
        if real.is_relative_to(shm.resolve()):
            continue
        fd = os.open(real, os.O_RDONLY)
        try:
            r, n = resident_pages(fd)
        finally:
            os.close(fd)
        resident, pages = resident + r, pages + n
    return resident / pages if pages else None


def plan_runs(args) -> list[str]:
    if args.runs:
        return [r.strip() for r in args.runs.split(",") if r.strip()]
    return list(ORDER) + [f"{r}@g2" for r in ORDER]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h3")
    parser.add_argument("--work", type=Path, default=Path(".h3gen"), help="disk folder (DiT, results, clips)")
    parser.add_argument("--shm", type=Path, default=Path("/dev/shm/h3gen"), help="tmpfs folder (the model root)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--workflow", choices=tuple(INPUT_IMAGES), default="t2va",
                        help="fl2va, ref2va: ours only, from inputs it writes (default t2va)")
    parser.add_argument("--steps", type=int, default=3, help="num_inference_steps (DiT calls = steps - 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--geometry2", default="576x1024", help="HxW of the second geometry (default 576x1024)")
    parser.add_argument("--runs", help="comma list of runs, in order (default: all; see the docstring)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for everything, writing included")
    parser.add_argument("--margin", type=float, default=4.0, help="GiB kept free in every fit check (default 4)")
    parser.add_argument("--host-ram", type=float, help="GiB of host RAM (default: MemTotal)")
    parser.add_argument("--dit", choices=("auto", "spill"), default="auto",
                        help="spill: write the DiT to tmpfs and move what fits of it to disk (the fallback, forced)")
    parser.add_argument("--resume", action="store_true", help="keep results already in WORK/results")
    parser.add_argument("--sparse", nargs="+", choices=WEIGHTS + ("transformer_ref",), metavar="COMPONENT",
                        help="write these components as holes (zeros, no RAM in tmpfs): e.g. text_encoder, so the "
                             "offload runs fit beside the checkpoint in host RAM")
    parser.add_argument("--out", type=Path, help="folder for generate_h3.json")
    # the child's
    parser.add_argument("--child", choices=("ours", "diffusers", "synth"), help=argparse.SUPPRESS)
    parser.add_argument("--placement", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--height", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--roots", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--quantize", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "synth":
        return child_synth(args)
    if args.child:
        args.side = args.child
        return child_main(args)

    margin = int(args.margin * GiB)
    log(f"bench_h3_generate: profile {args.profile}, device {args.device}, budget {args.budget:.0f} s, "
        f"{args.frames} frames, {args.steps} steps, seed {args.seed}")
    root, roots, info = ensure_checkpoint(args.profile, args.work.resolve(), args.shm.resolve(), margin, args.dit,
                                          tuple(args.sparse or ()), reference_dit=args.workflow == "ref2va")
    args.root = root
    from models.request.params import GenerateParams, ModelSpec

    default = ModelSpec.read(root).geometry(GenerateParams(prompt=PROMPT, frames=args.frames))
    h2, _, w2 = args.geometry2.partition("x")
    geometries = {"default": default, "g2": (int(h2), int(w2))}
    sizes = compute_sizes(root, info, roots)
    device_total = device_memory(args.device)
    host_ram = int(args.host_ram * GiB) if args.host_ram else _meminfo("MemTotal")
    shm_usage = shutil.disk_usage(args.shm)
    tmpfs_used = shm_usage.total - shm_usage.free if str(args.shm.resolve()).startswith("/dev/shm") else 0
    log("weights placed (bf16): " + ", ".join(f"{k} {_gib(v)}" for k, v in sizes.items())
        + f"; device {_gib(device_total)}, host RAM {_gib(host_ram)}, tmpfs used {_gib(tmpfs_used)}")
    summary = {"profile": args.profile, "workflow": args.workflow, "device": args.device, "frames": args.frames,
               "steps": args.steps, "seed": args.seed, "geometries": geometries, "checkpoint": info, "sizes": sizes,
               "device_total": device_total, "host_ram": host_ram, "tmpfs_used": tmpfs_used, "runs": {}}
    walls: dict[str, float] = {}
    if args.resume:  # every run measured before, whether or not this call lists it
        for saved in sorted((args.work / "results").glob("*.json")):
            old = json.loads(saved.read_text())
            if old.get("ok"):
                log(f"{saved.stem}: kept from {saved}")
                summary["runs"][saved.stem] = old
    for run in plan_runs(args):
        key = run.split("@")[1] if "@" in run else "default"
        if summary["runs"].get(run, {}).get("ok"):
            continue
        reason = fits(run, sizes, device_total, host_ram, tmpfs_used, margin)
        if args.workflow != "t2va" and run.startswith("diffusers"):
            reason = f"the diffusers side runs t2va only, not {args.workflow}"
        remaining = args.budget - (time.monotonic() - _T0)
        side = run.split("-")[0]
        estimate = walls.get(side, max(walls.values(), default=0.0))
        if reason is None and (remaining < estimate or remaining < 20):
            reason = f"{remaining:.0f} s of the budget left, a {side} run took {estimate:.0f} s"
        if reason is not None:
            log(f"{run}: skipped: {reason}")
            summary["runs"][run] = {"run": run, "ok": False, "skipped": reason}
            continue
        h, w = geometries[key]
        cached = disk_cached(root, args.shm)
        log(f"{run}: {h}x{w}, starting (timeout {remaining:.0f} s); page cache holds "
            f"{'-' if cached is None else f'{cached:.0%}'} of the weights on disk, MemAvailable "
            f"{_gib(_meminfo('MemAvailable'))}")
        out = run_child(args, run, (h, w), remaining, roots)
        out["disk_cached_before"] = cached
        walls[side] = max(walls.get(side, 0.0), out["process_seconds"])
        summary["runs"][run] = out
        log(f"{run}: {'ok' if out.get('ok') else 'FAILED: ' + str(out.get('error'))} in {out['process_seconds']:.1f} s"
            f" (job {out.get('job_seconds', 0):.1f} s)")
    compare_frames(summary)
    print_tables(summary)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "generate_h3.json").write_text(json.dumps(summary, indent=1, default=str))
        log(f"wrote {args.out / 'generate_h3.json'}")
    return 0


# ---------------------------------------------------------------- reporting


def compare_frames(summary: dict) -> None:
    """Each run's frames against diffusers' resident run at its geometry: identical digests, else the largest
    uint8 difference on the subsample."""
    import numpy as np

    for run, out in summary["runs"].items():
        if not out.get("ok"):
            continue
        suffix = "@" + run.split("@")[1] if "@" in run else ""
        side, placement, quantize = parse_run(run)
        if quantize:  # not bit-identical by design: PSNR against the same placement in bf16
            ref = summary["runs"].get(f"{side}-{placement}{suffix}")
            if ref and ref.get("ok"):
                out["frames_vs_bf16"] = {"reference": ref["run"], "psnr_db_subsample": _psnr(
                    np.load(out["subsample"]), np.load(ref["subsample"]))}
            continue
        ref = summary["runs"].get("diffusers-resident" + suffix) or summary["runs"].get("diffusers-offload" + suffix)
        if not ref or not ref.get("ok") or ref is out:
            continue
        same = out["video_sha256"] == ref["video_sha256"]
        out["frames_vs_diffusers"] = {"reference": ref["run"], "identical": same, "max_abs_diff_uint8": 0}
        if not same:
            a, b = np.load(out["subsample"]).astype(int), np.load(ref["subsample"]).astype(int)
            out["frames_vs_diffusers"]["max_abs_diff_uint8"] = int(np.abs(a - b).max()) if a.shape == b.shape else -1
            out["frames_vs_diffusers"]["uint8_identical"] = out["frames_sha256"] == ref["frames_sha256"]


def _psnr(test, reference) -> float:
    """PSNR in dB of uint8 frames (inf when identical)."""
    import numpy as np

    mse = float(np.mean((test.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _stage_seconds(out: dict, stage: str) -> float | None:
    """Load stages: the side's own stage seconds; compute stages: the timed calls (both sides alike)."""
    if stage in TIMED:
        calls = out.get("calls", {}).get(stage)
        return sum(calls) if calls else None
    return out.get("measured_seconds", {}).get(stage)


def _per_step(out: dict) -> tuple[float | None, float | None]:
    calls = out.get("calls", {}).get("denoise.denoise") or []
    if not calls:
        return None, None
    return calls[0], (sum(calls[1:]) / len(calls[1:]) if len(calls) > 1 else calls[0])


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def _lowest(ok: dict) -> dict:
    """Per side, the run with the lowest peak of VmRSS + reserved, as (run, bytes), or None."""
    best: dict = {"ours": None, "diffusers": None}
    for run, out in ok.items():
        peak = max((p.get("sum", 0) for p in out.get("peaks", {}).values()), default=0)
        side = run.split("-")[0]
        if best[side] is None or peak < best[side][1]:
            best[side] = (run, peak)
    return best


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_tables(summary: dict) -> None:
    for key, (h, w) in summary["geometries"].items():
        suffix = "" if key == "default" else "@" + key
        runs = {r: o for r, o in summary["runs"].items() if (("@" in r) == bool(suffix)) and r.endswith(suffix)}
        if not runs:
            continue
        print(f"\n== {h}x{w} ({key}), {summary['frames']} frames, {summary['steps']} steps, {summary['device']}")
        for r, o in runs.items():
            if not o.get("ok"):
                print(f"   {r}: {'skipped: ' + o['skipped'] if 'skipped' in o else 'FAILED: ' + str(o.get('error'))}")
        ok = {r: o for r, o in runs.items() if o.get("ok")}
        if not ok:
            continue
        base = ok.get("diffusers-resident" + suffix)
        cols = [r.split("@")[0] for r in ok]
        stages = [s for s in STAGES + ("vae_encoder",) if any(s in o.get("peaks", {}) for o in ok.values())]
        print(f"{'seconds':<20}" + "".join(f"{c:>20}" for c in cols) + ("   ours-resident/diffusers" if base else ""))

        def row(label: str, get) -> None:
            values = [get(o) for o in ok.values()]
            ratio = ""
            ours = ok.get("ours-resident" + suffix)
            if base and ours and get(base) and get(ours) is not None:
                ratio = f"   {get(ours) / get(base):.3f}"
            print(f"{label:<20}" + "".join(f"{_fmt(v):>20}" for v in values) + ratio)

        for stage in stages:
            row(stage, lambda o, s=stage: _stage_seconds(o, s))
        row("step 1 (s)", lambda o: _per_step(o)[0])
        row("s/step (later)", lambda o: _per_step(o)[1])
        row("job (load incl.)", lambda o: o.get("job_seconds"))
        if any("frames_vs_bf16" in o for o in ok.values()):
            row("PSNR vs bf16 (dB)", lambda o: o.get("frames_vs_bf16", {}).get("psnr_db_subsample"))
            row("DiT GiB held", lambda o: (lambda t: (t.get("bytes_held") or t.get("bytes_placed") or 0) / GiB or None)(
                o.get("loads", {}).get("transformer", {})))
        row("process", lambda o: o.get("process_seconds"))
        print(f"{'peak GiB':<20}" + "".join(f"{c:>20}" for c in cols))
        for metric in ("host_rss", "host_anon", "device_allocated", "device_reserved", "sum"):
            row(metric, lambda o, m=metric: max((p.get(m, 0) for p in o.get("peaks", {}).values()), default=0) / GiB)
        for stage in stages:
            row(f"sum {stage}", lambda o, s=stage: o.get("peaks", {}).get(s, {}).get("sum", 0) / GiB or None)
        ours, lowest = ok.get("ours-resident" + suffix), _lowest(ok)
        if base and ours:
            print(f"goals: s/step ours/diffusers resident {_ratio(_per_step(ours)[1], _per_step(base)[1])} (<= 1.03);"
                  f" job {_ratio(ours.get('job_seconds'), base.get('job_seconds'))} (< 1)")
        if lowest["ours"] and lowest["diffusers"]:
            (o, op), (d, dp) = lowest["ours"], lowest["diffusers"]
            print(f"goals: lowest peak sum ours {o} {op / GiB:.2f} GiB vs diffusers {d} {dp / GiB:.2f} GiB"
                  f" = {_ratio(op, dp)} (<= 1); diffusers runs not made are listed above")
        print("frames:")
        for r, o in ok.items():
            cmp = o.get("frames_vs_diffusers")
            verdict = "reference" if cmp is None else (
                "identical to " + cmp["reference"] if cmp["identical"]
                else f"DIFFER from {cmp['reference']} (max uint8 diff {cmp['max_abs_diff_uint8']} on a subsample)")
            print(f"   {r:<26} video_sha256 {o['video_sha256'][:16]}  {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
