"""The generate pipeline: prompt to MP4 with audio, in the stages users know.

input preparation -> conditioning -> latent preparation -> denoising ->
decoding -> encoding. Components are loaded with `loader.load_checkpoint` in
the stage that first needs them. The offload settings are resolved once for
the device (`loader.offload.resolve_offload`) and every site reads the
result: each component's load-time device, the text encoder and VAE moves
around their forwards, `dit_cpu_offload` around denoising, and
`dit_layerwise_offload` (each joint block brought to the device for its
forward and sent back after). Every stage boundary, denoising step and move
is reported through `on_event`; memory is sampled on a timer during stages.
"""

from __future__ import annotations

import hashlib
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import torch
import torch.nn as nn

from .loading import load_component
from loader.device import DeviceInfo, probe_device
from loader.memory import MemoryProbe, MemorySample, PeriodicSampler
from loader.offload import OffloadDecision, OffloadSettings, resolve_offload

from . import registry as _registry  # noqa: F401  (the loader builds components from their _class_name)
from .audio_vae import audio_latent_frames
from .encode import write_mp4
from .params import GenerateParams, ModelSpec, validate_params
from .text_encoder import tokenize

STAGES = ("input preparation", "conditioning", "latent preparation", "denoising", "decoding", "encoding")
"""Stage names, in order; events and samples carry them."""

FLOW_SHIFT = 3.0
"""Time shift of the flow-matching schedule (more steps spent at high noise)."""


@dataclass(frozen=True)
class PipelineEvent:
    """Something a watcher of the run wants to know."""

    kind: str
    """`stage_start`, `stage_end`, `step`, `load`, `move` or `offload_decision`."""
    stage: str
    """One of STAGES."""
    message: str
    """One line for people."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable details (step index, component, from/to device, bytes, seconds)."""


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
    """Whether the MP4 has an audio track."""
    frames_sha256: str = ""
    """SHA-256 of the decoded RGB frames before encoding: equal for equal seeds and inputs."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per stage."""
    stage_peaks: dict[str, int] = field(default_factory=dict)
    """Peak footprint per stage in bytes: max of VmRSS + CUDA allocated over the stage's samples."""
    offload: dict[str, bool] = field(default_factory=dict)
    """The resolved offload settings every site used."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """Flags the policy changed, with reasons."""
    loads: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Component -> the loader's LoadReport as a dict."""

    def to_dict(self) -> dict:
        return asdict(self)


EventSink = Callable[[PipelineEvent], None]
SampleSink = Callable[[str, MemorySample], None]


class _Run:
    """State shared by the stages of one run: device, settings, reporting."""

    def __init__(self, device: torch.device, info: DeviceInfo, dtype: torch.dtype, settings: OffloadSettings,
                 mode: str, on_event: EventSink | None, on_sample: SampleSink | None, sample_interval: float,
                 result: GenerateResult, probe: MemoryProbe):
        self.device, self.info, self.dtype, self.settings, self.mode = device, info, dtype, settings, mode
        self.on_event, self.on_sample, self.interval = on_event, on_sample, sample_interval
        self.result = result
        self.stage = STAGES[0]
        self.probe = probe

    def emit(self, kind: str, message: str, **data: Any) -> None:
        if self.on_event is not None:
            self.on_event(PipelineEvent(kind, self.stage, message, data))

    def _record(self, sample: MemorySample) -> None:
        peak = sample.vm_rss + sample.device_allocated
        if peak > self.result.stage_peaks.get(self.stage, 0):
            self.result.stage_peaks[self.stage] = peak
        if self.on_sample is not None:
            self.on_sample(self.stage, sample)

    @contextmanager
    def stage_of(self, name: str) -> Iterator[None]:
        self.stage = name
        self.emit("stage_start", f"{name} started")
        start = time.monotonic()
        self._record(self.probe.sample())
        with PeriodicSampler(self.probe, self.interval, self._record):
            yield
        _synchronize(self.device)
        self._record(self.probe.sample())
        seconds = time.monotonic() - start
        self.result.stage_seconds[name] = seconds
        self.emit("stage_end", f"{name} done in {seconds:.2f} s", seconds=seconds,
                  peak_bytes=self.result.stage_peaks.get(name, 0))

    def load(self, model_dir: Path, component: str, on_device: bool) -> nn.Module:
        module, report = load_component(
            model_dir, component, device=self.device, device_info=self.info, cpu_offload=not on_device,
            dtype=self.dtype, mode=self.mode, probe=self.probe,
            on_tensor=lambda placed: self._record(placed.sample) if placed.sample is not None else None,
        )
        self.result.loads[component] = report.to_dict()
        self.emit("load", f"loaded {component} on {report.device} ({self.mode})", component=component,
                  device=report.device, bytes=report.bytes_placed, seconds=report.load_seconds)
        return module

    def move(self, module: nn.Module, what: str, target: torch.device) -> None:
        nbytes = sum(t.nbytes for t in module.parameters())
        module.to(target)
        self.emit("move", f"moved {what} to {target}", component=what, to=str(target),
                  host=target.type == "cpu", bytes=nbytes)


