"""The CPU twin of a TPU-placed SavedModel: TPU call sites mapped back to ordinary calls.

Only the TPU plumbing is undone; BatchFunction, bfloat16 casts, IO reshapes stay, so
running the twin on CPU checks every other rewrite numerically. A TPU body the object
graph does not hold (one split from a signature) becomes an attribute of the twin's root
with its variables bound (tpu/captures.py), so that the report can lower it to HLO.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.graph_pb2 import GraphDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel.model import SavedModel
from tpubuild.savedmodel.xla_call_module import OP as XLA_CALL_MODULE
from tpubuild.tpu.captures import expose
from tpubuild.tpu.placement import (
    COMPILATION_RESULT,
    METADATA,
    ORDINAL_SELECTOR,
    OUTPUT_IDENTITY_ATTR,
    OUTPUT_SHARD_ATTR,
    REPLICATE_ATTR,
    REPLICATED_INPUT,
    REPLICATED_OUTPUT,
    TPU_CALL,
)

DROPPED_OPS = (ORDINAL_SELECTOR, METADATA, COMPILATION_RESULT)
# Single-replica pass-throughs that have no CPU kernel: on CPU they are Identity ops.
# {op: (name of its output arg, attrs Identity does not have)}
PASS_THROUGH = {
    REPLICATED_OUTPUT: ("outputs", ("num_replicas",)),
    REPLICATED_INPUT: ("output", ("N", "is_mirrored_variable", "index", "is_packed")),
}
TPU_ONLY_ATTRS = (REPLICATE_ATTR, OUTPUT_IDENTITY_ATTR, OUTPUT_SHARD_ATTR)


def make_cpu_twin(src: Path, dst: Path, tags: list[str] | None = None) -> dict[str, int]:
    """Write the CPU twin of the SavedModel `src` into the empty directory `dst`; returns counts."""
    model = SavedModel.load(Path(src), tags)
    bodies = tpu_call_targets(model)
    counts = untpu(model)
    expose(model, bodies)  # those it cannot expose, report's HLO names with the reason
    Path(dst).mkdir(parents=True, exist_ok=True)
    model.save(Path(dst))
    return counts


_TWINS: dict[tuple, Path] = {}  # this process's twins: (what it was made from, tags) -> directory


def cpu_twin(src: Path, tags: list[str], scratch: Path) -> Path:
    """The CPU twin of the SavedModel `src`, as make_cpu_twin writes it. In a worker, made
    once per input and kept in the worker's scratch for a later stage of the same worker
    that asks for the same twin (report after verify: engine/loop.py HANDOFF); elsewhere
    made in `scratch`, a new directory the caller removes. A kept twin is found by what it
    was made from, the files of `src` themselves (_made_from), never by a name alone: a
    stage is handed one only if it would have written the same one."""
    from tpubuild.handoff import WORKER_SCRATCH

    root = os.environ.get(WORKER_SCRATCH)
    if not root:
        twin = Path(scratch) / "twin"
        make_cpu_twin(src, twin, tags)
        return twin
    key = (_made_from(Path(src)), tuple(tags))
    made = _TWINS.get(key)
    if made is None or not made.is_dir():
        made = Path(tempfile.mkdtemp(prefix="twin-", dir=root)) / "twin"
        make_cpu_twin(src, made, tags)
        _TWINS[key] = made
    return made


def keep_loaded(twin: Path, tags: list[str], model: Any) -> bool:
    """In a worker handed on to report (engine/loop.py HANDOFF), the twin verify loaded
    and ran stays loaded for report's HLO (take_loaded): one load of the model less. False
    when it is not kept (outside a worker); the caller then lets it go."""
    from tpubuild.handoff import hand_on

    return hand_on(("loaded cpu twin", str(twin), tuple(tags)), model)


def take_loaded(twin: Path, tags: list[str]) -> Any:
    """The twin at `twin` as an earlier stage of this worker loaded it (keep_loaded), else None."""
    from tpubuild.handoff import handed_on

    return handed_on(("loaded cpu twin", str(twin), tuple(tags)))


def _made_from(src: Path) -> tuple:
    """The identity of a SavedModel directory's content: its real path and each file's
    path, inode, size and modification time. A stage's input is a store checkout, read-only
    hard links to content-addressed objects: the same identity is the same bytes, and a
    file written again (a repaired checkout, another object) has another inode or mtime."""
    found = []
    for path in sorted(src.rglob("*")):
        if path.is_file():
            st = path.stat()
            found.append((str(path.relative_to(src)), st.st_ino, st.st_size, st.st_mtime_ns))
    return (str(src.resolve()), tuple(found))


def tpu_call_targets(model: SavedModel) -> set[str]:
    """The functions a TPUPartitionedCall calls: the TPU bodies."""
    return {node.attr["f"].func.name for fdef in model.functions.values() for node in fdef.node_def
            if node.op == TPU_CALL}


def untpu(model: SavedModel) -> dict[str, int]:
    """Undo TPU placement in place: TPUPartitionedCall -> StatefulPartitionedCall, drop metadata."""
    counts = {"calls": 0, "dropped": 0}
    for fdef in model.meta_graph.graph_def.library.function:
        _untpu_function(fdef, counts)
    _untpu_nodes(model.meta_graph.graph_def, counts)
    model.invalidate()
    return counts


def _untpu_function(fdef: FunctionDef, counts: dict[str, int]) -> None:
    dropped = _untpu_nodes(fdef, counts)
    for key in [k for k, v in fdef.ret.items() if v.split(":")[0] in dropped]:
        raise ValueError(f"{fdef.signature.name}: output {key} comes from a dropped TPU node")
    for key in [k for k, v in fdef.control_ret.items() if v in dropped]:
        del fdef.control_ret[key]
        fdef.signature.control_output.remove(key)


def _untpu_nodes(holder: GraphDef | FunctionDef, counts: dict[str, int]) -> set[str]:
    nodes = holder.node_def if isinstance(holder, FunctionDef) else holder.node
    dropped = {n.name for n in nodes if n.op in DROPPED_OPS}
    keep = [n for n in nodes if n.name not in dropped]
    counts["dropped"] += len(dropped)
    renamed: dict[str, str] = {}
    for node in keep:
        for attr in TPU_ONLY_ATTRS:
            if attr in node.attr:
                del node.attr[attr]
        if node.op in PASS_THROUGH:
            renamed.update(_to_identity(node))
        if node.op == XLA_CALL_MODULE:
            _run_tpu_lowering_on_cpu(node)
        if node.op == TPU_CALL:
            # The device ordinal is the last data input, whatever produces it.
            data = [i for i in node.input if not i.startswith("^")]
            control = [i for i in node.input if i.startswith("^")]
            node.input[:] = [*data[:-1], *control]
            node.op = "StatefulPartitionedCall"
            if "autotuner_thresh" in node.attr:
                del node.attr["autotuner_thresh"]
            counts["calls"] += 1
        # Control edges from dropped nodes (metadata) go too.
        node.input[:] = [i for i in node.input if _source(i) not in dropped]
    if renamed:
        for node in keep:
            node.input[:] = [renamed.get(i, i) for i in node.input]
        if isinstance(holder, FunctionDef):
            for key, ref in list(holder.ret.items()):
                holder.ret[key] = renamed.get(ref, ref)
    if dropped:
        kept = [_copy(n) for n in keep]
        del nodes[:]
        nodes.extend(kept)
    return dropped


def _run_tpu_lowering_on_cpu(node: NodeDef) -> None:
    """A jax2tf module lowered for TPU and not for CPU runs its TPU lowering on CPU: its
    platform check, not the computation, is what refuses it (tensorflow/compiler/tf2xla/
    kernels/xla_call_module_loader.cc, SetPlatformIndex: with "platform" in disabled_checks
    the first platform's lowering is used). A module lowered for CPU too keeps running its
    CPU lowering."""
    platforms = [p.decode() for p in node.attr["platforms"].list.s]
    checks = node.attr["disabled_checks"].list.s
    if platforms and "CPU" not in platforms and b"platform" not in checks:
        checks.append(b"platform")


def _to_identity(node: NodeDef) -> dict[str, str]:
    """Turn a one-replica TPUReplicatedOutput/Input into Identity; returns the output refs it renames."""
    output_arg, attrs = PASS_THROUGH[node.op]
    count = node.attr["num_replicas"].i if node.op == REPLICATED_OUTPUT else node.attr["N"].i
    if count != 1:
        raise ValueError(f"node {node.name}: {node.op} with {count} replicas has no CPU equivalent")
    node.op = "Identity"
    for attr in attrs:
        if attr in node.attr:
            del node.attr[attr]
    return {f"{node.name}:{output_arg}:0": f"{node.name}:output:0"}


def _source(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _copy(node: NodeDef) -> NodeDef:
    """A detached copy: a repeated field cannot take elements that still belong to it."""
    copy = NodeDef()
    copy.CopyFrom(node)
    return copy
