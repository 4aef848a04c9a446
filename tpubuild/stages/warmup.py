"""Stage `warmup`: TF Serving warmup requests for the published SavedModels.

Writes `assets.extra/tf_serving_warmup_requests` (serving/warmup.py): one PredictRequest
per signature of the final model and per batch size the server will compile, filled
from verify's samples (the representative dataset, else seeded random inputs). The
publish step puts the file into the TPU SavedModel and into each SavedModel target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.serving import warmup
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, MODEL, TF_BASELINE, MemoryEstimate, StageContext, StageResult, StageSpec


def batch_sizes(recipe: dict[str, Any]) -> list[int]:
    """The batch sizes a batching server forms: allowed_batch_sizes, else max_batch_size
    (BatchFunction pads every batch to an allowed size, tensorflow/core/kernels/batching_util)."""
    batching = slices.converter(recipe)["batch_options"]
    if not batching:
        return []
    entry = batching[0]
    return sorted(set(entry.get("allowed_batch_sizes") or [entry["max_batch_size"]]))


# A bound, not a measurement: what warmup may hold is the final model's graph (parsed, a few
# times its saved_model.pb), the samples and one request at a time (written as it is made),
# at most MAX_REQUEST_BYTES (serving/warmup.py) with its serialization; no variable is read.
# (ResNet50 batched, issue 54: the worker measured 720 MiB at its peak, well inside it.)
WARMUP_MEMORY = MemoryEstimate(TF_BASELINE + 2 * warmup.MAX_REQUEST_BYTES, graph=4.0)

SPEC = StageSpec(
    "warmup",
    # No model runs here (the graph's signatures and verify's samples make the requests):
    # a pool stage, in the transforms' worker before verify (pipeline.py MAIN_STAGES).
    options=lambda r: {
        "tags": slices.tags(r),
        "batch_sizes": batch_sizes(r),
        "max_records": r.get("warmup", {}).get("max_records", 1000),
        # Asked for (a `warmup:` section) or on by default (batching): a default must not
        # fail a build that cannot fill requests (e.g. string inputs and no dataset).
        "requested": "warmup" in r,
        "samples": r["verify"]["samples"],
        "seed": r["verify"]["seed"],
        "representative_datasets": slices.verify_datasets(r),
    },
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(MODEL, DATASET),
    memory=WARMUP_MEMORY,
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.quantize import datasets
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.verify.verdict import verification_samples

    model = SavedModel.load(input_dir, options["tags"])
    if warmup.warmup_path(input_dir).is_file():
        return StageResult(summary={"requests": [], "kept": "the model's own"}, warnings=[
            f"the model already has {warmup.ASSETS_EXTRA}/{warmup.REQUESTS_FILE}; it is published as it is"])
    keys = sorted(k for k in model.meta_graph.signature_def if k != INIT_OP_KEY)
    sizes = {}
    for key in keys:
        specs = datasets.signature_inputs(model, key)
        static = {spec.shape[0] for spec in specs.values() if spec.shape and spec.shape[0] is not None}
        if len(static) > 1:
            raise StageError(f"warmup: signature {key!r}: inputs disagree on the batch dimension ({sorted(static)})")
        # A static batch dimension is the only size the signature takes.
        sizes[key] = sorted(static) if static else (options["batch_sizes"] or [1])
    try:
        samples_by_key, origin = verification_samples(model, keys, options, context)
    except StageError as exc:
        if options["requested"]:
            raise StageError(f"warmup: {exc}") from None
        return StageResult(summary={"requests": [], "skipped": str(exc)}, warnings=[
            f"warmup: no warmup requests written: {exc} (give verify.representative_datasets, or "
            "`warmup: {enabled: false}` to say so)"])
    try:
        # Each request written as it is made: one held at a time, not all of them.
        described = warmup.write(output_dir, warmup.requests(samples_by_key, sizes, options["max_records"]))
    except ValueError as exc:
        raise StageError(f"warmup: {exc}") from None
    # The worker goes on to verify (engine/loop.py _hands_on): what this stage allocated,
    # the samples and the graph, is handed back to the system first (memory.py).
    from tpubuild.memory import release_memory

    del model, samples_by_key
    release_memory(collect=False)
    for line in described:
        context.log(line)
    return StageResult(summary={"requests": described, "batch_sizes": sizes, "samples_from": origin})
