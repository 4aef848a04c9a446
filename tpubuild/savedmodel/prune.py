"""Drop what an artifact no longer reads: resource arguments no node uses, then the
variables no function reads, from the functions, the object graph, the graph-level saver
and the checkpoint.

A stage that replaces a function body (quantize grafts an int8 body with its weights as
constants) leaves the float32 variables the old body read: still captured by the
functions that passed them down, still in the object graph, still restored by the saver,
still in `variables/`. Served, they cost memory and disk and read nothing. Here:

1. **Dead resource arguments.** A resource argument is dead when every node that uses
   it is a call passing it to a dead argument of the callee (functions do not recurse,
   so this settles bottom-up). A function's dead arguments are dropped when every
   reference to it is a call op that can be edited (`PartitionedCall`,
   `StatefulPartitionedCall`, `TPUPartitionedCall`); its callers stop passing them, and
   a concrete function of the object graph loses the matching `bound_inputs`
   (tensorflow/python/saved_model/load.py binds captures from `bound_inputs`, in order,
   to the function's trailing arguments).
2. **Unread variables.** A variable no `bound_inputs` names and no graph node reads
   (other than the saver's save and restore calls) is removed: its graph-level
   `VarHandleOp`, its argument of the saver functions (`_traced_save`/`_traced_restore`,
   tensorflow/python/saved_model/save.py `_SaveableView` / `functional_saver.py`), its
   entry in their `SaveV2`/`RestoreV2` lists, its object-graph node (ids renumbered in
   the SavedModel's object graph and in the checkpoint's TrackableObjectGraph, which
   share node ids: tensorflow/python/checkpoint/save_util.py), and its checkpoint key.

Pure on the protos except `write_checkpoint`, which rewrites `variables/` with the kept
keys only. A model that reads every variable is left untouched.
"""

from __future__ import annotations

from pathlib import Path

from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tpubuild.savedmodel.call_edits import (
    call_args,
    drop_call_inputs,
    drop_function_args,
    ref_name,
    saver_calls,
)
from tpubuild.savedmodel.checkpoint import OBJECT_GRAPH_KEY
from tpubuild.savedmodel.dead_arguments import drop_dead_arguments
from tpubuild.savedmodel.model import SavedModel, node_functions
from tpubuild.savedmodel.saver_edits import (
    clean_saver_body,
    renumber_objects,
    set_saved_object_graph,
)

CHECKPOINT = Path("variables") / "variables"


def checkpoint_graph(model_dir: Path) -> trackable_object_graph_pb2.TrackableObjectGraph:
    import tensorflow as tf

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(str(model_dir / CHECKPOINT)).get_tensor(OBJECT_GRAPH_KEY))
    return graph


def unread_variables(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph) -> dict[int, str]:
    """Object-graph variable node id -> graph VarHandleOp name, for variables nothing reads."""
    objects = model.meta_graph.object_graph_def
    bound = {i for f in objects.concrete_functions.values() for i in f.bound_inputs}
    handles = restored_handles(model, checkpoint)
    ignored = {n.name for n in saver_calls(model).values()} | _idle_reads(model)
    read_in_graph = {ref_name(r) for n in model.meta_graph.graph_def.node if n.name not in ignored for r in n.input}
    unread = {}
    for node_id, node in enumerate(objects.nodes):
        if node.WhichOneof("kind") != "variable" or node_id in bound:
            continue
        handle = handles.get(node_id)
        if handle is None or handle in read_in_graph:
            continue  # not restored by the graph's saver as we know it, or read by a graph node: kept
        if any(s.original_variable_node_id == node_id or s.slot_variable_node_id == node_id
               for n in objects.nodes for s in n.slot_variables):
            continue
        unread[node_id] = handle
    return unread


def _idle_reads(model: SavedModel) -> set[str]:
    """Graph-level ReadVariableOps whose value nothing consumes: TF2's saver adds one per
    variable (`<name>/Read/ReadVariableOp`) for TF1 graph compatibility; they read nothing
    a signature returns."""
    graph = model.meta_graph.graph_def.node
    consumed = {ref_name(r) for n in graph for r in n.input}
    return {n.name for n in graph if n.op == "ReadVariableOp" and n.name not in consumed}


def restored_handles(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph) -> dict[int, str]:
    """Variable node id -> the graph VarHandleOp the saver's restore assigns it from: restore
    argument k holds call input k; its AssignVariableOp takes RestoreV2 output j, whose
    tensor name is the variable's checkpoint key."""
    restore = saver_calls(model).get("restore")
    if restore is None:
        return {}
    fdef = model.functions[restore.attr["f"].func.name]
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    params = [a.name for a in fdef.signature.input_arg]
    handle_of_arg = {p: ref_name(r) for p, r in zip(params, call_args(restore))}
    nodes = {n.name: n for n in fdef.node_def}
    key_of_id = {i: a.checkpoint_key for i, n in enumerate(checkpoint.nodes) for a in n.attributes
                 if a.name == "VARIABLE_VALUE"}
    id_of_key = {k: i for i, k in key_of_id.items()}
    found: dict[int, str] = {}
    for node in fdef.node_def:
        if node.op != "AssignVariableOp":
            continue
        arg, value = ref_name(node.input[0]), node.input[1]
        source = nodes.get(ref_name(value))
        while source is not None and source.op == "Identity":
            value = source.input[0]
            source = nodes.get(ref_name(value))
        if source is None or source.op != "RestoreV2":
            continue
        names = nodes[ref_name(source.input[1])].attr["value"].tensor.string_val
        index = int(value.split(":")[-1])
        key = names[index].decode()
        handle = handle_of_arg.get(arg)
        if key in id_of_key and handle is not None and handle in graph and graph[handle].op == "VarHandleOp":
            found[id_of_key[key]] = handle
    return found


