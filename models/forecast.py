"""What a generate run will hold, stage by stage, before any weight is read.

Reads configs, safetensors headers, the local tokenizer, the input images'
headers and a reference clip's header (one frame decoded, for its rotation)
only. Per computing stage of the workflow's plan (`models.workflows.
stage_plan`: every block that reads weights, with what is resident around it),
the forecast adds, above the process's own footprint once the pipeline is built
(what `bench/bench_generate.py` measures against; the process itself is learned from the machine's own
jobs, `models.process_size`):

- weights resident under the resolved policy (header sizes at the run's dtype,
  H3's fp32 modules kept fp32, the text encoder's vision tower only where the
  workflow reads it, the video VAE at fp32 when `vae_dtype` says so, the DiT at
  its quantized size under `quantize`; with `sequential_components` the plan's
  resident components, otherwise all the workflow's), split into host and device;
- the stage's working set: `fixed + per_unit * driver`, where the driver is
  the stage's size in its own unit (text and image rows x hidden x hidden states
  kept, encoded image pixels, packed sequence rows x DiT widths, output pixels,
  audio samples) and the two constants per stage are fitted on measured runs
  (`CPU_TERMS`; the fit and the geometries it was checked on are in
  docs/benchmarks.md);
- what earlier stages left behind (embeddings, latents, decoded frames, audio);
- on CUDA, the costs outside tensors: the context (process level), the
  cuBLAS/cuDNN workspaces, and each stage's reserve (`CUDA_TERMS`, `CUDA_STAGE_TERMS`:
  measured on one H200 at real size).

Each stage reports host, device and their sum: the sum is what a unified-memory
machine pays. Offloaded weights count on the host.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from loader import packed_bytes
from loader.roots import ModelRoots
from loader.safetensors_file import read_shard_header
from machine.device import DeviceInfo
from machine.offload import OffloadSettings, resolve_offload

from .levers import LEVER_FIELDS
from .params import TEXT_ENCODER_LAYER, GenerateParams, ModelSpec
from .quantize_check import FP8_COMPUTE
from .residency import MODEL_OFFLOAD, ON_DEVICE, pins_host_copy, plan_placements
from .video_length import FPS
from .workflows import check_workflow, stage_plan, workflow_components

AUDIO_CHANNELS, AUDIO_LATENTS_PER_SECOND = 2, 40
"""H3's stereo soundtrack and its latent rate."""
MiB = 2**20


@dataclass(frozen=True)
class StageTerm:
    """A stage's working set beyond weights and carried outputs: `fixed + per_unit * driver` bytes."""

    fixed: int
    """Bytes whatever the size (kernels' scratch, thread pools, the allocator's first arenas)."""
    per_unit: float
    """Bytes per unit of the stage's driver (see `_drivers`)."""


CLIP_ENCODE = "vae_encoder.clip"
"""The term of ref2va's `vae_encoder` for its reference clip, whose frames go through the VAE's temporal chunks
(an image takes the spatial encoder alone, `vae_encoder`'s own term); the stage holds the larger of the two,
the caching allocator reusing the one's blocks for the other."""

CPU_TERMS: dict[str, StageTerm] = {
    "text_encoder": StageTerm(16646710, 11.334),
    "denoise.denoise": StageTerm(29916548, 3.7263),
    "decode.video": StageTerm(34968454, 16.8655),
    "decode.audio": StageTerm(66692115, 236.8461),
    "vae_encoder": StageTerm(76591419, 15.33),
    CLIP_ENCODE: StageTerm(119600211, 53.91),
}
"""Fitted by `bench/fit_generate_forecast.py` on CPU runs with torch 2.13.0+cpu, diffusers 0.42.1,
transformers 5.25.0, tokenizers 0.23.3 and torchao 0.18.0 installed (diffusers imports it); other versions
move these by several MiB (see docs/benchmarks.md for the runs and the check on other geometries)."""
VAE_ALONE_TERMS = ("vae_encoder", CLIP_ENCODE)
"""Terms fitted on the video VAE's encode alone (`bench/bench_vae_encode.py`), not on whole runs: an image's
(fl2va's keyframes, ref2va's reference image: the spatial encoder over one frame; on a CPU fitted on the demo
profile's VAE at 448x256, 1344x768 and 1792x1024, checked on 576x320 and 896x512 within 4 % and on a whole
demo fl2va run's stage) and a reference clip's (on a CPU fitted on 124 frames of the tiny and the demo
profiles' canvases)."""
CPU_RETAINED = 0.0
"""Share of the largest earlier working set a CPU stage still holds. Every entry point fixes glibc's mmap
threshold (`loader.process`), so freed buffers of 1 MiB and up leave the resident set at once: the fit finds 0
(it found 0.1 to 1.0 with glibc's sliding threshold, from one machine state to the next)."""
CPU_RETAINED_WEIGHTS = 0.2
"""Share of the weights that sequential residency released in earlier stages a CPU stage still holds, fitted
with CPU_TERMS (the demo profile decides it, its text encoder and DiT being 95 MiB against the tiny's 1 MiB).
A release hands the heap's free pages back (`machine.host_heap.give_back_free_heap`), so what it measures
is not freed heap; what it is was not identified. Before that trim the same demo run kept 7 to 59 MiB of the
released text encoder, from one run to the next, and the fit found 0.3."""
CPU_NOISE_FLOOR = 48 * MiB
"""How far one CPU stage's peak RSS moves with nothing in the job changed: even with the mmap threshold
fixed, the process's footprint once the pipeline is built moved by 78 MiB and `text_encoder` by 20 MiB
between two machine states of one session here (same packages, same code, cause not found), and CI has
measured stages 17-50 MiB above this machine. A stage's forecast is held to 10 % or this, whichever is
larger (the test, and the fit's choice of retained shares)."""


