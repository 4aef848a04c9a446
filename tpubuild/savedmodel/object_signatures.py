"""The object graph's record of a saved function's inputs and outputs, kept true when a
stage changes the shapes the function takes or returns in place.

`tf.saved_model.load` rebuilds each saved `tf.function` from the object graph
(tensorflow/python/saved_model/function_deserialization.py: `recreate_function` checks a
call's arguments against `SavedFunction.function_spec.input_signature`, picks the
concrete function whose `canonicalized_input_signature` they match, calls its FunctionDef
with the flattened tensors and packs the results by `output_signature`). A FunctionDef
whose argument shapes changed while these records kept the old ones restores as a
function that refuses both the old shapes (its body no longer takes them) and the new
ones (the records say otherwise); `experimental_get_compiler_ir`, which the report uses
for a TPU function's HLO, traces from the same records and fails too.
"""

from __future__ import annotations

from tensorflow.core.framework.tensor_shape_pb2 import TensorShapeProto
from tensorflow.core.protobuf import saved_object_graph_pb2, struct_pb2


def _tensor_leaves(value: struct_pb2.StructuredValue) -> list[struct_pb2.TensorSpecProto] | None:
    """The tensor specs of `value` in tf.nest order (dict keys sorted), which is the order of
    the FunctionDef's arguments or results; None when a composite (a SparseTensor's
    TypeSpec, say) stands for an unknown number of them."""
    kind = value.WhichOneof("kind")
    if kind in ("tensor_spec_value", "bounded_tensor_spec_value"):
        return [getattr(value, kind)]
    if kind in ("tuple_value", "list_value"):
        children = [_tensor_leaves(child) for child in getattr(value, kind).values]
    elif kind == "dict_value":
        fields = value.dict_value.fields
        children = [_tensor_leaves(fields[key]) for key in sorted(fields)]
    elif kind == "named_tuple_value":
        children = [_tensor_leaves(pair.value) for pair in value.named_tuple_value.values]
    elif kind == "type_spec_value":
        return None
    else:  # None, numbers, strings, booleans: Python values, not FunctionDef arguments
        return []
    if any(child is None for child in children):
        return None
    return [leaf for child in children for leaf in child]  # type: ignore[union-attr]


def _set_shapes(value: struct_pb2.StructuredValue, shapes: dict[int, list[int]]) -> bool:
    """Give the tensor specs at flat positions `shapes` their new dims (-1: unknown); False
    (and nothing changed) when the positions cannot be told."""
    leaves = _tensor_leaves(value)
    if leaves is None or any(index >= len(leaves) for index in shapes):
        return False
    for index, dims in shapes.items():
        leaves[index].shape.CopyFrom(TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in dims]))
    return True


def reshape_function_io(graph: saved_object_graph_pb2.SavedObjectGraph, function: str,
                        inputs: dict[int, list[int]], outputs: dict[int, list[int]]) -> list[str]:
    """Record new shapes for arguments `inputs` and results `outputs` (FunctionDef positions)
    of concrete function `function`; the records that could not be updated, by name."""
    missed = []
    if function in graph.concrete_functions:
        concrete = graph.concrete_functions[function]
        if inputs and not _set_shapes(concrete.canonicalized_input_signature, inputs):
            missed.append("canonicalized_input_signature")
        if outputs and not _set_shapes(concrete.output_signature, outputs):
            missed.append("output_signature")
    for node in graph.nodes:
        saved = node.function if node.WhichOneof("kind") == "function" else None
        # A tf.function's input_signature describes all of its concrete functions: changed
        # only when this is its one concrete function.
        if saved is None or list(saved.concrete_functions) != [function] or not inputs:
            continue
        if saved.function_spec.HasField("input_signature") and \
                not _set_shapes(saved.function_spec.input_signature, inputs):
            missed.append("function_spec.input_signature")
    return missed
