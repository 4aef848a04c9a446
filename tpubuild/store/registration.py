"""What the last build of a workspace used, registered with its cache so that `gc` keeps it.

A lock file names the keys that every machine computes alike; the keys of stages keyed on
a measured output (verify's errors, latencies) are this machine's, and a build does not
rewrite a lock file for them alone (lockfile.same_keys). So the lock files do not name
every record a build used: `gc` also keeps, for each registered workspace, the keys its
last build of each recipe used, which the build records at its end in the store's index
(one sqlite transaction: atomic). A no-op build must not write the index (it may be a
shared cache, and a no-op build opens nothing), so the workspace remembers what it
registered (`<state_dir>/registered.json`) and registers again only what differs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.atomic import write_text_atomic

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

STATE_FILE = "registered.json"
# The recipe name under which a workspace's lock files' keys are registered (a recipe name
# is never empty: config/names.py).
LOCK_FILES = ""


def used_keys(runs: list[Any]) -> dict[str, set[str]]:
    """Recipe -> the stage keys its run used, for each run that did not fail (with
    --keep-going, what the stages that ran used): every stage record but publish's (the
    published version is not a record)."""
    return {run.name: {out.key for name, out in run.outputs.items() if name != "publish" and out.key}
            for run in runs if not run.failed and run.outputs}


def register(store: Any, ws: Workspace, runs: list[Any]) -> None:
    """Register what `runs` used with the store's index, unless the workspace registered
    exactly that with this index already."""
    used = used_keys(runs)
    if not used:
        return
    state_path = Path(ws.state_dir) / STATE_FILE
    recorded = _read(state_path)
    index = _identity(store.index_path)
    same_index = index is not None and recorded.get("index") == index
    known = recorded.get("recipes", {}) if same_index else {}
    changed = {name: keys for name, keys in used.items() if known.get(name) != sorted(keys)}
    if not changed:
        return
    store.register_workspace(Path(ws.root), changed, getattr(ws, "file", None))
    recipes = {**known, **{name: sorted(keys) for name, keys in changed.items()}}
    try:
        write_text_atomic(state_path, json.dumps({"index": _identity(store.index_path), "recipes": recipes},
                                                 sort_keys=True))
    except OSError:
        pass  # only a memo of what the index holds: the next build registers again


def registered(ws: Workspace, store: Any) -> dict[str, list[str]]:
    """What the workspace's builds registered with `store`'s index, recipe -> keys, as it
    remembers it (empty when it registered with another index)."""
    recorded = _read(Path(ws.state_dir) / STATE_FILE)
    index = _identity(store.index_path)
    return recorded.get("recipes", {}) if index is not None and recorded.get("index") == index else {}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("recipes", {}), dict) else {}


def _identity(index: Path) -> list[Any] | None:
    """Which index this is: its path and inode (a cache removed and made again is another)."""
    try:
        st = os.stat(index)
    except OSError:
        return None
    return [os.path.realpath(index), st.st_dev, st.st_ino]
