from __future__ import annotations

import json
from typing import Any

import click

from tpubuild.commands._common import recipes_from


@click.command(
    "clean",
    short_help="Remove the published versions of recipes (the cache stays).",
    epilog="\b\nExamples:\n  tpubuild clean          every recipe's outputs\n  tpubuild clean toy      out/toy/ only",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("--remote", is_flag=True,
              help="Clean each recipe's publish_to destination instead of out/: every version tpubuild published "
                   "there but the newest and those serving.version_labels pin, and what killed publishes left.")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], remote: bool = False) -> int:
    """Remove the versions tpubuild published in `<output_dir>/<recipe>/` for each RECIPE
    (names, globs or recipe files; none = all).

    Only directories holding a tpubuild-manifest.json for that recipe, with exactly the
    files it lists, are removed; anything else there is left and reported. The cache is
    kept, so the next build republishes without running stages.

    With --remote, the same on each recipe's `publish_to:` destination, except what a
    server may be serving: the newest version and the versions its `serving:
    version_labels` name stay. Version numbers stay used there (a later build never
    reuses one). On an oci:// registry, each old version's manifest is deleted by digest
    (with its tag and claims), where the registry deletes (a registry that refuses is one
    warning line). A destination that cannot be reached is one line and exit 1.
    """
    from tpubuild.config.workspace import OutputOverlapError, check_output_overlap
    from tpubuild.fs import WorkspaceLock
    from tpubuild.publish import remove_published

    ws, recipes = recipes_from(ctx, recipe_patterns)
    if remote:
        return _clean_destinations(ws, recipes)
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


def _clean_destinations(ws: Any, recipes: list[Any]) -> int:
    """`clean --remote`: each recipe's destination, its newest and pinned versions kept."""
    from tpubuild.errors import UsageError
    from tpubuild.publish import is_registry, open_destination

    with_destination = [r for r in recipes if r.publish_to]
    if not with_destination:
        raise UsageError("--remote: no recipe selected has a publish_to destination (tpubuild.yaml or the recipe)")
    destinations: dict[tuple[str, str], Any] = {}
    for recipe in with_destination:
        # What the destination holds that tpubuild did not write is left alone, a warning line each.
        settings = recipe.oci if is_registry(recipe.publish_to) else {}
        place = (recipe.publish_to, json.dumps(settings, sort_keys=True))
        if place not in destinations:
            destinations[place] = open_destination(recipe.publish_to, ws.remote_timeouts, settings,
                                                   say=lambda m: click.echo(m, err=True))
        dest = destinations[place]
        survey = dest.survey(recipe.name)
        for line in dest.mend(survey, say=lambda m: click.echo(m, err=True)):
            click.echo(f"{recipe.name}: {line}")
        survey = dest.survey(recipe.name)
        pinned = set(recipe.version_labels.values())
        for number in dest.prune(survey, None, pinned, lambda m: click.echo(m, err=True), everything=True):
            click.echo(f"removed {dest.version_url(recipe.name, number)}")
        kept = survey.complete_numbers()
        if kept:
            ours = dest.newest_published(survey)  # kept too when a newer one is not tpubuild's
            why = ", ".join([f"{kept[-1]} (the newest)"]
                            + ([f"{ours} (the newest tpubuild published)"] if ours not in (None, kept[-1]) else [])
                            + [f"{n} (labelled)" for n in sorted(pinned) if n not in (kept[-1], ours) and n in kept])
            slash = "" if is_registry(recipe.publish_to) else "/"
            click.echo(f"kept {dest.base_path(recipe.name)}{slash}: {why}")
    return 0
