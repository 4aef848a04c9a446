"""The TPU runtime's rules for the functions a TPUPartitionedCall runs, checked on the protos.

A CPU machine cannot run `TPUPartitionedCallOp`, so its rules are applied here, from its
source (tensorflow/tensorflow):
- tensorflow/core/tpu/graph_rewrite/encapsulate_tpu_computations_pass.cc,
  `EncapsulateTPUComputationsPass::Encapsulate`: no data edge from a `_tpu_replicate`-tagged
  node to an untagged node other than `TPUReplicatedOutput` ("Undeclared output of TPU
  computation"); the function's return values are untagged `_Retval` nodes.
  `RewriteSubgraph`: "Missing TPUReplicateMetadata node"; it reads one metadata node.
- tensorflow/core/tpu/kernels/tpu_functional_ops.cc, `GetClusterName`: "Only one cluster is
  allowed ... for TPUPartitionedCall"; `ReplaceResourceArgsWithVarHandleOps`: each resource
  argument a tagged node consumes is looked up as a variable (`LookupResource<Var>`), so
  any other resource (a lookup table) fails the call.
- tensorflow/core/tpu/tpu_defs.h, `kTpuAllTypes`: the types the TPU XLA backend registers
  kernels for (REGISTER_XLA_BACKEND(DEVICE_TPU_XLA_JIT, kTpuAllTypes, ...)). An op's TPU
  kernel accepts its XLA kernel's type constraint intersected with these; resource and
  variant handles pass where the XLA kernel allows them (AllowResourceTypes).
- tensorflow/compiler/tf2xla/kernels/xla_call_module_loader.cc,
  `XlaCallModuleLoader::SetPlatformIndex`: an XlaCallModule (jax2tf) compiled for a platform
  not in its `platforms` attr fails ("The current platform TPU is not among the platforms
  required by the module") unless its `disabled_checks` hold "platform".

Pure: `check_tpu_runtime_rules` reads a model and returns findings; nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensorflow.core.framework import types_pb2
from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.findings import ERROR, WARNING, Finding, tpu_bodies
from tpubuild.tpu.placement import METADATA, OUTSIDE_COMPILATION_ATTR, REPLICATE_ATTR, REPLICATED_OUTPUT, TPU_CALL

T = types_pb2
# kTpuAllTypes, tensorflow/core/tpu/tpu_defs.h
TPU_ALL_TYPES = frozenset({
    T.DT_INT32, T.DT_UINT32, T.DT_FLOAT8_E4M3FN, T.DT_FLOAT8_E5M2, T.DT_HALF, T.DT_BFLOAT16,
    T.DT_FLOAT, T.DT_DOUBLE, T.DT_BOOL, T.DT_COMPLEX64, T.DT_INT64, T.DT_UINT64, T.DT_QINT8,
    T.DT_QUINT8, T.DT_QINT32, T.DT_INT8, T.DT_UINT8, T.DT_INT16, T.DT_UINT16, T.DT_INT4,
    T.DT_UINT4, T.DT_FLOAT8_E4M3FNUZ, T.DT_FLOAT8_E4M3B11FNUZ, T.DT_FLOAT8_E5M2FNUZ,
})
HANDLE_TYPES = frozenset({T.DT_RESOURCE, T.DT_VARIANT})
XLA_DEVICE = "XLA_CPU_JIT"  # the XLA kernels registered in this TensorFlow build


def check_tpu_runtime_rules(
    source: str | Path | SavedModel | MetaGraphDef, tags: list[str] | None = None
) -> list[Finding]:
    """Every finding for every function a TPUPartitionedCall calls, in function order."""
    model = as_model(source, tags)
    findings: list[Finding] = []
    for fn in tpu_bodies(model):
        findings += structure_findings(model.functions[fn])
        findings += dtype_findings(model, fn)
        findings += resource_argument_findings(model, fn)
        findings += platform_findings(model, fn)
    return findings


def as_model(source: str | Path | SavedModel | MetaGraphDef, tags: list[str] | None = None) -> SavedModel:
    if isinstance(source, SavedModel):
        return source
    if isinstance(source, MetaGraphDef):
        from tensorflow.core.protobuf import saved_model_pb2

        return SavedModel(Path("."), saved_model_pb2.SavedModel(meta_graphs=[source]), source)
    return SavedModel.load(Path(source), tags)


def _source(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def structure_findings(fdef: FunctionDef) -> list[Finding]:
    """Encapsulate's edge rule, GetClusterName's one-cluster rule, exactly one metadata node."""
    fn = fdef.signature.name
    tagged = {n.name for n in fdef.node_def if REPLICATE_ATTR in n.attr}
    findings = []
    # In node order, like GetClusterName: the first tagged node names the cluster, the first
    # node with another name is the offender.
    clusters: dict[str, str] = {}
    for node in fdef.node_def:
        if node.name in tagged:
            clusters.setdefault(node.attr[REPLICATE_ATTR].s.decode(), node.name)
    if len(clusters) > 1:
        findings.append(Finding(
            ERROR, "one-cluster", fn, list(clusters.values())[1],
            f"{len(clusters)} _tpu_replicate clusters ({', '.join(clusters)}); TPUPartitionedCall "
            "allows one (GetClusterName)",
        ))
    metadata = [n.name for n in fdef.node_def if n.op == METADATA]
    if not metadata:
        findings.append(Finding(ERROR, "metadata", fn, None, "no TPUReplicateMetadata node; the TPU runtime "
                                "refuses the function (\"Missing TPUReplicateMetadata node\")"))
    elif len(metadata) > 1:
        findings.append(Finding(ERROR, "metadata", fn, metadata[1],
                                f"{len(metadata)} TPUReplicateMetadata nodes ({', '.join(metadata)}); one is needed"))
    # Outside-compilation nodes run on the host; Encapsulate lets their outputs leave.
    sources = {n.name for n in fdef.node_def if n.name in tagged and OUTSIDE_COMPILATION_ATTR not in n.attr}
    for node in fdef.node_def:
        if node.name in tagged or node.op == REPLICATED_OUTPUT:
            continue
        for ref in node.input:
            if not ref.startswith("^") and _source(ref) in sources:
                findings.append(_undeclared(fn, _source(ref), f"node {node.name} ({node.op}), which is not in the cluster"))
    for key, ref in sorted(fdef.ret.items()):
        if _source(ref) in sources:
            findings.append(_undeclared(fn, _source(ref), f"return value {key} without TPUReplicatedOutput"))
    for node in fdef.node_def:
        if node.op == TPU_CALL and node.name in tagged:
            findings.append(Finding(
                ERROR, "nested-tpu-call", fn, node.name,
                f"TPUPartitionedCall of {node.attr['f'].func.name} inside the TPU computation; it has "
                "no XLA kernel (call the function directly)",
            ))
    return findings


def _undeclared(fn: str, node: str, consumer: str) -> Finding:
    return Finding(ERROR, "undeclared-output", fn, node,
                   f"feeds {consumer}: \"Undeclared output of TPU computation\" on a TPU host")


def dtype_findings(model: SavedModel, fn: str) -> list[Finding]:
    """Every node of the computation and of its callees against the TPU backend's types."""
    fdef = model.functions[fn]
    # Outside-compilation nodes run on the host (soft device placement): not the TPU's types.
    computation = [n for n in fdef.node_def if REPLICATE_ATTR in n.attr and OUTSIDE_COMPILATION_ATTR not in n.attr]
    findings = _node_type_findings(model, fn, "", computation)
    for callee in sorted(model.reachable(fn)):
        if callee in model.functions:
            findings += _node_type_findings(model, fn, f"{callee}/", list(model.functions[callee].node_def))
    return findings


