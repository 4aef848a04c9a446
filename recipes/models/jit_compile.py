"""A model whose TPU work is marked at export time with `@tf.function(jit_compile=True)`.

The recipe sets `jit_compile_functions: true` instead of naming functions: every
function compiled with XLA at export (here `encoder`) goes to the TPU.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN, CLASSES = 4, 8, 2


class JitModel(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(4)
        self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32"), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, CLASSES)).astype("float32"), name="w2")

    @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def encoder(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.nn.gelu(tf.matmul(x, self.w1)), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"probabilities": tf.nn.softmax(self.encoder(x))}


def export(output_dir: str) -> None:
    """Write the SavedModel; no alias needed, the jit_compile attribute marks the function."""
    model = JitModel()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})
