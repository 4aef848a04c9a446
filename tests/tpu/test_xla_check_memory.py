"""The tpu stage's XLA lowering check costs the weights' shapes, not their bytes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.compatibility import check_tpu_functions
from tpubuild.tpu.functions import resolve_tpu_functions

ROWS, COLS = 8192, 8192  # 256 MiB of float32


def _rss_peak_since_reset() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # proc(5): 5 resets the peak RSS
        f.write("5")


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_xla_check_does_not_materialize_the_weights(tmp_path):
    module = tf.Module()
    # Ones, not zeros: the checkpoint holds real bytes (what the check must not read or copy).
    module.w = tf.Variable(np.ones((ROWS, COLS), np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, ROWS], tf.float32)])
    def tpu_func(x):
        return tf.tanh(tf.matmul(x, module.w))

    module.tpu_func = tpu_func
    tf.saved_model.save(module, str(tmp_path / "m"), signatures={"serving_default": tpu_func},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": tpu_func}))
    del module, tpu_func
    model = SavedModel.load(tmp_path / "m")
    functions = resolve_tpu_functions(model, [{"function_alias": "tpu_func"}])
    check_tpu_functions(model, functions)  # the first pays XLA's kernel registration and tracing
    _reset_peak()
    before = _rss()
    check_tpu_functions(model, functions)  # lowers the function to HLO with a variable of the weight's shape
    grown = _rss_peak_since_reset() - before
    # tf.zeros of the weight's shape grew it by the weight's 256 MiB; an uninitialized
    # buffer whose pages are never touched, by what tracing and lowering allocate (~10 MiB).
    assert grown < ROWS * COLS * 4 // 4, f"the XLA check grew the peak RSS by {grown / 2**20:.0f} MiB"
