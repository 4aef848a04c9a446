"""Tensor dtypes inside a FunctionDef, and Cast nodes wherever a producer and a consumer disagree.

A rewrite changes some ops' type attrs (float32 -> bfloat16); `fix_edges` then makes the
function consistent again by casting on every float32/bfloat16 edge that no longer matches,
including the function's return values (so its signature keeps its dtypes).
"""

from __future__ import annotations

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.python.framework import op_def_registry

from tpubuild.savedmodel import fnedit

F32 = types_pb2.DT_FLOAT
BF16 = types_pb2.DT_BFLOAT16
CASTABLE = frozenset({F32, BF16})
CLUSTER_ATTR = "_tpu_replicate"


def _arg_types(args, node: NodeDef) -> list[tuple[str, list[int]]] | None:
    if any(a.type_attr and a.type_attr not in node.attr for a in args):
        # Saved FunctionDefs leave out attrs at their default value (e.g. Sum's Tidx).
        full = NodeDef()
        full.CopyFrom(node)
        fnedit.fill_default_attrs(full)
        node = full
    out = []
    for arg in args:
        count = node.attr[arg.number_attr].i if arg.number_attr else 1
        if arg.type_list_attr:
            types = list(node.attr[arg.type_list_attr].list.type)
        elif arg.type_attr:
            if arg.type_attr not in node.attr:
                return None
            types = [node.attr[arg.type_attr].type] * count
        else:
            types = [arg.type] * count
        out.append((arg.name, types))
    return out


def output_types(node: NodeDef, functions: dict[str, FunctionDef]) -> dict[str, list[int]] | None:
    """Output arg name -> dtypes of a node, from its op def (or the function it names)."""
    op_def = op_def_registry.get(node.op)
    if op_def is not None:
        found = _arg_types(op_def.output_arg, node)
        return None if found is None else dict(found)
    if node.op in functions:
        return {a.name: [a.type] for a in functions[node.op].signature.output_arg}
    return None


def input_types(node: NodeDef, functions: dict[str, FunctionDef]) -> list[int] | None:
    """The dtype each data input of `node` must have, in input order."""
    op_def = op_def_registry.get(node.op)
    if op_def is not None:
        found = _arg_types(op_def.input_arg, node)
        return None if found is None else [t for _, types in found for t in types]
    if node.op in functions:
        return fnedit.input_types(functions[node.op])
    return None


class Edges:
    """Producer dtypes of one function, and the Cast nodes added to it."""

    def __init__(self, fdef: FunctionDef, functions: dict[str, FunctionDef]):
        self.fdef = fdef
        self.functions = functions
        self.args = {a.name: a.type for a in fdef.signature.input_arg}
        self.outputs = {n.name: output_types(n, functions) for n in fdef.node_def}
        self.casts: dict[tuple[str, int], str] = {}
        self.taken = fnedit.node_names(fdef)
        clusters = {n.attr[CLUSTER_ATTR].s for n in fdef.node_def if CLUSTER_ATTR in n.attr}
        # Casts inside a TPU computation belong to its cluster, as tpu.rewrite would tag them.
        self.cluster = clusters.pop() if len(clusters) == 1 else None

    def dtype(self, ref: str) -> int | None:
        parts = ref.split(":")
        if len(parts) == 1:
            return self.args.get(ref)
        produced = self.outputs.get(parts[0])
        if produced is None or parts[1] not in produced:
            return None
        types = produced[parts[1]]
        index = int(parts[2]) if len(parts) > 2 else 0
        return types[index] if index < len(types) else None

    def cast(self, ref: str, want: int) -> str:
        """A reference to `ref` cast to `want` (one Cast node per tensor and target dtype)."""
        key = (ref, want)
        if key not in self.casts:
            suffix = "to_bf16" if want == BF16 else "to_f32"
            base = ref.split(":")[0] + f"/{suffix}"
            name = fnedit.fresh_node_name(self.fdef, base, self.taken)
            node = NodeDef(name=name, op="Cast", input=[ref])
            node.attr["SrcT"].type = self.dtype(ref)
            node.attr["DstT"].type = want
            node.attr["Truncate"].b = False
            if self.cluster is not None:
                node.attr[CLUSTER_ATTR].s = self.cluster
            self.fdef.node_def.append(node)
            self.outputs[name] = {"y": [want]}
            self.casts[key] = f"{name}:y:0"
        return self.casts[key]

    def fix(self) -> int:
        """Cast every float32/bfloat16 mismatch on data edges and return values; returns the count."""
        for node in list(self.fdef.node_def):
            wanted = input_types(node, self.functions)
            if wanted is None:
                continue
            data = [i for i, ref in enumerate(node.input) if not ref.startswith("^")]
            for position, want in zip(data, wanted):
                self._fix_input(node, position, want)
        returns = {a.name: a.type for a in self.fdef.signature.output_arg}
        for key, ref in list(self.fdef.ret.items()):
            have = self.dtype(ref)
            if have != returns[key] and {have, returns[key]} <= CASTABLE:
                self.fdef.ret[key] = self.cast(ref, returns[key])
        return len(self.casts)

    def _fix_input(self, node: NodeDef, position: int, want: int) -> None:
        ref = node.input[position]
        have = self.dtype(ref)
        if have is not None and have != want and {have, want} <= CASTABLE:
            node.input[position] = self.cast(ref, want)


def fix_edges(fdef: FunctionDef, functions: dict[str, FunctionDef]) -> int:
    """Insert the Casts `fdef` needs after its ops' dtypes changed; returns how many."""
    return Edges(fdef, functions).fix()
