"""A generate run's forecast, stage by stage: weights resident under the policy, the stage's working set from
its driver and the fitted terms, what earlier stages left behind, and on CUDA the costs outside tensors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from machine.device import DeviceInfo
from machine.offload import OffloadSettings, resolve_offload

from ..speed.levers import LEVER_FIELDS
from ..request.params import GenerateParams, ModelSpec
from ..run.residency import MODEL_OFFLOAD, ON_DEVICE, plan_placements
from ..run.workflows import check_workflow, stage_plan, workflow_components
from . import fitted
from .drivers import count_prompt_tokens, encoded_inputs, image_sizes, reference_clip, stage_drivers, vision_tokens
from .lever_memory import lever_memory_unknown, step_cache_bytes
from .weights import host_bytes, weight_bytes


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
    CPU also the heap earlier stages freed but the allocator kept (fitted.CPU.retained)."""
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
    """What the process adds beyond its start-up (`models.forecast.process_size`, learned from this machine's jobs): on
    CUDA cuBLAS and cuDNN and an image path's processor; a reference clip's decoded frames; else 0."""
    process_device_bytes: int
    """The CUDA context (0 elsewhere)."""
    stages: list[StageForecast] = field(default_factory=list)
    """One entry per computing stage, in run order."""
    workflow: str = "t2va"
    """The workflow whose stage plan was forecast."""
    clip_decode_bytes: int = 0
    """Host bytes above the process (which counts the decoded clip) while a reference clip decodes, in its own
    stage (`models.inputs.clips.READ_CLIP`) before any weight: what the decode holds twice for a moment."""
    lora_bytes: dict[str, int] = field(default_factory=dict)
    """Partition -> what its LoRAs hold while it loads (`models.lora.inputs.lora_load_bytes`); a merged LoRA holds
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
        from ..inputs.clips import READ_CLIP

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
    ranks_per_host: int | None = None,
) -> GenerateForecast:
    """Forecast a run of `params` on the model at `root` under `settings` for `device_info`.

    `ranks_per_host`: how many of a parallel run's ranks one host holds; all of them unless said (1: one on each
    node, as Ray spreads them).

    `workflow` defaults to the one `params` selects (`GenerateParams.resolved_workflow`); its stage plan
    (`models.run.workflows.stage_plan`) says which components each stage holds. `resolved`: the settings are
    the policy's answer already (a job's probe stage resolved them); else they are resolved here.
    `sequential_components` defaults as `run_generate` does (on for unified memory).
    """
    from ..quantization.quantize import DIT_COMPONENTS

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
    host_sizes = host_bytes(root, sizes, placements, settings, cuda, bf16_dit, dtype_bytes, params.transformer)
    images, height, width, text_tokens, clip, conditions = _layout(root, model, params, workflow)
    tokens, drivers, outputs = stage_drivers(model, params, height, width, text_tokens, dtype_bytes, conditions,
                                        vision_tokens(root, [c for c in conditions if c[0] == 1]), clip)
    pixels = drivers["decode.video"]  # the clip's pixels, as _drivers counts them
    from ..lora.inputs import lora_load_bytes

    lora_bytes, lora_work = lora_load_bytes(root, params) if params.loras else ({}, {})
    loaded: set[str] = set()
    layers = max(int(model.configs["transformer"]["num_layers"]), 1)
    # An fp32 video VAE's tensors are twice bf16's: its stages' per-unit bytes scale with the element (an
    # assumption, not fitted: fitted.CPU.terms were measured at bf16).
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
                        on_device += int(fitted.CUDA.group_offload_device_blocks * sizes[c] / layers)
                        streaming += int(fitted.CUDA.group_offload_host_blocks * sizes[c] / layers)
        terms = fitted.CUDA.stage_terms if cuda else fitted.CPU.terms
        scale = vae_scale if "vae" in reads else 1.0
        activations = _working_set(terms[stage], drivers[stage] * scale)
        merging = sum(lora_bytes.get(c, 0) for c in resident if c not in loaded)  # loaded just before this stage
        loaded.update(resident)
        if stage == "vae_encoder" and drivers[fitted.CLIP_ENCODE]:
            activations = max(activations, _working_set(terms[fitted.CLIP_ENCODE], drivers[fitted.CLIP_ENCODE] * scale))
        carried += int(fitted.CUDA.host_frame_bytes[stage] * 3 * pixels) if cuda and stage in fitted.CUDA.host_frame_bytes \
            else outputs[stage]
        heap = retained + int(fitted.CPU.retained_weights * released)
        held = carried + (heap if cpu else 0)
        if cpu:
            overhead, host, device = 0, weights + max(activations, merging) + held, 0
            retained = max(retained, int(fitted.CPU.retained * activations))
            released += sum(sizes[c] for c in planned.releases) if sequential else 0
        else:
            overhead = fitted.CUDA.workspaces if cuda else 0
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
    process_host = (fitted.CUDA.blas_init_host + (fitted.CUDA.image_path_host if images else 0) if cuda else 0)
    ranks: list[RankForecast] = []
    if params.parallel > 1:
        dit = 0 if sequential else sum(sizes[c] for c in components if c in DIT_COMPONENTS)
        ranks = rank_forecasts(stages, params.parallel, cpu, dit)
        per_host = ranks_per_host or params.parallel
        stages = joint_stages(ranks, params.parallel, per_host)
        process_host *= per_host  # each rank is a process of its own
    return GenerateForecast(
        height, width, params.frames, model.steps(params), text_tokens, tokens, sequential, sizes,
        {c: p.mechanism for c, p in placements.items()}, process_host + (clip.decoded_bytes if clip else 0),
        fitted.CUDA.context if cuda else 0, stages, workflow, clip.decode_bytes if clip else 0, lora_bytes, lora_work,
        levers,
        {"step_cache": cache} if cache else {}, lever_memory_unknown(params), ranks)


def _layout(root: Path, model: ModelSpec, params: GenerateParams, workflow: str):
    """(input image sizes, height, width, prompt tokens, reference clip, conditions): what the packed sequence is
    made of."""
    images = image_sizes(params)
    height, width = model.geometry(params, images.get("image") or images.get("last_image"))
    clip = reference_clip(root, model, params) if workflow == "ref2va" else None
    conditions = encoded_inputs(model, workflow, params, images, height, width, clip)
    return images, height, width, count_prompt_tokens(root, params.prompt), clip, conditions


def packed_rows(root: str | Path, params: GenerateParams) -> int:
    """Rows of the packed sequence the DiT attends over (text and vision tokens, audio rows, video patches), from
    headers and the tokenizer: what a parallel run must split evenly over its ranks."""
    root = Path(root)
    model = ModelSpec.read(root)
    _, height, width, text_tokens, clip, conditions = _layout(root, model, params, params.resolved_workflow)
    tokens, _, _ = stage_drivers(model, params, height, width, text_tokens, 2, conditions,
                                  vision_tokens(root, [c for c in conditions if c[0] == 1]), clip)
    return tokens


def rank_forecasts(stages: list[StageForecast], ranks: int, cpu: bool, idle_dit: int) -> list[RankForecast]:
    """A parallel run's stages per rank, from the one-process forecast of the same run: every rank holds the whole
    DiT and 1/N of the sequence's working set in its DiT stages (diffusers' context parallelism splits the rows);
    rank 0 also runs every other stage as one process would; the other ranks hold, outside the DiT's stages,
    only what the stages left behind (the text embeddings rank 0 broadcasts, the latents), and `idle_dit`, the DiT
    when it stays loaded through the run (not sequential)."""
    from ..quantization.quantize import DIT_COMPONENTS

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


def joint_stages(ranks: list[RankForecast], count: int, per_host: int | None = None) -> list[StageForecast]:
    """What the walls check per stage: the fullest host, which holds `per_host` ranks (every one by default: rank 0
    and N - 1 others; rank 0's host then holds it and per_host - 1 others, another host per_host others), each GPU
    one rank (the larger of the two)."""
    from dataclasses import replace

    per_host = per_host or count
    first, other = ranks
    return [replace(a, host_bytes=max(a.host_bytes + (per_host - 1) * b.host_bytes,
                                      per_host * b.host_bytes if per_host < count else 0),
                    device_bytes=max(a.device_bytes, b.device_bytes))
            for a, b in zip(first.stages, other.stages)]


def _working_set(term: fitted.StageTerm, driver: float) -> int:
    """`term`'s bytes at `driver` units."""
    return int(term.fixed + term.per_unit * driver)


def _host_copies_freed(placements, resident: list[str], sizes: Mapping[str, int], reads: tuple[str, ...]) -> int:
    """Weights placed on the device hold no host copy; offloaded ones stay on the host (model offload moves
    the module in, so its host copy is gone while it runs; group offload keeps the host copy)."""
    freed = sum(sizes[c] for c in resident if placements[c].mechanism == ON_DEVICE)
    return freed + sum(sizes[c] for c in reads if placements[c].mechanism == MODEL_OFFLOAD)


def _torch_device(info: DeviceInfo):
    import torch

    return torch.device("cpu" if info.kind == "cpu" else info.kind)
