"""What a user's own code (an export script, a dataset generator) is told when it cannot
open a file: the directory a relative path was relative to, and how to name files.

Both run in the directory of their own file (stages/export.py, stages/dataset.py), as
every path in a recipe is relative to the recipe: `open("weights.h5")` beside the script
works, and a path written relative to the workspace root does not.
"""

from __future__ import annotations

import os
from pathlib import Path


def missing_file_hint(exc: BaseException, owner: str, workspace: Path) -> str:
    """`; 'x' was looked up in DIR/ ...` for a FileNotFoundError of a relative path raised
    by the `owner`'s code (running in its file's directory), else ""."""
    name = getattr(exc, "filename", None)
    if not isinstance(exc, FileNotFoundError) or not isinstance(name, str) or os.path.isabs(name):
        return ""
    cwd = os.path.realpath(os.getcwd())
    rel = os.path.relpath(cwd, os.path.realpath(workspace))
    shown = cwd if rel.startswith("..") else "the workspace root" if rel == "." else f"{Path(rel).as_posix()}/"
    return (f"; {name!r} was looked up in {shown}, the {owner}'s directory (its working directory): put the "
            f"file there or name it from the {owner}, e.g. Path(__file__).parent / {name!r}, and list it in "
            "the recipe's deps: so that changing it rebuilds")
