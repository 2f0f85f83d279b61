"""The reference H3-family model, its synthetic checkpoints and the generate pipeline.

Importing this package registers the model classes with the loader, and sets
`HF_HUB_OFFLINE=1`: diffusers and transformers read every file from local folders
and never contact a model hub.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

from . import registry as _registry  # noqa: F401  (registers builders with the loader)
from .config import PROFILES, Profile, ProfileError, get_profile
from .params import GenerateParams, GenerateParamsError, ModelSpec, validate_params
from .pipeline import STAGES, GenerateResult, PipelineEvent, run_generate
from .synth import SynthReport, synth_checkpoint

__all__ = [
    "PROFILES",
    "STAGES",
    "GenerateParams",
    "GenerateParamsError",
    "GenerateResult",
    "ModelSpec",
    "PipelineEvent",
    "Profile",
    "ProfileError",
    "SynthReport",
    "get_profile",
    "run_generate",
    "synth_checkpoint",
    "validate_params",
]
