"""What most verbs do first: find the workspace and load (some of) its recipes."""

from __future__ import annotations

import click

from tpubuild.config.workspace import Workspace, load_workspace


def workspace_from(ctx: click.Context) -> Workspace:
    return load_workspace(override=ctx.obj.workspace if ctx.obj else None)


def recipes_from(ctx: click.Context, patterns: tuple[str, ...] | list[str]):
    """(workspace, recipes matching the patterns; all when none are given)."""
    from tpubuild.config.recipe import load_recipes
    from tpubuild.config.workspace import OutputOverlapError, check_output_overlap

    ws = workspace_from(ctx)
    recipes = load_recipes(ws, list(patterns) or None)
    problems = check_output_overlap(ws, recipes)
    if problems:
        raise OutputOverlapError(problems)
    return ws, recipes


def changed_recipes(ctx: click.Context, patterns: tuple[str, ...], rev: str) -> tuple[str, ...]:
    """`--changed-since REV`: the names of the recipes `tpubuild diff REV` reports as
    affected, among those `patterns` match (all when none are given)."""
    import fnmatch

    from tpubuild.review.diff import changed_since

    names = changed_since(workspace_from(ctx), rev)
    return tuple(n for n in names if not patterns or any(fnmatch.fnmatchcase(n, t) for t in patterns))


def remote_setting(ws, url: str | None, read_only: bool) -> tuple[str, bool] | None:
    """(url, push) of the remote cache: --remote-cache wins over the workspace file's
    `remote_cache:`; --remote-cache-read-only turns uploads off. None: no remote."""
    from tpubuild.errors import UsageError

    if url is not None:
        from tpubuild.engine.remote_url import url_problem

        problem = url_problem(url)
        if problem:
            raise UsageError(f"--remote-cache: {problem}")
        return url, not read_only
    if ws.remote_cache is None:
        if read_only:
            raise UsageError("--remote-cache-read-only: no remote cache (give --remote-cache URL or remote_cache: "
                             f"in {ws.display(ws.file)})")
        return None
    return ws.remote_cache, ws.remote_push and not read_only

