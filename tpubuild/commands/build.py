from __future__ import annotations

import json
import sys
import threading
import time

import click


@click.command(
    "build",
    short_help="Build recipes: run the stages whose inputs changed, publish new versions.",
    epilog="\b\nExamples:\n  tpubuild build                 every recipe of the workspace\n"
    "  tpubuild build -j 2 'nlp-*'    the recipes whose name matches, two at a time\n"
    "  tpubuild build --dry-run       what would run, without running it\n"
    "  tpubuild build --check         in CI: exit 1 if a lock file is out of date\n"
    "  tpubuild build --remote-cache-read-only   in a pull request: the team's cache, no uploads",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Recipes built in parallel (one worker process each).")
@click.option("--dry-run", is_flag=True, help="Show which stages are cached and which would run; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document with a row per stage.")
@click.option("--check", is_flag=True, help="Exit 1, listing the recipes, if building would change a lock file.")
@click.option("--changed-since", metavar="REV", help="Only the recipes `tpubuild diff REV` reports as affected.")
@click.option("--remote-cache", metavar="URL",
              help="A shared cache (s3://bucket/prefix, gs://..., file:///dir); overrides remote_cache: in tpubuild.yaml.")
@click.option("--remote-cache-read-only", is_flag=True,
              help="Fetch from the remote cache but upload nothing (pull requests, untrusted builds).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where stages run: local worker processes, or Ray tasks (needs a remote cache). "
                   "Default: the workspace's executor, else local.")
@click.option("--ray-address", metavar="ADDR", help="The Ray cluster of --executor ray (default: RAY_ADDRESS, "
              "else the cluster on this machine).")
@click.option("-k", "--keep-going", is_flag=True,
              help="Like make -k: a failed target (cpu_savedmodel, litert, xla_aot) fails the build (exit 1) "
                   "but the recipe still publishes what built and verified, without that target.")
@click.option("--relock", is_flag=True,
              help="Rewrite the lock files even where no key changed, with the figures measured on this machine "
                   "(a build keeps a lock file whose keys match byte for byte).")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], jobs: int, dry_run: bool, as_json: bool, check: bool,
            changed_since: str | None, remote_cache: str | None, remote_cache_read_only: bool,
            executor: str | None = None, ray_address: str | None = None, keep_going: bool = False,
            relock: bool = False) -> int:
    """Build the workspace's recipes (names or globs; none = all).

    A stage reruns only when its options or the content of its inputs changed; its
    output is then taken from the cache. A new numbered version appears under
    `<output_dir>/<recipe>/` only when the result differs. Exit code 1 when a stage
    failed (the other recipes are still built), 2 for a bad recipe.
    """
    since_ns = time.time_ns()  # files changed after this are never remembered as up to date
    if changed_since is not None:
        from tpubuild.commands._common import changed_recipes

        recipe_patterns = changed_recipes(ctx, recipe_patterns, changed_since)
        if not recipe_patterns:
            click.echo(json.dumps({"rows": [], "versions": {}, "exit_code": 0}) if as_json
                       else f"no recipe affected since {changed_since}")
            return 0
    if not (dry_run or relock):
        code = _noop_fast_path(ctx, recipe_patterns, as_json, check)
        if code is not None:
            return code
    from tpubuild.commands._common import recipes_from, remote_setting

    ws, recipes = recipes_from(ctx, recipe_patterns)
    remote = remote_setting(ws, remote_cache, remote_cache_read_only)  # checked even where unused
    ws.executor = executor or ws.executor
    ws.ray_address = ray_address or ws.ray_address
    if check:
        return _check(ws, recipes)
    if dry_run:
        return _dry_run(ws, recipes, as_json)
    from tpubuild.config.recipe import discover
    from tpubuild.engine.build import build
    from tpubuild.engine.noop import NoopMemo

    memo = NoopMemo(ws, discover(ws))
    out = click.get_text_stream("stdout")
    progress = _Progress(out, tty=out.isatty() and not as_json, quiet=as_json)
    runs, engine = build(ws, recipes, jobs, printer=progress.row, errors=progress.error, started=progress.started,
                         memo=memo, since_ns=since_ns, remote=remote, keep_going=keep_going, relock=relock)
    memo.save(ws)
    rows = [row for run in runs for row in run.rows]
    failed = [run for run in runs if not run.succeeded]
    if as_json:
        document = {
            "rows": [row.to_json() for row in rows],
            "versions": {run.name: run.version for run in runs},
            "hashed": {"files": engine.stat.files_hashed, "bytes": engine.stat.bytes_hashed},
            "exit_code": 1 if failed else 0,
        }
        if engine.remote is not None:
            document["remote"] = engine.remote.stats.to_json(engine.remote.url)
        click.echo(json.dumps(document, indent=2))
    else:
        progress.summary(runs)
        if engine.remote is not None:
            click.echo(engine.remote.stats.line(engine.remote.url))
    return 1 if failed else 0


def _noop_fast_path(ctx: click.Context, recipe_patterns: tuple[str, ...], as_json: bool,
                    check: bool = False) -> int | None:
    """A build with nothing to do, proven from stats alone (engine/noop.py): no recipe is
    loaded, no record read. None when anything may have changed: the full path decides.
    It answers `--check` too: a build with nothing to do changes no lock file."""
    import fnmatch
    from pathlib import Path

    from tpubuild.engine.noop import quick

    override = ctx.obj.workspace if ctx.obj else None
    found = quick(Path.cwd(), Path(override) if override else None)
    if found is None:
        return None
    _, entries = found
    if recipe_patterns:
        names = [e["name"] for e in entries]
        wanted = set()
        for pattern in recipe_patterns:
            matched = fnmatch.filter(names, pattern)
            if not matched:
                return None  # the full path reports the unknown recipe
            wanted.update(matched)
        entries = [e for e in entries if e["name"] in wanted]
    if check:
        _say_up_to_date(len(entries))
    elif as_json:
        document = {
            "rows": [{"recipe": e["name"], "stage": stage, "status": "cached", "key": key, "seconds": 0.0,
                      "remote": False}
                     for e in entries for stage, key in e["rows"]],
            "versions": {e["name"]: e["version"] for e in entries},
            "hashed": {"files": 0, "bytes": 0},
            "exit_code": 0,
        }
        click.echo(json.dumps(document, indent=2))
    else:
        count = sum(len(e["rows"]) for e in entries)
        click.echo(f"{len(entries)} recipe{'s' if len(entries) != 1 else ''}: {count} cached")
    return 0


class _Progress:
    """Per-stage lines (all of them on a terminal, only work done when piped), and on a
    terminal a live line with the running stages and their elapsed time."""

    def __init__(self, out, tty: bool, quiet: bool):
        self.out, self.tty, self.quiet = out, tty, quiet
        self.lock = threading.Lock()
        self.running: dict[tuple[str, str], float] = {}
        self.live = False
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def started(self, run, stage: str) -> None:
        if self.quiet or not self.tty:
            return
        with self.lock:
            self.running[(run.name, stage)] = time.monotonic()
            if self.ticker is None:
                self.ticker = threading.Thread(target=self._tick, daemon=True)
                self.ticker.start()

    def _tick(self) -> None:
        while not self.stop.wait(0.25):
            with self.lock:
                self._draw()

    def _draw(self) -> None:
        now = time.monotonic()
        parts = [f"{recipe}: {stage} {now - start:.0f} s" for (recipe, stage), start in sorted(self.running.items())]
        self._clear()
        if parts:
            self.out.write(("running " + ", ".join(parts))[:200])
            self.out.flush()
            self.live = True

    def _clear(self) -> None:
        if self.live:
            self.out.write("\r\033[K")
            self.live = False

    def row(self, run, row) -> None:
        if self.quiet or (not self.tty and row.status == "cached"):
            return
        with self.lock:
            self.running.pop((row.recipe, row.stage), None)
            self._clear()
            where = " from the remote cache" if getattr(row, "remote", False) else ""
            self.out.write(f"{row.recipe}: {row.stage}: {row.status}{where} ({row.seconds:.2f} s)\n")
            self.out.flush()

    def error(self, message: str) -> None:
        with self.lock:
            self._clear()
            self.out.flush()
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    def summary(self, runs) -> None:
        self.stop.set()
        with self.lock:
            self._clear()
        counts: dict[str, int] = {}
        for run in runs:
            for row in run.rows:
                counts[row.status] = counts.get(row.status, 0) + 1
        parts = ", ".join(f"{counts[s]} {s}" for s in ("built", "cached", "failed", "skipped") if counts.get(s))
        published = [f"{run.name} {run.version}" for run in runs if run.version is not None]
        self.out.write(f"{len(runs)} recipe{'s' if len(runs) != 1 else ''}: {parts or 'nothing to do'}\n")
        if self.tty and published:
            self.out.write(f"published: {', '.join(published)}\n")


def _check(ws, recipes) -> int:
    from tpubuild.engine.lockcheck import check_lines

    stale = check_lines(ws, recipes)
    for line in stale:
        click.echo(line)
    if not stale:
        _say_up_to_date(len(recipes))
    return 1 if stale else 0


def _say_up_to_date(count: int) -> None:
    click.echo(f"{count} lock file{'s' if count != 1 else ''} up to date")


def _dry_run(ws, recipes, as_json: bool) -> int:
    from tpubuild.engine.build import Engine
    from tpubuild.engine.explain import resolve

    engine = Engine(ws)
    rows = []
    for recipe in recipes:
        for stage in resolve(ws, recipe, engine):
            rows.append({"recipe": recipe.name, "stage": stage.name, "status": stage.status, "key": stage.key})
    engine.stat.save()
    if as_json:
        click.echo(json.dumps({"rows": rows}, indent=2))
    else:
        for row in rows:
            click.echo(f"{row['recipe']}: {row['stage']}: {row['status']}")
    return 0
