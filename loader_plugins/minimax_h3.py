"""MiniMax H3's diffusers / transformers classes for `python -m loader`.

The one module that knows both the loader and `models`: the loader's command line
finds it by listing the `loader_plugins` namespace (`loader.model_registry.load_builder_plugins`)
and calls `register_builders()`, so the loader itself names no model package.
"""

from models.components import register_builders

__all__ = ["register_builders"]
