from __future__ import annotations

import json

import click

from tpubuild.commands._common import (
    asked_broken,
    changed_recipes,
    recipes_from,
    warn_unmatched_globs,
)


@click.command(
    "list",
    short_help="List recipes with their model, the stages they run and their targets.",
    epilog="\b\nExamples:\n  tpubuild list\n  tpubuild list --json 'quantized*' | jq '.[].stages'",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--changed-since", metavar="REV", help="Only the recipes `tpubuild diff REV` reports as affected.")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], as_json: bool, changed_since: str | None) -> int:
    """List the workspace's recipes (or those named: names, globs or recipe files): name,
    file, model, the pipeline stages and the serving targets (`targets:`; shown when
    there is more than the TPU SavedModel). An invalid recipe is reported and the others
    are listed (exit 2 if it was among those asked for)."""
    from tpubuild.pipeline import stage_names
    from tpubuild.stages.slices import MAIN_TARGET
    from tpubuild.stages.slices import targets as recipe_targets

    if changed_since is not None:
        recipe_patterns = changed_recipes(ctx, recipe_patterns, changed_since)
    ws, recipes = (recipes_from(ctx, recipe_patterns, keep_going=True) if recipe_patterns or changed_since is None
                   else (None, []))
    if ws is not None and not recipes:
        warn_unmatched_globs(ws)
    rows = [
        {
            "name": r.name,
            "file": r.rel_file,
            "model": _model(r.canonical["model"]),
            "stages": stage_names(r.canonical),
            "targets": list(recipe_targets(r.canonical)),
        }
        for r in recipes
    ]
    code = 2 if asked_broken(ctx) else 0  # listed the others; the invalid ones were reported
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return code
    width = max((len(row["name"]) for row in rows), default=0)
    for row in rows:
        # The default target (the TPU SavedModel alone) goes without saying.
        shown = f"  targets: {', '.join(row['targets'])}" if row["targets"] != [MAIN_TARGET] else ""
        click.echo(f"{row['name']:<{width}}  {row['model']}  [{' > '.join(row['stages'])}]{shown}")
    return code


def _model(model: dict) -> str:
    if "saved_model" in model:
        return model["saved_model"]
    export = model["export"]
    return f"{export['script']}:{export['function']}"
