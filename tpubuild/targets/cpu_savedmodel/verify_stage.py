"""Stage `cpu_savedmodel_verify`: the CPU SavedModel computes what the source computes,
and how fast it loads and answers next to the source.

Samples and tolerances are verify's (verify/verdict.py: verification_samples, tolerances):
the target's `rtol`/`atol`, else verify's, else the defaults for the stages that changed
the model. Writes `cpu_savedmodel_verify.json`; exceeding the tolerances or a NaN fails
the build with one line (verdict.raise_on_failure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, SOURCE, StageContext, StageResult, StageSpec
from tpubuild.stages.selection import applied_transforms
from tpubuild.verify.verdict import (
    error_summary,
    raise_on_failure,
    tolerances,
    vacuous_warnings,
    verification_samples,
    write_json,
)

TARGET = "cpu_savedmodel"


def _options(recipe: dict[str, Any]) -> dict[str, Any]:
    options = slices.target_options(recipe, TARGET)
    for key in ("rtol", "atol"):  # the TPU artifact's tolerances hold for its CPU twin too
        if options.get(key) is None:
            options[key] = recipe["verify"].get(key)
    return {**options, "applied": applied_transforms(recipe)}


SPEC = StageSpec(
    "cpu_savedmodel_verify",
    runs_models=True,
    options=_options,
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(SOURCE, DATASET, TARGET),
    machine_dependent=lambda options: True,  # measured errors and latencies
)

VERIFY_JSON = "cpu_savedmodel_verify.json"
RUNS, CALLS = 5, 50  # loads, calls (verify/latency.py)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.report import params
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.verify import compare, latency
    from tpubuild.verify.serving_load import check_serving_load

    tags = options["tags"]
    kind, rtol, atol = tolerances(list(options["applied"]), options, f"targets.{TARGET}")
    source_dir, artifact_dir = context.inputs[SOURCE], context.inputs[TARGET]
    source = SavedModel.load(source_dir, tags)
    artifact = SavedModel.load(artifact_dir, tags)
    keys = sorted(k for k in source.meta_graph.signature_def
                  if k != INIT_OP_KEY and k in artifact.meta_graph.signature_def)
    if not keys:
        raise StageError("nothing to verify: no signature of the source is in the CPU SavedModel")
    samples_by_key, origin = verification_samples(source, keys, options, context)
    try:
        errors = compare.compare_models(source_dir, artifact_dir, tags, samples_by_key, rtol, atol)
    except ValueError as exc:
        raise StageError(str(exc)) from None
    timing = {"source": latency.measure(source_dir, tags, samples_by_key, RUNS, CALLS),
              TARGET: latency.measure(artifact_dir, tags, samples_by_key, RUNS, CALLS)}
    summary = {
        "target": TARGET,
        # `passed` is False for NaN too (OutputError.passed).
        **error_summary(errors, (kind, rtol, atol), options, samples_by_key, origin),
        "size": params.sizes(artifact_dir)["total"],
        "latency": {
            "method": (f"loads: median of up to {RUNS} fresh tf.saved_model.load (fewer once they took "
                       f"{latency.BUDGET_SECONDS:g} s); calls: " + latency.METHOD.format(calls=CALLS)),
            "load_seconds": {side: t["load_seconds"] for side, t in timing.items()},
            "call_seconds": {side: t["call_seconds"] for side, t in timing.items()},
        },
    }
    write_json(output_dir / VERIFY_JSON, summary)
    raise_on_failure(errors, rtol, atol)
    # What is published must load where it is served, not only in TF2's loader.
    check_serving_load(artifact_dir, tags, "the CPU SavedModel")
    return StageResult(summary=summary, warnings=vacuous_warnings(errors, rtol, atol, "targets.cpu_savedmodel"))
