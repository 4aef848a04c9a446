"""Lock files, `<recipe>.lock.yaml`: what decided a recipe's build, written in a fixed layout
and read back line by line (`lockfile`); lock files no build wrote, found and named
(`shape`); `build --check` answered from lock files alone (`quickcheck`); and the no-op
memo that lets an up-to-date build answer without loading a recipe (`memo`).
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.lock import name` to its module.
_FACE = {
    "MEASURED": "lockfile",
    "NoopMemo": "memo",
    "defect": "shape",
    "lock_document": "lockfile",
    "lock_text": "lockfile",
    "older_layout": "lockfile",
    "parse_lock_keys": "lockfile",
    "planning_digest": "quickcheck",
    "quick": "memo",
    "quick_check": "quickcheck",
    "read_lock": "lockfile",
    "read_lock_keys": "lockfile",
    "rewrite_reason": "shape",
    "same_keys": "lockfile",
    "stale_output": "shape",
    "well_formed": "shape",
    "write_lock": "lockfile",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
