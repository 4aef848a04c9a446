"""`tpubuild report --html`: what the pages are drawn from, and where they are written.

A recipe's page is drawn from its published versions (each `tpubuild-manifest.json`; the
newest version's `tpubuild-report.json` for its findings), the workspace's record of its
builds (engine/history.py: stage times, the builds that published nothing), the highest
version number reserved for it (publish/versions.py) and its newest `explain-error`
result. Everything read is data others could have written: a file that is not what it
should be (unreadable, not JSON, too large, another recipe's) is left out, never trusted.

A page replaces only a file that is absent or a page this command wrote (its
`<meta name="generator">`): a file of the user's at that path is refused, not overwritten.
TensorFlow is not imported (tests/report/test_html_page.py checks sys.modules).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from tpubuild.commands._common import recipes_from
from tpubuild.errors import UsageError

# A JSON file larger than this is not read: a manifest or report is kilobytes.
READ_LIMIT = 16 << 20
INDEX = "index.html"


def write_pages(ctx: click.Context, recipe_pattern: str | None, path: Path) -> int:
    """RECIPE and FILE: that recipe's page. No RECIPE: DIR/<recipe>.html of each and DIR/index.html."""
    from tpubuild.report import html

    if recipe_pattern is not None:
        if path.is_dir():
            raise UsageError(f"--html {path}: a directory; with RECIPE name the page's file "
                             "(or give no RECIPE for a page per recipe in a directory)")
        ws, recipes = recipes_from(ctx, [recipe_pattern])
        if len(recipes) != 1:
            names = ", ".join(r.name for r in recipes)
            raise UsageError(f"{recipe_pattern} matches {len(recipes)} recipes ({names}); --html FILE is one "
                             "recipe's page: name one, or give no RECIPE and a directory")
        _check_replaceable(path)
        _write(path, _recipe_page(ws, recipes[0], html.javascript_bundle()))
        click.echo(f"wrote {path}")
        return 0
    if path.exists() and not path.is_dir():
        raise UsageError(f"--html {path}: not a directory; without RECIPE it names the directory of the pages "
                         "(with RECIPE, the file of its page)")
    ws, recipes = recipes_from(ctx, [])
    targets = [(recipe, path / f"{recipe.name}.html") for recipe in recipes]  # names are checked file names
    for _, page_path in targets:
        _check_replaceable(page_path)
    _check_replaceable(path / INDEX)
    if any(r.name == INDEX[:-5] for r in recipes):
        raise UsageError(f"recipe {INDEX[:-5]}: its page would be the index's file; name the recipe otherwise")
    script = html.javascript_bundle()
    path.mkdir(parents=True, exist_ok=True)
    entries = []
    for recipe, page_path in targets:
        data = recipe_data(ws, recipe)
        _write(page_path, _page(recipe, data, script))
        entries.append({"recipe": recipe.name, "href": page_path.name, "points": data["points"]})
    _write(path / INDEX, html.index_page(entries, script, _now()))
    click.echo(f"wrote {path / INDEX} and {len(targets)} recipe page(s)")
    return 0


def recipe_data(ws: Any, recipe: Any) -> dict[str, Any]:
    """The points of a recipe's charts, its newest version and its explain-error result."""
    from tpubuild.engine import read_history
    from tpubuild.publish import read_manifest, reservation_file, version_numbers
    from tpubuild.report.formats import REPORT_JSON
    from tpubuild.report.history_points import points

    recipe_dir = Path(ws.output_dir) / recipe.name
    versions: dict[int, dict[str, Any]] = {}
    for number in version_numbers(recipe_dir):
        manifest = read_manifest(recipe_dir / str(number))
        if manifest is not None and manifest.get("recipe") == recipe.name:  # a version of this recipe
            versions[number] = manifest
    newest = None
    if versions:
        number = max(versions)
        newest = {"number": number, "manifest": versions[number],
                  "report_json": _read_json(recipe_dir / str(number) / REPORT_JSON)}
    reserved = _reserved(reservation_file(ws.state_dir, recipe_dir))
    return {"points": points(versions, read_history(ws.state_dir, recipe.name), reserved),
            "newest": newest, "explanation": _explanation(ws, recipe.name)}


def _recipe_page(ws: Any, recipe: Any, script: str) -> str:
    return _page(recipe, recipe_data(ws, recipe), script)


def _page(recipe: Any, data: dict[str, Any], script: str) -> str:
    from tpubuild.report import html

    return html.recipe_page(recipe.name, recipe.rel_file, data["points"], data["newest"], data["explanation"],
                            script, _now())


def _explanation(ws: Any, recipe: str) -> dict[str, Any] | None:
    from tpubuild.commands.explain_error import result_file

    found = _read_json(result_file(ws.state_dir, recipe))
    if found is None or found.get("schema") != 1 or found.get("recipe") != recipe:
        return None
    return found if isinstance(found.get("nodes"), dict) else None


def _reserved(path: Path) -> int | None:
    """The highest version number ever reserved (publish/versions.py reserve_number)."""
    try:
        text = path.read_text().split("\n", 1)[0].strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) < 10 else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > READ_LIMIT:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _check_replaceable(path: Path) -> None:
    """A page may replace nothing or a page this command wrote: never a file of the user's."""
    from tpubuild.report.html import written_here

    if path.is_dir():
        raise UsageError(f"--html: {path} is a directory; it is where a page would go")
    if path.exists() and not written_here(path):
        raise UsageError(f"--html: {path} exists and is not a page `tpubuild report --html` wrote; "
                         "not overwritten (move it, or name another file)")


def _write(path: Path, text: str) -> None:
    from tpubuild.atomic import write_text_atomic

    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"--html: cannot write {path}: {exc.strerror or exc}") from None


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
