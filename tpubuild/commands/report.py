from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from tpubuild.commands._common import recipes_from
from tpubuild.errors import UsageError


@click.command(
    "report",
    short_help="Print the conversion report of a recipe's newest published version; --html: its versions as charts.",
    epilog="\b\nExamples:\n  tpubuild report toy\n  tpubuild report toy --format markdown > report.md\n"
    "  tpubuild report toy --against 1      what changed since version 1\n"
    "  tpubuild report toy --html toy.html  every version as charts, one page\n"
    "  tpubuild report --html report/       a page per recipe and an index",
)
@click.argument("recipe_pattern", metavar="[RECIPE]", required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default=None,
              help="[default: text]")
@click.option("--version", "version", type=int, help="A published version number instead of the newest.")
@click.option("--against", type=int, metavar="VERSION", help="Show the difference from this older version.")
@click.option("--html", "html_path", metavar="FILE|DIR", type=click.Path(),
              help="With RECIPE: write its page to FILE (every version as charts, self-contained). Without: a page "
                   "per recipe and index.html in DIR.")
@click.pass_context
def command(ctx: click.Context, recipe_pattern: str | None, fmt: str | None, version: int | None,
            against: int | None, html_path: str | None = None) -> int:
    """Print the conversion report saved in `<output_dir>/<recipe>/<N>/tpubuild-report.json`.

    TPU vs CPU cost (per TPU function), sizes, parameters by dtype, verification errors,
    the quantization summary and the HLO files; with `targets:`, every target side by side
    (size, verified max error, per-call and load latency, from the version's manifest).
    TensorFlow is not imported.

    --html FILE (with RECIPE): one self-contained page (script and styles inline; it opens
    from disk and requests nothing) of every version as charts over version number and
    build date: artifact size, parameters by dtype, cost, verification error and argmax
    agreement, measured latency per target; builds that published nothing are marked in
    red, not dropped; the newest version's stage times and findings, and explain-error's
    op-level error drift when it was run. --html DIR (no RECIPE): a page per recipe and
    an index.html of them, each with a small trend.
    """
    if html_path is not None:
        for given, flag in ((fmt, "--format"), (version, "--version"), (against, "--against")):
            if given is not None:
                raise UsageError(f"{flag} and --html cannot be used together: the page shows every version")
        from tpubuild.commands.report_html import write_pages

        return write_pages(ctx, recipe_pattern, Path(html_path))
    if recipe_pattern is None:
        raise UsageError("missing RECIPE: name the recipe to report on (or give --html DIR for every recipe's page)")
    fmt = fmt or "text"
    from tpubuild.publish import read_manifest, version_numbers
    from tpubuild.report import formats as report_format
    from tpubuild.report import targets as targets_report

    ws, recipes = recipes_from(ctx, [recipe_pattern])
    for recipe in recipes:
        recipe_dir = Path(ws.output_dir) / recipe.name
        numbers = version_numbers(recipe_dir)
        if not numbers:
            raise UsageError(f"{recipe.name}: no published version in {recipe_dir}; run `tpubuild build {recipe.name}`")
        chosen = numbers[-1] if version is None else version
        report = _load(recipe_dir, recipe.name, chosen, numbers)
        if against is not None:
            old = _load(recipe_dir, recipe.name, against, numbers)
            diff = report_format.difference(old, report)
            if fmt == "json":
                click.echo(json.dumps({"recipe": recipe.name, "old": against, "new": chosen, "difference": diff}, indent=2))
            else:
                click.echo(f"{recipe.name}: version {against} -> version {chosen}")
                click.echo(report_format.difference_text(diff, f"version {against}", f"version {chosen}"), nl=False)
            continue
        # Serving targets beside the TPU SavedModel: from the manifest (report/targets.py).
        manifest = read_manifest(recipe_dir / str(chosen)) or {}
        table = targets_report.rows(manifest) if manifest.get("targets") else []
        peaks = peak_memory(recipe.lock_file, manifest)
        if fmt == "json":
            shown = {**report, "targets": table} if table else report
            click.echo(report_format.to_json({**shown, "peak_memory": peaks} if peaks else shown), nl=False)
        elif fmt == "markdown":  # as published: shared by every recipe with this build, it names none
            click.echo(report_format.to_markdown(report), nl=False)
            if table:
                click.echo(targets_report.to_markdown(table), nl=False)
        else:
            click.echo(f"version {chosen} ({recipe_dir / str(chosen)})")
            click.echo(report_format.to_text({"recipe": recipe.name, **report}), nl=False)
            if table:
                click.echo(targets_report.to_text(table), nl=False)
            if peaks:
                click.echo(peak_memory_text(peaks), nl=False)
    return 0


def _load(recipe_dir: Path, name: str, number: int, numbers: list[int]) -> dict:
    from tpubuild.report.formats import REPORT_JSON

    if number not in numbers:
        listed = ", ".join(map(str, numbers))
        raise UsageError(f"{name}: no version {number} in {recipe_dir}; published versions: {listed}")
    path = recipe_dir / str(number) / REPORT_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{name}: version {number} has no {REPORT_JSON}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON: {exc}") from None


def peak_memory(lock_file: Path, manifest: dict) -> dict | None:
    """Each stage's peak memory (its worker's peak resident set, measured when it was built)
    and the build's (the largest), from the recipe's lock file, for the stages whose key the
    version's manifest records (the lock file describes the newest build; an older
    version's stages that it does not record are left out). None when none is known."""
    from tpubuild.lock import read_lock

    lock = read_lock(lock_file) or {}
    recorded: dict[Any, Any] = {s.get("key"): s.get("peak_memory") for s in lock.get("stages") or []
                                if isinstance(s, dict)}
    stages: dict[str, int] = {s["stage"]: recorded[s["key"]] for s in manifest.get("stages") or []
                              if isinstance(s, dict) and isinstance(recorded.get(s.get("key")), int)}
    if not stages:
        return None
    return {"build": max(stages.values()), "stages": stages, "measured": "on the building machine"}


def peak_memory_text(peaks: dict) -> str:
    from tpubuild.report.formats import human_bytes

    stages = ", ".join(f"{name} {human_bytes(size)}" for name, size in peaks["stages"].items())
    return f"peak memory (measured on the building machine): build {human_bytes(peaks['build'])}; {stages}\n"
