"""How long a worker spent importing TensorFlow: the worker's start-up, not a stage's work.

A worker imports TensorFlow once, during the first stage it runs (stages import it
lazily; an export script imports it itself), and that import takes seconds on a busy
machine, more than many stages' own work (a 4x3 matmul's `tpu` stage printed 21 s).
Reported as the stage's time, it made every first stage of a worker look slow. The
clock times the import of the top-level `tensorflow` package (its loader's exec_module,
inside which every module TensorFlow needs is imported) so that the worker can report
it apart from the stage's own time (workers/pool.py main).

The clock never imports anything itself and changes no module: the same package is
found by the same finders and executed by its own loader (the wrapper is the pattern of
quiet._QuietImport, which may wrap the same import).
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import sys
import time

TIMED = "tensorflow"


class ImportClock(importlib.abc.MetaPathFinder):
    """A sys.meta_path finder that finds nothing but the first `import tensorflow`, which
    it hands to the real finders and times; `take()` returns the seconds counted since the
    last `take()`."""

    def __init__(self) -> None:
        self.counted = 0.0

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TIMED:
            return None
        sys.meta_path.remove(self)  # once: the other finders locate the package
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _TimedLoader(spec.loader, self)
        return spec

    def take(self) -> float:
        counted, self.counted = self.counted, 0.0
        return counted


class _TimedLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, clock: ImportClock):
        self.loader = loader
        self.clock = clock

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        module.__loader__ = module.__spec__.loader = self.loader  # the package's own, for later readers
        started = time.monotonic()
        try:
            self.loader.exec_module(module)
            # What TensorFlow's import created lives as long as the worker: out of every
            # later collection's scan (gc.freeze), which otherwise walks its ~340,000
            # objects in each full collection, the automatic ones while a model loads and
            # release_memory's after it. ResNet50's load + 8 runs + the collection after it:
            # 3.2 s of CPU instead of 3.9 (load 1.7 s instead of 2.1, collection 0.1 instead
            # of 0.3). Frozen is only what exists now (modules, and the few objects a first
            # stage made before it imported TensorFlow): what stages make later is collected.
            gc.freeze()
        finally:
            self.clock.counted += time.monotonic() - started


def install() -> ImportClock:
    """Time this process's first `import tensorflow` from now on.

    Call it before engine/imports.install: that module's finder must stay in front, so it
    still sees the user code's own `import tensorflow` (its frames decide what is
    recorded); this one is asked after it.
    """
    clock = ImportClock()
    if TIMED not in sys.modules:
        sys.meta_path.insert(0, clock)
    return clock
