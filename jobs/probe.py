"""The `probe` stage every kind that binds a device starts with: decide offload once per job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.context import JobContext

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: jobs.spec imports torch, listing kinds must not
    from loader.device import DeviceInfo
    from loader.offload import OffloadSettings


def decide_offload(spec: JobSpec, ctx: JobContext) -> tuple["DeviceInfo", "OffloadSettings"]:
    """Probe `spec.device` and resolve `spec.offload` for it, once, in a `probe` stage.

    The device and every policy decision become job events, so the dashboard can
    say why a flag was turned off; every later site reads the returned settings.
    """
    from loader.device import probe_device
    from loader.offload import resolve_offload

    with ctx.stage("probe"):
        device = probe_device(spec.device)
        ctx.event("device", device.reason, data=device.to_dict())
        settings, decisions = resolve_offload(spec.offload, device)
        for decision in decisions:
            ctx.event("decision", str(decision), data=decision.to_dict())
        ctx.record()
    return device, settings
