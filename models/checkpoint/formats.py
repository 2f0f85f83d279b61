"""What a checkpoint is, when it is not something MiniMax H3's generate can run: one line naming what was found.

Community formats reach users as readily as the release: GGUF files under another suffix, packed or
quantized weights (NVFP4, int8 "ConvRot"), pruned DiTs whose layout only remote code understands, single
files of other models.
Each is refused when the job is submitted, from its first bytes, its headers and its configs, never
found out deep in a job or run as a generic skeleton. Nothing here reads a tensor's data.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from core.echo import NAME_LIMIT, echo, echo_name
from loader.metadata import TensorMeta

GGUF_MAGIC = b"GGUF"
"""The first four bytes of a GGUF file."""
PICKLE_STARTS = (b"PK\x03\x04", b"\x80")
"""A zip (torch.save's format) or a bare pickle: never unpickled."""
PACKED_DTYPES = ("U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "U4", "I4")
"""safetensors dtypes a bf16 DiT's weights never have: packed or quantized storage."""
SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "scale", "scales", "weight_global_scale")
"""Tensor names that sit beside packed weights (NVFP4's block scales, an int8 format's per-row scale)."""
DIT_CLASS = "MiniMaxH3Transformer3DModel"


def file_problem(path: Path) -> str | None:
    """A file that is no safetensors file, named by what its first bytes say (GGUF under another suffix, a
    pickle); None otherwise. A `.gguf` file goes to `models.checkpoint.gguf` before this."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return f"{echo_name(path.name)}: cannot be read: {exc.strerror}"
    if head.startswith(GGUF_MAGIC):
        version = int.from_bytes(head[4:8], "little")
        return (f"{echo_name(path.name)}: a GGUF file (version {version}) named as safetensors; a GGUF DiT is read "
                f"by diffusers' GGUF path, which its .gguf suffix selects: rename it {echo_name(path.stem)}.gguf")
    if head.startswith(PICKLE_STARTS):
        return (f"{echo_name(path.name)}: a PyTorch pickle (torch.save's format), which is never unpickled here; use a "
                f"safetensors copy")
    return None


def packed_problem(tensors: Sequence[TensorMeta], where: str) -> str | None:
    """Packed or quantized weights among `tensors` (NVFP4, int8 ConvRot and the like), named, or None."""
    packed = next((t for t in tensors if t.dtype in PACKED_DTYPES and t.name.endswith("weight")), None)
    if packed is None:
        return None
    names = {t.name for t in tensors}
    stem = packed.name.removesuffix("weight")
    scale = next((stem + s for s in SCALE_SUFFIXES if stem + s in names), None)
    beside = f" beside {echo_name(scale)}" if scale else ""
    return (f"{where}: packed or quantized weights: {echo_name(packed.name)} is {packed.dtype} {packed.shape}{beside} "
            f"(NVFP4, int8 ConvRot or another packed format), which diffusers' {DIT_CLASS} cannot take; use the "
            f"bf16 checkpoint")


def dit_config_problem(config: dict, where: str) -> str | None:
    """A DiT `config.json` that names no diffusers class for H3: remote code (`auto_map`) or a pruned layout."""
    if "auto_map" in config:
        return (f"{where}: a layout with remote code (auto_map {echo_name(config['auto_map'])}); Drainboard runs no "
                f"code from a checkpoint and generates with diffusers' {DIT_CLASS} only")
    if config.get("_class_name") != DIT_CLASS:
        hints = ", ".join(k for k in sorted(config) if re.search(r"rank|prun|layout|basis", k))
        found = f"_class_name {echo(config.get('_class_name'), NAME_LIMIT)}" + (f" and {hints}" if hints else "")
        return (f"{where}: a DiT that diffusers has no class for ({found}; a pruned layout?); generate needs "
                f"diffusers' {DIT_CLASS}")
    return None
