"""Where stages run: the pool of worker processes the build loop hands stage requests to
(`pool`), the worker process itself (`process`, with what it records of user code's
imports, `import_record`, and how it times and trims TensorFlow's import, `import_clock`,
`lean_import`), the worker logs a failure points to (`logs`), and the Ray executor that runs
the same requests on a cluster (`ray`).
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.workers import name` to its module.
_FACE = {
    "RayExecutor": "ray",
    "WorkerPool": "pool",
    "handle": "process",
    "loaded_libraries": "pool",
    "next_index": "logs",
    "node_env": "ray",
    "own_worker_min_bytes": "pool",
    "run_on_node": "ray",
    "settle": "logs",
    "stage_request": "pool",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
