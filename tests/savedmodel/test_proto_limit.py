"""Protobuf's 2 GiB limit (issue 54 item 4): a saved_model.pb over it, or edits that would
make one, are one line naming the cause (weights as constants) and the fix (variables),
never a protobuf error. The logic on small protos with a lowered limit; a real pb near the
limit is the slow tier's (2 GiB of disk and memory)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpubuild.errors import ConversionError
from tpubuild.savedmodel import proto_limit
from tpubuild.savedmodel.model import SavedModel


@pytest.fixture(scope="module")
def constant_model(tmp_path_factory):
    """A SavedModel whose 64 KiB weight is a constant in the graph, not a variable."""
    # Random, not ones: a constant of one repeated value is saved as that value once.
    weight = tf.constant(np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32))
    module = tf.Module()
    module.f = tf.function(lambda x: tf.matmul(x, weight), autograph=False, input_signature=[tf.TensorSpec([None, 128], tf.float32)])
    path = tmp_path_factory.mktemp("constant") / "m"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.f})
    return path


def test_over_the_limit_when_written_is_one_line_naming_constants_and_variables(constant_model, tmp_path):
    model = SavedModel.load(constant_model)
    size = len(model.proto.SerializeToString(deterministic=True))
    assert proto_limit.constant_bytes(model.proto) >= 128 * 128 * 4
    with pytest.raises(ConversionError) as err:
        proto_limit.serialize(model.proto, tmp_path, limit=size - 1)
    message = str(err.value)
    assert "\n" not in message
    assert "over protobuf's" in message and "constants" in message and "export the weights as variables" in message
    # At the limit exactly, it is written as TF's own would be.
    assert proto_limit.serialize(model.proto, tmp_path, limit=size) == model.proto.SerializeToString(deterministic=True)


def test_over_the_limit_when_read_is_refused_before_parsing(constant_model):
    pb = constant_model / "saved_model.pb"
    with pytest.raises(ConversionError) as err:
        proto_limit.check_readable(pb, limit=pb.stat().st_size - 1)
    assert "cannot be read" in str(err.value) and "export the weights as variables" in str(err.value)
    proto_limit.check_readable(pb, limit=pb.stat().st_size)


def test_chunked_savedmodel_names_the_cause(tmp_path):
    (tmp_path / "saved_model.cpb").write_bytes(b"")
    with pytest.raises(ConversionError) as err:
        SavedModel.load(tmp_path)
    assert "saved_model.cpb" in str(err.value) and "variables" in str(err.value)


@pytest.mark.slow
def test_a_graph_just_over_two_gib_of_constants_is_one_line(tmp_path):
    """A real proto over the limit: two 1 GiB constants (~2 GiB of memory, no disk)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    graph = proto.meta_graphs.add().graph_def
    for i in range(2):
        node = graph.node.add()
        node.op, node.name = "Const", f"w{i}"
        node.attr["value"].tensor.tensor_content = bytes(1 << 30)
    with pytest.raises(ConversionError) as err:
        proto_limit.serialize(proto, tmp_path)
    assert "over protobuf's 2.00 GiB limit" in str(err.value) and "(2.00 GiB of it constants)" in str(err.value)
    assert not (tmp_path / "saved_model.pb").exists()
