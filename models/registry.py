"""Which module class each component config builds, and its registration with the loader.

Importing `models` registers every class here, so `loader.load_checkpoint`
builds a component on the meta device from its `config.json` `_class_name`.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from loader.model_registry import get_model_builder, register_model_builder

from .audio_vae import H3AudioVAEDecoder
from .config import AudioVAEConfig, DiTConfig, TextEncoderConfig, VideoVAEConfig, _ComponentConfig
from .dit import H3Transformer3DModel
from .text_encoder import H3ByteTextEncoder
from .video_vae import H3VideoVAEDecoder

COMPONENT_CLASSES: dict[type[_ComponentConfig], Callable[[_ComponentConfig], nn.Module]] = {
    DiTConfig: H3Transformer3DModel,
    TextEncoderConfig: H3ByteTextEncoder,
    VideoVAEConfig: H3VideoVAEDecoder,
    AudioVAEConfig: H3AudioVAEDecoder,
}


def build_component(cfg: _ComponentConfig) -> nn.Module:
    """The module for `cfg` (on the current default device)."""
    return COMPONENT_CLASSES[type(cfg)](cfg)


def _register() -> None:
    for config_cls, module_cls in COMPONENT_CLASSES.items():
        if get_model_builder(config_cls.class_name) is None:
            register_model_builder(
                config_cls.class_name,
                lambda data, c=config_cls, m=module_cls: m(c.from_json(data)),
            )


_register()
