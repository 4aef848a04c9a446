"""The no-op memo: a stat-only proof that a recipe is still up to date.

The full no-op check (engine/lockdoc.py up_to_date) loads and validates the recipe, hashes
its inputs through the stat cache, reads every stage record and the lock file. That is
exact but costs milliseconds per recipe; with 2,000 recipes it would dominate. So when
the full check finds a recipe up to date, the files it read are remembered here with
their stat (device, inode, size, mtime_ns, ctime_ns): the recipe and its `extends`
bases, the source model's files and directories, declared and discovered inputs, the
stage records, the newest published version and the lock file. The next build accepts
the recipe as up to date without reading anything only if every one of them has the
same stat, and if the code, toolchain, environment allow-list, workspace file and the
set of recipe files are the same (the guard).

Soundness: an entry is written only if every file's ctime is older than the start of the
build that checked it (minus a margin for coarse file system clocks), so the content
the full check read is the content whose stat is remembered; a file changed since then
changes its ctime. Recipes whose inputs are globs are never memoized (a new matching
file in a subdirectory would not change any remembered stat).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.atomic import write_text_atomic
from tpubuild.digests import hash_bytes, key_env, toolchain
from tpubuild.keys import canonical_dumps, package_fingerprint

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

SCHEMA = 1
MARGIN_NS = 2_000_000_000  # coarse timestamps: ext4 ctime ticks with the kernel's jiffies, FAT/SMB with seconds


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def guard(ws: Workspace | _Seen, recipe_files: list[Path]) -> str:
    """What every memo entry depends on besides its own files."""
    return hash_bytes(canonical_dumps({
        "schema": SCHEMA,
        "code": package_fingerprint(),
        "toolchain": toolchain(),
        "env": key_env(),
        "workspace": _stat(str(ws.file)),
        "recipes": [str(p) for p in recipe_files],
        "output_dir": str(ws.output_dir),
        "cache_dir": str(ws.cache_dir),
    }).encode())


class NoopMemo:
    def __init__(self, ws: Workspace, recipe_files: list[Path]):
        self.path = Path(ws.state_dir) / "noop-memo.json"
        self.guard = guard(ws, recipe_files)
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if data.get("guard") == self.guard:
            self.entries = data.get("recipes", {})

    def check(self, recipe_file: Path) -> dict[str, Any] | None:
        """The remembered result (name, rows, version) when every file is unchanged."""
        entry = self.entries.get(str(recipe_file))
        if entry is None:
            return None
        for path, stat in entry["files"]:
            if _stat(path) != stat:
                return None
        return entry

    def remember(self, recipe_file: Path, name: str, rows: list[list[str]], version: int | None,
                 files: list[str], since_ns: int) -> bool:
        """Remember a recipe found up to date by the full check that began at `since_ns`."""
        stats = []
        for path in sorted(set(files)):
            stat = _stat(path)
            if stat is None or stat[4] >= since_ns - MARGIN_NS:
                self.entries.pop(str(recipe_file), None)
                return False
            stats.append([path, stat])
        self.entries[str(recipe_file)] = {"name": name, "rows": rows, "version": version, "files": stats}
        self.dirty = True
        return True

    def forget(self, recipe_file: Path) -> None:
        if self.entries.pop(str(recipe_file), None) is not None:
            self.dirty = True

    def save(self, ws: Workspace) -> None:
        if not self.dirty:
            return
        seen = {"file": str(Path(ws.file).resolve()), "stat": _stat(str(ws.file)), "recipes": list(ws.recipe_globs),
                "output_dir": str(ws.output_dir), "cache_dir": str(ws.cache_dir)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps({"guard": self.guard, "workspace": seen, "recipes": self.entries}))
        except OSError:
            pass  # only a memo: the next build does the full check


def quick(start: Path, override: Path | None) -> tuple[Path, list[dict[str, Any]]] | None:
    """(workspace root, remembered entries of every recipe) when the whole workspace is
    provably up to date from stats alone; None sends the build down the full path."""
    from tpubuild.config.finding import discover_files, workspace_file_for

    ws_file = workspace_file_for(start, override)
    if ws_file is None:
        return None
    root = ws_file.parent.resolve()
    try:
        data = json.loads((root / ".tpubuild" / "noop-memo.json").read_text())
    except (OSError, ValueError):
        return None
    seen = data.get("workspace") or {}
    if seen.get("file") != str(ws_file.resolve()) or seen.get("stat") != _stat(str(ws_file)):
        return None
    files = discover_files(root, seen.get("recipes", []), ws_file)
    ws = _Seen(ws_file.resolve(), seen)
    if data.get("guard") != guard(ws, files):
        return None
    entries = []
    for recipe_file in files:
        entry = data.get("recipes", {}).get(str(recipe_file))
        if entry is None or any(_stat(path) != stat for path, stat in entry["files"]):
            return None
        entries.append(entry)
    return root, entries


class _Seen:
    """The workspace fields the guard reads, as the memo remembered them."""

    def __init__(self, file: Path, seen: dict[str, Any]):
        self.file = file
        self.output_dir = seen["output_dir"]
        self.cache_dir = seen["cache_dir"]
