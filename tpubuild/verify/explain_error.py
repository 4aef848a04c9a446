"""`tpubuild explain-error`: which ops of the bfloat16 stage make the artifact differ from
its source, and the filterlist that brings it within tolerance.

The stage's input and its cached output are compared node by node on the verification
samples (verify/node_errors.py). The op types where the error starts are added to
`bfloat16_optimization_options.filterlist` one round at a time, the bfloat16 stage's own
`run` converts the stage's input again with that filterlist, and the result is compared
with the source as `verify` compares it, until it is within tolerance. The error is
measured on the bfloat16 stage's output: the stages after it (io_shape, batch) reshape
and wrap, they do not round.

Everything is written under a scratch directory; nothing in the cache or `out/` changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.verify.node_errors import NodeError, compare_nodes, contribution, first_out_of_tolerance

MAX_ROUNDS = 4  # filterlist rounds before giving up (each converts and verifies once)


@dataclass
class Attempt:
    """A filterlist tried, and what verification measures with it."""

    filterlist: list[str]
    max_rel_error: float
    worst_output: str
    passed: bool


@dataclass
class Explanation:
    stage: str
    tolerance: tuple[float, float]  # rtol, atol
    samples: dict[str, int]
    output_error: Attempt  # the cached stage output against the source
    first: dict[str, list[NodeError]] = field(default_factory=dict)  # signature -> where the error starts
    contributions: dict[str, float] = field(default_factory=dict)  # tensor -> relative error added
    attempts: list[Attempt] = field(default_factory=list)
    compared: int = 0  # tensors compared in all
    note: str = ""
    option: str = ""  # the recipe option the attempts change

    @property
    def proposal(self) -> Attempt | None:
        return next((a for a in self.attempts if a.passed), None)


def verify_against_source(source: Path, candidate: Path, tags: list[str], samples: dict[str, list[Any]],
            rtol: float, atol: float, filterlist: list[str]) -> Attempt:
    """Verification's comparison (verify/compare.py) of `candidate` with the source."""
    from tpubuild.verify.compare import compare_models

    errors = compare_models(source, candidate, tags, samples, rtol, atol)
    worst = max(errors, key=lambda e: e.max_rel_error)
    return Attempt(sorted(filterlist), worst.max_rel_error, f"{worst.signature}/{worst.output}",
                   all(e.passed for e in errors))


def locate(reference: Path, candidate: Path, tags: list[str], samples: dict[str, list[Any]],
           rtol: float, atol: float) -> tuple[dict[str, list[NodeError]], dict[str, float], int]:
    """Per signature, the first tensors out of tolerance and what each adds; tensors compared."""
    first, added, compared = {}, {}, 0
    for key, key_samples in sorted(samples.items()):
        errors = compare_nodes(reference, candidate, tags, key, key_samples)
        compared += len(errors)
        first[key] = first_out_of_tolerance(errors, rtol, atol)
        for error in first[key]:
            added[error.tensor] = contribution(error, errors)
    return first, added, compared


def explain_bfloat16(stage_input: Path, stage_output: Path, source: Path, options: dict[str, Any],
                     samples: dict[str, list[Any]], rtol: float, atol: float, tpu_placed: bool,
                     scratch: Path) -> Explanation:
    """Where the bfloat16 stage's error starts, and the filterlist that brings its output
    within the verify tolerance (`options` are the bfloat16 stage's)."""
    tags = options["tags"]
    reference = _runnable(stage_input, scratch / "reference", tags, tpu_placed)
    candidate = _runnable(stage_output, scratch / "candidate", tags, tpu_placed)
    filterlist = list(options["bfloat16_optimization_options"].get("filterlist", []))
    result = Explanation("bfloat16", (rtol, atol), {k: len(s) for k, s in samples.items()},
                         verify_against_source(source, candidate, tags, samples, rtol, atol, filterlist),
                         option="bfloat16_optimization_options.filterlist")
    result.first, result.contributions, result.compared = locate(reference, candidate, tags, samples, rtol, atol)
    if result.output_error.passed:
        result.note = "the bfloat16 stage's output is within tolerance: nothing to filter"
        return result
    first = result.first
    for round_number in range(1, MAX_ROUNDS + 1):
        wanted = sorted({e.op for errors in first.values() for e in errors if e.dtype == "bfloat16"} - set(filterlist))
        if not wanted:
            result.note = ("no op that computes in bfloat16 starts the error: it comes from ops kept in float32 "
                           "or from the stages around bfloat16")
            break
        filterlist = filterlist + wanted
        converted = _convert(stage_input, scratch / f"round{round_number}", options, filterlist)
        candidate = _runnable(converted, scratch / f"round{round_number}-run", tags, tpu_placed)
        attempt = verify_against_source(source, candidate, tags, samples, rtol, atol, filterlist)
        result.attempts.append(attempt)
        if attempt.passed:
            break
        first, _, _ = locate(reference, candidate, tags, samples, rtol, atol)
    else:
        result.note = f"still out of tolerance after {MAX_ROUNDS} rounds"
    return result


def _convert(stage_input: Path, where: Path, options: dict[str, Any], filterlist: list[str]) -> Path:
    """The bfloat16 stage's own `run` on its input, with another filterlist."""
    from tpubuild.stages import bfloat16 as stage
    from tpubuild.stages.base import StageContext

    settings = {**options["bfloat16_optimization_options"], "filterlist": sorted(filterlist)}
    where.mkdir(parents=True)
    stage.run(stage_input, where, {**options, "bfloat16_optimization_options": settings}, StageContext(where))
    return where


def _runnable(model: Path, where: Path, tags: list[str], tpu_placed: bool) -> Path:
    """The model, or its CPU twin when it holds TPU calls (verify runs the same)."""
    if not tpu_placed:
        return model
    from tpubuild.tpu.twin import make_cpu_twin

    where.mkdir(parents=True)
    make_cpu_twin(model, where, tags)
    return where
