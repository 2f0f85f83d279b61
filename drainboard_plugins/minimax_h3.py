"""MiniMax H3's diffusers / transformers classes for the loader: the one module that knows both.

A plugin (`core.plugins` imports every module of the `drainboard_plugins` namespace): it hands the loader a
deferred registration, run when `python -m loader` is about to load (`loader.model_registry.load_model_builders`),
so the loader names no model package and importing this stays cheap (`models.checkpoint.components` imports torch).
"""

from loader.model_registry import register_builder_source


def register_builders() -> None:
    """Register H3's classes with the loader's model registry (`models.checkpoint.components.register_builders`)."""
    from models.checkpoint.components import register_builders as register

    register()


register_builder_source("minimax_h3", register_builders)
