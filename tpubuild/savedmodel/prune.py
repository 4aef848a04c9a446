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

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import saved_object_graph_pb2, trackable_object_graph_pb2

from tpubuild.savedmodel.fnedit import ANY_CALL_OPS, TPU_CALL
from tpubuild.savedmodel.model import GRAPH, SavedModel, attr_functions, node_functions

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
CHECKPOINT = Path("variables") / "variables"


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _call_args(node: NodeDef) -> list[str]:
    """The data inputs of a call node that are the callee's arguments, in order."""
    data = [ref for ref in node.input if not ref.startswith("^")]
    return data[:-1] if node.op == TPU_CALL else data  # TPUPartitionedCall's last input: the ordinal


def _holders(model: SavedModel) -> dict[str, list[NodeDef]]:
    return {GRAPH: list(model.meta_graph.graph_def.node),
            **{name: list(f.node_def) for name, f in model.functions.items()}}


def _saver_calls(model: SavedModel) -> dict[str, NodeDef]:
    """The graph's save and restore call nodes, by role (`save`, `restore`)."""
    saver = model.meta_graph.saver_def
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    calls = {}
    for role, ref in (("save", saver.save_tensor_name), ("restore", saver.restore_op_name)):
        node = graph.get(_name(ref)) if ref else None
        if node is not None and node.op in ANY_CALL_OPS:
            calls[role] = node
    return calls


def _editable_functions(model: SavedModel, saver: set[str]) -> set[str]:
    """Functions referenced only by call ops' `f` (never by If/While/Case/BatchFunction or
    another attr), whose argument lists can therefore change with their call sites."""
    blocked = set(saver)
    for nodes in _holders(model).values():
        for node in nodes:
            for key, value in node.attr.items():
                names = set(attr_functions(value))
                if node.op in ANY_CALL_OPS and key == "f":
                    continue
                blocked |= names
    for fdef in model.functions.values():
        for value in fdef.attr.values():
            blocked |= set(attr_functions(value))
    return set(model.functions) - blocked


def dead_arguments(model: SavedModel) -> dict[str, list[int]]:
    """Function -> indexes of resource arguments that nothing reads and that can be dropped."""
    saver_fns = {n.attr["f"].func.name for n in _saver_calls(model).values()}
    editable = _editable_functions(model, saver_fns)
    concrete = model.meta_graph.object_graph_def.concrete_functions
    candidates: dict[str, set[str]] = {}
    for name in editable:
        args = list(model.functions[name].signature.input_arg)
        first = len(args) - len(concrete[name].bound_inputs) if name in concrete else 0
        # Only captures of an object-graph function may go: the rest is its call signature.
        candidates[name] = {a.name for i, a in enumerate(args) if i >= first and a.type == types_pb2.DT_RESOURCE}
    dead: dict[str, set[str]] = {}
    changed = True
    while changed:
        changed = False
        for name, args in candidates.items():
            fdef = model.functions[name]
            returned = {_name(ref) for ref in fdef.ret.values()}
            for arg in sorted(args - dead.get(name, set())):
                if arg not in returned and all(_passes_to_dead(node, arg, dead, model) for node in _consumers(fdef, arg)):
                    dead.setdefault(name, set()).add(arg)
                    changed = True
    return {name: [i for i, a in enumerate(model.functions[name].signature.input_arg) if a.name in args]
            for name, args in sorted(dead.items()) if args}


def _consumers(fdef: FunctionDef, arg: str) -> list[NodeDef]:
    return [n for n in fdef.node_def if any(not r.startswith("^") and _name(r) == arg for r in n.input)]


def _passes_to_dead(node: NodeDef, arg: str, dead: dict[str, set[str]], model: SavedModel) -> bool:
    if node.op not in ANY_CALL_OPS:
        return False
    callee = node.attr["f"].func.name
    params = [a.name for a in model.functions[callee].signature.input_arg] if callee in model.functions else []
    positions = [i for i, ref in enumerate(_call_args(node)) if _name(ref) == arg]
    return bool(positions) and all(i < len(params) and params[i] in dead.get(callee, set()) for i in positions)


def _drop_call_inputs(node: NodeDef, drop: list[int]) -> None:
    """A call node stops passing the arguments at `drop` (indexes into the callee's args)."""
    args, control = _call_args(node), [r for r in node.input if r.startswith("^")]
    rest = [r for r in node.input if not r.startswith("^")][len(args):]
    node.input[:] = [r for i, r in enumerate(args) if i not in drop] + rest + control
    types = list(node.attr["Tin"].list.type)
    del node.attr["Tin"].list.type[:]
    node.attr["Tin"].list.type.extend(t for i, t in enumerate(types) if i not in drop)
    if "_read_only_resource_inputs" in node.attr:
        kept = [i - sum(1 for d in drop if d < i) for i in node.attr["_read_only_resource_inputs"].list.i
                if i not in drop]
        del node.attr["_read_only_resource_inputs"].list.i[:]
        node.attr["_read_only_resource_inputs"].list.i.extend(kept)


