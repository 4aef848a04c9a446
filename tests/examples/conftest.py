"""The example workspace at the repository root, with every recipe's model exported once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.cli import REPO
from tpubuild.config.recipe import Recipe, load_recipes
from tpubuild.config.workspace import load_workspace


def example_recipes() -> dict[str, Recipe]:
    """Every recipe of the repository's example workspace, by name (TensorFlow-free)."""
    return {r.name: r for r in load_recipes(load_workspace(override=REPO))}


def load_script(path: Path, name: str):
    """Import a script by file path, as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"tpubuild_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking `recipe_name` runs once per example recipe."""
    if "recipe_name" in metafunc.fixturenames:
        metafunc.parametrize("recipe_name", sorted(example_recipes()))


@pytest.fixture(scope="session")
def recipes() -> dict[str, Recipe]:
    return example_recipes()


@pytest.fixture(scope="session")
def script():
    """`script(path, name)` imports an example script as a module."""
    return load_script


@pytest.fixture(scope="session")
def exported(example_exports: dict[str, Path]) -> dict[str, Path]:
    """Each recipe's SavedModel, made by its export script in an empty directory (the
    exports shared by the suite, tests/conftest.py: recipes with one export share it)."""
    from tests.example_workspace import example_exports as exports

    return {name: example_exports[key] for key, (_, _, names) in exports().items() for name in names}
