"""Batched vs unbatched throughput under 32 concurrent callers, and bfloat16 variables size.

An MLP of ~2.6M parameters is exported, placed on the TPU, optionally batched
(BatchFunction around the TPU call) and run as its CPU twin, with 32 threads each
sending single-row requests. Prints both ratios; asserts nothing.
Run: python3 benchmarks/batching_bfloat16.py [--seconds 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from tpubuild.stages import batch, bfloat16, tpu
from tpubuild.stages.base import StageContext
from tpubuild.tpu.twin import make_cpu_twin

WIDTHS = (512, 1024, 1024, 1024, 16)
CALLERS = 32
TPU = [{"function_alias": "tpu_func"}]
BATCH = {
    "num_batch_threads": 2,
    "max_batch_size": 32,
    "batch_timeout_micros": 2000,
    "allowed_batch_sizes": [8, 16, 32],
    "max_enqueued_batches": 100,
    "disable_large_batch_splitting": False,
}


class Mlp(tf.Module):
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.layers = [
            tf.Variable((rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), name=f"w{i}")
            for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:]))
        ]

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTHS[0]], tf.float32)])
    def tpu_func(self, x):
        for w in self.layers[:-1]:
            x = tf.nn.relu(tf.matmul(x, w))
        return tf.matmul(x, self.layers[-1])

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTHS[0]], tf.float32)])
    def serve(self, x):
        return {"logits": self.tpu_func(x)}


def stage(run, src: Path, root: Path, name: str, options: dict) -> Path:
    out = root / name
    out.mkdir()
    run(src, out, {"tags": ["serve"], "tpu_functions": TPU, **options}, StageContext(root, "bench", root / "r.yaml"))
    return out


def throughput(model_dir: Path, seconds: float) -> float:
    """Requests per second with CALLERS threads each sending one-row requests."""
    fn = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(1).normal(size=(1, WIDTHS[0])).astype(np.float32))
    fn(x=x)  # warm up: first call builds the function runtime
    counts = [0] * CALLERS
    stop = time.perf_counter() + seconds
    start = threading.Barrier(CALLERS)

    def caller(i: int) -> None:
        start.wait()
        while time.perf_counter() < stop:
            fn(x=x)
            counts[i] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - began)


@dataclass
class Built:
    """The exported MLP, its TPU-placed and batched conversions, and their CPU twins."""

    params: int
    src: Path
    placed: Path
    batched: Path
    plain_twin: Path
    batched_twin: Path


def build(root: Path) -> Built:
    mlp = Mlp()
    src = root / "src"
    tf.saved_model.save(
        mlp, str(src), signatures={"serving_default": mlp.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": mlp.tpu_func}),
    )
    placed = stage(tpu.run, src, root, "tpu", {"xla_sharding_options": None})
    batched = stage(batch.run, placed, root, "batch", {"batch_options": [BATCH]})
    plain_twin, batched_twin = root / "plain_twin", root / "batched_twin"
    make_cpu_twin(placed, plain_twin)
    make_cpu_twin(batched, batched_twin)
    params = sum(int(np.prod(w.shape)) for w in mlp.layers)
    return Built(params, src, placed, batched, plain_twin, batched_twin)


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "variables").iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        built = build(root)
        params, src = built.params, built.src
        bf16 = stage(
            bfloat16.run, built.placed, root, "bf16",
            {"bfloat16_optimization_options": {"scope": "TPU", "skip_safety_checks": False, "filterlist": []}},
        )
        plain = throughput(built.plain_twin, args.seconds)
        grouped = throughput(built.batched_twin, args.seconds)
        print(f"MLP {params / 1e6:.2f}M parameters, {CALLERS} concurrent callers, 1 row per request")
        print(f"  unbatched: {plain:8.1f} requests/s")
        print(f"  batched:   {grouped:8.1f} requests/s  (max_batch_size 32, timeout 2 ms)")
        print(f"  throughput ratio batched/unbatched: {grouped / plain:.2f}")
        print(f"  variables: source {size(src) / 1e6:.2f} MB, bfloat16 {size(bf16) / 1e6:.2f} MB")
        print(f"  size ratio bfloat16/source: {size(bf16) / size(src):.3f}")


if __name__ == "__main__":
    main()
