"""Generate parameters and their validation against a MiniMax H3 model folder.

The rules are H3's, read where H3 reads them: 24 fps; 5 to 15 seconds, in
frame counts the video VAE can decode (`clip_length * n + tokens_chunk_size`,
17n + 5 for H3: 124..345); width and height multiples of the VAE's spatial
compression times the DiT's patch (32 for H3); `num_inference_steps >= 2`
(N steps make N - 1 DiT calls); no classifier-free guidance and no negative
prompt (the checkpoint is guidance-distilled). Height and width left unset
take the checkpoint's own 16:9 canvas (`canvas_short_edge` and
`canvas_max_pixels` in `modular_model_index.json`), which is how a small
synthetic checkpoint gets a small default canvas without any rule of its own.
Bounds of Drainboard's own: a canvas edge of at most `MAX_CANVAS_EDGE` px, a
prompt of at most `MAX_PROMPT_TOKENS` tokens (`prompt_tokens`).

Validation reads only JSON configs, so a job can be refused in the parent
process before any weight is read.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from loader.confined import read_json_checked
from loader.gguf_header import is_gguf
from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import DrainboardError

from ..speed.levers import ATTENTION_BACKENDS, step_cache_problem
from ..lora.inputs import MAX_LORAS, PARTITIONS, LoraFacts, LoraInput, lora_from_value
from .cli_args import QKV_LAYOUTS, QUANTIZATIONS, VAE_DTYPES
from .video_length import FPS, MAX_SECONDS, MIN_SECONDS

TEXT_ENCODER_LAYER = 50
"""The Qwen3-VL hidden state H3 conditions on; the encoder needs more layers than this."""
INDEX_FILE = "modular_model_index.json"
"""The pipeline's index at a model root."""
PIPELINE_CLASS = "MiniMaxH3ModularPipeline"
"""The `_class_name` a generate root must declare."""
MAX_CANVAS_EDGE = 4096
"""The widest and tallest canvas accepted, in pixels (H3's default is 1344 x 768; a 4K frame is 3840 wide):
beyond it a job would only fail allocating; the memory forecast refuses what the machine cannot hold."""
MAX_PROMPT_TOKENS = 2048
"""The longest prompt, in tokens of the checkpoint's tokenizer: the text encoder runs on the whole prompt (no
truncation in H3's pipeline), so a 100,000-character prompt held the queue in `text_encoder` for minutes."""
MAX_PROMPT_BYTES = 16 * MAX_PROMPT_TOKENS
"""A prompt longer than this (UTF-8 bytes) is refused without tokenizing it (tokenizing costs time too)."""
WEIGHT_COMPONENTS = ("text_encoder", "transformer", "vae", "audio_vae")
"""Components with weights that `t2va` runs, in the order the pipeline first uses them (every workflow's:
`models.run.workflows.workflow_components`)."""
INPUT_FILE_FIELDS = ("image", "last_image", "ref_image", "ref_video")
"""GenerateParams fields that name an input file: three images, one clip (`ref_video`)."""
DEFAULT_STEPS = 50
"""H3's `num_inference_steps` where the scheduler config names none (a distilled checkpoint's does)."""



MAX_PARALLEL = 8
"""The most local ranks `parallel` takes: the GPUs of one host."""


