"""A worker's TensorFlow import without JAX: JAX is imported when a stage asks for it.

`import tensorflow` imports JAX too when it is installed (tpubuild's bfloat16 stage wants
jaxlib's MLIR bindings for XlaCallModule): tensorflow/lite/python/util.py does, at import,

    try:
      from jax import jit as _jit
    except ImportError:
      _jit = None

for one caller, `TFLiteConverter.experimental_from_jax` (tensorflow/lite/python/lite.py,
TFLiteJaxConverterV2, which raises "Cannot import jit from jax." when `_jit` is None).
Measured with TF 2.21 on 2 cores: 0.7 s of CPU and 110 MiB of resident memory in every
worker (548 MiB after the import instead of 658), for a converter no stage calls.

So, in a worker that runs tpubuild's own stages only, the import of the top-level `jax`
package fails while TensorFlow's own import runs (that module then sets `_jit = None`, its
path for an absent JAX); afterwards `jax` and `jaxlib` import as ever, for the stages that
use them. Workers that run user code (export scripts, dataset generators: they may call
`experimental_from_jax`) never get this finder (workers/pool.py main).
"""

from __future__ import annotations

import importlib.abc
import sys

DEFERRED = "jax"
IMPORTING = "tensorflow"


class DeferJax(importlib.abc.MetaPathFinder):
    """A sys.meta_path finder that refuses `jax` while `tensorflow` is being imported and
    finds nothing else: every other import goes to the finders behind it."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        # It stays in sys.meta_path after TensorFlow's import (two lookups per import):
        # removing itself here would make importlib's loop over the list skip the next finder.
        if name == DEFERRED and _importing(IMPORTING):
            raise ModuleNotFoundError(f"{DEFERRED} is imported after {IMPORTING} in a tpubuild worker", name=name)
        return None


def _importing(name: str) -> bool:
    """Whether module `name` is being executed now: importlib marks its spec
    `_initializing` from the start of its exec_module to its end (importlib._bootstrap
    _load_unlocked; what also tells a circular import apart from a missing attribute)."""
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def install() -> None:
    """Defer JAX past this process's TensorFlow import, if TensorFlow is not imported yet."""
    if IMPORTING not in sys.modules:
        sys.meta_path.insert(0, DeferJax())
