"""Tiny real SavedModels for the batching, bfloat16 and IO-shape stages (session-scoped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages.base import StageContext
from tpubuild.tpu.functions import resolve_tpu_functions
from tpubuild.tpu.placement import place_on_tpu
from tpubuild.tpu.twin import make_cpu_twin

SPEC4 = tf.TensorSpec([None, 4], tf.float32)


def _save(module: tf.Module, path: Path, signatures: dict, aliases: dict) -> Path:
    options = tf.saved_model.SaveOptions(function_aliases=aliases)
    tf.saved_model.save(module, str(path), signatures=signatures, options=options)
    return path


class Toy(tf.Module):
    """serve(x) = 2 * tpu_func(x); tpu_func is a dense layer with two variables."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32), name="w")
        self.b = tf.Variable(rng.normal(size=(3,)).astype(np.float32), name="b")

    @tf.function(input_signature=[SPEC4])
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x, self.w) + self.b)

    @tf.function(input_signature=[SPEC4])
    def serve(self, x):
        return {"y": self.tpu_func(x) * 2.0}


class TwoCalls(Toy):
    """serve calls tpu_func at two call sites."""

    @tf.function(input_signature=[SPEC4])
    def serve(self, x):
        return {"y": self.tpu_func(x) - self.tpu_func(2.0 * x)}


class Mlp(tf.Module):
    """A softmax classifier with a 256x256 kernel; the CPU side also reads `b2`."""

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.w1 = tf.Variable(rng.normal(size=(16, 256)).astype(np.float32) / 4, name="w1")
        self.w2 = tf.Variable(rng.normal(size=(256, 256)).astype(np.float32) / 16, name="w2")
        self.b2 = tf.Variable(rng.normal(size=(256,)).astype(np.float32), name="b2")

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def tpu_func(self, x):
        h = tf.nn.relu(tf.matmul(x, self.w1))
        return tf.nn.softmax(tf.matmul(h, self.w2) + self.b2)

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def serve(self, x):
        return {"probs": self.tpu_func(x), "bias_sum": tf.reduce_sum(self.b2) + 0.0 * x[:, 0]}


