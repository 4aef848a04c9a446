"""Write recipes/data/string_preprocess.tfrecord, the verification samples of
recipes/string_preprocess.yaml.

Its input is text ("0.5 1 -2 3"), which cannot be drawn at random the way numbers can,
so the recipe names these samples under `verify.representative_datasets`.
Run from anywhere: `python recipes/data/make_string_preprocess.py`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

NUM_SAMPLES, FEATURES = 32, 4
SIGNATURE_KEY, INPUT_NAME = "serving_default", "text"


def samples(num_samples: int = NUM_SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """One {"text": [1] bytes} map per sample: a row of space-separated numbers."""
    rng = np.random.default_rng(seed)
    rows = (" ".join(f"{v:.3f}" for v in rng.normal(size=FEATURES)) for _ in range(num_samples))
    return [{INPUT_NAME: np.array([row.encode()], dtype=object)} for row in rows]


def write(path: str) -> None:
    saver = tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(path_map={SIGNATURE_KEY: path})
    saver.save({SIGNATURE_KEY: samples()})


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    write(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "string_preprocess.tfrecord"))
