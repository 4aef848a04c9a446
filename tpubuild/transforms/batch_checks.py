"""The converter's batching shape requirements, checked statically before anything is written.

BatchFunction concatenates the requests' inputs along dimension 0 and splits the outputs
along dimension 0; these checks catch, at build time, what would otherwise fail at serving
time with the messages quoted below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf import struct_pb2

from tpubuild.savedmodel import fnedit
from tpubuild.savedmodel.model import SavedModel
from tpubuild.transforms.batching import TPU_CALL

SCALAR = "Batching input tensors must have at least one dimension"
EQUAL_DIM0 = (
    "Batching input tensors supplied in a given op invocation must have equal 0th-dimension size"
)
MATCH = "Dimensions of inputs should match"
OUTPUT = (
    "Batched output tensor's 0th dimension does not equal the sum of the 0th dimension sizes "
    "of the input tensors"
)
SPARSE = "BatchFunction does not accept SparseTensors"


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Spec:
    """One input or output as the checks see it: name, dims (None: unknown rank), sparse."""

    name: str
    dims: list[int] | None
    sparse: bool = False


def _shape_text(dims: list[int]) -> str:
    return "[" + ", ".join("None" if d < 0 else str(d) for d in dims) + "]"


def check_specs(what: str, inputs: list[Spec], outputs: list[Spec]) -> Findings:
    """Apply the four requirements to the batched inputs and the outputs of `what`."""
    found = Findings()
    for spec in inputs:
        where = f'{what}: input "{spec.name}"'
        if spec.sparse:
            found.errors.append(f"{where} is a SparseTensor: {SPARSE}")
        elif spec.dims is None:
            found.warnings.append(f"{where} has an unknown rank; its batching shape is not checked")
        elif not spec.dims:
            found.errors.append(f"{where} is a scalar: {SCALAR}")
        elif spec.dims[0] >= 0:
            found.errors.append(
                f"{where} has shape {_shape_text(spec.dims)}; dimension 0 must be None (-1) so "
                f"that requests can be concatenated (at serving time: {EQUAL_DIM0})"
            )
        elif any(d < 0 for d in spec.dims[1:]):
            found.warnings.append(
                f"{where} has shape {_shape_text(spec.dims)}; requests whose other dimensions "
                f'differ fail at serving time with "{MATCH}"'
            )
    if found.errors:
        return found  # outputs of ill-shaped inputs are ill-shaped too: report the cause only
    for spec in outputs:
        where = f'{what}: output "{spec.name}"'
        if spec.dims is None:
            continue
        if not spec.dims or spec.dims[0] >= 0:
            kind = "is a scalar" if not spec.dims else f"has shape {_shape_text(spec.dims)}"
            found.errors.append(
                f"{where} {kind}; its dimension 0 must follow the batched inputs ({OUTPUT})"
            )
    return found


def function_specs(model: SavedModel, fn: str, batched: list[int]) -> tuple[list[Spec], list[Spec]]:
    """Specs of a batched call's inputs (positions `batched`) and outputs of function `fn`."""
    fdef = model.functions[fn]
    outputs = [
        Spec(arg.name, dims) for arg, dims in zip(fdef.signature.output_arg, output_dims(model, fn))
    ]
    return input_specs(model, fn, batched), outputs


def input_specs(model: SavedModel, fn: str, positions: list[int]) -> list[Spec]:
    """Specs of function `fn`'s inputs at `positions`, named as the user named them."""
    fdef = model.functions[fn]
    names = fnedit.arg_names(fdef)
    sparse = _sparse_positions(model, fn)
    inputs: list[Spec] = []
    for index in positions:
        name = _user_name(fdef, index) or names[index]
        spec = Spec(name, fnedit.dims(fnedit.arg_shape(fdef, index)), index in sparse)
        if not any(spec.sparse and seen.name == name for seen in inputs):
            inputs.append(spec)  # one report per SparseTensor, not per component
    return inputs


