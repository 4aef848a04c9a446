"""Edits of the graph-level saver and the object graph when variables or checkpoint keys go
(savedmodel/prune.py step 2, savedmodel/alias_variables.py): the saver functions'
(`_traced_save`/`_traced_restore`, tensorflow/python/saved_model/save.py `_SaveableView` /
`functional_saver.py`) arguments and `SaveV2`/`RestoreV2` lists, object ids renumbered in the
SavedModel's object graph and in the checkpoint's TrackableObjectGraph (which share node ids:
tensorflow/python/checkpoint/save_util.py), and the object graph the checkpoint carries.
"""

from __future__ import annotations

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import saved_object_graph_pb2, trackable_object_graph_pb2

from tpubuild.savedmodel.call_edits import (
    call_args,
    drop_call_inputs,
    drop_function_args,
    ref_name,
    saver_calls,
)
from tpubuild.savedmodel.checkpoint import OBJECT_GRAPH_KEY
from tpubuild.savedmodel.model import SavedModel


def clean_saver_body(fdef: FunctionDef, args: set[str]) -> None:
    """Before `args` leave a save or restore function: remove the nodes that depend on
    them, then the RestoreV2 outputs and SaveV2 inputs nothing needs any more."""
    removed = set(args)
    save_drop: dict[str, set[int]] = {}
    changed = True
    while changed:
        changed = False
        for node in fdef.node_def:
            if node.name in removed:
                continue
            data = [r for r in node.input if not r.startswith("^")]
            hit = [i for i, r in enumerate(data) if ref_name(r) in removed]
            if not hit:
                continue
            if node.op == "SaveV2":
                save_drop.setdefault(node.name, set()).update(hit)
            else:
                removed.add(node.name)
                changed = True
    restore_before = _consumed_outputs(fdef)
    kept_nodes = [n for n in fdef.node_def if n.name not in removed]
    for node in kept_nodes:
        node.input[:] = [r for r in node.input if not (r.startswith("^") and ref_name(r) in removed)]
    _set_nodes(fdef, kept_nodes)
    for key in [k for k, node in fdef.control_ret.items() if node in removed]:
        del fdef.control_ret[key]
    outputs = [o for o in fdef.signature.control_output if o in fdef.control_ret]
    del fdef.signature.control_output[:]
    fdef.signature.control_output.extend(outputs)
    _remove_unused_identities(fdef)
    for node in fdef.node_def:
        if node.op == "SaveV2" and node.name in save_drop:
            tensors = sorted(i - 3 for i in save_drop[node.name])  # inputs: prefix, names, slices, tensors...
            node.input[:] = [r for i, r in enumerate(node.input) if i < 3 or (i - 3) not in tensors or r.startswith("^")]
            _drop_list_entries(fdef, node, tensors)
        if node.op == "RestoreV2":
            after = _consumed_outputs(fdef).get(node.name, set())
            lost = sorted(restore_before.get(node.name, set()) - after)
            if lost:
                _drop_list_entries(fdef, node, lost)
                _renumber_outputs(fdef, node.name, lost)


def _consumed_outputs(fdef: FunctionDef) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for ref in [r for n in fdef.node_def for r in n.input] + list(fdef.ret.values()):
        parts = ref.split(":")
        if not ref.startswith("^") and len(parts) == 3:
            used.setdefault(parts[0], set()).add(int(parts[2]))
    return used


def _set_nodes(fdef: FunctionDef, nodes: list[NodeDef]) -> None:
    copies = [NodeDef.FromString(n.SerializeToString()) for n in nodes]
    del fdef.node_def[:]
    fdef.node_def.extend(copies)


def _remove_unused_identities(fdef: FunctionDef) -> None:
    """Identity nodes whose output nothing reads (left by a removed consumer)."""
    while True:
        referenced = {ref_name(r) for n in fdef.node_def for r in n.input} | {ref_name(r) for r in fdef.ret.values()}
        referenced |= set(fdef.control_ret.values())
        unused = [n for n in fdef.node_def if n.op == "Identity" and n.name not in referenced]
        if not unused:
            return
        _set_nodes(fdef, [n for n in fdef.node_def if n not in unused])


