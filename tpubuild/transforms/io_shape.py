"""IO-shape rewrite: tensors crossing into and out of a TPU computation travel as rank 2.

A TPU pads the two minor dimensions of every transferred tensor (to 8 x 128), so a tensor
like [batch, 4, 4, 3] wastes most of each transfer; [batch, 48] does not. The caller
reshapes before the TPU call and after it, a copy of the TPU function reshapes back
inside, so the computation itself sees the original shapes and outputs stay bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.framework.tensor_shape_pb2 import TensorShapeProto
from tensorflow.python.framework import tensor_util

from tpubuild.savedmodel import fnedit
from tpubuild.savedmodel.casts import CLUSTER_ATTR
from tpubuild.savedmodel.model import SavedModel
from tpubuild.savedmodel.object_signatures import reshape_function_io
from tpubuild.tpu import placement as tpu
from tpubuild.transforms.batch_checks import output_dims

# Dtypes a TPU transfer carries as plain dense data; handles and strings are left alone.
SKIPPED = frozenset({types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT, types_pb2.DT_STRING})


@dataclass
class Layout:
    """One tensor's shape in the model and on the wire."""

    name: str
    dims: list[int]
    wire: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.name, "shape": self.dims, "transfer_shape": self.wire}


@dataclass
class FunctionPlan:
    function: str
    inputs: dict[int, Layout] = field(default_factory=dict)
    outputs: dict[int, Layout] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)  # why a tensor kept its shape

    def summary(self, wrapper: str | None, sites: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "function": self.function,
            "wrapper": wrapper,
            "inputs": [layout.to_json() for layout in self.inputs.values()],
            "outputs": [layout.to_json() for layout in self.outputs.values()],
            "left_alone": self.left,
            "call_sites": sites,
        }


def transfer_shape(dims: list[int] | None) -> tuple[list[int] | None, str | None]:
    """The rank-2 transfer shape for `dims`, or None and the reason it is left alone."""
    if dims is None:
        return None, "unknown rank"
    if len(dims) <= 2:
        return None, f"rank {len(dims)} already transfers as is"
    if any(d < 0 for d in dims[1:]):
        return None, "non-batch dimensions unknown when the model is built"
    return [dims[0], math.prod(dims[1:])], None


def plan_function(model: SavedModel, fn: str) -> FunctionPlan:
    """Which inputs and outputs of TPU function `fn` get a rank-2 transfer layout."""
    fdef = model.functions[fn]
    plan = FunctionPlan(fn)
    for index, arg in enumerate(fdef.signature.input_arg):
        if arg.type not in SKIPPED:
            dims = fnedit.dims(fnedit.arg_shape(fdef, index))
            _consider(plan, plan.inputs, index, f"input {arg.name}", dims)
    outs = output_dims(model, fn)
    for index, (arg, dims) in enumerate(zip(fdef.signature.output_arg, outs)):
        if arg.type not in SKIPPED:
            _consider(plan, plan.outputs, index, f"output {arg.name}", dims)
    return plan


def _consider(plan: FunctionPlan, chosen: dict[int, Layout], index: int, name: str, dims) -> None:
    wire, reason = transfer_shape(dims)
    if wire is None:
        plan.left.append(f"{name}: {reason}")
    else:
        chosen[index] = Layout(name, dims, wire)


def _reshape(
    fdef: FunctionDef, ref: str, dims: list[int], dtype: int, base: str, cluster: bytes | None
) -> tuple[list[NodeDef], str]:
    """Const + Reshape nodes turning `ref` into shape `dims` (-1 for the batch dimension)."""
    taken = fnedit.node_names(fdef)
    shape_name = fnedit.fresh_node_name(fdef, f"{base}/io_shape", taken)
    const = NodeDef(name=shape_name, op="Const")
    const.attr["dtype"].type = types_pb2.DT_INT32
    value = tensor_util.make_tensor_proto(dims, dtype=types_pb2.DT_INT32)
    const.attr["value"].tensor.CopyFrom(value)
    reshape = NodeDef(name=fnedit.fresh_node_name(fdef, f"{base}/io_reshape", taken), op="Reshape")
    reshape.input.extend([ref, f"{shape_name}:output:0"])
    reshape.attr["T"].type = dtype
    reshape.attr["Tshape"].type = types_pb2.DT_INT32
    for node in (const, reshape):
        if cluster is not None:
            node.attr[CLUSTER_ATTR].s = cluster
    return [const, reshape], f"{reshape.name}:output:0"


def _shape_proto(dims: list[int]) -> TensorShapeProto:
    return TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in dims])


