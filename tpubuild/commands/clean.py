from __future__ import annotations

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "clean",
    short_help="Remove the published versions of recipes (the cache stays).",
    epilog="\b\nExamples:\n  tpubuild clean          every recipe's outputs\n  tpubuild clean toy      out/toy/ only",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...]) -> int:
    """Remove the versions tpubuild published in `<output_dir>/<recipe>/` for each RECIPE
    (names, globs or recipe files; none = all).

    Only directories holding a tpubuild-manifest.json for that recipe, with exactly the
    files it lists, are removed; anything else there is left and reported. The cache is
    kept, so the next build republishes without running stages.
    """
    from tpubuild.config.workspace import OutputOverlapError, check_output_overlap
    from tpubuild.fs import WorkspaceLock
    from tpubuild.publish import remove_published

    ws, recipes = recipes_from(ctx, recipe_patterns)
    problems = check_output_overlap(ws, recipes)
    if problems:
        raise OutputOverlapError(problems)
    with WorkspaceLock(ws.state_dir) as lock:
        lock.acquire(3600, notify=lambda m: click.echo(m, err=True))
        for recipe in recipes:
            removed, left = remove_published(ws.output_dir / recipe.name, recipe.name)
            for path in removed:
                click.echo(f"removed {ws.display(path)}")
            for path, why in left:
                click.echo(f"warning: {ws.display(path)}: {why}; left in place", err=True)
    return 0
