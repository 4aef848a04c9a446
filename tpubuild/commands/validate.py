from __future__ import annotations

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "validate",
    short_help="Check recipes against the schema and the converter's rules.",
    epilog="\b\nExamples:\n  tpubuild validate            every recipe of the workspace\n"
    "  tpubuild validate 'nlp-*'    the recipes whose name matches",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...]) -> int:
    """Check recipes without building anything.

    Every problem is printed as `file:line:col: json.path: message`, all problems of
    all files at once; the exit code is 2 when there is any. TensorFlow is not imported.
    """
    from tpubuild.config.recipe import unmatched_globs

    ws, recipes = recipes_from(ctx, recipe_patterns)
    # A mistyped glob in tpubuild.yaml would otherwise end in "0 recipes OK".
    for pattern in unmatched_globs(ws):
        click.echo(f"warning: {ws.display(ws.file)}: recipes glob {pattern!r} matches no recipe file", err=True)
    click.echo(f"{len(recipes)} recipe{'s' if len(recipes) != 1 else ''} OK in {ws.root}")
    return 0
