"""The placement interface, its registry, and the context every mode writes through.

A mode decides how bytes get from the checkpoint into destination tensors;
the context allocates each destination once on the target device, installs
it into the module and accounts for it. Modes never touch the module or the
metrics directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
import torch.nn as nn

from ..io.host_blocks import PinnedHostArena, user_allocator_settings
from ..metadata import ComponentMeta, TensorMeta
from machine.device import DeviceInfo
from core.errors import PlacementError
from core.plugins import load_plugins
from ..naming import Target
from ..report import LoadMeter


@dataclass
class LoadPlan:
    """Everything a mode needs: what to write where, and what to read but drop."""

    targets: list["PlannedTarget"]
    """Tensors to place, in read order."""
    dropped: list[TensorMeta] = field(default_factory=list)
    """Checkpoint tensors not placed (unexpected names, `*_extra_state`): never read by `stream`,
    released at once by `drain`."""

    @property
    def files(self) -> list:
        """Every shard a mode may open, in order."""
        seen: dict = {}
        for t in self.targets:
            for s in t.sources:
                seen.setdefault(s.file, None)
        for s in self.dropped:
            seen.setdefault(s.file, None)
        return list(seen)


@dataclass(frozen=True)
class PlannedTarget:
    """A Target with its destination dtype decided."""

    target: Target
    """Name, sources, shape."""
    dtype: torch.dtype
    """Destination dtype (from the dtype policy)."""

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def sources(self) -> tuple[TensorMeta, ...]:
        return self.target.sources

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.target.shape:
            n *= d
        return n


Adjust = Callable[[torch.Tensor], None]
"""An in-place change to one placed tensor (a merged LoRA delta, say), made before it is installed."""


class PlacementContext:
    """Allocates destinations, installs them into the module, and meters the load."""

    def __init__(self, module: nn.Module, device: torch.device, meter: LoadMeter,
                 host: PinnedHostArena | None = None, adjust: MutableMapping[str, Adjust] | None = None,
                 device_info: DeviceInfo | None = None):
        self.module = module
        self.device = device
        self.device_info = device_info
        """What a probe of `device` found before the load (`LoadOptions.device_info`); None: not probed yet."""
        self.meter = meter
        self.host = host
        """Where CPU destinations come from when they are to be page-locked (None: ordinary pages)."""
        self.adjust = adjust if adjust is not None else {}
        """Target name -> an in-place change applied to its destination once its bytes have landed; each entry
        is removed once applied (the mapping is consumed), so what it holds is freed as the load goes."""

    def allocate(self, planned: PlannedTarget) -> torch.Tensor:
        """The destination, allocated once on the target device (ordinary pages: on the development VM
        transparent huge pages made first touch slower and erratic, see docs/benchmarks.md, Placement modes on
        CPU), or carved from `host`'s pinned blocks."""
        if self.host is not None and self.device.type == "cpu":
            return self.host.empty(tuple(planned.target.shape), planned.dtype)
        return torch.empty(planned.target.shape, dtype=planned.dtype, device=self.device)

    def reserve(self, targets: Iterable[PlannedTarget]) -> int:
        """Size torch's CUDA allocator for the large destinations of `targets` with one block, freed at once.

        The native caching allocator keeps a freed block and carves later
        requests out of it, so each `allocate` after this is a split rather
        than a cudaMalloc (a large share of a load's time with hundreds of
        tensors), and the device holds one segment instead of 639
        rounded ones. Call it with the targets about to be allocated, in
        order, and allocate nothing else meanwhile. Skipped (0) on other
        devices, where the allocator would not split the block, and where
        the device lacks the room: the tensor that does not fit then fails
        by name. Returns the bytes reserved.
        """
        if self.device.type != "cuda" or not _allocator_splits_cached_blocks():
            return 0
        sizes = (-(-p.nbytes // _ALLOCATOR_ROUND) * _ALLOCATOR_ROUND for p in targets)
        total = sum(n for n in sizes if n > _SMALL_POOL_MAX)
        if not total:
            return 0
        try:
            block = torch.empty(total, dtype=torch.uint8, device=self.device)
        except torch.OutOfMemoryError:
            return 0
        del block
        return total

    def place(self, planned: PlannedTarget, tensor: torch.Tensor) -> None:
        """Install `tensor` under the target's name, replacing the meta placeholder, and record it."""
        self.apply_adjust(planned.name, tensor)
        install(self.module, planned.name, tensor)
        self.meter.placed(planned.name, planned.nbytes)

    def apply_adjust(self, name: str, tensor: torch.Tensor) -> None:
        """Apply `name`'s adjustment, if any, to its filled destination. On CUDA a mode's copies may still run
        on a side stream, so the device is synchronised first (only for the tensors adjusted)."""
        change = self.adjust.pop(name, None)
        if change is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        change(tensor)


_ALLOCATOR_ROUND = 512
"""torch's CUDA caching allocator rounds every request up to a multiple of this."""
_SMALL_POOL_MAX = 1 << 20
"""...and serves requests up to this size from separate small segments, never from a large block."""


def _allocator_splits_cached_blocks() -> bool:
    """Whether torch's CUDA allocator serves requests by splitting cached blocks: the native allocator with
    caching on and no max_split_size_mb (which keeps large blocks whole)."""
    conf = user_allocator_settings()
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" or "max_split_size_mb" in conf:
        return False
    return torch.cuda.get_allocator_backend() == "native"


def install(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Swap `tensor` in as parameter or buffer `name` (keeps requires_grad of a parameter)."""
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        old = owner._parameters[leaf]
        owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=old is not None and old.requires_grad)
    elif leaf in owner._buffers:
        owner._buffers[leaf] = tensor
    else:
        raise PlacementError(f"module has no parameter or buffer {name!r}")


@dataclass(frozen=True)
class PlacementCost:
    """What a mode holds beside the model at a load's peak, forecast from headers alone; bytes."""

    staging: int = 0
    """Buffers the mode reads through (host, pinned to a device, plus a device-side conversion buffer)."""
    mapped: int = 0
    """Checkpoint pages resident through mappings at the peak."""
    conversion: int = 0
    """Transient converted copies outside staging."""


class Placement:
    """Base of the placement modes: a `name`, the facts every page and command shows, and one method, `place`.

    Options come as keyword arguments to `__init__`; a mode accepts only the
    ones it declares in `options`, so nothing is dropped silently. The class
    attributes below are the one home of a mode's facts: the CLIs' help, the
    Run page, the fit panel, History, Compare and a retry's offer read them, so
    a new mode is one module (see docs/extending.md).
    """

    name: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    """What the mode does, in one clause ("reads tensor by tensor straight into place")."""
    typical_footprint: ClassVar[float] = 1.0
    """A load's usual peak over the model's bytes (`footprint_ratio`): what the help quotes, and the order a retry
    after running out of memory offers cheaper modes in; the job's own forecast is `forecast_cost`'s."""
    uses_mmap: ClassVar[bool] = False
    """Whether its reads go through mmap views of the shards (slow on unified memory: `mode_warning`)."""
    glyph: ClassVar[str] = "·"
    """The line the History table draws before the mode's name, the dash of Compare in one character."""
    dash: ClassVar[tuple[int, ...]] = ()
    """Compare's dash pattern (stroke, gap, ...) for the mode's first job; () for none of its own."""
    forecast_reads_memory: ClassVar[bool] = False
    """Whether `forecast_cost` onto CUDA reads the machine's state now (free memory, the page cache), so the
    forecast is not remembered."""

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = ", ".join(self.options) or "none"
            raise PlacementError(
                f"placement mode {self.name!r} does not take option(s) {', '.join(unknown)}; accepted: {accepted}"
            )

    @classmethod
    def describe(cls) -> str:
        """The mode in one line: its name, what it does and its usual footprint."""
        return f"{cls.name}: {cls.summary}; about {cls.typical_footprint:g}×"

    def prepare(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        """Set-up that reads no checkpoint byte (e.g. wrapping the empty module); runs before the baseline and the clock."""

    def place(self, plan: LoadPlan, ctx: PlacementContext) -> None:
        """Write every planned target through `ctx`, releasing each source before the load ends."""
        raise NotImplementedError

    def forecast_cost(self, component: ComponentMeta, targets: list[tuple[TensorMeta, torch.dtype]],
                      device: DeviceInfo) -> PlacementCost:
        """What this mode holds beside the model at the peak of loading `targets` (each checkpoint tensor with
        its destination dtype) of `component` onto `device`; `loader.forecast_load` adds the model."""
        raise PlacementError(f"placement mode {self.name!r} has no forecast (it defines no forecast_cost)")


_PLACEMENTS: dict[str, type[Placement]] = {}


def register_placement(name: str) -> Callable[[type[Placement]], type[Placement]]:
    """Class decorator adding a placement mode; a name can be registered once."""

    def decorate(cls: type[Placement]) -> type[Placement]:
        if not (isinstance(cls, type) and issubclass(cls, Placement)):
            raise TypeError(f"placement {name!r} must subclass Placement, got {cls!r}")
        if name in _PLACEMENTS:
            raise ValueError(f"placement mode {name!r} is already registered by {_PLACEMENTS[name].__name__}")
        cls.name = name
        _PLACEMENTS[name] = cls
        return cls

    return decorate


def known_placements() -> list[str]:
    """Every registered mode's name, the plugins' included (`core.plugins`), sorted."""
    load_plugins()
    return sorted(_PLACEMENTS)


def placement_classes() -> list[type[Placement]]:
    """Every registered mode, cheapest first (by `typical_footprint`, then name): the order pages offer them in."""
    load_plugins()
    return sorted(_PLACEMENTS.values(), key=lambda cls: (cls.typical_footprint, cls.name))


def placement_class(name: str) -> type[Placement]:
    """The class of mode `name` (its facts); an unknown name lists the known ones."""
    load_plugins()
    try:
        return _PLACEMENTS[name]
    except KeyError:
        raise PlacementError(f"unknown placement mode {name!r}; known: {', '.join(known_placements())}") from None


def modes_help() -> str:
    """Every mode in one line each, cheapest first, for a `--mode` option's help."""
    return "; ".join(cls.describe() for cls in placement_classes())


def get_placement(name: str, **options) -> Placement:
    """An instance of mode `name`; an unknown name lists the known ones."""
    return placement_class(name)(**options)
