"""`tpubuild diff` output: text for terminals, markdown for a pull-request comment (kept
under GitHub's 65,535-character limit), JSON with a versioned schema for scripts."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tpubuild.review.compare import RecipeChange, change_text, show

SCHEMA = 1
COMMENT_LIMIT = 65_535  # GitHub's maximum comment body
# The markdown's last line: CI finds the comment it posted before by it, and updates it.
MARKER = "<!-- tpubuild diff -->"


def summary_line(changes: list[RecipeChange]) -> str:
    """E.g. "3 recipes affected: 2 rebuild from tpu, 1 from batch; 1 removed; size -48%"."""
    affected = [c for c in changes if c.affected]
    removed = sum(c.status == "removed" for c in changes)
    if not affected and not removed:
        return "no recipe affected"
    parts = []
    if affected:
        starts = Counter(c.rebuild_from for c in affected)
        froms = [f"{n} {'rebuild ' if i == 0 else ''}from {stage}" for i, (stage, n) in enumerate(starts.most_common())]
        noun = "recipe" if len(affected) == 1 else "recipes"
        parts.append(f"{len(affected)} {noun} affected: " + ", ".join(froms))
    else:
        parts.append("no recipe to rebuild")
    added = sum(c.status == "added" for c in affected)
    if added:
        parts.append(f"{added} added")
    if removed:
        parts.append(f"{removed} removed")
    old = sum(c.artifact["size_bytes"]["old"] for c in changes if "size_bytes" in c.artifact)
    new = sum(c.artifact["size_bytes"]["new"] for c in changes if "size_bytes" in c.artifact)
    if old:
        parts.append(f"size {100.0 * (new - old) / old:+.0f}%")
    errors = [c.artifact["max_abs_error"]["new"] for c in changes if "max_abs_error" in c.artifact]
    if errors:
        parts.append(f"max error {max(errors):.3g}")
    return "; ".join(parts)


def _title(change: RecipeChange) -> str:
    if change.status == "renamed":
        return f"renamed {change.old_name} -> {change.name} ({change.file})"
    return f"{change.status} {change.name} ({change.file})"


def _delta(path: str, entry: dict[str, Any]) -> str:
    text = f"{path}: {show(entry['old'])} -> {show(entry['new'])}"
    if "percent" in entry:
        text += f" ({entry['percent']:+g}%)"
    return text


def detail_lines(change: RecipeChange, indent: str = "  ") -> list[str]:
    """The body of one recipe's entry: fields, rendered options diff, stages, artifact."""
    lines = []
    if change.fields and change.status != "added":
        lines.append("recipe fields (after extends and workspace defaults):")
        lines += [f"{indent}{change_text(*f)}" for f in change.fields]
    if change.render_diff:
        lines.append("rendered ConverterOptions:")
        lines += [f"{indent}{line}" for line in change.render_diff]
    if change.stages:
        lines.append("stages that rerun:")
        for stage in change.stages:
            cached = {True: " (already in the cache)", False: "", None: ""}[stage.cached]
            lines.append(f"{indent}{stage.stage}{cached}")
            lines += [f"{indent}{indent}- {cause}" for cause in stage.causes]
    if change.artifact:
        lines.append("artifact (BASE lock file -> HEAD lock file):")
        lines += [f"{indent}{_delta(path, entry)}" for path, entry in change.artifact.items()]
    return lines


def text(changes: list[RecipeChange], base: str, head: str) -> str:
    lines = [f"tpubuild diff {base} .. {head}", summary_line(changes)]
    for change in changes:
        if change.status == "unchanged":
            continue
        lines.append("")
        lines.append(_title(change))
        lines += ["  " + line for line in detail_lines(change)]
    return "\n".join(lines) + "\n"


def markdown(changes: list[RecipeChange], base: str, head: str, limit: int = COMMENT_LIMIT) -> str:
    shown = [c for c in changes if c.status != "unchanged"]
    head_lines = [f"**tpubuild diff**: {summary_line(changes)}", "", f"`{base}` .. `{head}`", ""]
    if shown:
        head_lines += ["| recipe | change | rebuild from | cached | size |", "|---|---|---|---|---|"]
        for c in shown:
            name = f"{c.old_name} → {c.name}" if c.old_name else c.name
            cached = ", ".join(s.stage for s in c.stages if s.cached) or "-"
            size = _delta("size", c.artifact["size_bytes"]).split(": ", 1)[1] if "size_bytes" in c.artifact else "-"
            head_lines.append(f"| `{name}` | {c.status} | {c.rebuild_from or '-'} | {cached} | {size} |")
        head_lines.append("")
    out = "\n".join(head_lines) + "\n"
    budget = limit - len(MARKER) - 1
    notice = "\n_{n} recipes' details were left out to stay under GitHub's {limit:,}-character comment limit._\n"
    if len(out) > budget - 1000:  # thousands of affected recipes: the table itself is cut
        out = out[: budget - 1000].rsplit("\n", 1)[0] + f"\n\n_The table was cut to stay under GitHub's {limit:,}-character comment limit._\n"
    for index, c in enumerate(shown):
        body = "\n".join(detail_lines(c))
        block = f"<details><summary>{_title(c)}</summary>\n\n```\n{body}\n```\n\n</details>\n"
        room = budget - len(out) - len(notice.format(n=len(shown), limit=limit))
        if len(block) > room:
            out += notice.format(n=len(shown) - index, limit=limit)
            break
        out += block
    return out[:budget] + MARKER + "\n"


def as_json(changes: list[RecipeChange], base: str, head: str) -> str:
    def stage(s: Any) -> dict[str, Any]:
        return {"stage": s.stage, "causes": s.causes, "cached": s.cached}

    recipes = [
        {
            "name": c.name,
            "status": c.status,
            "affected": c.affected,
            "file": c.file,
            "old_name": c.old_name,
            "rebuild_from": c.rebuild_from,
            "fields": [{"path": p, "old": _plain(o), "new": _plain(n)} for p, o, n in c.fields],
            "render_diff": c.render_diff,
            "stages": [stage(s) for s in c.stages],
            "artifact": c.artifact,
        }
        for c in changes
    ]
    document = {"schema": SCHEMA, "base": base, "head": head, "summary": summary_line(changes), "recipes": recipes}
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def _plain(value: Any) -> Any:
    return None if show(value) == "(absent)" else value


FORMATS = {"text": text, "markdown": markdown, "json": as_json}
