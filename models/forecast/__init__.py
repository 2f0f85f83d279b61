"""What a generate run will hold, stage by stage, before any weight is read.

Reads configs, safetensors headers, the local tokenizer, the input images'
headers and a reference clip's header (one frame decoded, for its rotation)
only. Per computing stage of the workflow's plan (`models.run.workflows.
stage_plan`: every block that reads weights, with what is resident around it),
the forecast adds, above the process's own footprint once the pipeline is built
(what `bench/bench_generate.py` measures against; the process itself is learned from the machine's own
jobs, `models.forecast.process_size`):

- weights resident under the resolved policy (header sizes at the run's dtype,
  H3's fp32 modules kept fp32, the text encoder's vision tower only where the
  workflow reads it, the video VAE at fp32 when `vae_dtype` says so, the DiT at
  its quantized size under `quantize`; with `sequential_components` the plan's
  resident components, otherwise all the workflow's), split into host and device;
- the stage's working set: `fixed + per_unit * driver`, where the driver is
  the stage's size in its own unit (text and image rows x hidden x hidden states
  kept, encoded image pixels, packed sequence rows x DiT widths, output pixels,
  audio samples) and the two constants per stage are fitted on measured runs
  (`fitted.CPU`, `fitted.CUDA`: each names its command and its table in docs/benchmarks.md);
- what earlier stages left behind (embeddings, latents, decoded frames, audio);
- on CUDA, the costs outside tensors: the context (process level), the
  cuBLAS/cuDNN workspaces, and each stage's reserve (`fitted.CUDA`).

Each stage reports host, device and their sum: the sum is what a unified-memory
machine pays. Offloaded weights count on the host.

The modules, by what they forecast: `weights` (each component's bytes), `drivers` (each stage's size from the
request and its inputs), `lever_memory` (what the speed levers add), `stages` (the run, stage by stage, and a
parallel run's ranks), `policy` (the fit-aware offload policy's input); `fitted` holds the fitted constants. Learned
from this machine's history: `eta` (seconds per stage), `process_size` (a job's own process).
"""

from .drivers import clip_text_rows, count_prompt_tokens, reference_clip
from .lever_memory import lever_memory_unknown
from .policy import policy_fit, resolve_for_generate
from .stages import GenerateForecast, StageForecast, forecast_generate, packed_rows
from .weights import pinned_component_bytes, weight_bytes

__all__ = ["GenerateForecast", "StageForecast", "clip_text_rows", "count_prompt_tokens", "forecast_generate",
           "lever_memory_unknown", "packed_rows", "pinned_component_bytes", "policy_fit", "reference_clip",
           "resolve_for_generate", "weight_bytes"]
