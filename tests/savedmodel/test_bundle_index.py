"""savedmodel/bundle_index.py reads each tensor's size from a checkpoint's variables.index
without TensorFlow: the sizes TensorFlow's own checkpoint reader gives, for a real
SavedModel of tensors of several sizes and dtypes; what it cannot read is None."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.bundle_index import largest_tensor_bytes, tensor_sizes


def test_sizes_are_the_checkpoint_readers(tmp_path):
    module = tf.Module()
    module.small = tf.Variable(np.ones((3, 5), np.float32))
    module.big = tf.Variable(np.ones((300, 70), np.float32))
    module.half = tf.Variable(np.ones((1000,), np.float16))
    module.count = tf.Variable(np.int64(7))
    tf.saved_model.save(module, str(tmp_path / "m"))
    reader = tf.train.load_checkpoint(str(tmp_path / "m" / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    expected = {name: int(np.prod(shape)) * dtypes[name].size
                for name, shape in reader.get_variable_to_shape_map().items() if dtypes[name] != tf.string}
    sizes = tensor_sizes(tmp_path / "m" / "variables" / "variables.index")
    assert sizes is not None and {k: sizes[k] for k in expected} == expected
    assert largest_tensor_bytes(tmp_path / "m") == 300 * 70 * 4


def test_what_is_not_an_index_is_none(tmp_path):
    (tmp_path / "variables").mkdir()
    assert largest_tensor_bytes(tmp_path) is None  # no index
    (tmp_path / "variables" / "variables.index").write_bytes(b"\0" * 100)
    assert largest_tensor_bytes(tmp_path) is None  # no table's magic
