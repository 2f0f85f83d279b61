"""MiniMax H3 in Drainboard: components filled by the loader, synthetic checkpoints, the generate pipeline.

The computation is diffusers' (`MiniMaxH3ModularPipeline`) and transformers'
(Qwen3-VL); this package adapts it. diffusers and transformers are imported
where they are used (`models.checkpoint.components`, `models.synth.writer`, inside a run).
Importing it changes no process-wide setting: the entry points make those
(`loader.process.configure_process`, which keeps the hub offline).
"""

_EXPORTS = {"GenerateForecast": "forecast", "forecast_generate": "forecast", "GenerateParams": "request.params",
            "GenerateParamsError": "request.params", "ModelSpec": "request.params", "validate_params": "request.params",
            "GenerateResult": "run.results", "PipelineEvent": "run.results", "run_generate": "run.pipeline"}
"""Exported name -> its module, imported on first use so that `import models.request.cli_args` loads no torch."""


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = ["GenerateForecast", "GenerateParams", "GenerateParamsError", "GenerateResult", "ModelSpec",
           "PipelineEvent", "forecast_generate", "run_generate", "validate_params"]