def run_generate(
    model_dir: str | os.PathLike,
    params: GenerateParams,
    out_path: str | os.PathLike,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    mode: str = "stream",
    offload: OffloadSettings = OffloadSettings(),
    device_info: DeviceInfo | None = None,
    on_event: EventSink | None = None,
    on_sample: SampleSink | None = None,
    sample_interval: float = 0.1,
    probe: MemoryProbe | None = None,
) -> GenerateResult:
    """Generate one clip from the model at `model_dir` into the MP4 `out_path`.

    `dtype` defaults to float32 on CPU and bfloat16 elsewhere; `mode` is the
    loader's placement mode. `device_info` replaces the device probe (tests,
    or a job that probed already). `probe` is the job's memory probe (with its
    cgroup file, when it runs under a limit); by default one for `device`. Raises GenerateParamsError for parameters
    the model cannot take, before any weight is read.
    """
    root = Path(model_dir)
    info = device_info or probe_device(device)
    torch_device = torch.device(device)
    dtype = dtype or (torch.float32 if torch_device.type == "cpu" else torch.bfloat16)
    settings, decisions = resolve_offload(offload, info)
    result = GenerateResult(str(out_path), params.frames, params.fps, params.duration, params.width,
                            params.height, params.audio, offload=settings.to_dict(),
                            decisions=[d.to_dict() for d in decisions])
    own_probe = probe is None
    probe = probe or MemoryProbe(str(torch_device) if torch_device.type == "cuda" else None)
    run = _Run(torch_device, info, dtype, settings, mode, on_event, on_sample, sample_interval, result, probe)
    try:
        with run.stage_of("input preparation"):
            model = ModelSpec.read(root)
            available = info.total_memory if torch_device.type == "cuda" else psutil.virtual_memory().available
            validate_params(params, model, available_bytes=available, dtype_bytes=dtype.itemsize)
            _report_decisions(run, decisions)
            prompts = [params.prompt] + ([params.negative_prompt] if params.guidance_scale != 1.0 else [])
            ids, mask = tokenize(prompts, model.text_encoder.max_tokens)
        with run.stage_of("conditioning"):
            text, text_mask = _encode_text(run, root, ids, mask)
        with run.stage_of("latent preparation"):
            video, audio = _initial_latents(params, model, run.device)
        with run.stage_of("denoising"):
            video, audio = _denoise(run, root, params, video, audio, text, text_mask)
        with run.stage_of("decoding"):
            frames, wave = _decode(run, root, params, model, video, audio)
        result.frames_sha256 = hashlib.sha256(frames.tobytes()).hexdigest()
        with run.stage_of("encoding"):
            write_mp4(out_path, frames, params.fps, wave, model.audio_vae.sample_rate)
    finally:
        if own_probe:
            probe.close()
    return result


def _report_decisions(run: _Run, decisions: list[OffloadDecision]) -> None:
    for decision in decisions:
        run.emit("offload_decision", str(decision), **decision.to_dict())


