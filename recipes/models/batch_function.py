"""A model batched at a user-chosen function, `batch_func` (`experimental.function_alias`).

`batch_func` normalizes the features on the CPU and calls the TPU function
`tpu_func`; batching it groups that CPU work with the TPU call, while the cheap
post-processing in the signature runs per request. `batch_func` takes a tensor with
None as dimension 0 and returns one row per input row, as BatchFunction requires.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN, CLASSES = 4, 8, 3


class BatchedClassifier(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(6)
        self.mean = tf.Variable(rng.normal(size=FEATURES).astype("float32"), name="mean")
        self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32"), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, CLASSES)).astype("float32"), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def batch_func(self, x: tf.Tensor) -> tf.Tensor:
        centered = x - self.mean
        return self.tpu_func(centered / (tf.norm(centered, axis=-1, keepdims=True) + 1e-6))

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.batch_func(x)
        return {"class_id": tf.argmax(logits, axis=-1), "logits": logits}


def export(output_dir: str) -> None:
    """Write the SavedModel with the aliases `tpu_func` and `batch_func`."""
    model = BatchedClassifier()
    aliases = {"tpu_func": model.tpu_func, "batch_func": model.batch_func}
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases=aliases),
    )