class ControlFlow(tf.Module):
    """tf.cond and tf.while_loop inside the TPU function, both reading a variable."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1, 1, 16).reshape(4, 4).astype(np.float32), name="w")

    @tf.function(input_signature=[SPEC4])
    def tpu_func(self, x):
        x = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, self.w), lambda: x - 1.0)
        _, x = tf.while_loop(
            lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, self.w))), (0, x)
        )
        return x

    @tf.function(input_signature=[SPEC4])
    def serve(self, x):
        return {"y": self.tpu_func(x)}


class AlreadyBf16(tf.Module):
    @tf.function(input_signature=[SPEC4])
    def tpu_func(self, x):
        return tf.cast(tf.cast(x, tf.bfloat16) * tf.constant(2.0, tf.bfloat16), tf.float32)

    @tf.function(input_signature=[SPEC4])
    def serve(self, x):
        return {"y": self.tpu_func(x)}


class Image(tf.Module):
    """A TPU function with a rank-4 input, a variable-length input and a rank-4 output."""

    def __init__(self) -> None:
        self.w = tf.Variable(tf.constant([0.5, -1.0, 2.0]), name="w")

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4, 4, 3], tf.float32),
            tf.TensorSpec([None, None, 2], tf.float32),
        ]
    )
    def tpu_func(self, image, seq):
        scaled = image * self.w
        return {
            "scaled": scaled,
            "pooled": tf.reduce_mean(scaled, axis=[1, 2]) + tf.reduce_sum(seq, axis=[1, 2])[:, None],
        }

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4, 4, 3], tf.float32),
            tf.TensorSpec([None, None, 2], tf.float32),
        ]
    )
    def serve(self, image, seq):
        out = self.tpu_func(image, seq)
        return {"scaled": out["scaled"] + 1.0, "pooled": out["pooled"]}


class BadBatch(tf.Module):
    """One aliased function per batching requirement, each called from a signature."""

    def __init__(self) -> None:
        self.w = tf.Variable(tf.ones([3]), name="w")

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def scalar_fn(self, x):
        return x * self.w

    @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32)])
    def static_fn(self, x):
        return x * self.w

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def reduce_fn(self, x):
        return tf.reduce_sum(x * self.w, axis=0)

    @tf.function(input_signature=[tf.SparseTensorSpec([None, 3], tf.float32)])
    def sparse_fn(self, x):
        return tf.sparse.reduce_sum(x, axis=1, keepdims=True) * self.w

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def call_scalar(self, x):
        return {"y": self.scalar_fn(x)}

    @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32)])
    def call_static(self, x):
        return {"y": self.static_fn(x)}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def call_reduce(self, x):
        return {"y": self.reduce_fn(x)}

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.int64),
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([2], tf.int64),
        ]
    )
    def call_sparse(self, indices, values, shape):
        return {"y": self.sparse_fn(tf.SparseTensor(indices, values, shape))}


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Source SavedModels by name."""
    root = tmp_path_factory.mktemp("sources")
    out = {}
    toy = Toy()
    out["toy"] = _save(toy, root / "toy", {"serving_default": toy.serve}, {"tpu_func": toy.tpu_func})
    two = TwoCalls()
    out["two_calls"] = _save(two, root / "two_calls", {"serving_default": two.serve}, {"tpu_func": two.tpu_func})
    mlp = Mlp()
    out["mlp"] = _save(mlp, root / "mlp", {"serving_default": mlp.serve}, {"tpu_func": mlp.tpu_func})
    flow = ControlFlow()
    out["control_flow"] = _save(
        flow, root / "control_flow", {"serving_default": flow.serve}, {"tpu_func": flow.tpu_func}
    )
    bf = AlreadyBf16()
    out["already_bf16"] = _save(
        bf, root / "already_bf16", {"serving_default": bf.serve}, {"tpu_func": bf.tpu_func}
    )
    image = Image()
    out["image"] = _save(
        image, root / "image", {"serving_default": image.serve}, {"tpu_func": image.tpu_func}
    )
    bad = BadBatch()
    out["bad_batch"] = _save(
        bad,
        root / "bad_batch",
        {
            "scalar": bad.call_scalar,
            "static": bad.call_static,
            "reduce": bad.call_reduce,
            "sparse": bad.call_sparse,
        },
        {name: getattr(bad, name) for name in ("scalar_fn", "static_fn", "reduce_fn", "sparse_fn")},
    )
    return out


@pytest.fixture(scope="session")
def placed(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy, two_calls, mlp, image and control_flow models with `tpu_func` placed on the TPU (A's placement code)."""
    root = tmp_path_factory.mktemp("placed")
    out = {}
    for name in ("toy", "mlp", "image", "two_calls", "control_flow"):
        model = SavedModel.load(models[name])
        place_on_tpu(model, resolve_tpu_functions(model, [{"function_alias": "tpu_func"}]))
        (root / name).mkdir()
        model.save(root / name)
        out[name] = root / name
    return out


@pytest.fixture
def context(tmp_path: Path) -> StageContext:
    return StageContext(workspace=tmp_path)


@pytest.fixture
def run_stage(tmp_path: Path, context: StageContext) -> Callable[..., Any]:
    """Run stage `run` on `src` into a fresh directory; returns (output dir, StageResult)."""

    def go(run: Callable[..., Any], src: Path, options: dict[str, Any]) -> tuple[Path, Any]:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        return out, run(src, out, options, context)

    return go


@pytest.fixture
def cpu_twin(tmp_path: Path) -> Callable[[Path], Any]:
    """Load the CPU twin of a (possibly TPU-placed) SavedModel."""

    def go(path: Path) -> Any:
        dst = tmp_path / f"twin{len(list(tmp_path.iterdir()))}"
        make_cpu_twin(path, dst)
        return tf.saved_model.load(str(dst))

    return go