@dataclass(frozen=True)
class CudaTerms:
    """What a CUDA run holds outside its tensors' own bytes, measured on one H200 (torch 2.11, cu130) at real
    size (docs/benchmarks.md, "Generate forecast against measured, one H200")."""

    context: int = 600 * MiB
    """The CUDA context and torch's loaded kernels, device side; not in torch's reserved figure, so not in
    the measured sum, but real memory on a unified-memory machine; once per process (not measured here)."""
    blas_init_host: int = 700 * MiB
    """Host memory the process adds when cuBLAS and cuDNN initialise, at its first stage: 0.70 GiB over the
    0.96 GiB it held at the end of `prepare` (1.66 GiB measured at real size, both geometries); once per
    process. The 0.96 GiB is the process's start-up, learned from the machine's own jobs (`models.process_size`)."""
    workspaces: int = 96 * MiB
    """cuBLAS and cuBLASLt workspaces plus a cuDNN convolution workspace, per stage, on the device."""
    group_offload_device_blocks: float = 2.27
    """DiT blocks a block-level group offload holds on the device beyond the running one, while the DiT runs:
    the block its stream prefetches and those not yet freed behind it (2.80 GiB at real size, blocks of 1.23
    GiB, at either geometry)."""
    image_path_host: int = 410 * MiB
    """Host memory a run conditioned on an image (fl2va's keyframes, ref2va's reference image) holds from its
    text stage on, beyond a t2va run's: the processor's image half and what it brings in. 0.40 GiB over a t2va
    run on the same checkpoint at 1344x768 (0.35-0.37 GiB in the later stages), 0.32 GiB at 1024x576; once
    per process."""
    group_offload_host_blocks: float = 1.31
    """Host memory a group-offloaded DiT adds while it runs, beyond its pinned copy, in blocks (1.61 GiB at
    real size, the same at both geometries; its cause was not identified)."""


CUDA_STAGE_TERMS: dict[str, StageTerm] = {
    "text_encoder": StageTerm(0, 2.0714),
    "denoise.denoise": StageTerm(0, 7.38),
    "decode.video": StageTerm(0, 50.3),
    "decode.audio": StageTerm(0, 2294.0),
    "vae_encoder": StageTerm(770655724, 13.35),
    CLIP_ENCODE: StageTerm(5736823855, 30.87),
}
"""Device bytes a CUDA stage reserves beyond its weights and the workspaces (the working set plus the caching
allocator's reserve over it; weights placed by the loader reserve what they allocate): fitted on the real-size
sequential run at 1344x768 and checked on 1024x576 and on the resident runs (`text_encoder`'s on an fl2va run's,
two keyframes, the vision tower and the language model over their rows, checked on ref2va's image and clip: a
t2va prompt's rows hold next to nothing); `vae_encoder`'s two terms on the
real-size video VAE encoding alone (`bench/bench_vae_encode.py`): an image's on 1344x768 and 3648x2048, a clip's
on 124 frames of 1024x576 and 345 of 1344x768, checked on three other clips (docs/benchmarks.md)."""
CUDA_HOST_FRAME_BYTES = {"decode.video": 8.8, "decode.audio": 4.3}
"""Host bytes per decoded RGB value a CUDA stage adds (the float32 frames copied off the device, their float32
and uint8 copies for the MP4), fitted with CUDA_STAGE_TERMS; on a CPU the fitted CPU_TERMS hold them."""


CUDA_TERMS = CudaTerms()


@dataclass(frozen=True)
class StageForecast:
    """Predicted bytes held during one stage, above the process's own footprint."""

    stage: str
    """Pipeline block name."""
    component: str
    """The weight component the stage runs (the first it reads: ref2va's `vae_encoder` also runs `audio_vae`)."""
    weight_bytes: int
    """Weights resident anywhere (device or host) during the stage."""
    device_weight_bytes: int
    """Of those, on the device while the stage computes (0 on a CPU; unified memory counts them here)."""
    activation_bytes: int
    """Working set of the stage's forward (fitted term), on the device where the stage runs."""
    output_bytes: int
    """What this and earlier stages leave behind: embeddings, latents, decoded frames or audio (host); on a
    CPU also the heap earlier stages freed but the allocator kept (CPU_RETAINED)."""
    overhead_bytes: int
    """CUDA only: workspaces and the caching allocator's reserve over allocated."""
    host_bytes: int
    """Host memory of the stage: weights not on the device, outputs; everything on a CPU."""
    device_bytes: int
    """Device memory of the stage (reserved, not only allocated); 0 on a CPU."""
    driver: float
    """The stage's size in its own unit (what the working set and the seconds scale with)."""
    lora_bytes: int = 0
    """LoRA factors and merge temporaries held while this stage's DiT loads just before it (they are gone when it
    computes: the stage counts the larger of them and its working set)."""

    @property
    def total_bytes(self) -> int:
        """Host + device: what a unified-memory machine pays."""
        return self.host_bytes + self.device_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class RankForecast:
    """The stages of one rank, or of ranks alike, of a parallel run (`--parallel`)."""

    ranks: str
    """Which ranks: `0`, or the others (`1`, `1-3`)."""
    stages: list[StageForecast]
    """Each stage as that rank holds it."""

    @property
    def peak_bytes(self) -> int:
        return max((s.total_bytes for s in self.stages), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "stages": [s.to_dict() for s in self.stages], "peak_bytes": self.peak_bytes}


