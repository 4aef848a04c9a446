"""Keras 3 models exported with Keras's own export API, as its documentation teaches.

Also the test workspace's export script (copied in as recipes/models/keras_exports.py):
no `tf.Module` wrapper, no `tf.saved_model.save`, nothing that works around how Keras
writes the SavedModel. `model.export(output_dir)` for a Sequential, a functional and a
subclassed model (BatchNormalization, Dropout, a non-trainable weight); a
`keras.export.ExportArchive` with `track`, three endpoints, a variable collection and a
function alias (the one Keras export path that takes `SaveOptions`); and a tiny
`keras_hub` text classifier exported with `model.export()`. Random weights, seeded; tiny
widths: the export path is what is tested.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

FEATURES = 4
IMAGE = (8, 8, 3)
CLASSES = 3
VOCAB, SEQUENCE = 24, 8


def sequential():
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(CLASSES),
    ])


def functional():
    import keras

    keras.utils.set_random_seed(2)
    inputs = keras.Input(IMAGE)
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.25)(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(x))


def subclassed():
    import keras

    keras.utils.set_random_seed(3)

    class Scored(keras.Model):
        """Dense -> BatchNormalization -> Dropout -> Dense, shifted by a non-trainable bias."""

        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.norm = keras.layers.BatchNormalization()
            self.drop = keras.layers.Dropout(0.25)
            self.head = keras.layers.Dense(CLASSES)
            self.shift = self.add_weight(shape=(CLASSES,), initializer="random_normal", trainable=False,
                                         name="shift")

        def call(self, x, training=False):
            x = self.drop(self.norm(self.hidden(x), training=training), training=training)
            return self.head(x) + self.shift

    model = Scored()
    model(np.zeros((1, FEATURES), np.float32))  # build: a subclassed model has no input shape until called
    return model


def export_sequential(output_dir: str) -> None:
    sequential().export(output_dir, verbose=False)


def export_functional(output_dir: str) -> None:
    functional().export(output_dir, verbose=False)


def export_subclassed(output_dir: str) -> None:
    subclassed().export(output_dir, verbose=False)


def export_archive(output_dir: str) -> None:
    """ExportArchive: the TPU part is an endpoint saved under the alias `tpu_func`; the
    serving endpoints call it from the CPU."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(CLASSES),
    ])
    spec = [keras.InputSpec(shape=(None, FEATURES), dtype="float32")]
    archive = keras.export.ExportArchive()
    archive.track(model)
    tpu_func = archive.add_endpoint("tpu_func", lambda x: model(x, training=False), input_signature=spec)
    archive.add_endpoint("serving_default", lambda x: {"probabilities": tf.nn.softmax(tpu_func(x))},
                         input_signature=spec)
    archive.add_endpoint("logits", lambda x: {"logits": tpu_func(x)}, input_signature=spec)
    archive.add_variable_collection("batch_statistics", model.non_trainable_variables)
    archive.write_out(output_dir, verbose=False,
                      options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": tpu_func}))


def export_keras_hub(output_dir: str) -> None:
    """A one-layer BERT text classifier (no preprocessor: it takes token ids)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=SEQUENCE)
    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=CLASSES, preprocessor=None)
    classifier.export(output_dir, verbose=False)


def features(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, FEATURES)).astype(np.float32)


def images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(size=(count, *IMAGE)).astype(np.float32)


def token_inputs(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"token_ids": rng.integers(1, VOCAB, (count, SEQUENCE)).astype(np.int32),
            "segment_ids": np.zeros((count, SEQUENCE), np.int32),
            "padding_mask": np.ones((count, SEQUENCE), np.int32)}


def feature_samples():
    """Representative requests of the subclassed model (its input is `args_0`: Keras names
    a subclassed model's input by position) for the static-range int8 recipe."""
    for row in features(64, seed=3):
        yield {"args_0": row[None]}
