"""The Cloud TPU guide's quantization example: an aliased TPU function, quantized to int8.

The serving signature scales the features on the CPU, calls the TPU function `tpu_func`
(named by the alias given at export time) and turns its logits into probabilities.
`tpu_func` holds the matmuls: the quantize stage quantizes it as a model of its own,
calibrated on the inputs it receives from the representative dataset
(recipes/data/quantized.tfrecord, shared with recipes/quantized.yaml), so it keeps its
name and alias and the tpu stage places it afterwards.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES, HIDDEN, CLASSES = 16, 64, 4  # w1 has 1024 elements: every method quantizes it


class Classifier(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(11)  # fixed weights: the same export every time
        self.w1 = tf.Variable((rng.normal(size=(FEATURES, HIDDEN)) / 4).astype("float32"), name="w1")
        self.b1 = tf.Variable(rng.normal(scale=0.1, size=HIDDEN).astype("float32"), name="b1")
        self.w2 = tf.Variable((rng.normal(size=(HIDDEN, CLASSES)) / 8).astype("float32"), name="w2")

    # Dimension 0 is None so the default batching (which wraps every TPU function) can
    # concatenate requests along it.
    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, x: tf.Tensor) -> tf.Tensor:
        hidden = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
        return tf.matmul(hidden, self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="features")])
    def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.tpu_func(features * 0.5)  # CPU preprocessing before the TPU call
        return {"probabilities": tf.nn.softmax(logits), "logits": logits}


def export(output_dir: str) -> None:
    """Write the SavedModel with the alias `tpu_func` for the TPU function."""
    model = Classifier()
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )
