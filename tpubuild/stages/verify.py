"""Stage `verify`: the artifact must compute what the source computes, within tolerances.

Samples come from the representative dataset when the recipe has one, else `samples` seeded
random inputs drawn from each signature. A TPU-placed artifact runs through its CPU twin.
Writes `verify.json`; exceeding the tolerances fails the build with the measured errors.
An output holding NaN fails whatever the tolerances, and so does verifying on no samples:
a check that looked at nothing must not report "passed".
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import (
    DATASET,
    MODEL,
    SOURCE,
    StageContext,
    StageResult,
    StageSpec,
)
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

# A source this large or larger is loaded and run in a thread beside the rest of the
# stage (the serving-load check, the CPU twin's making, the artifact's load and run; the
# verdict is the same, only the order of the work changes): its
# run takes every core (TensorFlow's intra-op pool) while most of the rest runs on one (a
# v1 session's graph import and restore, protobuf edits, tf.saved_model.load's Python),
# so on 2 cores the stage takes about the longer of the two instead of their sum
# (BERT-base, 420 MiB, in-process: 7.8 s instead of 11.1 s). Its price is memory, two
# loaded models at once: for a model this large its weights dominate, and the stage stays
# within the peak goal of 3x the model + TensorFlow's own (BERT-base: 1,735 MiB against
# 2,033); for a small one TensorFlow's per-model and per-run memory dominates and the
# goal does not hold (ResNet50 bf16, 100 MiB: 1,068 MiB against 957), so it runs one
# model at a time. Which thread runs what changes no output.
SIDE_BY_SIDE_MIN_BYTES = 256 * 2**20


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.memory import release_memory
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
    samples_by_key, origin, random_samples, skipped = _drawn(source, [k for k in keys if k not in dropped], options,
                                                             context)
    if not samples_by_key:
        raise StageError("nothing to verify: no signature of the source is in the artifact")
    sample_sets = [samples_by_key, *([random_samples] if random_samples else [])]
    del source, artifact  # the protos: only the loaded models below are needed now
    tpu_placed = "tpu" in applied
    side_by_side = _tree_bytes(source_dir) >= SIDE_BY_SIDE_MIN_BYTES
    with tempfile.TemporaryDirectory(prefix=".twin-", dir=output_dir) as scratch, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpubuild-verify-source") as beside:
        # A large source runs beside all that follows (SIDE_BY_SIDE_MIN_BYTES). Else one
        # model at a time, and the serving-load check first, while this process holds no
        # other model: each model a process has loaded leaves some of its footprint behind
        # (memory.py), and this load set the stage's peak when it came after the two others
        # (ResNet50 bf16, in-process: stage peak 901 MiB with it last, 831 MiB with it
        # first; the load + save floor is 814).
        # Or its outputs are being computed beside the earlier stages (verify/reference.py):
        # the thread waits for them, and runs the source itself if they are not these samples'.
        if context.reference_dir is not None:
            source_run = beside.submit(_prefetched_or_run, context.reference_dir, source_dir, tags, sample_sets,
                                       context.log)
        elif side_by_side:
            source_run = beside.submit(compare.signature_outputs, source_dir, tags, sample_sets)
        else:
            source_run = None
        # What is published must load where it is served, not only in TF2's loader.
        check_serving_load(input_dir, tags, "the TPU SavedModel")
        runnable = _runnable(input_dir, Path(scratch), tags, tpu_placed)
        try:
            try:
                reference, candidate = _outputs(runnable, source_dir, tags, tpu_placed, sample_sets, source_run,
                                                context.log)
            except ValueError as exc:
                if not random_samples:
                    raise
                # The random-input check is not part of the verdict: a model that cannot
                # take random inputs (ids past an embedding's rows) is judged on its dataset.
                random_samples, skipped, sample_sets = {}, str(exc), [samples_by_key]
                if source_run is not None:
                    wait([source_run])  # one source in memory at a time
                release_memory()  # what the failed run loaded (cycles), before the retry loads again
                reference, candidate = _outputs(runnable, source_dir, tags, tpu_placed, sample_sets, None, context.log)
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
    warnings = [dropped_warning(k, applied) for k in dropped]
    warnings += vacuous_warnings(errors, rtol, atol)
    return StageResult(summary=summary, warnings=warnings)


def dropped_warning(key: str, applied: list[str]) -> str:
    """A source signature the artifact lacks: which stage dropped it when that is known
    (of the stages, only TF's quantizer writes fewer signatures than it reads: those of
    quantization_options.signature_keys), and that the artifact is what the warning is about."""
    if "quantize" in applied:
        why = ("the quantize stage dropped it, since TF's quantizer writes only the signatures in "
               "quantization_options.signature_keys (add it there to keep it)")
    else:
        why = "a conversion stage dropped it"
    return (f"signature {key!r} of the source is not in the artifact: {why}; the published model cannot serve "
            "it, and it was not verified")


def prefetch_reference(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """verify's source side, run beside the stages before verify (engine/beside.py) with
    verify's options and inputs but no model: the source's outputs on the samples verify will
    draw for every signature of the source (verify takes those of the signatures the artifact
    kept) and on the random-input check's, written for verify/reference.py take."""
    from tpubuild.memory import release_memory
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.verify import compare, reference

    tags = options["tags"]
    source_dir = context.inputs[SOURCE]
    source = SavedModel.load(source_dir, tags)
    keys = sorted(k for k in source.meta_graph.signature_def if k != INIT_OP_KEY)
    samples_by_key, _, random_samples, _ = _drawn(source, keys, options, context)
    del source
    release_memory()
    sample_sets = [samples_by_key, *([random_samples] if random_samples else [])]
    try:
        reference.write(output_dir, source_dir, tags, sample_sets, compare.signature_outputs(source_dir, tags, sample_sets))
    except ValueError as exc:  # verify runs the source itself, and says what it finds
        raise StageError(str(exc)) from None
    context.log(f"the source's outputs on {sum(len(s) for s in samples_by_key.values())} samples, for verify")
    return StageResult()


