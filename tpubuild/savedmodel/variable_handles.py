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

Keras 3's own export (`model.export()`, `keras.export.ExportArchive.write_out`) leaves a
third handle per weight, read by nothing. ExportArchive saves an AutoTrackable holding
the Keras variables (`variables`, `trainable_variables`, a collection added with
`add_variable_collection`) *and* the `tf.Variable`s its endpoints capture
(`_all_variables`, keras/src/export/saved_model_export_archive.py
`_filter_and_track_resources`), which are those Keras variables' inner values. The save
exports each inner `tf.Variable` twice, as its own object-graph node and again inside the
Keras wrapper's `_export_to_saved_model_graph`; the second export overwrites the object
map, so the functions capture and the saver restores its handle (`dense/bias_1`, which the
wrapper's copy `Variable` duplicates), and the first (`dense/bias`) is read only by its
own `Read` node and restored by nothing. TF Serving never runs it, but it stays uninitialized, so a session
check of every variable (verify/serving_load.py) and any tool that reads every variable
(the LiteRT and XLA AOT freezers) trip on it. `remove_unused_handles` deletes such a
handle with its bookkeeping nodes: nothing read it, so nothing changes meaning.
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


def normalize_handles(meta_graph: MetaGraphDef) -> list[Duplicate | Unused]:
    """One handle per weight, read and restored: merge duplicates, then drop the handles
    left read by nothing (the merge itself leaves none; Keras's own export does)."""
    return [*merge_duplicate_handles(meta_graph), *remove_unused_handles(meta_graph)]


@dataclass(frozen=True)
class Unused:
    handle: str  # a VarHandleOp that no function, saver or signature reads
    removed: tuple[str, ...]  # it and its own IsInitialized / Read nodes


# Nodes that only look at one variable: a handle whose consumers are all of these (and
# which nothing consumes in turn) is read by nothing that runs.
_BOOKKEEPING = ("ReadVariableOp", "VarIsInitializedOp")


def find_unused_handles(meta_graph: MetaGraphDef) -> list[Unused]:
    """Top-level VarHandleOps read by nothing but their own unread bookkeeping nodes and
    named by no signature, saver or collection (see the module docstring)."""
    graph = meta_graph.graph_def
    consumers: dict[str, list[NodeDef]] = {}
    for node in graph.node:
        for ref in node.input:
            consumers.setdefault(_node_name(ref), []).append(node)
    named = _named_outside_the_graph(meta_graph)
    found = []
    for handle in graph.node:
        if handle.op != VAR_HANDLE or handle.name in named:
            continue
        users = consumers.get(handle.name, [])
        if all(u.op in _BOOKKEEPING and len(u.input) == 1 and u.name not in named and not consumers.get(u.name)
               for u in users):
            found.append(Unused(handle.name, (handle.name, *(u.name for u in users))))
    return found


def remove_unused_handles(meta_graph: MetaGraphDef) -> list[Unused]:
    unused = find_unused_handles(meta_graph)
    removed = {name for u in unused for name in u.removed}
    if removed:
        graph = meta_graph.graph_def
        survivors = [node for node in graph.node if node.name not in removed]
        del graph.node[:]
        graph.node.extend(survivors)
    return unused


def _named_outside_the_graph(meta_graph: MetaGraphDef) -> set[str]:
    """Nodes a loader fetches by name: signature tensors, the saver's ops, collections."""
    names = {_node_name(t.name) for sig in meta_graph.signature_def.values()
             for t in (*sig.inputs.values(), *sig.outputs.values())}
    saver = meta_graph.saver_def
    names |= {_node_name(n) for n in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name) if n}
    for collection in meta_graph.collection_def.values():
        names |= {_node_name(v) for v in collection.node_list.value}
        if collection.bytes_list.value:
            # TF1 variable collections (serialized VariableDefs) name handles too: a graph
            # that has them is left as it is.
            names |= {node.name for node in meta_graph.graph_def.node}
    return names


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


def normalize_in_place(saved_model_dir: Path) -> list[Duplicate | Unused]:
    """Normalize the handles of every MetaGraphDef of a SavedModel this process wrote
    (the export stage's output); returns what changed. The pb is rewritten atomically."""
    from tensorflow.core.protobuf import saved_model_pb2

    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.reproducible import write_fingerprint

    pb = Path(saved_model_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(pb.read_bytes())
    merged = [d for meta_graph in proto.meta_graphs for d in normalize_handles(meta_graph)]
    if merged:
        write_atomic(pb, proto.SerializeToString(deterministic=True))
        write_fingerprint(Path(saved_model_dir))
    return merged


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _same_variable(a: NodeDef, b: NodeDef) -> bool:
    return a.attr["dtype"].type == b.attr["dtype"].type and \
        a.attr["shape"].SerializeToString() == b.attr["shape"].SerializeToString()
