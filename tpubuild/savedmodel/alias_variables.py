"""One object per weight: drop the lists of variable aliases Keras 3's export saves.

`model.export()` and `keras.export.ExportArchive.write_out()` track every variable their
endpoints capture in a list, `_all_variables`
(keras/src/export/saved_model_export_archive.py `_filter_and_track_resources`), built by
`_list_variables_used_by_fns` from `ConcreteFunction.variables`. That is a FuncGraph's
`_watched_variables`, an `ObjectIdentityWeakSet` (tensorflow/python/framework/func_graph.py):
it iterates in the order of the variables' memory addresses, so the list's order, hence
the object graph's node ids and which tensor the checkpoint stores under
`_all_variables/N`, changes from one process to the next. Two runs of the same export
script never gave the same bytes.

The list's elements are the inner `tf.Variable`s of the Keras variables, exported as object
nodes of their own beside the copies the functions capture (`variables/N`); once
savedmodel/variable_handles.py has merged the duplicate graph handles, the graph's saver
restores each of them into the very handle its twin is restored into. They are aliases:
the same value saved a second time, which no function reads. A bfloat16 artifact kept
them in float32 beside the converted weights.

`drop_alias_lists` removes every list whose elements are all such aliases, with the alias
nodes (both object graphs, renumbered: tensorflow/python/checkpoint/save_util.py keeps
their node ids in step), their entries in the graph's saver functions and their checkpoint
keys. An alias is recognized by structure, not by Keras's names: a variable node no
concrete function captures, restored by the saver into the same graph handle as a
captured variable node of the same dtype and shape, with the same value in the checkpoint.
An alias another object also holds is re-pointed to its twin, so no object loses an
attribute. What a server runs, and every value it reads, is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tensorflow.core.protobuf import saved_object_graph_pb2
from tensorflow.core.protobuf.trackable_object_graph_pb2 import TrackableObjectGraph

from tpubuild.savedmodel.model import SavedModel

# The identifier TF gives a ListWrapper's node (tensorflow/python/trackable/data_structures.py,
# read back by tensorflow/python/saved_model/revived_types.py).
LIST_WRAPPER = "trackable_list_wrapper"



@dataclass
class AliasDrop:
    """What `find_alias_lists` found: alias node -> twin, lists to remove, their keys."""

    twins: dict[int, int] = field(default_factory=dict)
    lists: set[int] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.lists)


def find_aliases(model: SavedModel, checkpoint: TrackableObjectGraph, reader) -> dict[int, int]:
    """Alias variable node -> its captured twin (see the module docstring)."""
    from tpubuild.savedmodel.prune import restored_handles

    objects = model.meta_graph.object_graph_def
    bound = {i for f in objects.concrete_functions.values() for i in f.bound_inputs}
    in_slots = {i for n in objects.nodes for s in n.slot_variables
                for i in (s.original_variable_node_id, s.slot_variable_node_id)}
    by_handle: dict[str, list[int]] = {}
    for node_id, handle in sorted(restored_handles(model, checkpoint).items()):
        by_handle.setdefault(handle, []).append(node_id)
    twins = {}
    for node_ids in by_handle.values():
        captured = [i for i in node_ids if i in bound]
        if len(captured) != 1:
            continue
        twin = captured[0]
        for alias in node_ids:
            if alias == twin or alias in bound or alias in in_slots:
                continue
            if _same_variable(objects.nodes[alias], objects.nodes[twin]) and \
                    _same_value(checkpoint, reader, alias, twin):
                twins[alias] = twin
    return twins


def find_alias_lists(model: SavedModel, checkpoint: TrackableObjectGraph, reader) -> AliasDrop:
    """The lists made only of aliases, and the keys their aliases are checkpointed under."""
    objects = model.meta_graph.object_graph_def
    twins = find_aliases(model, checkpoint, reader)
    lists = {
        node_id for node_id, node in enumerate(objects.nodes)
        if node.WhichOneof("kind") == "user_object" and node.user_object.identifier == LIST_WRAPPER
        and node.children and all(child.node_id in twins for child in node.children)
    }
    held = {child.node_id for node_id in lists for child in objects.nodes[node_id].children}
    keys = {attribute.checkpoint_key for alias in held for attribute in checkpoint.nodes[alias].attributes}
    return AliasDrop({a: t for a, t in twins.items() if a in held}, lists, keys)


def drop_alias_lists(model: SavedModel, checkpoint: TrackableObjectGraph, reader) -> set[str]:
    """Remove the alias lists from `model` and `checkpoint` (in memory); returns the
    checkpoint keys to leave out (empty when nothing was removed)."""
    from tpubuild.savedmodel.saver_edits import (
        drop_saver_entries,
        renumber_objects,
        saver_entries_separable,
        set_saved_object_graph,
    )

    found = find_alias_lists(model, checkpoint, reader)
    if not found or not saver_entries_separable(model, found.keys):
        return set()
    objects = model.meta_graph.object_graph_def
    # An alias some other object holds too stays reachable there, as its twin.
    for graph in (objects, checkpoint):
        for node_id, node in enumerate(graph.nodes):
            if node_id in found.lists:
                continue
            for child in node.children:
                child.node_id = found.twins.get(child.node_id, child.node_id)
    drop_saver_entries(model, found.keys)
    renumber_objects(model, checkpoint, found.lists | set(found.twins))
    set_saved_object_graph(model, checkpoint.SerializeToString(deterministic=True))
    model.invalidate()
    return found.keys


def drop_alias_lists_in_place(saved_model_dir: Path) -> int:
    """Rewrite a SavedModel this process wrote (the export stage's output) without its alias
    lists; returns the number of aliases removed. pb and checkpoint are replaced atomically."""
    import tensorflow as tf

    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.checkpoint import OBJECT_GRAPH_KEY, PREFIX, write_without
    from tpubuild.savedmodel.reproducible import write_fingerprint

    directory = Path(saved_model_dir)
    if not (directory / "variables" / "variables.index").is_file():
        return 0
    model = SavedModel.load(directory)
    if len(model.proto.meta_graphs) != 1:
        return 0  # the checkpoint is shared by every MetaGraphDef: one graph's view is not enough
    reader = tf.train.load_checkpoint(str(directory / PREFIX))
    if not reader.has_tensor(OBJECT_GRAPH_KEY):
        return 0
    checkpoint = TrackableObjectGraph.FromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    before = len(model.meta_graph.object_graph_def.nodes)
    keys = drop_alias_lists(model, checkpoint, reader)
    if not keys:
        return 0
    removed = before - len(model.meta_graph.object_graph_def.nodes)
    del reader
    write_without(directory, directory, keys, checkpoint.SerializeToString(deterministic=True))
    write_atomic(directory / "saved_model.pb", model.proto.SerializeToString(deterministic=True))
    write_fingerprint(directory)
    return removed


def _same_variable(a: saved_object_graph_pb2.SavedObject, b: saved_object_graph_pb2.SavedObject) -> bool:
    return a.WhichOneof("kind") == b.WhichOneof("kind") == "variable" and \
        a.variable.dtype == b.variable.dtype and a.variable.shape == b.variable.shape


def _same_value(checkpoint: TrackableObjectGraph, reader, a: int, b: int) -> bool:
    """Whether the checkpoint stores the same tensor for both nodes' VARIABLE_VALUE."""
    import numpy as np

    def value_key(node_id: int) -> str | None:
        return next((x.checkpoint_key for x in checkpoint.nodes[node_id].attributes if x.name == "VARIABLE_VALUE"),
                    None)

    key_a, key_b = value_key(a), value_key(b)
    if key_a is None or key_b is None or not reader.has_tensor(key_a) or not reader.has_tensor(key_b):
        return False
    return bool(np.array_equal(reader.get_tensor(key_a), reader.get_tensor(key_b)))
