"""TPU-compatibility checks the official converter does not make, run before placement.

A CPU machine has no libtpu, so XLA on CPU stands in for the TPU compiler: the boundary
dtypes, the ops' XLA kernels and a real XLA lowering (to HLO only, which is cheap).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.functions import TpuFunction

UNSUPPORTED_DTYPES = {
    types_pb2.DT_STRING,
    types_pb2.DT_VARIANT,
    types_pb2.DT_DOUBLE,
    types_pb2.DT_COMPLEX64,
    types_pb2.DT_COMPLEX128,
}
XLA_DEVICE = "XLA_CPU_JIT"
SPARSE_SPEC = 1  # TypeSpecProto.SPARSE_TENSOR_SPEC
TENSOR_SPEC = -1  # our marker for a plain tensor_spec_value in a StructuredValue


class _Tensor:
    type_spec_class = TENSOR_SPEC


_TENSOR = _Tensor()


def check_tpu_functions(model: SavedModel, functions: list[TpuFunction], xla: bool = True) -> list[str]:
    """Raise ConversionError for the first TPU-incompatibility found; return warnings."""
    warnings: list[str] = []
    for fn in functions:
        who = f"tpu function {model.describe(fn.name)}"
        check_boundary(model, fn.name, who)
        check_sparse_inputs(model, fn.name, who)
        if fn.soft_placement:
            warnings.append(check_soft_placement(model, fn.name, who))
        else:
            check_xla_kernels(model, fn.name, who)
    if xla:
        # With soft placement XLA never sees the host ops, so lowering the whole function
        # here would fail on them: TensorFlow's bridge (run by the runtime check after
        # placement) is the judge of what stays on the TPU.
        for fn in (f for f in functions if not f.soft_placement):
            warning = check_xla_compiles(model, fn.name, f"tpu function {model.describe(fn.name)}")
            if warning:
                warnings.append(warning)
    return warnings


def check_boundary(model: SavedModel, name: str, who: str) -> None:
    """Inputs and outputs of a TPU function must have dtypes TPUs support."""
    signature = model.functions[name].signature
    for kind, args in (("input", signature.input_arg), ("output", signature.output_arg)):
        for arg in args:
            if arg.type in UNSUPPORTED_DTYPES:
                raise ConversionError(
                    f"{who}: {kind} '{arg.name}' has dtype {tf.dtypes.as_dtype(arg.type).name}, "
                    "which TPUs do not support"
                )


def check_sparse_inputs(model: SavedModel, name: str, who: str) -> None:
    """A SparseTensor input (three tensors with different 0th dimensions) cannot cross to the TPU."""
    saved = model.meta_graph.object_graph_def.concrete_functions.get(name)
    if saved is None:
        return
    fdef = model.functions[name]
    offset = 0  # position of the spec's first tensor among the function's flat inputs
    for spec in _type_specs(saved.canonicalized_input_signature):
        if spec.type_spec_class == SPARSE_SPEC:
            user_name = fdef.arg_attr[offset].attr["_user_specified_name"].s.decode()
            arg = user_name or fdef.signature.input_arg[offset].name
            raise ConversionError(f"{who}: input '{arg}' is a SparseTensor, which TPUs do not support")
        if spec.type_spec_class != TENSOR_SPEC:
            return  # other composites flatten in ways we do not track; XLA will judge them
        offset += 1


def _type_specs(value: Any) -> list[Any]:
    """TypeSpecProtos of a StructuredValue in flattening order (dict keys sorted, as nest does)."""
    kind = value.WhichOneof("kind")
    if kind == "type_spec_value":
        return [value.type_spec_value]
    if kind == "tensor_spec_value":
        return [_TENSOR]
    items: list[Any] = []
    if kind in ("list_value", "tuple_value"):
        items = list(getattr(value, kind).values)
    elif kind == "dict_value":
        items = [value.dict_value.fields[k] for k in sorted(value.dict_value.fields)]
    elif kind == "named_tuple_value":
        items = [pair.value for pair in value.named_tuple_value.values]
    return [spec for item in items for spec in _type_specs(item)]


def check_xla_kernels(model: SavedModel, name: str, who: str) -> None:
    """Every op in the function and its callees must have an XLA kernel; names them all at once."""
    gaps = xla_kernel_gaps(model, name)
    if len(gaps) == 1:
        raise ConversionError(f"{who}: {gaps[0]} has no XLA kernel and cannot run on the TPU")
    if gaps:
        raise ConversionError(
            f"{who}: {len(gaps)} ops: {', '.join(gaps)}; each has no XLA kernel and cannot run on the TPU"
        )


def check_soft_placement(model: SavedModel, name: str, who: str) -> str:
    """Soft device placement: the function's own ops the TPU cannot run go to the host
    (tpu/placement.py allow_soft_placement); one line saying which. Ops of the functions
    it calls are not moved (TensorFlow's bridge marks ops of the cluster's own body), so a
    gap there is still refused."""
    # xla_kernel_gaps names a callee's node "(node N in F)", the function's own "(node N)".
    deeper = [gap for gap in xla_kernel_gaps(model, name) if " in " in gap.rsplit("(node ", 1)[-1]]
    if deeper:
        raise ConversionError(
            f"{who}: {', '.join(deeper)}: no XLA kernel, in a function it calls; soft device placement "
            "moves only the TPU function's own ops to the host"
        )
    host = host_ops(model, name)
    if not host:
        return f"{who}: soft device placement: every op runs on the TPU"
    listed = ", ".join(f"{node} ({op})" for node, op in host)
    return f"{who}: soft device placement: {len(host)} op(s) run on the host instead of the TPU: {listed}"


def host_ops(model: SavedModel, name: str) -> list[tuple[str, str]]:
    """(node, op) of each node of the function itself that the TPU cannot run, in node
    order: as TensorFlow's outside-compilation marking decides (mark_ops_for_outside_compilation.cc
    IsSupportedOp), an op with a string input or output or without an XLA kernel."""
    from tensorflow.python.framework import op_def_registry

    register_xla_kernels()
    found = []
    for node in model.functions[name].node_def:
        if node.op in model.functions or node.op in PLUMBING_OPS:
            continue
        if not _has_xla_kernel(node.op) or _has_string(node, op_def_registry.get(node.op)):
            found.append((node.name, node.op))
    return found


def _has_string(node: Any, op_def: Any) -> bool:
    """Whether any input or output of the node is a string tensor (its type attrs, or fixed types)."""
    if op_def is None:
        return False
    for arg in [*op_def.input_arg, *op_def.output_arg]:
        if arg.type == types_pb2.DT_STRING:
            return True
        for attr in (arg.type_attr, arg.type_list_attr):
            value = node.attr[attr] if attr and attr in node.attr else None
            if value is not None and (value.type == types_pb2.DT_STRING or types_pb2.DT_STRING in value.list.type):
                return True
    return False


# TPU plumbing that the TPU runtime removes before XLA sees the computation.
PLUMBING_OPS = frozenset({"TPUReplicateMetadata", "TPUReplicatedOutput", "TPUReplicatedInput"})


def xla_kernel_gaps(model: SavedModel, name: str) -> list[str]:
    """"op 'X' (node n[ in f])" for each node of `name` and its callees without an XLA kernel."""
    register_xla_kernels()
    gaps = []
    for fn in [name, *sorted(model.reachable(name))]:
        for node in model.functions[fn].node_def:
            if node.op in model.functions or node.op in PLUMBING_OPS or _has_xla_kernel(node.op):
                continue
            where = f"node {node.name}" + ("" if fn == name else f" in {fn}")
            gaps.append(f"op '{node.op}' ({where})")
    return gaps


_KERNELS: dict[str, bool] = {}
_REGISTERED = False


def register_xla_kernels() -> None:
    """XLA registers its JIT kernels on first use; compile a trivial function once to list them."""
    global _REGISTERED
    if not _REGISTERED:
        trivial = tf.function(lambda x: x + 1.0, jit_compile=True, autograph=False)
        trivial.experimental_get_compiler_ir(tf.TensorSpec([1], tf.float32))(stage="hlo")
        _REGISTERED = True


def _has_xla_kernel(op: str) -> bool:
    if op not in _KERNELS:
        from tensorflow.python.framework import kernels

        devices = {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}
        _KERNELS[op] = XLA_DEVICE in devices
    return _KERNELS[op]


def check_xla_compiles(model: SavedModel, name: str, who: str) -> str | None:
    """Lower the function to HLO with XLA on CPU; returns a warning when it cannot be tried."""
    from tensorflow.python.ops import gen_functional_ops

    concrete = _library(model, name)[name]
    args, variables = [], []
    resources = _resource_specs(model, name)
    for index, tensor in enumerate(concrete.inputs):
        if tensor.dtype == tf.resource:
            if index not in resources:
                return f"{who}: input '{_arg_name(model, name, index)}' is a resource that is not a variable; XLA check skipped"
            dtype, shape = resources[index]
            variables.append(_placeholder_variable(shape, dtype))
        elif tensor.shape.rank is None:
            return f"{who}: input '{_arg_name(model, name, index)}' has unknown rank; XLA check skipped"
        else:
            # Specs, not values: values would be folded in as constants and hide errors.
            # Unknown dimensions become 1: the TPU compiles one program per shape anyway.
            args.append(tf.TensorSpec([d if d is not None else 1 for d in tensor.shape], tensor.dtype))
    tout = [t.dtype for t in concrete.outputs]

    def call(*inputs: tf.Tensor) -> Any:
        # Variables are captured, not passed: XLA takes captured resources as parameters.
        handles = [v.handle for v in variables]
        return gen_functional_ops.stateful_partitioned_call(args=[*inputs, *handles], Tout=tout, f=concrete)

    compiled = tf.function(call, jit_compile=True, autograph=False)
    try:
        compiled.experimental_get_compiler_ir(*args)(stage="hlo")
    except (tf.errors.OpError, ValueError, TypeError) as exc:
        message = getattr(exc, "message", str(exc)).strip()
        message = message.removeprefix("Failed getting HLO text: '").splitlines()[0]
        # Node names are those inside the function, not the wrapper's call path.
        message = message.replace("StatefulPartitionedCall/", "")
        raise ConversionError(f"{who}: XLA cannot compile it: {message}") from None
    return None


def _placeholder_variable(shape: list[int], dtype: tf.DType) -> tf.Variable:
    """A variable of the weight's shape and dtype for the HLO lowering, which reads only
    its shape and dtype (tensorflow/compiler/jit/get_compiler_ir.cc builds the XLA
    arguments from the variables' shapes; nothing runs). Its buffer is left uninitialized
    (tf.raw_ops.Empty, init=False), so the kernel never touches its pages: a 2 GiB weight
    costs address space, not memory or time, where tf.zeros wrote every byte (the tpu stage
    held a zeroed copy of the whole model: 31.6 s on an 8 GiB one). AssignVariableOp adopts
    the buffer rather than copying it (tensorflow/core/kernels/resource_variable_ops.cc:
    forward_input when the value has no other user). Strings and other non-numeric types
    keep tf.zeros: Empty constructs their elements anyway."""
    if dtype.is_numeric or dtype.is_bool:
        return tf.Variable(tf.raw_ops.Empty(shape=shape, dtype=dtype, init=False))
    return tf.Variable(tf.zeros(shape, dtype))


def _library(model: SavedModel, name: str) -> dict[str, Any]:
    """Function `name` and every function it depends on, as ConcreteFunctions (built once
    per model object and function). Only its closure is deserialized, not the whole
    library: a SavedModel's library also holds its signatures' functions and the object
    graph's save and restore functions, which no TPU function calls (BERT-base: 2,006 of
    its 5,500 function nodes are the TPU function's; 0.97 s for the whole library). Its
    large constants are splats (tpu/splat.py): only the XLA check uses it, which reads none."""
    cache = model.__dict__.setdefault("_concrete_library", {})
    if name not in cache:
        from tensorflow.python.saved_model import function_deserialization

        from tpubuild.tpu.splat import splat_large_constants

        # A copy of the closure: the loader renames functions in the library it is given.
        full = model.meta_graph.graph_def.library
        library = type(full)()
        keep = _closure(model, name)
        # Each with its large constants as splats: the lowering reads no weight (tpu/splat.py).
        library.function.extend(splat_large_constants(f) for f in full.function if f.signature.name in keep)
        library.gradient.extend(g for g in full.gradient if g.function_name in keep)
        library.registered_gradients.extend(g for g in full.registered_gradients if g.gradient_func in keep)
        cache[name] = function_deserialization.load_function_def_library(library, model.meta_graph.object_graph_def)
    return cache[name]


def _closure(model: SavedModel, name: str) -> set[str]:
    """`name`, the functions it reaches through any func-valued attribute or calls by
    name as an op, and the gradient functions its nodes name by `_gradient_op_type`: what TF's loader resolves
    each function's dependencies to (tensorflow/python/saved_model/
    function_deserialization.py _list_function_deps), so the pruned library loads alone."""
    gradients = {g.registered_op_type.encode(): g.gradient_func
                 for g in model.meta_graph.graph_def.library.registered_gradients if g.registered_op_type}
    keep: set[str] = set()
    stack = [name]
    while stack:
        fn = stack.pop()
        if fn in keep or fn not in model.functions:
            continue
        keep.add(fn)
        stack.extend(model.callees(fn))
        for node in model.functions[fn].node_def:
            if node.op in model.functions:  # a function called by its name as the op
                stack.append(node.op)
            op_type = node.attr["_gradient_op_type"].s if "_gradient_op_type" in node.attr else b""
            if op_type in gradients:
                stack.append(gradients[op_type])
    return keep


def _arg_name(model: SavedModel, name: str, index: int) -> str:
    return model.functions[name].signature.input_arg[index].name


def _resource_specs(model: SavedModel, name: str, depth: int = 0) -> dict[int, tuple[tf.DType, list[int]]]:
    """Resource arg index -> (dtype, shape) of the variable it is bound to, found through callers."""
    fdef = model.functions[name]
    inputs = fdef.signature.input_arg
    found: dict[int, tuple[tf.DType, list[int]]] = {}
    saved = model.meta_graph.object_graph_def.concrete_functions.get(name)
    nodes = model.meta_graph.object_graph_def.nodes
    if saved is not None and saved.bound_inputs:
        first = len(inputs) - len(saved.bound_inputs)
        for offset, node_id in enumerate(saved.bound_inputs):
            node = nodes[node_id]
            if node.WhichOneof("kind") == "variable":
                shape = [d.size for d in node.variable.shape.dim]
                found[first + offset] = (tf.dtypes.as_dtype(node.variable.dtype), shape)
    missing = [i for i, arg in enumerate(inputs) if arg.type == types_pb2.DT_RESOURCE and i not in found]
    if not missing or depth > 20:
        return found
    # An inner function: its resource args come from its caller's args.
    for caller, node in model.call_sites(name):
        caller_args = [a.name for a in model.functions[caller].signature.input_arg]
        data = [i for i in node.input if not i.startswith("^")]
        outer = None
        for index in missing:
            if index < len(data) and data[index] in caller_args:
                outer = outer if outer is not None else _resource_specs(model, caller, depth + 1)
                position = caller_args.index(data[index])
                if position in outer:
                    found[index] = outer[position]
        if all(i in found for i in missing):
            break
    return found
