"""Toy classifier: a two-layer MLP whose dense part is the TPU function `tpu_func`.

The serving signature calls `tpu_func` and applies softmax/argmax around it; the
function alias given at export time is how the recipe names the TPU function.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN, CLASSES = 4, 8, 3


class Toy(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)  # fixed weights: the same export every time
        self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32"), name="w1")
        self.b1 = tf.Variable(np.zeros(HIDDEN, "float32"), name="b1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, CLASSES)).astype("float32"), name="w2")
        self.b2 = tf.Variable(np.zeros(CLASSES, "float32"), name="b2")

    # Dimension 0 is None so the default batching (which wraps every TPU function) can
    # concatenate requests along it.
    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, x: tf.Tensor) -> tf.Tensor:
        hidden = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
        return tf.matmul(hidden, self.w2) + self.b2

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.tpu_func(x)
        return {"probabilities": tf.nn.softmax(logits), "class_id": tf.argmax(logits, axis=-1)}


def export(output_dir: str) -> None:
    """Write the SavedModel with the alias `tpu_func` for the TPU function."""
    model = Toy()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )


if __name__ == "__main__":  # `python recipes/models/toy.py DIR`: the SavedModel alone (`tpubuild convert --help`)
    import sys

    export(sys.argv[1])
