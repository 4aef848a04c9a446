"""The remote cache on any fsspec URL: stage records and objects mirrored under `<url>/v1/`,
each download verified before it enters the local store, create-only uploads, signed
records (`cache`); the fsspec backends with deadlines on every call (`backends`); and
retention of the remote (`gc`).
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.remote import name` to its module.
_FACE = {
    "RemoteCache": "cache",
    "collect_remote": "gc",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
