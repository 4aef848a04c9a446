from __future__ import annotations

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "explain",
    short_help="Say for each stage whether it is cached, and what changed if not.",
    epilog="\b\nExample:\n  tpubuild explain toy\n    recipes/toy.yaml: recipe toy\n"
    "      export: cached (key 32db2ac10ca86d01)\n      ...\n      batch: would run (key fbdc3962f2bff670)\n"
    "        - option batch_options[0].batch_timeout_micros: 5000 -> 3000\n"
    "      verify: cached if batch's output is unchanged",
)
@click.argument("recipe_pattern", metavar="RECIPE")
@click.pass_context
def command(ctx: click.Context, recipe_pattern: str) -> int:
    """Explain why stages of RECIPE (a recipe name or glob) would rerun.

    For each stage: cached, or would run and exactly which option, input file or
    imported module changed since the build recorded in the lock file; a stage after
    one that would run is "cached if <that stage>'s output is unchanged" when the
    build will find it cached should that stage write the same output again. Builds
    nothing and never imports TensorFlow.
    """
    from tpubuild.engine import explain_lines

    ws, recipes = recipes_from(ctx, [recipe_pattern])
    for recipe in recipes:
        for line in explain_lines(ws, recipe):
            click.echo(line)
    return 0
