"""A single-head self-attention block on the TPU, converted to bfloat16 but for Softmax.

bfloat16 keeps float32's exponent range with fewer mantissa bits, which is fine for
the matmuls; the recipe's filterlist keeps `Softmax` in float32 (its inputs are cast
up and its outputs cast back), where the lost precision would show most.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SEQUENCE, WIDTH = 6, 8


class Attention(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(7)
        scale = 1.0 / np.sqrt(WIDTH)
        self.wq = tf.Variable((rng.normal(size=(WIDTH, WIDTH)) * scale).astype("float32"), name="wq")
        self.wk = tf.Variable((rng.normal(size=(WIDTH, WIDTH)) * scale).astype("float32"), name="wk")
        self.wv = tf.Variable((rng.normal(size=(WIDTH, WIDTH)) * scale).astype("float32"), name="wv")

    @tf.function(input_signature=[tf.TensorSpec([None, SEQUENCE, WIDTH], tf.float32)])
    def tpu_func(self, x: tf.Tensor) -> tf.Tensor:
        q, k, v = (tf.einsum("bsw,wd->bsd", x, w) for w in (self.wq, self.wk, self.wv))
        weights = tf.nn.softmax(tf.einsum("bqd,bkd->bqk", q, k) / np.sqrt(WIDTH).astype("float32"))
        return tf.einsum("bqk,bkd->bqd", weights, v)

    @tf.function(input_signature=[tf.TensorSpec([None, SEQUENCE, WIDTH], tf.float32, name="tokens")])
    def serve(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"pooled": tf.reduce_mean(self.tpu_func(tokens), axis=1)}


def export(output_dir: str) -> None:
    """Write the SavedModel with the alias `tpu_func` for the attention block."""
    model = Attention()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )
