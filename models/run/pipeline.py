"""Generate with MiniMax H3: diffusers' modular pipeline, fed by Drainboard's loader, policy and telemetry.

The computation is diffusers' `MiniMaxH3ModularPipeline` running one of H3's
workflows (`t2va`, `fl2va`, `ref2va`) on the blocks diffusers builds for it
(`MiniMaxH3Blocks().get_workflow(...)`, handed over as `blocks=`); nothing of
the model is re-implemented here. What this module adds:

- every weight component is built empty and filled by Drainboard's loader
  (`models.checkpoint.components.load_component`), with per-tensor samples and a load
  report each; tokenizer, processor and schedulers come from `load_aux`;
- the offload settings, resolved once (`machine.offload.resolve_offload`), are
  mapped onto diffusers' mechanisms (`models.run.residency`);
- stage-by-stage residency (`sequential_components`), as `models.run.workflows`
  plans it: each component is loaded just before a block that uses it and
  released after it, so the peak is the largest stage, not the sum of all
  weights;
- a stage per pipeline block (`text_encoder`, `denoise.*`, `decode.video`,
  `decode.audio`), an event per denoising step (a loop block of our own,
  appended to the denoising loop), timer samples throughout, and the MP4
  written with PyAV;
- the VAE knobs (tiling, decode precision) and the input images, opened from
  the job's own copies.

Blocks are timed by blocks of our own put around each of diffusers' in the
workflow's `sub_blocks` (`models.run.stage_blocks`) before the pipeline is built
from them; the run's stages and residency are `models.run.state`, what it
reports `models.run.results`. Components not loaded yet, or released, are held as
empty (meta-device) shells built from their config, so the blocks that read
model facts (patch size, VAE compression, latent channels) see the
checkpoint's own values without any weight resident; the blocks run on the
job's device (`_execution_device`, the one private name overridden) whatever
the residency.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn as nn

from machine.device import DeviceInfo, probe_device
from machine.host_heap import give_back_free_heap
from machine.memory import MemoryProbe
from machine.offload import OffloadDecision, OffloadSettings, resolve_offload

from ..checkpoint.classes import component_config
from ..checkpoint.components import AUX_COMPONENTS, load_aux
from ..parallel.rank import RankGroup, rank_reads, split_workflow
from ..video.encode import silence_non_finite, write_mp4
from ..video.settings import video_settings
from ..inputs.images import open_image
from ..speed.levers import LEVER_FIELDS, is_lossless, lever_key, lever_problems
from ..request.params import GenerateParams, GenerateParamsError, ModelSpec, validate_params
from .residency import plan_placements
from .results import EventSink, GenerateResult, PipelineEvent, SampleSink
from ..speed.speedups import CACHE_REUSE_COUNTS
from .state import ENCODE, PREPARE, RunState
from .workflows import block_reads, plan_from_reads, workflow_blocks

__all__ = ["GenerateResult", "PipelineEvent", "VAE_TILING_WARNING", "run_generate"]
"""`PipelineEvent` is what `on_event` receives; it lives in `models.run.results` and is named here for callers."""


def _pipeline_class():
    from diffusers import MiniMaxH3ModularPipeline

    class DrainboardH3Pipeline(MiniMaxH3ModularPipeline):
        """diffusers' H3 pipeline whose blocks run on the job's device, whatever each component's residency.

        diffusers' H3 blocks take their device from `components._execution_device`, which it infers from the
        first component module (its offload hook's device, else its parameters'); here that module is often a
        meta-device shell (not loaded yet, or released), which would answer `meta`. diffusers has no public
        setter: this override is one of the exceptions docs/models.md lists.
        """

        run_device = torch.device("cpu")

        @property
        def _execution_device(self) -> torch.device:
            return self.run_device

    return DrainboardH3Pipeline


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
    video_extra: Mapping[str, Any] | None = None,
    group: RankGroup | None = None,
) -> GenerateResult:
    """Generate one clip (`params.resolved_workflow`) from the H3 model at `model_dir` into the MP4 `out_path`.

    `dtype` defaults to bfloat16 (the checkpoint's; fp32 modules stay fp32);
    `mode` is the loader's placement mode. `decided`: `offload` is the policy's answer already (a job's
    probe stage resolved it, these are its decisions), so it is not resolved again. `device_info` replaces the device
    probe (tests, or a job that probed already). `sequential_components`
    defaults to on for unified memory and off elsewhere. `probe` is the job's
    memory probe (with its cgroup file, when it runs under a limit). `roots`:
    every weight file must resolve under one of them (default: `model_dir`, and the folder of
    `params.transformer`, a single-file DiT, when one is given). Raises
    GenerateParamsError for parameters the model cannot take, before any
    weight is read. The MP4 carries the parameters (models.video.settings), with `video_extra` beside them.
    `group`: this process is one rank of a parallel run (`models.parallel.launch`): only rank 0 loads the text encoder
    and VAEs and writes the MP4; the others return after the denoising loop.
    """
    root = Path(model_dir)
    info = device_info or probe_device(device)
    torch_device = torch.device(device)
    dtype = dtype or torch.bfloat16
    settings, decisions = (offload, list(decided)) if decided is not None else resolve_offload(offload, info)
    sequential = info.unified_memory if sequential_components is None else sequential_components
    model = ModelSpec.read(root)
    validate_params(params, model)
    _refuse_levers(params, torch_device)
    loras = _check_loras(params, root, roots)
    images = {name: open_image(path) for name, path in params.input_files().items() if name != "ref_video"}
    first = images.get("image") or images.get("last_image")
    height, width = model.geometry(params, None if first is None else first.size)
    workflow, steps = params.resolved_workflow, model.steps(params)
    result = GenerateResult(str(out_path), params.frames, params.fps, params.duration, width, height, params.audio,
                            sequential_components=sequential, offload=settings.to_dict(),
                            decisions=[d.to_dict() for d in decisions], workflow=workflow,
                            num_inference_steps=steps, shift=model.shift_for(params), vae_tiling=params.vae_tiling, vae_dtype=params.vae_dtype,
                            quantize=params.quantize, loras=[lora.to_dict() for lora in loras])
    _describe_inputs(result, params, images, model)
    _describe_levers(result, params)
    own_probe = probe is None
    probe = probe or MemoryProbe(str(torch_device) if torch_device.type == "cuda" else None)
    run = None
    try:
        run = _prepare(root, params, torch_device, dtype, mode, settings, decisions, sequential, on_event,
                       on_sample, sample_interval, result, probe, inputs=images, group=group)
        run.roots = None if roots is None else [Path(r) for r in roots]
        run.device_info = info
        run.loras = tuple(loras)
        if not sequential:
            for name in run.components:
                if group is None or group.loads(name):
                    run.load(name)
        generator = torch.Generator("cpu").manual_seed(params.seed)
        state = run.pipe(prompt=params.prompt, num_frames=params.frames, height=height, width=width,
                         num_inference_steps=steps, generator=generator, output_type="np", **_workflow_inputs(images))
        for name in list(run.resident):
            run.done_with(name)
        if group is not None and group.rank > 0:
            return result  # rank 0 decodes and writes the MP4
        video = np.asarray(state.get("videos"))[0]
        result.video_sha256 = hashlib.sha256(np.ascontiguousarray(video, dtype=np.float32).tobytes()).hexdigest()
        frames = (video * 255.0).round().clip(0, 255).astype(np.uint8)
        result.frames_sha256 = hashlib.sha256(frames.tobytes()).hexdigest()
        wave = None
        if params.audio:
            wave, non_finite = silence_non_finite(state.get("audio")[0].float().cpu().numpy())
            result.sample_rate = int(state.get("sampling_rate"))
            if non_finite:
                note = (f"audio: {non_finite} of {wave.size} samples were NaN or infinite (the audio decode "
                        "diverged) and are written as silence")
                result.notes.append(note)
                run.emit("note", note)
        with run.stage_of(ENCODE):
            settings = video_settings(params, model_dir, video_extra)
            write_mp4(out_path, frames, params.fps, wave, result.sample_rate or model.sampling_rate,
                      comment=json.dumps(settings))
    finally:
        if run is not None:
            run.abandon()  # a block that raised left its stage open
        if own_probe:
            probe.close()
    return result


def _prepare(root: Path, params: GenerateParams, device: torch.device, dtype: torch.dtype, mode: str,
             settings: OffloadSettings, decisions: list[OffloadDecision], sequential: bool, on_event, on_sample,
             interval: float, result: GenerateResult, probe: MemoryProbe,
             inputs: dict[str, Any] | None = None, group: RankGroup | None = None) -> RunState:
    """Build the workflow's blocks (each a stage, the loop reporting its steps), the pipeline over them,
    its aux components and shells. A reference clip is decoded into `inputs` (the run's input media by field)
    first, in a stage of its own (`_read_clip`), so `prepare` starts with it held as every later stage does.
    A rank of a parallel run plans only the weights it loads (`models.parallel.rank`); every component keeps
    its shell, whose facts the blocks read."""
    from .stage_blocks import staged_workflow

    blocks = workflow_blocks(result.workflow, params.audio)
    reads = block_reads(blocks)
    components = tuple(dict.fromkeys(c for stage in plan_from_reads(reads, sequential) for c in stage.reads))
    plan = plan_from_reads(rank_reads(reads, group), sequential)
    placements = plan_placements(settings, device, components)
    result.placements = {name: p.to_dict() for name, p in placements.items()}
    pipe = _pipeline_class()(blocks=blocks, pretrained_model_name_or_path=str(root))
    pipe.run_device = device
    run = RunState(root, pipe, device, dtype, mode, settings, placements, sequential, on_event, on_sample, interval,
                   result, probe)
    run.vae_tiling, run.vae_compile, run.quantize = params.vae_tiling, params.vae_compile, params.quantize
    if params.transformer is not None:
        run.single_files["transformer"] = (params.transformer, params.qkv_layout)
    run.levers = {"attention": params.attention, "step_cache": params.step_cache, "compile": params.compile}
    run.dtypes = {"vae": torch.float32} if params.vae_dtype == "fp32" else {}
    run.group = group
    staged_workflow(blocks, plan, run)
    if group is not None:
        split_workflow(blocks, reads, group)
    if params.ref_video is not None and inputs is not None:
        inputs["ref_video"] = _read_clip(run, params, ModelSpec.read(root))
    with run.stage_of(PREPARE):
        for decision in decisions:
            run.emit("offload_decision", str(decision), **decision.to_dict())
        for name, placement in placements.items():
            run.emit("placement", f"{name}: {placement.mechanism}" + (f" ({placement.flag})" if placement.flag else ""),
                     **placement.to_dict())
        for note in result.notes:
            run.emit("note", note)
        pipe.update_components(**{name: load_aux(root, name, shift=params.shift if name == "scheduler" else None)
                                  for name in AUX_COMPONENTS})
        run.shells = {name: _shell(root, name) for name in components if name != "text_encoder"}
        pipe.update_components(**run.shells)
        pipe.set_progress_bar_config(disable=True)
    return run


def _check_loras(params: GenerateParams, root: Path, roots) -> list:
    """Each LoRA checked against the model (header only; hashed unless the job recorded its hash, which the
    merge checks as it reads), with its partition set: refused before any weight is read."""
    from ..lora.inputs import inspect_lora

    folders = list(roots) if roots is not None else [root]
    return [inspect_lora(lora, root, params.resolved_workflow, folders, hash_file=lora.sha256 is None).lora
            for lora in params.loras]


def _read_clip(run: RunState, params: GenerateParams, model: ModelSpec):
    """The reference clip as diffusers' own `MiniMaxH3VideoReference.from_file` decodes it, in a stage of its own
    (`READ_CLIP`): its frames and whole soundtrack are the largest input a run holds, so their memory is sampled
    and a kill while they decode names the decode. Recorded as `_describe_inputs` records an image (`prepare`
    says the notes)."""
    from ..inputs.clips import READ_CLIP, open_clip

    with run.stage_of(READ_CLIP):
        clip = open_clip(params.ref_video)
        # diffusers stacks the frames from a list of them: frames under the mmap threshold were heap chunks,
        # which stayed resident beside the stacked copy for the whole run unless given back here.
        give_back_free_heap()
    described = {**_describe_clip(clip, params, model), "file": Path(params.ref_video).name}
    run.result.inputs["ref_video"] = described
    if described["note"]:
        run.result.notes.append(described["note"])
    return clip


def _workflow_inputs(images: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's keyword inputs: fl2va's `image` / `last_image`; ref2va's `references`, the image then the clip."""
    inputs = {name: images[name] for name in ("image", "last_image") if name in images}
    references = []
    if "ref_image" in images:
        from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

        references.append(MiniMaxH3ImageReference(image=images["ref_image"]))
    if "ref_video" in images:
        references.append(images["ref_video"])
    if references:
        inputs["references"] = references
    return inputs


def _describe_inputs(result: GenerateResult, params: GenerateParams, images: dict[str, Any], model: ModelSpec) -> None:
    """Record each image and what diffusers does to it on this canvas; say when tiling is off (the reference clip,
    decoded later, is recorded by `_read_clip`)."""
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


def _refuse_levers(params: GenerateParams, device: torch.device) -> None:
    """GenerateParamsError for a lever `device` cannot run, as `jobs submit` refuses it, before any weight is read."""
    from ..quantization.check import cuda_capability

    problems = lever_problems(params.to_dict(), str(device), cuda_capability(device.type, device.index))
    if problems:
        raise GenerateParamsError(problems)


def _describe_levers(result: GenerateResult, params: GenerateParams) -> None:
    """Record the run's lever set, whether it is lossless, and what a cached run cannot count."""
    values = params.to_dict()
    result.levers = {name: values[name] for name in LEVER_FIELDS} | {"key": lever_key(values),
                                                                      "lossless": is_lossless(values)}
    if params.step_cache is not None:
        result.notes.append(CACHE_REUSE_COUNTS)


def _describe_clip(clip, params: GenerateParams, model: ModelSpec) -> dict[str, Any]:
    """{size, frames, fps, audio, note}: the clip as decoded and what diffusers' ref2va setup does to it (resampled
    onto 24 fps, cut to the generated frames, put on the canvas of its own aspect)."""
    from ..inputs.clips import frames_at_24
    from ..request.video_length import FPS

    frames, height, width = clip.frames.shape[:3]
    done = []
    if clip.fps != FPS:
        done.append(f"resampled from {clip.fps:g} to {FPS} fps")
    if frames_at_24(frames, clip.fps) > params.frames:
        done.append(f"cut to the first {params.frames} frames")
    canvas_h, canvas_w = model.canvas_for(width, height)
    if (canvas_w, canvas_h) != (width, height):
        done.append(f"resized (LANCZOS) to {canvas_w}x{canvas_h}")
    note = f"ref_video {width}x{height}, {frames} frames at {clip.fps:g} fps: " + ", ".join(done) if done else ""
    return {"size": [width, height], "frames": frames, "fps": clip.fps, "audio": clip.audio is not None, "note": note}


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
        return cls.from_config(component_config(root, name))


def _index_class(root: Path, name: str) -> str:
    import json

    return json.loads((root / "modular_model_index.json").read_text())[name][1]


