"""How one load runs, in one dataclass (as vLLM keeps a load's options in its LoadConfig).

`load_checkpoint(path, LoadOptions(...), module=..., on_tensor=..., probe=...)`: the options say what is read
and how it is placed; the module it fills and the callbacks it reports through are the call's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, MutableMapping

import torch

from machine.device import DeviceInfo

from .naming import MergeRules, RenameRules, SplitRules
from .roots import RootsArg

if TYPE_CHECKING:
    from .placement import Placement
    from .placement.base import Adjust


@dataclass(frozen=True)
class LoadOptions:
    """Every option of one `load_checkpoint`."""

    component: str | None = None
    """The component folder of a model folder (None: the only one, or a component folder or file given)."""
    mode: str | Placement = "stream"
    """A placement name (`loader.known_placements()`) or a placement instance, options and all."""
    device: str | torch.device = "cpu"
    """`cpu`, `cuda`, `cuda:N` or `mps`."""
    device_info: DeviceInfo | None = None
    """What a probe of `device` already found (a job's probe stage), so the placement does not probe again;
    None: probed where needed."""
    dtype: str | torch.dtype | None = None
    """`bf16` / `fp16` / `fp32` or a torch dtype for floating tensors; None keeps the checkpoint's."""
    dtype_overrides: Mapping[str, str | torch.dtype] | None = None
    """Name regex -> dtype, over `dtype` (the model's `keep_fp32` patterns apply too)."""
    rename: RenameRules = None
    """Regex -> replacement rules, applied in order."""
    merges: MergeRules = None
    """A target template -> source regexes concatenated along dim 0."""
    splits: SplitRules = None
    """`SplitRule`s: a renamed tensor cut along dim 0 into several targets, each read from its own byte range."""
    strict: bool = True
    """Missing or unexpected names fail the load before a byte is read."""
    skeleton: bool = False
    """Build a skeleton from the checkpoint's metadata even for a registered class."""
    exclude: Callable[[str], bool] | None = None
    """True for a checkpoint tensor name: never read, and not "unexpected" (the report lists it as excluded)."""
    roots: RootsArg = None
    """Folders every file opened must resolve under (None: the checkpoint's own root)."""
    drop_page_cache: bool | None = None
    """Passed to a placement given by name (`stream` takes it); None keeps the mode's default."""
    pin_host: bool = False
    """CPU destinations in page-locked memory, packed into power-of-two blocks (`loader.io.host_blocks`)."""
    adjust: MutableMapping[str, Adjust] | None = None
    """Target name -> an in-place change applied once its bytes have landed, before it is installed (how a
    model merges a LoRA delta while the weights stream); entries are removed as they are applied."""
