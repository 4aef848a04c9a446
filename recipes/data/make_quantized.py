"""Write recipes/data/quantized.tfrecord, the representative dataset of recipes/quantized.yaml.

Run from anywhere: `python recipes/data/make_quantized.py`. The samples follow the
distribution the model sees in serving (standard normal features); 256 of them, more
than the 200 the converter's documentation recommends.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

NUM_SAMPLES, FEATURES = 256, 16
SIGNATURE_KEY, INPUT_NAME = "serving_default", "features"


def samples(num_samples: int = NUM_SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Representative samples: one {input name: [1, FEATURES] float32} map each."""
    rng = np.random.default_rng(seed)
    return [{INPUT_NAME: rng.normal(size=(1, FEATURES)).astype("float32")} for _ in range(num_samples)]


def write(path: str) -> None:
    saver = tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(path_map={SIGNATURE_KEY: path})
    saver.save({SIGNATURE_KEY: samples()})


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    write(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "quantized.tfrecord"))
