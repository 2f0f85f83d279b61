"""MiniMax H3 in Drainboard: components filled by the loader, synthetic checkpoints, the generate pipeline.

The computation is diffusers' (`MiniMaxH3ModularPipeline`) and transformers'
(Qwen3-VL); this package adapts it. Importing it sets `HF_HUB_OFFLINE=1`:
diffusers and transformers read every file from local folders and never
contact a model hub. diffusers and transformers themselves are imported where
they are used (`models.components`, `models.h3synth`, inside a run).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

from .forecast import GenerateForecast, forecast_generate  # noqa: E402
from .params import GenerateParams, GenerateParamsError, ModelSpec, validate_params  # noqa: E402
from .pipeline import GenerateResult, PipelineEvent, run_generate  # noqa: E402

__all__ = ["GenerateForecast", "GenerateParams", "GenerateParamsError", "GenerateResult", "ModelSpec",
           "PipelineEvent", "forecast_generate", "run_generate", "validate_params"]
