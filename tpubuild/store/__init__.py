"""The content-addressed local cache, `<cache_dir>/v1/`: objects, stage records under this
user's MAC, checkouts and per-process sessions (`store`, `layout`, `sessions`,
`record_mac`), the SQLite index of the workspaces that use it (`index`, with what each
build used: `registration`), and garbage collection (`gc`). Safe to share between
workspaces and users who trust each other (docs/shared-cache.md).
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.store import name` to its module.
_FACE = {
    "GcResult": "gc",
    "LAYOUT": "layout",
    "Store": "store",
    "choose_removals": "gc",
    "collect": "gc",
    "register": "registration",
    "workspace_references": "gc",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
