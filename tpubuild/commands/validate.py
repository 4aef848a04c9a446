from __future__ import annotations

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "validate",
    short_help="Check recipes against the schema and the converter's rules.",
    epilog="\b\nExamples:\n  tpubuild validate            every recipe of the workspace\n"
    "  tpubuild validate 'nlp-*'    the recipes whose name matches",
)
@click.argument("targets", nargs=-1)
@click.pass_context
def command(ctx: click.Context, targets: tuple[str, ...]) -> int:
    """Check recipes without building anything.

    Every problem is printed as `file:line:col: json.path: message`, all problems of
    all files at once; the exit code is 2 when there is any. TensorFlow is not imported.
    """
    ws, recipes = recipes_from(ctx, targets)
    click.echo(f"{len(recipes)} recipe{'s' if len(recipes) != 1 else ''} OK in {ws.root}")
    return 0
