"""Stage `verify`: the artifact must compute what the source computes, within tolerances.

Samples come from the representative dataset when the recipe has one, else `samples` seeded
random inputs drawn from each signature. A TPU-placed artifact runs through its CPU twin.
Writes `verify.json`; exceeding the tolerances fails the build with the measured errors.
An output holding NaN fails whatever the tolerances, and so does verifying on no samples:
a check that looked at nothing must not report "passed".
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, MODEL, SOURCE, StageContext, StageResult, StageSpec
from tpubuild.stages.selection import applied_transforms
from tpubuild.verify.verdict import (
    error_summary,
    raise_on_failure,
    random_check_samples,
    random_check_summary,
    tolerances,
    vacuous_warnings,
    verdict_inputs,
    verification_samples,
    write_json,
)

SPEC = StageSpec(
    "verify",
    runs_models=True,
    # The representative datasets, when there are any, are verify's samples.
    options=lambda r: {
        "tags": slices.tags(r),
        "applied": applied_transforms(r),
        **r["verify"],
        "representative_datasets": slices.verify_datasets(r),
    },
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(MODEL, SOURCE, DATASET),
    # Measured errors are floats that differ between CPUs and kernels.
    machine_dependent=lambda options: True,
)

VERIFY_JSON = "verify.json"


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.verify import compare
    from tpubuild.verify.serving_load import check_serving_load

    tags = options["tags"]
    applied = list(options.get("applied", []))
    kind, rtol, atol = tolerances(applied, options, "verify")
    source_dir = context.inputs["source"]
    source = SavedModel.load(source_dir, tags)
    artifact = SavedModel.load(input_dir, tags)
    keys = sorted(k for k in source.meta_graph.signature_def if k != INIT_OP_KEY)
    dropped = [k for k in keys if k not in artifact.meta_graph.signature_def]
    samples_by_key, origin = verification_samples(source, [k for k in keys if k not in dropped], options, context)
    if not samples_by_key:
        raise StageError("nothing to verify: no signature of the source is in the artifact")
    random_samples, skipped = random_check_samples(source, origin, options)
    sample_sets = [samples_by_key, *([random_samples] if random_samples else [])]
    del source, artifact  # the protos: only the loaded models below are needed now
    # What is published must load where it is served, not only in TF2's loader. Checked
    # first, while this process holds no other model: each model a process has loaded
    # leaves some of its footprint behind (memory.py), and this load set the
    # stage's peak when it came after the two others (ResNet50 bf16, in-process: stage
    # peak 901 MiB with it last, 831 MiB with it first; the load + save floor is 814).
    check_serving_load(input_dir, tags, "the TPU SavedModel")
    with tempfile.TemporaryDirectory(prefix=".twin-", dir=output_dir) as scratch:
        runnable = _runnable(input_dir, Path(scratch), tags, "tpu" in applied)
        try:
            # One model in memory at a time (compare.signature_outputs): the stage's peak is
            # one loaded model and the outputs, not the source and the artifact together.
            try:
                candidate = compare.signature_outputs(runnable, tags, sample_sets)
                reference = compare.signature_outputs(source_dir, tags, sample_sets)
            except ValueError as exc:
                if not random_samples:
                    raise
                # The random-input check is not part of the verdict: a model that cannot
                # take random inputs (ids past an embedding's rows) is judged on its dataset.
                random_samples, skipped, sample_sets = {}, str(exc), [samples_by_key]
                candidate = compare.signature_outputs(runnable, tags, sample_sets)
                reference = compare.signature_outputs(source_dir, tags, sample_sets)
            errors = compare.compare_all(reference[0], candidate[0], rtol, atol)
            random_errors = compare.compare_all(reference[1], candidate[1], rtol, atol) if random_samples else []
        except ValueError as exc:
            raise StageError(str(exc)) from None
    random_inputs = random_check_summary(random_samples, skipped, random_errors)
    summary = {
        "applied": applied,
        **error_summary(errors, (kind, rtol, atol), options, samples_by_key, origin),
        "signatures_not_in_artifact": dropped,
        "verdict_on": verdict_inputs(origin),
        **({"random_inputs": random_inputs} if random_inputs else {}),
    }
    write_json(output_dir / VERIFY_JSON, summary)
    try:
        raise_on_failure(errors, rtol, atol)
    except StageError as exc:
        if "bfloat16" not in applied and "quantize" not in applied:
            raise
        raise StageError(f"{exc}; `tpubuild explain-error` on this recipe names the ops where it starts and the "
                         "recipe change that fixes it") from None
    warnings = [f"signature {k!r} is not in the artifact; not verified" for k in dropped]
    warnings += vacuous_warnings(errors, rtol, atol)
    return StageResult(summary=summary, warnings=warnings)


def _runnable(artifact: Path, scratch: Path, tags: list[str], tpu_placed: bool) -> Path:
    """The artifact itself, or its CPU twin when functions were placed on the TPU."""
    if not tpu_placed:
        return artifact
    from tpubuild.tpu.twin import cpu_twin

    return cpu_twin(artifact, tags, scratch)