class GenerateParamsError(DrainboardError):
    """One or more generate parameters cannot be used with this model."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        """Field name -> what is wrong with it."""
        super().__init__("; ".join(self.messages()))

    def messages(self) -> list[str]:
        return [f"{k}: {v}" for k, v in sorted(self.problems.items())]


@dataclass(frozen=True)
class GenerateParams:
    """What to generate: `t2va` (text to video with audio), `fl2va` (from a first and/or last frame) or `ref2va`
    (from a reference image and/or clip)."""

    prompt: str
    """Text describing the clip."""
    negative_prompt: str = ""
    """Must stay empty: H3 is guidance-distilled and has no negative prompt."""
    frames: int = 124
    """Video frames at 24 fps, of the form 17n + 5 within 5-15 s (124..345)."""
    height: int | None = None
    """Pixels, a multiple of 32 for H3; None takes the checkpoint's default 16:9 canvas."""
    width: int | None = None
    """Pixels, a multiple of 32 for H3; None takes the checkpoint's default 16:9 canvas."""
    steps: int | None = None
    """`num_inference_steps`; None takes the checkpoint's (`ModelSpec.default_steps`); N steps make N - 1 DiT
    calls, so at least 2."""
    shift: float | None = None
    """The video scheduler's sigma shift (`sigma' = s*sigma / (1 + (s-1)*sigma)`); None takes the scheduler config's
    (H3's 12). A few-step LoRA is distilled for a shift of its own, which its card gives."""
    guidance_scale: float = 1.0
    """Must stay 1.0: guidance is baked into H3's weights, every step is one forward pass."""
    seed: int = 0
    """Seed of the request's CPU generator; the same seed gives the same frames on every placement mode."""
    fps: int = FPS
    """Must be 24, H3's own rate."""
    audio: bool = True
    """Decode the stereo soundtrack and put it in the MP4 (off skips the `decode.audio` block)."""
    workflow: str | None = None
    """`t2va`, `fl2va` or `ref2va`; None picks it from the images given, as diffusers' blocks do."""
    image: str | None = None
    """fl2va: the image file the clip starts from (a job holds its own copy)."""
    last_image: str | None = None
    """fl2va: the image file the clip ends on."""
    ref_image: str | None = None
    """ref2va: the reference image file (subject, style or scene)."""
    ref_video: str | None = None
    """ref2va: the reference clip (MP4/MOV: motion and camera, with its soundtrack); with `ref_image`, after it."""
    vae_tiling: bool = True
    """Decode the video on the VAE's 256 px tiles (H3's release setting); off is noisier and, at high
    resolution, can exhaust a unified-memory box."""
    vae_dtype: str = "bf16"
    """Video VAE precision, one of VAE_DTYPES."""
    quantize: str | None = None
    """Quantization of the DiT, one of QUANTIZATIONS (frames then differ from bf16's); None keeps bf16."""
    transformer: str | None = None
    """A single-file DiT in the reference layout (Comfy-Org's H3 files, `models.checkpoint.single_file`) that supplies the
    transformer's weights; the model folder supplies the rest, its `transformer/config.json` the DiT's class.
    A `.gguf` file is loaded quantized by diffusers' GGUF path (`models.checkpoint.gguf`)."""
    qkv_layout: str = "stacked"
    """How `transformer`'s fused qkv orders its rows: `stacked` (every published file) or `interleaved`."""
    attention: str = "native"
    """The DiT's attention backend, one of `models.speed.levers.ATTENTION_BACKENDS` (a speed lever)."""
    compile: bool = False
    """Regional compile of the DiT's repeated blocks (a speed lever; the calls that compile are their own stage)."""
    step_cache: str | None = None
    """A diffusers step cache on the DiT, one of `models.speed.levers.STEP_CACHES` (a lossy speed lever); None: every
    step computed."""
    vae_compile: bool = False
    """Compile of the video VAE decoder's repeated blocks (a lossless speed lever; its first decoder call is its own
    stage, `decode.compile`)."""
    loras: tuple[LoraInput, ...] = ()
    """LoRAs merged into the workflow's DiT as it loads, stacked in this order (`models.lora.inputs`)."""
    parallel: int = 1
    """Local ranks one generate runs on (one GPU each): the DiT replicated, its sequence split by diffusers' context
    parallelism (Ulysses); the text encoder and VAEs on rank 0 only (`models.parallel.launch`)."""

    def __post_init__(self) -> None:
        # A stored spec gives its LoRAs back as mappings, the CLI and pages as LoraInput or `FILE[:SCALE]`.
        if not isinstance(self.loras, tuple) or not all(isinstance(x, LoraInput) for x in self.loras):
            if isinstance(self.loras, (str, bytes)) or not isinstance(self.loras, (list, tuple)):
                raise GenerateParamsError({"loras": f"must be a list of LoRAs, got {type(self.loras).__name__}"})
            try:
                object.__setattr__(self, "loras", tuple(lora_from_value(x) for x in self.loras))
            except ValueError as e:
                raise GenerateParamsError({"loras": str(e)}) from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def duration(self) -> float:
        """Seconds of video."""
        return self.frames / self.fps

    @property
    def gguf_dit(self) -> bool:
        """Whether `transformer` is a GGUF file: a DiT diffusers loads quantized (`models.checkpoint.gguf`)."""
        return self.transformer is not None and is_gguf(Path(self.transformer))

    @property
    def resolved_workflow(self) -> str:
        """The workflow named, or the one the images given select (diffusers' triggers)."""
        if self.workflow is not None:
            return self.workflow
        if self.ref_image is not None or self.ref_video is not None:
            return "ref2va"
        return "fl2va" if self.image is not None or self.last_image is not None else "t2va"

    def input_files(self) -> dict[str, str]:
        """Field -> input file (image or clip), for those given."""
        return {name: getattr(self, name) for name in INPUT_FILE_FIELDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class ModelSpec:
    """The facts of a model folder's configs that constrain generate parameters and size a run."""

    root: str
    """The model folder."""
    canvas_multiple: int
    """Height and width must be multiples of this: VAE spatial compression x DiT patch width."""
    spatial_compression: int
    """Pixels per latent along height and width."""
    frames_per_chunk: int
    """The video VAE's `clip_length` (17 for H3)."""
    latents_per_chunk: int
    """Latent frames per chunk (`ceil(clip_length / temporal compression)`, 5 for H3)."""
    canvas: tuple[int, int]
    """(height, width) of the checkpoint's default 16:9 canvas."""
    text_encoder_layers: int
    """Decoder layers of the Qwen3-VL text encoder."""
    sampling_rate: int
    """Audio samples per second (32 kHz for H3)."""
    configs: dict[str, dict[str, Any]]
    """Each weight component's `config.json`, by component name."""
    default_steps: int = DEFAULT_STEPS
    """`num_inference_steps` of the checkpoint: `scheduler/scheduler_config.json`'s, else DEFAULT_STEPS."""
    shift: float | None = None
    """The scheduler config's `shift` (None: the scheduler class default)."""
    index: dict[str, Any] = field(default_factory=dict)
    """`modular_model_index.json` (canvas and reference configs)."""
    dit_defaults: bool = False
    """The folder has no `transformer/config.json`: `configs["transformer"]` is diffusers' default config
    (`models.checkpoint.classes.default_dit_config`), which only a single-file DiT that fits it may use."""

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "ModelSpec":
        """Read the index and the components' config.json from `model_dir`; GenerateParamsError under `model`."""
        root = Path(model_dir)
        index = _read_json(root / INDEX_FILE)
        if index.get("_class_name") != PIPELINE_CLASS:
            raise GenerateParamsError({"model": f"{root / INDEX_FILE} has _class_name {echo(index.get('_class_name'), NAME_LIMIT)};"
                                                f" expected {PIPELINE_CLASS!r}"})
        dit_defaults = not os.path.lexists(root / "transformer" / "config.json")
        missing = [name for name in WEIGHT_COMPONENTS
                   if name != "transformer" and not os.path.lexists(root / name / "config.json")]
        if missing:
            raise GenerateParamsError({"model": f"{root} has no {', '.join(f'{m}/config.json' for m in missing)}: every "
                                                f"component of MiniMax H3 is built from its folder's config"})
        configs = {name: _read_json(root / name / "config.json") for name in WEIGHT_COMPONENTS
                   if not (name == "transformer" and dit_defaults)}
        if dit_defaults:  # only a single-file DiT that fits them may run so (validate_params)
            from ..checkpoint.classes import default_dit_config

            configs["transformer"] = default_dit_config()
        vae, dit = configs["vae"], configs["transformer"]
        try:
            spatial = math.prod(vae["spatial_downsample_factors"])
            temporal = math.prod(vae["temporal_downsample_factors"])
            clip_length = int(vae["clip_length"])
            patch = [int(p) for p in dit["patch_size"]]
            layers = int(configs["text_encoder"]["text_config"]["num_hidden_layers"])
            rate = int(configs["audio_vae"]["sampling_rate"])
        except (KeyError, TypeError, ValueError) as e:
            raise GenerateParamsError({"model": f"{root}: a component config lacks {e}"}) from None
        multiple = spatial * patch[2]
        return cls(
            root=str(root), canvas_multiple=multiple, spatial_compression=spatial, frames_per_chunk=clip_length,
            latents_per_chunk=math.ceil(clip_length / temporal),
            canvas=_default_canvas(multiple, index),
            text_encoder_layers=layers, sampling_rate=rate, configs=configs, index=index, dit_defaults=dit_defaults,
            **_scheduler_facts(root),
        )

    def frame_counts(self) -> list[int]:
        """Every frame count H3 takes: the VAE's form within 5-15 s at 24 fps."""
        lo, hi = math.ceil(MIN_SECONDS * FPS), math.floor(MAX_SECONDS * FPS)
        return [f for f in range(lo, hi + 1) if f % self.frames_per_chunk == self.latents_per_chunk]

    def geometry(self, params: GenerateParams, first_image: tuple[int, int] | None = None) -> tuple[int, int]:
        """(height, width) the run uses: the params', else for fl2va the canvas of the first keyframe's
        aspect (`first_image` is its (width, height)), else the checkpoint's default 16:9 canvas."""
        if params.height is not None and params.width is not None:
            return params.height, params.width
        if first_image is not None and params.resolved_workflow == "fl2va":
            return self.canvas_for(*first_image)
        return self.canvas

    def canvas_for(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) of the canvas an input of `width` x `height` resolves to (diffusers' rule, this
        checkpoint's canvas configs): an fl2va keyframe's, or a reference clip's own."""
        return _canvas(self.index, self.canvas_multiple, width, height)

    def steps(self, params: GenerateParams) -> int:
        """`num_inference_steps` the run uses: the params', else the checkpoint's."""
        return self.default_steps if params.steps is None else params.steps

    def shift_for(self, params: GenerateParams) -> float | None:
        """The video scheduler's shift the run uses: the params', else the scheduler config's (None: the class's)."""
        return self.shift if params.shift is None else params.shift


def _read_json(path: Path) -> dict[str, Any]:
    """The file parsed as the loader reads a checkpoint's JSON: bounded, regular files only (a FIFO never hangs)."""
    try:
        data = read_json_checked(path)
    except (OSError, DrainboardError) as exc:
        raise GenerateParamsError({"model": f"cannot read {path}: {exc}"}) from None
    if not isinstance(data, dict):
        raise GenerateParamsError({"model": f"{path} is not a JSON object"})
    return data


def _default_canvas(multiple: int, index: dict[str, Any]) -> tuple[int, int]:
    """The canvas diffusers' t2va layout step picks when no size is given: 16:9 from the index's
    `canvas_short_edge` / `canvas_max_pixels`, or the blocks' own defaults where the index has none."""
    return _canvas(index, multiple, 16, 9)


def _canvas(index: dict[str, Any], multiple: int, width: int, height: int) -> tuple[int, int]:
    """diffusers' `resolve_canvas_size` for an aspect of `width`:`height` under the index's canvas configs."""
    from diffusers import MiniMaxH3Blocks
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    defaults = {c.name: c.default for c in MiniMaxH3Blocks().get_workflow("t2va").expected_configs}
    try:
        short_edge, max_pixels = (int(index.get(k, defaults[k])) for k in ("canvas_short_edge", "canvas_max_pixels"))
    except (TypeError, ValueError) as e:
        raise GenerateParamsError({"model": f"{INDEX_FILE}: canvas_short_edge / canvas_max_pixels: {e}"}) from None
    return resolve_canvas_size(width, height, multiple, short_edge, max_pixels)


def _scheduler_facts(root: Path) -> dict[str, Any]:
    """`default_steps` and `shift` from `scheduler/scheduler_config.json` (a few-step checkpoint names its steps
    as `num_inference_steps`, which diffusers' scheduler ignores and Drainboard reads)."""
    path = root / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        return {}
    config = _read_json(path)
    try:
        steps = int(config.get("num_inference_steps", DEFAULT_STEPS))
        shift = None if config.get("shift") is None else float(config["shift"])
    except (TypeError, ValueError) as e:
        raise GenerateParamsError({"model": f"{path}: num_inference_steps / shift: {e}"}) from None
    return {"default_steps": steps, "shift": shift}


SCHEDULE_FIELDS = ("steps", "shift")
"""GenerateParams fields a few-step LoRA's metadata may state (`models.lora.inputs.stated_steps` / `stated_shift`)."""
GIVEN, CHECKPOINT = "given", "checkpoint"
"""Where a run's steps or shift came from, besides `LoRA <file name>`: the request, or the scheduler config."""


def stated_schedule(params: GenerateParams, loras: Sequence[LoraFacts]) -> tuple[GenerateParams, dict[str, str]]:
    """`params` with its unset steps and shift taken from the first LoRA (in stack order) whose metadata states
    them, and where each came from: `given`, `LoRA <file name>` or `checkpoint`. A value given always wins."""
    values, sources = {}, {}
    for name in SCHEDULE_FIELDS:
        if getattr(params, name) is not None:
            sources[name] = GIVEN
            continue
        stating = next((f for f in loras if getattr(f, f"stated_{name}") is not None), None)
        if stating is None:
            sources[name] = CHECKPOINT
            continue
        values[name] = getattr(stating, f"stated_{name}")
        sources[name] = f"LoRA {stating.lora.name}"
    return replace(params, **values), sources


def prompt_problem(prompt: str, root: Path) -> str | None:
    """Why `prompt` is too long for a job, or None; the bound, `MAX_PROMPT_TOKENS`, is in the message.

    H3's tokenizer is byte-level BPE: every token is at least one byte, so a prompt of at most
    `MAX_PROMPT_TOKENS` UTF-8 bytes is within the bound uncounted, and one over `MAX_PROMPT_BYTES` is
    refused uncounted too. Only in between is the checkpoint's `tokenizer/` loaded (local files only);
    where it cannot be, the byte count is the bound used (conservative: it is never below the token count).
    """
    size = len(prompt.encode("utf-8", errors="replace"))
    if size <= MAX_PROMPT_TOKENS:
        return None
    bound = f"a prompt is at most {MAX_PROMPT_TOKENS:,} tokens"
    if size > MAX_PROMPT_BYTES:
        return f"is {size:,} bytes, far over the bound ({bound}, and at most {MAX_PROMPT_BYTES:,} bytes)"
    from ..checkpoint.text_aux import load_tokenizer

    try:
        tokenizer = load_tokenizer(root / "tokenizer")
    except (OSError, ValueError):
        return f"is {size:,} bytes and the checkpoint's tokenizer cannot be read to count it; {bound}"
    tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return f"is {tokens:,} tokens; {bound}" if tokens > MAX_PROMPT_TOKENS else None


def validate_params(params: GenerateParams, model: ModelSpec) -> None:
    """Raise GenerateParamsError naming every field this model cannot take, with what it expects."""
    problems: dict[str, str] = {}
    if not params.prompt.strip():
        problems["prompt"] = "must not be empty"
    if params.negative_prompt:
        problems["negative_prompt"] = "MiniMax H3 is guidance-distilled and takes no negative prompt; leave it empty"
    if params.guidance_scale != 1.0:
        problems["guidance_scale"] = (f"{params.guidance_scale} given; MiniMax H3 is guidance-distilled (one forward"
                                      " pass per step, no CFG), so it must be 1.0")
    if params.fps != FPS:
        problems["fps"] = f"{params.fps} given; MiniMax H3 generates at {FPS} fps only"
    counts = model.frame_counts()
    if params.frames not in counts:
        problems["frames"] = (
            f"{params.frames} is not {model.frames_per_chunk}n + {model.latents_per_chunk} within"
            f" {MIN_SECONDS:g}-{MAX_SECONDS:g} s at {FPS} fps ({counts[0]}..{counts[-1]}, e.g. {counts[0]},"
            f" {counts[1]} or {counts[-1]})"
        )
    if (params.height is None) != (params.width is None):
        problems["height" if params.height is None else "width"] = "give width and height together, or neither"
    for name in ("height", "width"):
        value = getattr(params, name)
        if value is not None and (value < model.canvas_multiple or value % model.canvas_multiple):
            problems[name] = (f"{value} is not a positive multiple of {model.canvas_multiple}"
                               f" (VAE {model.spatial_compression}x spatial compression x patch 2)")
        elif value is not None and value > MAX_CANVAS_EDGE:
            problems[name] = f"{value:,} px is more than the largest canvas edge, {MAX_CANVAS_EDGE:,} px"
    too_long = prompt_problem(params.prompt, Path(model.root))
    if too_long is not None:
        problems["prompt"] = too_long
    steps = model.steps(params)
    if not 2 <= steps <= 1000:
        problems["steps"] = f"{steps} is outside 2..1000 (N steps make N - 1 DiT calls)"
    shift = shift_problem(params.shift)
    if shift is not None:
        problems["shift"] = shift
    if not 0 <= params.seed < 2**63:
        problems["seed"] = f"{params.seed} is outside 0..2**63-1"
    if model.dit_defaults:
        problem = _defaults_problem(params, model)
        if problem is not None:
            problems["transformer" if params.transformer else "model"] = problem
    elif params.transformer is None:
        from ..checkpoint.formats import dit_config_problem

        layout = dit_config_problem(model.configs["transformer"], f"{model.root}/transformer/config.json")
        if layout is not None:
            problems["model"] = layout
    if model.text_encoder_layers <= TEXT_ENCODER_LAYER:
        problems["model"] = (f"{model.root}/text_encoder has {model.text_encoder_layers} decoder layers; H3 reads"
                             f" hidden_states[{TEXT_ENCODER_LAYER}] and needs more than {TEXT_ENCODER_LAYER}")
    problems.update(_knob_problems(params))
    problems.update(_parallel_problems(params, model))
    problems.update(_lora_problems(params))
    problems.update(_workflow_problems(params, model))
    if params.transformer is not None and "transformer" not in problems:
        from ..checkpoint.gguf import gguf_problem
        from ..checkpoint.single_file import transformer_problem

        config = model.configs["transformer"]
        problem = (gguf_problem(Path(params.transformer), config) if params.gguf_dit
                   else transformer_problem(params.transformer, config))
        if problem is not None:
            problems["transformer"] = problem
    if problems:
        raise GenerateParamsError(problems)


MAX_SHIFT = 1000.0
"""The largest shift accepted: past it every sigma of the grid but the last is within float32 rounding of 1."""


def shift_problem(shift: Any) -> str | None:
    """Why `shift` cannot be the scheduler's sigma shift (a finite number in (0, MAX_SHIFT]), or None; unset is fine."""
    if shift is None:
        return None
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift):
        return f"must be a finite number, got {echo(shift)}"
    if not 0 < shift <= MAX_SHIFT:
        return f"{shift:g} is outside (0, {MAX_SHIFT:g}] (the sigma shift s in s*sigma / (1 + (s-1)*sigma))"
    return None


def _defaults_problem(params: GenerateParams, model: ModelSpec) -> str | None:
    """A folder without `transformer/config.json` runs only a single-file DiT whose every tensor fits diffusers'
    default config (`DIT_DEFAULTS`); anything else is refused naming the missing file and the fix."""
    from ..checkpoint.classes import DIT_DEFAULTS
    from ..checkpoint.single_file import config_fit_problem, header_tensors

    fix = f"put the DiT's config.json (the release's, or the one the file was made from) in {model.root}/transformer/"
    if params.transformer is None:
        return f"{model.root} has no transformer/config.json; {fix}"
    file = Path(params.transformer)
    try:
        tensors = header_tensors(file)
    except (DrainboardError, OSError):
        return None  # the file's own check names what is wrong with it
    misfit = config_fit_problem(tensors, model.configs["transformer"])
    if misfit is None:
        return None
    return (f"{echo_name(file.name)}: {model.root} has no transformer/config.json, and {DIT_DEFAULTS} does "
            f"not fit this file ({misfit}); {fix}")


def _knob_problems(params: GenerateParams) -> dict[str, str]:
    problems = {}
    if not isinstance(params.vae_tiling, bool):
        problems["vae_tiling"] = f"must be true or false, got {params.vae_tiling!r}"
    if params.vae_dtype not in VAE_DTYPES:
        problems["vae_dtype"] = f"{params.vae_dtype!r} given; expected one of {', '.join(VAE_DTYPES)}"
    if params.quantize is not None and params.quantize not in QUANTIZATIONS:
        problems["quantize"] = f"{params.quantize!r} given; expected one of {', '.join(QUANTIZATIONS)} or unset"
    if params.gguf_dit and params.quantize is not None:
        problems["quantize"] = "a GGUF DiT is quantized already (its own quant type); leave quantize unset"
    if params.gguf_dit and params.parallel != 1:
        problems["parallel"] = "is not combined with a GGUF DiT (not tried together yet)"
    if params.gguf_dit and params.loras:
        problems["loras"] = ("a GGUF DiT's weights stay packed, so no LoRA can be merged into them; use the "
                             "safetensors single file")
    if params.qkv_layout not in QKV_LAYOUTS:
        problems["qkv_layout"] = f"{params.qkv_layout!r} given; expected one of {', '.join(QKV_LAYOUTS)}"
    elif params.qkv_layout != "stacked" and params.transformer is None:
        problems["qkv_layout"] = "only applies to a single-file DiT (transformer)"
    if params.attention not in ATTENTION_BACKENDS:
        problems["attention"] = f"{params.attention!r} given; expected one of {', '.join(ATTENTION_BACKENDS)}"
    for name in ("compile", "vae_compile"):
        if not isinstance(getattr(params, name), bool):
            problems[name] = f"must be true or false, got {getattr(params, name)!r}"
    cache = step_cache_problem(params.step_cache)
    if cache is not None:
        problems["step_cache"] = cache
    return problems


def _parallel_problems(params: GenerateParams, model: ModelSpec) -> dict[str, str]:
    """`parallel`: a whole number of ranks that splits the DiT's heads evenly (Ulysses hands each rank whole heads),
    and none of the levers not tried with it."""
    n = params.parallel
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARALLEL:
        return {"parallel": f"must be a whole number of ranks in 1..{MAX_PARALLEL}, got {n!r}"}
    if n == 1:
        return {}
    heads = int(model.configs.get("transformer", {}).get("num_attention_heads", 56))
    if heads % n:
        return {"parallel": f"{n} ranks cannot split the DiT's {heads} attention heads evenly (Ulysses gives each"
                            f" rank whole heads); use a divisor of {heads}"}
    untried = [f"--{name.replace('_', '-')}" for name in ("compile", "step_cache") if getattr(params, name)]
    if untried:
        return {"parallel": f"is not combined with {' or '.join(untried)} (not tried together yet)"}
    return {}


def split_problem(rows: int, world: int, parts: str = "") -> str | None:
    """Why `rows` packed rows (made of `parts`, in words) cannot split evenly over `world` ranks; None when they can."""
    if rows % world == 0:
        return None
    return (f"the packed sequence has {rows} rows{parts}, which {world} ranks cannot split evenly (diffusers' context"
            f" parallelism shards equal parts); {world - rows % world} rows more or {rows % world} fewer would: change"
            " the prompt or the frame count")


def _lora_problems(params: GenerateParams) -> dict[str, str]:
    """The LoRA list's own rules; each file is checked against the model where its roots are known
    (`jobs.spec` at submit, `models.run.pipeline.run_generate` before any weight is read)."""
    if len(params.loras) > MAX_LORAS:
        return {"loras": f"{len(params.loras)} given; at most {MAX_LORAS} LoRAs are stacked on one job"}
    wrong = [lora.partition for lora in params.loras if lora.partition not in (None, *PARTITIONS)]
    if wrong:
        return {"loras": f"partition {wrong[0]!r}; expected one of {', '.join(PARTITIONS)}"}
    return {}


def _workflow_problems(params: GenerateParams, model: ModelSpec) -> dict[str, str]:
    """The workflow and its input files: each image must pass `models.inputs.images.check_image`, each clip
    `models.inputs.clips.check_clip`."""
    from ..inputs.clips import InputClipError, check_clip
    from ..inputs.images import InputImageError, check_image
    from ..run.workflows import WORKFLOW_CLIPS, WORKFLOWS, workflow_inputs

    workflow = params.resolved_workflow
    if workflow not in WORKFLOWS:
        return {"workflow": f"{workflow!r} given; expected one of {', '.join(WORKFLOWS)}"}
    problems = {}
    given, takes = params.input_files(), workflow_inputs(workflow)
    for name in sorted(set(given) - set(takes)):
        problems[name] = f"{workflow} takes no {name}" + (f" (it takes {' or '.join(takes)})" if takes else "")
    if takes and not set(given) & set(takes):
        problems["workflow"] = f"{workflow} needs {' or '.join(takes)}"
    for name, path in given.items():
        if name in problems:
            continue
        clip = name in WORKFLOW_CLIPS[workflow]
        if not isinstance(path, str):
            problems[name] = f"must be {'a video' if clip else 'an image'} file path, got {path!r}"
            continue
        if clip:
            try:
                check_clip(path, model.sampling_rate)
            except InputClipError as e:
                problems[name] = str(e)
            continue
        try:
            check_image(path)
        except InputImageError as e:
            problems[name] = str(e)
    return problems
