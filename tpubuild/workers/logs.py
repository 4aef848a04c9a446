"""How long the worker logs in `.tpubuild/logs/` live.

A failure message points into these logs ("see .tpubuild/logs/worker-3.log",
"traceback in ..."), so a log is never overwritten: each build numbers its workers
after the highest number present, and `kept.json` says which build wrote which logs and
which of its recipes failed. At the end of each build (under the workspace lock):
- a log of an earlier build is removed once every recipe that failed in that build has
  built successfully since (a build with no failures: at the end of the next build);
- logs no entry names (a killed build's, an older tpubuild's) are removed too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

KEPT = "kept.json"
_LOG = re.compile(r"worker-(\d+)\.log")


def next_index(log_dir: Path) -> int:
    """The first worker number no log in `log_dir` has."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return 0
    numbers = [int(m.group(1)) for name in names if (m := _LOG.fullmatch(name))]
    return max(numbers) + 1 if numbers else 0


def settle(log_dir: Path, written: list[Path], failed: set[str], succeeded: set[str]) -> None:
    """After a build that wrote the logs `written`: forget (and delete) what no failure
    needs any more, and remember this build's logs with the recipes it failed."""
    from tpubuild.atomic import write_text_atomic

    if not log_dir.is_dir():
        return
    kept = []
    for entry in _entries(log_dir):
        still = sorted(set(entry["failed"]) - succeeded)
        if still:
            kept.append({"files": entry["files"], "failed": still})
    if written:
        kept.append({"files": sorted(path.name for path in written), "failed": sorted(failed)})
    named = {name for entry in kept for name in entry["files"]}
    for name in os.listdir(log_dir):
        if _LOG.fullmatch(name) and name not in named:
            try:
                os.unlink(log_dir / name)
            except FileNotFoundError:
                pass
    write_text_atomic(log_dir / KEPT, json.dumps(kept, indent=1, sort_keys=True) + "\n")


def _entries(log_dir: Path) -> list[dict]:
    """kept.json's entries; an unreadable one is none (its logs then go)."""
    try:
        data = json.loads((log_dir / KEPT).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [e for e in data if isinstance(e, dict) and isinstance(e.get("files"), list)
            and isinstance(e.get("failed"), list)
            and all(isinstance(n, str) and _LOG.fullmatch(n) for n in e["files"])
            and all(isinstance(r, str) for r in e["failed"])]
