"""What most verbs do first: find the workspace and load (some of) its recipes."""

from __future__ import annotations

import click

from tpubuild.workspace import Workspace, load_workspace


def workspace_from(ctx: click.Context) -> Workspace:
    return load_workspace(override=ctx.obj.workspace if ctx.obj else None)


def recipes_from(ctx: click.Context, targets: tuple[str, ...] | list[str]):
    """(workspace, recipes matching targets; all when none are given)."""
    from tpubuild.config import load_recipes

    ws = workspace_from(ctx)
    return ws, load_recipes(ws, list(targets) or None)
