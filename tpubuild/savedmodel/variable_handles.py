"""One graph handle per weight: merge the duplicate handles Keras 3 models are saved with.

A Keras 3 model saved with `tf.saved_model.save` (inside a `tf.Module`, the converter
guide's way) has two `VarHandleOp`s per weight in the top-level graph (keras-team/keras
#19274; keras-team/keras#20095 shows the same failure): Keras's variable wrapper exports
its inner `tf.Variable` (the handle the traced functions captured, e.g. `dense/kernel`)
and then stands a *new* `tf.Variable` initialized from it in the object map
(keras/src/backend/tensorflow/core.py `Variable._export_to_saved_model_graph`:
`object_map[self] = tf.Variable(object_map[self.value])`). The saver saves and restores
that new one (`Variable`, `Variable_1`, ...; the `_traced_save`/`_traced_restore` calls
take it), while the signature calls read the first. TF2's `tf.saved_model.load` does not
notice (it rebuilds one variable per object-graph node and binds the functions' captures
by node id), but every session-based consumer does: TF Serving's SavedModelBundle,
TF's quantizer, the LiteRT converter and the XLA AOT freezer restore the duplicate and
then read the never-restored handle (`Could not find variable dense/bias`).

The duplicate is recognized by its structure, not by Keras's names: a `VarHandleOp` V
whose `AssignVariableOp` initializer is `ReadVariableOp(X)` of another `VarHandleOp` X of
the same dtype and shape. `merge_duplicate_handles` makes every reader of V (the saver's
save and restore calls) read X instead and removes V with its initializer, its
`IsInitialized` and `Read` nodes: the graph is then what TF writes for a plain
`tf.Variable` (one `VarHandleOp`, its `Read/ReadVariableOp`). Checkpoint keys, the object
graph and the function library are untouched: the checkpoint is read through the object
graph's keys and the restore function takes the handle as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

VAR_HANDLE = "VarHandleOp"


@dataclass(frozen=True)
class Duplicate:
    handle: str  # the duplicate VarHandleOp (restored by the checkpoint)
    kept: str  # the VarHandleOp the functions read, which now also gets restored
    removed: tuple[str, ...]  # the duplicate and its initializer / read nodes


def find_duplicate_handles(meta_graph: MetaGraphDef) -> list[Duplicate]:
    """The duplicate handles of the top-level graph (see the module docstring)."""
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    consumers: dict[str, list[NodeDef]] = {}
    for node in meta_graph.graph_def.node:
        for ref in node.input:
            consumers.setdefault(_node_name(ref), []).append(node)
    found = []
    for assign in meta_graph.graph_def.node:
        if assign.op != "AssignVariableOp" or len(assign.input) < 2:
            continue
        handle, read = nodes.get(_node_name(assign.input[0])), nodes.get(_node_name(assign.input[1]))
        if handle is None or handle.op != VAR_HANDLE or read is None or read.op != "ReadVariableOp":
            continue
        kept = nodes.get(_node_name(read.input[0])) if read.input else None
        if kept is None or kept.op != VAR_HANDLE or kept.name == handle.name or not _same_variable(handle, kept):
            continue
        removed = [handle.name, assign.name]
        if all(c.name == assign.name for c in consumers.get(read.name, [])):
            removed.append(read.name)
        # The duplicate's own bookkeeping: IsInitialized and Read nodes that read only it.
        for consumer in consumers.get(handle.name, []):
            if consumer.op in ("VarIsInitializedOp", "ReadVariableOp") and len(consumer.input) == 1 \
                    and not consumers.get(consumer.name):
                removed.append(consumer.name)
        found.append(Duplicate(handle.name, kept.name, tuple(removed)))
    return found


def merge_duplicate_handles(meta_graph: MetaGraphDef) -> list[Duplicate]:
    """Rewrite the graph so each weight has one handle, read and restored; returns what merged."""
    duplicates = find_duplicate_handles(meta_graph)
    if not duplicates:
        return []
    kept_for = {d.handle: d.kept for d in duplicates}
    removed = {name for d in duplicates for name in d.removed}
    graph = meta_graph.graph_def
    survivors = [node for node in graph.node if node.name not in removed]
    for node in survivors:
        inputs = []
        for ref in node.input:
            name = _node_name(ref)
            if ref.startswith("^") and name in removed:
                continue  # a control edge on a removed initializer: nothing left to wait for
            if name in kept_for:
                ref = ref.replace(name, kept_for[name], 1)
            inputs.append(ref)
        del node.input[:]
        node.input.extend(inputs)
    del graph.node[:]
    graph.node.extend(survivors)
    return duplicates


def normalize_in_place(saved_model_dir: Path) -> list[Duplicate]:
    """Merge the duplicate handles of every MetaGraphDef of a SavedModel this process wrote
    (the export stage's output); returns what merged. The pb is rewritten atomically."""
    from tensorflow.core.protobuf import saved_model_pb2

    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.reproducible import write_fingerprint

    pb = Path(saved_model_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(pb.read_bytes())
    merged = [d for meta_graph in proto.meta_graphs for d in merge_duplicate_handles(meta_graph)]
    if merged:
        write_atomic(pb, proto.SerializeToString(deterministic=True))
        write_fingerprint(Path(saved_model_dir))
    return merged


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _same_variable(a: NodeDef, b: NodeDef) -> bool:
    return a.attr["dtype"].type == b.attr["dtype"].type and \
        a.attr["shape"].SerializeToString() == b.attr["shape"].SerializeToString()
