"""What every verifier shares (verify, and each target's verify stage): the samples,
the tolerances, the one-line failures, and the summary written as `verify.json`.

Each verifier runs the same samples (the representative dataset's first `samples`
records, else seeded random inputs) and reports the same way, so the targets' errors sit
side by side in the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from tpubuild.errors import StageError


class StageContext(Protocol):
    """What a verifier reads of its stage's context (stages/base.py StageContext, which
    stands above this module): the workspace root and the consumed outputs by role."""

    workspace: Path
    inputs: dict[str, Path]


def tolerances(applied: list[str], options: dict[str, Any], where: str) -> tuple[str, float, float]:
    """(kind, rtol, atol): the defaults for the stages that changed the model
    (compare.default_tolerances, e.g. `applied=["quantize"]` for int8), overridden by the
    `rtol`/`atol` of `options`. `where` names the recipe field in errors."""
    from tpubuild.verify import compare

    kind, rtol, atol = compare.default_tolerances(applied)
    try:
        # The schema refuses these too; a NaN bound would make every comparison pass.
        if options.get("rtol") is not None:
            rtol = compare.checked_tolerance(f"{where}.rtol", options["rtol"])
        if options.get("atol") is not None:
            atol = compare.checked_tolerance(f"{where}.atol", options["atol"])
    except ValueError as exc:
        raise StageError(str(exc)) from None
    return kind, rtol, atol


def verification_samples(source: Any, keys: list[str], options: dict[str, Any],
                         context: StageContext) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """The samples every verifier runs (verify, and each target's verify stage): for each
    signature key, the first `samples` records of its representative dataset when the
    recipe has one, else `samples` random inputs seeded with `seed`. Returns (samples by
    key, origin by key). Every record of a dataset is read and checked (a bad or truncated
    tail is an error); a signature with no samples is an error: a check that looked at
    nothing must not pass."""
    from tpubuild.quantize import datasets

    samples_by_key, origin = {}, {}
    files = dataset_files(options, context)
    for key in keys:
        specs = datasets.signature_inputs(source, key)
        if key in files:
            label = f"representative_datasets.{key}: {files[key].name}"
            samples = [
                datasets.check_sample(sample, specs, f"{label}: sample {i}")
                for i, sample in enumerate(datasets.read_tfrecord(files[key], label))
            ][: options["samples"]]
            origin[key] = "representative_dataset"
        else:
            try:
                samples = datasets.random_samples(specs, options["samples"], options["seed"])
            except StageError as exc:
                raise StageError(f"signature {key!r}: {exc}") from None
            origin[key] = "random"
        if not samples:
            raise StageError(f"signature {key!r}: no samples to verify on")
        samples_by_key[key] = samples
    return samples_by_key, origin


def error_summary(errors: list[Any], tolerance: tuple[str, float, float], options: dict[str, Any],
                  samples_by_key: dict[str, list[Any]], origin: dict[str, str]) -> dict[str, Any]:
    """What every verifier (verify, and each target's verify stage) says of a comparison:
    the tolerance used (and the one the recipe gave), the samples, each output's errors,
    the worst errors and the verdict."""
    kind, rtol, atol = tolerance
    return {
        "tolerance": {"kind": kind, "rtol": rtol, "atol": atol,
                      "given": {"rtol": options.get("rtol"), "atol": options.get("atol")}},
        "samples": {key: {"count": len(s), "from": origin[key]} for key, s in samples_by_key.items()},
        "outputs": [e.as_dict() for e in errors],
        "max_abs_error": max((e.max_abs_error for e in errors), default=0.0),
        "max_rel_error": max((e.max_rel_error for e in errors), default=0.0),
        "passed": all(e.passed for e in errors),
        # Outputs whose comparison could not fail (vacuous_warnings): not verified.
        "vacuous": [f"{e.signature}/{e.output}" for e in errors if is_vacuous(e, rtol, atol)],
    }


def is_vacuous(error: Any, rtol: float, atol: float) -> bool:
    """An artifact returning zeros would pass: |0 - b| <= atol + rtol * max|b| for every
    source value b. Never for an output compared exactly (integers, bools, strings: any
    difference fails) nor for one holding NaN (which fails anyway)."""
    return bool(error.elements and not error.exact and error.max_reference <= atol + rtol * error.max_reference
                and not (error.nan_in_artifact or error.nan_in_source))


def vacuous_warnings(errors: list[Any], rtol: float, atol: float, where: str = "verify") -> list[str]:
    """One warning per output whose reference is so small next to the tolerance that an
    artifact returning zeros would pass: |0 - b| <= atol + rtol * max|b| for every b. A
    check that cannot fail is not a verification, and the report must not say it is."""
    return [
        f"{where}: signature {e.signature!r} output {e.output!r}: the source's outputs are at most "
        f"{e.max_reference:.3g}, within the tolerance (atol {atol:g}, rtol {rtol:g}): an artifact returning "
        "zeros would pass, so this comparison says nothing; give this recipe a smaller atol"
        for e in errors
        if is_vacuous(e, rtol, atol)
    ]


def raise_on_failure(errors: list[Any], rtol: float, atol: float, prefix: str = "") -> None:
    """A StageError of one line when an output holds NaN (whatever the tolerances) or
    differs from the source beyond them (the worst output, by how far it is out)."""
    with_nan = [e for e in errors if e.nan_in_artifact or e.nan_in_source]
    if with_nan:
        raise StageError(prefix + describe_nan(with_nan[0]))
    failed = [e for e in errors if e.mismatched]
    if failed:
        worst = max(failed, key=lambda e: e.max_abs_error - (atol + rtol * e.max_reference))
        raise StageError(prefix + describe_failure(worst, rtol, atol))


def describe_failure(error: Any, rtol: float, atol: float) -> str:
    """One line with the measured error and the bound it broke."""
    bound = atol + rtol * error.max_reference
    batched = getattr(error, "batch_size", None)
    where = f" in batches of {batched} rows" if batched is not None else ""
    text = (
        f"signature {error.signature!r} output {error.output!r}{where} differs from the source: "
        f"max abs error {error.max_abs_error:.4g} > {bound:.4g} (atol {atol:g} + rtol {rtol:g} "
        f"x max|output| {error.max_reference:.4g}); max rel error {error.max_rel_error:.4g}, "
        f"{error.mismatched}/{error.elements} elements outside"
    )
    if error.argmax_agreement is not None:
        text += f", argmax agreement {error.argmax_agreement:.1%}"
    return text


def describe_nan(error: Any) -> str:
    """One line naming the output and how many of its values are NaN, in each model."""
    return (
        f"signature {error.signature!r} output {error.output!r}: {error.nan_in_artifact} of {error.elements} "
        f"values are NaN in the artifact, {error.nan_in_source} in the source; NaN never passes verification"
    )


def dataset_files(options: dict[str, Any], context: StageContext) -> dict[str, Path]:
    from tpubuild.quantize.datasets import dataset_paths

    return dataset_paths(options, context) if options.get("representative_datasets") else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    from tpubuild.atomic import write_atomic

    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def random_check_samples(source: Any, origin: dict[str, str],
                         options: dict[str, Any]) -> tuple[dict[str, list[Any]], str | None]:
    """The seeded random inputs of the check beside the verdict, for the signatures the
    verdict judged on their representative dataset: the report shows both errors, so a
    tolerance met only on realistic data (or only on noise) is visible. Not part of the
    verdict. (samples by key, why the check is skipped); both empty when the verdict itself
    used random inputs."""
    from tpubuild.quantize import datasets

    keys = sorted(k for k, where in origin.items() if where == "representative_dataset")
    samples = {}
    try:
        for key in keys:
            samples[key] = datasets.random_samples(datasets.signature_inputs(source, key), options["samples"],
                                                   options["seed"])
    except StageError as exc:  # e.g. a string input random values cannot fill
        return {}, f"signature {key!r}: {exc}"
    return samples, None


def random_check_summary(samples: dict[str, list[Any]], skipped: str | None,
                         errors: list[Any]) -> dict[str, Any] | None:
    """What verify.json says of the random-input check (random_check_samples)."""
    if skipped:
        return {"skipped": skipped}
    if not samples:
        return None
    return {
        "signatures": sorted(samples),
        "max_abs_error": max((e.max_abs_error for e in errors), default=0.0),
        "max_rel_error": max((e.max_rel_error for e in errors), default=0.0),
        "within_tolerance": all(e.passed for e in errors),
        "outputs": [e.as_dict() for e in errors],
    }


def verdict_inputs(origin: dict[str, str]) -> str:
    """Which inputs the verdict was taken on: `representative_dataset`, `random`, or `mixed`."""
    kinds = set(origin.values())
    return kinds.pop() if len(kinds) == 1 else "mixed"
