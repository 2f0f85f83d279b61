"""Generate with MiniMax H3: diffusers' modular pipeline, fed by Drainboard's loader, policy and telemetry.

The computation is diffusers' `MiniMaxH3ModularPipeline` running one of H3's
workflows (`t2va`, `fl2va`, `ref2va`) on the blocks diffusers builds for it
(`MiniMaxH3Blocks().get_workflow(...)`, handed over as `blocks=`); nothing of
the model is re-implemented here. What this module adds:

- every weight component is built empty and filled by Drainboard's loader
  (`models.components.load_component`), with per-tensor samples and a load
  report each; tokenizer, processor and schedulers come from `load_aux`;
- the offload settings, resolved once (`machine.offload.resolve_offload`), are
  mapped onto diffusers' mechanisms (`models.residency`);
- stage-by-stage residency (`sequential_components`), as `models.workflows`
  plans it: each component is loaded just before a block that uses it and
  released after it, so the peak is the largest stage, not the sum of all
  weights;
- a stage per pipeline block (`text_encoder`, `denoise.*`, `decode.video`,
  `decode.audio`), an event per denoising step (a loop block of our own,
  appended to the denoising loop), timer samples throughout, and the MP4
  written with PyAV;
- the VAE knobs (tiling, decode precision) and the input images, opened from
  the job's own copies.

Blocks are timed by wrapping the entries of the workflow's `sub_blocks` before
the pipeline is built from them. Components not loaded yet, or
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
from machine.device import DeviceInfo, probe_device
from machine.memory import MemoryProbe, MemorySample, PeriodicSampler
from machine.offload import OffloadDecision, OffloadSettings, resolve_offload

from .encode import write_mp4
from .params import GenerateParams, ModelSpec, validate_params
from .residency import Placement, Residency, observe, plan_placements
from .workflows import PlannedStage, block_reads, plan_from_reads, workflow_blocks

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
    workflow: str = "t2va"
    """The diffusers workflow run."""
    num_inference_steps: int = 0
    """Steps asked of the scheduler: the request's or the checkpoint's scheduler config's."""
    vae_tiling: bool = True
    """Whether the video VAE encoded and decoded on its 256 px tiles."""
    vae_dtype: str = "bf16"
    """The video VAE's precision."""
    quantize: str | None = None
    """The DiT's weight-only quantization (frames then differ from bf16's); None: bf16."""
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Input field -> {file, size [w, h], note}: the image as given and what diffusers does to fit it."""
    notes: list[str] = field(default_factory=list)
    """Lines for people: resized inputs, tiling off."""
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
        self.components = tuple(placements)
        self.vae_tiling = True
        self.quantize: str | None = None
        self.dtypes: dict[str, torch.dtype] = {}
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
        self.result.stage_seconds[name] = self.result.stage_seconds.get(name, 0.0) + seconds  # a reload adds up
        self.emit("stage_end", f"{name} done in {seconds:.2f} s", seconds=seconds,
                  peak_bytes=self.result.stage_peaks.get(name, 0))

    def load(self, name: str) -> None:
        """Fill `name` with the loader in its own stage, apply its placement, hand it to the pipeline."""
        placement = self.placements[name]
        with self.stage_of(load_stage(name)):
            module, report = _load_weights(self, name, torch.device(placement.load_device))
            if name == "vae" and not self.vae_tiling:
                module.disable_tiling()
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
        for name in self.components:
            residency = self.resident.get(name)
            where[name] = {**observe(residency.module), "mechanism": residency.placement.mechanism} \
                if residency else observe(None)
        self.result.residency.append({"block": block, "components": where})


class _Block:
    """A pipeline block run as a stage: loads what the plan loads before it, releases what it releases after."""

    def __init__(self, block, run: _Run, stage: PlannedStage):
        self._block, self._run, self._stage = block, run, stage

    def __call__(self, pipeline, state):
        run, stage = self._run, self._stage
        for component in stage.loads:
            if component not in run.resident:
                run.load(component)
        with run.stage_of(stage.block):
            out = self._block(pipeline, state)
        run.observe(stage.block)
        for component in stage.releases:
            run.done_with(component)
        return out

    def __getattr__(self, attr: str):
        return getattr(self._block, attr)


def _step_block(run: _Run):
    """A block of our own for the end of diffusers' denoising loop: reports each finished step."""
    from diffusers.modular_pipelines import ModularPipelineBlocks

    class ReportStep(ModularPipelineBlocks):
        model_name = "minimax-h3"

        @property
        def description(self) -> str:
            return "Reports a finished denoising step to Drainboard."

        def __call__(self, components, block_state, i: int, t):
            step, total = i + 1, len(block_state.timesteps)
            run.result.steps = step
            run.emit("step", f"step {step}/{total}", step=step, steps=total, timestep=float(t))
            return components, block_state

    return ReportStep()


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
    """Generate one clip (`params.resolved_workflow`) from the H3 model at `model_dir` into the MP4 `out_path`.

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
    images = {name: _open_image(path) for name, path in params.input_images().items()}
    first = images.get("image") or images.get("last_image")
    height, width = model.geometry(params, None if first is None else first.size)
    workflow, steps = params.resolved_workflow, model.steps(params)
    result = GenerateResult(str(out_path), params.frames, params.fps, params.duration, width, height, params.audio,
                            sequential_components=sequential, offload=settings.to_dict(),
                            decisions=[d.to_dict() for d in decisions], workflow=workflow,
                            num_inference_steps=steps, vae_tiling=params.vae_tiling, vae_dtype=params.vae_dtype,
                            quantize=params.quantize)
    _describe_inputs(result, params, images, model)
    own_probe = probe is None
    probe = probe or MemoryProbe(str(torch_device) if torch_device.type == "cuda" else None)
    try:
        run = _prepare(root, params, torch_device, dtype, mode, settings, decisions, sequential, on_event,
                       on_sample, sample_interval, result, probe)
        run.roots = None if roots is None else [Path(r) for r in roots]
        if not sequential:
            for name in run.components:
                run.load(name)
        generator = torch.Generator("cpu").manual_seed(params.seed)
        state = run.pipe(prompt=params.prompt, num_frames=params.frames, height=height, width=width,
                         num_inference_steps=steps, generator=generator, output_type="np", **_workflow_inputs(images))
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
    """Build the workflow's blocks (each a stage, the loop reporting its steps), the pipeline over them,
    its aux components and shells."""
    blocks = workflow_blocks(result.workflow, params.audio)
    plan = plan_from_reads(block_reads(blocks), sequential)
    components = tuple(dict.fromkeys(c for stage in plan for c in stage.reads))
    placements = plan_placements(settings, device, components)
    result.placements = {name: p.to_dict() for name, p in placements.items()}
    pipe = _pipeline_class()(blocks=blocks, pretrained_model_name_or_path=str(root))
    pipe.run_device = device
    run = _Run(root, pipe, device, dtype, mode, settings, placements, sequential, on_event, on_sample, interval,
               result, probe)
    run.vae_tiling, run.quantize = params.vae_tiling, params.quantize
    run.dtypes = {"vae": torch.float32} if params.vae_dtype == "fp32" else {}
    loop = blocks.sub_blocks["denoise.denoise"]
    loop.sub_blocks["report_step"] = _step_block(run)
    for stage in plan:
        blocks.sub_blocks[stage.block] = _Block(blocks.sub_blocks[stage.block], run, stage)
    with run.stage_of(PREPARE):
        for decision in decisions:
            run.emit("offload_decision", str(decision), **decision.to_dict())
        for name, placement in placements.items():
            run.emit("placement", f"{name}: {placement.mechanism}" + (f" ({placement.flag})" if placement.flag else ""),
                     **placement.to_dict())
        for note in result.notes:
            run.emit("note", note)
        pipe.update_components(**{name: _load_aux(root, name) for name in AUX_COMPONENTS})
        run.shells = {name: _shell(root, name) for name in components if name != "text_encoder"}
        pipe.update_components(**run.shells)
        pipe.set_progress_bar_config(disable=True)
    return run


def _open_image(path: str):
    from .inputs import open_image

    return open_image(path)


def _workflow_inputs(images: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's keyword inputs for the images: fl2va's `image` / `last_image`, ref2va's `references`."""
    inputs = {name: images[name] for name in ("image", "last_image") if name in images}
    if "ref_image" in images:
        from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

        inputs["references"] = [MiniMaxH3ImageReference(image=images["ref_image"])]
    return inputs