def make_wrapper(model: SavedModel, plan: FunctionPlan, in_place: bool) -> str:
    """The TPU function taking and returning the transfer layouts: rewritten in place when
    every call of it is rewritten (so the alias keeps naming the function that is called,
    and its weights are stored once), else a copy for the rewritten calls."""
    if in_place:
        fdef = model.functions[plan.function]
    else:
        fdef = FunctionDef()
        fdef.CopyFrom(model.functions[plan.function])
        fdef.signature.name = model.unique_name(f"{plan.function}_io")
    clusters = {n.attr[CLUSTER_ATTR].s for n in fdef.node_def if CLUSTER_ATTR in n.attr}
    cluster = clusters.pop() if len(clusters) == 1 else None
    for index, layout in plan.inputs.items():
        arg = fdef.signature.input_arg[index]
        nodes, ref = _reshape(fdef, arg.name, _batch_free(layout.dims), arg.type, arg.name, cluster)
        fnedit.replace_refs(fdef, {arg.name: ref})
        fdef.node_def.extend(nodes)
        shapes = fdef.arg_attr[index].attr["_output_shapes"].list
        del shapes.shape[:]
        shapes.shape.append(_shape_proto(layout.wire))
        if "_input_shapes" in fdef.attr and index < len(fdef.attr["_input_shapes"].list.shape):
            fdef.attr["_input_shapes"].list.shape[index].CopyFrom(_shape_proto(layout.wire))
    for index, layout in plan.outputs.items():
        arg = fdef.signature.output_arg[index]
        wire = _batch_free(layout.wire)
        # Inside the computation, before TPUReplicatedOutput (tpu.py's output chain).
        value = tpu.computation_output(fdef, arg.name)
        nodes, ref = _reshape(fdef, value, wire, arg.type, arg.name, cluster)
        fdef.node_def.extend(nodes)
        tpu.set_computation_output(fdef, arg.name, ref)
    if in_place:
        # The saved tf.function behind the alias now takes and returns the transfer
        # layouts: its object-graph records say so, or it would not restore as a callable
        # (and the report's HLO, traced from them, would fail).
        missed = reshape_function_io(
            model.meta_graph.object_graph_def, plan.function,
            {i: layout.wire for i, layout in plan.inputs.items()},
            {i: layout.wire for i, layout in plan.outputs.items()},
        )
        plan.left += [f"object graph record {name}: holds a composite tensor; kept as saved" for name in missed]
        model.invalidate()
    else:
        model.add_function(fdef)
    return fdef.signature.name


def called_only_at(model: SavedModel, fn: str, sites: list[tuple[str, str]]) -> bool:
    """Whether `sites` ((caller, node) pairs) are every call of `fn` in the library and the
    top-level graph. The object graph also names `fn` (the saved `tf.function` behind the
    alias), but as a TPU computation it runs only through these calls, never on its own;
    an in-place rewrite updates its records (make_wrapper)."""
    calls = {(caller, node.name) for caller, node in model.call_sites(fn)}
    return calls <= set(sites) and not model.graph_call_sites(fn)


def _batch_free(dims: list[int]) -> list[int]:
    """The shape to reshape to, with the batch dimension left to Reshape (-1)."""
    return [-1, *dims[1:]]


def rewrite_site(
    model: SavedModel, caller: str, node_name: str, plan: FunctionPlan, wrapper: str
) -> None:
    """Point one TPUPartitionedCall at the wrapper and reshape around it in the caller."""
    fdef = model.functions[caller]
    node = next(n for n in fdef.node_def if n.name == node_name)
    callee = model.functions[plan.function]
    data = [i for i, ref in enumerate(node.input) if not ref.startswith("^")]
    added: list[NodeDef] = []
    for index, layout in plan.inputs.items():
        position = data[index]
        dtype = callee.signature.input_arg[index].type
        wire = _batch_free(layout.wire)
        base = f"{node_name}/in{index}"
        nodes, ref = _reshape(fdef, node.input[position], wire, dtype, base, None)
        fdef.node_def.extend(nodes)
        node = next(n for n in fdef.node_def if n.name == node_name)
        node.input[position] = ref
    mapping = {}
    for index, layout in plan.outputs.items():
        dtype = callee.signature.output_arg[index].type
        output = f"{node_name}:output:{index}"
        dims = _batch_free(layout.dims)
        nodes, ref = _reshape(fdef, output, dims, dtype, f"{node_name}/out{index}", None)
        added.extend(nodes)
        mapping[output] = ref
    fnedit.replace_refs(fdef, mapping)
    fdef.node_def.extend(added)  # after the rewrite, so they keep reading the call's outputs
    node = next(n for n in fdef.node_def if n.name == node_name)
    node.attr["f"].func.name = wrapper
    model.invalidate()