def _drop_list_entries(fdef: FunctionDef, node: NodeDef, indexes: list[int]) -> None:
    """Remove entries from a SaveV2/RestoreV2's tensor_names and shape_and_slices constants
    and its dtypes attr."""
    nodes = {n.name: n for n in fdef.node_def}
    for ref in node.input[1:3]:
        const = nodes[ref_name(ref)]
        values = list(const.attr["value"].tensor.string_val)
        kept = [v for i, v in enumerate(values) if i not in indexes]
        tensor = const.attr["value"].tensor
        del tensor.string_val[:]
        tensor.string_val.extend(kept)
        tensor.tensor_shape.dim[0].size = len(kept)
        if "_output_shapes" in const.attr:
            const.attr["_output_shapes"].list.shape[0].dim[0].size = len(kept)
    types = list(node.attr["dtypes"].list.type)
    del node.attr["dtypes"].list.type[:]
    node.attr["dtypes"].list.type.extend(t for i, t in enumerate(types) if i not in indexes)


def _renumber_outputs(fdef: FunctionDef, name: str, dropped: list[int]) -> None:
    def renumber(ref: str) -> str:
        parts = ref.split(":")
        if ref.startswith("^") or len(parts) != 3 or parts[0] != name:
            return ref
        index = int(parts[2])
        return f"{parts[0]}:{parts[1]}:{index - sum(1 for d in dropped if d < index)}"

    for node in fdef.node_def:
        node.input[:] = [renumber(r) for r in node.input]
    for key, ref in list(fdef.ret.items()):
        fdef.ret[key] = renumber(ref)


def renumber_objects(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph,
                      removed: set[int]) -> None:
    """Remove object-graph nodes from both object graphs and renumber every reference."""
    objects = model.meta_graph.object_graph_def
    new_id: dict[int, int] = {}
    for old in range(len(objects.nodes)):
        if old not in removed:
            new_id[old] = len(new_id)

    def references(refs) -> None:
        kept = [type(r).FromString(r.SerializeToString()) for r in refs if r.node_id not in removed]
        for r in kept:
            r.node_id = new_id[r.node_id]
        del refs[:]
        refs.extend(kept)

    def slots(refs) -> None:
        kept = [type(r).FromString(r.SerializeToString()) for r in refs
                if r.original_variable_node_id not in removed and r.slot_variable_node_id not in removed]
        for r in kept:
            r.original_variable_node_id = new_id[r.original_variable_node_id]
            r.slot_variable_node_id = new_id[r.slot_variable_node_id]
        del refs[:]
        refs.extend(kept)

    kept_nodes = [saved_object_graph_pb2.SavedObject.FromString(n.SerializeToString())
                  for i, n in enumerate(objects.nodes) if i not in removed]
    for node in kept_nodes:
        references(node.children)
        references(node.dependencies)
        slots(node.slot_variables)
        for saveable in node.saveable_objects.values():
            for field in ("save_function", "restore_function"):
                if getattr(saveable, field) in new_id:
                    setattr(saveable, field, new_id[getattr(saveable, field)])
    del objects.nodes[:]
    objects.nodes.extend(kept_nodes)
    for function in objects.concrete_functions.values():
        bound = [new_id[i] for i in function.bound_inputs]
        del function.bound_inputs[:]
        function.bound_inputs.extend(bound)
    if len(checkpoint.nodes) != len(new_id) + len(removed):
        raise ValueError("the checkpoint's object graph does not match the SavedModel's")
    kept_checkpoint = [type(n).FromString(n.SerializeToString()) for i, n in enumerate(checkpoint.nodes)
                       if i not in removed]
    for node in kept_checkpoint:
        references(node.children)
        slots(node.slot_variables)
    del checkpoint.nodes[:]
    checkpoint.nodes.extend(kept_checkpoint)


