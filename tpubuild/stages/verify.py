"""Stage `verify`: the artifact must compute what the source computes, within tolerances.

Samples come from the representative dataset when the recipe has one, else `samples` seeded
random inputs drawn from each signature. A TPU-placed artifact runs through its CPU twin.
One model at a time: the source's outputs on every sample first, the source let go, then
the artifact's. A batched artifact (`batch_sizes`, from batch_options) is called at every
batch size on the samples grouped into batches, each against the same source outputs
(issue 54: in-process side by side, BERT-base's verify peaked at ~1,870 MiB; one at a time
~1,570, and no slower measured on a shared 2-core machine: 15.9/17.6/18.0 s before, 15.7/26.4/9.0 s).
Writes `verify.json`; exceeding the tolerances fails the build with the measured errors.
An output holding NaN fails whatever the tolerances, and so does verifying on no samples:
a check that looked at nothing must not report "passed".
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
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
from tpubuild.stages.warmup import batch_sizes
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
        # A batched model is called at every batch size its server forms (stages/warmup.py).
        **({"batch_sizes": batch_sizes(r)} if batch_sizes(r) else {}),
    },
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(MODEL, SOURCE, DATASET),
    # Measured errors are floats that differ between CPUs and kernels.
    machine_dependent=lambda options: True,
)

VERIFY_JSON = "verify.json"


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.memory import release_memory
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel
    from tpubuild.verify.serving_load import check_serving_load

    tags = options["tags"]
    applied = list(options.get("applied", []))
    kind, rtol, atol = tolerances(applied, options, "verify")
    sizes = list(options.get("batch_sizes", []))
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
    if context.reference_dir is not None:
        from tpubuild.verify.reference import wait_ended

        # The worker beside holds the source until it has written its outputs and exited:
        # no model is loaded here before (one copy of the model in memory at a time).
        wait_ended(context.reference_dir)
    with tempfile.TemporaryDirectory(prefix=".twin-", dir=output_dir) as scratch:
        # One model at a time, and the serving-load check first, while this process holds
        # no other model: each model a process has loaded leaves some of its footprint
        # behind (memory.py), and this load set the stage's peak when it came after the two
        # others (ResNet50 bf16, in-process: stage peak 901 MiB with it last, 831 MiB with it
        # first; the load + save floor is 814).
        # What is published must load where it is served, not only in TF2's loader.
        check_serving_load(input_dir, tags, "the TPU SavedModel")
        runnable = _runnable(input_dir, Path(scratch), tags, tpu_placed)
        try:
            try:
                reference, candidate = _outputs(runnable, source_dir, tags, tpu_placed, sample_sets, sizes,
                                                context.reference_dir, context.log)
            except ValueError as exc:
                if not random_samples:
                    raise
                # The random-input check is not part of the verdict: a model that cannot
                # take random inputs (ids past an embedding's rows) is judged on its dataset.
                random_samples, skipped, sample_sets = {}, str(exc), [samples_by_key]
                release_memory()  # what the failed run loaded (cycles), before the retry loads again
                reference, candidate = _outputs(runnable, source_dir, tags, tpu_placed, sample_sets, sizes, None,
                                                context.log)
            errors, batch_calls = _compared(reference[0], candidate[0], rtol, atol)
            random_errors = _compared(reference[1], candidate[1], rtol, atol)[0] if random_samples else []
        except ValueError as exc:
            raise StageError(str(exc)) from None
    random_inputs = random_check_summary(random_samples, skipped, random_errors)
    summary = {
        "applied": applied,
        **error_summary(errors, (kind, rtol, atol), options, samples_by_key, origin),
        "signatures_not_in_artifact": dropped,
        "verdict_on": verdict_inputs(origin),
        **({"random_inputs": random_inputs} if random_inputs else {}),
        # A batched model: each signature's calls at every batch size its server forms.
        **({"batch_calls": batch_calls} if sizes else {}),
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
    warnings += [f"verify: signature {key!r} was called on each sample alone, not in batches: {calls['not_batched']}"
                 for key, calls in sorted(batch_calls.items()) if "not_batched" in calls]
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


@dataclass
class _Runs:
    """The artifact's outputs for one signature on one set of samples, per sample as
    compare.run_signature stacks them: by the batch size of its calls (None: each sample
    alone); the batched runs; why it was not called in batches, if it was not."""

    outputs: dict[int | None, dict[str, Any]]
    batched: list[Any] = field(default_factory=list)
    not_batched: str | None = None


Candidate = dict[str, _Runs]


def _outputs(runnable: Path, source_dir: Path, tags: list[str], tpu_placed: bool,
             sample_sets: list[dict[str, list[Any]]], sizes: list[int], reference_dir: Path | None,
             log: Callable[[str], None]) -> tuple[list[Any], list[Candidate]]:
    """(the source's outputs, the artifact's) on every set of samples, one model loaded at a
    time: the source's first (taken from `reference_dir` when they were computed beside the
    earlier stages, engine/beside.py; else computed here), the source let go, then the
    artifact (its CPU twin): on each sample alone, or, batched (`sizes`), at every batch size
    on the same samples grouped into batches, against the same source outputs. The artifact
    runs last: it may stay loaded for report."""
    import tensorflow as tf

    from tpubuild.verify import compare

    if reference_dir is not None:  # waits for the worker beside, if it still runs
        reference = _prefetched_or_run(reference_dir, source_dir, tags, sample_sets, log)
    else:
        reference = compare.signature_outputs(source_dir, tags, sample_sets)  # the source let go when it returns
    model = tf.saved_model.load(str(runnable), tags=tags)
    candidate = []
    for samples_by_key in sample_sets:
        missing = sorted(k for k in samples_by_key if k not in model.signatures)
        if missing:
            raise ValueError(f"the artifact has no signature {missing[0]!r}")
        by_key: Candidate = {}
        for key, samples in sorted(samples_by_key.items()):
            why = compare.batch_dimension_problem(model, key, samples) if sizes else None
            if sizes and why is None:
                try:
                    batched = [_trimmed(compare.run_signature_batched(model, key, samples, size)) for size in sizes]
                    by_key[key] = _Runs({run.batch_size: run.outputs for run in batched}, batched)
                    continue
                except compare.NotBatchMajor as exc:
                    why = str(exc)
            by_key[key] = _Runs({None: compare.run_signature(model, key, samples)}, not_batched=why)
        candidate.append(by_key)
    if sizes:
        log("verify called the artifact in batches of " + ", ".join(map(str, sizes)) + " rows")
    if _keep_or_let_go(model, runnable, tags, tpu_placed):
        log("the CPU twin stays loaded for report")
    return reference, candidate


def _trimmed(run: Any) -> Any:
    """`run`, once the memory its calls freed is handed back (memory.py): each batch size's
    activations are freed pages in malloc's arenas after it, under the next, larger one's
    (ResNet50 batched, sizes 4, 8, 16, in-process: verify's peak 1,184 MiB with, 1,232 without)."""
    from tpubuild.memory import release_memory

    release_memory(collect=False)
    return run


def _compared(reference: dict[str, dict[str, Any]], candidate: Candidate, rtol: float,
              atol: float) -> tuple[list[Any], dict[str, Any]]:
    """Every output of every signature compared with the source's, at every batch size the
    artifact was called at; (for each output its worst comparison, the batch calls made per
    signature). Whatever the batch size, the same source outputs and tolerances."""
    from tpubuild.verify import compare

    errors: list[Any] = []
    calls: dict[str, Any] = {}
    for key in sorted(reference):
        worst: dict[str, Any] = {}
        runs = candidate[key]
        found = {}
        for size, outputs in runs.outputs.items():
            found[size] = compare.compare_outputs(key, reference[key], outputs, rtol, atol)
            for error in found[size]:
                error.batch_size = size
                if error.output not in worst or _excess(error, rtol, atol) > _excess(worst[error.output], rtol, atol):
                    worst[error.output] = error
        errors += [worst[name] for name in sorted(worst)]
        if runs.not_batched is not None:
            calls[key] = {"not_batched": runs.not_batched}
        elif runs.batched:
            calls[key] = {"sizes": [
                {"batch_size": run.batch_size, "calls": run.calls, "padded_rows": run.padded_rows,
                 "max_abs_error": max((e.max_abs_error for e in found[run.batch_size]), default=0.0),
                 "passed": all(e.passed for e in found[run.batch_size])}
                for run in runs.batched]}
    return errors, calls


def _excess(error: Any, rtol: float, atol: float) -> tuple[int, int, float]:
    """How badly a comparison fails, to pick an output's worst batch size: NaN first, then
    elements outside the tolerance, then how far past its bound the largest error is."""
    return (error.nan_in_artifact + error.nan_in_source, error.mismatched,
            error.max_abs_error - (atol + rtol * error.max_reference))


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


def _runnable(artifact: Path, scratch: Path, tags: list[str], tpu_placed: bool) -> Path:
    """The artifact itself, or its CPU twin when functions were placed on the TPU."""
    if not tpu_placed:
        return artifact
    from tpubuild.tpu.twin import cpu_twin

    return cpu_twin(artifact, tags, scratch)
