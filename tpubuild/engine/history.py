"""Each recipe's builds as they happened, for `tpubuild report --html`: what a published
version's manifest cannot say (its stage times, built or cached; the findings of every
stage), and the builds that published nothing (a verification that failed, with the errors
it measured; a stage that failed; a publish that never finished).

`<state_dir>/history/<recipe>.json`: `{"schema": 1, "recipe": NAME, "attempts": [...]}`, the
newest HISTORY_LIMIT attempts, rewritten whole and atomically at the end of every build that
ran something for the recipe (a no-op build adds nothing). The state directory is this
workspace's own (ignored by git, as `.tpubuild/` is); a file another process wrote there is
read as data: a malformed one reads as no history and is replaced by the next build.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.atomic import write_text_atomic

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace
    from tpubuild.engine.resolver import RecipeRun

SCHEMA = 1
HISTORY_LIMIT = 200  # attempts kept per recipe
HISTORY_DIR = "history"
# What a failed stage wrote before it failed and is worth keeping: verify's measured errors.
FAILED_FIGURES = {"verify": "verify.json"}
_FIGURE_LIMIT = 1 << 20  # a figures file larger than this is not read (it is data a stage wrote)


def history_file(state_dir: Path, recipe: str) -> Path:
    """The history of `recipe` (a recipe name is a checked file name: config/names.py)."""
    return Path(state_dir) / HISTORY_DIR / f"{recipe}.json"


def read_history(state_dir: Path, recipe: str) -> list[dict[str, Any]]:
    """The recorded attempts of `recipe`, oldest first; [] when none or unreadable."""
    try:
        data = json.loads(history_file(state_dir, recipe).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("recipe") != recipe:
        return []
    return [a for a in data.get("attempts", []) if isinstance(a, dict)]


def failed_figures(run: RecipeRun, stage: str, out_dir: Path) -> None:
    """Keep what a failed stage measured before it failed (verify writes verify.json, then
    fails on the tolerances), before its work directory goes."""
    name = FAILED_FIGURES.get(stage)
    path = out_dir / name if name else None
    try:
        if path is None or path.stat().st_size > _FIGURE_LIMIT:
            return
        figures = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(figures, dict):
        run.failed_summaries[stage] = figures


def attempt(run: RecipeRun, started: float) -> dict[str, Any] | None:
    """What the build did for `run`, or None when it did nothing (every stage cached and
    nothing published)."""
    statuses = [row.status for row in run.rows]
    if not statuses or (all(s == "cached" for s in statuses) and not run.failed):
        return None
    failed = next((row.stage for row in run.rows if row.status == "failed"), None)
    if run.failed or failed:
        outcome = "failed"
    elif run.version is None:
        outcome = "not published"
    elif run.updated_in_place:
        outcome = "updated"
    elif any(row.stage == "publish" and row.status == "built" for row in run.rows):
        outcome = "published"
    else:
        outcome = "unchanged"
    record: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "outcome": outcome,
        "version": run.version,
        "recipe_digest": run.recipe.digest,
        "stages": [row.to_json() for row in run.rows],
        # Every stage's findings, the cached ones' too (they are in the stage records).
        "warnings": {name: list(out.warnings) for name, out in run.outputs.items() if getattr(out, "warnings", None)},
    }
    if failed:
        record["failed_stage"] = failed
        record["error"] = run.error or next(iter(run.failed_targets.values()), None)
    if run.failed_targets:
        record["failed_targets"] = sorted(run.failed_targets)
    if "report" in run.outputs:  # the headline figures, kept when the version is pruned
        record["report"] = run.outputs["report"].summary
    if run.failed_summaries:
        record["failed_figures"] = run.failed_summaries
    return record


def record_attempts(ws: Workspace, runs: list[RecipeRun], started: float) -> None:
    """Add each run's attempt to its recipe's history. The history is for reading later:
    a history that cannot be written (a full disk, a read-only state directory) costs
    the report that build, never the build."""
    for run in runs:
        entry = attempt(run, started)
        if entry is None:
            continue
        attempts = (read_history(ws.state_dir, run.name) + [entry])[-HISTORY_LIMIT:]
        path = history_file(ws.state_dir, run.name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps({"schema": SCHEMA, "recipe": run.name, "attempts": attempts},
                                               indent=1, sort_keys=True) + "\n")
        except OSError:
            continue