def _drop_function_args(fdef: FunctionDef, drop: list[int]) -> None:
    """Remove arguments from a FunctionDef, with their per-index attrs and resource ids."""
    shift = {i: i - sum(1 for d in drop if d < i) for i in range(len(fdef.signature.input_arg)) if i not in drop}
    kept = [a for i, a in enumerate(fdef.signature.input_arg) if i not in drop]
    del fdef.signature.input_arg[:]
    fdef.signature.input_arg.extend(kept)
    attrs = {i: fdef.arg_attr[i].SerializeToString() for i in list(fdef.arg_attr)}  # copies, not views
    ids = dict(fdef.resource_arg_unique_id)
    fdef.ClearField("arg_attr")
    fdef.ClearField("resource_arg_unique_id")
    for i, data in attrs.items():
        if i in shift:
            fdef.arg_attr[shift[i]].ParseFromString(data)
    for i, unique in ids.items():
        if i in shift:
            fdef.resource_arg_unique_id[shift[i]] = unique


def drop_dead_arguments(model: SavedModel) -> dict[str, list[int]]:
    """Drop every dead resource argument (and its call inputs and bound inputs)."""
    dead = dead_arguments(model)
    concrete = model.meta_graph.object_graph_def.concrete_functions
    for name, drop in dead.items():
        for nodes in _holders(model).values():
            for node in nodes:
                if node.op in ANY_CALL_OPS and node.attr["f"].func.name == name:
                    _drop_call_inputs(node, drop)
        count = len(model.functions[name].signature.input_arg)
        if name in concrete:
            bound = list(concrete[name].bound_inputs)
            first = count - len(bound)
            del concrete[name].bound_inputs[:]
            concrete[name].bound_inputs.extend(b for i, b in enumerate(bound) if first + i not in drop)
        _drop_function_args(model.functions[name], drop)
    if dead:
        model.invalidate()
    return dead


# -- unread variables ------------------------------------------------------------------------

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
    ignored = {n.name for n in _saver_calls(model).values()} | _idle_reads(model)
    read_in_graph = {_name(r) for n in model.meta_graph.graph_def.node if n.name not in ignored for r in n.input}
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
    consumed = {_name(r) for n in graph for r in n.input}
    return {n.name for n in graph if n.op == "ReadVariableOp" and n.name not in consumed}


def restored_handles(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph) -> dict[int, str]:
    """Variable node id -> the graph VarHandleOp the saver's restore assigns it from: restore
    argument k holds call input k; its AssignVariableOp takes RestoreV2 output j, whose
    tensor name is the variable's checkpoint key."""
    restore = _saver_calls(model).get("restore")
    if restore is None:
        return {}
    fdef = model.functions[restore.attr["f"].func.name]
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    params = [a.name for a in fdef.signature.input_arg]
    handle_of_arg = {p: _name(r) for p, r in zip(params, _call_args(restore))}
    nodes = {n.name: n for n in fdef.node_def}
    key_of_id = {i: a.checkpoint_key for i, n in enumerate(checkpoint.nodes) for a in n.attributes
                 if a.name == "VARIABLE_VALUE"}
    id_of_key = {k: i for i, k in key_of_id.items()}
    found = {}
    for node in fdef.node_def:
        if node.op != "AssignVariableOp":
            continue
        arg, value = _name(node.input[0]), node.input[1]
        source = nodes.get(_name(value))
        while source is not None and source.op == "Identity":
            value = source.input[0]
            source = nodes.get(_name(value))
        if source is None or source.op != "RestoreV2":
            continue
        names = nodes[_name(source.input[1])].attr["value"].tensor.string_val
        index = int(value.split(":")[-1])
        key = names[index].decode()
        handle = handle_of_arg.get(arg)
        if key in id_of_key and handle in graph and graph[handle].op == "VarHandleOp":
            found[id_of_key[key]] = handle
    return found


def _clean_saver_body(fdef: FunctionDef, args: set[str]) -> None:
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
            hit = [i for i, r in enumerate(data) if _name(r) in removed]
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
        node.input[:] = [r for r in node.input if not (r.startswith("^") and _name(r) in removed)]
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
        referenced = {_name(r) for n in fdef.node_def for r in n.input} | {_name(r) for r in fdef.ret.values()}
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
        const = nodes[_name(ref)]
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
    new_id = {}
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


def remove_variables(model: SavedModel, checkpoint: trackable_object_graph_pb2.TrackableObjectGraph,
                     unread: dict[int, str]) -> set[str]:
    """Remove the `unread` variables (node id -> graph VarHandleOp); returns their keys."""
    handles = set(unread.values())
    for node in _saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        params = [a.name for a in fdef.signature.input_arg]
        drop = [i for i, ref in enumerate(_call_args(node)) if _name(ref) in handles]
        _clean_saver_body(fdef, {params[i] for i in drop})
        _drop_call_inputs(node, drop)
        _drop_function_args(fdef, drop)
    graph = model.meta_graph.graph_def
    idle = _idle_reads(model)
    kept = [n for n in graph.node if not (n.op == "VarHandleOp" and n.name in handles)
            and not (n.name in idle and _name(n.input[0]) in handles)]
    kept = [NodeDef.FromString(n.SerializeToString()) for n in kept]
    del graph.node[:]
    graph.node.extend(kept)
    keys = {a.checkpoint_key for i in unread for a in checkpoint.nodes[i].attributes}
    renumber_objects(model, checkpoint, set(unread))
    set_saved_object_graph(model, checkpoint.SerializeToString(deterministic=True))
    model.invalidate()
    return keys