def _keys_by_argument(fdef: FunctionDef) -> dict[str, set[str]]:
    """Saver argument -> the checkpoint keys it is saved (SaveV2) or restored (RestoreV2)
    under, read through the Identity / ReadVariableOp / DisableCopyOnRead chains TF's
    functional saver writes (tensorflow/python/checkpoint/functional_saver.py)."""
    params = {a.name for a in fdef.signature.input_arg}
    nodes = {n.name: n for n in fdef.node_def}
    keys: dict[str, set[str]] = {}

    def names_of(node: NodeDef) -> list[str]:
        const = nodes.get(ref_name(node.input[1]))
        return [s.decode() for s in const.attr["value"].tensor.string_val] if const is not None else []

    def argument_behind(ref: str) -> str | None:
        while ref_name(ref) not in params:
            source = nodes.get(ref_name(ref))
            if source is None or source.op not in ("Identity", "ReadVariableOp") or not source.input:
                return None
            ref = source.input[0]
        return ref_name(ref)

    for node in fdef.node_def:
        if node.op == "SaveV2":
            names = names_of(node)
            tensors = [r for r in node.input if not r.startswith("^")][3:]
            for index, ref in enumerate(tensors):
                arg = argument_behind(ref)
                if arg is not None and index < len(names):
                    keys.setdefault(arg, set()).add(names[index])
        elif node.op == "AssignVariableOp" and len(node.input) >= 2 and ref_name(node.input[0]) in params:
            value = node.input[1]
            source = nodes.get(ref_name(value))
            while source is not None and source.op == "Identity":
                value = source.input[0]
                source = nodes.get(ref_name(value))
            if source is not None and source.op == "RestoreV2":
                names = names_of(source)
                index = int(value.split(":")[-1])
                if index < len(names):
                    keys.setdefault(ref_name(node.input[0]), set()).add(names[index])
    return keys


def saver_entries_separable(model: SavedModel, keys: set[str]) -> bool:
    """Whether the saver moves each of `keys` through arguments that carry no other key, so
    `drop_saver_entries` can remove exactly them."""
    for node in saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        for carried in _keys_by_argument(fdef).values():
            if carried & keys and not carried <= keys:
                return False
    return True


def drop_saver_entries(model: SavedModel, keys: set[str]) -> None:
    """The graph's saver stops saving and restoring `keys`; the variables themselves stay
    (their handles may be restored under another key). Check `saver_entries_separable` first."""
    for node in saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        params = [a.name for a in fdef.signature.input_arg]
        carried = _keys_by_argument(fdef)
        drop = [i for i, p in enumerate(params) if carried.get(p) and carried[p] <= keys]
        clean_saver_body(fdef, {params[i] for i in drop})
        drop_call_inputs(node, drop)
        drop_function_args(fdef, drop)
    model.invalidate()


def set_saved_object_graph(model: SavedModel, data: bytes) -> None:
    """Make the saver write `data` as the checkpoint's object graph.

    TF's traced save function stores the TrackableObjectGraph it was built with as a
    constant and saves it under `_CHECKPOINTABLE_OBJECT_GRAPH` with every checkpoint
    (tensorflow/python/checkpoint/functional_saver.py; tensorflow/python/saved_model/save.py
    passes it in from a graph-level Const). A model whose object graph was edited must
    carry the edited one there too, or a session-based save writes the old graph."""
    call = saver_calls(model).get("save")
    if call is None:
        return
    fdef = model.functions[call.attr["f"].func.name]
    nodes = {n.name: n for n in fdef.node_def}
    params = [a.name for a in fdef.signature.input_arg]
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    for node in fdef.node_def:
        if node.op != "SaveV2":
            continue
        names = [s.decode() for s in nodes[ref_name(node.input[1])].attr["value"].tensor.string_val]
        tensors = [r for r in node.input if not r.startswith("^")][3:]
        if OBJECT_GRAPH_KEY not in names:
            continue
        ref = tensors[names.index(OBJECT_GRAPH_KEY)]
        while ref_name(ref) in nodes and nodes[ref_name(ref)].op == "Identity":
            ref = nodes[ref_name(ref)].input[0]
        if ref_name(ref) in nodes:
            const = nodes[ref_name(ref)]
        elif ref_name(ref) in params:
            const = graph.get(ref_name(call_args(call)[params.index(ref_name(ref))]))
        else:
            const = None
        if const is not None and const.op == "Const":
            del const.attr["value"].tensor.string_val[:]
            const.attr["value"].tensor.string_val.append(data)
