"""`tpubuild diff` and `--changed-since`: compare two sides of a workspace and say which
recipes a change affects (TensorFlow-free)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace


def diff(ws: Workspace, base: str | None, head: str | None) -> tuple[list[Any], str, str]:
    """(RecipeChange of every recipe, BASE label, HEAD label)."""
    from tpubuild.review.compare import add_cache_state, compare
    from tpubuild.review.sides import sides

    with sides(ws, base, head) as (base_side, head_side, changed):
        changes = compare(base_side, head_side, changed)
        if head is None:
            add_cache_state(ws, base_side, changes, head_side)
        return changes, base_side.label, head_side.label


def changed_since(ws: Workspace, rev: str) -> list[str]:
    """Names of the recipes `tpubuild diff REV` reports as affected (to build)."""
    from tpubuild.review.compare import compare
    from tpubuild.review.sides import sides

    with sides(ws, rev, None) as (base_side, head_side, changed):
        return [c.name for c in compare(base_side, head_side, changed) if c.affected]
