"""A ranking model batched as a whole signature (`experimental.signature_name`).

Feature clipping and log scaling run on the CPU, the dense part (`tpu_func`) on the
TPU. Batching the whole `serving_default` signature groups the CPU and TPU work of
concurrent requests together. Its inputs have -1 (None) as dimension 0 and every
output has one row per input row, as BatchFunction requires.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

DENSE_FEATURES, COUNT_FEATURES, HIDDEN = 4, 2, 8


class Ranker(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(5)
        inputs = DENSE_FEATURES + COUNT_FEATURES
        self.w1 = tf.Variable(rng.normal(size=(inputs, HIDDEN)).astype("float32"), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, 1)).astype("float32"), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, DENSE_FEATURES + COUNT_FEATURES], tf.float32)])
    def tpu_func(self, features: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.nn.relu(tf.matmul(features, self.w1)), self.w2)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, DENSE_FEATURES], tf.float32, name="dense"),
            tf.TensorSpec([None, COUNT_FEATURES], tf.int64, name="counts"),
        ]
    )
    def serve(self, dense: tf.Tensor, counts: tf.Tensor) -> dict[str, tf.Tensor]:
        scaled = tf.math.log1p(tf.cast(tf.maximum(counts, 0), tf.float32))
        features = tf.concat([tf.clip_by_value(dense, -5.0, 5.0), scaled], axis=-1)
        return {"score": tf.sigmoid(tf.squeeze(self.tpu_func(features), axis=-1))}


def export(output_dir: str) -> None:
    """Write the SavedModel with the signature `serving_default` and the alias `tpu_func`."""
    model = Ranker()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )
