from __future__ import annotations

import click

from tpubuild.commands._common import workspace_from
from tpubuild.report.formats import human_bytes


@click.command(
    "gc",
    short_help="Remove cache entries no workspace references.",
    epilog="\b\nExamples:\n  tpubuild gc                   keep what lock files use, and 30 days of others\n"
    "  tpubuild gc --keep-days 0     keep only what lock files and the last builds use\n"
    "  tpubuild gc --max-size 2G     drop least recently used entries until 2 GiB",
)
@click.option("--keep-days", type=click.FloatRange(min=0), help="Keep unreferenced entries used within N days (default 30).")
@click.option("--max-size", help="Drop unreferenced entries, least recently used first, until the cache fits (e.g. 500M, 2G).")
@click.option("--remote", is_flag=True,
              help="Collect the remote cache instead of the local one (records kept by age of creation).")
@click.option("--remote-cache", metavar="URL", help="The remote cache to collect (implies --remote; default: remote_cache:).")
@click.pass_context
def command(ctx: click.Context, keep_days: float | None, max_size: str | None, remote: bool,
            remote_cache: str | None) -> int:
    """Garbage-collect the workspace cache.

    Stage outputs referenced by this workspace's lock files or used by its last build of
    each recipe (measured keys included), or by any other existing workspace that uses
    the same cache_dir, are always kept. Published versions are never touched (they are
    copies, or hard links that stay intact).

    In a workspace with a shared cache (`remote_cache:` in tpubuild.yaml), `tpubuild gc
    --remote` applies the same rules to it; `--remote-cache URL` names another.
    """
    import errno

    from tpubuild.config.recipe import LOCK_SUFFIX, discover
    from tpubuild.config.sizes import parse_size
    from tpubuild.errors import UsageError
    from tpubuild.fs import WorkspaceLock
    from tpubuild.store import Store, collect, workspace_references

    if keep_days is not None and max_size is not None:
        raise UsageError("give --keep-days or --max-size, not both")
    try:
        limit = parse_size(max_size) if max_size is not None else None
    except (ValueError, KeyError):
        raise UsageError(f"--max-size: {max_size!r} is not a size like 500M or 2G") from None
    ws = workspace_from(ctx)
    locks = [p.with_name(p.name.rsplit(".", 1)[0] + LOCK_SUFFIX) for p in discover(ws)]
    notify = lambda m: click.echo(m, err=True)  # noqa: E731
    if remote or remote_cache is not None:
        refs, _ = workspace_references(ws, locks)
        return _remote_gc(ws, remote_cache, set().union(*refs.values()), keep_days, limit, notify)
    with WorkspaceLock(ws.state_dir) as lock:
        lock.acquire(3600, notify=notify)
        store = Store(ws.cache_dir)
        refs, recipes = workspace_references(ws, locks, store)
        try:
            # Its lock files and its last builds are what it uses now; recipes gone are forgotten.
            store.register_workspace(ws.root, refs, ws.file, only={*refs, *recipes})
            result = collect(store, set().union(*refs.values()), keep_days, limit, notify=notify)
        except OSError as exc:  # the index is another user's, or kept busy: which workspaces use the cache is unknown
            if exc.filename != str(store.index_path) or exc.errno not in (errno.EACCES, errno.EBUSY):
                raise
            raise UsageError(f"the cache index {exc.filename} is {exc.strerror}: gc cannot know which workspaces "
                             "use the cache; nothing removed") from None
    click.echo(
        f"removed {result.entries_removed} stage entries and {result.objects_removed} objects "
        f"({human_bytes(result.bytes_freed)}); {human_bytes(result.bytes_kept)} kept"
    )
    return 0


def _remote_gc(ws, url: str | None, referenced: set[str], keep_days: float | None, limit: int | None, notify) -> int:
    from tpubuild.commands._common import remote_setting
    from tpubuild.errors import UsageError
    from tpubuild.remote import RemoteCache, collect_remote

    setting = remote_setting(ws, url, False)
    if setting is None:
        raise UsageError(f"gc --remote: no remote cache (give --remote-cache URL or remote_cache: in {ws.display(ws.file)})")
    remote = RemoteCache(setting[0], timeouts=ws.remote_timeouts)
    result = collect_remote(remote, referenced, keep_days, limit, notify)
    click.echo(
        f"remote cache {remote.url}: removed {result.entries_removed} stage records and {result.objects_removed} "
        f"objects ({human_bytes(result.bytes_freed)}); {human_bytes(result.bytes_kept)} kept"
    )
    return 0
