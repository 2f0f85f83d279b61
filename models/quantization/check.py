"""Whether a DiT quantization can run on a device, asked before a job is queued (torch-free at import).

The Run page and `jobs submit` ask the same question here, so a job the page
warns about is the job submit refuses; `models.quantization.quantize` raises the same
limits when a job is run anyway (a spec written by hand, a device changed
since).
"""

from __future__ import annotations

from importlib.util import find_spec

FP8_COMPUTE = "fp8-compute"
"""The `quantize` value of fp8 compute (dynamic fp8 activations and fp8 weights), a speed lever (`models.speed.levers`)."""
FP8_CAPABILITY = (8, 9)
"""The least CUDA compute capability torchao's fp8 kernels run on (weight-only and fp8 compute)."""
FP8_KINDS = ("fp8", FP8_COMPUTE)
"""The quantizations that need fp8 kernels: weight-only fp8, and fp8 compute (`FP8_COMPUTE`)."""
INSTALL_HINT = "pip install -r requirements-quant.txt"
"""How torchao is installed (a wheel with no dependencies: it never pulls a CUDA torch)."""


def torchao_installed() -> bool:
    return find_spec("torchao") is not None


def cuda_capability(kind: str, index: int | None) -> tuple[int, int] | None:
    """The CUDA device's compute capability, or None off CUDA (or when torch cannot read it)."""
    if kind != "cuda":
        return None
    try:
        import torch

        return tuple(torch.cuda.get_device_capability(index or 0))
    except (RuntimeError, AssertionError, ValueError):
        return None


def quantization_problem(kind: str | None, device: str, capability: tuple[int, int] | None,
                         torchao: bool) -> str | None:
    """Why `kind` cannot run on `device` (CUDA `capability`, None elsewhere), or None when it can."""
    if kind is None:
        return None
    if not torchao:
        return f"{kind} quantization needs torchao, which is not installed here: `{INSTALL_HINT}`"
    if kind in FP8_KINDS and (capability is None or capability < FP8_CAPABILITY):
        has = f"compute capability {capability[0]}.{capability[1]}" if capability else "no CUDA"
        return (f"{kind} needs a CUDA GPU of compute capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or newer; "
                f"{device} has {has} (int8 runs on CPU and CUDA)")
    return None
