"""The content-addressed local cache, `<cache_dir>/v1/`: objects, stage records under this
user's MAC, checkouts, dep files and per-process sessions (`store`, with its parts `objects`,
`entries`, `checkouts`, `scan`, `depfiles`; `layout`, `sessions`, `record_mac`), the SQLite index of the workspaces that use it (`index`, with what each
build used: `registration`), and garbage collection (`gc`). Safe to share between
workspaces and users who trust each other (docs/shared-cache.md).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
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
__getattr__, __dir__ = lazy(__name__, _FACE)
