"""The text encoder's tokenizer and processor, made and read locally (no hub, no download).

The tokenizer is a byte-level BPE with Qwen's special tokens appended after
the learned vocabulary, as in Qwen's own. Qwen3-VL's processor has an image
part, a tokenizer and a video part. `build_processor` builds all three without
torchvision (which the CPU torch here has no wheel for): the image part on
Pillow, the video part from `models.inputs.qwen_video` (transformers' own where
torchvision imports). `ref2va` reads the video part for a reference clip.
"""

from __future__ import annotations

import json
from pathlib import Path

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
"""Qwen2.5 / Qwen3-VL special tokens, in Qwen's order."""

_CORPUS = (
    "a red fox running through fresh snow", "a whale at dusk", "the camera slowly pans across a quiet harbour",
    "a busy street market at night with neon signs and rain", "waves crash on black volcanic sand",
    "an old man plays the violin in a sunlit room", "children laugh as they chase bubbles in the park",
    "a drone shot of green rice terraces in the morning mist", "the sound of birds and a distant train",
)
"""Text the BPE merges are learned from (the vocabulary only has to be deterministic)."""


def build_tokenizer(merges: int):
    """A `Qwen2Tokenizer` over a byte-level BPE: 256 bytes + up to `merges` merges + Qwen's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + merges, initial_alphabet=alphabet, show_progress=False)
    bpe.train_from_iterator(_CORPUS * 4, trainer)
    bpe.add_special_tokens(list(QWEN_SPECIAL_TOKENS))
    return Qwen2Tokenizer(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                          bos_token=None)


def special_token_ids(tokenizer) -> dict[str, int]:
    """The ids Qwen3-VL's config refers to, from the tokenizer."""
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    return ids


def _processor_class():
    from transformers import Qwen3VLProcessor

    from ..inputs.qwen_video import torchvision_available

    if torchvision_available():
        return Qwen3VLProcessor

    class Qwen3VLProcessorTorchVideo(Qwen3VLProcessor):
        """Qwen3-VL's processor whose video part is `models.inputs.qwen_video`'s (transformers' own class is a
        placeholder without torchvision, so its type check would refuse the part).

        `ProcessorMixin.__init__` checks every part against its expected class; overriding that check (a
        public method, no underscore) for the video part alone is the narrowest way to build it, and the
        exception docs/models.md lists.
        """

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return Qwen3VLProcessorTorchVideo


def image_processor(config: dict | None = None):
    """Qwen3-VL's image processor on the PIL backend (patch 16, merge 2), from its saved dict when given."""
    from transformers import Qwen2VLImageProcessorPil

    values = {k: v for k, v in (config or {}).items() if k not in ("image_processor_type", "processor_class")}
    return Qwen2VLImageProcessorPil(**({"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2} | values))


def resized_image(processor, height: int, width: int) -> tuple[int, int]:
    """(height, width) `processor` (an `image_processor`) resizes a `height` x `width` image to: transformers'
    `smart_resize` within its pixel bounds, on its patch grid. The forecast counts an image's rows with it."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize(height, width, factor=processor.patch_size * processor.merge_size,
                        min_pixels=processor.size.shortest_edge, max_pixels=processor.size.longest_edge)


def build_processor(tokenizer, image_config: dict | None = None, video_config: dict | None = None):
    """A Qwen3-VL processor: the image part, `tokenizer` and the video part, from their saved dicts when given."""
    from ..inputs.qwen_video import video_processor

    return _processor_class()(image_processor=image_processor(image_config), tokenizer=tokenizer,
                              video_processor=video_processor(video_config))


def save_processor(folder: Path, tokenizer) -> None:
    """Write `processor/`: `processor_config.json` (image part, processor class) and the tokenizer files."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    body = {"image_processor": image_processor().to_dict(), "processor_class": "Qwen3VLProcessor"}
    (folder / "processor_config.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def load_tokenizer(folder: Path):
    """The tokenizer saved in `folder` (local files only; a FIFO or device among them refused first, since
    transformers opens them by path and would block on one)."""
    from transformers import Qwen2Tokenizer

    from loader.confined import require_regular_files

    require_regular_files(folder)

    return Qwen2Tokenizer.from_pretrained(str(folder), local_files_only=True)


def read_processor_config(folder: Path) -> dict:
    """`processor_config.json` of a processor folder, read as the loader reads a checkpoint's JSON (bounded, a
    regular file only); {} where there is none."""
    from loader.confined import read_json_checked

    path = folder / "processor_config.json"
    config = read_json_checked(path) if path.is_file() else {}
    return config if isinstance(config, dict) else {}


def load_processor(folder: Path):
    """The processor saved in `folder` (its video part from `video_processor` there, else transformers' defaults)."""
    config = json.loads((folder / "processor_config.json").read_text())
    return build_processor(load_tokenizer(folder), config.get("image_processor"), config.get("video_processor"))
