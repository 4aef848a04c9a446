"""bfloat16 rewrite on the protos: float32 ops of the scope compute in bfloat16, variables they
read are stored in bfloat16, and Casts keep every function signature's dtypes unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.python.framework import kernels, op_def_registry

from tpubuild.errors import ConversionError
from tpubuild.savedmodel import casts, xla_call_module
from tpubuild.savedmodel.casts import BF16, F32
from tpubuild.savedmodel.model import GRAPH, SavedModel, node_functions
from tpubuild.savedmodel.resources import VariableSources
from tpubuild.tpu.placement import host_side_nodes

# Ops left alone whatever their dtype: constants keep their float32 value (a Cast follows),
# Casts are what the rewrite itself adds, and calls keep their callee's signature.
NEVER = frozenset(
    {"Const", "Cast", "Placeholder", "PartitionedCall", "StatefulPartitionedCall",
     "TPUPartitionedCall", "BatchFunction", "If", "StatelessIf", "While", "StatelessWhile",
     "Case", "StatelessCase", "IdentityN", "TPUReplicatedOutput", "TPUReplicatedInput"}
)


@dataclass
class Bf16Plan:
    """What the rewrite did, for the stage summary."""

    functions: list[str] = field(default_factory=list)
    converted_ops: dict[str, int] = field(default_factory=dict)  # op type -> count
    kept_filterlist: dict[str, int] = field(default_factory=dict)
    kept_no_kernel: dict[str, int] = field(default_factory=dict)
    variables: dict[int, str] = field(default_factory=dict)  # object-graph id -> checkpoint name
    casts: int = 0
    # One entry per XlaCallModule in scope: where it is and what its StableHLO became.
    xla_call_modules: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "functions": sorted(self.functions),
            "converted_ops": dict(sorted(self.converted_ops.items())),
            "kept_float32": {
                "filterlist": dict(sorted(self.kept_filterlist.items())),
                "no_bfloat16_cpu_kernel": dict(sorted(self.kept_no_kernel.items())),
            },
            "xla_call_modules": self.xla_call_modules,
            "variables": sorted(self.variables.values()),
            "casts": self.casts,
        }


def saver_functions(model: SavedModel) -> set[str]:
    """The checkpoint save/restore functions the graph's saver_def runs (never in scope)."""
    saver = model.meta_graph.saver_def
    names = {saver.save_tensor_name.split(":")[0], saver.restore_op_name.split(":")[0]}
    roots = set()
    for node in model.meta_graph.graph_def.node:
        if node.name in names:
            roots |= node_functions(node)
    return roots.union(*(model.reachable(r) for r in roots)) if roots else set()


def check_no_bfloat16(model: SavedModel, scope: Iterable[str]) -> None:
    """The converter's safety check: refuse a scope that already computes in bfloat16."""
    for fn in sorted(scope):
        fdef = model.functions[fn]
        for arg in fdef.signature.input_arg:
            if arg.type == BF16:
                raise ConversionError(_refusal(model, fn, f'argument "{arg.name}"'))
        for node in fdef.node_def:
            if any(_has_bf16(v) for v in node.attr.values()):
                raise ConversionError(_refusal(model, fn, f'op "{node.name}" ({node.op})'))


def _refusal(model: SavedModel, fn: str, what: str) -> str:
    return (
        f"bfloat16: function {model.describe(fn)}: {what} already uses bfloat16; the model is "
        "refused (set bfloat16_optimization_options.skip_safety_checks to convert it anyway)"
    )


def _has_bf16(value: Any) -> bool:
    kind = value.WhichOneof("value")
    return (kind == "type" and value.type == BF16) or (kind == "list" and BF16 in value.list.type)


@lru_cache(maxsize=None)
def has_cpu_kernel(op: str, attrs: tuple[tuple[str, int], ...]) -> bool:
    """Whether TF has an unlabelled CPU kernel for `op` with these type attr values."""
    wanted = dict(attrs)
    for kernel in kernels.get_registered_kernels_for_op(op).kernel:
        if kernel.device_type != "CPU" or kernel.label:
            continue
        if all(
            c.name not in wanted or wanted[c.name] in c.allowed_values.list.type
            for c in kernel.constraint
        ):
            return True
    return False


