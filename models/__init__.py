"""MiniMax H3 in Drainboard: components filled by the loader, synthetic checkpoints, the generate pipeline.

The computation is diffusers' (`MiniMaxH3ModularPipeline`) and transformers'
(Qwen3-VL); this package adapts it. Importing it sets `HF_HUB_OFFLINE=1`:
diffusers and transformers read every file from local folders and never
contact a model hub. diffusers and transformers themselves are imported where
they are used (`models.components`, `models.h3synth`, inside a run).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

_EXPORTS = {"GenerateForecast": "forecast", "forecast_generate": "forecast", "GenerateParams": "params",
            "GenerateParamsError": "params", "ModelSpec": "params", "validate_params": "params",
            "GenerateResult": "results", "PipelineEvent": "results", "run_generate": "pipeline"}
"""Exported name -> its module, imported on first use so that `import models.request_args` loads no torch."""


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = ["GenerateForecast", "GenerateParams", "GenerateParamsError", "GenerateResult", "ModelSpec",
           "PipelineEvent", "forecast_generate", "run_generate", "validate_params"]
