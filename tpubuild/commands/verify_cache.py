from __future__ import annotations

import click

from tpubuild.commands._common import workspace_from


@click.command(
    "verify-cache",
    short_help="Rehash the cache and the published versions; repair what is damaged.",
    epilog="\b\nExamples:\n  tpubuild verify-cache     check everything, repair, exit 1 if damage is left",
)
@click.pass_context
def command(ctx: click.Context) -> int:
    """Rehash every cache object and every published file, whatever their timestamps say.

    A corrupted object is removed, so the next build rebuilds its stage. A published file
    that differs from its version's tpubuild-manifest.json is restored from the cache when
    the cache holds its content; otherwise it is reported (run `tpubuild build`, which
    rebuilds the content and restores it). Exits 1 when damage is left.
    """
    from tpubuild.fs import WorkspaceLock
    from tpubuild.publish import published_versions, repair_version
    from tpubuild.store import Store

    ws = workspace_from(ctx)
    notify = lambda m: click.echo(m, err=True)  # noqa: E731
    store = Store(ws.cache_dir)
    restored, lost = [], []
    with WorkspaceLock(ws.state_dir) as lock:
        lock.acquire(3600, notify=notify)
        with store.exclusive(notify=notify):
            objects = len(store.all_objects())
            removed = store.verify_all()
            versions = published_versions(ws.output_dir)
            for version_dir in versions:
                fixed, left = repair_version(version_dir, store.object_path, ws.link_type)
                restored += fixed
                lost += left
    for digest in removed:
        click.echo(f"removed corrupted cache object {digest[:16]} (the next build rebuilds it)")
    for path in restored:
        click.echo(f"restored {ws.display(path)} from the cache")
    for path in lost:
        click.echo(f"error: {ws.display(path)} is damaged and its content is not in the cache "
                   "(`tpubuild build` rebuilds and restores it)", err=True)
    click.echo(
        f"checked {objects} objects and {len(versions)} published versions: {len(removed)} corrupted objects "
        f"removed, {len(restored)} published files restored, {len(lost)} damaged files left"
    )
    return 1 if lost else 0