@dataclass(frozen=True)
class GenerateForecast:
    """A whole run's forecast."""

    height: int
    """Pixels."""
    width: int
    """Pixels."""
    frames: int
    """Video frames."""
    steps: int
    """num_inference_steps."""
    text_tokens: int
    """The prompt's tokens, counted with the checkpoint's own tokenizer."""
    tokens: int
    """Rows of the packed sequence the DiT attends over (text + audio + video patches)."""
    sequential_components: bool
    """Whether the forecast assumes per-stage residency."""
    component_bytes: dict[str, int]
    """Each weight component's bytes at the run's dtype."""
    placements: dict[str, str]
    """Component -> diffusers mechanism under the resolved policy."""
    process_host_bytes: int
    """What the process adds beyond its start-up (`models.process_size`, learned from this machine's jobs): on
    CUDA cuBLAS and cuDNN and an image path's processor; a reference clip's decoded frames; else 0."""
    process_device_bytes: int
    """The CUDA context (0 elsewhere)."""
    stages: list[StageForecast] = field(default_factory=list)
    """One entry per computing stage, in run order."""
    workflow: str = "t2va"
    """The workflow whose stage plan was forecast."""
    clip_decode_bytes: int = 0
    """Host bytes above the process (which counts the decoded clip) while a reference clip decodes, in its own
    stage (`models.clips.READ_CLIP`) before any weight: what the decode holds twice for a moment."""
    lora_bytes: dict[str, int] = field(default_factory=dict)
    """Partition -> what its LoRAs hold while it loads (`models.lora_inputs.lora_load_bytes`); a merged LoRA holds
    nothing once loaded."""
    lora_work: dict[str, int] = field(default_factory=dict)
    """Partition -> bytes of LoRA factors its load reads, converts and merges (what the ETA scales by)."""
    levers: dict[str, Any] = field(default_factory=dict)
    """The speed levers forecast (`attention`, `compile`, `quantize`, `step_cache`)."""
    lever_bytes: dict[str, int] = field(default_factory=dict)
    """Memory a lever adds that is known from configs (`step_cache`: its buffers), counted in the stages that hold it."""
    not_counted: list[str] = field(default_factory=list)
    """Lever memory that only a GPU run can fit (a compile's workspace, fp8 activation scales), said, not guessed."""
    ranks: list[RankForecast] = field(default_factory=list)
    """A parallel run's ranks (rank 0, then the others, alike); `stages` is then what the walls check: every rank's
    host bytes together, one rank's device bytes (each has its own GPU). Empty for a run of one process."""

    @property
    def predicted_peak_bytes(self) -> int:
        """The largest stage's host + device, above the process."""
        return max([s.total_bytes for s in self.stages] + [self.clip_decode_bytes])

    @property
    def peak_stage(self) -> str:
        from .clips import READ_CLIP

        peak = max(self.stages, key=lambda s: s.total_bytes, default=None)
        if peak is None or self.clip_decode_bytes > peak.total_bytes:
            return READ_CLIP if self.clip_decode_bytes else ""
        return peak.stage

    def stage(self, name: str) -> StageForecast:
        return next(s for s in self.stages if s.stage == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "height": self.height, "width": self.width, "frames": self.frames, "steps": self.steps,
            "workflow": self.workflow, "text_tokens": self.text_tokens, "tokens": self.tokens,
            "sequential_components": self.sequential_components, "component_bytes": dict(self.component_bytes),
            "placements": dict(self.placements), "process_host_bytes": self.process_host_bytes,
            "process_device_bytes": self.process_device_bytes, "stages": [s.to_dict() for s in self.stages],
            "clip_decode_bytes": self.clip_decode_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes, "peak_stage": self.peak_stage,
            "lora_bytes": dict(self.lora_bytes), "lora_work": dict(self.lora_work),
            "levers": dict(self.levers), "lever_bytes": dict(self.lever_bytes), "not_counted": list(self.not_counted),
            "ranks": [r.to_dict() for r in self.ranks],
        }


def count_prompt_tokens(root: str | Path, prompt: str) -> int:
    """Tokens of `prompt` as the t2va text step makes them (the checkpoint's tokenizer, no special tokens)."""
    return count_tokens(root, [prompt])[0]


def count_tokens(root: str | Path, texts: list[str]) -> list[int]:
    """Tokens of each of `texts`, each encoded on its own as diffusers encodes a label (the checkpoint's tokenizer,
    read once, no special tokens)."""
    from tokenizers import Tokenizer

    from loader.confined import require_regular_files

    path = Path(root) / "tokenizer" / "tokenizer.json"
    if path.parent.is_dir():
        require_regular_files(path.parent)  # tokenizers opens by path: a FIFO would block it
    if not path.is_file():
        raise ValueError(f"{path}: no tokenizer.json, so the prompt's tokens cannot be counted")
    tokenizer = Tokenizer.from_file(str(path))
    return [len(tokenizer.encode(text, add_special_tokens=False).ids) for text in texts]


