"""Load time and per-call latency, measured the same way for every target.

Method (every figure): the median wall time (`time.perf_counter`) of up to `calls` calls,
after `WARMUP_CALLS` untimed calls (the first call instantiates and optimizes a function,
which is load work, not call work), one signature called on the same sample for the target
and for the source. The timed calls stop early once they have taken `BUDGET_SECONDS` and
number at least `MIN_CALLS` (pytest-benchmark's max_time/min_rounds, Google Benchmark's
min_time): 200 calls of a 1 ms model take 0.2 s, of a ResNet50 on one core (~0.3 s a call
in the XLA AOT harness) a minute, for no better a median. A load is `tf.saved_model.load`
of the directory, fresh each run. The one figure not taken here is the XLA AOT library's
own: it runs in the C++ harness (targets/xla_aot/harness.py), which follows the same
method (`WARMUP_CALLS` untimed calls, then the median of up to `calls` timed ones within
the same budget, in `std::chrono::steady_clock`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

WARMUP_CALLS = 3
BUDGET_SECONDS = 2.0
MIN_CALLS = 5
METHOD = ("median (time.perf_counter) of up to {calls} calls of one signature on the first verification sample "
          f"(fewer once the calls took {BUDGET_SECONDS:g} s, at least {MIN_CALLS}), after {WARMUP_CALLS} untimed "
          "calls, same inputs for the target and the source")


def median_call_seconds(call: Callable[[], Any], calls: int) -> float:
    """Median wall time of up to `calls` calls of `call`, in seconds, after the warm-up
    calls; the timed calls stop once they took BUDGET_SECONDS and number MIN_CALLS."""
    for _ in range(WARMUP_CALLS):
        call()
    times: list[float] = []
    while len(times) < calls and (len(times) < MIN_CALLS or sum(times) < BUDGET_SECONDS):
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
    """{"load_seconds": median, "call_seconds": {key: median}} of the SavedModel at `path`:
    up to `runs` loads (fewer once they took BUDGET_SECONDS, at least one), the calls as
    median_call_seconds takes them."""
    import tensorflow as tf

    loads: list[float] = []
    loaded = None
    while len(loads) < runs and (not loads or sum(loads) < BUDGET_SECONDS):
        loaded = None  # one model in memory at a time
        start = time.perf_counter()
        loaded = tf.saved_model.load(str(path), tags=tags)
        loads.append(time.perf_counter() - start)
    assert loaded is not None  # runs >= 1: the loop ran at least once
    per_key = {key: median_call_seconds(signature_call(loaded.signatures[key], samples[0]), calls)
               for key, samples in sorted(samples_by_key.items())}
    return {"load_seconds": statistics.median(loads), "call_seconds": per_key}
