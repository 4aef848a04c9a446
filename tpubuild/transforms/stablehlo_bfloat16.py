"""bfloat16 inside an XlaCallModule: the StableHLO computation jax2tf serialized, rewritten.

TensorFlow's own bfloat16 rewrite (transforms/bfloat16.py) sees an XlaCallModule as one
opaque op; its work happens in the module. Here every float32 tensor of the module becomes
bfloat16 (function signatures, block arguments of regions such as a reduce's body, op
results, constants rounded once), except around the ops that cannot or must not change:
those keep float32 with `stablehlo.convert`s on their way in and out, as the TF-side
rewrite keeps an op with Casts. `main`'s arguments and results change with the rest, so the
node's `Tin`/`Tout` change to match and the TF-side Casts (savedmodel/casts.py) feed it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel.xla_call_module import ModuleError, open_module, write_module

# Ops whose float32 is part of their meaning, not a precision choice.
KEEP_REASONS = {
    "stablehlo.custom_call": "a custom call: its target fixes its operand types",
    "stablehlo.bitcast_convert": "reinterprets the bits of a float32",
    "stablehlo.fft": "XLA's FFT has no bfloat16 form",
    "stablehlo.complex": "builds complex64 from float32 parts",
    "stablehlo.real": "reads float32 parts of a complex64",
    "stablehlo.imag": "reads float32 parts of a complex64",
}
FILTERLIST_REASON = "in bfloat16_optimization_options.filterlist"
# Ops that only route values (they change type with what they carry; not "converted").
ROUTING = frozenset({"func.func", "func.call", "func.return", "stablehlo.return", "builtin.module"})


@dataclass
class ModuleRewrite:
    """What happened to one XlaCallModule node's computation."""

    converted_ops: dict[str, int] = field(default_factory=dict)  # StableHLO op -> count now bfloat16
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # op -> {"count", "reason"}

    def summary(self) -> dict[str, Any]:
        return {"converted_ops": dict(sorted(self.converted_ops.items())),
                "kept_float32": dict(sorted(self.kept.items()))}


def convert_module(node: NodeDef, filtered: set[str]) -> ModuleRewrite:
    """Rewrite the node's module and its Tin/Tout in place; raises ModuleError (the node
    untouched) when the module cannot be read, converted consistently or written back."""
    from jaxlib.mlir import ir

    with open_module(node) as module:
        f32, bf16 = ir.F32Type.get(), ir.BF16Type.get()
        rewrite = ModuleRewrite()
        kept = _kept_ops(module, filtered, f32, rewrite)
        operand_types = {op: [v.type for v in op.operands] for op in kept}
        _retype(module, kept, f32, bf16, rewrite)
        _convert_around(kept, operand_types, bf16)
        _refresh_function_types(module)
        try:
            module.operation.verify()
        except Exception as exc:
            raise ModuleError(f"the bfloat16 module does not verify: {_diagnostic(exc)}") from None
        inputs, results = _main_types(module)
        tin = _retyped_list(node.attr["Tin"].list.type, inputs, bf16, "Tin")
        tout = _retyped_list(node.attr["Tout"].list.type, results, bf16, "Tout")
        if not rewrite.converted_ops:
            return rewrite  # nothing computes in bfloat16: the node stays as it was
        write_module(node, module)
    node.attr["Tin"].list.type[:] = tin
    node.attr["Tout"].list.type[:] = tout
    return rewrite


def _kept_ops(module: Any, filtered: set[str], f32: Any, rewrite: ModuleRewrite) -> list[Any]:
    """Ops touching float32 that stay float32: by kind (KEEP_REASONS) or by the filterlist
    (`stablehlo.exponential`, or the bare `exponential`)."""
    from jaxlib.mlir import ir

    kept: list[Any] = []

    def visit(op: Any) -> Any:
        name = op.name
        reason = KEEP_REASONS.get(name)
        if name in filtered or name.partition(".")[2] in filtered:
            reason = FILTERLIST_REASON
        if reason and any(_element(v.type) == f32 for v in [*op.operands, *op.results]):
            label = _label(op)
            entry = rewrite.kept.setdefault(label, {"count": 0, "reason": reason})
            entry["count"] += 1
            kept.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return kept


def _label(op: Any) -> str:
    """How the report names a kept op: a custom call by its target too."""
    if op.name == "stablehlo.custom_call" and "call_target_name" in op.attributes:
        from jaxlib.mlir import ir

        return f"stablehlo.custom_call @{ir.StringAttr(op.attributes['call_target_name']).value}"
    return op.name


