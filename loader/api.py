"""`load_checkpoint`: discover, plan, build the empty model, place every tensor, report.

The steps run in a fixed order so no mode can skip one: discover and validate
the checkpoint from headers (every file under a model root); set aside the
excluded source tensors; map names and decide dtypes; build the module on the
meta device (registered builder, given module, or skeleton from metadata);
check names and shapes (strict fails here, before any byte is read); let the
placement prepare (set-up that reads nothing, e.g. wrapping the empty module
for FSDP); take the baseline sample and start the clock; let the placement
mode fill the module.
"""

from __future__ import annotations

import os
from typing import Callable, MutableMapping, Sequence

import torch
import torch.nn as nn

from .metadata import ComponentMeta, TensorMeta
from .checkpoint import discover_checkpoint
from .dtypes import DtypePolicy
from .io.host_blocks import PinnedHostArena
from machine.device import DeviceInfo, parse_device_spec
from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import DeviceError, PlacementError
from machine.memory import MemoryProbe
from .model_registry import get_model_builder
from .naming import EXTRA_STATE_SUFFIX, plan_targets
from .options import LoadOptions
from .placement import LoadPlan, Placement, PlacementContext, PlannedTarget, get_placement
from .placement.base import Adjust
from .report import LoadMeter, LoadReport, TensorPlaced
from .skeleton import build_skeleton


def load_checkpoint(
    path: str | os.PathLike,
    options: LoadOptions = LoadOptions(),
    *,
    module: nn.Module | None = None,
    on_tensor: Callable[[TensorPlaced], None] | None = None,
    probe: MemoryProbe | None = None,
) -> tuple[nn.Module, LoadReport]:
    """Load one component of the checkpoint at `path` into a module on `options.device` (`LoadOptions` says
    how).

    `module` (built on meta, or any module) receives the tensors; without one the component's registered
    builder is used, else a skeleton is built from the checkpoint's metadata (`options.skeleton` builds the
    skeleton even for a registered class: a checkpoint of another layout than its config's class says).
    A module tensor an excluded name would have filled stays missing, so build the module without it.
    `on_tensor` is called after each placed tensor; `probe` samples memory (default: one of the device's).
    With `options.pin_host`, CPU destinations are page-locked where pinning is allowed (the report's
    `host_pinned_note` says why not). An `options.adjust` name the load does not place is refused before
    any byte is read.

    Raises CheckpointError (malformed checkpoint, a file outside the roots),
    PlacementError (bad option, unknown mode, name/shape mismatch, strict
    failure) or DeviceError.
    """
    o = options
    extra = {} if o.drop_page_cache is None else {"drop_page_cache": o.drop_page_cache}
    if isinstance(o.mode, Placement) and extra:
        raise PlacementError("drop_page_cache goes to the placement instance itself when mode is one")
    if o.skeleton and module is not None:
        raise PlacementError("skeleton builds the module from the checkpoint; do not pass a module too")
    placement = o.mode if isinstance(o.mode, Placement) else get_placement(o.mode, **extra)
    target_device = resolve_device(o.device)
    _check_device_info(o.device_info, target_device)
    comp = discover_checkpoint(path, roots=o.roots).component(o.component)
    sources, excluded = _split_excluded(comp.tensors, o.exclude)
    targets, skipped = plan_targets(sources, o.rename, o.merges, o.splits)
    given = module is not None
    module, keep_fp32 = (None, ()) if o.skeleton else _registered_module(comp, module)
    policy = DtypePolicy.build(o.dtype, o.dtype_overrides, keep_fp32)
    planned = [PlannedTarget(t, policy.target_dtype(t.name, t.sources[0].torch_dtype)) for t in targets]
    if module is None:  # built from the plan itself, so every name and shape matches: nothing to check
        module = build_skeleton((p.name, p.target.shape, p.dtype) for p in planned)
        plan, missing, unexpected = LoadPlan(targets=planned, dropped=list(skipped)), [], []
    else:
        plan, missing, unexpected = _match_module(module, planned, skipped, comp, o.strict, given)
    report = LoadReport(
        mode=placement.name,
        device=str(target_device),
        tensors_total=len(plan.targets),
        missing=missing,
        unexpected=unexpected,
        skipped=[m.name for m in skipped],
        excluded=[m.name for m in excluded],
        excluded_tensors=len(excluded),
        excluded_bytes=sum(m.nbytes for m in excluded),
    )
    _check_adjust(o.adjust, plan)
    pinned = o.pin_host and target_device.type == "cpu"
    host = PinnedHostArena(sum(p.nbytes for p in plan.targets)) if pinned else None
    _fill(placement, plan, module, target_device, report, o, probe, on_tensor, host)
    return module, report


def _check_device_info(info: DeviceInfo | None, device: torch.device) -> None:
    """Refuse a probe of another device than the load's (its facts would size the load wrongly)."""
    if info is None:
        return
    index = device.index if device.index is not None else (0 if device.type == "cuda" else None)
    if (info.kind, info.index) != (device.type, index):
        raise PlacementError(f"device_info describes {info.spec!r}, but the load targets {str(device)!r}")


