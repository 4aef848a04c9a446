"""Keras 3 architectures exported the converter guide's way, as a user writes them.

This file is also the workspaces' export script (copied in; recipes name `export_mobilenet`
and `export_lstm`): a `tf.Module` holds the Keras model, `tpu_func` (with an
input_signature) calls it and is saved under the function alias `tpu_func`, and the
serving signature calls `tpu_func` from the CPU. Nothing here works around how Keras 3
saves its variables: the build has to cope with what `tf.saved_model.save` writes.
Random weights (weights=None; seeded), tiny widths: the architecture is what is tested.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

IMAGE = (32, 32, 3)  # the smallest input MobileNetV2 accepts
CLASSES = 4
VOCAB, STEPS, EMBED, UNITS = 40, 6, 8, 8


def mobilenet() -> "object":
    """MobileNetV2 (alpha 0.35, random weights) on 32x32 images with a 4-class head."""
    import keras

    keras.utils.set_random_seed(7)
    return keras.applications.MobileNetV2(
        weights=None, alpha=0.35, input_shape=IMAGE, classes=CLASSES, classifier_activation="softmax")


def lstm_classifier() -> "object":
    """Token ids -> Embedding -> LSTM -> Dense softmax: a small text classifier."""
    import keras

    keras.utils.set_random_seed(11)
    return keras.Sequential([
        keras.Input((STEPS,), dtype="int32"),
        keras.layers.Embedding(VOCAB, EMBED),
        keras.layers.LSTM(UNITS),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])


def _export(model: "object", spec: "object", input_name: str, output_dir: str) -> None:
    import tensorflow as tf

    class Exported(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[spec])
        def tpu_func(self, x):
            return self.model(x, training=False)

        @tf.function(input_signature=[tf.TensorSpec(spec.shape, spec.dtype, name=input_name)])
        def serve(self, x):
            return {"probabilities": self.tpu_func(x)}

    module = Exported()
    tf.saved_model.save(module, output_dir, signatures={"serving_default": module.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))


def export_mobilenet(output_dir: str) -> None:
    import tensorflow as tf

    _export(mobilenet(), tf.TensorSpec([None, *IMAGE], tf.float32), "images", output_dir)


def export_lstm(output_dir: str) -> None:
    import tensorflow as tf

    # One request at a time: the LSTM's while loop needs a static batch for LiteRT's
    # TensorList lowering and for XLA AOT, as real LiteRT text classifiers are exported.
    _export(lstm_classifier(), tf.TensorSpec([1, STEPS], tf.int32), "ids", output_dir)


def images(count: int, seed: int = 0) -> np.ndarray:
    """Image-like samples: smooth colour gradients with noise, in [0, 1]."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, IMAGE[0], dtype=np.float32)
    base = ramp[None, :, None, None] * rng.uniform(0.2, 1, (count, 1, 1, 3)) + ramp[None, None, :, None] * 0.3
    return np.clip(base + rng.normal(0, 0.05, (count, *IMAGE)), 0, 1).astype(np.float32)


def token_ids(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (count, STEPS)).astype(np.int32)


def lstm_samples():
    """Representative requests for the LSTM recipe's calibration (a dataset generator)."""
    for row in token_ids(64, seed=3):
        yield {"ids": row[None, :]}


def image_samples():
    """Representative requests for the MobileNet recipe (a dataset generator)."""
    for image in images(32, seed=3):
        yield {"images": image[None]}
