"""The oldest TensorFlow release whose op registry accepts a SavedModel.

A consumer fails on a node whose op it does not register ("Op type not registered").
An attribute its OpDef lacks is, in the releases read here, logged as an error and
ignored (tensorflow/core/framework/node_def_util.cc, ValidateNodeDef: "NodeDef mentions
attribute ... Unknown attributes will be ignored"), so a value other than the newer
default is silently lost; attributes starting with "_" are exempt from both
(graph_def_util.cc, RemoveNewDefaultAttrsFromNodeDef). Either way the release does not
run the model as built, so both count. tpubuild strips default-valued attributes on
every write (model.prepare_for_older_runtimes), so what is left is what the model really
uses; each op and attribute is dated by `tf_op_history` (generated from the op wrappers
of each tensorflow-cpu release by scripts/tf_op_history.py).

The attributes tpubuild's own rewrites set, and when they appeared (from that history):
  BatchFunction: f, num_batch_threads, max_batch_size, batch_timeout_micros,
    allowed_batch_sizes, max_enqueued_batches, shared_name, batching_queue, Tin,
    Tcaptured, Tout, enable_large_batch_splitting: 2.12 or older;
    low_priority_max_batch_size / _batch_timeout_micros / _allowed_batch_sizes /
    _max_enqueued_batches: 2.14; mixed_priority_policy: 2.17; batch_padding_policy: 2.18
    (tpubuild leaves all of these at their defaults, so they are stripped).
  TPUPartitionedCall (autotuner_thresh), TPUOrdinalSelector, TPUReplicatedOutput:
    2.12 or older.
  TPUReplicateMetadata: num_replicas, num_cores_per_replica, topology, use_tpu,
    device_assignment, computation_shape, allow_soft_placement,
    use_spmd_for_xla_partitioning: 2.12 or older; use_shardy_partitioner: 2.20.
Releases older than tf_op_history.BASELINE were not read: an artifact that uses nothing
newer is reported as needing "2.12" with a reason that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

from tpubuild.report import tf_op_history
from tpubuild.savedmodel.model import SavedModel


@dataclass(frozen=True, order=True)
class Requirement:
    """One op or attribute that needs release `since` (a wheel version from the history)."""

    since: tuple[int, ...]
    what: str


def series(version: str | tuple[int, ...]) -> str:
    """'2.17.1' -> '2.17': the history reads one wheel per minor series."""
    parts = version.split(".") if isinstance(version, str) else [str(p) for p in version]
    return ".".join(parts[:2])


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _nodes(meta_graph: MetaGraphDef) -> Iterator[tuple[str, NodeDef]]:
    """(where, node) for every node of the graph and of every library function."""
    for node in meta_graph.graph_def.node:
        yield "the graph", node
    for fdef in meta_graph.graph_def.library.function:
        for node in fdef.node_def:
            yield f"function {fdef.signature.name}", node


def requirements(meta_graph: MetaGraphDef) -> list[Requirement]:
    """Every op and attribute of the model that is newer than the history's baseline."""
    library = {f.signature.name for f in meta_graph.graph_def.library.function}
    found = []
    for where, node in _nodes(meta_graph):
        if node.op in library:  # a call by function name: no registry entry to check
            continue
        place = f'node "{node.name}" in {where}'
        if node.op in tf_op_history.OPS:
            found.append(Requirement(_key(tf_op_history.OPS[node.op]), f"op {node.op} ({place})"))
        for attr in node.attr:
            since = tf_op_history.ATTRS.get((node.op, attr))
            if since and not attr.startswith("_"):
                found.append(Requirement(_key(since), f"attribute {attr} of {node.op} ({place})"))
    return found


def _previous(version: tuple[int, ...]) -> str:
    releases = [_key(v) for v in tf_op_history.RELEASES]
    older = [v for v in releases if v < version]
    return series(max(older)) if older else "none"


def required_version(meta_graph: MetaGraphDef) -> tuple[str, str]:
    """(oldest release series, why) for one MetaGraphDef."""
    found = requirements(meta_graph)
    baseline = series(tf_op_history.BASELINE)
    if not found:
        return baseline, (
            f"no op or attribute newer than TensorFlow {baseline}, the oldest release in "
            "tpubuild's op history; older releases were not checked"
        )
    newest = max(found)
    return series(newest.since), (
        f"{newest.what} first appears in TensorFlow {series(newest.since)} "
        f"(not in {_previous(newest.since)})"
    )


def min_tensorflow_version(saved_model_dir: Path, tags: list[str] | None) -> tuple[str, str]:
    """The oldest TensorFlow release whose op registry accepts the SavedModel, and why."""
    return required_version(SavedModel.load(Path(saved_model_dir), tags).meta_graph)
