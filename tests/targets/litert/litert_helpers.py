"""Tiny real SavedModels and an engine-like stage runner for the LiteRT target's tests."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tests.cli import REPO
from tpubuild.stages.base import StageContext, StageResult  # noqa: E402
from tpubuild.targets.litert import stage as litert
from tpubuild.targets.litert import verify_stage as litert_verify


def example_module() -> Any:
    """recipes/models/all_targets.py, the example of issue 12, imported from its file."""
    spec = importlib.util.spec_from_file_location("all_targets_example", REPO / "recipes" / "models" / "all_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DynamicBatch(tf.Module):
    """The example's LSTM composite called with a batch of unknown size: not fusable
    (CheckFusableKerasLstm wants the state's shape static)."""

    def __init__(self, example: Any) -> None:
        super().__init__()
        self.example = example
        self.weights = example.SequenceClassifier()

    @tf.function(input_signature=[tf.TensorSpec([None, 3, 8], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        zeros = tf.zeros([tf.shape(x)[0], self.example.UNITS])
        w = self.weights
        last, _, _, _, _ = self.example.lstm(x, zeros, zeros, tf.convert_to_tensor(w.kernel),
                                             tf.convert_to_tensor(w.recurrent), tf.convert_to_tensor(w.bias))
        return {"last": last}


class Unary(tf.Module):
    """y = op(x) + x on a fixed [2, 3] float input: one op decides whether LiteRT converts it."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self.op(x) + x}


def flex_only(x: tf.Tensor) -> tf.Tensor:
    # MatrixInverse: no LiteRT builtin, but in the select-TF allowlist (measured with TF 2.21).
    return tf.linalg.inv(tf.matmul(x, x, transpose_b=True) + 3.0 * tf.eye(2))[:, :1]


def no_kernel(x: tf.Tensor) -> tf.Tensor:
    # Digamma: neither a LiteRT builtin nor a select-TF op (measured with TF 2.21).
    return tf.math.digamma(tf.abs(x) + 1.0)


# A custom composite the converter turns into a CUSTOM op of its name (`tfl_fusable_op`,
# ConvertTflFusableOp in prepare_composite_functions_tf.cc); no interpreter has its kernel.
@tf.function(experimental_implements='name: "tpubuild_test.scaled_tanh" attr { key: "tfl_fusable_op" value { b: true } }')
def scaled_tanh(x: tf.Tensor) -> tf.Tensor:
    return 2.0 * tf.tanh(x)


# A composite of a name the converter does not know: kept, it is still converted op by op.
@tf.function(experimental_implements="tpubuild_test.unknown")
def unknown_composite(x: tf.Tensor) -> tf.Tensor:
    return tf.tanh(x) * 0.5


class TwoSignatures(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))

    @tf.function(input_signature=[tf.TensorSpec([1, 3], tf.float32, name="x")])
    def project(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"z": tf.matmul(x, self.w)}

    @tf.function(input_signature=[tf.TensorSpec([1, 3], tf.float32, name="x")])
    def squash(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"z": tf.tanh(tf.matmul(x, self.w))}


def save(module: tf.Module, path: Path, signatures: dict[str, Any] | None = None) -> Path:
    tf.saved_model.save(module, str(path), signatures=signatures or {"serving_default": module.serve})
    return path


def recipe(litert_target: dict[str, Any] | None = None, verify_datasets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The slice of a canonical recipe the LiteRT stages' SPECs read: `targets.litert` with
    the defaults filled in, as config/canonical.py fills them."""
    from tpubuild.pipeline import target

    return {
        "model": {"tags": ["serve"]},
        "converter": {},
        "verify": {"samples": 4, "seed": 0, **({"representative_datasets": verify_datasets} if verify_datasets else {})},
        "targets": {"tpu_savedmodel": {}, "litert": {**target("litert").defaults, **(litert_target or {})}},
    }


class Runner:
    """Runs the LiteRT stages as the engine does: options from SPEC, outputs by role."""

    def __init__(self, workspace: Path, out: Path):
        self.workspace, self.out = workspace, out
        self.count = 0

    def _dir(self, name: str) -> Path:
        self.count += 1
        path = self.out / f"{self.count}-{name}"
        path.mkdir(parents=True)
        return path

    def build(self, source: Path, target: dict[str, Any] | None = None, **recipe_args: Any) -> tuple[Path, StageResult]:
        options = litert.SPEC.options(recipe(target, **recipe_args))
        output = self._dir("litert")
        context = StageContext(self.workspace, inputs={"source": source})
        return output, litert.run(source, output, options, context)

    def verify(self, source: Path, built: Path, target: dict[str, Any] | None = None, **recipe_args: Any) -> tuple[Path, StageResult]:
        options = litert_verify.SPEC.options(recipe(target, **recipe_args))
        output = self._dir("litert_verify")
        context = StageContext(self.workspace, inputs={"source": source, "litert": built})
        return output, litert_verify.run(source, output, options, context)
