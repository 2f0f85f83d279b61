"""The reference H3-family model, its synthetic checkpoints and the generate pipeline.

Importing this package registers the model classes with the loader.
"""

from . import registry as _registry  # noqa: F401  (registers builders with the loader)
from .config import PROFILES, Profile, ProfileError, get_profile
from .synth import SynthReport, synth_checkpoint

__all__ = ["PROFILES", "Profile", "ProfileError", "SynthReport", "get_profile", "synth_checkpoint"]
