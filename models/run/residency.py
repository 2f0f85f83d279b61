"""Where each H3 component lives during a run: the resolved offload flags mapped onto diffusers' mechanisms.

| flag | mechanism |
|---|---|
| `dit_layerwise_offload` | diffusers group offload of the DiT (`transformer`, or `transformer_ref` for ref2va) at block level (CUDA streams on a GPU) |
| `dit_cpu_offload` | model-level offload of the DiT (accelerate's `cpu_offload_with_hook`) |
| `text_encoder_cpu_offload` | model-level offload of the Qwen3-VL text encoder |
| `image_encoder_cpu_offload` | model-level offload of the Qwen3-VL vision tower (fl2va/ref2va only) |
| `vae_cpu_offload` | model-level offload of both VAEs |

Model-level offload keeps the weights on the host, moves the whole module to
the device when its forward (or the pipeline's `decode`, or the text encoder
step's explicit `pre_forward`) fires, and back when its last block has run.
Group offload keeps each transformer block on the host and brings it in for
its own forward. Block-level group offload is not used for the text encoder
(it misses Qwen3-VL's `embed_tokens`) nor for the audio VAE (diffusers refuses
it or the audio comes out wrong), hence model-level there.

The settings are resolved once per job (`machine.offload.resolve_offload`); on
unified memory every flag is off and each component sits on the device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn

from machine.offload import OffloadSettings

ON_DEVICE = "on device"
MODEL_OFFLOAD = "model offload"
GROUP_OFFLOAD = "group offload (block level)"
RELEASED = "released"
"""Residency names, as events and results carry them."""
ACCELERATE_OFFLOAD = "accelerate cpu offload"
DIFFUSERS_GROUP_OFFLOAD = "diffusers group offload"
"""Hook names, as results carry them: what `Residency` applied, not read back from the libraries' hooks."""


@dataclass(frozen=True)
class Placement:
    """How one component is held during the run."""

    component: str
    """Pipeline component name."""
    mechanism: str
    """ON_DEVICE, MODEL_OFFLOAD or GROUP_OFFLOAD."""
    flag: str | None
    """The OffloadSettings field that chose the mechanism (None: on device)."""
    load_device: str
    """Where the loader puts the weights: the host when offloaded, else the run's device."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FLAGS = {"transformer": "dit_cpu_offload", "transformer_ref": "dit_cpu_offload", "text_encoder": "text_encoder_cpu_offload",
          "vae": "vae_cpu_offload", "audio_vae": "vae_cpu_offload"}
"""The model-level flag of each weight component."""


def plan_placements(settings: OffloadSettings, device: torch.device, components: tuple[str, ...]) -> dict[str, Placement]:
    """Decide, from resolved settings, the mechanism and load device of every weight component."""
    plans = {}
    for name in components:
        flag = _FLAGS[name]
        if name in ("transformer", "transformer_ref") and settings.dit_layerwise_offload:
            mechanism, flag = GROUP_OFFLOAD, "dit_layerwise_offload"
        elif getattr(settings, flag):
            mechanism = MODEL_OFFLOAD
        else:
            mechanism, flag = ON_DEVICE, None
        plans[name] = Placement(name, mechanism, flag, "cpu" if mechanism != ON_DEVICE else str(device))
    return plans


def pins_host_copy(placement: Placement, device_type: str, settings: OffloadSettings, *, quantized: bool) -> bool:
    """Whether the loader places the component's host copy page-locked: group-offloaded to CUDA with
    `pin_cpu_memory`, unquantized. Group offload would pin each tensor itself, at torch's power-of-two sizes
    and beside the loader's pageable copy (H3's DiT: 90.2 GiB pinned next to 61.7 GiB, more than a 128 GiB
    host holds); placed pinned, it pins nothing twice. Quantizing replaces tensors as they are placed, which
    would leave the blocks part-used."""
    return (placement.mechanism == GROUP_OFFLOAD and device_type == "cuda" and settings.pin_cpu_memory
            and not quantized)


class Residency:
    """Applies a Placement to a loaded module, says what it applied, and undoes it after the module's last block."""

    def __init__(self, placement: Placement, module: nn.Module, device: torch.device, settings: OffloadSettings):
        self.placement = placement
        self.module = module
        self._hook = None
        self.hooks: tuple[str, ...] = ()
        """The offload hooks applied to the module, by the name of the library mechanism."""
        if placement.mechanism == MODEL_OFFLOAD:
            from accelerate import cpu_offload_with_hook

            _, self._hook = cpu_offload_with_hook(module, execution_device=device)
            self.hooks = (ACCELERATE_OFFLOAD,)
        elif placement.mechanism == GROUP_OFFLOAD:
            from diffusers.hooks import apply_group_offloading

            cuda = device.type == "cuda"
            apply_group_offloading(
                module, onload_device=device, offload_device=torch.device("cpu"), offload_type="block_level",
                num_blocks_per_group=1, use_stream=cuda, non_blocking=cuda,
                # pin_cpu_memory: pinned host copies up front (fast async copies); off pins each block on the fly.
                low_cpu_mem_usage=cuda and not settings.pin_cpu_memory,
            )
            self.hooks = (DIFFUSERS_GROUP_OFFLOAD,)

    def offload(self) -> None:
        """After the component's last block: model offload sends the module back to the host."""
        if self._hook is not None:
            self._hook.offload()

    def observe(self) -> dict[str, Any]:
        """Where the module lives now: its parameters' devices, the mechanism and the hooks applied to it."""
        devices = sorted({str(p.device) for p in self.module.parameters()})
        return {"mechanism": self.placement.mechanism, "devices": devices, "hooks": list(self.hooks)}


def observe(residency: Residency | None) -> dict[str, Any]:
    """`residency.observe()`, or a released component's entry when it holds no weights."""
    if residency is None:
        return {"mechanism": RELEASED, "devices": [], "hooks": []}
    return residency.observe()
