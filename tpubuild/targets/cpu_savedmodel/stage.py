"""Stage `cpu_savedmodel` (target cpu_savedmodel): a servable CPU SavedModel.

The CPU twin of the final TPU artifact (tpu/twin.py: TPU call sites back to
ordinary calls; BatchFunction, bfloat16 casts and IO reshapes kept), with, when
`optimize` is true, Grappler's machine-independent passes applied to its functions at
build time (savedmodel/grappler.py). Its output directory is the SavedModel alone, so it
is published as it is at `<output_dir>/<recipe>/cpu_savedmodel/<N>/` (a TF Serving version
directory); the facts (node counts) are the stage's summary, which the manifest carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.stages import slices
from tpubuild.stages.base import MODEL, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "cpu_savedmodel",
    # Only what shapes the artifact: a tolerance change reruns the verify stage alone.
    options=lambda r: {"tags": slices.tags(r), "optimize": slices.targets(r)["cpu_savedmodel"]["optimize"]},
    consumes=(MODEL,),
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.tpu.twin import untpu

    model = SavedModel.load(Path(input_dir), options["tags"])
    counts = untpu(model)
    summary: dict[str, Any] = {"tpu_calls_undone": counts["calls"], "optimized": bool(options["optimize"])}
    if options["optimize"]:
        from tpubuild.savedmodel.grappler import optimize_functions

        grappler = optimize_functions(model)
        summary["grappler"] = grappler
        before, after = grappler["nodes"]
        context.log(f"cpu_savedmodel: Grappler: {before} -> {after} nodes in {len(grappler['functions'])} functions")
    model.save(Path(output_dir))
    return StageResult(summary=summary)
