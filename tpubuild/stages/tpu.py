"""The `tpu` stage: check the TPU functions, then place them on the TPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages import slices
from tpubuild.stages.base import GRAPH_ONLY, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "tpu",
    options=lambda r: {
        "tags": slices.tags(r),
        "tpu_functions": slices.converter(r)["tpu_functions"],
        "xla_sharding_options": slices.converter(r).get("xla_sharding_options"),
        # Unbatched TPU calls with a dynamic batch dimension get a recompilation warning.
        "batched": bool(slices.converter(r)["batch_options"]),
    },
    memory=GRAPH_ONLY,  # its peak memory (stages/base.py, measured there)
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """Resolve `tpu_functions`, run the compatibility checks, write the placed SavedModel."""
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.compatibility import check_tpu_functions
    from tpubuild.tpu.functions import resolve_tpu_functions
    from tpubuild.tpu.placement import place_on_tpu, refuse_placed_model
    from tpubuild.tpu.runtime_check import enforce

    model = SavedModel.load(Path(input_dir), options.get("tags"))
    refuse_placed_model(model)
    functions = resolve_tpu_functions(model, options["tpu_functions"])
    # Checks run on the untouched model and before anything is written.
    warnings = check_tpu_functions(model, functions)
    placements, place_warnings = place_on_tpu(model, functions, options.get("xla_sharding_options"))
    # Post-condition: the TPU runtime's rules (structure, types, resources) and TF's MLIR
    # clustering bridge accept every TPU body; a violation fails the stage before writing.
    rule_warnings = enforce(model)
    if not options.get("batched"):
        from tpubuild.transforms import batch_checks

        rule_warnings += batch_checks.recompilation_warnings(model)
    model.save(Path(output_dir))
    # A Keras export given as `saved_model:` still holds Keras's list of variable aliases
    # (the export stage drops it from the models it writes): one object per weight from
    # here on, so no later stage keeps a float32 copy of a weight it converts.
    from tpubuild.savedmodel.alias_variables import drop_alias_lists_in_place

    aliases = drop_alias_lists_in_place(Path(output_dir))
    for placement in placements:
        sites = ", ".join(f"{s['caller']}/{s['node']}" for s in placement.call_sites) or "none"
        context.log(f"tpu: placed {placement.alias or placement.function} (call sites: {sites})")
    summary: dict[str, Any] = {"placed": [p.to_json() for p in placements]}
    if aliases:
        summary["removed_alias_objects"] = aliases
    return StageResult(
        summary=summary,
        warnings=[*warnings, *place_warnings, *rule_warnings],
    )
