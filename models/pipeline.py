"""Generate with MiniMax H3: diffusers' modular pipeline, fed by Drainboard's loader, policy and telemetry.

The computation is diffusers' `MiniMaxH3ModularPipeline` running the `t2va`
workflow; nothing of the model is re-implemented here. What this module adds:

- every weight component is built empty and filled by Drainboard's loader
  (`models.components.load_component`), with per-tensor samples and a load
  report each; tokenizer, processor and schedulers come from `load_aux`;
- the offload settings, resolved once (`loader.offload.resolve_offload`), are
  mapped onto diffusers' mechanisms (`models.residency`);
- stage-by-stage residency (`sequential_components`): each component is loaded
  just before the first block that uses it and released after its last one,
  so the peak is the largest stage, not the sum of all weights;
- a stage per pipeline block (`text_encoder`, `denoise.*`, `decode.video`,
  `decode.audio`), an event per denoising step, timer samples throughout, and
  the MP4 written with PyAV.

Blocks are timed by wrapping the entries of `pipe._blocks.sub_blocks`
(`ModularPipeline.blocks` returns a copy). Components not loaded yet, or
released, are held as empty (meta-device) shells built from their config, so
the blocks that read model facts (patch size, VAE compression, latent
channels) see the checkpoint's own values without any weight resident; the
blocks run on the job's device (`_execution_device`) whatever the residency.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn as nn

from loader.api import synchronize
from loader.device import DeviceInfo, probe_device
from loader.memory import MemoryProbe, MemorySample, PeriodicSampler
from loader.offload import OffloadDecision, OffloadSettings, resolve_offload

from .encode import write_mp4
from .params import WEIGHT_COMPONENTS, GenerateParams, ModelSpec, validate_params
from .residency import Placement, Residency, observe, plan_placements

WORKFLOW = "t2va"
"""The diffusers workflow a generate job runs."""
PREPARE, ENCODE = "prepare", "encode"
"""Drainboard's own stages around the pipeline's blocks."""
AUX_COMPONENTS = ("tokenizer", "processor", "scheduler", "audio_scheduler")
"""Components without weights, loaded in `prepare`."""


def load_stage(component: str) -> str:
    """The stage in which `component` is loaded."""
    return f"load.{component}"


@dataclass(frozen=True)
class PipelineEvent:
    """Something a watcher of the run wants to know."""

    kind: str
    """`stage_start`, `stage_end`, `step`, `load`, `release`, `placement` or `offload_decision`."""
    stage: str
    """The stage it happened in (a block name, `load.<component>`, `prepare` or `encode`)."""
    message: str
    """One line for people."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable details (step, component, bytes, seconds, devices)."""


@dataclass
class GenerateResult:
    """What a finished run produced and measured."""

    out_path: str
    """The MP4 written."""
    frames: int
    """Video frames."""
    fps: int
    """Frames per second."""
    duration: float
    """Seconds of video."""
    width: int
    """Pixels."""
    height: int
    """Pixels."""
    audio: bool
    """Whether the MP4 has the stereo audio track."""
    sample_rate: int = 0
    """Audio samples per second."""
    video_sha256: str = ""
    """SHA-256 of the float32 frames diffusers returned (`output_type="np"`): the seed contract compares this."""
    frames_sha256: str = ""
    """SHA-256 of the uint8 RGB frames handed to the encoder."""
    stages: list[str] = field(default_factory=list)
    """Stages in the order they ran."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per stage."""
    stage_peaks: dict[str, int] = field(default_factory=dict)
    """Peak footprint per stage in bytes: max of VmRSS + CUDA allocated over the stage's samples."""
    steps: int = 0
    """DiT calls made (num_inference_steps - 1)."""
    sequential_components: bool = False
    """Whether components were loaded per stage and released after their last block."""
    offload: dict[str, bool] = field(default_factory=dict)
    """The resolved offload settings every site used."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """Flags the policy changed, with reasons."""
    placements: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Component -> Placement: the diffusers mechanism its flag chose and where it was loaded."""
    residency: list[dict[str, Any]] = field(default_factory=list)
    """Per block: where each weight component lived at the block's end (devices, hooks, or released)."""
    loads: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Component -> the loader's LoadReport as a dict."""

    def to_dict(self) -> dict:
        return asdict(self)


