"""Dead resource arguments (savedmodel/prune.py, step 1): a resource argument is dead when
every node that uses it is a call passing it to a dead argument of the callee (functions do
not recurse, so this settles bottom-up). A function's dead arguments are dropped when every
reference to it is a call op that can be edited; its callers stop passing them, and a
concrete function of the object graph loses the matching `bound_inputs`
(tensorflow/python/saved_model/load.py binds captures from `bound_inputs`, in order, to the
function's trailing arguments).
"""

from __future__ import annotations

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel.call_edits import (
    call_args,
    drop_call_inputs,
    drop_function_args,
    holders,
    ref_name,
    saver_calls,
)
from tpubuild.savedmodel.fnedit import ANY_CALL_OPS
from tpubuild.savedmodel.model import SavedModel, attr_functions


def _editable_functions(model: SavedModel, saver: set[str]) -> set[str]:
    """Functions referenced only by call ops' `f` (never by If/While/Case/BatchFunction or
    another attr), whose argument lists can therefore change with their call sites."""
    blocked = set(saver)
    for nodes in holders(model).values():
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
    saver_fns = {n.attr["f"].func.name for n in saver_calls(model).values()}
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
        for name, resources in candidates.items():
            fdef = model.functions[name]
            returned = {ref_name(ref) for ref in fdef.ret.values()}
            for arg in sorted(resources - dead.get(name, set())):
                if arg not in returned and all(_passes_to_dead(node, arg, dead, model) for node in _consumers(fdef, arg)):
                    dead.setdefault(name, set()).add(arg)
                    changed = True
    return {name: [i for i, a in enumerate(model.functions[name].signature.input_arg) if a.name in args]
            for name, args in sorted(dead.items()) if args}


def _consumers(fdef: FunctionDef, arg: str) -> list[NodeDef]:
    return [n for n in fdef.node_def if any(not r.startswith("^") and ref_name(r) == arg for r in n.input)]


def _passes_to_dead(node: NodeDef, arg: str, dead: dict[str, set[str]], model: SavedModel) -> bool:
    if node.op not in ANY_CALL_OPS:
        return False
    callee = node.attr["f"].func.name
    params = [a.name for a in model.functions[callee].signature.input_arg] if callee in model.functions else []
    positions = [i for i, ref in enumerate(call_args(node)) if ref_name(ref) == arg]
    return bool(positions) and all(i < len(params) and params[i] in dead.get(callee, set()) for i in positions)


def drop_dead_arguments(model: SavedModel) -> dict[str, list[int]]:
    """Drop every dead resource argument (and its call inputs and bound inputs)."""
    dead = dead_arguments(model)
    concrete = model.meta_graph.object_graph_def.concrete_functions
    for name, drop in dead.items():
        for nodes in holders(model).values():
            for node in nodes:
                if node.op in ANY_CALL_OPS and node.attr["f"].func.name == name:
                    drop_call_inputs(node, drop)
        count = len(model.functions[name].signature.input_arg)
        if name in concrete:
            bound = list(concrete[name].bound_inputs)
            first = count - len(bound)
            del concrete[name].bound_inputs[:]
            concrete[name].bound_inputs.extend(b for i, b in enumerate(bound) if first + i not in drop)
        drop_function_args(model.functions[name], drop)
    if dead:
        model.invalidate()
    return dead
