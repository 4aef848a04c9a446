"""Bytes under names on a remote: the fsspec backends (s3://, gs://) and a shared directory
(file://, opened below its root by descriptor, never through a link: `mount`), each call
under deadlines (`backends`). It knows no stage keys, records or store layout: the remote
cache (remote/) and the publish destinations (publish/) stand on it, each rooting it where
its own layout starts.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "Backend": "backends",
    "NotARegularFile": "backends",
    "ObjectTooLarge": "backends",
    "RemoteSetupError": "backends",
    "open_backend": "backends",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
