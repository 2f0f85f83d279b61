"""The one dtype vocabulary of every CLI, the job spec and the loader, torch-free.

Every command accepts the short and the long names (`bf16` and `bfloat16`, `fp16`, `float16` and `half`,
`fp32`, `float32` and `float`) and prints the long one, torch's own (`bfloat16`), which stored job specs
and load reports carry.
"""

from __future__ import annotations

from core.echo import echo

DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""The names printed, torch's (`str(torch.bfloat16)` without `torch.`)."""
DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
"""Every accepted name (lower case) -> the name printed."""
DTYPE_HELP = "bfloat16, float16 or float32 (bf16, fp16, fp32 too)"
"""How a `--dtype` option's help names its values."""


def dtype_name(text: str) -> str:
    """The printed name of any accepted dtype name; ValueError naming the known ones otherwise."""
    name = DTYPE_ALIASES.get(text.strip().lower()) if isinstance(text, str) else None
    if name is None:
        raise ValueError(f"unknown dtype {echo(text)}; known: {', '.join(DTYPE_ALIASES)}")
    return name