def forecast_generate(
    root: str | Path,
    params: GenerateParams,
    *,
    device_info: DeviceInfo,
    settings: OffloadSettings,
    dtype_bytes: int = 2,
    sequential_components: bool | None = None,
    workflow: str | None = None,
    resolved: bool = False,
) -> GenerateForecast:
    """Forecast a run of `params` on the model at `root` under `settings` for `device_info`.

    `workflow` defaults to the one `params` selects (`GenerateParams.resolved_workflow`); its stage plan
    (`models.workflows.stage_plan`) says which components each stage holds. `resolved`: the settings are
    the policy's answer already (a job's probe stage resolved them); else they are resolved here.
    `sequential_components` defaults as `run_generate` does (on for unified memory).
    """
    from .quantize import DIT_COMPONENTS

    root = Path(root)
    model = ModelSpec.read(root)
    workflow = check_workflow(workflow or params.resolved_workflow)
    if not resolved:
        settings, _ = resolve_offload(settings, device_info)
    sequential = device_info.unified_memory if sequential_components is None else sequential_components
    cuda, cpu = device_info.kind == "cuda", device_info.kind == "cpu"
    plan = [s for s in stage_plan(workflow, audio=params.audio, sequential=sequential) if s.reads]
    components = workflow_components(workflow, params.audio)
    placements = plan_placements(settings, _torch_device(device_info), components)
    sizes = weight_bytes(root, dtype_bytes, workflow=workflow, quantize=params.quantize, vae_dtype=params.vae_dtype,
                         audio=params.audio, transformer=params.transformer)
    bf16_dit = params.quantize is None and not params.gguf_dit
    host_sizes = _host_sizes(root, sizes, placements, settings, cuda, bf16_dit, dtype_bytes, params.transformer)
    images, height, width, text_tokens, clip, conditions = _layout(root, model, params, workflow)
    tokens, drivers, outputs = _drivers(model, params, height, width, text_tokens, dtype_bytes, conditions,
                                        _vision_tokens(root, [c for c in conditions if c[0] == 1]), clip)
    pixels = drivers["decode.video"]  # the clip's pixels, as _drivers counts them
    from .lora_inputs import lora_load_bytes

    lora_bytes, lora_work = lora_load_bytes(root, params) if params.loras else ({}, {})
    loaded: set[str] = set()
    layers = max(int(model.configs["transformer"]["num_layers"]), 1)
    # An fp32 video VAE's tensors are twice bf16's: its stages' per-unit bytes scale with the element (an
    # assumption, not fitted: CPU_TERMS were measured at bf16).
    vae_scale = 4 / dtype_bytes if params.vae_dtype == "fp32" else 1.0
    levers = {name: getattr(params, name) for name in LEVER_FIELDS}
    cache = step_cache_bytes(model, params.step_cache, tokens, dtype_bytes)
    cache_from = next((i for i, s in enumerate(plan) if set(s.reads) & set(DIT_COMPONENTS)), len(plan))
    stages = []
    carried = clip.normalized_bytes if clip else 0  # the clip put on 24 fps and its canvas, held from the setup on
    retained = retained_device = released = 0
    for planned in plan:
        stage, reads = planned.block, planned.reads
        resident = list(planned.resident) if sequential else list(components)
        weights = sum(sizes[c] for c in resident)
        on_device = streaming = 0
        if not cpu:
            on_device = sum(sizes[c] for c in resident if placements[c].mechanism == ON_DEVICE)
            for c in reads:
                if placements[c].mechanism != ON_DEVICE:  # an offloaded component comes in while it runs
                    layerwise = c in DIT_COMPONENTS and settings.dit_layerwise_offload
                    on_device += sizes[c] // layers if layerwise else sizes[c]
                    if layerwise and cuda:
                        on_device += int(CUDA_TERMS.group_offload_device_blocks * sizes[c] / layers)
                        streaming += int(CUDA_TERMS.group_offload_host_blocks * sizes[c] / layers)
        terms = CUDA_STAGE_TERMS if cuda else CPU_TERMS
        scale = vae_scale if "vae" in reads else 1.0
        activations = _working_set(terms[stage], drivers[stage] * scale)
        merging = sum(lora_bytes.get(c, 0) for c in resident if c not in loaded)  # loaded just before this stage
        loaded.update(resident)
        if stage == "vae_encoder" and drivers[CLIP_ENCODE]:
            activations = max(activations, _working_set(terms[CLIP_ENCODE], drivers[CLIP_ENCODE] * scale))
        carried += int(CUDA_HOST_FRAME_BYTES[stage] * 3 * pixels) if cuda and stage in CUDA_HOST_FRAME_BYTES \
            else outputs[stage]
        heap = retained + int(CPU_RETAINED_WEIGHTS * released)
        held = carried + (heap if cpu else 0)
        if cpu:
            overhead, host, device = 0, weights + max(activations, merging) + held, 0
            retained = max(retained, int(CPU_RETAINED * activations))
            released += sum(sizes[c] for c in planned.releases) if sequential else 0
        else:
            overhead = CUDA_TERMS.workspaces if cuda else 0
            host = (sum(host_sizes[c] for c in resident) - _host_copies_freed(placements, resident, host_sizes, reads)
                    + carried + streaming)
            # The caching allocator keeps an earlier stage's working set reserved unless a release emptied it
            # (sequential residency frees the cache with each component).
            device = on_device + max(activations, 0 if sequential else retained_device) + overhead
            retained_device = max(retained_device, activations)
            host += merging  # the factors are host tensors; one weight's product at a time is on the device
        if cache and plan.index(planned) >= cache_from and set(resident) & set(DIT_COMPONENTS):
            # The cache's buffers live on the DiT's hooks, on the device the DiT computes on, while it is resident.
            host, device = (host + cache, device) if cpu else (host, device + cache)
        stages.append(StageForecast(stage, reads[0], weights, on_device, activations, held, overhead,
                                    host, device, drivers[stage], merging))
    process_host = (CUDA_TERMS.blas_init_host + (CUDA_TERMS.image_path_host if images else 0) if cuda else 0)
    ranks: list[RankForecast] = []
    if params.parallel > 1:
        dit = 0 if sequential else sum(sizes[c] for c in components if c in DIT_COMPONENTS)
        ranks = rank_forecasts(stages, params.parallel, cpu, dit)
        stages = joint_stages(ranks, params.parallel)
        process_host *= params.parallel  # each rank is a process of its own
    return GenerateForecast(
        height, width, params.frames, model.steps(params), text_tokens, tokens, sequential, sizes,
        {c: p.mechanism for c, p in placements.items()}, process_host + (clip.decoded_bytes if clip else 0),
        CUDA_TERMS.context if cuda else 0, stages, workflow, clip.decode_bytes if clip else 0, lora_bytes, lora_work,
        levers,
        {"step_cache": cache} if cache else {}, lever_memory_unknown(params), ranks)


