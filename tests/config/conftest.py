from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.cli import run_cli
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.errors import ConfigError


class WorkspaceFactory:
    """Writes a workspace (tpubuild.yaml, recipes, a fake SavedModel dir) under tmp_path."""

    def __init__(self, root: Path):
        self.root = root
        self.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\n")
        (root / "models" / "toy").mkdir(parents=True)
        # Config loading only checks that saved_model.pb exists; no TensorFlow here.
        (root / "models" / "toy" / "saved_model.pb").write_bytes(b"")

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    def errors_of(self, recipe_text: str, name: str = "r") -> list[str]:
        """The error lines of loading the workspace with `recipes/<name>.yaml` written."""
        self.write(f"recipes/{name}.yaml", recipe_text)
        with pytest.raises(ConfigError) as info:
            load_recipes(load_workspace(self.root))
        return info.value.lines()

    def cli(self, *argv: str) -> tuple[int, str, str]:
        """`tpubuild --workspace ROOT ARGV...` in this process: (exit code, stdout, stderr).
        An exception other than SystemExit escapes: that would be a traceback."""
        return run_cli("--workspace", str(self.root), *argv)


@pytest.fixture(name="run_cli")
def run_cli_fixture():
    """`run_cli(*argv)`: tpubuild in this process, as (exit code, stdout, stderr)."""
    return run_cli


@pytest.fixture
def ws(tmp_path: Path) -> WorkspaceFactory:
    return WorkspaceFactory(tmp_path)