def _float_type_attrs(node: NodeDef) -> list[str] | None:
    """The node's float32 `type` attrs, or None when it is not an op we may convert."""
    op_def = op_def_registry.get(node.op)
    if op_def is None or op_def.is_stateful or node.op in NEVER:
        return None
    names = [a.name for a in op_def.attr if a.type == "type" and a.name in node.attr]
    floats = [n for n in names if node.attr[n].type == F32]
    return floats or None


def convert(model: SavedModel, scope: set[str], filterlist: Iterable[str]) -> Bf16Plan:
    """Rewrite `model` in place; `scope` are the functions whose ops go to bfloat16."""
    plan = Bf16Plan(functions=sorted(scope))
    filtered = set(filterlist)
    sources = VariableSources(model)
    plan.variables = _variables_to_convert(model, sources, scope)
    for fn in sorted(scope):
        # A TPU body's untagged nodes (its outputs' host side, after TPUReplicatedOutput)
        # stay float32: a Cast there would be a tagged node feeding the return value,
        # which the TPU runtime refuses (tpu.py).
        host_side = host_side_nodes(model.functions[fn])
        for node in model.functions[fn].node_def:
            if node.name in host_side:
                continue
            if node.op == xla_call_module.OP:
                _convert_xla_call_module(model, fn, node, filtered, plan)
            else:
                _convert_node(node, filtered, plan)
    converted = set(plan.variables)
    touched = set(scope)
    for fn, fdef in model.functions.items():
        nodes = sources.nodes(fn)
        for node in fdef.node_def:
            ref = _resource_input(node)
            if ref is not None and _reads_converted(node, sources.ids(fn, ref, nodes), converted):
                node.attr["dtype"].type = BF16
                touched.add(fn)
    touched |= _retype_saver(model, plan)
    for fn in sorted(touched):
        plan.casts += casts.fix_edges(model.functions[fn], model.functions)
    _retype_graph(model, sources, converted)
    for node_id in converted:
        model.meta_graph.object_graph_def.nodes[node_id].variable.dtype = BF16
    model.invalidate()
    return plan


def _convert_node(node: NodeDef, filtered: set[str], plan: Bf16Plan) -> None:
    attrs = _float_type_attrs(node)
    if attrs is None:
        return
    if node.op in filtered:
        plan.kept_filterlist[node.op] = plan.kept_filterlist.get(node.op, 0) + 1
        return
    after = {n: node.attr[n].type for n in node.attr if node.attr[n].WhichOneof("value") == "type"}
    after.update({n: BF16 for n in attrs})
    if not has_cpu_kernel(node.op, tuple(sorted(after.items()))):
        # The CPU twin executes this op, so it stays float32 with casts around it.
        plan.kept_no_kernel[node.op] = plan.kept_no_kernel.get(node.op, 0) + 1
        return
    for name in attrs:
        node.attr[name].type = BF16
    plan.converted_ops[node.op] = plan.converted_ops.get(node.op, 0) + 1


