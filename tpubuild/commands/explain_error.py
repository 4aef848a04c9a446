from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpubuild.commands._common import recipes_from
from tpubuild.errors import UsageError

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

# The stages that change numbers, in the order the default takes them: int8 quantization
# changes them more than bfloat16 does (verify's int8 tolerance is the looser one,
# verify/verdict.py), so a recipe that runs both is explained at its quantize stage.
LOSSY_STAGES = ("quantize", "bfloat16")


@click.command(
    "explain-error",
    short_help="Name the ops where a bfloat16 or int8 artifact's error starts, and the recipe change that fixes it.",
    epilog="\b\nExamples:\n  tpubuild explain-error bfloat16             a bfloat16 recipe\n"
    "  tpubuild explain-error quantized_tpu_func   int8 and bfloat16: its quantize stage, the larger change\n"
    "  tpubuild explain-error quantized_tpu_func --stage bfloat16",
)
@click.argument("recipe_pattern", metavar="RECIPE")
@click.option("--stage", type=click.Choice(LOSSY_STAGES),
              help="The stage to explain. Default: quantize when the recipe quantizes (int8 changes numbers more "
                   "than bfloat16), else bfloat16.")
@click.pass_context
def command(ctx: click.Context, recipe_pattern: str, stage: str | None) -> int:
    """Compare the lossy stage's input and output of RECIPE node by node on the
    verification samples, list the first ops whose error exceeds verify's tolerance and
    what each adds, and propose the recipe change: for bfloat16 the filterlist entry,
    measured by converting again with it; for quantize each int8 layer's own error (TF's
    quantization debugger) and the layers to keep in float (unit_wise_quantization_specs),
    measured by quantizing again with them.

    Reads the stages a build left in the cache (a build whose verification fails keeps
    them); writes nothing there or in the output directory. The result is kept in the
    workspace's state directory (`explain-error/<recipe>.json`): `report --html` draws its
    op-level error drift. On a recipe out of
    tolerance, for example:

    \b
      where the error starts (first ops out of tolerance, of 9 compared):
        serving_default: sub (Sub, bfloat16): max rel error 1, adds 0.998
      tried bfloat16_optimization_options.filterlist: [Sub]: max rel error 0.00195
        on serving_default/y (within tolerance)
      proposal: bfloat16_optimization_options.filterlist: [Sub]
    """
    ws, recipes = recipes_from(ctx, [recipe_pattern])
    for recipe in recipes:
        for line in explain_recipe(ws, recipe, stage):
            click.echo(line)
    return 0


def explain_recipe(ws: Workspace, recipe: Any, stage: str | None) -> list[str]:
    """The lines `explain-error` prints for one recipe."""
    from tpubuild.engine import Engine, new_runs
    from tpubuild.stages.base import MODEL, SOURCE, StageContext
    from tpubuild.stages.selection import applied_transforms, main_chain

    chain = main_chain(recipe.canonical)
    where = f"{recipe.rel_file}: recipe {recipe.name}"
    chosen = ""
    if stage is None:
        lossy = [s for s in LOSSY_STAGES if s in chain]
        if not lossy:
            raise UsageError(f"{where} applies neither bfloat16 nor quantization: its artifact computes what its "
                             "source computes, up to float32 rounding; there is no conversion error to explain")
        stage = lossy[0]
        if len(lossy) > 1:
            chosen = (f" (of its stages quantize and bfloat16, the one that changes numbers most: int8; "
                      f"--stage {lossy[1]} explains the other)")
    elif stage not in chain:
        raise UsageError(f"{where} does not run the {stage} stage")
    engine = Engine(ws)
    run = new_runs([recipe])[0]
    engine.resolver.resolve(run)
    engine.stat.save()
    planned = {p.name: p for p in run.plan}
    verify = planned["verify"]
    needed = [planned[stage].consumes[MODEL], stage, verify.consumes[SOURCE]]
    missing = [name for name in needed if name not in run.outputs]
    if missing:
        raise UsageError(f"{where}: stage {missing[0]} is not built with the recipe as it is now; run "
                         f"`tpubuild build {recipe.name}` first (a build whose verification fails keeps the "
                         "stages before verify)")
    from tpubuild.verify.verdict import tolerances, verification_samples

    kind, rtol, atol = tolerances(applied_transforms(recipe.canonical), verify.options, "verify")
    context = StageContext(Path(recipe.root), {role: run.outputs[name].directory
                                               for role, name in verify.consumes.items() if name in run.outputs})
    stage_input = run.outputs[needed[0]].directory
    stage_output = run.outputs[stage].directory
    source = run.outputs[needed[2]].directory
    from tpubuild.diagnosis import explain_error
    from tpubuild.savedmodel.model import INIT_OP_KEY, SavedModel

    tags = verify.options["tags"]
    source_model = SavedModel.load(source, tags)
    served = SavedModel.load(stage_output, tags).meta_graph.signature_def
    keys = sorted(k for k in source_model.meta_graph.signature_def if k != INIT_OP_KEY and k in served)
    samples, origin = verification_samples(source_model, keys, verify.options, context)
    lines = [f"{where}: stage {stage}{chosen}, verify's {kind} tolerance (rtol {rtol:g}, atol {atol:g}), "
             + ", ".join(f"{key}: {len(s)} samples ({origin[key]})" for key, s in sorted(samples.items()))]
    with tempfile.TemporaryDirectory(prefix="explain-error-", dir=ws.state_dir) as scratch:
        if stage == "bfloat16":
            result = explain_error.explain_bfloat16(stage_input, stage_output, source, planned[stage].options,
                                                    samples, rtol, atol, "tpu" in chain, Path(scratch))
        else:
            quantize_context = StageContext(Path(recipe.root), {role: run.outputs[name].directory
                                                                for role, name in planned[stage].consumes.items()})
            result = explain_error.explain_quantize(stage_input, source, planned[stage].options, quantize_context,
                                                    samples, rtol, atol, stage_output, Path(scratch))
    save_result(ws, recipe.name, result, {"stage_key": run.outputs[stage].key,
                                          "input_key": run.outputs[needed[0]].key,
                                          "source_key": run.outputs[needed[2]].key})
    return lines + describe(result)