def _describe_inputs(result: GenerateResult, params: GenerateParams, images: dict[str, Any], model: ModelSpec) -> None:
    """Record each image and what diffusers does to it on this canvas; say when tiling is off."""
    canvas = (result.width, result.height)
    short_edge = int(model.index.get("reference_image_short_edge", 2048))
    for name, image in images.items():
        note = ""
        if name == "ref_image":
            if min(image.size) != short_edge:
                note = f"ref_image {image.size[0]}x{image.size[1]} is resized (LANCZOS) to a {short_edge} px short edge"
        elif image.size != canvas:
            how = "stretched" if name == "image" or "image" not in images else "scaled to cover and centre-cropped"
            note = f"{name} {image.size[0]}x{image.size[1]} is {how} onto the {canvas[0]}x{canvas[1]} canvas (LANCZOS)"
        result.inputs[name] = {"file": Path(getattr(params, name)).name, "size": list(image.size), "note": note}
        if note:
            result.notes.append(note)
    if not params.vae_tiling:
        result.notes.append(VAE_TILING_WARNING)


VAE_TILING_WARNING = ("VAE tiling is off: H3's VAE decodes cleanly only on its 256 px tiles (36.4 dB tiled against"
                      " 21.5 dB untiled, as reported), and an untiled high-resolution decode can exhaust a"
                      " unified-memory box")
"""Said whenever a run turns VAE tiling off."""


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
    from .quantize import DIT_COMPONENTS, held_bytes

    def on_tensor(placed) -> None:
        if placed.sample is not None:
            run.record(placed.sample)

    quantize = run.quantize if name in DIT_COMPONENTS else None
    module, report = load_component(run.root, name, mode=run.mode, device=str(target),
                                    dtype=run.dtypes.get(name, run.dtype), workflow=run.result.workflow,
                                    on_tensor=on_tensor, probe=run.probe, roots=run.roots, quantize=quantize)
    out = report.to_dict()
    if quantize is not None:
        out |= {"quantize": quantize, "bytes_held": held_bytes(module)}
    return module, out