def resolve_device(device: str | torch.device) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` or `mps` as a torch device, checked to be present."""
    kind, index = parse_device_spec(str(device))
    dev = torch.device(kind, index) if index is not None else torch.device(kind)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {str(device)!r} requested but this torch sees no CUDA device")
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device {str(device)!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise DeviceError("device 'mps' requested but MPS is not available")
    return dev


def _split_excluded(
    tensors: Sequence[TensorMeta], exclude: Callable[[str], bool] | None
) -> tuple[list[TensorMeta], list[TensorMeta]]:
    """(tensors to plan, tensors set aside unread) by checkpoint name."""
    if exclude is None:
        return list(tensors), []
    kept, excluded = [], []
    for meta in tensors:
        (excluded if exclude(meta.name) else kept).append(meta)
    return kept, excluded


def _check_adjust(adjust: MutableMapping[str, Adjust] | None, plan: LoadPlan) -> None:
    """Refuse adjustments for names this load never places (they would silently not apply)."""
    if not adjust:
        return
    placed = {p.name for p in plan.targets}
    stray = sorted(n for n in adjust if n not in placed)
    if stray:
        raise PlacementError(f"{len(stray)} adjusted tensor(s) are not placed by this load, e.g. {_examples(stray)}")


def _registered_module(comp: ComponentMeta, module: nn.Module | None) -> tuple[nn.Module | None, tuple[str, ...]]:
    """The given module, else the registered builder's (built on meta), with its keep-fp32 patterns."""
    if module is not None:
        return module, ()
    builder = get_model_builder(comp.class_name)
    if builder is None:
        return None, ()
    with torch.device("meta"):
        return builder.build(comp.config), builder.keep_fp32


def _match_module(
    module: nn.Module, planned: list[PlannedTarget], skipped: list[TensorMeta], comp: ComponentMeta, strict: bool,
    given: bool,
) -> tuple[LoadPlan, list[str], list[str]]:
    """(plan, missing, unexpected) after checking names and shapes against the module; raises on a
    shape mismatch, and on missing or unexpected names when `strict`. Messages are bounded: counts and
    the first few names; for a registered class (not a `given` module) they say how to load anyway."""
    expected = _module_tensors(module)
    names = {p.name for p in planned}
    unexpected = sorted(n for n in names if n not in expected)
    missing = sorted(n for n in expected if n not in names)
    mismatched = sorted(
        f"{echo(p.name, NAME_LIMIT)} from {echo_name(p.sources[0].file.name)} has shape {p.target.shape}; module expects {tuple(expected[p.name].shape)}"
        for p in planned
        if p.name in expected and tuple(expected[p.name].shape) != p.target.shape
    )
    parts = []
    if mismatched:
        parts.append(f"{len(mismatched)} with another shape, e.g. " + "; ".join(mismatched[:SHOWN_NAMES]))
    if strict and missing:
        parts.append(f"{len(missing)} missing from {echo_name(comp.path)}, e.g. {_examples(missing)}")
    if strict and unexpected:
        parts.append(f"{len(unexpected)} unexpected, e.g. {_examples(unexpected)}")
    if parts:
        hint = "" if given else "; " + _skeleton_hint(comp, type(module).__name__)
        raise PlacementError("tensors do not match the module: " + "; ".join(parts) + hint)
    plan = LoadPlan(
        targets=[p for p in planned if p.name in expected],
        dropped=list(skipped) + [s for p in planned if p.name not in expected for s in p.sources],
    )
    return plan, missing, unexpected


SHOWN_NAMES = 3
"""Names a mismatch message quotes per kind (missing, unexpected, reshaped) before "...": a wrong layout
has hundreds."""


def _examples(names: list[str]) -> str:
    shown = ", ".join(echo_name(n) for n in names[:SHOWN_NAMES])
    return shown + (", ..." if len(names) > SHOWN_NAMES else "")


def _skeleton_hint(comp: ComponentMeta, class_name: str) -> str:
    """What a mismatch against a registered class means, and the way to load the tensors anyway."""
    library = comp.library or (
        "diffusers" if "_diffusers_version" in comp.config else "transformers" if "transformers_version" in comp.config
        else None
    )
    library = library and echo_name(library)
    owner = f"{library}' {class_name}" if library and library.endswith("s") else f"{library}'s {class_name}" if library else class_name
    return f"these tensors do not match {owner}; to load them as a generic checkpoint, use --skeleton"


def _fill(
    placement: Placement,
    plan: LoadPlan,
    module: nn.Module,
    device: torch.device,
    report: LoadReport,
    options: LoadOptions,
    probe: MemoryProbe | None,
    on_tensor: Callable[[TensorPlaced], None] | None,
    host: PinnedHostArena | None,
) -> None:
    """Prepare, baseline, place and synchronise, metering every tensor into `report` (and what `host`
    pinned)."""
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(0, device=device)
    own_probe = probe is None
    probe = probe or MemoryProbe(str(device))
    try:
        meter = LoadMeter(report, probe, on_tensor)
        ctx = PlacementContext(module, device, meter, host, options.adjust, options.device_info)
        placement.prepare(plan, ctx)
        meter.baseline()
        meter.start()
        placement.place(plan, ctx)
        synchronize(device)
        meter.finish()
    finally:
        if host is not None:
            report.host_pinned_bytes, report.host_pinned_note = host.pinned_bytes, host.note
            host.release()
        if own_probe:
            probe.close()


def _module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by state-dict name (`*_extra_state` excluded)."""
    return {k: v for k, v in module.state_dict(keep_vars=True).items() if not k.endswith(EXTRA_STATE_SUFFIX)}


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work, so a clock read after it measures finished work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
