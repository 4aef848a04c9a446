"""Second opinion on TPU bodies: TensorFlow's MLIR replicated clustering bridge, run on CPU.

`tf-replicated-clustering-bridge-v2` is phase one of TF's MLIR TPU bridge, registered in
tensorflow/compiler/mlir/tf2xla/api/v2/cluster_tf.cc (CreateReplicatedClusteringPipeline:
TPUValidateInputsPass, then the passes of internal/clustering_bridge_passes.cc): it checks
the `_tpu_replicate` attributes ("TF2XLA TPU bridge input check: mismatch clusters"), forms one
`tf_device.cluster_func` per cluster from the TPUReplicateMetadata node, and marks ops for
outside compilation. It needs no TPU, so it runs here as is. The later phases (TPU rewrite,
compilation) need a TPU system and are not run. A TPU body passes when the bridge succeeds
and forms exactly one cluster with every tagged op inside it.

The bridge reads functions from the eager context's library, so the body and its callees
are registered under fresh names for the duration of one check and removed afterwards.
"""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

from tensorflow.core.framework.attr_value_pb2 import AttrValue
from tensorflow.core.framework.function_pb2 import FunctionDef

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.findings import ERROR, WARNING, Finding, tpu_bodies
from tpubuild.tpu.placement import METADATA
from tpubuild.tpu.splat import splat_large_constants

PIPELINE = "tf-replicated-clustering-bridge-v2"
_COUNTER = itertools.count()


def bridge_findings(model: SavedModel) -> list[Finding]:
    """One error finding per TPU body the clustering bridge refuses or does not cluster as one."""
    findings = []
    for fn in tpu_bodies(model):
        finding = check_body(model, fn)
        if finding is not None:
            findings.append(finding)
    return findings


def check_body(model: SavedModel, fn: str) -> Finding | None:
    import tensorflow as tf
    from tensorflow.python.eager import context

    from tpubuild.quiet import captured_stderr

    if soft_placement(model, fn):
        # The bridge's ExtractOutsideCompilation pass moves the host ops to the TPU host's
        # CPU device, which it looks up among the TPU system's devices
        # (tensorflow/compiler/mlir/tensorflow/utils/tpu_rewrite_device_util.cc: "Did not find
        # any CPU:0 host devices" here): without a TPU system the pipeline cannot finish.
        return Finding(WARNING, "mlir-bridge", fn, None,
                       "soft device placement: TensorFlow's MLIR bridge needs a TPU system to move the "
                       "host ops, so its check is not run on this function")
    names = [fn, *sorted(model.reachable(fn) & set(model.functions))]
    suffix = f"_tpubuild_bridge_{next(_COUNTER)}"
    renamed = {name: name + suffix for name in names}
    copies = [_renamed(splat_large_constants(model.functions[name]), renamed) for name in names]
    ctx = context.context()
    added = []
    try:
        for fdef in reversed(copies):  # callees first
            ctx.add_function_def(fdef)
            added.append(fdef.signature.name)
        # The bridge's passes log progress lines from C++; its verdict comes back as the
        # exception or the module text, so those lines are dropped.
        with captured_stderr():
            text = tf.mlir.experimental.convert_function(
                SimpleNamespace(function_def=copies[0]), pass_pipeline=PIPELINE
            )
    except Exception as exc:  # the bridge's refusal is the finding
        node, message = _first_error(exc)
        return Finding(ERROR, "mlir-bridge", fn, node, f"TensorFlow's MLIR clustering bridge refuses it: {message}")
    finally:
        for name in added:
            ctx.remove_function(name)
    clusters = text.count("tf_device.cluster_func")
    if clusters != 1:
        return Finding(ERROR, "mlir-bridge", fn, None,
                       f"TensorFlow's MLIR clustering bridge formed {clusters} TPU clusters, not 1")
    left = [line for line in text.splitlines() if "_replication_info" in line and "tf_device.cluster_func" not in line]
    if left:
        op = re.search(r'"(tf\.[A-Za-z0-9_]+)"', left[0])
        return Finding(ERROR, "mlir-bridge", fn, None,
                       f"TensorFlow's MLIR clustering bridge left {op.group(1) if op else 'an op'} of the "
                       "cluster outside it")
    return None


def soft_placement(model: SavedModel, fn: str) -> bool:
    """Whether the TPU body allows soft device placement (its TPUReplicateMetadata says so)."""
    # `in` first: indexing a proto map inserts an empty AttrValue, which the bridge refuses
    # ("Unknown AttrValue type"); a saved model drops the attribute when false (its default).
    return any(node.op == METADATA and "allow_soft_placement" in node.attr and node.attr["allow_soft_placement"].b
               for node in model.functions[fn].node_def)


def _first_error(exc: Exception) -> tuple[str | None, str]:
    """(node, message) of the bridge's first diagnostic, without MLIR's location syntax."""
    lines = [line.strip() for line in str(getattr(exc, "message", exc)).splitlines() if line.strip()]
    line = next((line for line in lines if "error: " in line or line.startswith("loc(")), lines[0] if lines else "")
    node = None
    location = re.match(r'loc\((?:fused\[)?"[^"]*"(?:, "([^"]+)")?', line)
    if location:
        node = location.group(1)
    if "error: " in line:
        line = line.split("error: ", 1)[1]
    elif line.startswith("loc(") and "): " in line:
        line = line.split("): ", 1)[1]
    return node, line or type(exc).__name__


def _renamed(copy: FunctionDef, renamed: dict[str, str]) -> FunctionDef:
    """`copy` (a function's copy: edited in place) with the functions it names renamed."""
    copy.signature.name = renamed[copy.signature.name]
    for node in copy.node_def:
        if node.op in renamed:
            node.op = renamed[node.op]
        for value in node.attr.values():
            _rename_attr(value, renamed)
    return copy


def _rename_attr(value: AttrValue, renamed: dict[str, str]) -> None:
    kind = value.WhichOneof("value")
    if kind == "func":
        if value.func.name in renamed:
            value.func.name = renamed[value.func.name]
        for inner in value.func.attr.values():
            _rename_attr(inner, renamed)
    elif kind == "list":
        for func in value.list.func:
            if func.name in renamed:
                func.name = renamed[func.name]
