"""Offload policy: decide once, per job, where weights live.

Offload flags move weights to host memory so the device can drop them. On
unified memory (NVIDIA GB10, other integrated GPUs, Apple MPS, or a CPU target)
host and device are one pool: the move frees nothing, the copy is pure loss,
and the peak becomes the sum instead of the max. One flag acts at several sites
(load-time device choice, the offload hooks around a component's forward), so
`resolve_offload` runs once after the job's device is bound and every site reads
its answer.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from machine.device import DeviceInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffloadSettings:
    """The offload settings, named and defaulted as in FastVideo."""

    dit_layerwise_offload: bool = True
    """Stream the DiT's layers from host memory one at a time during the forward."""
    dit_cpu_offload: bool = True
    """Keep the whole DiT in host memory and move it to the device around its forward."""
    text_encoder_cpu_offload: bool = True
    """Keep the text encoder in host memory between uses."""
    image_encoder_cpu_offload: bool = True
    """Keep the image encoder in host memory between uses."""
    vae_cpu_offload: bool = True
    """Keep the VAE in host memory between uses."""
    pin_cpu_memory: bool = True
    """Pin the host copies of a layerwise-offloaded DiT once, up front, for asynchronous copies on CUDA streams;
    off pins each block on the fly (less pinned memory, slower). Never changed by the policy."""

    def to_dict(self) -> dict[str, bool]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, bool]) -> "OffloadSettings":
        """Settings from a stored mapping; retired flags (RETIRED_FLAGS) of older job specs are dropped."""
        return cls(**{k: v for k, v in values.items() if k not in RETIRED_FLAGS})


RETIRED_FLAGS: tuple[str, ...] = ("use_fsdp_inference",)
"""Flags older job specs may carry that nothing reads any more (generate runs on one device)."""


UNIFIED_MEMORY_OFFLOAD_FLAGS: tuple[str, ...] = (
    "dit_layerwise_offload",
    "dit_cpu_offload",
    "text_encoder_cpu_offload",
    "image_encoder_cpu_offload",
    "vae_cpu_offload",
)
"""Every flag that moves weights to host; all of them turn off on unified memory.
A flag missing here would be silent: the run works and quietly pays twice."""


@dataclass(frozen=True)
class OffloadDecision:
    """One flag the policy changed, and why."""

    flag: str
    """The OffloadSettings field."""
    before: bool
    """Value as requested."""
    after: bool
    """Value every site must use."""
    reason: str
    """Why, in words a user understands."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.flag}: {_on_off(self.before)} -> {_on_off(self.after)} ({self.reason})"


def unified_memory_reason(device: DeviceInfo) -> str:
    """Why offloading to host is pointless on `device` (which must report unified memory)."""
    if device.source.startswith("env:"):
        forced = device.source[len("env:"):]
        return f"{device.name} is treated as unified memory ({forced}): moving weights to host frees nothing"
    if device.kind == "cpu":
        return "the target is the CPU: weights already live in host memory, so offloading them there frees nothing"
    return f"{device.name} has unified memory: moving weights to host frees nothing"


@dataclass(frozen=True)
class ComponentFit:
    """What a forecast says the components need on a discrete device, for the fit-aware policy."""

    component_bytes: dict[str, int]
    """Weight bytes per component the workflow reads (`transformer` or ref2va's `transformer_ref`, `text_encoder`,
    `vae`, `audio_vae`), at the size the run holds them (quantized where it quantizes)."""
    working_bytes: int
    """Device bytes besides weights at the largest stage: activations, workspaces, allocator reserve, context."""
    capacity: int
    """The device's memory in bytes."""
    sequential: bool
    """Per-stage residency: a stage holds only its own component (plus any resident ones when off)."""


