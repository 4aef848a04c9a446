"""TPU placement on the protos: call sites through TPUPartitionedCall, bodies with replication metadata.

This mirrors what `tf.compat.v1.tpu.rewrite` builds (tensorflow/python/tpu/tpu_replication.py,
`split_compile_and_replicate`): one `TPUReplicateMetadata` node per computation, every node
of the computation tagged `_tpu_replicate` with the one cluster name, and each output
leaving the computation through `Identity(_tpu_output_identity)` -> `TPUReplicatedOutput
(num_replicas=1)` -> `Identity`, the last two untagged. Callers pick a core with
`TPUOrdinalSelector`.

Why the outputs need that chain: `EncapsulateTPUComputationsPass::Encapsulate`
(tensorflow/core/tpu/graph_rewrite/encapsulate_tpu_computations_pass.cc), which
`TPUPartitionedCallOp` runs on the function body (tensorflow/core/tpu/kernels/
tpu_functional_ops.cc, PlacementHelper -> PRE_PLACEMENT passes), rejects any data edge from
a tagged node to an untagged node other than `TPUReplicatedOutput` ("Undeclared output of
TPU computation"); the function's `_Retval` nodes are untagged.

What `tpu.rewrite` also emits and tpubuild leaves out, on purpose:
- `TPUReplicatedInput`: marks an input as per-replica. With `num_replicas=1` a replicated
  and a broadcast argument are the same thing, `RewriteSubgraph` accepts arguments without
  it (they sort as broadcast arguments), and `TPUPartitionedCallOp::
  OptimizeTpuInputOutputTensors` removes every `TPUReplicatedInput` anyway unless inputs
  carry SPMD `XlaSharding` annotations, which tpubuild never writes. Untagged inputs
  feeding tagged nodes are the computation's declared inputs.
- `TPUCompilationResult`: gives a Session caller the compile status; the rewrite pass only
  rewires it. Under `TPUPartitionedCall` a compilation error already fails the call itself,
  and nothing in the function would consume the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.fnedit import CALL_OPS, TPU_CALL
from tpubuild.savedmodel.model import SavedModel, node_functions
from tpubuild.tpu.functions import XLA_MUST_COMPILE, TpuFunction

ORDINAL_SELECTOR = "TPUOrdinalSelector"
METADATA = "TPUReplicateMetadata"
REPLICATED_OUTPUT = "TPUReplicatedOutput"
REPLICATED_INPUT = "TPUReplicatedInput"
COMPILATION_RESULT = "TPUCompilationResult"
REPLICATE_ATTR = "_tpu_replicate"
OUTPUT_IDENTITY_ATTR = "_tpu_output_identity"  # what tpu.rewrite sets on its output Identity
# A node of the computation that runs on the host (kXlaOutsideCompilationAttr).
OUTSIDE_COMPILATION_ATTR = "_xla_outside_compilation"
# The untagged Identity after TPUReplicatedOutput; the CPU twin and later stages find it by this.
OUTPUT_SHARD_ATTR = "_tpubuild_tpu_output"
# Devices the TPU runtime addresses: x, y, z, core (kTPUTopologyRank in tpu_defs.h).
TOPOLOGY_RANK = 4
# Attributes of (Stateful)PartitionedCall that TPUPartitionedCall's op def lacks.
CPU_CALL_ONLY_ATTRS = ("config", "config_proto", "executor_type")


@dataclass
class Placement:
    """What placing one TPU function did, for the stage summary."""

    function: str  # the function whose body now runs on the TPU
    alias: str | None
    named_by: str
    cluster: str
    call_sites: list[dict[str, str]] = field(default_factory=list)  # {"caller", "node"}
    wrapper: str | None = None  # the signature function turned into a thin wrapper
    soft_placement: bool = False
    host_ops: list[dict[str, str]] = field(default_factory=list)  # {"node", "op"}: run on the host

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "function": self.function,
            "alias": self.alias,
            "named_by": self.named_by,
            "cluster": self.cluster,
            "call_sites": self.call_sites,
            "wrapper": self.wrapper,
        }
        if self.soft_placement:  # present only then: other summaries (and keys) stay as they were
            out["soft_placement"] = {"host_ops": self.host_ops}
        return out


# Ops only a model already placed on the TPU holds: what this module writes, and what
# tf.compat.v1.tpu.rewrite and the Cloud TPU Inference Converter write.
PLACED_OPS = (TPU_CALL, METADATA, ORDINAL_SELECTOR, REPLICATED_OUTPUT, COMPILATION_RESULT)


def refuse_placed_model(model: SavedModel) -> None:
    """A converted artifact given as the model (a tpubuild version, the converter's output)
    cannot be placed again: its TPU calls have no CPU kernel, so every check and the CPU
    twin would fail on them with TensorFlow's words. Say what it is, naming the node."""
    for name, fdef in model.functions.items():
        for node in fdef.node_def:
            if node.op in PLACED_OPS:
                raise ConversionError(
                    f"the model is already converted for the TPU: function {model.describe(name)} has {node.op} node "
                    f"'{node.name}'. Point `saved_model:` at the SavedModel it was converted from (the export), "
                    "not at a converted version")


def place_on_tpu(
    model: SavedModel, functions: list[TpuFunction], sharding: dict[str, Any] | None = None
) -> tuple[list[Placement], list[str]]:
    """Rewrite `model` in place so each function runs on the TPU; returns placements and warnings."""
    metadata = metadata_attrs(sharding)
    graph_called = _graph_called(model)
    placements, warnings = [], sharding_warnings(sharding)
    for fn in functions:
        placement = Placement(fn.name, fn.alias, fn.how, cluster_name(fn.label), soft_placement=fn.soft_placement)
        if fn.soft_placement:
            from tpubuild.tpu.compatibility import host_ops

            placement.host_ops = [{"node": node, "op": op} for node, op in host_ops(model, fn.name)]
        if fn.signature is not None or fn.name in graph_called:
            # Graph-level callers (TF Serving's signature nodes) stay as they are: the
            # signature's function keeps its name and calls a TPU copy of its body.
            placement.wrapper = fn.name
            placement.function = split_wrapper(model, fn.name)
        placements.append(placement)
    # Code already on the TPU calls TPU functions directly: a TPUPartitionedCall has no XLA
    # kernel, and a callee carrying its own cluster and metadata would be a second cluster
    # inside the computation. Those call sites get an untagged copy of the body.
    targets = {p.function for p in placements}
    plain = _plain_copies(model, targets)
    tpu_code = set(plain.values()).union(targets, *(model.reachable(t) for t in targets))
    for placement in placements:
        target = placement.function
        for caller, node in model.call_sites(target):
            if caller in tpu_code and node.attr["f"].func.name == target:
                node.attr["f"].func.name = plain[target]
                continue
            if node.op not in CALL_OPS or node.attr["f"].func.name != target:
                warnings.append(
                    f"tpu function {model.describe(placement.wrapper or target)}: node '{node.name}' (op {node.op}) in "
                    f"{caller} refers to it but is not a function call; left on the CPU"
                )
                continue
            _to_tpu_call(model.functions[caller], node)
            placement.call_sites.append({"caller": caller, "node": node.name})
        if not placement.call_sites:
            warnings.append(
                f"tpu function {model.describe(placement.wrapper or target)} has no call site in any "
                "function; nothing calls it through the TPU"
            )
    # Tag bodies last: the untagged copies above are taken from the bodies as exported.
    for placement in placements:
        body = model.functions[placement.function]
        _mark_body(body, placement.cluster, metadata)
        if placement.soft_placement:
            allow_soft_placement(body, [row["node"] for row in placement.host_ops])
    model.invalidate()
    return placements, warnings


def _plain_copies(model: SavedModel, targets: set[str]) -> dict[str, str]:
    """{TPU function: an untagged copy of its body}, for the targets that TPU code calls."""
    snapshot = {t: model.functions[t] for t in targets}
    reached = set(targets).union(*(model.reachable(t) for t in targets))
    called_inside = {t for t in targets if model.callers(t) & reached}
    names = {t: model.unique_name(f"{t}_in_tpu") for t in sorted(called_inside)}
    for target, name in names.items():
        copy = FunctionDef()
        copy.CopyFrom(snapshot[target])
        copy.signature.name = name
        if XLA_MUST_COMPILE in copy.attr:
            del copy.attr[XLA_MUST_COMPILE]  # compiled as part of the computation that calls it
        model.add_function(copy)
    # The copies call each other's copies, never the TPU bodies.
    for name in names.values():
        for node in model.functions[name].node_def:
            if node.op in CALL_OPS and node.attr["f"].func.name in names:
                node.attr["f"].func.name = names[node.attr["f"].func.name]
    model.invalidate()
    return names


def cluster_name(label: str) -> str:
    return "cluster_" + re.sub(r"[^A-Za-z0-9_]", "_", label)


def metadata_attrs(sharding: dict[str, Any] | None) -> dict[str, Any]:
    """TPUReplicateMetadata attributes from the recipe's xla_sharding_options.

    Raises ConversionError for a combination the TPU runtime would refuse (see
    `check_device_assignment`).
    """
    sharding = sharding or {}
    cores = int(sharding.get("num_cores_per_replica", 1))
    attrs: dict[str, Any] = {
        "num_replicas": 1,
        "num_cores_per_replica": cores,
        "device_assignment": [int(i) for i in sharding.get("device_assignment", [])],
        "topology": b"",
        # TPUPartitionedCallOp::GetGraphFromFunction reads this attr to size its ordinal
        # selector and to partition variables per core; without it a multi-core function
        # is compiled with the MPMD partitioner, which needs per-op sharding tpubuild
        # does not write (tpu_functional_ops.cc).
        "use_spmd_for_xla_partitioning": cores > 1,
    }
    topology = sharding.get("topology")
    if topology:
        attrs["topology"] = topology_proto(topology["mesh_shape"], topology["device_coordinates"])
    check_device_assignment(cores, attrs["device_assignment"], topology)
    return attrs


def check_device_assignment(cores: int, assignment: list[int], topology: dict[str, Any] | None) -> None:
    """Refuse what the runtime refuses, from its source:

    - DistributedTPURewritePass::BuildDeviceAssignment (distributed_tpu_rewrite_pass.cc):
      a device_assignment without a topology; ParseDeviceAssignmentAttr: a length other than
      num_replicas * num_cores_per_replica * 4, a negative coordinate, a core named twice.
    - TPUPartitionedCallOp (tpu_functional_ops.cc): with num_cores_per_replica > 1 the
      function's variables are copied to the cores starting at the ordinal the
      TPUOrdinalSelector picked (ReplaceAndPartitionXLAShardingVariable: TPU:ordinal ...
      TPU:ordinal+n-1), and an empty device_assignment is filled from the topology's
      coordinates starting at that ordinal (GetGraphFromFunction). A hand-set assignment is
      used as written for every call, so it only agrees with the variables' cores at
      ordinal 0: it must name the topology's first num_cores_per_replica devices, in order.
      GetGraphFromFunction auto-assigns only for topologies of 2, 4 or 8 cores
      ("Unable to auto assign device assignment").
    """
    where = "xla_sharding_options.device_assignment"
    if assignment and not topology:
        raise ConversionError(
            f"{where}: a device_assignment needs a topology (xla_sharding_options.topology); the TPU "
            "runtime refuses it without one"
        )
    if not topology:
        return
    coords = [int(c) for c in topology["device_coordinates"]]
    devices = [tuple(coords[i : i + TOPOLOGY_RANK]) for i in range(0, len(coords), TOPOLOGY_RANK)]
    if not assignment:
        if cores > 1 and len(devices) not in (2, 4, 8):
            raise ConversionError(
                f"{where}: empty with num_cores_per_replica {cores} and a topology of {len(devices)} "
                "cores; TPUPartitionedCall assigns devices itself only for topologies of 2, 4 or 8 "
                "cores: write the assignment"
            )
        return
    if len(assignment) != cores * TOPOLOGY_RANK:
        raise ConversionError(
            f"{where}: {len(assignment)} values, but num_replicas (1) * num_cores_per_replica "
            f"({cores}) * {TOPOLOGY_RANK} = {cores * TOPOLOGY_RANK} are needed ([x, y, z, core] per core)"
        )
    wanted = [tuple(assignment[i : i + TOPOLOGY_RANK]) for i in range(0, len(assignment), TOPOLOGY_RANK)]
    for index, device in enumerate(wanted):
        if min(device) < 0:
            raise ConversionError(f"{where}: core {index} at {list(device)} has a negative coordinate")
        if device not in devices:
            raise ConversionError(f"{where}: core {index} at {list(device)} is not a device of the topology")
        if wanted.index(device) != index:
            raise ConversionError(f"{where}: core {index} at {list(device)} is assigned twice")
    if wanted != devices[:cores]:
        first = [c for device in devices[:cores] for c in device]
        raise ConversionError(
            f"{where}: {list(assignment)} names cores other than the topology's first {cores} "
            f"({first}); TPUPartitionedCall copies the variables to the cores at the ordinal it "
            "picks, so a hand-set assignment would run the program on other cores at every "
            "ordinal but 0: leave device_assignment empty or write the first cores"
        )


def sharding_warnings(sharding: dict[str, Any] | None) -> list[str]:
    """What the TPU runtime does not take from xla_sharding_options, so the user knows."""
    sharding = sharding or {}
    cores = int(sharding.get("num_cores_per_replica", 1))
    topology = sharding.get("topology")
    warnings = []
    if topology:
        # ParseTopologyAttr (distributed_tpu_rewrite_pass.cc) never reads mesh_shape: it
        # checks the task and device counts and each coordinate against the TPU system of
        # the host that serves the model, and fails every call on a mismatch.
        devices = len(topology["device_coordinates"]) // TOPOLOGY_RANK
        warnings.append(
            f"xla_sharding_options.topology: the TPU runtime ignores mesh_shape {list(topology['mesh_shape'])} "
            f"and checks the {devices} device coordinates against the serving host's TPU system "
            f"(1 task with {devices} TPU devices); on another host every TPU call fails"
        )
    if cores > 1 and sharding.get("device_assignment"):
        warnings.append(
            "xla_sharding_options.device_assignment: used as written for every call; the TPU "
            "runtime's ordinal selector cannot spread calls over other cores"
        )
    return warnings


def topology_proto(mesh_shape: list[int], device_coordinates: list[int]) -> bytes:
    """A serialized tensorflow.tpu.TopologyProto for one host holding every listed device."""
    from tensorflow.core.protobuf.tpu.topology_pb2 import TopologyProto

    dims = len(mesh_shape)
    if dims == 0 or len(device_coordinates) % dims:
        raise ConversionError(
            f"xla_sharding_options.topology: {len(device_coordinates)} device_coordinates do not "
            f"divide into coordinates of {dims} dimensions (mesh_shape {list(mesh_shape)})"
        )
    proto = TopologyProto(
        mesh_shape=[int(d) for d in mesh_shape],
        num_tasks=1,
        num_tpu_devices_per_task=len(device_coordinates) // dims,
        device_coordinates=[int(c) for c in device_coordinates],
    )
    return proto.SerializeToString()


def _graph_called(model: SavedModel) -> set[str]:
    called = set(model.signatures.values())
    for node in model.meta_graph.graph_def.node:
        called |= node_functions(node)
    return called


def split_wrapper(model: SavedModel, name: str) -> str:
    """Move `name`'s body into a copy and make `name` call the copy; returns the copy's name."""
    original = model.functions[name]
    body = FunctionDef()
    body.CopyFrom(original)
    body.signature.name = model.unique_name(f"{name}_tpu")
    # The alias stays with the wrapper (its name is what users and the object graph know).
    model.add_function(body)
    original = model.functions[name]

    wrapper = FunctionDef()
    wrapper.signature.CopyFrom(original.signature)
    for key, value in original.attr.items():
        if key != XLA_MUST_COMPILE:
            wrapper.attr[key].CopyFrom(value)
    for index, value in original.arg_attr.items():
        wrapper.arg_attr[index].CopyFrom(value)
    for index, value in original.resource_arg_unique_id.items():
        wrapper.resource_arg_unique_id[index] = value
    call = wrapper.node_def.add()
    call.name = "StatefulPartitionedCall"
    call.op = "StatefulPartitionedCall"
    call.input.extend(arg.name for arg in original.signature.input_arg)
    call.attr["f"].func.name = body.signature.name
    call.attr["Tin"].list.type.extend(_arg_types(original, original.signature.input_arg))
    call.attr["Tout"].list.type.extend(_arg_types(original, original.signature.output_arg))
    for i, arg in enumerate(original.signature.output_arg):
        wrapper.ret[arg.name] = f"{call.name}:output:{i}"
    if original.control_ret or not original.signature.output_arg:
        wrapper.signature.control_output[:] = [call.name]
        wrapper.control_ret.clear()
        wrapper.control_ret[call.name] = call.name
    original.CopyFrom(wrapper)
    model.invalidate()
    return body.signature.name


def _arg_types(fdef: FunctionDef, args: Any) -> list[int]:
    types = []
    for arg in args:
        if arg.type_attr or arg.number_attr or arg.type_list_attr:
            raise ConversionError(
                f"function {fdef.signature.name}: argument '{arg.name}' has a polymorphic type; "
                "cannot place it on the TPU"
            )
        types.append(arg.type)
    return types


def _to_tpu_call(caller: FunctionDef, node: NodeDef) -> None:
    """Turn a (Stateful)PartitionedCall node into TPUPartitionedCall fed by a TPUOrdinalSelector."""
    taken = {n.name for n in caller.node_def}
    selector_name = f"{node.name}/{ORDINAL_SELECTOR}"
    n = 0
    while selector_name in taken:
        n += 1
        selector_name = f"{node.name}/{ORDINAL_SELECTOR}_{n}"
    selector = caller.node_def.add()
    selector.name = selector_name
    selector.op = ORDINAL_SELECTOR
    selector.attr["_output_shapes"].list.shape.add().dim.add().size = -1

    node.op = TPU_CALL
    for attr in CPU_CALL_ONLY_ATTRS:
        if attr in node.attr:
            del node.attr[attr]
    node.attr["autotuner_thresh"].i = 0
    # Data inputs come before control inputs in a NodeDef.
    data = [i for i in node.input if not i.startswith("^")]
    control = [i for i in node.input if i.startswith("^")]
    node.input[:] = [*data, f"{selector_name}:device_ordinals:0", *control]


def _mark_body(fdef: FunctionDef, cluster: str, metadata: dict[str, Any]) -> None:
    """Tag every node with the cluster, add TPUReplicateMetadata and the output chains, as tpu.rewrite does."""
    for node in fdef.node_def:
        node.attr[REPLICATE_ATTR].s = cluster.encode()
        # A call traced with jit_compile=False (orbax's serving function, for one) carries
        # `_XlaMustCompile = false`. Inside the cluster the whole body is compiled, and TF's
        # MLIR bridge refuses an op with both that and the cluster's tag ("has both
        # '_XlaMustCompile = false' and '_xla_compile_device_type' attribute which
        # contradicts each other": CanonicalizeCompileAndReplicateAttributesPass,
        # tensorflow/compiler/mlir/tensorflow/transforms/
        # canonicalize_compile_and_replicate_attributes.cc).
        if XLA_MUST_COMPILE in node.attr and not node.attr[XLA_MUST_COMPILE].b:
            del node.attr[XLA_MUST_COMPILE]
    meta = fdef.node_def.add()
    meta.name = _unique_node_name(fdef, METADATA)
    meta.op = METADATA
    meta.attr[REPLICATE_ATTR].s = cluster.encode()
    meta.attr["num_replicas"].i = metadata["num_replicas"]
    meta.attr["num_cores_per_replica"].i = metadata["num_cores_per_replica"]
    meta.attr["topology"].s = metadata["topology"]
    meta.attr["use_tpu"].b = True
    meta.attr["device_assignment"].list.i.extend(metadata["device_assignment"])
    meta.attr["computation_shape"].list.SetInParent()
    meta.attr["allow_soft_placement"].b = False
    meta.attr["use_spmd_for_xla_partitioning"].b = metadata["use_spmd_for_xla_partitioning"]
    meta.attr["_output_shapes"].list.SetInParent()
    for index, arg in enumerate(fdef.signature.output_arg):
        _add_output_chain(fdef, arg.name, arg.type, index, cluster)


def allow_soft_placement(fdef: FunctionDef, host_nodes: list[str]) -> None:
    """Soft device placement, as the TPU runtime reads it.

    TensorFlow's MLIR TPU bridge copies TPUReplicateMetadata's attributes onto the cluster
    it forms (tensorflow/compiler/mlir/tensorflow/transforms/tpu_cluster_formation.cc), and
    its outside-compilation marking pass
    (tensorflow/compiler/mlir/tf2xla/internal/passes/mark_ops_for_outside_compilation.cc)
    reads the cluster's `allow_soft_placement`: when true, every op it cannot compile for
    the TPU (a string operand or result, no tf2xla kernel) gets `_xla_outside_compilation`
    and is extracted to run on the host; when false, such an op fails the compilation
    ("isn't compilable for TPU device. enable soft_device_placement option to run on CPU").
    The older graph bridge (tensorflow/core/tpu/graph_rewrite/
    encapsulate_tpu_computations_pass.cc, then extract_outside_compilation_pass.cc) moves
    only the nodes already marked `_xla_outside_compilation`, as
    `tf.tpu.outside_compilation` marks them (tensorflow/python/tpu/tpu_replication.py:
    one counter value per region, the MLIR pass's own marks being "auto<N>"). So both are
    written: the flag, and the mark on each node the compatibility check found the TPU
    cannot run (tpu/compatibility.py host_ops), one region each.
    """
    for node in fdef.node_def:
        if node.op == METADATA:
            node.attr["allow_soft_placement"].b = True
    marked = set(host_nodes)
    for index, node in enumerate(n for n in fdef.node_def if n.name in marked):
        node.attr[OUTSIDE_COMPILATION_ATTR].s = str(index).encode()


def _add_output_chain(fdef: FunctionDef, key: str, dtype: int, index: int, cluster: str) -> None:
    """ret[key] = Identity(TPUReplicatedOutput(Identity_tagged(value))), like tpu.rewrite's outputs."""
    inner = fdef.node_def.add()
    inner.name = _unique_node_name(fdef, f"tpu_output_identity_{index}")
    inner.op = "Identity"
    inner.input.append(fdef.ret[key])
    inner.attr["T"].type = dtype
    inner.attr[REPLICATE_ATTR].s = cluster.encode()
    inner.attr[OUTPUT_IDENTITY_ATTR].b = True
    replicated = fdef.node_def.add()
    replicated.name = _unique_node_name(fdef, f"output{index}")
    replicated.op = REPLICATED_OUTPUT
    replicated.input.append(f"{inner.name}:output:0")
    replicated.attr["T"].type = dtype
    replicated.attr["num_replicas"].i = 1
    shard = fdef.node_def.add()
    shard.name = _unique_node_name(fdef, f"output_{index}_shard_0")
    shard.op = "Identity"
    shard.input.append(f"{replicated.name}:outputs:0")
    shard.attr["T"].type = dtype
    shard.attr[OUTPUT_SHARD_ATTR].b = True
    fdef.ret[key] = f"{shard.name}:output:0"


def _replicated_output(fdef: FunctionDef, key: str) -> NodeDef | None:
    """The TPUReplicatedOutput that output `key` leaves the computation through, if any."""
    nodes = {n.name: n for n in fdef.node_def}
    node = nodes.get(fdef.ret[key].split(":")[0])
    while node is not None and node.op == "Identity" and REPLICATE_ATTR not in node.attr:
        node = nodes.get(node.input[0].split(":")[0]) if node.input else None
    return node if node is not None and node.op == REPLICATED_OUTPUT else None


def computation_output(fdef: FunctionDef, key: str) -> str:
    """The tensor the TPU computation produces for output `key` (before TPUReplicatedOutput).

    Stages that change a TPU function's outputs (bfloat16 casts, IO reshapes) edit this
    tensor, inside the computation, so the output still leaves it through the chain.
    """
    replicated = _replicated_output(fdef, key)
    return fdef.ret[key] if replicated is None else replicated.input[0]


def set_computation_output(fdef: FunctionDef, key: str, ref: str) -> None:
    """Make `ref` (a tensor of the computation) the value of output `key`."""
    replicated = _replicated_output(fdef, key)
    if replicated is None:
        fdef.ret[key] = ref
    else:
        replicated.input[0] = ref


def host_side_nodes(fdef: FunctionDef) -> set[str]:
    """Untagged nodes of a TPU body (the output chains' host side); empty for other functions."""
    if not any(REPLICATE_ATTR in n.attr for n in fdef.node_def):
        return set()
    return {n.name for n in fdef.node_def if REPLICATE_ATTR not in n.attr}


def _unique_node_name(fdef: FunctionDef, base: str) -> str:
    taken = {n.name for n in fdef.node_def}
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name
