from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


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


@pytest.fixture
def ws(tmp_path: Path) -> WorkspaceFactory:
    return WorkspaceFactory(tmp_path)