RESULTS_DIR = "explain-error"


def result_file(state_dir: Path, recipe: str) -> Path:
    """Where the newest `explain-error` of `recipe` is kept (`report --html` draws it)."""
    return Path(state_dir) / RESULTS_DIR / f"{recipe}.json"


def save_result(ws: Workspace, recipe: str, result: Any, keys: dict[str, str]) -> None:
    """The explanation as JSON in the workspace's state directory: the op-level error along
    the graph (every tensor compared, in order), where it starts, what was tried; with the
    keys of the stage outputs it explained, so a report tells which build it is about.
    Only the state directory is written, atomically; a failed write costs the page's chart."""
    import json
    import math
    import time

    from tpubuild.atomic import write_text_atomic

    def node(error: Any) -> dict[str, Any]:
        return {"node": error.short_name, "op": error.op, "dtype": error.dtype, "order": error.order,
                "max_abs_error": finite(error.max_abs_error), "max_reference": finite(error.max_reference),
                "max_rel_error": finite(error.max_rel_error), "within": error.within(*result.tolerance)}

    def attempt(a: Any) -> dict[str, Any]:
        return {"change": result.change(a), "max_rel_error": finite(a.max_rel_error), "worst_output": a.worst_output,
                "passed": a.passed}

    def finite(value: float) -> float | None:  # JSON has no infinity: a shape changed, or NaN
        return value if math.isfinite(value) else None

    document = {
        "schema": 1, "recipe": recipe, "stage": result.stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **keys,
        "tolerance": {"rtol": result.tolerance[0], "atol": result.tolerance[1]},
        "samples": result.samples, "compared": result.compared, "ranking": result.ranking,
        "output_error": attempt(result.output_error),
        "nodes": {key: [node(e) for e in errors] for key, errors in sorted(result.drift.items())},
        "first": {key: [e.short_name for e in errors] for key, errors in sorted(result.first.items())},
        "attempts": [attempt(a) for a in result.attempts],
        "proposal": result.change(result.proposal) if result.proposal is not None else None,
        "note": result.note,
    }
    path = result_file(ws.state_dir, recipe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n")
    except (OSError, ValueError):
        pass


def describe(result: Any) -> list[str]:
    """The explanation as indented lines."""
    measured = result.output_error
    state = "within tolerance" if measured.passed else "out of tolerance"
    lines = [f"  the {result.stage} stage's output against the source: max rel error {measured.max_rel_error:.3g} "
             f"on {measured.worst_output} ({state})"]
    first = {key: errors for key, errors in result.first.items() if errors}
    if first:
        lines.append(f"  {result.ranking}, of {result.compared} compared):")
        for key, errors in sorted(first.items()):
            for error in errors:
                added = result.contributions.get(error.tensor, 0.0)
                lines.append(f"    {key + ': ' if key else ''}{error.short_name} ({error.op}, {error.dtype}): max rel error "
                             f"{error.max_rel_error:.3g}" + (f", adds {added:.3g}" if result.stage == "bfloat16" else ""))
    elif not measured.passed:
        lines.append(f"  no single op is out of tolerance ({result.compared} compared): the error accumulates")
    for attempt in result.attempts:
        state = "within tolerance" if attempt.passed else "still out of tolerance"
        lines.append(f"  tried {result.change(attempt)}: max rel error {attempt.max_rel_error:.3g} on "
                     f"{attempt.worst_output} ({state})")
    proposal = result.proposal
    if proposal is not None:
        lines.append(f"  proposal: {result.change(proposal)}")
    if result.note:
        lines.append(f"  {result.note}")
    return lines
