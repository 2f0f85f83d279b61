"""The `probe` stage every kind that binds a device starts with: decide offload once per job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.context import JobContext

if TYPE_CHECKING:
    from jobs.spec import JobSpec  # annotations only: jobs.spec imports torch, listing kinds must not
    from machine.device import DeviceInfo
    from machine.offload import OffloadDecision, OffloadSettings


def decide_offload(spec: JobSpec, ctx: JobContext) -> tuple["DeviceInfo", "OffloadSettings", list["OffloadDecision"]]:
    """Probe `spec.device` and resolve `spec.offload` for it, once, in a `probe` stage.

    The kind resolves it (`JobKind.resolve_offload`): a generate on a discrete GPU is resolved against its forecast (`models.forecast.policy_fit`, over the
    workflow's components at the size the run holds them: a quantized DiT at its int8 / fp8 bytes): the
    flags the user did not set keep each component resident where it fits. The device and every policy
    decision become job events, so the dashboard can say why; every later site reads the returned settings.
    """
    from machine.device import probe_device

    with ctx.stage("probe"):
        device = probe_device(spec.device)
        ctx.event("device", device.reason, data=device.to_dict())
        settings, decisions = job_offload(spec, device)
        for decision in decisions:
            ctx.event("decision", str(decision), data=decision.to_dict())
        ctx.record()
    return device, settings, decisions


def job_offload(spec: JobSpec, device: "DeviceInfo") -> tuple["OffloadSettings", list["OffloadDecision"]]:
    """What the job will use on `device`, as its probe stage decides it (and the Run page previews it): its kind's
    answer (`JobKind.resolve_offload`: a generate fit-aware against its forecast on a discrete GPU), the plain
    rules otherwise."""
    return spec.job_kind.resolve_offload(spec, device)