EventSink = Callable[[PipelineEvent], None]
SampleSink = Callable[[str, MemorySample], None]


def _pipeline_class():
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    class DrainboardH3Pipeline(MiniMaxH3ModularPipeline):
        """diffusers' H3 pipeline whose blocks run on the job's device, whatever each component's residency."""

        run_device = torch.device("cpu")

        @property
        def _execution_device(self) -> torch.device:
            return self.run_device

    return DrainboardH3Pipeline


class _Run:
    """One run's state: device, settings, reporting, and the components' residency."""

    def __init__(self, root: Path, pipe, device: torch.device, dtype: torch.dtype, mode: str,
                 settings: OffloadSettings, placements: dict[str, Placement], sequential: bool,
                 on_event: EventSink | None, on_sample: SampleSink | None, interval: float,
                 result: GenerateResult, probe: MemoryProbe):
        self.root, self.pipe, self.device, self.dtype, self.mode = root, pipe, device, dtype, mode
        self.settings, self.placements, self.sequential = settings, placements, sequential
        self.on_event, self.on_sample, self.interval = on_event, on_sample, interval
        self.result, self.probe = result, probe
        self.stage = PREPARE
        self.resident: dict[str, Residency] = {}
        self.shells: dict[str, nn.Module] = {}
        self.roots: list[Path] | None = None

    def emit(self, kind: str, message: str, **data: Any) -> None:
        if self.on_event is not None:
            self.on_event(PipelineEvent(kind, self.stage, message, data))

    def record(self, sample: MemorySample) -> None:
        peak = sample.vm_rss + sample.device_allocated
        if peak > self.result.stage_peaks.get(self.stage, 0):
            self.result.stage_peaks[self.stage] = peak
        if self.on_sample is not None:
            self.on_sample(self.stage, sample)

    @contextmanager
    def stage_of(self, name: str) -> Iterator[None]:
        self.stage = name
        self.result.stages.append(name)
        self.emit("stage_start", f"{name} started")
        start = time.monotonic()
        self.record(self.probe.sample())
        with PeriodicSampler(self.probe, self.interval, self.record):
            yield
        synchronize(self.device)
        self.record(self.probe.sample())
        seconds = time.monotonic() - start
        self.result.stage_seconds[name] = seconds
        self.emit("stage_end", f"{name} done in {seconds:.2f} s", seconds=seconds,
                  peak_bytes=self.result.stage_peaks.get(name, 0))

    def load(self, name: str) -> None:
        """Fill `name` with the loader in its own stage, apply its placement, hand it to the pipeline."""
        placement = self.placements[name]
        with self.stage_of(load_stage(name)):
            module, report = _load_weights(self, name, torch.device(placement.load_device))
            self.resident[name] = Residency(placement, module, self.device, self.settings)
            self.pipe.update_components(**{name: module})
        self.result.loads[name] = report
        self.emit("load", f"loaded {name} on {placement.load_device} ({placement.mechanism})", component=name,
                  device=placement.load_device, mechanism=placement.mechanism, bytes=report.get("bytes_placed", 0),
                  seconds=report.get("load_seconds", 0.0))

    def done_with(self, name: str) -> None:
        """After `name`'s last block: model offload goes back to the host; sequential residency releases it."""
        residency = self.resident.get(name)
        if residency is None:
            return
        residency.offload()
        if not self.sequential:
            return
        nbytes = sum(p.nbytes for p in residency.module.parameters())
        del self.resident[name], residency
        self.pipe.register_components(**{name: self.shells.get(name)})
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.emit("release", f"released {name} ({nbytes / 2**20:.1f} MiB)", component=name, bytes=nbytes)

    def observe(self, block: str) -> None:
        where = {}
        for name in WEIGHT_COMPONENTS:
            residency = self.resident.get(name)
            where[name] = {**observe(residency.module), "mechanism": residency.placement.mechanism} \
                if residency else observe(None)
        self.result.residency.append({"block": block, "components": where})


