"""Discovered inputs: the workspace source files a stage's user code imported.

In a fresh worker process (one per run of a stage that runs user code), every source
file Python reads through its import system is hashed *as it is read*, so the record
holds the content that was actually executed even if the file is edited while the stage
runs; the next build compares it with the file's current content. Bytecode caches are
sent to an empty directory (PYTHONPYCACHEPREFIX) so no module is loaded from a `.pyc`
whose source was never read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tpubuild.engine.hashing import hash_bytes, hash_file

_recorded: dict[str, str] = {}
_root: str | None = None


def _excluded_roots() -> list[str]:
    """Installed code is not a workspace input, even when a venv lives in the workspace."""
    import tpubuild

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.abspath(tpubuild.__file__))}
    return sorted(os.path.join(os.path.realpath(r), "") for r in roots)


def _workspace_rel(path: str) -> str | None:
    assert _root is not None
    real = os.path.realpath(path)
    if not real.startswith(_root) or any(real.startswith(r) for r in _excluded):
        return None
    if f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real:
        return None
    return Path(os.path.relpath(real, _root)).as_posix()


_excluded: list[str] = []


def install(workspace: Path) -> None:
    """Record every workspace source file read by the import system from now on."""
    global _root, _excluded
    import importlib.machinery

    _root = os.path.join(os.path.realpath(workspace), "")
    _excluded = _excluded_roots()
    loader = importlib.machinery.SourceFileLoader
    original = loader.get_data

    def get_data(self: object, path: str) -> bytes:
        data = original(self, path)
        if path.endswith(".py"):
            rel = _workspace_rel(path)
            if rel is not None:
                _recorded[rel] = hash_bytes(data)
        return data

    loader.get_data = get_data  # type: ignore[method-assign]


def discovered() -> dict[str, str]:
    """Workspace file -> hash of the content that was imported, for this process so far;
    modules loaded some other way (extension modules) are hashed as they are now."""
    found = dict(_recorded)
    if _root is None:
        return found
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        rel = _workspace_rel(path)
        if rel is not None and rel not in found and os.path.isfile(path):
            found[rel] = hash_file(path)
    return dict(sorted(found.items()))
