from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from tpubuild import trace_events
from tpubuild.build_words import summary_line, wants_colour
from tpubuild.commands.build_output import NORMAL, QUIET, VERBOSE


@click.command(
    "build",
    short_help="Build recipes: run the stages whose inputs changed, publish new versions.",
    epilog="\b\nExamples:\n  tpubuild build                 every recipe of the workspace\n"
    "  tpubuild build -j 2 'quantized*'   the recipes whose name matches, two at a time\n"
    "  tpubuild build --dry-run       what would run, without running it\n"
    "  tpubuild build -v              a row for every stage, cached ones too\n"
    "  tpubuild build --check         in CI: exit 1 if a lock file is out of date",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Recipes built in parallel (one worker process each).")
@click.option("--dry-run", is_flag=True, help="Show which stages are cached and which would run; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document with a row per stage.")
@click.option("-v", "--verbose", is_flag=True,
              help="A row for every stage, cached and skipped ones too, with each built stage's worker start-up.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors, warnings and the summary line.")
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
                   "but the recipe still publishes what built and verified, without that target; an invalid "
                   "recipe among those asked for is reported and the others still build (exit 2).")
@click.option("--profile", "profile", metavar="FILE", type=click.Path(dir_okay=False, writable=True),
              help="Write the build as a Chrome trace (Trace Event Format JSON) to FILE: each stage on the track "
                   "of the worker that ran it, the waits and this process's own work; open it in Perfetto's UI "
                   "or chrome://tracing.")
