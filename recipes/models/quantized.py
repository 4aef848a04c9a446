"""A small image-feature classifier quantized to int8 with static ranges.

Static-range quantization fixes every activation's range once, from a representative
dataset (recipes/data/quantized.tfrecord, made by recipes/data/make_quantized.py), so
inference does the least work at run time. The matmuls hold constant weights after
freezing, which is what the quantizer rewrites.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN, CLASSES = 16, 32, 4


class Classifier(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(8)
        self.w1 = tf.Variable((rng.normal(size=(FEATURES, HIDDEN)) / 4).astype("float32"), name="w1")
        self.b1 = tf.Variable(rng.normal(scale=0.1, size=HIDDEN).astype("float32"), name="b1")
        self.w2 = tf.Variable((rng.normal(size=(HIDDEN, CLASSES)) / 6).astype("float32"), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="features")])
    def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
        hidden = tf.nn.relu(tf.matmul(features, self.w1) + self.b1)
        return {"logits": tf.matmul(hidden, self.w2)}


def export(output_dir: str) -> None:
    """Write the SavedModel; quantization reads its `serving_default` signature."""
    model = Classifier()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})
