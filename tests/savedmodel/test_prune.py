"""savedmodel/prune.py on a real SavedModel: functions a server cannot reach (a method
saved with the model that no signature calls and no alias names) go with the variables
only they read; what the signatures read stays, and the pruned model loads and computes
what it computed before."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.checkpoint import write_without
from tpubuild.savedmodel.model import SavedModel
from tpubuild.savedmodel.prune import prune, unserved_objects


class WithExtraMethod(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.full((4, 2), 0.5, "float32"), name="served_w")
        # Read only by `extra`: a Keras layer method saved beside the model is like it.
        self.big = tf.Variable(np.ones((64, 64), "float32"), name="extra_w")

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w)}

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def extra(self, x):
        return tf.matmul(x, self.big)


def test_unserved_method_and_its_variable_are_removed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    module = WithExtraMethod()
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    model = SavedModel.load(src, ["serve"])
    unserved, nodes = unserved_objects(model)
    assert unserved and nodes, "the `extra` method is served by nothing and must be found"

    removed, object_graph, keys = prune(model)
    assert removed == ["extra_w"], removed
    dst = tmp_path / "dst"
    dst.mkdir()
    model.save(dst)
    assert object_graph is not None
    write_without(src, dst, keys, object_graph)
    shutil.rmtree(src)  # the pruned copy must not read anything from its source

    loaded = tf.saved_model.load(str(dst))
    assert not hasattr(loaded, "extra")
    assert not hasattr(loaded, "big") and loaded.w.name == "served_w:0"
    x = np.arange(8, dtype="float32").reshape(2, 4)
    # The same MatMul on the same values in the same process: only float rounding differs.
    np.testing.assert_allclose(loaded.signatures["serving_default"](x=tf.constant(x))["y"].numpy(),
                               x @ np.full((4, 2), 0.5, "float32"), rtol=1e-6)


def test_a_model_whose_functions_are_all_served_keeps_everything(tmp_path: Path) -> None:
    src = tmp_path / "src"
    module = WithExtraMethod()
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve, "extra": module.extra})
    model = SavedModel.load(src, ["serve"])
    removed, object_graph, _ = prune(model)
    assert removed == [] and object_graph is None
