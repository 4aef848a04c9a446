from __future__ import annotations

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "clean",
    short_help="Remove the published versions of recipes (the cache stays).",
    epilog="\b\nExamples:\n  tpubuild clean          every recipe's outputs\n  tpubuild clean toy      out/toy/ only",
)
@click.argument("targets", nargs=-1)
@click.pass_context
def command(ctx: click.Context, targets: tuple[str, ...]) -> int:
    """Remove `<output_dir>/<recipe>/` for TARGETs (names or globs; none = all).

    The cache is kept, so the next build republishes without running stages.
    """
    import os
    import shutil
    import tempfile

    from tpubuild.engine.wslock import WorkspaceLock

    ws, recipes = recipes_from(ctx, targets)
    with WorkspaceLock(ws.state_dir) as lock:
        lock.acquire(3600, notify=lambda m: click.echo(m, err=True))
        for recipe in recipes:
            recipe_dir = ws.output_dir / recipe.name
            if not recipe_dir.exists():
                continue
            # Renamed away first: a killed clean never leaves a half-deleted version.
            trash = tempfile.mkdtemp(prefix=f".trash-{recipe.name}-", dir=ws.output_dir)
            os.rename(recipe_dir, os.path.join(trash, "x"))
            shutil.rmtree(trash, ignore_errors=True)
            click.echo(f"removed {ws.display(recipe_dir)}")
    return 0
