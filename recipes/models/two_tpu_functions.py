"""Two-tower retrieval scorer: a query tower and an item tower, each a TPU function.

`tpu_func_1` embeds the query, `tpu_func_2` embeds the item; the dot product that
scores the pair stays on the CPU. Both towers are placed on the TPU by alias.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

QUERY_FEATURES, ITEM_FEATURES, EMBEDDING = 4, 6, 8


def _dense(rng: np.random.Generator, rows: int, cols: int, name: str) -> tf.Variable:
    return tf.Variable(rng.normal(scale=0.5, size=(rows, cols)).astype("float32"), name=name)


class TwoTower(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(1)
        self.query_w = _dense(rng, QUERY_FEATURES, EMBEDDING, "query_w")
        self.item_w = _dense(rng, ITEM_FEATURES, EMBEDDING, "item_w")

    @tf.function(input_signature=[tf.TensorSpec([None, QUERY_FEATURES], tf.float32)])
    def tpu_func_1(self, query: tf.Tensor) -> tf.Tensor:
        return tf.nn.tanh(tf.matmul(query, self.query_w))

    @tf.function(input_signature=[tf.TensorSpec([None, ITEM_FEATURES], tf.float32)])
    def tpu_func_2(self, item: tf.Tensor) -> tf.Tensor:
        return tf.nn.tanh(tf.matmul(item, self.item_w))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, QUERY_FEATURES], tf.float32, name="query"),
            tf.TensorSpec([None, ITEM_FEATURES], tf.float32, name="item"),
        ]
    )
    def serve(self, query: tf.Tensor, item: tf.Tensor) -> dict[str, tf.Tensor]:
        score = tf.reduce_sum(self.tpu_func_1(query) * self.tpu_func_2(item), axis=-1)
        return {"score": score}


def export(output_dir: str) -> None:
    """Write the SavedModel with the aliases `tpu_func_1` and `tpu_func_2`."""
    model = TwoTower()
    aliases = {"tpu_func_1": model.tpu_func_1, "tpu_func_2": model.tpu_func_2}
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases=aliases),
    )
