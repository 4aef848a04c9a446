"""The workspace every real-model test builds: one export module, its recipes."""

from __future__ import annotations

import shutil
from pathlib import Path


def model_workspace(ws: Path, module: Path, recipes: dict[str, str]) -> Path:
    """`ws` with a tpubuild.yaml, `module` copied to recipes/models/ (the recipes' export
    scripts name it there) and one recipes/<name>.yaml per entry of `recipes`."""
    (ws / "recipes" / "models").mkdir(parents=True)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    shutil.copy(module, ws / "recipes" / "models" / Path(module).name)
    for name, text in recipes.items():
        (ws / "recipes" / f"{name}.yaml").write_text(text)
    return ws
