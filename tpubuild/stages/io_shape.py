"""IO-shape stage: rank-2 transfer layouts for tensors entering and leaving TPU functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages import slices
from tpubuild.stages.base import GRAPH_ONLY, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "io_shape",
    options=lambda r: {"tags": slices.tags(r), "tpu_functions": slices.converter(r)["tpu_functions"]},
    memory=GRAPH_ONLY,  # its peak memory (stages/base.py, measured there)
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """Reshape around every TPUPartitionedCall made from CPU code; outputs stay identical."""
    from tpubuild.savedmodel.fnedit import TPU_CALL
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.transforms import io_shape

    model = SavedModel.load(Path(input_dir), options["tags"])
    # The graph is the source of truth: the tpu stage made every call of a TPU function a
    # TPUPartitionedCall. Calls made inside TPU code transfer nothing, so they are skipped.
    sites: dict[str, list[tuple[str, str]]] = {}
    bodies = {
        n.attr["f"].func.name
        for f in model.functions.values()
        for n in f.node_def
        if n.op == TPU_CALL
    }
    tpu_code = set(bodies).union(*(model.reachable(b) for b in bodies))
    for caller, fdef in sorted(model.functions.items()):
        if caller in tpu_code:
            continue
        for node in fdef.node_def:
            if node.op == TPU_CALL:
                sites.setdefault(node.attr["f"].func.name, []).append((caller, node.name))
    functions, warnings = [], []
    for fn, calls in sorted(sites.items()):
        plan = io_shape.plan_function(model, fn)
        wrapper = None
        if plan.inputs or plan.outputs:
            # Replaced, not duplicated, when nothing else calls it: the alias then names
            # the function the TPU runs, and a quantized body's weights are stored once.
            wrapper = io_shape.make_wrapper(model, plan, io_shape.called_only_at(model, fn, calls))
            for caller, node in calls:
                io_shape.rewrite_site(model, caller, node, plan, wrapper)
        warnings += [
            f"io_shape: {model.describe(fn)} {why}" for why in plan.left if "unknown" in why
        ]
        functions.append(plan.summary(wrapper, [{"caller": c, "node": n} for c, n in calls]))
    # The TPU runtime's rules hold after every rewrite of a TPU body, not only after placement.
    from tpubuild.tpu.runtime_check import enforce

    rule_warnings = enforce(model)
    model.save(Path(output_dir))
    context.log(f"io_shape: {sum(bool(f['wrapper']) for f in functions)} TPU functions reshaped")
    return StageResult(summary={"functions": functions}, warnings=warnings + rule_warnings)
