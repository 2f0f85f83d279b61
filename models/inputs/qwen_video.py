"""The video part of Qwen3-VL's processor, which `ref2va` needs for a reference clip, with or without torchvision.

transformers' `Qwen3VLVideoProcessor` runs its pixels through torchvision, which
the CPU install lacks (and must not pull in). Where torchvision imports, that
class is used as it is. Elsewhere `TorchVideoProcessor` is transformers' own
class (frame grouping, `smart_resize`, the fused rescale and normalize,
patchify and the grid all stay its code) with the three calls it makes into
torchvision done in torch: RGB conversion, the antialiased resize
(`torch.nn.functional.interpolate`, run on uint8 directly on the CPU, the way
torchvision's tensor resize runs it) and the per-channel normalize. That
replacement was not compared with torchvision here (it is not installed):
frames are bit-identical to diffusers' own pipeline handed the same processor,
not known to be identical to a processor on a box with torchvision.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

_DROPPED = ("video_processor_type", "processor_class")
"""Keys of a saved video-processor dict that are no constructor arguments."""


def torchvision_available() -> bool:
    """Whether transformers' own video processor can run here."""
    return importlib.util.find_spec("torchvision") is not None


def video_processor(config: dict[str, Any] | None = None):
    """Qwen3-VL's video processor from its saved dict (defaults: transformers'): transformers' own class where
    torchvision imports, else `TorchVideoProcessor`."""
    values = {k: v for k, v in (config or {}).items() if k not in _DROPPED}
    if torchvision_available():
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        return Qwen3VLVideoProcessor(**values)
    return _torch_class()(**values)


_CLASS: type | None = None


def _torch_class() -> type:
    """`TorchVideoProcessor`, built on first use (importing transformers' module is not free)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build_torch_class()
    return _CLASS


def _build_torch_class() -> type:
    from transformers.image_utils import ChannelDimension, PILImageResampling
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import convert_to_rgb

    class TorchVideoProcessor(Qwen3VLVideoProcessor):
        """transformers' Qwen3-VL video processor whose torchvision calls are torch's (see the module docstring)."""

        def convert_to_rgb(self, video: torch.Tensor) -> torch.Tensor:
            if video.shape[-3] == 1:
                video = video.repeat_interleave(3, dim=-3)
            return convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)

        def resize(self, videos: torch.Tensor, size, resample, factor: int, temporal_factor: int,
                   cap_pixels_per_frame: bool | None = None, **kwargs) -> torch.Tensor:
            target = resized_frame(self, videos.shape[1], videos.shape[-2], videos.shape[-1], size,
                                   cap_pixels_per_frame)
            if PILImageResampling(resample) != PILImageResampling.BICUBIC:
                raise ValueError(f"Qwen3-VL video processor: resample {PILImageResampling(resample).name} given;"
                                 " without torchvision only BICUBIC (Qwen3-VL's) is done")
            return _bicubic(videos, tuple(target))

        def normalize(self, image: torch.Tensor, mean, std, inplace: bool = False, **kwargs) -> torch.Tensor:
            mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            return (image.sub_(mean) if inplace else image.sub(mean)).div_(std)

    return TorchVideoProcessor


def resized_frame(processor, frames: int, height: int, width: int, size=None,
                  cap_pixels_per_frame: bool | None = None) -> tuple[int, int]:
    """(height, width) Qwen3-VL's video processor resizes `frames` frames of `height` x `width` to: transformers'
    `smart_resize` under the processor's pixel budget (`size`, default its own), with transformers' per-frame cap
    where `cap_pixels_per_frame` (default the processor's) asks for it. The forecast counts a reference clip's
    vision rows with it."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    size = processor.size if size is None else size
    shortest, longest = _edge(size, "shortest_edge"), _edge(size, "longest_edge")
    factor = processor.patch_size * processor.merge_size
    cap = processor.cap_pixels_per_frame if cap_pixels_per_frame is None else cap_pixels_per_frame
    budget = longest
    if cap:  # transformers' per-frame cap: the budget's share, at most max_video_tokens
        per_frame = max(min(processor.max_video_tokens * factor * factor, longest // frames), int(shortest * 1.05))
        budget = per_frame * frames
    return tuple(smart_resize(num_frames=frames, height=height, width=width, factor=factor,
                              temporal_factor=processor.temporal_patch_size, min_pixels=shortest, max_pixels=budget))


def _edge(size, name: str) -> int:
    """One bound of a processor's `size` (a SizeDict once built, a dict in its class defaults)."""
    return int(size[name] if isinstance(size, dict) else getattr(size, name))


def _bicubic(videos: torch.Tensor, target: tuple[int, int]) -> torch.Tensor:
    """`videos` (..., C, H, W) resized to `target`, bicubic and antialiased: uint8 stays uint8 on the CPU;
    elsewhere uint8 goes through float32 and comes back clamped and rounded."""
    if tuple(videos.shape[-2:]) == target:
        return videos
    flat = videos.reshape(-1, *videos.shape[-3:])
    native = flat.dtype in (torch.float32, torch.float64) or (flat.dtype == torch.uint8 and flat.device.type == "cpu")
    out = torch.nn.functional.interpolate(flat if native else flat.float(), size=target, mode="bicubic",
                                          align_corners=False, antialias=True)
    if not native:
        out = out.clamp_(0, 255).round_().to(videos.dtype)
    return out.reshape(*videos.shape[:-2], *target)
