"""File-system helpers the store, publishing and the workspace share: placing a file as a
reflink, copy or checked hard link, and durable renames (`place`); directories walked,
written and removed without following a link, by descriptor (`nofollow`); flock-based locks
with deadlines that name their holder (`flock`), and the workspace's own lock (`wslock`).
They know nothing of stages, keys or recipes.
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.fs import name` to its module.
_FACE = {
    "LockTimeout": "flock",
    "NotAFile": "nofollow",
    "WorkspaceLock": "wslock",
    "fsync_fd": "nofollow",
    "holder": "flock",
    "kind": "nofollow",
    "lstat_at": "nofollow",
    "make_dir": "nofollow",
    "open_dir": "nofollow",
    "open_lock_file": "flock",
    "open_path": "nofollow",
    "open_regular": "place",
    "open_regular_at": "nofollow",
    "opened": "nofollow",
    "place_file": "place",
    "read_regular_at": "nofollow",
    "remove_at": "nofollow",
    "replace_file": "place",
    "try_lock": "flock",
    "unlock": "flock",
    "wait_lock": "flock",
    "walk_regular": "nofollow",
    "write_atomic_at": "nofollow",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
