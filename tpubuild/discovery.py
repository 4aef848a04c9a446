"""Which files are recipes: the workspace's `recipes:` globs, lock files excluded.

One function shared by the config layer and the no-op memo (which must see exactly the
same set, or a new recipe could hide behind a remembered no-op). TensorFlow-free and
config-free, so the no-op fast path imports nothing heavy."""

from __future__ import annotations

import glob
import os
from pathlib import Path

LOCK_SUFFIX = ".lock.yaml"


def discover_files(root: Path, patterns: list[str]) -> list[Path]:
    """Recipe files matched by `patterns` (relative to `root`), resolved and sorted."""
    found = set()
    for pattern in patterns:
        for match in glob.glob(str(Path(root) / pattern), recursive=True):
            if os.path.isfile(match) and not match.endswith(LOCK_SUFFIX):
                found.add(Path(match).resolve())
    return sorted(found)
