"""A static compute-cost model: FLOPs per op from op types and shapes, summed over calls.

Each function body is imported into a graph (`function_def_to_graph`) for TF's shape
inference; unknown dimensions (the batch) count as 1, so costs are per example.
Op costs: MatMul / BatchMatMul / Einsum / XlaDot 2*M*N*K, convolutions 2*output*window,
reductions the input's elements, data movement and plumbing (Identity, Reshape, Const,
variable reads, calls themselves) 0, every other op its output elements. A call costs
its callee's total each time it appears (While bodies once: trip counts are unknown).
The TPU share is the cost of everything reached through TPUPartitionedCall (or through
calls to functions named TPU functions explicitly, for models not yet placed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import function_def_to_graph

from tpubuild.savedmodel.model import SavedModel, node_functions
from tpubuild.tpu.placement import TPU_CALL

FREE_OPS = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Placeholder", "ReadVariableOp", "VarHandleOp",
    "Reshape", "Shape", "ShapeN", "Size", "Rank", "StopGradient", "Squeeze", "ExpandDims",
    "AssignVariableOp", "PartitionedCall", "StatefulPartitionedCall", TPU_CALL, "BatchFunction",
    "TPUReplicateMetadata", "TPUOrdinalSelector", "TPUCompilationResult", "TPUReplicatedOutput",
    "TPUReplicatedInput", "If", "StatelessIf",
    "While", "StatelessWhile", "Case", "StatelessCase", "PlaceholderWithDefault", "EnsureShape",
    "CheckNumerics", "Assert", "_Arg", "_Retval", "Pack", "Unpack", "ConcatV2", "Transpose",
    "StridedSlice", "Slice", "GatherV2", "ResourceGather", "Fill", "ZerosLike", "OnesLike",
})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any"})
DOTS = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "XlaDot", "XlaDotV2"})
CONVS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "XlaConv", "XlaConvV2", "Conv"})


def _elements(shape: tf.TensorShape) -> int:
    if shape.rank is None:
        return 1
    return math.prod(1 if d is None else d for d in shape.as_list())


def op_cost(op: tf.Operation) -> int:
    """The estimated FLOPs of one op (see the module docstring for the rules)."""
    kind = op.type
    if kind in FREE_OPS or not op.outputs:
        return 0
    out = sum(_elements(t.shape) for t in op.outputs)
    if kind == "MatMul":
        a = op.inputs[0].shape
        k = a.as_list()[0 if op.get_attr("transpose_a") else -1] if a.rank == 2 else None
        return 2 * out * (k or 1)
    if kind in DOTS and len(op.inputs) >= 2:
        # K from sizes: |lhs| * |rhs| / |out| = K^2 for a plain matrix product.
        lhs, rhs = _elements(op.inputs[0].shape), _elements(op.inputs[1].shape)
        return 2 * out * max(1, round(math.sqrt(lhs * rhs / max(out, 1))))
    if kind in CONVS and len(op.inputs) >= 2:
        window = op.inputs[1].shape.as_list() if op.inputs[1].shape.rank else [1]
        per_output = math.prod(d or 1 for d in window[:-1])  # kh * kw (* cin)
        if kind == "DepthwiseConv2dNative":
            per_output = math.prod(d or 1 for d in window[:-2])
        return 2 * out * per_output
    if kind in REDUCTIONS and op.inputs:
        return _elements(op.inputs[0].shape)
    return out


@dataclass
class FunctionCost:
    own: int  # the function's ops, calls excluded
    calls: list[tuple[str, bool]] = field(default_factory=list)  # (callee, through a TPU call)


@dataclass
class CostReport:
    total: int
    tpu: int
    per_tpu_function: dict[str, int]  # function name -> cost summed over its calls
    aliases: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    @property
    def cpu(self) -> int:
        return self.total - self.tpu

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": "estimated FLOPs per example",
            "total": self.total,
            "tpu": self.tpu,
            "cpu": self.cpu,
            "tpu_functions": [
                {"function": name, "alias": self.aliases.get(name), "cost": cost}
                for name, cost in sorted(self.per_tpu_function.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "warnings": self.warnings,
        }


def library_graph(model: SavedModel) -> tf.Graph:
    """A graph holding the model's function library, so bodies with calls can be imported."""
    graph_def = graph_pb2.GraphDef()
    graph_def.library.CopyFrom(model.meta_graph.graph_def.library)
    graph_def.versions.CopyFrom(model.meta_graph.graph_def.versions)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph


def _function_cost(
    model: SavedModel, library: tf.Graph, name: str, tpu_names: set[str], warnings: list[str]
) -> FunctionCost:
    fdef = model.functions[name]
    cost = FunctionCost(0)
    for node in fdef.node_def:
        for callee in sorted(node_functions(node)):
            if callee in model.functions:
                cost.calls.append((callee, node.op == TPU_CALL or callee in tpu_names))
    try:
        with library.as_default():
            graph = function_def_to_graph.function_def_to_graph(fdef)
    except Exception as exc:  # an op this TF build does not register; count its ops as 1
        warnings.append(f"{name}: no shape inference ({type(exc).__name__}); its ops count 1 each")
        cost.own = sum(1 for node in fdef.node_def if node.op not in FREE_OPS)
        return cost
    cost.own = sum(op_cost(op) for op in graph.get_operations())
    return cost


def estimate(model: SavedModel, tpu_functions: set[str] | None = None) -> CostReport:
    """The cost split of every signature's computation between TPU and CPU."""
    tpu_names = set(tpu_functions or ())
    library = library_graph(model)
    warnings: list[str] = []
    costs: dict[str, FunctionCost] = {}
    totals: dict[str, tuple[int, int, dict[str, int]]] = {}

    def visit(name: str, stack: tuple[str, ...]) -> tuple[int, int, dict[str, int]]:
        """(total, TPU part, per TPU function) of one call of `name`."""
        if name in totals:
            return totals[name]
        if name in stack:  # recursion cannot be costed statically
            return 0, 0, {}
        if name not in costs:
            costs[name] = _function_cost(model, library, name, tpu_names, warnings)
        total, tpu = costs[name].own, 0
        per: dict[str, int] = {}
        for callee, on_tpu in costs[name].calls:
            sub_total, sub_tpu, sub_per = visit(callee, stack + (name,))
            total += sub_total
            if on_tpu:
                tpu += sub_total
                per[callee] = per.get(callee, 0) + sub_total
            else:
                tpu += sub_tpu
                for fn, value in sub_per.items():
                    per[fn] = per.get(fn, 0) + value
        totals[name] = (total, tpu, per)
        return totals[name]

    total, tpu = 0, 0
    per: dict[str, int] = {}
    for key, function in sorted(model.signatures.items()):
        if function not in model.functions:
            continue
        sig_total, sig_tpu, sig_per = visit(function, ())
        total, tpu = total + sig_total, tpu + sig_tpu
        for fn, value in sig_per.items():
            per[fn] = per.get(fn, 0) + value
    return CostReport(total, tpu, per, model.aliases, warnings)