def _node_type_findings(model: SavedModel, fn: str, prefix: str, nodes: list[NodeDef]) -> list[Finding]:
    from tensorflow.python.framework import op_def_registry

    findings = []
    for node in nodes:
        if node.op in model.functions or node.op in (METADATA, TPU_CALL):
            continue
        op_def = op_def_registry.get(node.op)
        constraints = xla_type_constraints(node.op)
        where = prefix + node.name
        if op_def is None or constraints is None:
            findings.append(Finding(ERROR, "xla-kernel", fn, where, f"op {node.op} has no XLA kernel; it cannot run on the TPU"))
            continue
        for attr in op_def.attr:
            if attr.type not in ("type", "list(type)"):
                continue
            value = node.attr[attr.name] if attr.name in node.attr else attr.default_value
            dtypes = [value.type] if attr.type == "type" else list(value.list.type)
            for dtype in dtypes:
                finding = _dtype_finding(fn, where, node.op, attr.name, dtype, constraints.get(attr.name))
                if finding is not None:
                    findings.append(finding)
    return findings


def platform_findings(model: SavedModel, fn: str) -> list[Finding]:
    """Each XlaCallModule of the computation (or its callees) lowered without TPU among its platforms."""
    from tpubuild.savedmodel.xla_call_module import OP

    fdef = model.functions[fn]
    holders = [("", [n for n in fdef.node_def if REPLICATE_ATTR in n.attr])]
    holders += [(f"{c}/", list(model.functions[c].node_def)) for c in sorted(model.reachable(fn)) if c in model.functions]
    findings = []
    for prefix, nodes in holders:
        for node in nodes:
            if node.op != OP:
                continue
            platforms = [p.decode() for p in node.attr["platforms"].list.s]
            disabled = [c.decode() for c in node.attr["disabled_checks"].list.s] if "disabled_checks" in node.attr else []
            if platforms and "TPU" not in platforms and "platform" not in disabled:
                findings.append(Finding(
                    ERROR, "xla-call-module-platform", fn, prefix + node.name,
                    f"the jax2tf computation was lowered for {', '.join(platforms)} only and the TPU refuses it; "
                    "export with jax2tf.convert(..., native_serialization_platforms=('cpu', 'tpu'))"))
    return findings


