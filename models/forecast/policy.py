"""The fit-aware offload policy's input for a generate: its components' bytes and the largest stage's device
working set, from the forecast with everything resident."""

from __future__ import annotations

from pathlib import Path

from machine.device import DeviceInfo
from machine.offload import OffloadSettings, resolve_offload

from ..request.params import GenerateParams
from .stages import forecast_generate


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
