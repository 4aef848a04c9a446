"""What most verbs do first: find the workspace and load (some of) its recipes."""

from __future__ import annotations

import click

from tpubuild.workspace import Workspace, load_workspace


def workspace_from(ctx: click.Context) -> Workspace:
    return load_workspace(override=ctx.obj.workspace if ctx.obj else None)


def recipes_from(ctx: click.Context, targets: tuple[str, ...] | list[str]):
    """(workspace, recipes matching targets; all when none are given)."""
    from tpubuild.config import load_recipes
    from tpubuild.workspace import OutputOverlapError, check_output_overlap

    ws = workspace_from(ctx)
    recipes = load_recipes(ws, list(targets) or None)
    problems = check_output_overlap(ws, recipes)
    if problems:
        raise OutputOverlapError(problems)
    return ws, recipes
