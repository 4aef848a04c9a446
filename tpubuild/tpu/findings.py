"""A finding of the TPU checks (a rule a TPU function breaks or leans on), and which
functions the checks look at: shared by the runtime rules and the MLIR bridge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.placement import TPU_CALL

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One rule a TPU function breaks (error) or leans on (warning)."""

    severity: str  # ERROR or WARNING
    rule: str  # undeclared-output, one-cluster, metadata, dtype, xla-kernel, resource-argument, nested-tpu-call, xla-call-module-platform, mlir-bridge
    function: str  # the TPU body (the function TPUPartitionedCall names)
    node: str | None  # the offending node (in `function`, or "callee/node" in a function it calls)
    message: str

    def __str__(self) -> str:
        where = f", node {self.node}" if self.node else ""
        return f"tpu function {self.function}{where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "rule": self.rule, "function": self.function,
                "node": self.node, "message": self.message}


def tpu_bodies(model: SavedModel) -> list[str]:
    """Functions named by a TPUPartitionedCall anywhere: the graph and every library function."""
    holders = [model.meta_graph.graph_def.node, *(f.node_def for f in model.functions.values())]
    return sorted({n.attr["f"].func.name for nodes in holders for n in nodes if n.op == TPU_CALL})
