"""The example workspace at the repository root, with every recipe's model exported once."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpubuild.config.recipe import Recipe, load_recipes
from tpubuild.config.workspace import load_workspace

REPO = Path(__file__).resolve().parents[2]


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
def exported(recipes: dict[str, Recipe], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each recipe's SavedModel, made by its export script in an empty directory."""
    out = {}
    for name, recipe in recipes.items():
        export = recipe.canonical["model"]["export"]
        module = load_script(recipe.root / export["script"], name)
        target = tmp_path_factory.mktemp(name) / "saved_model"
        target.mkdir()  # the stage contract: the output directory exists and is empty
        getattr(module, export["function"])(str(target))
        out[name] = target
    return out


@pytest.fixture(scope="session")
def built_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example workspace as a fresh clone has it after one `tpubuild build`: its files
    (lock files included) committed on a `main` branch of its own git repository, every
    recipe built. Built once per test run, also under xdist (its workers share the run's
    temp directory; the first builds, under a file lock): about a minute of CPU. Tests copy
    it before changing anything."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's directory, above each worker's own
    root = shared / "examples_built" / "ws"
    with FileLock(str(shared / "examples_built.lock")):
        if not (root.parent / "built").exists():
            _build_examples(root)
            (root.parent / "built").write_text("")
    return root


def _build_examples(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)  # a build interrupted in an earlier attempt of this run
    root.mkdir(parents=True)
    for name in ("tpubuild.yaml", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for folder in ("recipes", "schemas"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "tpubuild", "build"], cwd=root, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    # Committed after the build, as a clone of a repository whose lock files are current.
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "examples"]):
        subprocess.run(["git", *args], cwd=root, check=True, env=git, capture_output=True)