def _layout(root: Path, model: ModelSpec, params: GenerateParams, workflow: str):
    """(input image sizes, height, width, prompt tokens, reference clip, conditions): what the packed sequence is
    made of."""
    images = _image_sizes(params)
    height, width = model.geometry(params, images.get("image") or images.get("last_image"))
    clip = reference_clip(root, model, params) if workflow == "ref2va" else None
    conditions = _conditions(model, workflow, params, images, height, width, clip)
    return images, height, width, count_prompt_tokens(root, params.prompt), clip, conditions


def packed_rows(root: str | Path, params: GenerateParams) -> int:
    """Rows of the packed sequence the DiT attends over (text and vision tokens, audio rows, video patches), from
    headers and the tokenizer: what a parallel run must split evenly over its ranks."""
    root = Path(root)
    model = ModelSpec.read(root)
    _, height, width, text_tokens, clip, conditions = _layout(root, model, params, params.resolved_workflow)
    tokens, _, _ = _drivers(model, params, height, width, text_tokens, 2, conditions,
                            _vision_tokens(root, [c for c in conditions if c[0] == 1]), clip)
    return tokens


def rank_forecasts(stages: list[StageForecast], ranks: int, cpu: bool, idle_dit: int) -> list[RankForecast]:
    """A parallel run's stages per rank, from the one-process forecast of the same run: every rank holds the whole
    DiT and 1/N of the sequence's working set in its DiT stages (diffusers' context parallelism splits the rows);
    rank 0 also runs every other stage as one process would; the other ranks hold, outside the DiT's stages,
    only what the stages left behind (the text embeddings rank 0 broadcasts, the latents), and `idle_dit`, the DiT
    when it stays loaded through the run (not sequential)."""
    from .quantize import DIT_COMPONENTS

    first, others = [], []
    for s in stages:
        dit = s.component in DIT_COMPONENTS
        cut = s.activation_bytes - s.activation_bytes // ranks if dit else 0
        first.append(_less(s, cut, cpu))
        if dit:
            others.append(first[-1])
            continue
        on_host, on_device = (idle_dit + s.output_bytes, s.overhead_bytes) if cpu else (
            s.output_bytes, idle_dit + s.overhead_bytes)
        others.append(StageForecast(s.stage, s.component, idle_dit, 0 if cpu else idle_dit, 0, s.output_bytes,
                                    s.overhead_bytes, on_host, on_device, s.driver))
    label = "1" if ranks == 2 else f"1-{ranks - 1}"
    return [RankForecast("0", first), RankForecast(label, others)]


def _less(s: StageForecast, cut: int, cpu: bool) -> StageForecast:
    """`s` with `cut` bytes less working set, on the side it lives (the host on a CPU, else the device)."""
    from dataclasses import replace

    if not cut:
        return s
    return replace(s, activation_bytes=s.activation_bytes - cut, host_bytes=s.host_bytes - (cut if cpu else 0),
                   device_bytes=s.device_bytes - (0 if cpu else cut))


def joint_stages(ranks: list[RankForecast], count: int) -> list[StageForecast]:
    """What the walls check per stage: the host holds every rank (rank 0 and N - 1 others), each GPU one rank (the
    larger of the two)."""
    from dataclasses import replace

    first, other = ranks
    return [replace(a, host_bytes=a.host_bytes + (count - 1) * b.host_bytes,
                    device_bytes=max(a.device_bytes, b.device_bytes))
            for a, b in zip(first.stages, other.stages)]


def step_cache_bytes(model: ModelSpec, cache: str | None, tokens: int, dtype_bytes: int) -> int:
    """The buffers a step cache keeps on the DiT: TaylorSeer keeps, for each block's attention (the modules its
    default patterns hook), `max_order + 1` Taylor factors of the attention's output (packed rows x hidden) in its
    `taylor_factors_dtype`, at diffusers' config defaults. 0 without a cache."""
    if cache is None:
        return 0
    import torch

    from .speedups import cache_config

    config = cache_config(cache)
    dit = model.configs["transformer"]
    element = torch.empty((), dtype=config.taylor_factors_dtype).element_size() if config.taylor_factors_dtype \
        else dtype_bytes
    return int(dit["num_layers"]) * (config.max_order + 1) * tokens * int(dit["hidden_size"]) * element


def lever_memory_unknown(params: GenerateParams) -> list[str]:
    """The levers of `params` whose memory the forecast cannot know from configs, each in one line."""
    unknown = []
    if params.compile:
        unknown.append("compile: the compiled blocks' workspace and the compiler's own memory are not counted; only "
                       "a GPU run can fit them (bench/bench_levers.py)")
    if params.quantize == FP8_COMPUTE:
        unknown.append("fp8-compute: the fp8 weights are counted; the activations' fp8 copies and scales made as each "
                       "call runs are not; only a GPU run can fit them (bench/bench_levers.py)")
    if params.attention != "native":
        unknown.append(f"attention {params.attention}: the denoise working set was fitted with native attention; this "
                       "backend's was not measured")
    return unknown


def _working_set(term: StageTerm, driver: float) -> int:
    """`term`'s bytes at `driver` units."""
    return int(term.fixed + term.per_unit * driver)


def _host_sizes(root: Path, sizes: Mapping[str, int], placements, settings: OffloadSettings, cuda: bool,
                bf16_dit: bool, dtype_bytes: int, transformer: str | None = None) -> dict[str, int]:
    """Each component's bytes as the host holds them: one the loader places page-locked
    (`models.residency.pins_host_copy`) takes its power-of-two blocks (`pinned_component_bytes`). A quantized
    DiT is not pinned by the loader; group offload then pins torchao's tensors, whose size is not modelled."""
    from .quantize import DIT_COMPONENTS

    host = dict(sizes)
    for name in DIT_COMPONENTS:
        if name in placements and pins_host_copy(placements[name], "cuda" if cuda else "cpu", settings,
                                                 quantized=not bf16_dit):
            host[name] = pinned_component_bytes(weights_of(root, name, transformer), _keep_fp32(root, name),
                                                dtype_bytes)
    return host


