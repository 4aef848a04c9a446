"""Published versions, `<output_dir>/<recipe>/<N>/` in TF Serving's layout: numbers reserved
durably, versions written and checked in a temp directory and renamed into place, pruning,
repair, clean (`versions`); the target versions beside them (`targets`); and the newest
version updated in place when a build re-measured the same model (`refresh`).
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.publish import name` to its module.
_FACE = {
    "Holding": "versions",
    "MANIFEST": "targets",
    "OWN_FILES": "versions",
    "check_manifest": "versions",
    "foreign_in_newest": "versions",
    "newest_holding": "versions",
    "newest_matching": "versions",
    "newest_same_model": "versions",
    "prune": "versions",
    "publish": "versions",
    "published_versions": "versions",
    "read_manifest": "versions",
    "remove_published": "versions",
    "repair_newest": "versions",
    "repair_version": "versions",
    "reservation_file": "versions",
    "split_by_target": "targets",
    "update_version": "refresh",
    "version_numbers": "versions",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
