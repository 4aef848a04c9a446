"""The two sides of `tpubuild diff`: git revisions extracted into a temporary directory,
or the working tree, each loaded with the normal config layer.

BASE is loaded lazily: a recipe whose files (its own and its `extends` bases) and the
workspace file are unchanged between the revisions has the same canonical form at
both, so BASE reuses HEAD's (only the paths move to BASE's tree). That keeps a diff of
200 recipes under a second; every recipe whose configuration changed is loaded again.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from tpubuild.config.finding import LOCK_SUFFIX
from tpubuild.review.compare import Side
from tpubuild.review.revisions import (
    blobs,
    changed_paths,
    commit_of,
    default_base,
    materialize,
    repo_root,
)

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace


def _at(exc: Any, label: str) -> Any:
    """The same error, its lines followed by the revision it was found in."""
    lines = exc.lines()
    exc.lines = lambda: [f"{line} (at {label})" for line in lines]
    return exc


def load_side(ws_file: Path, top: Path, label: str, changed: set[str], reuse: Side | None = None) -> Side:
    """The workspace at `ws_file` (inside the tree `top`) and its recipes; a revision
    without that file has none. With `reuse` (the other side), recipes whose files are
    not in `changed` (paths relative to the top) take the other side's canonical form."""
    from tpubuild.config.recipe import discover, load_recipe_file
    from tpubuild.config.workspace import load_workspace
    from tpubuild.errors import ConfigError

    if not ws_file.is_file():
        return Side(label, {}, top=top)
    try:
        ws = load_workspace(override=ws_file)
        known: dict[str, Any] = {}
        reused_top = None
        if reuse is not None and reuse.ws is not None and _rel(ws_file, top) not in changed:
            reused_top = reuse.top
            known = {_rel(r.file, reuse.top): r for r in reuse.recipes.values()
                     if not any(_rel(f, reuse.top) in changed for f in r.files)}
        recipes: dict[str, Any] = {}
        for path in discover(ws):
            other = known.get(_rel(path, top))
            if other is None or reused_top is None:
                recipe = load_recipe_file(path, ws)
            else:
                recipe = dataclasses.replace(other, file=path, root=ws.root,
                                             files=[top / _rel(f, reused_top) for f in other.files])
            recipes.setdefault(recipe.name, recipe)
    except ConfigError as exc:
        raise _at(exc, label) from None
    return Side(label, recipes, ws, top)


def same_config(top: Path, rev: str, label: str, changed: set[str], head: Side, tmp: Path) -> Side:
    """BASE when no configuration file changed (no workspace file, recipe or base is in
    `changed`): the same recipes as HEAD, with BASE's lock files where they differ (read
    from git). No tree is extracted: that is most of a diff's cost on a large workspace."""
    from tpubuild.lock import read_lock

    moved = [r.lock_file for r in head.recipes.values() if _rel(r.lock_file, head.top) in changed]
    locks = {}
    for index, (path, content) in enumerate(zip(moved, blobs(top, commit_of(top, rev),
                                                             [_rel(p, head.top) for p in moved]))):
        copy = tmp / "locks" / f"{index}.lock.yaml"  # read_lock reads files
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(content or b"")
        locks[path] = read_lock(copy) or {}
    return Side(label, dict(head.recipes), head.ws, head.top, locks)


def _rel(path: Path, top: Path) -> str:
    """`path` relative to `top` (both resolved already, as recipe files are; resolve()
    for each of thousands of paths would cost a tenth of the diff)."""
    try:
        return Path(path).relative_to(top).as_posix()
    except ValueError:
        return Path(path).resolve().relative_to(top).as_posix()


@contextmanager
def sides(ws: Workspace, base: str | None, head: str | None) -> Iterator[tuple[Side, Side, set[str]]]:
    """(BASE side, HEAD side, the workspace-relative paths whose content differs)."""
    from tpubuild.config.recipe import load_recipes

    top = repo_root(ws.root)
    ws_file_rel = _rel(ws.file, top)
    prefix = _rel(ws.root, top)
    base_rev = base or default_base(top)
    changed_top = changed_paths(top, base_rev, head)
    start = "" if prefix == "." else prefix + "/"
    changed = {p[len(start):] for p in changed_top if p.startswith(start)}
    tmp = Path(tempfile.mkdtemp(prefix="tpubuild-diff-")).resolve()
    try:
        if head is None:
            head_side = Side("working tree", {r.name: r for r in load_recipes(ws)}, ws, top)
        else:
            head_top = materialize(top, head, tmp / "head")
            head_side = load_side(head_top / ws_file_rel, head_top, f"{head} ({commit_of(top, head)[:12]})", set())
        base_label = f"{base_rev} ({commit_of(top, base_rev)[:12]})"
        if any(p == ws_file_rel or (p.endswith((".yaml", ".yml")) and not p.endswith(LOCK_SUFFIX))
               for p in changed_top):
            base_top = materialize(top, base_rev, tmp / "base")
            base_side = load_side(base_top / ws_file_rel, base_top, base_label, changed_top, head_side)
        else:
            base_side = same_config(top, base_rev, base_label, changed_top, head_side, tmp)
        yield base_side, head_side, changed
    finally:
        # rm is much faster than shutil.rmtree on a tree of many small files; it is our own temp dir.
        subprocess.run(["rm", "-rf", "--", str(tmp)], check=False)
