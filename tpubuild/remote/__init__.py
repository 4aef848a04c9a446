"""The remote cache on any fsspec URL, on the transport (tpubuild/transport/): stage
records and objects under `<url>/v1/`, each download verified, create-only uploads, signed
records (`cache`: it knows no local store); the moves of records and objects between the
local store and it (`transfer`: the layered cache, engine/cache.py, and Ray's nodes call
them); and retention of the remote (`gc`).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "RemoteCache": "cache",
    "collect_remote": "gc",
    "fetch_entry": "transfer",
    "fetch_objects": "transfer",
    "push_entry": "transfer",
    "push_objects": "transfer",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