@click.option("--relock", is_flag=True,
              help="Rewrite the lock files even where no key changed, with the figures measured on this machine "
                   "(a build keeps a lock file whose keys match byte for byte).")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], jobs: int, dry_run: bool, as_json: bool, check: bool,
            changed_since: str | None, remote_cache: str | None, remote_cache_read_only: bool,
            executor: str | None = None, ray_address: str | None = None, keep_going: bool = False,
            verbose: bool = False, quiet: bool = False, relock: bool = False, profile: str | None = None) -> int:
    """Build the workspace's recipes (names, globs or recipe files; none = all).

    A stage reruns only when its options or the content of its inputs changed; its
    output is then taken from the cache. A new numbered version appears under
    `<output_dir>/<recipe>/` only when the result differs. Exit code 1 when a stage
    failed (the other recipes are still built), 2 for a bad recipe: one that was not
    asked for (`tpubuild build toy` with another recipe broken) is a warning line; one that
    was stops the build before anything runs, or with -k is skipped while the rest build.

    Prints a row per stage that built or failed, `published: RECIPE -> DIR` per new
    version (and `-> URL` per new version on a `publish_to:` destination; a destination
    that cannot be reached is an error line and exit 1, the local build kept) and a
    summary line; on a terminal also a live `[n/N]` line (colour off with
    NO_COLOR). -v: every stage; -q: errors, warnings and the summary only.

    With a shared cache (`remote_cache:` in tpubuild.yaml, or --remote-cache URL), a pull
    request's build runs `tpubuild build --remote-cache-read-only`: the team's cache, no uploads.

    --profile FILE: the build as a Chrome trace (the full path, never the no-op shortcut),
    written atomically when the build ends, also when it fails or is interrupted; a build
    killed outright leaves the file as it was.
    """
    if profile is not None:
        return _profiled(ctx, profile, recipe_patterns, jobs=jobs, dry_run=dry_run, as_json=as_json, check=check,
                         changed_since=changed_since, remote_cache=remote_cache,
                         remote_cache_read_only=remote_cache_read_only, executor=executor, ray_address=ray_address,
                         keep_going=keep_going, verbose=verbose, quiet=quiet, relock=relock)
    since_ns = time.time_ns()  # files changed after this are never remembered as up to date
    verbosity = _verbosity(ctx, verbose, quiet)
    if changed_since is not None:
        from tpubuild.commands._common import changed_recipes

        recipe_patterns = changed_recipes(ctx, recipe_patterns, changed_since)
        if not recipe_patterns:
            click.echo(json.dumps({"rows": [], "versions": {}, "exit_code": 0}) if as_json
                       else f"no recipe affected since {changed_since}")
            return 0
    if check and not (recipe_patterns or relock or changed_since):
        # The whole workspace: the executable's fast answers (tpubuild/entry.py), unless
        # it tried them already in this process.
        from tpubuild.entry import fast_check

        count = fast_check(ctx.obj.workspace if ctx.obj else None)
        if count is not None:
            _say_up_to_date(count)
            return 0
    elif not (dry_run or relock or trace_events.active()):  # a profile is of the full path
        code = _noop_fast_path(ctx, recipe_patterns, as_json, verbosity, check)
        if code is not None:
            return code
    from tpubuild.commands._common import (
        asked_broken,
        recipes_from,
        remote_setting,
        warn_unmatched_globs,
    )

    # An invalid recipe that was not asked for is a warning; one that was stops the build
    # before anything runs (bazel's loading phase), unless -k builds the others (exit 2).
    with trace_events.span("loading the recipes", cat="plan"):
        ws, recipes = recipes_from(ctx, recipe_patterns, keep_going=keep_going)
    if not recipes:  # say why nothing is built, as validate does
        warn_unmatched_globs(ws)
    invalid = 2 if asked_broken(ctx) else 0  # reported already; the valid recipes asked for still build
    remote = remote_setting(ws, remote_cache, remote_cache_read_only)  # checked even where unused
    ws.executor = executor or ws.executor
    ws.ray_address = ray_address or ws.ray_address
    if check:
        return _check(ws, recipes) or invalid
    if dry_run:
        return _dry_run(ws, recipes, as_json, verbosity) or invalid
    from tpubuild.commands.build_output import BuildOutput
    from tpubuild.config.recipe import discover
    from tpubuild.engine import BuildEvents, BuildOptions, build
    from tpubuild.lock import NoopMemo

    memo = NoopMemo(ws, discover(ws))
    out = sys.stdout  # the stream click.echo writes to (click.get_text_stream is deprecated)
    output = BuildOutput(out, QUIET if as_json else verbosity, tty=out.isatty() and not as_json,
                         colour=wants_colour(out) and not as_json, display=ws.display)
    try:
        runs, engine = build(ws, recipes,
                             BuildOptions(jobs=jobs, memo=memo, since_ns=since_ns, remote=remote, keep_going=keep_going,
                                          relock=relock),
                             BuildEvents(printer=output.row, errors=output.error, started=output.started,
                                         planned=output.planned, notes=output.note, waiting=output.waiting))
    finally:
        output.close()  # the live line goes, also on Ctrl-C or an error
    memo.save(ws)
    rows = [row for run in runs for row in run.rows]
    # A recipe built here but not published to its destination fails the build too (exit 1).
    failed = [run for run in runs if not run.succeeded or run.destination_error]
    if as_json:
        document = {
            "rows": [row.to_json() for row in rows],
            "versions": {run.name: run.version for run in runs},
            "hashed": {"files": engine.stat.files_hashed, "bytes": engine.stat.bytes_hashed},
            "exit_code": 1 if failed else invalid,
        }
        destinations = {run.name: run.destination.to_json() if run.destination else {"error": run.destination_error}
                        for run in runs if run.destination or run.destination_error}
        if destinations:  # recipes with `publish_to:` that were published (or said why not)
            document["destinations"] = destinations
        if engine.remote is not None:
            document["remote"] = engine.remote.stats.to_json(engine.remote.url)
        click.echo(json.dumps(document, indent=2))
    else:
        output.summary(runs)
        if engine.remote is not None:
            click.echo(engine.remote.stats.line(engine.remote.url))
    return 1 if failed else invalid


def _profiled(ctx: click.Context, path: str, recipe_patterns: tuple[str, ...], **options: Any) -> int:
    """The build with a trace recorded from its start (tpubuild/trace_events.py), written to
    `path` however the build ends: an error, a failed stage, Ctrl-C. The file is replaced
    atomically, so a build killed outright leaves the one that was there (or none)."""
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        from tpubuild.errors import UsageError

        raise UsageError(f"--profile {path}: a directory; name the trace file to write")
    trace_events.start("tpubuild build")
    try:
        with trace_events.span("tpubuild build", cat="command"):
            return command.callback(recipe_patterns=recipe_patterns, **options)  # type: ignore[misc]
    finally:
        trace = trace_events.stop()
        if trace is not None:
            try:
                trace.write(target)
            except OSError as exc:
                click.echo(f"--profile {path}: not written: {exc.strerror or exc}", err=True)


