"""Where a conversion's error comes from: two SavedModels that share node names (a
stage's input and its output) run on the same samples, and every intermediate tensor
is compared, node by node.

How the nodes are matched:
- Each signature is frozen with TensorFlow's own `convert_variables_to_constants_v2`
  (tensorflow/python/framework/convert_to_constants.py), which inlines every function
  call (Grappler's function inliner) and turns variable reads into constants. Inlined
  nodes are named `<call node>/<node>`, so a node keeps the same name in both models as
  long as the stage kept the names of the nodes it rewrote, which the bfloat16 and TPU
  rewrites do (they retype nodes in place).
- Nodes the stage added (the bfloat16 rewrite's `<tensor>/to_bf16` and `/to_f32` Casts)
  have no counterpart and are not compared; the comparison walks through them to find a
  node's nearest compared inputs.
- A bfloat16 output is compared as float64, like every other.
- A grafted body (the quantize stage puts the quantizer's int8 function under the float
  function's name) has the quantizer's own node names: only the nodes outside it, and
  those the quantizer left as they were, are matched.

A tensor is out of tolerance with verification's own rule (verify/compare.py): max|a - b|
> atol + rtol * max|b|, b the reference. The "first" nodes out of tolerance are those
whose compared inputs are all within it: the error starts there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

# Nodes that only move or hold a tensor: not compared (the error of what they pass on is
# the error of its producer), walked through to a node's nearest compared inputs.
PASS_OPS = frozenset({"Identity", "IdentityN", "Const", "Placeholder", "NoOp", "Cast", "Reshape",
                      "StopGradient", "Snapshot", "PreventGradient"})
# The inliner prefixes a body's nodes with the call node's name; the names users know
# (Keras layer scopes, tf.function's own) come after it.
CALL_PREFIX = re.compile(r"^(?:(?:Stateful)?PartitionedCall(?:_\d+)?/)+")


@dataclass
class NodeError:
    """One compared tensor: its node, op type, the dtype it has in the candidate, and its errors."""

    node: str
    op: str
    dtype: str
    output: int
    max_abs_error: float = 0.0
    max_reference: float = 0.0
    inputs: list[str] = field(default_factory=list)  # the nearest compared input tensors
    order: int = 0  # position in the candidate graph's topological order

    @property
    def max_rel_error(self) -> float:
        if self.max_reference > 0:
            return self.max_abs_error / self.max_reference
        return 0.0 if self.max_abs_error == 0 else float("inf")

    def within(self, rtol: float, atol: float) -> bool:
        return self.max_abs_error <= atol + rtol * self.max_reference

    @property
    def tensor(self) -> str:
        return f"{self.node}:{self.output}"

    @property
    def short_name(self) -> str:
        """The node's name without the inliner's call prefixes (e.g. `dense/MatMul`)."""
        return CALL_PREFIX.sub("", self.node) or self.node


@dataclass
class Frozen:
    graph: tf.Graph
    inputs: dict[str, str]  # signature input name -> placeholder tensor name


def freeze(model_dir: Path, tags: list[str], key: str) -> Frozen:
    """Signature `key` of the SavedModel as one inlined graph with its variables as constants."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    loaded = tf.saved_model.load(str(model_dir), tags=tags)
    function = loaded.signatures[key]
    frozen = convert_variables_to_constants_v2(function)
    _, kwargs = function.structured_input_signature
    names = sorted(kwargs)  # flat order of a signature's keyword inputs: sorted by name
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph.as_graph_def(), name="")
    placeholders = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    return Frozen(graph, dict(zip(names, placeholders)))


def compare_nodes(reference_dir: Path, candidate_dir: Path, tags: list[str], key: str,
                  samples: list[dict[str, np.ndarray]]) -> list[NodeError]:
    """Every float tensor the two models share by name, with its error over the samples, in
    the candidate's topological order."""
    reference, candidate = freeze(reference_dir, tags, key), freeze(candidate_dir, tags, key)
    errors = _matched(reference.graph, candidate.graph)
    fetches = [e.tensor for e in errors]
    with tf.compat.v1.Session(graph=reference.graph) as ref_session, \
            tf.compat.v1.Session(graph=candidate.graph) as cand_session:
        for sample in samples:
            ref_values = ref_session.run(fetches, {reference.inputs[k]: v for k, v in sample.items()})
            cand_values = cand_session.run(fetches, {candidate.inputs[k]: v for k, v in sample.items()})
            for error, ref, got in zip(errors, ref_values, cand_values):
                accumulate(error, np.asarray(ref), np.asarray(got))
    return errors


