"""Lock files, `<recipe>.lock.yaml`: what decided a recipe's build, written in a fixed layout
and read back line by line (`lockfile`); lock files no build wrote, found and named
(`shape`); `build --check` answered from lock files alone (`quickcheck`); and the no-op
memo that lets an up-to-date build answer without loading a recipe (`memo`).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "MEASURED": "lockfile",
    "NoopMemo": "memo",
    "defect": "shape",
    "lock_document": "lockfile",
    "lock_text": "lockfile",
    "memo_entries": "memo",
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
__getattr__, __dir__ = lazy(__name__, _FACE)
