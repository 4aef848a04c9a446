"""Load time and per-call latency, measured the same way for every target.

Method (every figure): the median wall time (`time.perf_counter`) of `calls` calls, after
`WARMUP_CALLS` untimed calls (the first call instantiates and optimizes a function, which
is load work, not call work), one signature called on the same sample for the target and
for the source. A load is `tf.saved_model.load` of the directory, fresh each run. The one
figure not taken here is the XLA AOT library's own: it runs in the C++ harness
(targets/xla_aot/harness.py), which follows the same method (`WARMUP_CALLS` untimed calls,
then the median of `calls` timed ones, in `std::chrono::steady_clock`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

WARMUP_CALLS = 3
METHOD = ("median (time.perf_counter) of {calls} calls of one signature on the first verification sample, "
          f"after {WARMUP_CALLS} untimed calls, same inputs for the target and the source")


def median_call_seconds(call: Callable[[], Any], calls: int) -> float:
    """Median wall time of `calls` calls of `call`, in seconds, after the warm-up calls."""
    for _ in range(WARMUP_CALLS):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def signature_call(function: Any, sample: dict[str, Any]) -> Callable[[], Any]:
    """A call of a TensorFlow signature on one sample, its tensors made once (not timed)."""
    import tensorflow as tf

    feed = {name: tf.constant(value) for name, value in sample.items()}
    return lambda: function(**feed)


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
    per_key = {key: median_call_seconds(signature_call(loaded.signatures[key], samples[0]), calls)
               for key, samples in sorted(samples_by_key.items())}
    return {"load_seconds": statistics.median(loads), "call_seconds": per_key}
