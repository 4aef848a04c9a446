"""Load time and per-call latency of a SavedModel, measured the same way for every target.

Method: each figure is the median of `runs` loads or `calls` calls with time.perf_counter; a load
is `tf.saved_model.load` of the directory (each run a fresh load), a call is one call of
a signature on one sample (the first verification sample) after one warm-up call (the
first call instantiates and optimizes the function, which is load work, not call work).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

METHOD = ("median (time.perf_counter) of {runs} loads (tf.saved_model.load, fresh each time) and of {calls} "
          "calls (one signature call on the first verification sample, after one warm-up call), same inputs "
          "for the target and the source")


def measure(path: Path, tags: list[str], samples_by_key: dict[str, list[dict[str, Any]]],
            runs: int = 5, calls: int = 50) -> dict[str, Any]:
    """{"load_seconds": median, "call_seconds": {key: median}} of the SavedModel at `path`."""
    import tensorflow as tf

    loads = []
    loaded = None
    for _ in range(runs):
        start = time.perf_counter()
        loaded = tf.saved_model.load(str(path), tags=tags)
        loads.append(time.perf_counter() - start)
    per_key = {}
    for key, samples in sorted(samples_by_key.items()):
        function = loaded.signatures[key]
        feed = {name: tf.constant(value) for name, value in samples[0].items()}
        function(**feed)  # warm-up
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            function(**feed)
            times.append(time.perf_counter() - start)
        per_key[key] = statistics.median(times)
    return {"load_seconds": statistics.median(loads), "call_seconds": per_key}