def _dtype_finding(fn: str, where: str, op: str, attr: str, dtype: int, allowed: frozenset[int] | None) -> Finding | None:
    from tensorflow.python.framework import dtypes

    if dtype == T.DT_INVALID:
        return None
    name = dtypes.as_dtype(dtype).name
    if dtype in HANDLE_TYPES and (allowed is None or dtype in allowed):
        return None
    if dtype not in TPU_ALL_TYPES:
        return Finding(ERROR, "dtype", fn, where, f"op {op} computes in {name} ({attr}), which TPUs do not support")
    if allowed is not None and dtype not in allowed:
        return Finding(ERROR, "dtype", fn, where, f"op {op} has no XLA kernel for {name} ({attr})")
    if dtype == T.DT_DOUBLE:
        return Finding(WARNING, "dtype", fn, where,
                       f"op {op} computes in float64 ({attr}); TPUs emulate it partially and slowly")
    return None


_CONSTRAINTS: dict[str, dict[str, frozenset[int]] | None] = {}


def xla_type_constraints(op: str) -> dict[str, frozenset[int]] | None:
    """{type attr: allowed dtypes} of the op's XLA kernel, or None when it has none."""
    if op not in _CONSTRAINTS:
        from tensorflow.python.framework import kernels

        from tpubuild.tpu.compatibility import register_xla_kernels

        register_xla_kernels()
        found = [k for k in kernels.get_registered_kernels_for_op(op).kernel if k.device_type == XLA_DEVICE]
        if not found:
            _CONSTRAINTS[op] = None
        else:
            merged: dict[str, set[int]] = {}
            for kernel in found:
                for constraint in kernel.constraint:
                    merged.setdefault(constraint.name, set()).update(constraint.allowed_values.list.type)
            _CONSTRAINTS[op] = {k: frozenset(v) for k, v in merged.items()}
    return _CONSTRAINTS[op]


def resource_argument_findings(model: SavedModel, fn: str) -> list[Finding]:
    """A resource argument read inside the computation must be a variable (LookupResource<Var>)."""
    from tpubuild.savedmodel.resources import VariableSources

    fdef = model.functions[fn]
    consumed = {
        _source(ref)
        for node in fdef.node_def
        if REPLICATE_ATTR in node.attr
        for ref in node.input
        if not ref.startswith("^")
    }
    resources = [a.name for a in fdef.signature.input_arg if a.type == T.DT_RESOURCE and a.name in consumed]
    if not resources:
        return []
    sources = VariableSources(model)
    objects = model.meta_graph.object_graph_def.nodes
    findings = []
    for arg in resources:
        ids = sources.known.get((fn, arg), set())
        kinds = sorted({_object_kind(objects[i]) for i in ids})
        others = [k for k in kinds if k != "variable"]
        if others:
            findings.append(Finding(
                ERROR, "resource-argument", fn, None,
                f"resource argument {arg} is a {others[0]}, not a variable; the TPU runtime copies "
                "only variables to the TPU (LookupResource<Var>)",
            ))
        elif not kinds and not _graph_variable(model, fn, arg):
            findings.append(Finding(
                WARNING, "resource-argument", fn, None,
                f"resource argument {arg}: tpubuild cannot tell whether it is a variable; the TPU "
                "runtime accepts only variables",
            ))
    return findings


def _object_kind(obj: Any) -> str:
    kind = obj.WhichOneof("kind")
    if kind == "resource":
        return "resource object (e.g. a lookup table)"
    return kind or "unknown object"


def _graph_variable(model: SavedModel, fn: str, arg: str) -> bool:
    """TF1 models: the argument comes from a graph-level VarHandleOp."""
    index = [a.name for a in model.functions[fn].signature.input_arg].index(arg)
    graph = {n.name: n for n in model.meta_graph.graph_def.node}
    for node in model.graph_call_sites(fn):
        data = [r for r in node.input if not r.startswith("^")]
        if index < len(data) and getattr(graph.get(_source(data[index])), "op", "") == "VarHandleOp":
            return True
    return False