class _Block:
    """A pipeline block run as a stage: loads what it needs first, releases what it used last."""

    def __init__(self, name: str, block, run: _Run, needs: list[str], last_for: list[str]):
        self._name, self._block, self._run, self._needs, self._last_for = name, block, run, needs, last_for

    def __call__(self, pipeline, state):
        run = self._run
        for component in self._needs:
            if component not in run.resident:
                run.load(component)
        with run.stage_of(self._name):
            out = self._block(pipeline, state)
        run.observe(self._name)
        for component in self._last_for:
            run.done_with(component)
        return out

    def __getattr__(self, attr: str):
        return getattr(self._block, attr)


class _Step:
    """The denoising loop's last sub-block, reporting each finished step."""

    def __init__(self, block, run: _Run):
        self._block, self._run = block, run

    def __call__(self, components, block_state, **kwargs):
        out = self._block(components, block_state, **kwargs)
        step, total = kwargs["i"] + 1, len(block_state.timesteps)
        self._run.result.steps = step
        self._run.emit("step", f"step {step}/{total}", step=step, steps=total,
                       timestep=float(kwargs["t"]))
        return out

    def __getattr__(self, attr: str):
        return getattr(self._block, attr)


def run_generate(
    model_dir: str | os.PathLike,
    params: GenerateParams,
    out_path: str | os.PathLike,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    mode: str = "stream",
    offload: OffloadSettings = OffloadSettings(),
    decided: list[OffloadDecision] | None = None,
    device_info: DeviceInfo | None = None,
    sequential_components: bool | None = None,
    on_event: EventSink | None = None,
    on_sample: SampleSink | None = None,
    sample_interval: float = 0.1,
    probe: MemoryProbe | None = None,
    roots: list[str | os.PathLike] | None = None,
) -> GenerateResult:
    """Generate one clip (t2va) from the H3 model at `model_dir` into the MP4 `out_path`.

    `dtype` defaults to bfloat16 (the checkpoint's; fp32 modules stay fp32);
    `mode` is the loader's placement mode. `decided`: `offload` is the policy's answer already (a job's
    probe stage resolved it, these are its decisions), so it is not resolved again. `device_info` replaces the device
    probe (tests, or a job that probed already). `sequential_components`
    defaults to on for unified memory and off elsewhere. `probe` is the job's
    memory probe (with its cgroup file, when it runs under a limit). `roots`:
    every weight file must resolve under one of them (default: `model_dir`). Raises
    GenerateParamsError for parameters the model cannot take, before any
    weight is read.
    """
    root = Path(model_dir)
    info = device_info or probe_device(device)
    torch_device = torch.device(device)
    dtype = dtype or torch.bfloat16
    settings, decisions = (offload, list(decided)) if decided is not None else resolve_offload(offload, info)
    sequential = info.unified_memory if sequential_components is None else sequential_components
    model = ModelSpec.read(root)
    validate_params(params, model)
    height, width = model.geometry(params)
    result = GenerateResult(str(out_path), params.frames, params.fps, params.duration, width, height, params.audio,
                            sequential_components=sequential, offload=settings.to_dict(),
                            decisions=[d.to_dict() for d in decisions])
    own_probe = probe is None
    probe = probe or MemoryProbe(str(torch_device) if torch_device.type == "cuda" else None)
    try:
        run = _prepare(root, params, torch_device, dtype, mode, settings, decisions, sequential, on_event,
                       on_sample, sample_interval, result, probe)
        run.roots = None if roots is None else [Path(r) for r in roots]
        if not sequential:
            for name in WEIGHT_COMPONENTS:
                run.load(name)
        generator = torch.Generator("cpu").manual_seed(params.seed)
        state = run.pipe(prompt=params.prompt, num_frames=params.frames, height=height, width=width,
                         num_inference_steps=params.steps, generator=generator, output_type="np")
        for name in list(run.resident):
            run.done_with(name)
        video = np.asarray(state.get("videos"))[0]
        result.video_sha256 = hashlib.sha256(np.ascontiguousarray(video, dtype=np.float32).tobytes()).hexdigest()
        frames = (video * 255.0).round().clip(0, 255).astype(np.uint8)
        result.frames_sha256 = hashlib.sha256(frames.tobytes()).hexdigest()
        wave = None
        if params.audio:
            wave = state.get("audio")[0].float().cpu().numpy()
            result.sample_rate = int(state.get("sampling_rate"))
        with run.stage_of(ENCODE):
            write_mp4(out_path, frames, params.fps, wave, result.sample_rate or model.sampling_rate)
    finally:
        if own_probe:
            probe.close()
    return result


