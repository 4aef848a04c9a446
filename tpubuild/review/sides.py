"""The two sides of `tpubuild diff`: git revisions extracted into a temporary directory,
or the working tree, each loaded with the normal config layer."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tpubuild.review.compare import Side
from tpubuild.review.revisions import commit_of, default_base, materialize, repo_root


def load_side(ws_file_rel: Path, top: Path, label: str) -> Side:
    """The workspace at `top / ws_file_rel` and its recipes; a revision without that
    workspace file has no recipes (everything at the other side is added)."""
    from tpubuild.config import load_recipes
    from tpubuild.errors import ConfigError
    from tpubuild.workspace import load_workspace

    ws_file = top / ws_file_rel
    if not ws_file.is_file():
        return Side(label, {})
    ws = load_workspace(override=ws_file)
    try:
        recipes = load_recipes(ws)
    except ConfigError as exc:
        raise _at(exc, label) from None  # the lines name the file; say which revision too
    return Side(label, {r.name: r for r in recipes}, ws)


def _at(exc: Any, label: str) -> Any:
    """The same error, its lines prefixed with the revision it was found in."""
    lines = exc.lines()
    exc.lines = lambda: [f"{line} (at {label})" for line in lines]
    return exc


@contextmanager
def sides(ws: Any, base: str | None, head: str | None) -> Iterator[tuple[Side, Side, bool]]:
    """(BASE side, HEAD side, whether HEAD is the working tree)."""
    top = repo_root(ws.root)
    ws_file_rel = Path(ws.file).resolve().relative_to(top)
    base_rev = base or default_base(top)
    with tempfile.TemporaryDirectory(prefix="tpubuild-diff-") as tmp:
        base_side = load_side(ws_file_rel, materialize(top, base_rev, Path(tmp) / "base"),
                              f"{base_rev} ({commit_of(top, base_rev)[:12]})")
        if head is None:
            head_side = load_side(ws_file_rel, top, "working tree")
        else:
            head_side = load_side(ws_file_rel, materialize(top, head, Path(tmp) / "head"),
                                  f"{head} ({commit_of(top, head)[:12]})")
        yield base_side, head_side, head is None