def _convert_xla_call_module(model: SavedModel, fn: str, node: NodeDef, filtered: set[str], plan: Bf16Plan) -> None:
    """A jax2tf computation computes in bfloat16 when its StableHLO does
    (transforms/stablehlo_bfloat16.py); what stays float32 is recorded, and a part that
    could not be converted is one warning naming the op."""
    from tpubuild.transforms.stablehlo_bfloat16 import FILTERLIST_REASON, convert_module

    where = f"XlaCallModule node {node.name!r} in function {model.describe(fn)}"
    entry: dict[str, Any] = {"function": model.alias_of(fn) or fn, "node": node.name}
    plan.xla_call_modules.append(entry)
    if node.op in filtered:
        plan.kept_filterlist[node.op] = plan.kept_filterlist.get(node.op, 0) + 1
        entry.update(converted_ops={}, kept_float32={"module": {"count": 1, "reason": FILTERLIST_REASON}})
        return
    try:
        rewrite = convert_module(node, filtered)
    except xla_call_module.ModuleError as exc:
        entry.update(converted_ops={}, kept_float32={"module": {"count": 1, "reason": str(exc)}})
        plan.warnings.append(f"bfloat16: {where} stays float32: {exc}")
        return
    entry.update(rewrite.summary())
    if rewrite.converted_ops:
        plan.converted_ops[node.op] = plan.converted_ops.get(node.op, 0) + 1
    cannot = {op: kept for op, kept in rewrite.kept.items() if kept["reason"] != FILTERLIST_REASON}
    if cannot:
        parts = "; ".join(f"{op} x{kept['count']} ({kept['reason']})" for op, kept in sorted(cannot.items()))
        plan.warnings.append(f"bfloat16: {where}: stays float32 inside: {parts}")


def _resource_input(node: NodeDef) -> str | None:
    """The data input feeding the op's first resource argument, if it has one."""
    op_def = op_def_registry.get(node.op)
    if op_def is None or "dtype" not in node.attr:
        return None
    data = [ref for ref in node.input if not ref.startswith("^")]
    for position, arg in enumerate(op_def.input_arg):
        if arg.type == types_pb2.DT_RESOURCE and position < len(data):
            return data[position]
    return None


def _reads_converted(node: NodeDef, ids: set[int], converted: set[int]) -> bool:
    return bool(ids) and ids <= converted and node.attr["dtype"].type == F32


def _variables_to_convert(model: SavedModel, sources: VariableSources, scope: set[str]) -> dict[int, str]:
    """float32 variables read by a function of the scope, with their checkpoint keys' names."""
    objects = model.meta_graph.object_graph_def.nodes
    found: dict[int, str] = {}
    for fn in scope:
        nodes = sources.nodes(fn)
        for node in model.functions[fn].node_def:
            ref = _resource_input(node)
            if ref is None or node.attr["dtype"].type != F32:
                continue
            for node_id in sources.ids(fn, ref, nodes):
                saved = objects[node_id]
                if saved.WhichOneof("kind") == "variable" and saved.variable.dtype == F32:
                    found[node_id] = saved.variable.name or str(node_id)
    return found


def _retype_saver(model: SavedModel, plan: Bf16Plan) -> set[str]:
    """SaveV2/RestoreV2 in the saver functions move the converted variables as bfloat16."""
    from tpubuild.savedmodel.checkpoint import checkpoint_keys

    keys = checkpoint_keys(model, set(plan.variables))
    touched = set()
    for fn in saver_functions(model):
        fdef = model.functions[fn]
        consts = {n.name: n for n in fdef.node_def if n.op == "Const"}
        for node in fdef.node_def:
            if node.op not in ("SaveV2", "RestoreV2"):
                continue
            names_node = consts.get(node.input[1].split(":")[0])
            if names_node is None:
                continue
            names = [s.decode() for s in names_node.attr["value"].tensor.string_val]
            for index, name in enumerate(names):
                if name in keys:
                    node.attr["dtypes"].list.type[index] = BF16
                    touched.add(fn)
    return touched


def _retype_graph(model: SavedModel, sources: VariableSources, converted: set[int]) -> None:
    """The graph-level VarHandleOp / ReadVariableOp nodes of converted variables (TF1 loaders)."""
    for node in model.meta_graph.graph_def.node:
        if node.op == "VarHandleOp":
            ids = sources.known.get((GRAPH, node.name), set())
        elif node.op == "ReadVariableOp" and node.input:
            ids = sources.known.get((GRAPH, node.input[0].split(":")[0]), set())
        else:
            continue
        if ids and ids <= converted and node.attr["dtype"].type == F32:
            node.attr["dtype"].type = BF16