def _matched(reference: tf.Graph, candidate: tf.Graph) -> list[NodeError]:
    """The candidate's float tensors that the reference has under the same node name,
    output index and op type, each with its nearest compared inputs."""
    errors: dict[str, NodeError] = {}
    order = {op.name: i for i, op in enumerate(_topological(candidate))}
    for op in sorted(candidate.get_operations(), key=lambda o: order[o.name]):
        try:
            ref_op = reference.get_operation_by_name(op.name)
        except KeyError:
            continue
        if ref_op.type != op.type or op.type in PASS_OPS:
            continue
        for index, tensor in enumerate(op.outputs):
            if index >= len(ref_op.outputs) or not (tensor.dtype.is_floating and ref_op.outputs[index].dtype.is_floating):
                continue
            error = NodeError(op.name, op.type, tensor.dtype.name, index, order=order[op.name])
            errors[error.tensor] = error
    for error in errors.values():
        error.inputs = _nearest_compared(candidate.get_operation_by_name(error.node), errors)
    return list(errors.values())


def _nearest_compared(op: tf.Operation, compared: dict[str, Any]) -> list[str]:
    """The compared tensors feeding `op`, walking up through tensors that are not compared
    (the Casts a rewrite added, pass-through ops, integer plumbing)."""
    found, seen = [], set()
    stack = list(op.inputs)
    while stack:
        tensor = stack.pop()
        if tensor.name in seen:
            continue
        seen.add(tensor.name)
        if tensor.name in compared:
            found.append(tensor.name)
        else:
            stack.extend(tensor.op.inputs)
    return sorted(found)


def _topological(graph: tf.Graph) -> list[tf.Operation]:
    """The graph's operations, every op after its data and control inputs."""
    done: set[str] = set()
    out: list[tf.Operation] = []
    for start in graph.get_operations():
        stack = [(start, False)]
        while stack:
            op, expanded = stack.pop()
            if op.name in done:
                continue
            if expanded:
                done.add(op.name)
                out.append(op)
                continue
            stack.append((op, True))
            stack.extend((t.op, False) for t in op.inputs if t.op.name not in done)
            stack.extend((c, False) for c in op.control_inputs if c.name not in done)
    return out


def accumulate(error: NodeError, ref: np.ndarray, got: np.ndarray) -> None:
    """Fold one sample's reference and candidate values into the tensor's errors."""
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    if ref64.shape != got64.shape:
        error.max_abs_error = float("inf")  # a rewrite changed the shape: cannot be compared
        return
    finite = np.isfinite(ref64) & np.isfinite(got64)
    diff = np.abs(ref64 - got64, where=finite, out=np.zeros(ref64.shape))
    # NaN or a different infinity in one of them: as far out as it gets.
    mismatch = ~finite & ~((ref64 == got64) & np.isinf(ref64))
    worst = float("inf") if mismatch.any() else float(np.max(diff, initial=0.0))
    error.max_abs_error = max(error.max_abs_error, worst)
    error.max_reference = max(error.max_reference,
                              float(np.max(np.abs(ref64), where=np.isfinite(ref64), initial=0.0)))


def first_out_of_tolerance(errors: list[NodeError], rtol: float, atol: float) -> list[NodeError]:
    """The tensors out of tolerance whose compared inputs are all within it (where the error
    starts), in graph order."""
    by_tensor = {e.tensor: e for e in errors}
    first = [e for e in errors if not e.within(rtol, atol)
             and all(by_tensor[t].within(rtol, atol) for t in e.inputs if t in by_tensor)]
    return sorted(first, key=lambda e: e.order)


def contribution(error: NodeError, errors: list[NodeError]) -> float:
    """How much relative error the node adds: its own minus the largest of its inputs'."""
    by_tensor = {e.tensor: e for e in errors}
    before = max((by_tensor[t].max_rel_error for t in error.inputs if t in by_tensor), default=0.0)
    return error.max_rel_error - before