def _encode_text(run: _Run, root: Path, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    offload = run.settings.text_encoder_cpu_offload
    encoder = run.load(root, "text_encoder", on_device=not offload)
    if offload:
        run.move(encoder, "text_encoder", run.device)
    with torch.inference_mode():
        text = encoder(ids.to(run.device), mask.to(run.device))
    if offload:
        run.move(encoder, "text_encoder", torch.device("cpu"))
    del encoder
    return text, mask.to(run.device)


def _initial_latents(params: GenerateParams, model: ModelSpec, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian noise drawn on the CPU from the seed, so every device starts from the same latents."""
    g = torch.Generator().manual_seed(params.seed)
    vae = model.vae
    latent_frames = (params.frames - 1) // vae.temporal_factor + 1
    video = torch.randn(1, vae.latent_channels, latent_frames, params.height // vae.spatial_factor,
                        params.width // vae.spatial_factor, generator=g)
    audio_len = audio_latent_frames(params.duration, model.audio_vae.latent_rate) if params.audio else 0
    audio = torch.randn(1, model.audio_vae.latent_channels, audio_len, generator=g)
    return video.to(device), audio.to(device)


def flow_sigmas(steps: int, shift: float = FLOW_SHIFT) -> torch.Tensor:
    """steps + 1 noise levels from 1 to 0, time-shifted."""
    s = torch.linspace(1.0, 0.0, steps + 1)
    return shift * s / (1 + (shift - 1) * s)


def _denoise(run: _Run, root: Path, params: GenerateParams, video: torch.Tensor, audio: torch.Tensor,
             text: torch.Tensor, text_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = run.settings
    on_host = s.dit_cpu_offload or s.dit_layerwise_offload
    dit = run.load(root, "transformer", on_device=not on_host)
    hooks = []
    if s.dit_layerwise_offload:
        blocks = dit.transformer_blocks
        dit.transformer_blocks = nn.ModuleList()
        run.move(dit, "transformer (all but its blocks)", run.device)
        dit.transformer_blocks = blocks
        hooks = _layerwise_hooks(run, blocks)
    elif s.dit_cpu_offload:
        run.move(dit, "transformer", run.device)
    sigmas = flow_sigmas(params.steps)
    guided = params.guidance_scale != 1.0
    try:
        with torch.inference_mode():
            for i in range(params.steps):
                t = sigmas[i].expand(text.shape[0]).to(run.device)
                v_video, v_audio = dit(
                    video.expand(text.shape[0], -1, -1, -1, -1), audio.expand(text.shape[0], -1, -1),
                    text, t, text_mask,
                )
                if guided:
                    v_video = v_video[1:] + params.guidance_scale * (v_video[:1] - v_video[1:])
                    v_audio = v_audio[1:] + params.guidance_scale * (v_audio[:1] - v_audio[1:])
                dt = float(sigmas[i + 1] - sigmas[i])
                video = video + dt * v_video
                audio = audio + dt * v_audio
                run.emit("step", f"step {i + 1}/{params.steps}", step=i + 1, steps=params.steps,
                         sigma=float(sigmas[i + 1]))
    finally:
        for hook in hooks:
            hook.remove()
    if s.dit_cpu_offload:
        run.move(dit, "transformer", torch.device("cpu"))
    del dit
    return video, audio


def _layerwise_hooks(run: _Run, blocks: nn.ModuleList) -> list[torch.utils.hooks.RemovableHandle]:
    """Bring each joint block to the device just before its forward and send it back after."""
    host = torch.device("cpu")
    handles = []
    for i, block in enumerate(blocks):
        name = f"transformer.transformer_blocks.{i}"
        handles.append(block.register_forward_pre_hook(lambda m, a, n=name: run.move(m, n, run.device)))
        handles.append(block.register_forward_hook(lambda m, a, o, n=name: run.move(m, n, host)))
    return handles


def _decode(run: _Run, root: Path, params: GenerateParams, model: ModelSpec, video: torch.Tensor,
            audio: torch.Tensor):
    offload = run.settings.vae_cpu_offload
    decoded = {}
    for component, latents in (("vae", video), ("audio_vae", audio if params.audio else None)):
        if latents is None:
            continue
        decoder = run.load(root, component, on_device=not offload)
        if offload:
            run.move(decoder, component, run.device)
        with torch.inference_mode():
            decoded[component] = decoder(latents)
        if offload:
            run.move(decoder, component, torch.device("cpu"))
        del decoder
    rgb = decoded["vae"][0].permute(1, 2, 3, 0)
    frames = ((rgb + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).contiguous().cpu().numpy()
    wave = None
    if params.audio:
        samples = round(params.duration * model.audio_vae.sample_rate)
        wave = decoded["audio_vae"][0, :samples].float().cpu().numpy()
    return frames, wave


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