def _host_copies_freed(placements, resident: list[str], sizes: Mapping[str, int], reads: tuple[str, ...]) -> int:
    """Weights placed on the device hold no host copy; offloaded ones stay on the host (model offload moves
    the module in, so its host copy is gone while it runs; group offload keeps the host copy)."""
    freed = sum(sizes[c] for c in resident if placements[c].mechanism == ON_DEVICE)
    return freed + sum(sizes[c] for c in reads if placements[c].mechanism == MODEL_OFFLOAD)


def _torch_device(info: DeviceInfo):
    import torch

    return torch.device("cpu" if info.kind == "cpu" else info.kind)


def _image_sizes(params: GenerateParams) -> dict[str, tuple[int, int]]:
    """(width, height) of each input image given, from its header (Pillow reads no pixel for it); an image
    that cannot be read is left out (the run itself refuses it, naming the file); a reference clip is read by
    `reference_clip`."""
    from PIL import Image

    sizes = {}
    for name, path in params.input_files().items():
        if name == "ref_video":
            continue
        try:
            with Image.open(path) as image:
                sizes[name] = image.size
        except (OSError, ValueError):
            continue
    return sizes


@dataclass(frozen=True)
class ReferenceClip:
    """A ref2va reference clip as diffusers' setup normalizes it, from the file's header (`models.clips.
    read_clip_header`): resampled onto 24 fps, cut to the generated frames, put on the canvas of its own aspect."""

    frames: int
    """Frames after the resample and the cut (what the conditioner samples at 2 fps)."""
    encoded_frames: int
    """Of those, the 17n + 5 the video VAE encodes (snapped down)."""
    height: int
    """Pixels of the clip's canvas."""
    width: int
    """Pixels of the clip's canvas."""
    audio_seconds: float
    """Seconds of soundtrack conditioned on (0 without one): the soundtrack cut to the generated duration."""
    frame_bytes: int
    """Every frame of the file as RGB bytes, as `MiniMaxH3VideoReference.from_file` holds them for the whole run."""
    soundtrack_bytes: int
    """The whole soundtrack as float32 at its own rate and channels, held likewise (diffusers cuts it later)."""

    @property
    def decoded_bytes(self) -> int:
        """What the decoded clip holds for the whole run (counted with the process)."""
        return self.frame_bytes + self.soundtrack_bytes

    @property
    def decode_bytes(self) -> int:
        """What the decode holds above `decoded_bytes` at its peak: the frames stacked from a list of them, after
        the soundtrack was joined from a list of pieces, each held twice for a moment (one at a time)."""
        return max(self.frame_bytes, self.soundtrack_bytes)

    @property
    def normalized_bytes(self) -> int:
        """The normalized frames (RGB bytes), held from the setup step on."""
        return self.frames * self.height * self.width * 3


