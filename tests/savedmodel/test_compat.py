"""Forward compatibility: default-valued attributes stripped on write, the oldest TF release."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework.meta_graph import stripped_op_list_for_graph

from tpubuild.report import compat, tf_op_history
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import batch, tpu
from tpubuild.stages.base import StageContext

SPEC = tf.TensorSpec([None, 4], tf.float32)
BATCH = {
    "num_batch_threads": 2,
    "max_batch_size": 8,
    "batch_timeout_micros": 1000,
    "allowed_batch_sizes": [4, 8],
    "max_enqueued_batches": 10,  # BatchFunction's default: stripped
    "disable_large_batch_splitting": True,  # enable_large_batch_splitting=false: the default
}


class Small(tf.Module):
    def __init__(self) -> None:
        self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, name="w")

    @tf.function(input_signature=[SPEC])
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 1.0}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The source, the tpu stage's output, and the batch stage's output."""
    root = tmp_path_factory.mktemp("compat")
    small = Small()
    options = tf.saved_model.SaveOptions(function_aliases={"tpu_func": small.tpu_func})
    tf.saved_model.save(small, str(root / "source"), signatures={"serving_default": small.serve}, options=options)
    context = StageContext(workspace=root)
    stage_options = {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}], "batch_options": [BATCH]}
    paths = {"source": root / "source"}
    for name, stage, src in (("tpu", tpu, "source"), ("batch", batch, "tpu")):
        (root / name).mkdir()
        stage.run(paths[src], root / name, stage_options, context)
        paths[name] = root / name
    return paths


def _nodes(model: SavedModel) -> list[NodeDef]:
    graph = model.meta_graph.graph_def
    return list(graph.node) + [n for f in graph.library.function for n in f.node_def]


def _default_valued(node: NodeDef) -> list[str]:
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return []
    return [
        a.name for a in op_def.attr
        if a.HasField("default_value") and a.name in node.attr and node.attr[a.name] == a.default_value
    ]


def test_rewrites_add_defaults_that_the_write_strips(converted, tmp_path):
    # tf.saved_model.save strips (tensorflow/python/saved_model/save.py), but tpubuild's
    # rewrites build nodes with every default filled in (as graph import would).
    from tpubuild.transforms import batching

    model = SavedModel.load(converted["tpu"])
    assert not any(_default_valued(n) for n in _nodes(model))
    (site,) = [
        batching.BatchSite(caller, node, node.attr["f"].func.name)
        for caller, fdef in model.functions.items()
        for node in fdef.node_def
        if node.op == "TPUPartitionedCall"
    ]
    batching.batch_site(model, site, BATCH, batching.model_digest(model))
    (node,) = [n for n in _nodes(model) if n.op == "BatchFunction"]
    assert {"batch_padding_policy", "mixed_priority_policy", "container"} <= set(_default_valued(node))
    model.save(tmp_path)
    assert not any(_default_valued(n) for n in _nodes(SavedModel.load(tmp_path)))


@pytest.mark.parametrize("stage", ["tpu", "batch"])
def test_every_write_strips_default_valued_attributes(converted, stage):
    model = SavedModel.load(converted[stage])
    found = {f"{n.name}.{a}": n.op for n in _nodes(model) for a in _default_valued(n)}
    assert found == {}
    assert model.meta_graph.meta_info_def.stripped_default_attrs is True
    # The op list is recomputed as tf.saved_model.save computes it, new ops included.
    listed = {op.name for op in model.meta_graph.meta_info_def.stripped_op_list.op}
    assert listed == {op.name for op in stripped_op_list_for_graph(model.meta_graph.graph_def).op}
    assert {"batch": "BatchFunction", "tpu": "TPUPartitionedCall"}[stage] in listed


def test_stripped_batch_function_keeps_what_differs_from_the_defaults(converted):
    model = SavedModel.load(converted["batch"])
    (node,) = [n for n in _nodes(model) if n.op == "BatchFunction"]
    assert sorted(node.attr) == [
        "Tcaptured", "Tin", "Tout", "allowed_batch_sizes", "batch_timeout_micros", "batching_queue",
        "f", "max_batch_size", "num_batch_threads", "shared_name",
    ]


def test_stripped_artifact_runs_like_the_source(converted, tmp_path):
    from tpubuild.tpu.twin import make_cpu_twin

    make_cpu_twin(converted["batch"], tmp_path / "twin")
    x = tf.constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    want = tf.saved_model.load(str(converted["source"])).signatures["serving_default"](x=x)["y"]
    got = tf.saved_model.load(str(tmp_path / "twin")).signatures["serving_default"](x=x)["y"]
    # Same kernels, same graph, but the batched path may reorder float work: a tolerance.
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_min_version_names_the_newest_op_or_attribute(converted):
    # TF 2.21's exporter writes VarHandleOp.debug_name, new in 2.15; the batch stage's
    # attributes are all older, and its newer ones (batch_padding_policy, 2.18) are stripped.
    version, reason = compat.min_tensorflow_version(converted["batch"], ["serve"])
    assert version == "2.15"
    assert reason == (
        'attribute debug_name of VarHandleOp (node "w" in the graph) first appears in '
        "TensorFlow 2.15 (not in 2.14)"
    )


def test_min_version_sees_a_non_default_new_attribute(converted):
    model = SavedModel.load(converted["batch"])
    (node,) = [n for n in _nodes(model) if n.op == "BatchFunction"]
    node.attr["batch_padding_policy"].s = b"MINIMIZE_TPU_COST_PER_REQUEST"
    version, reason = compat.required_version(model.meta_graph)
    assert (version, reason.split(" (node")[0]) == ("2.18", "attribute batch_padding_policy of BatchFunction")
    assert reason.endswith("first appears in TensorFlow 2.18 (not in 2.17)")


def test_min_version_of_a_model_with_nothing_new_is_the_baseline():
    graph = tf.compat.v1.GraphDef()
    graph.node.add(name="c", op="Const").attr["dtype"].type = tf.float32.as_datatype_enum
    meta = tf.compat.v1.MetaGraphDef(graph_def=graph)
    assert compat.required_version(meta) == (
        "2.12",
        "no op or attribute newer than TensorFlow 2.12, the oldest release in tpubuild's op "
        "history; older releases were not checked",
    )


def test_op_history_agrees_with_this_tensorflow():
    # Every op and attribute the history dates exists in the TensorFlow tpubuild runs with
    # (2.21, the newest release read), so none of its names is a parsing accident.
    for op in tf_op_history.OPS:
        assert op_def_registry.get(op) is not None, op
    for op, name in tf_op_history.ATTRS:
        op_def = op_def_registry.get(op)
        names = {a.name for a in op_def.attr} | {a.name for a in op_def.input_arg}
        assert name in names, (op, name)


def test_report_stage_records_min_tensorflow(converted, tmp_path):
    import json

    from tpubuild.stages import report

    context = StageContext(
        workspace=tmp_path, inputs={"source": converted["source"]}
    )
    result = report.run(converted["batch"], tmp_path, {"tags": ["serve"]}, context)
    written = json.loads((tmp_path / "tpubuild-report.json").read_text())
    assert result.summary["min_tensorflow"] == written["min_tensorflow"] == {
        "version": "2.15",
        "reason": 'attribute debug_name of VarHandleOp (node "w" in the graph) first appears in '
        "TensorFlow 2.15 (not in 2.14)",
    }
