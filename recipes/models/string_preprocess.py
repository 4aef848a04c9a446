"""A model fed raw text: string parsing on the CPU, the dense part on the TPU.

Each request row is a string of space-separated numbers ("0.5 1 -2 3"). Strings and
`StringToNumber` have no XLA kernel, so they must stay outside the TPU function; only
`tpu_func` (float in, float out) is placed on the TPU.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN = 4, 8


class StringPreprocess(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(2)
        self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32"), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, 1)).astype("float32"), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, features: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.nn.relu(tf.matmul(features, self.w1)), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def serve(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        # CPU only: split, pad/cut to FEATURES columns, parse.
        tokens = tf.strings.split(text).to_tensor(default_value="0", shape=[None, FEATURES])
        features = tf.strings.to_number(tokens, out_type=tf.float32)
        return {"score": tf.squeeze(self.tpu_func(features), axis=-1)}


def export(output_dir: str) -> None:
    """Write the SavedModel with the alias `tpu_func` for the float-only dense part."""
    model = StringPreprocess()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )
