"""bfloat16 stage: TPU functions (scope TPU) or every function (scope ALL) compute in bfloat16."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import ConversionError
from tpubuild.stages import slices
from tpubuild.stages.base import STREAMS_CHECKPOINT, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "bfloat16",
    options=lambda r: {
        "tags": slices.tags(r),
        "tpu_functions": slices.converter(r)["tpu_functions"],
        "bfloat16_optimization_options": slices.converter(r)["bfloat16_optimization_options"],
    },
    # XlaCallModule computations are rewritten and serialized with jax's MLIR bindings
    # (transforms/stablehlo_bfloat16.py): the installed jax and jaxlib can change such an
    # output, and whether they are installed at all decides whether it is rewritten. They are
    # discovered inputs of the runs that met an XlaCallModule, not options of every run: a
    # model without one builds the same with or without jax installed.
    reports_inputs=True,
    memory=STREAMS_CHECKPOINT,  # its peak memory (stages/base.py, measured there)
)

# The distributions whose versions key a bfloat16 run that rewrote StableHLO.
STABLEHLO_DISTRIBUTIONS = ("jax", "jaxlib")


def _installed_versions() -> dict[str, str]:
    """`dist:<name>` -> installed version, or ABSENT: what the resolver compares them with."""
    from tpubuild.digests import dist_input

    return dict(dist_input(name) for name in STABLEHLO_DISTRIBUTIONS)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """Convert the scope's float32 ops and the variables they read to bfloat16."""
    from tpubuild.savedmodel import checkpoint
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.transforms import bfloat16

    settings = options["bfloat16_optimization_options"]
    model = SavedModel.load(Path(input_dir), options["tags"])
    if settings["scope"] == "ALL":
        scope = set(model.functions) - bfloat16.saver_functions(model)
    else:
        scope = tpu_scope(model, options["tpu_functions"])
    if not settings.get("skip_safety_checks", False):
        bfloat16.check_no_bfloat16(model, scope)
    plan = bfloat16.convert(model, scope, settings.get("filterlist", []))
    keys = checkpoint.checkpoint_keys(model, set(plan.variables))
    # The TPU runtime's rules hold after every rewrite of a TPU body, not only after placement.
    from tpubuild.tpu.runtime_check import enforce

    rule_warnings = enforce(model)
    model.save(Path(output_dir))
    if keys:
        checkpoint.write_bfloat16(Path(input_dir), Path(output_dir), keys)
    summary = {"scope": settings["scope"], **plan.summary()}
    context.log(
        f"bfloat16: {sum(plan.converted_ops.values())} ops and {len(plan.variables)} variables "
        f"in {len(scope)} functions"
    )
    discovered = _installed_versions() if plan.xla_call_modules else {}
    return StageResult(summary=summary, warnings=plan.warnings + rule_warnings, discovered=discovered)


def tpu_scope(model: Any, tpu_functions: list[dict[str, Any]]) -> set[str]:
    """Functions that run on the TPU: bodies of TPUPartitionedCall and all they call.

    The graph decides (the tpu stage ran before this one and TPU computations that were
    already in the model count too); a model that skipped placement falls back to the
    functions the recipe names.
    """
    from tpubuild.tpu.functions import resolve_tpu_functions

    roots = {
        node.attr["f"].func.name
        for fdef in model.functions.values()
        for node in fdef.node_def
        if node.op == "TPUPartitionedCall"
    }
    if not roots and tpu_functions:
        roots = {f.name for f in resolve_tpu_functions(model, tpu_functions)}
    if not roots:
        raise ConversionError(
            "bfloat16: scope TPU but the model has no TPU function; set "
            "bfloat16_optimization_options.scope to ALL or name tpu_functions"
        )
    return roots.union(*(model.reachable(r) for r in roots))
