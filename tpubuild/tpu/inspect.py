"""What a recipe author needs to know about a SavedModel they did not export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import INIT_OP_KEY, SAVED_MODEL_PB, SavedModel

# Ops that show the model was already converted (placed on a TPU or batched).
TPU_OPS = frozenset({"TPUPartitionedCall", "TPUReplicateMetadata", "TPUOrdinalSelector", "TPUCompile",
                     "TPUExecute", "TPUReplicatedInput", "TPUReplicatedOutput", "TPUCompilationResult"})
BATCH_OPS = frozenset({"BatchFunction", "Batch", "Unbatch"})
# Functions TF writes for checkpointing; never candidates for the TPU.
SAVER_PREFIXES = ("__inference__traced_save", "__inference__traced_restore", "_traced_save", "_traced_restore")


def _shape(info: Any) -> str:
    if info.tensor_shape.unknown_rank:
        return "?"
    return "[" + ", ".join("None" if d.size < 0 else str(d.size) for d in info.tensor_shape.dim) + "]"


def _tensor(info: Any) -> dict[str, str]:
    return {"dtype": tf.as_dtype(info.dtype).name, "shape": _shape(info)}


def tag_sets(path: Path) -> list[list[str]]:
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(path) / SAVED_MODEL_PB).read_bytes())
    return [sorted(mg.meta_info_def.tags) for mg in proto.meta_graphs]


def inspect(path: Path, tags: list[str] | None = None) -> dict[str, Any]:
    """Tags, signatures with specs, aliases, functions with callers / XLA-compilability, TPU and batch ops.

    Functions a TPUPartitionedCall runs are reported as placed on the TPU, with the TPU
    runtime's rule findings (runtime_rules.py, then TF's MLIR clustering bridge), on any
    SavedModel, converted by tpubuild or elsewhere.
    """
    from tpubuild.serving import warmup
    from tpubuild.tpu.compatibility import check_xla_kernels
    from tpubuild.tpu.findings import tpu_bodies
    from tpubuild.tpu.runtime_check import all_findings

    model = SavedModel.load(Path(path), tags)
    bodies = set(tpu_bodies(model))
    findings = all_findings(model) if bodies else []
    signature_functions = model.signatures
    signatures = {}
    for key, sig in sorted(model.meta_graph.signature_def.items()):
        if key == INIT_OP_KEY:
            continue
        signatures[key] = {
            "function": signature_functions.get(key),
            "inputs": {name: _tensor(info) for name, info in sorted(sig.inputs.items())},
            "outputs": {name: _tensor(info) for name, info in sorted(sig.outputs.items())},
        }
    functions = []
    ops: dict[str, int] = {}
    for name, fdef in sorted(model.functions.items()):
        for node in fdef.node_def:
            if node.op in TPU_OPS or node.op in BATCH_OPS:
                ops[node.op] = ops.get(node.op, 0) + 1
        if name.startswith(SAVER_PREFIXES):
            continue
        host = _host_role(model, name, bodies)
        xla: dict[str, Any] | None = None  # a host caller's: not a question (see _host_role)
        if host is None:
            try:
                check_xla_kernels(model, name, name)
                xla = {"compilable": True}
            except ConversionError as exc:
                xla = {"compilable": False, "reason": str(exc).split(": ", 1)[-1]}
        functions.append({
            "name": name,
            "alias": model.alias_of(name),
            "jit_compile": fdef.attr["_XlaMustCompile"].b if "_XlaMustCompile" in fdef.attr else False,
            "callers": sorted(model.callers(name)),
            "signatures": sorted(k for k, fn in signature_functions.items() if fn == name),
            "xla": xla,
            "host": host,
            "tpu": _tpu_placement(model.functions[name], [f for f in findings if f.function == name])
            if name in bodies
            else None,
        })
    for node in model.meta_graph.graph_def.node:
        if node.op in TPU_OPS or node.op in BATCH_OPS:
            ops[node.op] = ops.get(node.op, 0) + 1
    return {
        "path": str(path),
        "tag_sets": tag_sets(path),
        "tags": sorted(model.meta_graph.meta_info_def.tags),
        "signatures": signatures,
        "aliases": dict(sorted((alias, fn) for fn, alias in model.aliases.items())),
        "functions": functions,
        "tpu_and_batch_ops": dict(sorted(ops.items())),
        # What TF Serving replays at load (assets.extra/tf_serving_warmup_requests).
        "warmup_requests": [warmup.describe(log) for log in warmup.read(Path(path))],
    }


def _host_role(model: SavedModel, name: str, bodies: set[str]) -> dict[str, Any] | None:
    """How a function of a converted model serves its TPU functions (or batches requests)
    from the host, or None.

    A function that holds a TPUPartitionedCall (or calls one that does) is the host side of
    the placement, by design: TF Serving runs it on the host CPU, where the
    TPUPartitionedCall hands the TPU function to the TPU runtime (TensorFlow's
    tensorflow/core/tpu/kernels/tpu_functional_ops.cc registers its kernel for DEVICE_CPU
    only); likewise the BatchFunction that batches requests for it. Whether XLA could
    compile such a function is no question (TPUOrdinalSelector and TPUPartitionedCall have
    no XLA kernel: they run on the host), so inspect says what it does instead."""
    inside_tpu = set(bodies) | {fn for body in bodies for fn in model.reachable(body)}
    tpu_functions: set[str] = set()
    batching = False
    for fn in [name, *sorted(model.reachable(name) - inside_tpu)]:
        for node in model.functions[fn].node_def:
            if node.op == "TPUPartitionedCall":
                tpu_functions.add(node.attr["f"].func.name)
            batching = batching or node.op in BATCH_OPS
    if name in inside_tpu or not (tpu_functions or batching):
        return None
    return {"tpu_functions": sorted(tpu_functions), "batching": batching}


def _tpu_placement(fdef: Any, findings: list[Any]) -> dict[str, Any]:
    from tpubuild.tpu.placement import REPLICATE_ATTR

    clusters = sorted({n.attr[REPLICATE_ATTR].s.decode() for n in fdef.node_def if REPLICATE_ATTR in n.attr})
    return {"clusters": clusters, "findings": [f.to_json() | {"text": str(f)} for f in findings]}


def _tpu_text(tpu: dict[str, Any]) -> list[str]:
    clusters = ", ".join(tpu["clusters"]) or "none"
    errors = [f for f in tpu["findings"] if f["severity"] == "error"]
    state = f"{len(errors)} TPU runtime rule violation(s)" if errors else "TPU runtime rules: OK"
    lines = [f"    placed on the TPU (cluster {clusters}); {state}"]
    lines += [f"      {f['severity']}: {f['text']}" for f in tpu["findings"]]
    return lines


def _runs_where(fn: dict[str, Any]) -> str:
    """Where a function runs: the host side of a TPU placement, or whether XLA compiles it."""
    host = fn.get("host")
    if host:
        does = [f"calls {', '.join(host['tpu_functions'])} on the TPU through TPUPartitionedCall"] \
            if host["tpu_functions"] else []
        does += ["batches requests with BatchFunction"] if host["batching"] else []
        return "runs on the host, by design: " + "; ".join(does)
    if fn["xla"]["compilable"]:
        return "XLA-compilable"
    return f"not XLA-compilable: {fn['xla']['reason']}"


def to_text(info: dict[str, Any]) -> str:
    """A readable listing of `inspect()`'s result."""
    lines = [f"SavedModel {info['path']}", "tag sets: " + "; ".join(", ".join(t) for t in info["tag_sets"])]
    lines.append(f"signatures (tags {', '.join(info['tags'])}):")
    for key, sig in info["signatures"].items():
        lines.append(f"  {key} -> {sig['function']}")
        for kind in ("inputs", "outputs"):
            for name, spec in sig[kind].items():
                lines.append(f"    {kind[:-1]:6} {name}: {spec['dtype']}{spec['shape']}")
    lines.append("function aliases:" + ("" if info["aliases"] else " none"))
    lines += [f"  {alias} -> {fn}" for alias, fn in info["aliases"].items()]
    lines.append("functions:")
    for fn in info["functions"]:
        tags = [f"alias {fn['alias']}"] if fn["alias"] else []
        tags += ["jit_compile"] if fn["jit_compile"] else []
        tags += [f"signature {s}" for s in fn["signatures"]]
        lines.append(f"  {fn['name']}" + (f" ({', '.join(tags)})" if tags else ""))
        lines.append(f"    called by: {', '.join(fn['callers']) or 'the graph / no function'}; {_runs_where(fn)}")
        if fn.get("tpu"):
            lines += _tpu_text(fn["tpu"])
    ops = info["tpu_and_batch_ops"]
    lines.append("TPU / batch ops: " + (", ".join(f"{op} x{n}" for op, n in ops.items()) or "none (not converted)"))
    requests = info.get("warmup_requests", [])
    lines.append("warmup requests (assets.extra):" + ("" if requests else " none"))
    lines += [f"  {line}" for line in requests]
    return "\n".join(lines) + "\n"
