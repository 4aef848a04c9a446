"""Where stages run: the pool of worker processes the build loop hands stage requests to
(`pool`), the worker process itself (`process`, with what it records of user code's
imports, `import_record`, and how it times and trims TensorFlow's import, `import_clock`,
`lean_import`), the worker logs a failure points to (`logs`), and the Ray executor that runs
the same requests on a cluster (`ray`).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "RayExecutor": "ray",
    "WorkerPool": "pool",
    "bytes_knob": "pool",
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
__getattr__, __dir__ = lazy(__name__, _FACE)
