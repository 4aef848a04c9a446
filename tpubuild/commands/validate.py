from __future__ import annotations

import json
from typing import Any

import click

from tpubuild.commands._common import recipes_from, warn_unmatched_globs


@click.command(
    "validate",
    short_help="Check recipes against the schema and the converter's rules.",
    epilog="\b\nExamples:\n  tpubuild validate            every recipe of the workspace\n"
    "  tpubuild validate 'quantized*'   the recipes whose name matches\n"
    "  tpubuild validate recipes/toy.yaml --json",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: the recipes checked, every problem with its file, line and column.")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], as_json: bool) -> int:
    """Check recipes (names, globs or recipe files) without building anything.

    Every problem is printed as `file:line:col: json.path: message`, all problems of
    all files at once; the exit code is 2 when there is any. TensorFlow is not imported:
    the export script is parsed (syntax, the `function:` it must define) and a plain
    SavedModel's function aliases are read from saved_model.pb, but whether the model
    converts is only known when `tpubuild build` runs it.
    """
    if as_json:
        return _as_json(ctx, recipe_patterns)
    ws, recipes = recipes_from(ctx, recipe_patterns, deep=True)
    warn_unmatched_globs(ws)
    for recipe in recipes:
        for warning in recipe.warnings:
            click.echo(f"warning: {warning}", err=True)
    click.echo(f"{len(recipes)} recipe{'s' if len(recipes) != 1 else ''} OK in {ws.root}")
    return 0


def _as_json(ctx: click.Context, recipe_patterns: tuple[str, ...]) -> int:
    """{"workspace", "recipes": [{name, file}], "problems": [{file, line, col, path, message}],
    "warnings": [...], "exit_code"}: problems go to stdout too, so a script reads one document
    (a usage error, as an unknown recipe, stays one line on stderr)."""
    from pathlib import Path

    from tpubuild.commands._common import unmatched_glob_warnings, workspace_from
    from tpubuild.config.finding import find_workspace_file
    from tpubuild.config.recipe import load_selection
    from tpubuild.config.workspace import check_output_overlap
    from tpubuild.errors import ConfigError

    document: dict[str, Any] = {"workspace": None, "recipes": [], "problems": [], "warnings": []}
    try:
        ws = workspace_from(ctx)
        document["workspace"] = str(ws.root)
        selection = load_selection(ws, list(recipe_patterns), Path.cwd(), deep=True)
    except ConfigError as exc:  # the workspace file, or a recipe glob leading out of it
        override = ctx.obj.workspace if ctx.obj else None
        found = find_workspace_file(Path(override) if override else Path.cwd())
        document["workspace"] = document["workspace"] or (str(found.parent) if found else None)
        document["problems"] = [_problem(d) for d in exc.diagnostics]
    else:
        document["recipes"] = [{"name": r.name, "file": r.rel_file} for r in selection.recipes]
        document["problems"] = [_problem(d) for d in sorted({d for b in selection.broken for d in b.diagnostics})]
        document["problems"] += [{"file": r, "line": 0, "col": 0, "path": "", "message": m}
                                 for r, m in (p.split(": ", 1) for p in check_output_overlap(ws, selection.recipes))]
        document["warnings"] = unmatched_glob_warnings(ws) + [b.summary() for b in selection.others]
        document["warnings"] += [str(w) for r in selection.recipes for w in r.warnings]
    document["exit_code"] = 2 if document["problems"] else 0
    click.echo(json.dumps(document, indent=2))
    return document["exit_code"]


def _problem(diagnostic) -> dict:
    loc = diagnostic.loc
    return {"file": loc.path, "line": loc.line, "col": loc.col, "path": diagnostic.json_path,
            "message": diagnostic.message}
