"""The variables a TPU body reads, for bodies the object graph does not record, and the
object-graph entry that binds them in the CPU twin (so the report can lower the body).

A body split from a signature (`placement.split_wrapper`: Keras's `model.export()`,
orbax), a jit-compiled helper or a function that only other functions call has no
SavedConcreteFunction: `tf.saved_model.load` loads its FunctionDef with a placeholder
for every argument, its resource arguments included, and binds no variable to it.
Its callers do pass the variables: each resource argument is, through the call nodes
(StatefulPartitionedCall, TPUPartitionedCall, BatchFunction), an argument of a function
the object graph records, whose `bound_inputs` name the object each trailing argument
is bound to. With those node ids in a `bare_concrete_function` entry of its own, TF's
loader binds the body exactly as it binds a signature (tensorflow/python/saved_model/
load.py `_recreate_bare_concrete_function` -> `_setup_function_captures` ->
tensorflow/core/function/capture/restore_captures.py: the last `len(bound_inputs)`
inputs of the function are the captures, in order).
"""

from __future__ import annotations

from collections.abc import Iterable

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.tensor_shape_pb2 import TensorShapeProto
from tensorflow.core.framework.types_pb2 import DT_RESOURCE
from tensorflow.core.protobuf import saved_object_graph_pb2

from tpubuild.savedmodel.fnedit import ANY_CALL_OPS
from tpubuild.savedmodel.model import SavedModel

# The root's attributes the twin adds, one per exposed body: `<prefix><n>`.
EXPOSED_PREFIX = "_tpubuild_tpu_body_"
# BatchFunction's callee takes `in_tensors` then `captured_tensors`, its inputs in order
# (tensorflow/core/ops/batch_ops.cc), as a call op's callee takes the call's inputs.
_PASS_THROUGH_CALLS = ANY_CALL_OPS | {"BatchFunction"}
_DATA = -1  # an argument that is no capture: the lowered body takes it as a parameter


def object_paths(model: SavedModel) -> dict[str, list[str]]:
    """Concrete function name -> attribute path from the root object that holds it: a
    saved tf.function's, else a bare concrete function's (signatures excluded: they are
    not attributes of the loaded object)."""
    nodes = model.meta_graph.object_graph_def.nodes
    paths: dict[int, list[str]] = {0: []}
    queue = [0]
    while queue:
        node_id = queue.pop(0)
        for child in nodes[node_id].children:
            if child.node_id not in paths:
                paths[child.node_id] = paths[node_id] + [child.local_name]
                queue.append(child.node_id)
    found: dict[str, list[str]] = {}
    # A saved tf.function before a bare trace of it at the same depth or deeper.
    ordered = sorted(paths.items(), key=lambda kv: (len(kv[1]), nodes[kv[0]].WhichOneof("kind") != "function"))
    for node_id, path in ordered:
        node = nodes[node_id]
        if "signatures" in path:
            continue
        if node.WhichOneof("kind") == "function":
            for name in node.function.concrete_functions:
                found.setdefault(name, path)
        elif node.WhichOneof("kind") == "bare_concrete_function":
            found.setdefault(node.bare_concrete_function.concrete_function_name, path)
    return found


def bound_inputs(model: SavedModel, name: str) -> list[int] | str:
    """The object-graph node ids function `name`'s trailing captured arguments are bound
    to, traced through its callers; or why they cannot be told (one line)."""
    fdef = model.functions[name]
    recorded = _recorded(model)
    sources = []
    for index, arg in enumerate(fdef.signature.input_arg):
        found = _arg_source(model, recorded, name, index, frozenset())
        if isinstance(found, str):
            if arg.type != DT_RESOURCE:
                found = _DATA  # a tensor the lowered body takes as a parameter, whatever made it
            else:
                return f"argument {arg.name}: {found}"
        sources.append(found)
    captured = [s for s in sources if s != _DATA]
    if sources[len(sources) - len(captured):] != captured:
        return "its captured arguments are not its last ones; TF's loader binds only trailing arguments"
    return captured


def _recorded(model: SavedModel) -> set[str]:
    """Concrete functions an object-graph node holds (so the loader binds their captures)."""
    names = set()
    for node in model.meta_graph.object_graph_def.nodes:
        kind = node.WhichOneof("kind")
        if kind == "function":
            names.update(node.function.concrete_functions)
        elif kind == "bare_concrete_function":
            names.add(node.bare_concrete_function.concrete_function_name)
    return names & set(model.meta_graph.object_graph_def.concrete_functions)


