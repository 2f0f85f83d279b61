"""Dtypes: the safetensors names, their torch dtypes, and the per-parameter dtype policy.

The policy decides the target dtype of every parameter before any byte is
read: a default (None keeps the checkpoint's dtype), per-name regex overrides,
and the model's `keep_fp32` patterns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import torch

from core.dtype_names import dtype_aliases
from core.errors import PlacementError

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors header dtype name -> torch dtype (the ones torch can hold)."""



def itemsize(safetensors_dtype: str) -> int:
    """Bytes per element of a safetensors dtype name (which must be known)."""
    return SAFETENSORS_DTYPES[safetensors_dtype].itemsize


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """A name of the one vocabulary (`core.dtype_names`: `bf16`, `bfloat16`, ...) or a torch dtype; None stays None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    aliases = dtype_aliases()
    try:
        return getattr(torch, aliases[value.lower()])
    except KeyError:
        raise PlacementError(f"unknown dtype {value!r}; known: {', '.join(sorted(aliases))}") from None


@dataclass(frozen=True)
class DtypePolicy:
    """Target dtype of each parameter, from its (target) name and checkpoint dtype."""

    default: torch.dtype | None = None
    """Dtype of floating parameters; None keeps the checkpoint's dtype."""
    overrides: tuple[tuple[re.Pattern, torch.dtype], ...] = field(default=())
    """(regex, dtype) pairs searched in order; the first match wins over everything else."""
    keep_fp32: tuple[re.Pattern, ...] = field(default=())
    """Regexes of floating parameters that stay float32 (from the model registry)."""

    @classmethod
    def build(
        cls,
        default: str | torch.dtype | None = None,
        overrides: Mapping[str, str | torch.dtype] | None = None,
        keep_fp32: tuple[str, ...] = (),
    ) -> "DtypePolicy":
        """Parse user-facing values; a bad regex or dtype raises PlacementError naming it."""
        compiled = []
        for pattern, dtype in (overrides or {}).items():
            compiled.append((_compile(pattern, "dtype override"), parse_dtype(dtype)))
        return cls(
            default=parse_dtype(default),
            overrides=tuple(compiled),
            keep_fp32=tuple(_compile(p, "keep_fp32 pattern") for p in keep_fp32),
        )

    def target_dtype(self, name: str, checkpoint_dtype: torch.dtype) -> torch.dtype:
        """The dtype `name` is placed in. Integer and bool tensors always keep their dtype."""
        if not checkpoint_dtype.is_floating_point:
            return checkpoint_dtype
        for pattern, dtype in self.overrides:
            if pattern.search(name):
                return dtype
        if any(p.search(name) for p in self.keep_fp32):
            return torch.float32
        return self.default or checkpoint_dtype


def _compile(pattern: str, what: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise PlacementError(f"{what} {pattern!r} is not a valid regex: {exc}") from None