def remove_variables(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph,
                     unread: dict[int, str]) -> set[str]:
    """Remove the `unread` variables (node id -> graph VarHandleOp); returns their keys."""
    handles = set(unread.values())
    for node in saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        params = [a.name for a in fdef.signature.input_arg]
        drop = [i for i, ref in enumerate(call_args(node)) if ref_name(ref) in handles]
        clean_saver_body(fdef, {params[i] for i in drop})
        drop_call_inputs(node, drop)
        drop_function_args(fdef, drop)
    graph = model.meta_graph.graph_def
    idle = _idle_reads(model)
    kept = [n for n in graph.node if not (n.op == "VarHandleOp" and n.name in handles)
            and not (n.name in idle and ref_name(n.input[0]) in handles)]
    kept = [NodeDef.FromString(n.SerializeToString()) for n in kept]
    del graph.node[:]
    graph.node.extend(kept)
    keys = {a.checkpoint_key for i in unread for a in checkpoint.nodes[i].attributes}
    renumber_objects(model, checkpoint, set(unread))
    set_saved_object_graph(model, checkpoint.SerializeToString(deterministic=True))
    model.invalidate()
    return keys


def served_functions(model: SavedModel) -> set[str]:
    """What a server can run: the functions the graph calls (signatures, saver, init op),
    the aliased ones (placed or called by name), and everything they call."""
    roots = {name for node in model.meta_graph.graph_def.node for name in node_functions(node)}
    roots |= {fn for fn in model.aliases if fn in model.functions}
    served = set(roots)
    for fn in roots:
        served |= model.reachable(fn)
    return served


def unserved_objects(model: SavedModel) -> tuple[set[str], set[int]]:
    """Concrete functions of the object graph no served function is, and the object-graph
    nodes that hold nothing else (bare concrete functions, functions whose every concrete
    function is unserved). A quantized artifact's float copies of a model's methods (e.g.
    the layer calls Keras saves) would otherwise keep every float weight alive."""
    served = served_functions(model)
    objects = model.meta_graph.object_graph_def
    # Functions a resource's saveable calls (a lookup table's save/restore) stay: the
    # checkpoint restore runs them (tensorflow/python/saved_model/load.py _restore_checkpoint).
    for node in objects.nodes:
        for saveable in node.saveable_objects.values():
            for node_id in (saveable.save_function, saveable.restore_function):
                held = objects.nodes[node_id]
                if held.WhichOneof("kind") == "function":
                    served.update(held.function.concrete_functions)
                elif held.WhichOneof("kind") == "bare_concrete_function":
                    served.add(held.bare_concrete_function.concrete_function_name)
    unserved = {name for name in objects.concrete_functions if name not in served}
    nodes = set()
    for node_id, node in enumerate(objects.nodes):
        kind = node.WhichOneof("kind")
        if kind == "bare_concrete_function" and node.bare_concrete_function.concrete_function_name in unserved:
            nodes.add(node_id)
        elif kind == "function" and node.function.concrete_functions and \
                set(node.function.concrete_functions) <= unserved:
            nodes.add(node_id)
    return unserved, nodes


def drop_unserved_objects(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph) -> int:
    """Remove the unserved concrete functions from the object graph (both object graphs,
    renumbered); their FunctionDefs stay in the library only while something calls them."""
    unserved, nodes = unserved_objects(model)
    if not unserved:
        return 0
    objects = model.meta_graph.object_graph_def
    for node in objects.nodes:
        if node.WhichOneof("kind") == "function":
            kept = [n for n in node.function.concrete_functions if n not in unserved]
            del node.function.concrete_functions[:]
            node.function.concrete_functions.extend(kept)
    for name in unserved:
        del objects.concrete_functions[name]
    renumber_objects(model, checkpoint, nodes)
    set_saved_object_graph(model, checkpoint.SerializeToString(deterministic=True))
    served = served_functions(model) | {n for n in objects.concrete_functions if n in model.functions}
    called = set(served)
    for name in served:
        called |= model.reachable(name)
    for name in [n for n in model.functions if n not in called]:
        model.remove_function(name)
    model.invalidate()
    return len(unserved)


def prune(model: SavedModel) -> tuple[list[str], bytes | None, set[str]]:
    """Drop unserved functions, dead resource arguments and unread variables from
    `model` (in memory).

    Returns (removed variable names, the checkpoint's new object graph or None when no
    variable was removed, the checkpoint keys to leave out)."""
    objects = model.meta_graph.object_graph_def
    if not any(n.WhichOneof("kind") == "variable" for n in objects.nodes):
        drop_dead_arguments(model)
        return [], None, set()
    checkpoint = checkpoint_graph(model.path)
    dropped = drop_unserved_objects(model, checkpoint)
    drop_dead_arguments(model)
    unread = unread_variables(model, checkpoint)
    if not unread:
        return [], checkpoint.SerializeToString(deterministic=True) if dropped else None, set()
    names = sorted(objects.nodes[i].variable.name or unread[i] for i in unread)
    keys = remove_variables(model, checkpoint, unread)
    return names, checkpoint.SerializeToString(deterministic=True), keys
