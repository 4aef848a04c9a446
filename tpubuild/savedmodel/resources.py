"""Which variables (object-graph node ids) each resource argument of each function can hold.

Captured variables enter concrete functions as trailing resource arguments (the object
graph's `bound_inputs`) and are passed on through call ops; following those edges tells
every ReadVariableOp which variable it reads, in any function.
"""

from __future__ import annotations

from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel.model import GRAPH, SavedModel

Key = tuple[str, str]  # (function name or GRAPH, argument or graph node name)
PASS_THROUGH = frozenset({"Identity"})


def _arg_mapping(node: NodeDef, functions: dict) -> list[tuple[str, list[str]]]:
    """(callee, refs passed to its arguments in order) for each function a node calls."""
    data = [ref for ref in node.input if not ref.startswith("^")]
    op = node.op
    if op in ("PartitionedCall", "StatefulPartitionedCall", "BatchFunction"):
        return [(node.attr["f"].func.name, data)]
    if op == "TPUPartitionedCall":
        return [(node.attr["f"].func.name, data[:-1])]  # the last input is the device ordinal
    if op in ("If", "StatelessIf"):
        return [(node.attr[b].func.name, data[1:]) for b in ("then_branch", "else_branch")]
    if op in ("While", "StatelessWhile"):
        return [(node.attr[b].func.name, data) for b in ("cond", "body")]
    if op in ("Case", "StatelessCase"):
        return [(f.name, data[1:]) for f in node.attr["branches"].list.func]
    if op in functions:
        return [(op, data)]
    return []


class VariableSources:
    """The analysis result: `ids(fn, ref)` gives the variables a resource tensor can be."""

    def __init__(self, model: SavedModel):
        self.model = model
        self.known: dict[Key, set[int]] = {}
        self._seed()
        self._propagate()

    def _seed(self) -> None:
        for fn, saved in self.model.meta_graph.object_graph_def.concrete_functions.items():
            if fn not in self.model.functions:
                continue
            args = [a.name for a in self.model.functions[fn].signature.input_arg]
            bound = list(saved.bound_inputs)
            for arg, node_id in zip(args[len(args) - len(bound):], bound):
                self.known.setdefault((fn, arg), set()).add(node_id)

    def nodes(self, holder: str) -> dict[str, NodeDef]:
        if holder == GRAPH:
            return {n.name: n for n in self.model.meta_graph.graph_def.node}
        return {n.name: n for n in self.model.functions[holder].node_def}

    def ids(self, holder: str, ref: str, nodes: dict[str, NodeDef] | None = None) -> set[int]:
        """Variables the resource tensor `ref` of `holder` (a function or GRAPH) can be."""
        nodes = self.nodes(holder) if nodes is None else nodes
        seen = set()
        while True:
            name = ref.lstrip("^").split(":")[0]
            if name in seen:
                return set()
            seen.add(name)
            node = nodes.get(name)
            if holder != GRAPH and node is None:
                return set(self.known.get((holder, name), set()))
            if node is not None and node.op in PASS_THROUGH and node.input:
                ref = node.input[0]
                continue
            return set(self.known.get((holder, name), set()))

    def _propagate(self) -> None:
        functions = self.model.functions
        holders = [GRAPH, *functions]
        changed = True
        while changed:
            changed = False
            for holder in holders:
                nodes = self.nodes(holder)
                for node in nodes.values():
                    for callee, refs in _arg_mapping(node, functions):
                        if callee not in functions:
                            continue
                        args = [a.name for a in functions[callee].signature.input_arg]
                        for ref, arg in zip(refs, args):
                            changed |= self._link(holder, ref, nodes, (callee, arg))

    def _link(self, holder: str, ref: str, nodes: dict[str, NodeDef], arg: Key) -> bool:
        """Merge what the caller knows about `ref` into the callee's argument (and back, at the
        graph level, where VarHandleOp nodes learn their variable from the callee)."""
        before = len(self.known.get(arg, ())), 0
        ids = self.ids(holder, ref, nodes)
        self.known.setdefault(arg, set()).update(ids)
        back = 0
        if holder == GRAPH:
            name = ref.split(":")[0]
            if name in nodes and nodes[name].op == "VarHandleOp" and self.known[arg]:
                mine = self.known.setdefault((GRAPH, name), set())
                back = len(self.known[arg] - mine)
                mine.update(self.known[arg])
        return len(self.known[arg]) != before[0] or back > 0
