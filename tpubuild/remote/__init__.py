"""The remote cache on any fsspec URL: stage records and objects mirrored under `<url>/v1/`,
each download verified before it enters the local store, create-only uploads, signed
records (`cache`); the fsspec backends with deadlines on every call (`backends`), which
the publish destination (publish/destination.py) uses too; and retention of the remote
(`gc`).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "CHUNK": "backends",
    "ObjectTooLarge": "backends",
    "RemoteCache": "cache",
    "RemoteSetupError": "backends",
    "collect_remote": "gc",
    "open_backend": "backends",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