def reference_clip(root: Path, model: ModelSpec, params: GenerateParams) -> ReferenceClip | None:
    """`params.ref_video` as the run will hold it, from its streams as they are declared; None without a clip, or
    where its header cannot be read (the job's submit check refuses such a clip, naming the file). A soundtrack
    whose length is not declared is counted at the longest accepted."""
    from .clips import MAX_SOUNDTRACK_SECONDS, frames_at_24, read_clip_header

    info = read_clip_header(params.ref_video) if params.ref_video else None
    if info is None:
        return None
    frames = min(frames_at_24(info.frames, info.fps), params.frames)
    chunk, latents = model.frames_per_chunk, model.latents_per_chunk
    encoded = max(1, (frames - latents) // chunk) * chunk + latents
    height, width = model.canvas_for(info.width, info.height)
    soundtrack = (MAX_SOUNDTRACK_SECONDS if info.audio_seconds is None else info.audio_seconds) if info.audio_rate \
        else 0.0
    samples = round(soundtrack * info.audio_rate) * (info.audio_channels or 2) if info.audio_rate else 0
    return ReferenceClip(frames, encoded, height, width, min(soundtrack, params.frames / FPS),
                         info.frames * info.width * info.height * 3, samples * 4)


def _conditions(model: ModelSpec, workflow: str, params: GenerateParams, images: Mapping[str, tuple[int, int]],
                height: int, width: int, clip: ReferenceClip | None) -> list[tuple[int, int, int]]:
    """(frames, height, width) of each input the VAE encodes and the DiT attends to: fl2va's keyframes on the
    canvas, ref2va's reference image at the checkpoint's reference short edge (diffusers' rule; a square when
    its file cannot be read) and its clip's encoded frames on the clip's canvas (a square image when neither
    can be read)."""
    if workflow == "fl2va":
        return [(1, height, width)] * max(sum(1 for n in ("image", "last_image") if n in images), 1)
    if workflow != "ref2va":
        return []
    conditions = []
    if params.ref_image is not None or clip is None:
        short, multiple = int(model.index.get("reference_image_short_edge", 2048)), model.canvas_multiple
        w, h = images.get("ref_image", (short, short))
        scale = short / min(w, h)
        conditions.append((1, max(multiple, round(h * scale / multiple) * multiple),
                           max(multiple, round(w * scale / multiple) * multiple)))
    if clip is not None:
        conditions.append((clip.encoded_frames, clip.height, clip.width))
    return conditions


def _vision_tokens(root: Path, images: list[tuple[int, int, int]]) -> int:
    """Rows the text encoder adds for the images it is shown: per image a `<Picture i>: ` label, the vision
    block's start and end, and one row per merged patch of the image as Qwen3-VL's image processor resizes it
    (`smart_resize` within the processor's pixel bounds: ref2va's reference image, put on a 2048 short edge for
    the VAE, reaches the text encoder at about a megapixel)."""
    from .text_aux import image_processor, read_processor_config, resized_image

    processor = image_processor(read_processor_config(root / "processor").get("image_processor"))
    side = processor.patch_size * processor.merge_size
    labels = count_tokens(root, [f"<Picture {i + 1}>: " for i in range(len(images))])
    rows = 0
    for label, (_, h, w) in zip(labels, images):
        height, width = resized_image(processor, h, w)
        rows += label + 2 + (height // side) * (width // side)
    return rows


CLIP_SAMPLE_STRIDE = 12
"""diffusers' ref2va text step shows the conditioner every 12th frame of the 24 fps clip (2 fps)."""


def clip_text_rows(root: Path, clip: ReferenceClip) -> int:
    """Rows the text encoder adds for a reference clip, as diffusers' ref2va text step lays them out: `<Audio 1>: `
    for a soundtrack, `<Video 1>: `, then per merged pair of frames sampled at 2 fps a timestamp label, the vision
    block's start and end and the block's merged patches at the size Qwen3-VL's video processor resizes to."""
    from .qwen_video import resized_frame, video_processor
    from .text_aux import read_processor_config

    processor = video_processor(read_processor_config(root / "processor").get("video_processor"))
    sampled = len(range(0, clip.frames, CLIP_SAMPLE_STRIDE))
    patch = processor.temporal_patch_size
    times = [i * CLIP_SAMPLE_STRIDE / FPS for i in range(sampled)]
    times += [times[-1]] * (-len(times) % patch)
    stamps = [(times[i] + times[i + patch - 1]) / 2 for i in range(0, len(times), patch)]
    h, w = resized_frame(processor, sampled, clip.height, clip.width)
    side = processor.patch_size * processor.merge_size
    labels = count_tokens(root, ["<Video 1>: ", "<Audio 1>: ", *(f"<{t:.1f} seconds>" for t in stamps)])
    return (labels[0] + (labels[1] if clip.audio_seconds else 0)
            + sum(label + 2 + (h // side) * (w // side) for label in labels[2:]))


def _drivers(model: ModelSpec, params: GenerateParams, height: int, width: int, text_tokens: int,
             dtype_bytes: int, conditions: list[tuple[int, int, int]] = (), vision_tokens: int = 0,
             clip: ReferenceClip | None = None) -> tuple[int, dict[str, float], dict[str, int]]:
    """The packed sequence's rows, each stage's driver, and each stage's output bytes. `conditions`: the
    (frames, height, width) of each input the VAE encodes (an image one latent frame, a clip its own), packed in
    front of the video; `clip` adds its vision rows to the text and its soundtrack's rows to the audio."""
    dit = model.configs["transformer"]
    text_hidden = int(model.configs["text_encoder"]["text_config"]["hidden_size"])
    sc = model.spatial_compression
    video_latents = _video_latents(params.frames, model) * (height // sc) * (width // sc)
    condition_latents = sum((1 if f == 1 else _video_latents(f, model)) * (h // sc) * (w // sc)
                            for f, h, w in conditions)
    latent_channels = int(model.configs["vae"].get("latent_channels", 24))
    patch = math.prod(int(p) for p in dit["patch_size"])
    seconds = params.frames / FPS + (clip.audio_seconds if clip else 0.0)
    audio_rows = round(seconds * AUDIO_LATENTS_PER_SECOND) * AUDIO_CHANNELS
    text_rows = text_tokens + vision_tokens + (clip_text_rows(Path(model.root), clip) if clip else 0)
    tokens = text_rows + audio_rows + (video_latents + condition_latents) // patch
    hidden, ffn = int(dit["hidden_size"]), int(dit["ffn_dim"])
    pixels = params.frames * height * width
    samples = round(params.frames / FPS * model.sampling_rate) * AUDIO_CHANNELS
    states = min(model.text_encoder_layers, TEXT_ENCODER_LAYER + 1) + 1
    drivers = {
        # Qwen3-VL over the prompt (and the images' rows) keeping every hidden state: bytes of those states.
        "text_encoder": text_rows * text_hidden * dtype_bytes * states,
        # The VAE's encoder over the conditioning images, and over the reference clip's frames: their pixels.
        "vae_encoder": sum(h * w for f, h, w in conditions if f == 1),
        CLIP_ENCODE: sum(f * h * w for f, h, w in conditions if f > 1),
        # One joint block over the packed sequence: its rows times the block's widths, in bytes.
        "denoise.denoise": tokens * (hidden + ffn) * dtype_bytes,
        # The ViT decoder's output: pixels of the clip.
        "decode.video": pixels,
        # The BigVGAN decoder's output: samples of both channels.
        "decode.audio": samples,
    }
    outputs = {
        "text_encoder": text_rows * text_hidden * dtype_bytes,
        "vae_encoder": condition_latents * latent_channels * 4,
        "denoise.denoise": (video_latents * latent_channels + audio_rows * 32) * 4,
        "decode.video": pixels * 3 * 4,  # float32 RGB frames (output_type="np")
        "decode.audio": samples * 4,
    }
    return tokens, drivers, outputs


def _video_latents(frames: int, model: ModelSpec) -> int:
    """Latent frames the video VAE makes of `frames` (5n + 2 for 17n + 5)."""
    return (frames - model.latents_per_chunk) // model.frames_per_chunk * model.latents_per_chunk + 2


def weight_bytes(root: str | Path, dtype_bytes: int = 2, *, workflow: str = "t2va", quantize: str | None = None,
                 vae_dtype: str = "bf16", audio: bool = True, transformer: str | None = None) -> dict[str, int]:
    """Each weight component `workflow` reads, its bytes as the run holds them, from the headers: the text
    encoder without what the workflow never reads, the DiT quantized (`models.quantize.quantized_bytes`,
    from its config) when `quantize` is set, the video VAE at fp32 when `vae_dtype` says so; `transformer`,
    a single-file DiT, is counted from its own header."""
    from .quantize import DIT_COMPONENTS, quantized_bytes

    root = Path(root)
    sizes = {}
    for name in workflow_components(workflow, audio):
        if name in DIT_COMPONENTS and quantize is not None:
            sizes[name] = quantized_bytes(root, name, quantize, dtype_bytes)
        else:
            element = 4 if name == "vae" and vae_dtype == "fp32" else dtype_bytes
            sizes[name] = component_bytes(weights_of(root, name, transformer), _keep_fp32(root, name), element,
                                          workflow)
    return sizes


def weights_of(root: Path, name: str, transformer: str | None) -> Path:
    """Where component `name`'s weights are: its folder, or for the DiT the single file given instead."""
    return Path(transformer) if name == "transformer" and transformer is not None else root / name


def _keep_fp32(root: Path, name: str) -> tuple[str, ...]:
    """The component class's float32 modules (diffusers' dtype rule), from the index's class name."""
    import importlib

    from .classes import keep_fp32_modules

    library, class_name = json.loads((root / "modular_model_index.json").read_text())[name][:2]
    return keep_fp32_modules(getattr(importlib.import_module(library), class_name))


def unread_by(name: str, workflow: str) -> bool:
    """Text-encoder tensors `workflow` never reads: the LM head and the decoder layers after layer 50 (layers
    0..50 stay, so `hidden_states[50]` remains the pre-norm state), and for t2va the vision tower (the
    loader's rule, `models.components.text_encoder_pruning`)."""
    if name.startswith("lm_head.") or (workflow == "t2va" and name.startswith("model.visual.")):
        return True
    prefix = "model.language_model.layers."
    return name.startswith(prefix) and int(name[len(prefix):].split(".", 1)[0]) > TEXT_ENCODER_LAYER


def component_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int, workflow: str = "t2va",
                    roots: ModelRoots | None = None) -> int:
    """Bytes of a component's tensors at the run's dtype (`tensor_bytes`)."""
    return sum(tensor_bytes(folder, keep_fp32, dtype_bytes, workflow, roots))


def pinned_component_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int,
                           roots: ModelRoots | None = None) -> int:
    """Host bytes of a component the loader places page-locked (`pin_host`): its tensors packed, in load
    order, into power-of-two blocks (`loader.packed_bytes`)."""
    return packed_bytes(tensor_bytes(folder, keep_fp32, dtype_bytes, roots=roots))


def tensor_bytes(folder: Path, keep_fp32: tuple[str, ...], dtype_bytes: int, workflow: str = "t2va",
                 roots: ModelRoots | None = None) -> Iterator[int]:
    """Each tensor's bytes at the run's dtype, in the loader's order (shards by name, tensors by offset): fp32
    where diffusers keeps fp32 (a dotted part of the name in `_keep_in_fp32_modules`), else `dtype_bytes`;
    tensors `workflow` never reads are left out. `roots`: where the shards may lie (default: the folder).
    `folder` may be a single-file DiT in the reference layout, its names read as diffusers names them, or a
    GGUF one, its quantized tensors counted packed (`models.gguf.held_bytes`)."""
    from loader.gguf_header import is_gguf

    from .single_file import diffusers_name

    if is_gguf(folder):
        from .gguf import held_bytes

        yield from held_bytes(folder, keep_fp32, dtype_bytes)
        return
    single = folder.is_file()
    for path in [folder] if single else sorted(folder.glob("*.safetensors")):
        shard, problems = read_shard_header(path, roots)
        if shard is None:
            raise ValueError(f"{path}: " + "; ".join(problems))
        for t in sorted(shard.tensors, key=lambda t: t.offset):
            name = diffusers_name(t.name) if single else t.name
            if folder.name == "text_encoder" and unread_by(name, workflow):
                continue
            if not t.dtype.startswith(("F", "BF")):
                yield t.nbytes
            elif any(part in keep_fp32 for part in name.split(".")):
                yield t.numel * 4
            else:
                yield t.numel * dtype_bytes


def policy_fit(root: str | Path, params: GenerateParams, device_info: DeviceInfo, *, dtype_bytes: int = 2,
               sequential_components: bool | None = None):
    """What the fit-aware offload policy weighs (`machine.offload.ComponentFit`): each component's bytes, and
    the device working set of the largest stage with every component resident, against the device's memory.
    None where the device's memory is unknown."""
    from machine.offload import ComponentFit

    if not device_info.total_memory:
        return None
    resident = OffloadSettings(**{f: False for f in ("dit_layerwise_offload", "dit_cpu_offload",
                                                     "text_encoder_cpu_offload", "image_encoder_cpu_offload",
                                                     "vae_cpu_offload")})
    forecast = forecast_generate(root, params, device_info=device_info, settings=resident, dtype_bytes=dtype_bytes,
                                 sequential_components=sequential_components, resolved=True)
    working = max((s.activation_bytes + s.overhead_bytes for s in forecast.stages), default=0)
    return ComponentFit(dict(forecast.component_bytes), working + forecast.process_device_bytes,
                        device_info.total_memory, forecast.sequential_components)


def resolve_for_generate(root: str | Path, params: GenerateParams, settings: OffloadSettings,
                         device_info: DeviceInfo, *, user_set: tuple[str, ...] | frozenset[str] = (),
                         dtype_bytes: int = 2, sequential_components: bool | None = None):
    """The offload policy's answer for a generate: fit-aware on a discrete GPU (`policy_fit`), the plain rules
    elsewhere. Returns (settings, decisions)."""
    fit = None
    if device_info.kind == "cuda" and not device_info.unified_memory:
        fit = policy_fit(root, params, device_info, dtype_bytes=dtype_bytes,
                         sequential_components=sequential_components)
    return resolve_offload(settings, device_info, fit=fit, user_set=user_set)
