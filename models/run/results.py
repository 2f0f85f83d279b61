"""What a generate run reports: events as they happen, the result when it ends.

`models.run.pipeline.run_generate` fills them; jobs, the CLI and the dashboard read
them (`GenerateResult.to_dict()` is what a job stores).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from machine.memory import MemorySample


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
    steps_computed: int = 0
    """Of `steps`, the calls that computed every module: all of them without a step cache."""
    steps_reused: int = 0
    """Of `steps`, the calls on which the step cache predicted its modules' outputs from earlier calls instead of
    computing them (TaylorSeer: each block's attention). diffusers' hooks keep no count: our denoise block counts
    the calls and applies the cache's schedule (`models.speed.speedups.step_reused`)."""
    workflow: str = "t2va"
    """The diffusers workflow run."""
    num_inference_steps: int = 0
    """Steps asked of the scheduler: the request's or the checkpoint's scheduler config's."""
    shift: float | None = None
    """The video scheduler's sigma shift: the request's or the scheduler config's (None: the class default)."""
    vae_tiling: bool = True
    """Whether the video VAE encoded and decoded on its 256 px tiles."""
    vae_dtype: str = "bf16"
    """The video VAE's precision."""
    quantize: str | None = None
    """The DiT's weight-only quantization (frames then differ from bf16's); None: bf16."""
    levers: dict[str, Any] = field(default_factory=dict)
    """The speed levers the run used: `key` (the lever set as history keys it, "" for none), `lossless`, and each
    lever's value (`models.speed.levers`)."""
    loras: list[dict[str, Any]] = field(default_factory=list)
    """The LoRAs merged, in order: file, sha256, scale, partition (what each merge did: `loads[partition]["lora"]`)."""
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
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """A parallel run's ranks (`models.parallel.launch`), each {rank, stage_seconds, stage_peaks, peak}; the fields above
    are rank 0's. Empty for a run of one process."""

    def to_dict(self) -> dict:
        return asdict(self)


EventSink = Callable[[PipelineEvent], None]
SampleSink = Callable[[str, MemorySample], None]
