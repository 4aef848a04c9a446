"""Finding the workspace file and the recipe files, for the config layer and the no-op
memo alike (which must see exactly what the config layer sees, or a new recipe could
hide behind a remembered no-op). TensorFlow-free and config-free, so the no-op fast
path imports nothing heavy."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

LOCK_SUFFIX = ".lock.yaml"
WORKSPACE_FILE = "tpubuild.yaml"
STATE_DIR = ".tpubuild"  # tpubuild's own files (dep file, stat cache, locks) live here
DEFAULT_RECIPE_GLOBS = ("recipes/*.yaml",)


def find_workspace_file(start: Path) -> Path | None:
    """The nearest tpubuild.yaml in `start` or a parent directory."""
    directory = Path(os.path.abspath(start))
    for candidate in (directory, *directory.parents):
        path = candidate / WORKSPACE_FILE
        if path.is_file():
            return path
    return None


def workspace_file_for(start: Path, override: Path | None) -> Path | None:
    """The workspace file `--workspace` names (a directory or a file), else the nearest
    one upward (the fast paths' lookup); None when there is none or the name cannot be
    used: the full load (config/workspace.py load_workspace) then says why."""
    if override is None:
        return find_workspace_file(start)
    try:
        path = override / WORKSPACE_FILE if override.is_dir() else override
        return path if path.is_file() else None
    except (OSError, ValueError):  # a null byte, an over-long name
        return None


def lock_file_of(recipe_file: Path) -> Path:
    """`recipes/toy.yaml` -> `recipes/toy.lock.yaml`, one per recipe (no merge conflicts)."""
    name = recipe_file.name
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            return recipe_file.with_name(name[: -len(suffix)] + LOCK_SUFFIX)
    return recipe_file.with_name(recipe_file.stem + LOCK_SUFFIX)


_EXTENDS = re.compile(r"""^extends:[ \t]*(?:"([^"\n]*)"|'([^'\n]*)'|([^\s#'"][^#\n]*?))[ \t]*(?:#.*)?$""", re.M)


def extends_chain(recipe_file: Path, limit: int = 32) -> list[Path]:
    """The recipe file and the bases its top-level `extends:` line names, read without a
    YAML parser (`build --check`'s quick path, engine/quickcheck.py). A guess: where it is
    wrong (an `extends` written another way), the files hash differently from what the
    lock file recorded and the full check decides."""
    chain = [recipe_file]
    while len(chain) < limit:
        try:
            found = _EXTENDS.search(chain[-1].read_text())
        except (OSError, UnicodeDecodeError):
            break
        if found is None:
            break
        base = (chain[-1].parent / next(g for g in found.groups() if g is not None).strip()).resolve()
        if base in chain:
            break
        chain.append(base)
    return chain


def recipe_matches(root: Path, pattern: str, workspace_file: Path) -> list[str]:
    """The files a recipes glob matches that can be recipes: not a lock file, and not the
    workspace file itself (`recipes: ["*.yaml"]` at the root matches tpubuild.yaml)."""
    own = os.path.realpath(workspace_file)
    return [match for match in glob.glob(str(Path(root) / pattern), recursive=True)
            if os.path.isfile(match) and not match.endswith(LOCK_SUFFIX) and os.path.realpath(match) != own]


def discover_files(root: Path, patterns: list[str], workspace_file: Path) -> list[Path]:
    """Recipe files matched by `patterns` (relative to `root`), resolved and sorted."""
    return sorted({Path(match).resolve() for pattern in patterns for match in recipe_matches(root, pattern,
                                                                                             workspace_file)})
