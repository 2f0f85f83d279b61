"""The forecast's fitted constants, as data. Each set names the command that fits it and the docs/benchmarks.md
table that checks it; how well they hold is that table's, not this module's."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20

CLIP_ENCODE = "vae_encoder.clip"
"""The term of ref2va's `vae_encoder` for its reference clip (its frames go through the VAE's temporal chunks; an
image takes the spatial encoder alone, `vae_encoder`'s own term). The stage holds the larger of the two."""


@dataclass(frozen=True)
class StageTerm:
    """A stage's working set beyond weights and carried outputs: `fixed + per_unit * driver` bytes."""

    fixed: int
    """Bytes whatever the size (kernels' scratch, thread pools, the allocator's first arenas)."""
    per_unit: float
    """Bytes per unit of the stage's driver (`models.forecast.drivers.stage_drivers`)."""


@dataclass(frozen=True)
class CpuFit:
    """What a CPU run holds beyond its tensors' own bytes."""

    terms: dict[str, StageTerm]
    """Stage -> its working set."""
    retained: float
    """Share of the largest earlier working set a stage still holds."""
    retained_weights: float
    """Share of the weights sequential residency released in earlier stages that a stage still holds."""
    noise_floor: int
    """How far one stage's peak moves with nothing in the job changed: a stage's forecast is held to 10 % or this,
    whichever is larger (the test, and the fit's choice of retained shares)."""
    vae_alone: tuple[str, ...]
    """Terms fitted on the video VAE's encode alone rather than on whole runs."""
    fitted_by: str
    """The commands that fit these numbers."""
    checked_in: str
    """Where docs/benchmarks.md holds them against measured runs."""


@dataclass(frozen=True)
class CudaFit:
    """What a CUDA run holds beyond its tensors' own bytes, at real size on one H200."""

    stage_terms: dict[str, StageTerm]
    """Stage -> device bytes it reserves beyond its weights and the workspaces (its working set and the caching
    allocator's reserve over it)."""
    host_frame_bytes: dict[str, float]
    """Decode stage -> host bytes per decoded RGB value (the frames copied off the device and their copies for the
    MP4); on a CPU the stage's term holds them."""
    context: int
    """The CUDA context and torch's loaded kernels, device side, once per process."""
    blas_init_host: int
    """Host memory cuBLAS and cuDNN add when they initialise at the first stage, once per process."""
    workspaces: int
    """cuBLAS, cuBLASLt and cuDNN workspaces, per stage, on the device."""
    group_offload_device_blocks: float
    """DiT blocks a block-level group offload holds on the device beyond the running one (prefetched, not yet
    freed)."""
    group_offload_host_blocks: float
    """Host memory a group-offloaded DiT adds while it runs beyond its pinned copy, in DiT blocks."""
    image_path_host: int
    """Host memory a run conditioned on an image holds from its text stage on beyond a t2va run (the processor's
    image half), once per process."""
    fitted_by: str
    """The commands that fit these numbers."""
    checked_in: str
    """Where docs/benchmarks.md holds them against measured runs."""


CPU = CpuFit(
    terms={
        "text_encoder": StageTerm(16646710, 11.334),
        "denoise.denoise": StageTerm(29916548, 3.7263),
        "decode.video": StageTerm(34968454, 16.8655),
        "decode.audio": StageTerm(66692115, 236.8461),
        "vae_encoder": StageTerm(76591419, 15.33),
        CLIP_ENCODE: StageTerm(119600211, 53.91),
    },
    retained=0.0,
    retained_weights=0.2,
    noise_floor=48 * MiB,
    vae_alone=("vae_encoder", CLIP_ENCODE),
    fitted_by="python bench/fit_generate_forecast.py --fit ROOT=RUN.json ... (the runs of bench/bench_generate.py); "
              "the vae_alone terms: python bench/bench_vae_encode.py ROOT --device cpu",
    checked_in="docs/benchmarks.md: Generate forecast against measured, CPU; Encoding a condition with the video VAE",
)
"""Fitted with torch 2.13.0+cpu, diffusers 0.42.1, transformers 5.25.0, tokenizers 0.23.3 and torchao 0.18.0
installed; other versions move the terms by several MiB."""

CUDA = CudaFit(
    stage_terms={
        "text_encoder": StageTerm(0, 2.0714),
        "denoise.denoise": StageTerm(0, 7.38),
        "decode.video": StageTerm(0, 50.3),
        "decode.audio": StageTerm(0, 2294.0),
        "vae_encoder": StageTerm(770655724, 13.35),
        CLIP_ENCODE: StageTerm(5736823855, 30.87),
    },
    host_frame_bytes={"decode.video": 8.8, "decode.audio": 4.3},
    context=600 * MiB,
    blas_init_host=700 * MiB,
    workspaces=96 * MiB,
    group_offload_device_blocks=2.27,
    group_offload_host_blocks=1.31,
    image_path_host=410 * MiB,
    fitted_by="bench/device_generate.sh (bench/bench_h3_generate.py at real size), checked by python "
              "bench/check_forecast_cuda.py; the vae_encoder terms: python bench/bench_vae_encode.py ROOT --device cuda",
    checked_in="docs/benchmarks.md: Generate forecast against measured, one H200, real size; Encoding a condition "
               "with the video VAE",
)
"""Measured with torch 2.11 (cu130) on one H200."""