def _retype(module: Any, kept: list[Any], f32: Any, bf16: Any, rewrite: ModuleRewrite) -> None:
    """Every float32 tensor outside the kept ops becomes bfloat16; constants are rounded."""
    from jaxlib.mlir import ir

    # MLIR's Python objects are new on every walk; equality and hashing follow the op.
    kept_set = set(kept)

    def visit(op: Any) -> Any:
        if op in kept_set:
            return ir.WalkResult.ADVANCE
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    _swap(arg, f32, bf16)
        changed = [r for r in op.results if _swap(r, f32, bf16)]
        if changed and op.name == "stablehlo.constant":
            op.attributes["value"] = _rounded(op.attributes["value"], changed[0].type, bf16)
        if changed and op.name not in ROUTING:
            rewrite.converted_ops[op.name] = rewrite.converted_ops.get(op.name, 0) + 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def _swap(value: Any, f32: Any, bf16: Any) -> bool:
    from jaxlib.mlir import ir

    kind = value.type
    if isinstance(kind, ir.RankedTensorType) and kind.element_type == f32:
        value.set_type(ir.RankedTensorType.get(kind.shape, bf16, kind.encoding))
        return True
    if isinstance(kind, ir.UnrankedTensorType) and kind.element_type == f32:
        value.set_type(ir.UnrankedTensorType.get(bf16))
        return True
    return False


def _rounded(attr: Any, kind: Any, bf16: Any) -> Any:
    """A float32 constant's value as bfloat16 (round to nearest even, as a Cast does)."""
    import ml_dtypes
    import numpy as np
    from jaxlib.mlir import ir

    dense = ir.DenseElementsAttr(attr)
    if dense.is_splat:
        return ir.DenseElementsAttr.get_splat(kind, ir.FloatAttr.get(bf16, ir.FloatAttr(dense.get_splat_value()).value))
    values = np.asarray(ir.DenseFPElementsAttr(attr), dtype=np.float32).astype(ml_dtypes.bfloat16)
    # The bindings take bfloat16 data as its 16-bit patterns (as jax's ir_constant does).
    return ir.DenseElementsAttr.get(values.view(np.uint16), type=bf16, shape=list(values.shape))  # type: ignore[call-overload]  # an ndarray is a Buffer


def _convert_around(kept: list[Any], operand_types: dict[Any, list[Any]], bf16: Any) -> None:
    """A kept op reads its operands in the types it had (converted back from bfloat16),
    and its float32 results reach the bfloat16 ops after it through converts. Between two
    kept ops the float32 value passes as it is (no round trip through bfloat16)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    widened: dict[Any, Any] = {}  # a convert's bfloat16 result -> the float32 value it narrowed
    for op in kept:
        for result in op.results:
            kind = result.type
            if not isinstance(kind, ir.RankedTensorType) or kind.element_type != ir.F32Type.get():
                continue
            with ir.InsertionPoint.after(op):
                narrowed = stablehlo.ConvertOp(ir.RankedTensorType.get(kind.shape, bf16, kind.encoding), result)
            result.replace_all_uses_except(narrowed.result, narrowed.operation)
            widened[narrowed.result] = result
    for op in kept:
        for index, (operand, want) in enumerate(zip(list(op.operands), operand_types[op])):
            if operand.type == want:
                continue
            if operand in widened:
                op.operands[index] = widened[operand]
                continue
            with ir.InsertionPoint(op):
                op.operands[index] = stablehlo.ConvertOp(want, operand).result


def _refresh_function_types(module: Any) -> None:
    """Each function's type from its (retyped) entry block and return values."""
    from jaxlib.mlir import ir

    for op in module.body.operations:
        if op.operation.name != "func.func" or not op.regions[0].blocks:
            continue
        entry = op.regions[0].blocks[0]
        returned = [o for o in entry.operations][-1]
        inputs = [a.type for a in entry.arguments]
        op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, [v.type for v in returned.operands]))


def _diagnostic(exc: Exception) -> str:
    """The first error of an MLIR verification failure, without its source location."""
    for line in str(exc).splitlines():
        found = re.search(r"'([\w.]+)' op (.*)", line)
        if line.lstrip().startswith("error:") and found:
            return f"{found.group(1)}: {found.group(2)}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _main_types(module: Any) -> tuple[list[Any], list[Any]]:
    """`main`'s argument and result types: the function XlaCallModule calls
    (xla_call_module_loader.cc looks it up by that name)."""
    from jaxlib.mlir import ir

    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            return list(kind.inputs), list(kind.results)
    raise ModuleError("its module has no main function")


def _retyped_list(types: Any, module_types: list[Any], bf16: Any, attr: str) -> list[int]:
    """Tin or Tout after the rewrite: the node's list lines up with the last entries of
    main's (a platform index and a token may come first), float32 where main now has
    bfloat16 becomes bfloat16."""
    types = list(types)
    offset = len(module_types) - len(types)
    if offset < 0:
        raise ModuleError(f"its main has fewer entries than the node's {attr}")
    out = []
    for index, dtype in enumerate(types):
        kind = module_types[offset + index]
        out.append(types_pb2.DT_BFLOAT16 if dtype == types_pb2.DT_FLOAT and _element(kind) == bf16 else dtype)
    return out


def _element(kind: Any) -> Any:
    from jaxlib.mlir import ir

    if isinstance(kind, (ir.RankedTensorType, ir.UnrankedTensorType)):
        return kind.element_type
    return None
