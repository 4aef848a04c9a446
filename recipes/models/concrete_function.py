"""A model whose TPU function has no alias and is named by its concrete function name.

This is the case of a SavedModel exported by someone else: the recipe names
`__inference_dense_block_<N>` from the FunctionDefLibrary. TensorFlow numbers traced
functions with a per-process counter, so tpubuild renames every exported function to
`<name>_<10 digits>`, the digits taken from the function's content
(tpubuild/savedmodel/reproducible.py): the name no longer depends on what else the
process traced, only on the model and the TensorFlow version. `export` applies the
same renaming and checks the name against CONCRETE_FUNCTION_NAME.

To find the name yourself: `python recipes/models/concrete_function.py /tmp/cf` exports
and prints every function of the library.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.reproducible import make_reproducible

# Must equal converter.tpu_functions[0].concrete_function_name in recipes/concrete_function.yaml.
CONCRETE_FUNCTION_NAME = "__inference_dense_block_8149458093"
FEATURES, HIDDEN = 4, 8


class Regressor(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(3)
        self.w1 = tf.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype("float32"), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(HIDDEN, 1)).astype("float32"), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def dense_block(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.squeeze(self.dense_block(x), axis=-1)}


def function_names(saved_model_dir: str) -> list[str]:
    """Names in the SavedModel's FunctionDefLibrary, sorted."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return sorted(f.signature.name for f in proto.meta_graphs[0].graph_def.library.function)


def _export_here(output_dir: str) -> None:
    model = Regressor()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})
    make_reproducible(output_dir)  # what tpubuild does to every export: content-derived names


def export(output_dir: str) -> None:
    """Export, then check the dense block's concrete name."""
    _export_here(output_dir)
    found = [n for n in function_names(output_dir) if re.fullmatch(r"__inference_dense_block_\d+", n)]
    if found != [CONCRETE_FUNCTION_NAME]:
        raise RuntimeError(
            f"concrete_function.py: the dense block was exported as {found}, not "
            f"{CONCRETE_FUNCTION_NAME!r} (another TensorFlow version?); update "
            "CONCRETE_FUNCTION_NAME and recipes/concrete_function.yaml"
        )


if __name__ == "__main__":
    _export_here(sys.argv[1])
    print("\n".join(function_names(sys.argv[1])))
