"""Large constants as splats, for the checks that read a TPU body's structure, not its values.

A model exported with its weights frozen into the graph holds them as Const nodes: a TPU
body of 576 MiB of such weights took the tpu stage's worker to 8.5 GiB and the batch
stage's to 11 GiB and over 8 minutes, for checks that never read a weight. TF's MLIR
clustering bridge (tpu/mlir_bridge.py) prints its module as text, every constant in hex,
and decides from ops, attributes, dtypes and shapes (clusters, outside compilation, its
input checks); the XLA lowering to unoptimized HLO (tpu/compatibility.py
check_xla_compiles) converts each constant to a literal and runs no pass that reads it.
A constant is "large" above SPLAT_MIN_BYTES (16,384 float32 elements): what an op needs as
a compile-time constant (a shape, a size, an axis) is a few elements, never that, so each
check's verdict is the same on the splat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorflow.core.framework.function_pb2 import FunctionDef

# A constant of more bytes than this is checked as a splat (splat_large_constants).
SPLAT_MIN_BYTES = 64 * 1024
# dtype -> (the TensorProto field, the splat's value: neither 0 nor 1, which canonicalization
# folds as identities of Add and Mul; half and bfloat16 as their bits, 0.5).
_SPLATS = {1: ("float_val", 0.5), 2: ("double_val", 0.5), 3: ("int_val", 3), 9: ("int64_val", 3),
           19: ("half_val", 0x3800), 14: ("half_val", 0x3F00)}


def splat_large_constants(fdef: FunctionDef) -> FunctionDef:
    """A copy of `fdef` with each large numeric constant's value a splat of its dtype and
    shape (a TensorProto with one value repeats it over its shape: tensorflow/core/framework/
    tensor.cc FromProtoField, the last value fills the rest). Built field by field, so a
    large value is never copied: a copy cleared afterwards would keep its bytes in the
    protobuf arena of the message it belongs to."""
    from tensorflow.core.framework.function_pb2 import FunctionDef

    copy = FunctionDef()
    _copy_fields(fdef, copy, skip="node_def")
    for node in fdef.node_def:
        splat = _splat_of(node)
        if splat is None:
            copy.node_def.add().CopyFrom(node)
            continue
        into = copy.node_def.add()
        _copy_fields(node, into, skip="attr")
        for key in node.attr:
            if key != "value":
                into.attr[key].CopyFrom(node.attr[key])
        tensor, (field, value) = node.attr["value"].tensor, splat
        made = into.attr["value"].tensor
        made.dtype = tensor.dtype
        made.tensor_shape.CopyFrom(tensor.tensor_shape)
        getattr(made, field).append(value)
    return copy


def _splat_of(node) -> tuple[str, float | int] | None:  # type: ignore[no-untyped-def]
    """(field, value) of the splat for a large numeric Const node, else None."""
    if node.op != "Const" or "value" not in node.attr:
        return None
    tensor = node.attr["value"].tensor
    splat = _SPLATS.get(tensor.dtype)
    return splat if splat is not None and len(tensor.tensor_content) > SPLAT_MIN_BYTES else None


def _copy_fields(source, target, skip: str) -> None:  # type: ignore[no-untyped-def]
    """Every set field of protobuf message `source` but `skip`, into the empty `target`."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        into = getattr(target, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in value:
                if field.message_type.fields_by_name["value"].message_type is not None:
                    into[key].CopyFrom(value[key])
                else:
                    into[key] = value[key]
        elif field.is_repeated:
            into.extend(value)
        elif field.message_type is not None:
            into.CopyFrom(value)
        else:
            setattr(target, field.name, value)
