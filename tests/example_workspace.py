"""The repository's example workspace as a fresh clone has it after one `tpubuild build`,
built once per test run and shared by every package that tests what it builds (the
`built_examples` fixture, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.cli import REPO, tpubuild


@dataclass(frozen=True)
class BuiltExamples:
    """The built workspace (read it; copy it to change it), and what its one build said."""

    root: Path
    document: dict  # `tpubuild build --json`
    stderr: str

    def statuses(self, recipe: str) -> dict[str, str]:
        return {row["stage"]: row["status"] for row in self.document["rows"] if row["recipe"] == recipe}

    def stages(self, recipe: str) -> list[str]:
        """`recipe`'s stages in the order the build listed them."""
        return [row["stage"] for row in self.document["rows"] if row["recipe"] == recipe]

    def warnings(self) -> list[str]:
        """The build's warnings: `<recipe file>: stage <stage>: warning: ...` lines."""
        return [line for line in self.stderr.splitlines() if "warning:" in line]


def build_examples(directory: Path) -> None:
    """`directory/ws`: the example workspace's files (lock files included), every recipe
    built, then committed on a `main` branch of its own git repository, as a clone of a
    repository whose lock files are current; the build's --json document and stderr beside it."""
    root = directory / "ws"
    root.mkdir()
    for name in ("tpubuild.yaml", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for folder in ("recipes", "schemas"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = tpubuild(root, "build", "--json", timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    (directory / "build.json").write_text(done.stdout)
    (directory / "build.err").write_text(done.stderr)
    git = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "examples"]):
        subprocess.run(["git", *args], cwd=root, check=True, env=git, capture_output=True)


def copy_built_examples(root: Path, dest: Path) -> Path:
    """A private copy of the shared built workspace at `dest`, to run commands in or change.
    The shared one is read only: a command run in it (explain-error's scratch directory under
    .tpubuild/) would race with a copy another xdist worker takes."""
    shutil.copytree(root, dest, symlinks=True)
    return dest


def read_built_examples(directory: Path) -> BuiltExamples:
    return BuiltExamples(directory / "ws", json.loads((directory / "build.json").read_text()),
                         (directory / "build.err").read_text())


def example_exports() -> dict[str, tuple[Path, str, list[str]]]:
    """"<script stem>:<function>" -> (script, function, the recipes exporting with it), each
    distinct export of the example workspace once (TensorFlow-free)."""
    from tpubuild.config.recipe import load_recipes
    from tpubuild.config.workspace import load_workspace

    found: dict[str, tuple[Path, str, list[str]]] = {}
    for recipe in load_recipes(load_workspace(override=REPO)):
        export = recipe.canonical["model"].get("export")
        if export:
            key = f"{Path(export['script']).stem}:{export['function']}"
            found.setdefault(key, (recipe.root / export["script"], export["function"], []))[2].append(recipe.name)
    return dict(sorted(found.items()))


def export_examples(directory: Path) -> None:
    """`directory/<script stem>:<function>/`: each export's SavedModel, made by its script
    in an empty directory, as the export stage does."""
    import importlib.util

    for key, (script, function, _) in example_exports().items():
        spec = importlib.util.spec_from_file_location(f"tpubuild_example_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        target = directory / key
        target.mkdir()  # the stage contract: the output directory exists and is empty
        getattr(module, function)(str(target))