def _keys_by_argument(fdef: FunctionDef) -> dict[str, set[str]]:
    """Saver argument -> the checkpoint keys it is saved (SaveV2) or restored (RestoreV2)
    under, read through the Identity / ReadVariableOp / DisableCopyOnRead chains TF's
    functional saver writes (tensorflow/python/checkpoint/functional_saver.py)."""
    params = {a.name for a in fdef.signature.input_arg}
    nodes = {n.name: n for n in fdef.node_def}
    keys: dict[str, set[str]] = {}

    def names_of(node: NodeDef) -> list[str]:
        const = nodes.get(_name(node.input[1]))
        return [s.decode() for s in const.attr["value"].tensor.string_val] if const is not None else []

    def argument_behind(ref: str) -> str | None:
        while _name(ref) not in params:
            source = nodes.get(_name(ref))
            if source is None or source.op not in ("Identity", "ReadVariableOp") or not source.input:
                return None
            ref = source.input[0]
        return _name(ref)

    for node in fdef.node_def:
        if node.op == "SaveV2":
            names = names_of(node)
            tensors = [r for r in node.input if not r.startswith("^")][3:]
            for index, ref in enumerate(tensors):
                arg = argument_behind(ref)
                if arg is not None and index < len(names):
                    keys.setdefault(arg, set()).add(names[index])
        elif node.op == "AssignVariableOp" and len(node.input) >= 2 and _name(node.input[0]) in params:
            value = node.input[1]
            source = nodes.get(_name(value))
            while source is not None and source.op == "Identity":
                value = source.input[0]
                source = nodes.get(_name(value))
            if source is not None and source.op == "RestoreV2":
                names = names_of(source)
                index = int(value.split(":")[-1])
                if index < len(names):
                    keys.setdefault(_name(node.input[0]), set()).add(names[index])
    return keys


def saver_entries_separable(model: SavedModel, keys: set[str]) -> bool:
    """Whether the saver moves each of `keys` through arguments that carry no other key, so
    `drop_saver_entries` can remove exactly them."""
    for node in _saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        for carried in _keys_by_argument(fdef).values():
            if carried & keys and not carried <= keys:
                return False
    return True


def drop_saver_entries(model: SavedModel, keys: set[str]) -> None:
    """The graph's saver stops saving and restoring `keys`; the variables themselves stay
    (their handles may be restored under another key). Check `saver_entries_separable` first."""
    for node in _saver_calls(model).values():
        fdef = model.functions[node.attr["f"].func.name]
        params = [a.name for a in fdef.signature.input_arg]
        carried = _keys_by_argument(fdef)
        drop = [i for i, p in enumerate(params) if carried.get(p) and carried[p] <= keys]
        _clean_saver_body(fdef, {params[i] for i in drop})
        _drop_call_inputs(node, drop)
        _drop_function_args(fdef, drop)
    model.invalidate()


def set_saved_object_graph(model: SavedModel, data: bytes) -> None:
    """Make the saver write `data` as the checkpoint's object graph.

    TF's traced save function stores the TrackableObjectGraph it was built with as a
    constant and saves it under `_CHECKPOINTABLE_OBJECT_GRAPH` with every checkpoint
    (tensorflow/python/checkpoint/functional_saver.py; tensorflow/python/saved_model/save.py
    passes it in from a graph-level Const). A model whose object graph was edited must
    carry the edited one there too, or a session-based save writes the old graph."""
    call = _saver_calls(model).get("save")
    if call is None:
        return
    fdef = model.functions[call.attr["f"].func.name]
    nodes = {n.name: n for n in fdef.node_def}
    params = [a.name for a in fdef.signature.input_arg]
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    for node in fdef.node_def:
        if node.op != "SaveV2":
            continue
        names = [s.decode() for s in nodes[_name(node.input[1])].attr["value"].tensor.string_val]
        tensors = [r for r in node.input if not r.startswith("^")][3:]
        if OBJECT_GRAPH_KEY not in names:
            continue
        ref = tensors[names.index(OBJECT_GRAPH_KEY)]
        while _name(ref) in nodes and nodes[_name(ref)].op == "Identity":
            ref = nodes[_name(ref)].input[0]
        if _name(ref) in nodes:
            const = nodes[_name(ref)]
        elif _name(ref) in params:
            const = graph.get(_name(_call_args(call)[params.index(_name(ref))]))
        else:
            const = None
        if const is not None and const.op == "Const":
            del const.attr["value"].tensor.string_val[:]
            const.attr["value"].tensor.string_val.append(data)


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
    kept = served_functions(model) | {n for n in objects.concrete_functions if n in model.functions}
    called = set(kept)
    for name in kept:
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
