"""What most verbs do first: find the workspace and load (some of) its recipes."""

from __future__ import annotations

from typing import Any

import click

from tpubuild.config.workspace import Workspace, load_workspace


def workspace_from(ctx: click.Context) -> Workspace:
    return load_workspace(override=ctx.obj.workspace if ctx.obj else None)


def recipes_from(ctx: click.Context, patterns: tuple[str, ...] | list[str], keep_going: bool = False,
                 deep: bool = False):
    """(workspace, recipes matching the patterns; all when none are given). Patterns are
    recipe names, globs of names, or recipe files (relative to the current directory).

    A recipe that does not load and was not asked for is one warning line (its file and
    line) and does not stop the work on the others. One that was asked for is an error
    (ConfigError, exit 2); with `keep_going` its problems are printed instead, the rest
    proceeds, and `asked_broken(ctx)` makes the command exit 2 at the end."""
    from pathlib import Path

    from tpubuild.config.recipe import load_selection
    from tpubuild.config.workspace import OutputOverlapError, check_output_overlap
    from tpubuild.errors import ConfigError

    ws = workspace_from(ctx)
    selection = load_selection(ws, list(patterns), Path.cwd(), deep)
    for broken in selection.others:
        click.echo(f"warning: {broken.summary()}", err=True)
    if selection.broken:
        invalid = ConfigError([d for b in selection.broken for d in b.diagnostics])
        if not keep_going or not selection.recipes:
            raise invalid
        for line in invalid.lines():
            click.echo(line, err=True)
        names = ", ".join(b.name for b in selection.broken)
        click.echo(f"error: skipped, invalid: {names}", err=True)
        ctx.meta["tpubuild.broken"] = [b.name for b in selection.broken]
    overlaps = check_output_overlap(ws, selection.recipes)
    if overlaps:
        raise OutputOverlapError(overlaps)
    return ws, selection.recipes


def asked_broken(ctx: click.Context) -> bool:
    """Whether recipes_from(..., keep_going=True) met a recipe asked for that does not load."""
    return bool(ctx.meta.get("tpubuild.broken"))


def unmatched_glob_warnings(ws: Workspace) -> list[str]:
    """Why a workspace has no recipe: a mistyped glob in tpubuild.yaml would otherwise end
    in "0 recipes OK" (validate) or an empty build."""
    from tpubuild.config.recipe import unmatched_globs

    return [f"{ws.display(ws.file)}: recipes glob {pattern!r} matches no recipe file" for pattern in unmatched_globs(ws)]


def warn_unmatched_globs(ws: Workspace) -> None:
    for warning in unmatched_glob_warnings(ws):
        click.echo(f"warning: {warning}", err=True)


def changed_recipes(ctx: click.Context, patterns: tuple[str, ...], rev: str) -> tuple[str, ...]:
    """`--changed-since REV`: the names of the recipes `tpubuild diff REV` reports as
    affected, among those `patterns` match (all when none are given)."""
    import fnmatch

    from tpubuild.review.diff import changed_since

    ws = workspace_from(ctx)
    names = changed_since(ws, rev)
    if any("/" in t or t.endswith((".yaml", ".yml")) for t in patterns):
        # Recipe files among the patterns: the names they select, read from the workspace.
        from pathlib import Path

        from tpubuild.config.recipe import load_selection

        patterns = tuple(r.name for r in load_selection(ws, list(patterns), Path.cwd()).recipes)
        return tuple(n for n in names if n in patterns)
    return tuple(n for n in names if not patterns or any(fnmatch.fnmatchcase(n, t) for t in patterns))


def remote_setting(ws, url: str | None, read_only: bool) -> tuple[str, bool] | None:
    """(url, push) of the remote cache: --remote-cache wins over the workspace file's
    `remote_cache:`; --remote-cache-read-only turns uploads off. None: no remote."""
    from tpubuild.errors import UsageError

    if url is not None:
        from tpubuild.config.remote_url import url_problem

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



def only_one(option: str, values: tuple) -> Any:
    """The one value of an option declared `multiple=True` so that giving it twice is seen
    (click keeps the last and drops the first without a word), or None when not given."""
    from tpubuild.errors import UsageError

    if len(values) > 1:
        raise UsageError(f"{option} given {len(values)} times; give it once (only one would be used, "
                         "the others dropped)")
    return values[0] if values else None
