"""Discovered inputs: the source files a stage's user code imported, and where it looked.

In a fresh worker process (one per run of a stage that runs user code), every source
file Python reads through its import system is hashed *as it is read*, so the record
holds the content that was actually executed even if the file is edited while the stage
runs; the next build compares it with the file's current content. The user's own modules
(those recorded) are always compiled from the source just read and hashed, never loaded
from or written to a bytecode cache, so no module of theirs runs from a `.pyc` whose
source was never read and no `__pycache__` appears in the workspace. Installed code
(TensorFlow, Keras ...) keeps its bytecode caches: it is keyed by version, not by
content, and compiling it from source in every export worker cost seconds per build
(`import tensorflow, keras`: 6 s with its caches, 15 s without, on 2 cores).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from tpubuild.digests import ABSENT, hash_bytes, hash_file, normalized_dist

_recorded: dict[str, str] = {}
_root: str | None = None


def _excluded_roots() -> list[str]:
    """Installed code is not a workspace input, even when a venv lives in the workspace."""
    import tpubuild

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.abspath(tpubuild.__file__))}
    return sorted(os.path.join(os.path.realpath(r), "") for r in roots)


def _installed(real: str) -> bool:
    """Code of the interpreter, an installed distribution or tpubuild: keyed as the
    toolchain and code digests, not as a discovered input."""
    return any(real.startswith(r) for r in _excluded) or \
        f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real


def _workspace_rel(path: str) -> str | None:
    assert _root is not None
    real = os.path.realpath(path)
    if not real.startswith(_root) or _installed(real):
        return None
    return Path(os.path.relpath(real, _root)).as_posix()


def _input_name(path: str) -> str | None:
    """How a source file read by user code is recorded: workspace-relative inside the
    workspace; absolute for code outside it that no distribution installed (a PYTHONPATH
    directory, an editable install's source tree), which is as much an input; None for
    installed code."""
    rel = _workspace_rel(path)
    if rel is not None:
        return rel
    real = os.path.realpath(path)
    if _installed(real):
        return None
    # Only code found through the search path: AutoGraph's generated modules (temporary
    # files it imports by location, with random names) are the stage's own doing.
    for entry in sys.path:
        if isinstance(entry, str) and entry and os.path.isdir(entry):
            root = os.path.join(os.path.realpath(entry), "")
            if real.startswith(root) and not _installed(root):
                return real
    return None


def _imported_by_user_code() -> bool:
    """Whether the import statement being resolved is in a workspace file or another
    source file no distribution installed (the innermost frame outside importlib)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib") or f"{os.sep}importlib{os.sep}" in filename:
            frame = frame.f_back
            continue
        return not filename.startswith("<") and _input_name(filename) is not None
    return False


class _NegativeLookups:
    """A sys.meta_path finder that finds nothing and records where Python is about to
    look in the workspace: each `<dir>/<name>.py` and `<dir>/<name>/__init__.py` that does
    not exist, in every workspace directory of the search path up to the one holding the
    module. A file created there later would be imported instead (or at last), so its
    absence is an input, as compilers' dep files record the include paths they tried."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if not _imported_by_user_code():
            # What TensorFlow and other installed packages look for depends on what else is
            # installed (optional dependencies): recording it would make every key differ
            # between two environments with the same toolchain. The user's imports are the
            # user's inputs; an installed package's are part of that package.
            return None
        tail = name.rpartition(".")[2]
        for entry in list(path if path is not None else sys.path):
            if not isinstance(entry, str) or not entry or not os.path.isdir(entry):
                continue  # path hooks' markers (editable installs), zip files, the cwd
            directory = os.path.abspath(entry)
            if _workspace_rel(os.path.join(directory, "x")) is None:
                continue  # outside the workspace: an installed location or the caller's
            base = os.path.join(directory, tail)
            candidates = (base + ".py", os.path.join(base, "__init__.py"))
            if any(os.path.exists(c) for c in candidates) or os.path.isdir(base):
                break  # found here: the directories after it are not reached
            for candidate in candidates:
                rel = _workspace_rel(candidate)
                if rel is not None:
                    _recorded.setdefault(rel, ABSENT)
        return None


_excluded: list[str] = []


def install(workspace: Path) -> None:
    """Record every workspace source file read by the import system from now on."""
    global _root, _excluded
    import importlib.machinery

    _root = os.path.join(os.path.realpath(workspace), "")
    _excluded = _excluded_roots()
    loader = importlib.machinery.SourceFileLoader
    original = loader.get_data

    def get_data(self: Any, path: str) -> bytes:
        data = original(self, path)
        if path.endswith(".py"):
            name = _input_name(path)
            if name is not None:
                _recorded[name] = hash_bytes(data)
        return data

    original_get_code = loader.get_code

    def get_code(self: importlib.machinery.SourceFileLoader, fullname: str):  # type: ignore[no-untyped-def]
        path = self.get_filename(fullname)
        if path.endswith(".py") and _input_name(path) is not None:
            # A recorded input: compiled from the bytes get_data hashes, bypassing
            # __pycache__ both ways (importlib's SourceLoader.get_code would read a .pyc
            # whose source it never opens, and write one into the workspace).
            return self.source_to_code(self.get_data(path), path)
        return original_get_code(self, fullname)

    loader.get_data = get_data  # type: ignore[method-assign]
    loader.get_code = get_code  # type: ignore[method-assign, assignment]
    sys.meta_path.insert(0, _NegativeLookups())  # type: ignore[arg-type]


# Distributions whose versions every key already holds (keys/stage.py toolchain).
_TOOLCHAIN_DISTS = frozenset({"tensorflow", "tensorflow-cpu", "tf-nightly", "numpy", "protobuf", "tpubuild"})


def _imported_distributions(sources: list[str]) -> dict[str, str]:
    """`dist:<name>` -> version for each installed distribution the user's own files
    import by name (Keras, keras-hub, tensorflow_text ...): upgrading one reruns the stage.
    Only the packages the user's code names, not what they import in turn: those follow
    from the named package's version (and TensorFlow's, which every key holds), and keying
    them would tie every key to each patch release of TensorFlow's dependencies."""
    import ast
    from importlib import metadata

    named: set[str] = set()
    for path in sources:
        try:
            tree = ast.parse(open(path, "rb").read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named.add(node.module.split(".")[0])
    owners = metadata.packages_distributions()
    found: dict[str, str] = {}
    for name in sorted(named):
        module = sys.modules.get(name)
        # A namespace package (orbax, google) has no __file__, only its directories.
        where: str | None = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), None)
        if not where or not _installed(os.path.realpath(where)):
            continue  # not imported, or the workspace's own module of that name
        for dist in owners.get(name, []):
            key = normalized_dist(dist)
            if key in _TOOLCHAIN_DISTS:
                continue
            try:
                found[f"dist:{key}"] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
    return found


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
        name = _input_name(path)
        if name is not None and (found.get(name) in (None, ABSENT)) and os.path.isfile(path):
            found[name] = hash_file(path)
    sources = [name if os.path.isabs(name) else os.path.join(_root, name)
               for name, digest in found.items() if digest != ABSENT and name.endswith(".py")]
    found.update(_imported_distributions(sources))
    return dict(sorted(found.items()))
