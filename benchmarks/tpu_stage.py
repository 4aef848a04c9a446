"""Cost of the tpu stage per build: reading, resolving, checks (XLA on CPU), placement, save.

An MLP of ~3.2M parameters split into LAYERS aliased TPU functions (one per layer) is
exported once; the stage then runs on it and each step is timed. Prints the timings;
asserts nothing. Run: python3 benchmarks/tpu_stage.py [--layers 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.compatibility import check_tpu_functions
from tpubuild.tpu.functions import resolve_tpu_functions
from tpubuild.tpu.placement import place_on_tpu

WIDTH = 896  # LAYERS=4 -> 4 * 896 * 896 = 3.2M parameters


def _dense(weight: tf.Variable):
    def layer(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.matmul(x, weight))

    return layer


def make_model(layers: int) -> tf.Module:
    """A module whose `layer_i` functions are each one dense layer, called in sequence by `serve`."""
    module = tf.Module()
    rng = np.random.default_rng(0)
    module.weights = [tf.Variable(rng.normal(size=(WIDTH, WIDTH)).astype("float32") / 30.0) for _ in range(layers)]
    spec = [tf.TensorSpec([None, WIDTH], tf.float32)]
    for i in range(layers):
        setattr(module, f"layer_{i}", tf.function(_dense(module.weights[i]), input_signature=spec, autograph=False))

    @tf.function(input_signature=spec)
    def serve(x):
        for i in range(layers):
            x = getattr(module, f"layer_{i}")(x)
        return {"y": x}

    module.serve = serve
    return module


def timed(label: str, results: dict[str, float], action):
    start = time.perf_counter()
    value = action()
    results[label] = time.perf_counter() - start
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        module = make_model(args.layers)
        aliases = {f"layer_{i}": getattr(module, f"layer_{i}") for i in range(args.layers)}
        tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve},
                            options=tf.saved_model.SaveOptions(function_aliases=aliases))
        params = sum(int(np.prod(w.shape)) for w in module.weights)
        times: dict[str, float] = {}
        model = timed("read saved_model.pb", times, lambda: SavedModel.load(src))
        entries = [{"function_alias": alias} for alias in aliases]
        functions = timed("resolve", times, lambda: resolve_tpu_functions(model, entries))
        timed("static checks", times, lambda: check_tpu_functions(model, functions, xla=False))
        timed("checks incl. XLA lowering", times, lambda: check_tpu_functions(model, functions))
        timed("placement", times, lambda: place_on_tpu(model, functions))
        out.mkdir()
        timed("save (hardlinked variables)", times, lambda: model.save(out))
        timed("tf.saved_model.load of the output", times, lambda: tf.saved_model.load(str(out)))
    print(f"tpu stage on an MLP of {params / 1e6:.1f}M parameters, {args.layers} TPU functions:")
    for label, seconds in times.items():
        print(f"  {label:<36} {seconds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