_COMPONENT_FLAGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "transformer": (("transformer", "transformer_ref"), ("dit_layerwise_offload", "dit_cpu_offload")),
    "text_encoder": (("text_encoder",), ("text_encoder_cpu_offload", "image_encoder_cpu_offload")),
    "vae": (("vae", "audio_vae"), ("vae_cpu_offload",)),
}
"""Per policy group: the components it holds and the flags that offload it (the first is the one turned on)."""


def _fit_groups(values: dict[str, bool], fit: ComponentFit, user_set: frozenset[str],
                changes: dict[str, str]) -> None:
    """On a discrete device: every group the user left alone stays resident if the forecast fits, else the
    largest such groups are offloaded one by one until it does. Writes each group's flags and reason."""
    sizes = {g: sum(fit.component_bytes.get(c, 0) for c in comps) for g, (comps, _) in _COMPONENT_FLAGS.items()}
    free = [g for g, (_, flags) in _COMPONENT_FLAGS.items() if not set(flags) & user_set]
    offloaded = {g for g, (_, flags) in _COMPONENT_FLAGS.items() if g not in free and any(values[f] for f in flags)}

    def need(out: set[str]) -> int:
        resident = [sizes[g] for g in sizes if g not in out]
        # While an offloaded group runs, model offload brings it in whole (layerwise: a block, counted as none).
        running = [0 if g == "transformer" else sizes[g] for g in out]
        held = max(resident + running, default=0) if fit.sequential else sum(resident) + max(running, default=0)
        return held + fit.working_bytes

    gib = 2**30
    for group in sorted(free, key=lambda g: -sizes[g]):
        if need(offloaded) <= fit.capacity:
            break
        before = need(offloaded)
        offloaded.add(group)
        flags = _COMPONENT_FLAGS[group][1]
        for flag in flags:
            values[flag] = flag == flags[0]
            changes[flag] = (f"{group} offloaded: with it resident the predicted peak is {before / gib:.1f} of "
                             f"{fit.capacity / gib:.1f} GiB")
    peak = need(offloaded)
    for group in free:
        if group not in offloaded:
            for flag in _COMPONENT_FLAGS[group][1]:
                values[flag] = False
                changes[flag] = f"{group} resident: predicted {peak / gib:.1f} of {fit.capacity / gib:.1f} GiB"


def resolve_offload(
    settings: OffloadSettings, device: DeviceInfo, *, fit: ComponentFit | None = None,
    user_set: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
) -> tuple[OffloadSettings, list[OffloadDecision]]:
    """Return the settings every site must use on `device`, and one decision per flag it decided.

    Rules, in order (each sees the result of the previous one):
    unified memory turns off each of UNIFIED_MEMORY_OFFLOAD_FLAGS that is on;
    on a discrete device with a forecast (`fit`), the flags the user did not set (`user_set`) follow it:
    every component resident when it fits, else the largest offloaded one by one until it does (each such
    flag gets a decision with its reason, changed or not);
    layerwise offload, when still on, wins over dit_cpu_offload.
    Other flags already off produce no decision. Pure: no torch, no logging.
    """
    changes: dict[str, str] = {}
    values = settings.to_dict()

    def turn_off(flag: str, reason: str) -> None:
        if values[flag]:
            values[flag] = False
            changes[flag] = reason

    if device.unified_memory:
        reason = unified_memory_reason(device)
        for flag in UNIFIED_MEMORY_OFFLOAD_FLAGS:
            turn_off(flag, reason)
    elif fit is not None and device.kind == "cuda":
        _fit_groups(values, fit, frozenset(user_set), changes)
    if values["dit_layerwise_offload"]:
        turn_off(
            "dit_cpu_offload",
            "dit_layerwise_offload is on and already moves the DiT between host and device layer by layer",
        )
    decisions = [
        OffloadDecision(flag, getattr(settings, flag), values[flag], changes[flag])
        for flag in (f.name for f in fields(OffloadSettings))
        if flag in changes
    ]
    return replace(settings, **values), decisions


def _on_off(value: bool) -> str:
    return "on" if value else "off"
