"""The variables checkpoint of a SavedModel: keys by object-graph node, bfloat16 rewrite."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tensorflow.core.protobuf import trackable_object_graph_pb2

from tpubuild.savedmodel.model import SavedModel

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
PREFIX = Path("variables") / "variables"


def _reader(model_dir: Path):
    import tensorflow as tf

    return tf.train.load_checkpoint(str(model_dir / PREFIX))


def checkpoint_keys(model: SavedModel, node_ids: set[int]) -> set[str]:
    """Checkpoint keys (`w/.ATTRIBUTES/VARIABLE_VALUE`) of the given object-graph nodes."""
    if not node_ids:
        return set()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(_reader(model.path).get_tensor(OBJECT_GRAPH_KEY))
    return {
        attr.checkpoint_key
        for node_id in node_ids
        for attr in graph.nodes[node_id].attributes
        if attr.name == "VARIABLE_VALUE"
    }


def write_bfloat16(src_dir: Path, out_dir: Path, keys: set[str]) -> None:
    """Rewrite out_dir's checkpoint with `keys` stored as bfloat16 (same keys, same values
    rounded); the files are written beside the published ones and renamed into place, so
    hardlinks to the source checkpoint are replaced, never written through."""
    import tensorflow as tf

    reader = _reader(src_dir)
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = []
    for name in names:
        value = tf.constant(reader.get_tensor(name))
        tensors.append(tf.cast(value, tf.bfloat16) if name in keys else value)
    _write(out_dir, names, tensors)


def _write(out_dir: Path, names: list[str], tensors: list) -> None:
    """SaveV2 into a staging directory beside out_dir's checkpoint, then rename into place."""
    import tensorflow as tf

    variables = out_dir / PREFIX.parent
    staging = Path(tempfile.mkdtemp(dir=variables, prefix=".ckpt-"))
    try:
        tf.raw_ops.SaveV2(
            prefix=str(staging / PREFIX.name),
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            tensors=tensors,
        )
        for written in sorted(staging.iterdir()):
            os.replace(written, variables / written.name)
    finally:
        for left in staging.iterdir():
            left.unlink()
        staging.rmdir()


def write_without(src_dir: Path, out_dir: Path, keys: set[str], object_graph: bytes) -> None:
    """Rewrite out_dir's checkpoint without `keys` and with a new object graph (after
    variables were removed from the SavedModel); like `write_bfloat16`, the files are
    renamed into place, so hardlinks to the source checkpoint are never written through."""
    import tensorflow as tf

    reader = _reader(src_dir)
    names = sorted(n for n in reader.get_variable_to_dtype_map() if n not in keys)
    tensors = [tf.constant(object_graph) if name == OBJECT_GRAPH_KEY else tf.constant(reader.get_tensor(name))
               for name in names]
    _write(out_dir, names, tensors)
