"""An export script for test_reproducible.py, run as `python reproducible_export.py OUT [--warm-up]`.

`--warm-up` traces unrelated functions (with a cond and a custom gradient) and creates
variables first, so TensorFlow's per-process counters differ from a clean run's: the
exported function names, capture ids and custom gradient op types all shift.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

FEATURES, OUTPUTS = 4, 3
CLIP = 0.5


@tf.custom_gradient
def clipped_identity(x: tf.Tensor):
    """Identity whose gradient is clipped: a registered custom gradient in the SavedModel."""

    def grad(dy: tf.Tensor) -> tf.Tensor:
        return tf.clip_by_value(dy, -CLIP, CLIP)

    return tf.identity(x), grad


class Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(5)
        self.w = tf.Variable(rng.normal(size=(FEATURES, OUTPUTS)).astype("float32"), name="w")
        self.b = tf.Variable(rng.normal(size=OUTPUTS).astype("float32"), name="b")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, x: tf.Tensor) -> tf.Tensor:
        return clipped_identity(tf.matmul(x, self.w) + self.b)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = self.tpu_func(x)
        # Conds: their branches are library functions called through If nodes. The two
        # conds trace identical branch bodies under different names.
        for _ in range(2):
            y = tf.cond(tf.reduce_sum(y) > 0, lambda: y * 2.0, lambda: y - 1.0)
        return {"y": y}


def warm_up() -> None:
    for step in range(3):
        unrelated = tf.Variable(float(step))

        @tf.function
        def other(x: tf.Tensor) -> tf.Tensor:
            return tf.cond(x > 0, lambda: clipped_identity(x * unrelated), lambda: x - 1.0)

        other(tf.constant(float(step)))


def export(output_dir: str) -> None:
    model = Model()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )


if __name__ == "__main__":
    if "--warm-up" in sys.argv:
        warm_up()
    export(sys.argv[1])