def _verbosity(ctx: click.Context, verbose: bool, quiet: bool) -> int:
    """-q/-v given to `build` or to `tpubuild` itself (`tpubuild -v build` = `tpubuild build -v`)."""
    verbose = verbose or bool(ctx.obj and ctx.obj.verbose)
    quiet = quiet or bool(ctx.obj and ctx.obj.quiet)
    if verbose and quiet:
        from tpubuild.errors import UsageError

        raise UsageError("-q/--quiet and -v/--verbose cannot be used together")
    return VERBOSE if verbose else QUIET if quiet else NORMAL


def _noop_fast_path(ctx: click.Context, recipe_patterns: tuple[str, ...], as_json: bool,
                    verbosity: int = NORMAL, check: bool = False) -> int | None:
    """A build with nothing to do, proven from stats alone (lock/memo.py): no recipe is
    loaded, no record read. None when anything may have changed: the full path decides.
    It answers `--check` too: a build with nothing to do changes no lock file."""
    import fnmatch
    from pathlib import Path

    from tpubuild.entry import fast_paths_declined
    from tpubuild.lock import memo_entries, quick

    if fast_paths_declined():  # `tpubuild build`, which the executable asked the memo already
        return None

    override = ctx.obj.workspace if ctx.obj else None
    # --check needs the files that decide lock files; a build, its outputs' too.
    found = quick(Path.cwd(), Path(override) if override else None, outputs=not check)
    if found is None:
        return None
    root, head = found
    if not head["recipe_files"]:
        return None  # the full path says why there is no recipe
    if not recipe_patterns and not as_json and verbosity < VERBOSE:  # counts only: the memo's first line
        if check:
            _say_up_to_date(len(head["recipe_files"]))
        else:
            click.echo(summary_line(len(head["recipe_files"]), {"cached": head["rows"]}, ("cached",),
                                    wants_colour(sys.stdout)))
        return 0
    entries = memo_entries(root, head)
    if entries is None:
        return None
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
                      "remote": False, "peak_rss_bytes": None, "worker_startup_seconds": None,
                      "io": None}
                     for e in entries for stage, key in e["rows"]],
            "versions": {e["name"]: e["version"] for e in entries},
            "hashed": {"files": 0, "bytes": 0},
            "exit_code": 0,
        }
        click.echo(json.dumps(document, indent=2))
    else:
        from tpubuild.commands.build_output import stage_line

        colour = wants_colour(sys.stdout)
        if verbosity >= VERBOSE:  # the rows a full no-op build prints with -v
            for e in entries:
                for stage, _ in e["rows"]:
                    click.echo(stage_line(e["name"], stage, "cached", "", colour))
        count = sum(len(e["rows"]) for e in entries)
        click.echo(summary_line(len(entries), {"cached": count}, ("cached",), colour))
    return 0


def _check(ws, recipes) -> int:
    from tpubuild.engine import check_lines

    stale = check_lines(ws, recipes)
    for line in stale:
        click.echo(line)
    if not stale:
        _say_up_to_date(len(recipes))
    return 1 if stale else 0


def _say_up_to_date(count: int) -> None:
    from tpubuild.entry import up_to_date_line

    click.echo(up_to_date_line(count))


def _dry_run(ws, recipes, as_json: bool, verbosity: int = NORMAL) -> int:
    """What a build would do, in `explain`'s words (stage_words) and with its reasons:
    a row per stage that would run or cannot run (-v: cached ones too), then the summary."""
    from tpubuild.commands.build_output import stage_line
    from tpubuild.engine import DRY_RUN_ORDER, Engine, resolve, stage_words, state_word

    engine = Engine(ws)
    rows = []
    counts: dict[str, int] = {}
    for recipe in recipes:
        for stage in resolve(ws, recipe, engine):
            rows.append({"recipe": recipe.name, "stage": stage.name, "status": stage.status, "key": stage.key,
                         "state": stage_words(stage), "reasons": list(stage.reasons)})
            counts[state_word(stage)] = counts.get(state_word(stage), 0) + 1
    engine.stat.save()
    if as_json:
        click.echo(json.dumps({"rows": rows, "summary": counts}, indent=2))
        return 0
    colour = wants_colour(sys.stdout)
    for row in rows:
        if verbosity >= VERBOSE or (verbosity >= NORMAL and row["status"] != "cached"):
            click.echo(stage_line(row["recipe"], row["stage"], row["state"], "; ".join(row["reasons"]), colour))
    click.echo(summary_line(len(recipes), counts, DRY_RUN_ORDER, colour))
    return 0