def signature_specs(model: SavedModel, key: str) -> tuple[list[Spec], list[Spec]]:
    """Specs of a signature's inputs and outputs, from its SignatureDef."""
    sig = model.meta_graph.signature_def[key]

    def spec(name: str, info) -> Spec:
        if info.WhichOneof("encoding") == "coo_sparse":
            return Spec(name, None, sparse=True)
        return Spec(name, fnedit.dims(info.tensor_shape))

    return (
        [spec(n, sig.inputs[n]) for n in sorted(sig.inputs)],
        [spec(n, sig.outputs[n]) for n in sorted(sig.outputs)],
    )


def _user_name(fdef: FunctionDef, index: int) -> str | None:
    if index in fdef.arg_attr and "_user_specified_name" in fdef.arg_attr[index].attr:
        return fdef.arg_attr[index].attr["_user_specified_name"].s.decode()
    return None


def _sparse_positions(model: SavedModel, fn: str) -> set[int]:
    """Argument positions that carry SparseTensor components in a saved concrete function."""
    functions = model.meta_graph.object_graph_def.concrete_functions
    if fn not in functions:
        return set()
    positions: set[int] = set()
    position = 0

    def walk(value: struct_pb2.StructuredValue) -> bool:
        """Count flat arguments in tf.nest order; False once a leaf of unknown width is met."""
        nonlocal position
        kind = value.WhichOneof("kind")
        if kind == "tensor_spec_value":
            position += 1
        elif kind == "type_spec_value":
            if value.type_spec_value.type_spec_class != struct_pb2.TypeSpecProto.SPARSE_TENSOR_SPEC:
                return False
            positions.update(range(position, position + 3))  # indices, values, dense_shape
            position += 3
        elif kind in ("tuple_value", "list_value"):
            return all(walk(child) for child in getattr(value, kind).values)
        elif kind == "dict_value":
            fields = value.dict_value.fields
            return all(walk(fields[key]) for key in sorted(fields))
        return True

    walk(functions[fn].canonicalized_input_signature)
    return positions


def output_dims(model: SavedModel, fn: str) -> list[list[int] | None]:
    """Static output shapes of `fn`: from the object graph, else by importing the function."""
    functions = model.meta_graph.object_graph_def.concrete_functions
    count = len(model.functions[fn].signature.output_arg)
    if fn in functions:
        flat = _flatten_specs(functions[fn].output_signature)
        if len(flat) == count:
            return flat
    return _inferred_output_dims(model, fn, count)


def _flatten_specs(value: struct_pb2.StructuredValue) -> list[list[int] | None]:
    """Tensor specs in tf.nest order (dict keys sorted), as dims."""
    kind = value.WhichOneof("kind")
    if kind == "tensor_spec_value":
        return [fnedit.dims(value.tensor_spec_value.shape)]
    if kind in ("tuple_value", "list_value"):
        return [d for child in getattr(value, kind).values for d in _flatten_specs(child)]
    if kind == "dict_value":
        fields = value.dict_value.fields
        return [d for key in sorted(fields) for d in _flatten_specs(fields[key])]
    if kind == "none_value":
        return []
    return [None]  # composite tensors: one spec for several tensors, not checked


def _inferred_output_dims(model: SavedModel, fn: str, count: int) -> list[list[int] | None]:
    """Shape inference over `fn` imported as a graph. A function stages made (a TPU body
    split from a Keras endpoint, an io_shape wrapper) has no object-graph record and calls
    other library functions: function_def_to_graph looks callees up in the default graph
    (function_def_to_graph_def in tensorflow/python/framework/function_def_to_graph.py
    raises "Function ... was not found" otherwise), so the library is imported first."""
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    # A copy: function_def_to_graph rewrites the FunctionDef it is given (seen on a jax2tf
    # XlaCallModule, whose empty `function_list` attr it left without a value, which the
    # MLIR bridge check then refused: "Failed to bind all placeholders").
    fdef = FunctionDef()
    fdef.CopyFrom(model.functions[fn])
    # Argument shapes as protos (function_def_to_graph wants TensorShape or its proto).
    shapes = [fnedit.arg_shape(fdef, i) for i in range(len(fdef.signature.input_arg))]
    try:
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(GraphDef(library=model.meta_graph.graph_def.library), name="")
            graph = function_def_to_graph(fdef, input_shapes=shapes)
    except Exception:  # a function TF cannot import (an op this TF does not register)
        return [None] * count
    out: list[list[int] | None] = []
    for tensor in graph.outputs:
        if tensor.shape.rank is None:
            out.append(None)
        else:
            out.append([-1 if d is None else d for d in tensor.shape.as_list()])
    return out


