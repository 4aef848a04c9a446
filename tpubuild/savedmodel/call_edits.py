"""Edits of the calls between a SavedModel's functions, shared by the passes that drop what an
artifact no longer reads (savedmodel/prune.py, dead_arguments.py, saver_edits.py): which nodes
call a function, which arguments a call passes, the graph-level saver's calls, and dropping
arguments from a call and from the function it calls, in step.
"""

from __future__ import annotations

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel.fnedit import ANY_CALL_OPS, TPU_CALL
from tpubuild.savedmodel.model import GRAPH, SavedModel


def ref_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def call_args(node: NodeDef) -> list[str]:
    """The data inputs of a call node that are the callee's arguments, in order."""
    data = [ref for ref in node.input if not ref.startswith("^")]
    return data[:-1] if node.op == TPU_CALL else data  # TPUPartitionedCall's last input: the ordinal


def holders(model: SavedModel) -> dict[str, list[NodeDef]]:
    return {GRAPH: list(model.meta_graph.graph_def.node),
            **{name: list(f.node_def) for name, f in model.functions.items()}}


def saver_calls(model: SavedModel) -> dict[str, NodeDef]:
    """The graph's save and restore call nodes, by role (`save`, `restore`)."""
    saver = model.meta_graph.saver_def
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    calls = {}
    for role, ref in (("save", saver.save_tensor_name), ("restore", saver.restore_op_name)):
        node = graph.get(ref_name(ref)) if ref else None
        if node is not None and node.op in ANY_CALL_OPS:
            calls[role] = node
    return calls


def drop_call_inputs(node: NodeDef, drop: list[int]) -> None:
    """A call node stops passing the arguments at `drop` (indexes into the callee's args)."""
    args, control = call_args(node), [r for r in node.input if r.startswith("^")]
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


def drop_function_args(fdef: FunctionDef, drop: list[int]) -> None:
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
