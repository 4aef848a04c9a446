"""The tiny model of the xla_aot tests and the calls of the real stages (conftest.py shares them).

The model has what the example recipe's model has (an embedding gather feeding a recurrent
cell) plus a while loop (tf.range over the steps: a TensorFlow While with a fixed trip
count), and a second signature tfcompile refuses (AsString: XLA has no string type).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tpubuild.stages.base import StageContext, StageResult
from tpubuild.targets.xla_aot import stage as xla_aot
from tpubuild.targets.xla_aot import verify_stage as xla_aot_verify

VOCAB, EMBED, UNITS, STEPS = 16, 4, 6, 5
BATCH_SIZES = [1, 3]


class Recurrent(tf.Module):
    def __init__(self, seed: int = 3) -> None:
        rng = np.random.default_rng(seed)
        self.table = tf.Variable(rng.normal(size=(VOCAB, EMBED)).astype("float32"), name="table")
        self.kernel = tf.Variable(rng.normal(size=(EMBED + UNITS, UNITS)).astype("float32") / 3, name="kernel")
        self.head = tf.Variable(rng.normal(size=(UNITS, 2)).astype("float32"), name="head")

    @tf.function(input_signature=[tf.TensorSpec([None, STEPS], tf.int32, name="ids"),
                                  tf.TensorSpec([None, UNITS], tf.float32, name="state")])
    def serve(self, ids, state):
        embedded = tf.gather(self.table, ids)
        h = state
        for step in tf.range(STEPS):  # AutoGraph: a While loop with a fixed trip count
            h = tf.tanh(tf.matmul(tf.concat([embedded[:, step], h], axis=1), self.kernel))
        return {"logits": tf.matmul(h, self.head), "state": h}

    @tf.function(input_signature=[tf.TensorSpec([None, STEPS], tf.int32, name="ids"),
                                  tf.TensorSpec([None, UNITS], tf.float32, name="state")])
    def unrolled(self, ids, state):
        """serve with the steps unrolled in Python, as the example model's LSTM is: no While."""
        embedded = tf.gather(self.table, ids)
        h = state
        for step in range(STEPS):
            h = tf.tanh(tf.matmul(tf.concat([embedded[:, step], h], axis=1), self.kernel))
        return {"logits": tf.matmul(h, self.head), "state": h}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
    def any_length(self, ids):
        return {"pooled": tf.reduce_mean(tf.gather(self.table, ids), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def strings(self, x):
        return {"length": tf.strings.length(tf.strings.as_string(x))}


def stage_options(**extra: Any) -> dict[str, Any]:
    return {"tags": ["serve"], "signatures": ["serving_default"], "batch_sizes": BATCH_SIZES, **extra}


def verify(source: Path, artifact: Path, out: Path, workspace: Path, **extra: Any) -> StageResult:
    out.mkdir(parents=True, exist_ok=True)
    context = StageContext(workspace=workspace, inputs={"source": source, "xla_aot": artifact})
    options = stage_options(rtol=None, atol=None, samples=7, seed=0, representative_datasets={}, **extra)
    return xla_aot_verify.run(source, out, options, context)


def build(source: Path, out: Path, workspace: Path, **extra: Any) -> StageResult:
    out.mkdir(parents=True)
    context = StageContext(workspace=workspace, inputs={"source": source})
    return xla_aot.run(source, out, stage_options(**extra), context)


def save(path: Path, seed: int = 3) -> Path:
    model = Recurrent(seed)
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve, "unrolled": model.unrolled,
                                                 "strings": model.strings,
                                                 "any_length": model.any_length})
    return path
