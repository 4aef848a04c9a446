"""TPU placement on the protos: call sites through TPUPartitionedCall, bodies with replication metadata.

This mirrors what `tf.compat.v1.tpu.rewrite` builds (tpu_replication.py): one
`TPUReplicateMetadata` node per computation and every node of the computation tagged
`_tpu_replicate` with the cluster name; callers pick a core with `TPUOrdinalSelector`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel, node_functions
from tpubuild.savedmodel.resolve import TpuFunction

CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
TPU_CALL = "TPUPartitionedCall"
ORDINAL_SELECTOR = "TPUOrdinalSelector"
METADATA = "TPUReplicateMetadata"
REPLICATE_ATTR = "_tpu_replicate"
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

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "alias": self.alias,
            "named_by": self.named_by,
            "cluster": self.cluster,
            "call_sites": self.call_sites,
            "wrapper": self.wrapper,
        }


def place_on_tpu(
    model: SavedModel, functions: list[TpuFunction], sharding: dict[str, Any] | None = None
) -> tuple[list[Placement], list[str]]:
    """Rewrite `model` in place so each function runs on the TPU; returns placements and warnings."""
    metadata = metadata_attrs(sharding)
    graph_called = _graph_called(model)
    placements, warnings = [], []
    for fn in functions:
        placement = Placement(fn.name, fn.alias, fn.how, cluster_name(fn.label))
        if fn.signature is not None or fn.name in graph_called:
            # Graph-level callers (TF Serving's signature nodes) stay as they are: the
            # signature's function keeps its name and calls a TPU copy of its body.
            placement.wrapper = fn.name
            placement.function = split_wrapper(model, fn.name)
        target = placement.function
        for caller, node in model.call_sites(target):
            if node.op not in CALL_OPS or node.attr["f"].func.name != target:
                warnings.append(
                    f"tpu function {model.describe(fn.name)}: node '{node.name}' (op {node.op}) in "
                    f"{caller} refers to it but is not a function call; left on the CPU"
                )
                continue
            _to_tpu_call(model.functions[caller], node)
            placement.call_sites.append({"caller": caller, "node": node.name})
        if not placement.call_sites:
            warnings.append(
                f"tpu function {model.describe(fn.name)} has no call site in any function; "
                "nothing calls it through the TPU"
            )
        placements.append(placement)
    # Tag bodies last so the ordinal selectors added inside TPU functions are tagged too.
    for placement in placements:
        _mark_body(model.functions[placement.function], placement.cluster, metadata)
    model.invalidate()
    return placements, warnings


def cluster_name(label: str) -> str:
    return "cluster_" + re.sub(r"[^A-Za-z0-9_]", "_", label)


def metadata_attrs(sharding: dict[str, Any] | None) -> dict[str, Any]:
    """TPUReplicateMetadata attributes from the recipe's xla_sharding_options."""
    sharding = sharding or {}
    attrs: dict[str, Any] = {
        "num_replicas": 1,
        "num_cores_per_replica": int(sharding.get("num_cores_per_replica", 1)),
        "device_assignment": [int(i) for i in sharding.get("device_assignment", [])],
        "topology": b"",
    }
    topology = sharding.get("topology")
    if topology:
        attrs["topology"] = topology_proto(topology["mesh_shape"], topology["device_coordinates"])
    return attrs


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
        if key != "_XlaMustCompile":
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
    """Add TPUReplicateMetadata and tag every node with the cluster, as tpu.rewrite does."""
    for node in fdef.node_def:
        node.attr[REPLICATE_ATTR].s = cluster.encode()
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
    meta.attr["_output_shapes"].list.SetInParent()


def _unique_node_name(fdef: FunctionDef, base: str) -> str:
    taken = {n.name for n in fdef.node_def}
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name