def _arg_source(model: SavedModel, recorded: set[str], name: str, index: int, seen: frozenset) -> int | str:
    """The node id argument `index` of `name` is bound to, _DATA (an argument of a function
    the object graph records, not one of its captures), or why not known."""
    fdef = model.functions[name]
    if name in recorded:
        bound = model.meta_graph.object_graph_def.concrete_functions[name].bound_inputs
        first = len(fdef.signature.input_arg) - len(bound)
        return bound[index - first] if index >= first else _DATA
    if (name, index) in seen:
        return "it is passed around a recursive call"
    sites = model.call_sites(name)
    if not sites:
        return "nothing calls its function and the object graph does not record it"
    found: set[int] = set()
    for caller, node in sites:
        data = [i for i in node.input if not i.startswith("^")]
        if node.op not in _PASS_THROUGH_CALLS or node.attr["f"].func.name != name or index >= len(data):
            return f"{caller} calls it through {node.op} node '{node.name}'"
        source = _through_identities(model.functions[caller], data[index])
        args = [a.name for a in model.functions[caller].signature.input_arg]
        if source not in args:
            return f"{caller} passes it from '{source}', not from an argument"
        upstream = _arg_source(model, recorded, caller, args.index(source), seen | {(name, index)})
        if isinstance(upstream, str):
            return upstream
        found.add(upstream)
    if len(found) > 1:
        return "its call sites pass it different objects"
    return found.pop()


def _through_identities(fdef: FunctionDef, tensor: str) -> str:
    """`tensor` (a FunctionDef input reference) with Identity nodes looked through."""
    nodes = {n.name: n for n in fdef.node_def}
    node = nodes.get(tensor.split(":")[0]) if ":" in tensor else None
    while node is not None and node.op == "Identity" and node.input:
        tensor = node.input[0]
        node = nodes.get(tensor.split(":")[0]) if ":" in tensor else None
    return tensor


def expose(model: SavedModel, names: Iterable[str]) -> dict[str, str]:
    """Give each function of `names` the object graph does not hold an attribute of the
    root, its captures bound; returns {name: why not} for those that cannot have one."""
    graph = model.meta_graph.object_graph_def
    if not graph.nodes:
        return {}
    held = object_paths(model)
    taken = {child.local_name for child in graph.nodes[0].children}
    refused = {}
    for name in sorted(set(names) - set(held)):
        if name not in model.functions:
            continue
        bound = bound_inputs(model, name)
        if isinstance(bound, str):
            refused[name] = bound
            continue
        problem = _add_entry(graph, model.functions[name], bound, taken)
        if problem:
            refused[name] = problem
    return refused


def _add_entry(graph: saved_object_graph_pb2.SavedObjectGraph, fdef: FunctionDef, bound: list[int],
               taken: set[str]) -> str | None:
    """A bare_concrete_function node for `fdef`, a child of the root, taking its data
    arguments by position; None, or why it cannot have one."""
    args = list(fdef.signature.input_arg)[: len(fdef.signature.input_arg) - len(bound)]
    for arg in [*args, *fdef.signature.output_arg]:
        if not arg.type:
            return f"argument {arg.name} has a polymorphic type"
    name = fdef.signature.name
    if name not in graph.concrete_functions:
        record = graph.concrete_functions[name]
        record.bound_inputs.extend(bound)
        # (args, kwargs) and the outputs, as load_function_def_library decodes them
        # (nested_structure_coder); the shapes the loader gives the placeholders are the
        # FunctionDef's own (function_def_to_graph: `_input_shapes`).
        signature = record.canonicalized_input_signature.tuple_value
        positional = signature.values.add().tuple_value
        signature.values.add().dict_value.SetInParent()
        shapes = _input_shapes(fdef)
        for index, arg in enumerate(args):
            spec = positional.values.add().tensor_spec_value
            spec.name, spec.dtype = arg.name, arg.type
            spec.shape.CopyFrom(shapes[index])
        outputs = record.output_signature.tuple_value
        for arg in fdef.signature.output_arg:
            spec = outputs.values.add().tensor_spec_value
            spec.name, spec.dtype = arg.name, arg.type
            spec.shape.unknown_rank = True
    node = graph.nodes.add()
    node.bare_concrete_function.concrete_function_name = name
    node.bare_concrete_function.argument_keywords.extend(arg.name for arg in args)
    node.bare_concrete_function.allowed_positional_arguments = len(args)
    count = 0
    while f"{EXPOSED_PREFIX}{count}" in taken:
        count += 1
    local = f"{EXPOSED_PREFIX}{count}"
    taken.add(local)
    graph.nodes[0].children.add(node_id=len(graph.nodes) - 1, local_name=local)
    return None


def _input_shapes(fdef: FunctionDef) -> list[TensorShapeProto]:
    """Each argument's recorded shape (`_input_shapes`, else the argument's
    `_output_shapes`), unknown rank when neither says."""
    listed = list(fdef.attr["_input_shapes"].list.shape) if "_input_shapes" in fdef.attr else []
    shapes = []
    for index in range(len(fdef.signature.input_arg)):
        if len(listed) == len(fdef.signature.input_arg):
            shapes.append(listed[index])
            continue
        attr = fdef.arg_attr[index].attr if index in fdef.arg_attr else {}
        recorded = attr["_output_shapes"].list.shape if "_output_shapes" in attr else []
        shapes.append(recorded[0] if recorded else TensorShapeProto(unknown_rank=True))
    return shapes

