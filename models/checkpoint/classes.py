"""The classes of MiniMax H3's weight components, and each one's module built empty from its config.

The classes are diffusers' and transformers'; this module names them, reads a component's config and builds
its module with nothing in it, for the loader to fill (`models.checkpoint.components`), the synthetic writer to fill
(`models.synth.writer`) or the forecast and the LoRA check to measure (`models.quantization.quantize`, `models.lora.inputs`):

- **Construction.** Parameters are created on the meta device with weight
  initialisation skipped, while buffers are computed on the CPU exactly as the
  constructor defines them. Non-persistent buffers (the transformer's
  `rope.inv_freq`, Qwen3-VL's rotary `inv_freq`) are not in the checkpoint, so
  this is where their values come from; a module built wholly on meta would
  carry no value there (and `to_empty` would leave garbage that silently shifts
  the latents). The default dtype during construction is the requested one, as
  in diffusers' and transformers' own `from_pretrained`.
- **Dtype rule (diffusers').** With a requested dtype, a floating tensor stays
  float32 when any dotted part of its name is in the class's
  `_keep_in_fp32_modules`; without one, the checkpoint's dtypes are kept.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

from core.echo import NAME_LIMIT, echo
from core.errors import CheckpointError, PlacementError
from loader.confined import read_json_checked

CLASS_LIBRARIES: dict[str, str] = {
    "MiniMaxH3Transformer3DModel": "diffusers",
    "AutoencoderKLMiniMaxH3": "diffusers",
    "AutoencoderKLMiniMaxH3Audio": "diffusers",
    "Qwen3VLForConditionalGeneration": "transformers",
}
"""The weight classes of a MiniMax H3 checkpoint and the library defining each. Only `t2va` runs without the
text encoder's vision tower: `fl2va` and `ref2va` present their images to it."""
TRANSFORMERS_AUTO_CLASSES: dict[str, str] = {"Qwen3VLForConditionalGeneration": "AutoModelForImageTextToText"}
"""transformers' auto class whose public `from_config` builds each transformers class (with `dtype=`)."""


def class_name_of(config: dict) -> str | None:
    """The class a component's `config.json` names: diffusers' `_class_name`, or transformers' `architectures[0]`."""
    name = config.get("_class_name")
    if name is None and isinstance(config.get("architectures"), list) and config["architectures"]:
        name = config["architectures"][0]
    return name if isinstance(name, str) else None


def component_class(class_name: str) -> type[nn.Module]:
    """The diffusers / transformers class called `class_name` (one of `CLASS_LIBRARIES`)."""
    library = CLASS_LIBRARIES.get(class_name)
    if library is None:
        raise PlacementError(
            f"no MiniMax H3 class {echo(class_name, NAME_LIMIT)}; known: {', '.join(CLASS_LIBRARIES)} (others load as generic skeletons)"
        )
    return getattr(importlib.import_module(library), class_name)


def keep_fp32_modules(cls: type[nn.Module]) -> tuple[str, ...]:
    """The module names `cls` keeps in float32 under a requested dtype (diffusers' and transformers' rule).

    The one read of the class attribute `_keep_in_fp32_modules`: neither library offers a public accessor
    for it, and both `from_pretrained` read it the same way (docs/models.md lists it as an exception).
    """
    return tuple(getattr(cls, "_keep_in_fp32_modules", None) or ())


def fp32_patterns(cls: type[nn.Module]) -> tuple[str, ...]:
    """The fp32 rule as regexes: a name stays float32 when one of its dotted parts is in `keep_fp32_modules(cls)`."""
    return tuple(rf"(?:^|\.){re.escape(part)}(?:\.|$)" for part in keep_fp32_modules(cls))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    previous = torch.get_default_dtype()
    if dtype is not None and dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_empty(config: dict, dtype: torch.dtype | None = None) -> nn.Module:
    """The component's module with every parameter on meta and every buffer computed on the CPU.

    `dtype` is the default dtype during construction (what `from_pretrained(torch_dtype=...)`
    builds under); buffers the constructor makes without an explicit dtype take it.
    """
    from accelerate import init_empty_weights

    class_name = class_name_of(config)
    if class_name is None:
        raise PlacementError("config.json names no class (_class_name or architectures)")
    cls = component_class(class_name)
    library = CLASS_LIBRARIES[class_name]
    # The caller (the loader's registry) may be inside `torch.device("meta")`: buffers must be real.
    with torch.device("cpu"), init_empty_weights(include_buffers=False):
        if library == "diffusers":
            from diffusers.models.modeling_utils import no_init_weights

            with no_init_weights(), _default_dtype(dtype):
                module = cls.from_config(config)
        else:
            from transformers.initialization import no_init_weights

            import transformers

            auto = getattr(transformers, TRANSFORMERS_AUTO_CLASSES[class_name])
            parsed = cls.config_class.from_dict(config)
            with no_init_weights():
                module = auto.from_config(parsed, **({"dtype": dtype} if dtype is not None else {}))
            if type(module) is not cls:
                raise PlacementError(f"{auto.__name__}.from_config built {type(module).__name__}, expected {class_name}")
    return module.eval().requires_grad_(False)


DIT_CLASS = "MiniMaxH3Transformer3DModel"
DIT_DEFAULTS = "diffusers' default MiniMaxH3Transformer3DModel config (the released H3: 50 blocks of width 5376)"
"""How the DiT's config is named where a model folder lacks `transformer/config.json` and it is used instead."""


def default_dit_config() -> dict:
    """The config diffusers' MiniMax H3 DiT class builds with when given none: its constructor's defaults (the
    released model's shapes; `python -m models synth --profile h3` writes them)."""
    import inspect

    cls = component_class(DIT_CLASS)
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {"_class_name": DIT_CLASS, **defaults}


def component_config(root: Path, name: str) -> dict:
    """Component `name`'s `config.json` under the model folder `root`; for a DiT whose folder lacks it,
    `default_dit_config()` (submit lets that happen only for a single-file DiT whose every tensor fits it)."""
    if name == "transformer" and not os.path.lexists(root / name / "config.json"):
        return default_dit_config()
    return read_config(root / name)


def read_config(folder: Path, file: str = "config.json") -> dict:
    """`folder`/`file` as a JSON object, read bounded (a FIFO config never hangs a job); CheckpointError naming
    the file otherwise."""
    path = folder / file
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: no such file (expected the component's {file})")
    data = read_json_checked(path)  # bounded, regular files only: a FIFO config never hangs a job
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data