def _prepare(root: Path, params: GenerateParams, device: torch.device, dtype: torch.dtype, mode: str,
             settings: OffloadSettings, decisions: list[OffloadDecision], sequential: bool, on_event, on_sample,
             interval: float, result: GenerateResult, probe: MemoryProbe) -> _Run:
    """Build the pipeline for the workflow, its aux components and shells, and wrap its blocks."""
    placements = plan_placements(settings, device, WEIGHT_COMPONENTS)
    result.placements = {name: p.to_dict() for name, p in placements.items()}
    pipe = _pipeline_class()(pretrained_model_name_or_path=str(root), workflow=WORKFLOW)
    pipe.run_device = device
    run = _Run(root, pipe, device, dtype, mode, settings, placements, sequential, on_event, on_sample, interval,
               result, probe)
    with run.stage_of(PREPARE):
        for decision in decisions:
            run.emit("offload_decision", str(decision), **decision.to_dict())
        for name, placement in placements.items():
            run.emit("placement", f"{name}: {placement.mechanism}" + (f" ({placement.flag})" if placement.flag else ""),
                     **placement.to_dict())
        pipe.update_components(**{name: _load_aux(root, name) for name in AUX_COMPONENTS})
        run.shells = {name: _shell(root, name) for name in WEIGHT_COMPONENTS if name != "text_encoder"}
        pipe.update_components(**run.shells)
        pipe.set_progress_bar_config(disable=True)
        _wrap_blocks(run, params)
    return run


def _wrap_blocks(run: _Run, params: GenerateParams) -> None:
    """Make each of the workflow's blocks a stage; the denoising loop reports its steps."""
    blocks = run.pipe._blocks.sub_blocks
    if not params.audio:
        del blocks["decode.audio"]
    uses = {name: [c.name for c in block.expected_components if c.name in WEIGHT_COMPONENTS]
            for name, block in blocks.items()}
    last_use = {c: name for name in blocks for c in uses[name]}
    for name, block in list(blocks.items()):
        if name == "denoise.denoise":
            inner = block.sub_blocks
            last = list(inner)[-1]
            inner[last] = _Step(inner[last], run)
        blocks[name] = _Block(name, block, run, needs=uses[name],
                              last_for=[c for c, n in last_use.items() if n == name])


def _shell(root: Path, name: str) -> nn.Module:
    """`name` built on the meta device from its config: its facts for the blocks, no weight."""
    import diffusers
    from accelerate import init_empty_weights

    cls = getattr(diffusers, _index_class(root, name))
    with init_empty_weights():
        return cls.from_config(cls.load_config(str(root / name)))


def _index_class(root: Path, name: str) -> str:
    import json

    return json.loads((root / "modular_model_index.json").read_text())[name][1]


def _load_aux(root: Path, name: str):
    from .components import load_aux

    return load_aux(root, name)


def _load_weights(run: _Run, name: str, target: torch.device) -> tuple[nn.Module, dict[str, Any]]:
    from .components import load_component

    def on_tensor(placed) -> None:
        if placed.sample is not None:
            run.record(placed.sample)

    module, report = load_component(run.root, name, mode=run.mode, device=str(target), dtype=run.dtype,
                                    workflow=WORKFLOW, on_tensor=on_tensor, probe=run.probe, roots=run.roots)
    return module, report.to_dict()
