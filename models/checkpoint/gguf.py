"""A GGUF DiT: MiniMax H3's single file in the reference layout, quantized (Q8_0, Q4_K, ...), kept quantized.

The GGUFs users download are derived from Comfy-Org's single files, so they carry the reference names
(`models.checkpoint.single_file`). diffusers loads them through its public API, `from_single_file` with a
`GGUFQuantizationConfig`: it converts the names, splits the fused qkv and swaps the gated halves on the
packed blocks, and runs each Linear on its quantized weight (dequantized per call, at `compute_dtype`).
Drainboard hands that call the file and the DiT's config (the model folder's `transformer/config.json`), and
does the rest: refusing a file it cannot run at submit (from the header, `loader.gguf_header`), counting the
DiT's real bytes in the forecast, reading the very file that was checked, and never contacting a hub.

This path is diffusers' loader, not Drainboard's: the file's tensors are read into host memory whole (about
the quantized size), then the module moves to the device. It needs the optional `gguf` package
(`requirements-gguf.txt`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from core.echo import echo_name
from core.errors import CheckpointError, DrainboardError
from loader.gguf_header import UNQUANTIZED, GgufHeader, read_gguf_header
from loader.roots import ModelRoots

from .single_file import diffusers_name, layout_problem

RUNNABLE = ("F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K",
            "IQ4_NL", "IQ4_XS")
"""The GGML types diffusers 0.42's GGUF path can run: F32 and F16 as plain tensors, the rest dequantized
per call (its `dequantize_functions`; a test holds this list to diffusers' own)."""
EXTRA = "requirements-gguf.txt"
MODE = "diffusers-gguf"
"""What a GGUF DiT's load report calls its placement (diffusers' loader, not one of Drainboard's modes)."""


def gguf_installed() -> bool:
    """Whether the optional `gguf` package diffusers' GGUF path needs can be imported."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def gguf_problem(path: Path, config: dict, roots: ModelRoots | None = None) -> str | None:
    """Why the GGUF file at `path` cannot be the DiT of the model `config` describes, in one line, or None:
    from its header alone."""
    name = echo_name(path.name)
    if not path.is_file():
        return f"{name}: not a file (a single-file DiT is one .safetensors or .gguf file)"
    try:
        header = read_gguf_header(path, roots)
    except DrainboardError as exc:
        return exc.messages()[0]
    problem = header_problem(header, config)
    if problem is None and not gguf_installed():
        problem = (f"{name}: a GGUF DiT needs the optional gguf package, which is not installed: "
                   f"pip install -r {EXTRA}")
    return problem


def header_problem(header: GgufHeader, config: dict) -> str | None:
    """A quant type diffusers cannot run, or tensors that are no DiT of the model `config` describes."""
    return runnable_problem(header) or layout_problem(echo_name(header.path.name), header.tensors, config)


def runnable_problem(header: GgufHeader) -> str | None:
    """The first tensor whose quant type diffusers cannot run, named with the types it can, or None."""
    bad = next((t for t in header.tensors if t.quant_type not in RUNNABLE), None)
    if bad is None:
        return None
    return (f"{echo_name(header.path.name)}: tensor {echo_name(bad.name)} is {bad.quant_type}, a quant type diffusers' "
            f"GGUF path cannot run (it runs {', '.join(RUNNABLE)})")


def held_bytes(path: Path, keep_fp32: tuple[str, ...], dtype_bytes: int) -> Iterator[int]:
    """Each tensor's bytes as diffusers' GGUF load holds them: quantized ones packed as on disk, F32 and F16
    at the run's dtype (`dtype_bytes`), and in the class's float32 modules (`keep_fp32`) every one at float32
    (diffusers dequantizes those)."""
    for t in read_gguf_header(path).tensors:
        if any(part in keep_fp32 for part in diffusers_name(t.name).split(".")):
            yield t.numel * 4
        elif t.quant_type in UNQUANTIZED:
            yield t.numel * dtype_bytes
        else:
            yield t.nbytes


def load_gguf_dit(config: dict, file: Path, *, device, dtype, qkv_layout: str, roots) -> tuple:
    """The DiT `config` describes (the model folder's `transformer/config.json`, or diffusers' defaults where
    it has none: `models.checkpoint.classes.component_config`) with the GGUF file's weights, quantized, on `device`:
    (module, LoadReport).

    `roots`: where the file must lie. The file diffusers opens is the one the header was read from: a link in
    a private folder to this process's descriptor of it (`/proc/self/fd`), so a file swapped after the check is
    never read; beside it, `config` as the `config.json` diffusers builds from. `dtype` is the compute dtype of
    the quantized Linears and the dtype of the plain tensors."""
    import torch
    from diffusers import GGUFQuantizationConfig, MiniMaxH3Transformer3DModel

    from loader import LoadReport

    if not gguf_installed():
        raise DrainboardError(f"{echo_name(file.name)}: a GGUF DiT needs the optional gguf package: pip install -r {EXTRA}")
    header = read_gguf_header(Path(file), ModelRoots(roots))
    problem = header_problem(header, config)
    if problem is not None:
        raise CheckpointError(problem)
    start = time.perf_counter()
    fd = header.checked.open(echo_name(file.name))
    try:
        with tempfile.TemporaryDirectory(prefix="drainboard-gguf-") as folder:
            link = Path(folder) / "transformer.gguf"  # diffusers picks its GGUF reader by the suffix
            os.symlink(f"/proc/self/fd/{fd}", link)
            (Path(folder) / "config.json").write_text(json.dumps(config))  # the config submit checked the file with
            module = MiniMaxH3Transformer3DModel.from_single_file(
                str(link), config=folder, local_files_only=True, torch_dtype=dtype,
                quantization_config=GGUFQuantizationConfig(compute_dtype=dtype), qkv_layout=qkv_layout)
    finally:
        os.close(fd)
    module = module.to(torch.device(device)).eval()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    placed = sum(t.numel() * t.element_size() for t in module.parameters())
    read = sum(t.nbytes for t in header.tensors)
    report = LoadReport(mode=MODE, device=str(device), tensors_total=len(header.tensors),
                        tensors_placed=len(header.tensors), bytes_placed=placed, bytes_read=read,
                        load_seconds=seconds, throughput_gbps=read / seconds / 1e9 if seconds else 0.0)
    return module, report
