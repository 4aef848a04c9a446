"""Recipe configuration: YAML with line marks, JSON Schema, extends/defaults, semantic
checks and the canonical form that the build engine hashes. TensorFlow-free."""

from __future__ import annotations

__all__ = ["Recipe", "discover", "load_recipes", "load_recipe_file", "load_converter_options_file", "select"]


def __getattr__(name: str):
    # Lazy, because tpubuild.workspace (which recipe.py needs) itself uses config.yamlload.
    if name in __all__:
        from tpubuild.config import recipe

        return getattr(recipe, name)
    raise AttributeError(name)