# -- TPU programs per input shape --------------------------------------------------------
# A TPU program is compiled for static shapes: TPUPartitionedCallOp::ComputeAsync
# (tensorflow/core/tpu/kernels/tpu_functional_ops.cc) keys its cache of rewritten
# functions on GetInputHash (every input's number of elements) and the core, and a cache
# miss rewrites the function and compiles a new TPU program. Every distinct request or
# batch size therefore costs one compilation (and a slow first call) and one cached program.
PER_SHAPE = "the TPU compiles a new program for each input shape it sees"


def recompilation_warnings(model: SavedModel) -> list[str]:
    """Warnings for TPU calls whose dimension 0 can take any size at serving time.

    A call batched with empty allowed_batch_sizes gets batches of every size from 1 to
    max_batch_size (batches are padded only to an allowed size); an unbatched call with
    a dynamic dimension 0 gets every request's own size.
    """
    governing = _batch_nodes_by_function(model)
    warnings: list[str] = []
    for caller in sorted(model.functions):
        for node in model.functions[caller].node_def:
            if node.op != TPU_CALL:
                continue
            fn = model.describe(node.attr["f"].func.name)
            if caller in governing:
                batch_caller, batch = governing[caller]
                if not _allowed_sizes(batch):
                    warning = (
                        f'TPU call of {fn} batched by "{batch.name}" in {batch_caller} has empty '
                        "allowed_batch_sizes: batches of every size from 1 to max_batch_size "
                        f"({batch.attr['max_batch_size'].i}) reach it and {PER_SHAPE}; list a few "
                        "sizes in allowed_batch_sizes so that batches are padded up to one of them"
                    )
                    if warning not in warnings:
                        warnings.append(warning)
                continue
            dynamic = _dynamic_inputs(model, node, node.attr["f"].func.name)
            if dynamic:
                warnings.append(
                    f'TPU call of {fn} ("{node.name}" in {caller}) is not batched and its input '
                    f"{dynamic} has a dynamic dimension 0: every request size reaches it and "
                    f"{PER_SHAPE}; batch the call (batch_options with allowed_batch_sizes) or fix "
                    "dimension 0"
                )
    return warnings


def _batch_nodes_by_function(model: SavedModel) -> dict[str, tuple[str, NodeDef]]:
    """Function name -> (caller, BatchFunction node) whose batches run it, directly or nested."""
    found: dict[str, tuple[str, NodeDef]] = {}
    for caller in sorted(model.functions):
        for node in model.functions[caller].node_def:
            if node.op == "BatchFunction":
                body = node.attr["f"].func.name
                for name in {body} | model.reachable(body):
                    found.setdefault(name, (caller, node))
    return found


def _allowed_sizes(node: NodeDef) -> list[int]:
    # Absent once default-valued attributes are stripped (the default is the empty list).
    return list(node.attr["allowed_batch_sizes"].list.i) if "allowed_batch_sizes" in node.attr else []


def _dynamic_inputs(model: SavedModel, node: NodeDef, callee: str) -> str | None:
    """`"name" (shape [None, 4])` for the first tensor input whose dimension 0 is dynamic."""
    tin = list(node.attr["Tin"].list.type)
    positions = [i for i, t in enumerate(tin) if t not in fnedit.UNBATCHABLE]
    for spec in input_specs(model, callee, positions):
        if spec.dims and spec.dims[0] < 0:
            return f'"{spec.name}" (shape {_shape_text(spec.dims)})'
    return None
