"""Batching measured in the runtime: 32 concurrent one-row calls issued from inside TensorFlow.

benchmarks/batching_bfloat16.py drives the model from 32 Python threads, so its figure is
bounded by the GIL and by Python's per-call overhead, not by what BatchFunction does. Here
one tf.function issues 32 independent one-row calls of the serving signature: the
executor starts them together (no data or control edge between them; the calls only read
the variables, and automatic control dependencies order reads after writes only, see
tensorflow/python/framework/auto_control_deps.py: the traced calls carry no control
input), so the BatchFunction kernel sees 32
requests at once and Python runs once per 32 requests. Printed beside it: the old method
(Python threads), and the bound for this model, the speed-up of one 32-row call over 32
one-row calls made one after the other.

Run: python3 benchmarks/batching_runtime.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tpubuild.quiet import quiet_tensorflow

quiet_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from batching_bfloat16 import BATCH, CALLERS, WIDTHS, build, throughput  # noqa: E402

# Enough inter-op threads that no call waits for a thread: each call is an async kernel
# (PartitionedCall, BatchFunction) but its function's ops need a thread to run on.
INTER_OP_THREADS = 2 * CALLERS


def rate(step, seconds: float, per_step: int) -> float:
    """Rows per second of `step()` (which handles `per_step` rows), after one warm-up call."""
    step()
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        step()
        count += 1
    return count * per_step / (time.perf_counter() - began)


def in_graph_rate(model_dir: Path, seconds: float) -> float:
    """Requests per second when one tf.function issues CALLERS one-row calls at once."""
    loaded = tf.saved_model.load(str(model_dir))  # owns the variables: keep it alive
    fn = loaded.signatures["serving_default"]
    x = tf.constant(np.random.default_rng(1).normal(size=(CALLERS, WIDTHS[0])).astype(np.float32))

    @tf.function
    def concurrent_calls(x):
        return [fn(x=x[i : i + 1])["logits"] for i in range(CALLERS)]

    return rate(lambda: concurrent_calls(x), seconds, CALLERS)


def bound(model_dir: Path, seconds: float) -> tuple[float, float]:
    """Rows per second of one-row calls in sequence, and of one CALLERS-row call."""
    loaded = tf.saved_model.load(str(model_dir))  # owns the variables: keep it alive
    fn = loaded.signatures["serving_default"]
    rows = np.random.default_rng(1).normal(size=(CALLERS, WIDTHS[0])).astype(np.float32)

    @tf.function
    def one_by_one(x):
        out = []
        for i in range(CALLERS):
            # A control edge on the previous call: one call at a time, inside the graph.
            with tf.control_dependencies(out[-1:]):
                out.append(fn(x=x[i : i + 1])["logits"])
        return out

    sequential = rate(lambda: one_by_one(tf.constant(rows)), seconds, CALLERS)
    whole = rate(lambda: fn(x=tf.constant(rows)), seconds, CALLERS)
    return sequential, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp))
        params, plain_twin, batched_twin = built.params, built.plain_twin, built.batched_twin

        sequential, whole = bound(plain_twin, args.seconds)
        graph_plain = in_graph_rate(plain_twin, args.seconds)
        graph_batched = in_graph_rate(batched_twin, args.seconds)
        threads_plain = throughput(plain_twin, args.seconds)
        threads_batched = throughput(batched_twin, args.seconds)

        print(f"MLP {params / 1e6:.2f}M parameters on {os.cpu_count()} CPU cores (CPU twin), "
              f"{CALLERS} concurrent one-row requests, inter-op threads {INTER_OP_THREADS}")
        print(f"  batching: max_batch_size {BATCH['max_batch_size']}, allowed {BATCH['allowed_batch_sizes']}, "
              f"timeout {BATCH['batch_timeout_micros'] / 1000:g} ms, {BATCH['num_batch_threads']} batch threads")
        print("  in-graph (one tf.function, 32 independent calls):")
        print(f"    unbatched: {graph_plain:9.1f} requests/s")
        print(f"    batched:   {graph_batched:9.1f} requests/s")
        print(f"    ratio batched/unbatched: {graph_batched / graph_plain:.2f}")
        print("  Python threads (the old method, benchmarks/batching_bfloat16.py):")
        print(f"    unbatched: {threads_plain:9.1f} requests/s")
        print(f"    batched:   {threads_batched:9.1f} requests/s")
        print(f"    ratio batched/unbatched: {threads_batched / threads_plain:.2f}")
        print("  bound for this model (no batching overhead, no waiting):")
        print(f"    32 one-row calls in sequence: {sequential:9.1f} rows/s")
        print(f"    one 32-row call:              {whole:9.1f} rows/s")
        print(f"    ratio: {whole / sequential:.2f}")


if __name__ == "__main__":
    main()
