"""The reference H3-family model, its synthetic checkpoints and the generate pipeline.

Importing this package registers the model classes with the loader.
"""

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
