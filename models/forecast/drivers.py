"""Each stage's size in its own unit (its driver), from the request and its inputs' headers: the prompt's tokens,
the images' and a reference clip's canvases, the packed sequence's rows, the output's pixels and samples."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..request.params import TEXT_ENCODER_LAYER, GenerateParams, ModelSpec
from ..request.video_length import FPS
from . import fitted

AUDIO_CHANNELS, AUDIO_LATENTS_PER_SECOND = 2, 40
"""H3's stereo soundtrack and its latent rate."""


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


def image_sizes(params: GenerateParams) -> dict[str, tuple[int, int]]:
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
    """A ref2va reference clip as diffusers' setup normalizes it, from the file's header (`models.inputs.clips.
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
    from ..inputs.clips import MAX_SOUNDTRACK_SECONDS, frames_at_24, read_clip_header

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


def encoded_inputs(model: ModelSpec, workflow: str, params: GenerateParams, images: Mapping[str, tuple[int, int]],
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


def vision_tokens(root: Path, images: list[tuple[int, int, int]]) -> int:
    """Rows the text encoder adds for the images it is shown: per image a `<Picture i>: ` label, the vision
    block's start and end, and one row per merged patch of the image as Qwen3-VL's image processor resizes it
    (`smart_resize` within the processor's pixel bounds: ref2va's reference image, put on a 2048 short edge for
    the VAE, reaches the text encoder at about a megapixel)."""
    from ..checkpoint.text_aux import image_processor, read_processor_config, resized_image

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
    from ..inputs.qwen_video import resized_frame, video_processor
    from ..checkpoint.text_aux import read_processor_config

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


def stage_drivers(model: ModelSpec, params: GenerateParams, height: int, width: int, text_tokens: int,
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
        fitted.CLIP_ENCODE: sum(f * h * w for f, h, w in conditions if f > 1),
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
