"""Tiny real models and a stage runner for the stage tests of verify/, report/, quantize/,
diagnosis/, serving/ and tpu/ (their fixtures are in tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tpubuild.pipeline import stage_module  # noqa: E402
from tpubuild.stages.base import StageContext, StageResult  # noqa: E402

FEATURES, HIDDEN, CLASSES = 64, 128, 10


class Dense(tf.Module):
    """Two dense layers; 64x128 and 128x10 float32 weights (quantizable: >= 1024 elements)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(7)
        self.w1 = tf.Variable(rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32) * 0.1)
        self.b1 = tf.Variable(np.zeros(HIDDEN, np.float32))
        self.w2 = tf.Variable(rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x):
        hidden = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
        return {"logits": tf.matmul(hidden, self.w2)}


class TwoTpu(tf.Module):
    """CPU preprocessing, then two aliased TPU-able functions (a bigger and a smaller matmul)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(3)
        self.w1 = tf.Variable(rng.standard_normal((32, 64)).astype(np.float32))
        self.w2 = tf.Variable(rng.standard_normal((64, 8)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32)])
    def tpu_func_1(self, x):
        return tf.nn.relu(tf.matmul(x, self.w1))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def tpu_func_2(self, h):
        return tf.matmul(h, self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.int32, name="ids")])
    def serve(self, ids):
        x = tf.cast(ids, tf.float32) / 10.0 - 1.0  # CPU preprocessing
        return {"scores": tf.nn.softmax(self.tpu_func_2(self.tpu_func_1(x)))}


def save(module: tf.Module, path: Path, aliases: dict[str, Any] | None = None) -> Path:
    tf.saved_model.save(
        module,
        str(path),
        signatures={"serving_default": module.serve},
        options=tf.saved_model.SaveOptions(function_aliases=aliases or {}),
    )
    return path


def dense_samples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, FEATURES)).astype(np.float32)} for _ in range(count)]


class Runner:
    """Runs stages the way the engine does: a fresh empty output dir, a StageContext."""

    def __init__(self, workspace: Path, out: Path, recipe: str = "toy"):
        self.workspace, self.out, self.recipe = workspace, out, recipe
        self.inputs: dict[str, Path] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.logged: list[str] = []

    def run(self, name: str, input_dir: Path, options: dict[str, Any]) -> tuple[Path, StageResult]:
        import importlib

        module = importlib.import_module(stage_module(name))
        output = self.out / f"{name}-{len(list(self.out.iterdir())) if self.out.exists() else 0}"
        output.mkdir(parents=True)
        context = StageContext(
            workspace=self.workspace, inputs=dict(self.inputs), results=dict(self.results), log=self.logged.append,
        )
        result = module.run(input_dir, output, options, context)
        self.inputs[name] = output
        self.results[name] = result.summary
        return output, result