def _drawn(source: Any, keys: list[str], options: dict[str, Any],
           context: StageContext) -> tuple[dict[str, list[Any]], dict[str, str], dict[str, list[Any]], str | None]:
    """The samples of signatures `keys` of the source (its proto) and those of the random-input
    check: (samples by key, origin by key, random samples by key, why the random check is
    skipped). One drawing for verify and for its prefetch, which must draw the same."""
    samples_by_key, origin = verification_samples(source, keys, options, context)
    random_samples, skipped = random_check_samples(source, origin, options)
    return samples_by_key, origin, random_samples, skipped


def _prefetched_or_run(directory: Path, source_dir: Path, tags: list[str], sample_sets: list[dict[str, list[Any]]],
                       log: Callable[[str], None]) -> list[Any]:
    from tpubuild.verify import compare, reference

    taken = reference.take(directory, source_dir, tags, sample_sets, log)
    return taken if taken is not None else compare.signature_outputs(source_dir, tags, sample_sets)


def _outputs(runnable: Path, source_dir: Path, tags: list[str], tpu_placed: bool,
             sample_sets: list[dict[str, list[Any]]], source_run: Future | None,
             log: Callable[[str], None]) -> tuple[list[Any], list[Any]]:
    """(the source's outputs, the artifact's) on every set of samples: the source's from
    `source_run` when it runs beside (SIDE_BY_SIDE_MIN_BYTES), else computed first. The
    artifact (its CPU twin) runs last either way: it may stay loaded for report."""
    import tensorflow as tf

    from tpubuild.verify import compare

    if source_run is None:
        reference = compare.signature_outputs(source_dir, tags, sample_sets)
    model = tf.saved_model.load(str(runnable), tags=tags)
    candidate = compare.run_sample_sets(model, sample_sets)
    if source_run is not None:
        reference = source_run.result()
    if _keep_or_let_go(model, runnable, tags, tpu_placed):  # no other thread runs a model now
        log("the CPU twin stays loaded for report")
    return reference, candidate


def _keep_or_let_go(model: Any, runnable: Path, tags: list[str], tpu_placed: bool) -> bool:
    """A CPU twin stays loaded for report's HLO when verify's worker is handed on to report
    (tpu/twin.py keep_loaded), else it is let go like any model (compare.signature_outputs)."""
    from tpubuild.memory import release_memory
    from tpubuild.tpu.twin import keep_loaded

    if tpu_placed and keep_loaded(runnable, tags, model):
        # Kept, without what its runs left: the eager runtime's kernels and function
        # instantiations (report only traces it) and malloc's free pages (report's peak in
        # verify's worker, ResNet50 bf16: 940 MiB with them, 904 without; the goal is 957).
        from tensorflow.python.eager import context as eager_context

        eager_context.context().clear_kernel_cache()
        release_memory(collect=False)
        return True
    del model
    release_memory()
    return False


def _tree_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _runnable(artifact: Path, scratch: Path, tags: list[str], tpu_placed: bool) -> Path:
    """The artifact itself, or its CPU twin when functions were placed on the TPU."""
    if not tpu_placed:
        return artifact
    from tpubuild.tpu.twin import cpu_twin

    return cpu_twin(artifact, tags, scratch)
