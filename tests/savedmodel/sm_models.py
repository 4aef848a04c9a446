"""The tiny models the savedmodel tests export, and helpers to run them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

F = 4  # features of every float input

VEC = tf.TensorSpec([None, F], tf.float32)


class Zoo(tf.Module):
    """One model holding every scenario; each test names the functions it places."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.normal(size=(F, F)).astype("float32"), name="w")
        self.v = tf.Variable(rng.normal(size=(F, F)).astype("float32"), name="v")

    @tf.function(input_signature=[VEC])
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[VEC])
    def tpu_b(self, x):
        return tf.tanh(tf.matmul(x, self.v))

    @tf.function(input_signature=[VEC])
    def inner(self, x):
        return tf.matmul(x, self.v) * 0.5

    @tf.function(input_signature=[VEC])
    def outer_direct(self, x):
        return self.inner(x) + 1.0

    @tf.function(input_signature=[VEC])
    def middle(self, x):
        return self.inner(x) - 1.0

    @tf.function(input_signature=[VEC])
    def outer_indirect(self, x):
        return self.middle(x) * 2.0

    @tf.function(input_signature=[VEC])
    def control_flow(self, x):
        y = tf.cond(tf.reduce_sum(x) > 0.0, lambda: tf.matmul(x, self.w), lambda: -x)
        i, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 0.5 + 1.0), (tf.constant(0), y))
        return y

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def string_in(self, s):
        return tf.strings.to_number(s)

    @tf.function(input_signature=[tf.TensorSpec([None, F], tf.float64)])
    def f64_in(self, x):
        return tf.cast(x, tf.float32) * 2.0

    @tf.function(input_signature=[tf.SparseTensorSpec([None, F], tf.float32)])
    def sparse_in(self, sp):
        return tf.sparse.reduce_sum(sp, axis=1)

    @tf.function(input_signature=[VEC])
    def string_op(self, x):
        return x * tf.strings.to_number(tf.constant("1.5"))

    @tf.function(input_signature=[VEC])
    def dynamic_shape(self, x):
        # The target shape depends on the data: not a compile-time constant for XLA.
        n = tf.cast(tf.reduce_sum(tf.abs(x)) > 0.0, tf.int32) + 1
        return tf.reshape(x, tf.stack([n, -1]))

    @tf.function(input_signature=[VEC])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 1.0}

    @tf.function(input_signature=[VEC])
    def serve_again(self, x):
        return {"z": self.tpu_func(x) * 3.0}

    @tf.function(input_signature=[VEC])
    def serve_two(self, x):
        return {"a": self.tpu_func(x), "b": self.tpu_b(x)}

    @tf.function(input_signature=[VEC])
    def serve_chains(self, x):
        return {"d": self.outer_direct(x), "i": self.outer_indirect(x)}

    @tf.function(input_signature=[VEC])
    def serve_control_flow(self, x):
        return {"c": self.control_flow(x)}


ALIASES = (
    "tpu_func", "tpu_b", "inner", "outer_direct", "middle", "outer_indirect", "control_flow",
    "string_in", "f64_in", "sparse_in", "string_op", "dynamic_shape",
)
SIGNATURES = {
    "serving_default": "serve",
    "serve_again": "serve_again",
    "serve_two": "serve_two",
    "serve_chains": "serve_chains",
    "serve_control_flow": "serve_control_flow",
}


class Jit(tf.Module):
    """Two jit-compiled functions, one calling the other: only the outer one goes to the TPU."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(tf.ones([F, 2]), name="w")

    @tf.function(jit_compile=True, input_signature=[VEC])
    def jit_inner(self, x):
        return tf.nn.relu(x)

    @tf.function(jit_compile=True, input_signature=[VEC])
    def jit_outer(self, x):
        return tf.matmul(self.jit_inner(x), self.w)

    @tf.function(input_signature=[VEC])
    def serve(self, x):
        return {"y": self.jit_outer(x) + 1.0}


def run_signature(path: Path, key: str, x: tf.Tensor) -> dict[str, np.ndarray]:
    loaded = tf.saved_model.load(str(path))
    return {k: v.numpy() for k, v in loaded.signatures[key](x=x).items()}
